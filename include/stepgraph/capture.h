// Capture and replay: a plan's decode step recorded once as a CUDA graph and replayed
// with one cudaGraphLaunch per step. Per-step values (ids, positions) live in device
// buffers the kernels read, so a replay needs no host work. Batch buckets keep one
// captured graph per batch size, all sharing one arena.
#ifndef STEPGRAPH_CAPTURE_H_
#define STEPGRAPH_CAPTURE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stepgraph/capture_policy.h"
#include "stepgraph/cuda_dispatch.h"
#include "stepgraph/executor.h"
#include "stepgraph/plan.h"

namespace sg {

namespace internal {
struct CapturedGraph;
}  // namespace internal

struct CaptureOptions {
  // Run the plan eagerly on every Replay instead of capturing (for profilers and
  // debugging). Defaults to true when the environment sets STEPGRAPH_EAGER=1.
  bool eager = false;
  // Nodes that may be patched in place by Update before it captures again instead.
  double max_patch_fraction = 0.5;
  // The stream to capture on and replay on (not owned); when null the step makes its own.
  // Steps that share an arena must share a stream so that their replays never overlap.
  cudaStream_t stream = nullptr;
};

// CaptureOptions with `eager` taken from the STEPGRAPH_EAGER environment variable.
CaptureOptions DefaultCaptureOptions();

// True for device or managed memory (cudaPointerGetAttributes).
bool IsDevicePointer(const void* p);

class CapturedStep {
 public:
  // Checks capture safety (CheckCaptureSafety), prepares `dispatch` for the plan, captures
  // one execution on the step's own non-default stream (thread-local capture mode) and
  // instantiates it. `plan` and `dispatch` must outlive the step; `bindings` are copied.
  // Steps made with one dispatcher share its workspaces (attention partials, argmax, the
  // error word): their replays must not overlap, so give them one stream
  // (CaptureOptions::stream) or order their streams.
  static absl::StatusOr<std::unique_ptr<CapturedStep>> Create(const ExecutionPlan& plan,
                                                              const Bindings& bindings,
                                                              CudaDispatch& dispatch,
                                                              const CaptureOptions& options);
  ~CapturedStep();
  CapturedStep(const CapturedStep&) = delete;
  CapturedStep& operator=(const CapturedStep&) = delete;

  // Launches the step on stream(): one cudaGraphLaunch (eagerly: one Execute).
  absl::Status Replay();

  // Makes later replays use `next` bindings (rebound weights, a replaced state buffer):
  // patches the launches of the nodes that changed in place, or captures again and
  // updates the executable (cudaGraphExecUpdate), or, if that fails, instantiates anew.
  absl::Status Update(const Bindings& next);
  // The share of nodes later Updates may patch in place (CaptureOptions::max_patch_fraction).
  void set_max_patch_fraction(double fraction) { options_.max_patch_fraction = fraction; }

  cudaStream_t stream() const { return stream_; }
  const ExecutionPlan& plan() const { return *plan_; }
  const Bindings& bindings() const { return bindings_; }
  const CaptureStats& stats() const { return stats_; }
  bool eager() const { return options_.eager; }
  // CUDA graph nodes in the executable (0 when eager).
  int64_t num_graph_nodes() const;

  // The captured graph as DOT, one cluster per stepgraph node labelled with its op, name
  // and shapes, holding the CUDA nodes (kernel names) it launched.
  absl::StatusOr<std::string> ToDot() const;

 private:
  CapturedStep(const ExecutionPlan& plan, const Bindings& bindings, CudaDispatch& dispatch,
               const CaptureOptions& options);
  // Records one execution into a new graph; fills the node map when `graph_nodes` is set.
  absl::StatusOr<internal::CapturedGraph> CaptureOnce(const Bindings& bindings);
  absl::Status PatchNodes(const Bindings& next, const std::vector<int32_t>& nodes);
  absl::Status Instantiate();

  const ExecutionPlan* plan_;
  Bindings bindings_;
  CudaDispatch* dispatch_;
  CaptureOptions options_;
  cudaStream_t stream_ = nullptr;
  bool owns_stream_ = false;
  std::unique_ptr<internal::CapturedGraph> graph_;
  cudaGraphExec_t exec_ = nullptr;  // owned
  CaptureStats stats_;
};

// One captured step per batch bucket, made lazily or up front, all sharing one arena
// sized for the largest need.
class GraphCache {
 public:
  struct Options {
    std::vector<int64_t> buckets = {1, 2, 4, 8, 16, 32};
    bool capture_up_front = false;
    CaptureOptions capture = DefaultCaptureOptions();
  };
  // Makes the graph of a step with `batch` rows.
  using GraphFactory = std::function<absl::StatusOr<Graph>(int64_t batch)>;
  // Binds every Input, Weight and State of a bucket's graph (the cache binds the arena).
  using Binder = std::function<absl::Status(const Graph& graph, Bindings& bindings)>;

  // Builds and plans every bucket's graph, binds them (one shared arena), prepares
  // `dispatch` for all plans, and captures every bucket when capture_up_front. The
  // dispatcher's stream is set to the cache's stream.
  static absl::StatusOr<std::unique_ptr<GraphCache>> Create(const GraphFactory& make_graph,
                                                            const Binder& bind,
                                                            CudaDispatch& dispatch,
                                                            const Options& options);
  ~GraphCache();
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  const std::vector<int64_t>& buckets() const { return options_.buckets; }
  int64_t max_batch() const { return options_.buckets.back(); }
  absl::StatusOr<int64_t> BucketFor(int64_t live_rows) const {
    return ChooseBucket(options_.buckets, live_rows);
  }
  // The captured step of `bucket`, capturing it on first use.
  absl::StatusOr<CapturedStep*> Step(int64_t bucket);
  // Replays the step of the bucket that holds `live_rows` rows.
  absl::Status Replay(int64_t live_rows);
  // The plan and bindings of `bucket` (for reading outputs with ResolveTensor).
  const ExecutionPlan& plan(int64_t bucket) const;
  const Bindings& bindings(int64_t bucket) const;
  // The one stream every bucket captures and replays on (owned by the cache).
  cudaStream_t stream() const { return stream_; }

  struct BucketMemory {
    int64_t bucket = 0;
    int64_t arena_bytes = 0;   // what this bucket's plan uses of the shared arena
    bool captured = false;
    int64_t graph_nodes = 0;
  };
  std::vector<BucketMemory> Memory() const;
  int64_t shared_arena_bytes() const { return arena_bytes_; }
  // Device memory held by CUDA for graphs (cudaGraphMemAttrUsedMemCurrent).
  static absl::StatusOr<int64_t> DeviceGraphMemory();

 private:
  GraphCache() = default;
  int64_t IndexOf(int64_t bucket) const;

  Options options_;
  CudaDispatch* dispatch_ = nullptr;
  std::vector<std::unique_ptr<ExecutionPlan>> plans_;  // per bucket
  std::vector<std::unique_ptr<Bindings>> bindings_;    // per bucket
  std::vector<std::unique_ptr<CapturedStep>> steps_;   // per bucket, null until captured
  void* arena_ = nullptr;                              // owned, cudaFree'd
  int64_t arena_bytes_ = 0;
  cudaStream_t stream_ = nullptr;                      // owned
};

}  // namespace sg

#endif  // STEPGRAPH_CAPTURE_H_
