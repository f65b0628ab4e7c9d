// Capture and replay: a prepared plan's step recorded once as a CUDA graph and replayed
// with one cudaGraphLaunch per step. Per-step values (ids, positions) live in device
// buffers the kernels read, so a replay needs no host work. StepRunner
// (stepgraph/runtime/step_runner.h) keeps one captured step per batch bucket.
#ifndef STEPGRAPH_CAPTURE_CUDA_GRAPH_H_
#define STEPGRAPH_CAPTURE_CUDA_GRAPH_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stepgraph/capture/capture_policy.h"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/graph/memory_plan.h"

namespace sg {

// True for device or managed memory (cudaPointerGetAttributes).
bool IsDevicePointer(const void* p);

class CapturedStep {
 public:
  // Checks capture safety (CheckCaptureSafety), captures one execution of `prepared` on
  // the dispatcher's stream (thread-local capture mode) and instantiates it. `prepared`
  // (and its plan) and `dispatch` must outlive the step; `bindings` are copied. Steps made
  // with one dispatcher share its workspaces and its stream, so their replays are ordered.
  static absl::StatusOr<std::unique_ptr<CapturedStep>> Create(const PreparedPlan& prepared,
                                                              const Bindings& bindings,
                                                              CudaDispatch& dispatch);
  ~CapturedStep();
  CapturedStep(const CapturedStep&) = delete;
  CapturedStep& operator=(const CapturedStep&) = delete;

  // Launches the step on stream(): one cudaGraphLaunch.
  absl::Status Replay();

  cudaStream_t stream() const { return dispatch_->stream(); }
  const ExecutionPlan& plan() const { return prepared_->plan(); }
  const Bindings& bindings() const { return bindings_; }
  const CaptureStats& stats() const { return stats_; }
  // CUDA graph nodes in the executable.
  int64_t num_graph_nodes() const;
  // What the step runs, for graphs built around it (capture/captured_loop.h).
  const PreparedPlan& prepared() const { return *prepared_; }
  CudaDispatch& dispatch() const { return *dispatch_; }

  // The captured graph as DOT, one cluster per stepgraph node labelled with its op, name
  // and shapes, holding the CUDA nodes (kernel names) it launched.
  absl::StatusOr<std::string> ToDot() const;

  // Device memory held by CUDA for graphs (cudaGraphMemAttrUsedMemCurrent).
  static absl::StatusOr<int64_t> DeviceGraphMemory();

 private:
  CapturedStep(const PreparedPlan& prepared, const Bindings& bindings, CudaDispatch& dispatch);
  // The CUDA graph and, per stepgraph node, the CUDA nodes it launched (cuda_graph.cc).
  struct Recording;
  // Records one execution into a new graph, with the node map.
  absl::StatusOr<Recording> CaptureOnce();
  absl::Status Instantiate();

  const PreparedPlan* prepared_;
  Bindings bindings_;
  CudaDispatch* dispatch_;
  std::unique_ptr<Recording> graph_;
  cudaGraphExec_t exec_ = nullptr;  // owned
  CaptureStats stats_;
};

}  // namespace sg

#endif  // STEPGRAPH_CAPTURE_CUDA_GRAPH_H_
