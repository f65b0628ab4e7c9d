// StepRunner: where steps run. One object owns a set of steps (one graph per batch bucket,
// or per prefill chunk) with their plans, bindings and preparations, the one arena they
// share, the device memory the caller asks for (weights, KV cache, step inputs), the
// stream and the dispatcher. It runs a step eagerly (one Run per node through the
// executor) or, on CUDA, replays the step captured once as a CUDA graph. The CPU
// reference and CUDA are the same object with a different device behind it, so callers
// (the decode session, benchmarks, tools) never include CUDA headers.
//
//   auto runner = StepRunner::Create({.device = DeviceKind::kCuda});
//   void* kv = runner->AllocateZeroed(kv_bytes, "the KV cache");
//   int step = runner->AddStep(std::move(graph), bind_weights_and_kv);   // per bucket
//   runner->Finalize();          // arena, prepare every step, capture every step
//   runner->Run(step);           // one cudaGraphLaunch (or one eager pass)
//
// Every copy and step is ordered on the runner's one stream, so the host never needs to
// synchronise the device except where it reads results (Sync). Measurements on a runner
// (copy bandwidth, time marks, per-node profiles, the matmul rate) are in
// stepgraph/runtime/measure.h.
#ifndef STEPGRAPH_RUNTIME_STEP_RUNNER_H_
#define STEPGRAPH_RUNTIME_STEP_RUNNER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "stepgraph/dispatch/cuda_options.h"
#include "stepgraph/dispatch/dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/graph/memory_plan.h"

namespace sg {

class CollectiveGroup;

enum class DeviceKind : uint8_t { kCpu, kCuda };
absl::string_view DeviceKindName(DeviceKind d);  // "cpu", "cuda"

// Whether this build includes CUDA, and whether a CUDA device can be used here.
bool BuiltWithCuda();
bool CudaDeviceFound();

struct RunnerOptions {
  DeviceKind device = DeviceKind::kCpu;
  // CUDA: execute every step node by node instead of replaying captured graphs (for
  // profilers and debugging). The CPU always runs eagerly. The program maps --eager and
  // STEPGRAPH_EAGER onto this; it is the only eager switch.
  bool eager = false;
  CudaOptions cuda;
  // CPU: the dispatcher to run with instead of the CPU reference (not owned; e.g. a
  // MockDispatch in tests). Memory is host memory either way.
  KernelDispatch* cpu_dispatch = nullptr;
  // CPU: threads of the reference's parallel ops (0: one per core).
  int cpu_threads = 0;
  // CUDA: the device ordinal the runner's memory, stream and dispatcher live on.
  int cuda_device = 0;
  // Tensor parallel (stepgraph/runtime/tensor_parallel.h): the group the steps' collective
  // ops meet and this runner's rank in it (not owned; must outlive the runner). Null: a
  // group of one.
  CollectiveGroup* collectives = nullptr;
  int rank = 0;
};

// What a StepRunner with `options` would run (the fusions its dispatcher takes), answered
// without a device, for preparing a graph where there is none (`stepgraph graph`).
// FailedPrecondition for kCuda in a build without CUDA.
absl::StatusOr<std::unique_ptr<OpSupport>> OpSupportFor(const RunnerOptions& options);

class StepRunner {
 public:
  // The device, its stream and its dispatcher. FailedPrecondition for kCuda where CUDA is
  // not built or no device is found.
  static absl::StatusOr<std::unique_ptr<StepRunner>> Create(const RunnerOptions& options);
  ~StepRunner();
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  DeviceKind device() const;
  // Whether Run replays captured graphs (false: every step runs eagerly).
  bool replays() const;
  // "cuda (NVIDIA H100 80GB HBM3, 132 SMs), replayed CUDA graphs", "cpu (the f32 reference)".
  std::string Describe() const;
  // What the runner's dispatcher runs: the backend graph passes ask (PassOptions::backend)
  // when they make graphs for its steps.
  const OpSupport& op_support() const;

  // ---- Memory on the runner's device (host memory on the CPU), owned by the runner.
  // Not initialised.
  absl::StatusOr<void*> Allocate(int64_t bytes, absl::string_view what);
  // Reading as zeros. On the CPU its pages are mapped on first touch, so a large buffer
  // costs memory only where it is written.
  absl::StatusOr<void*> AllocateZeroed(int64_t bytes, absl::string_view what);
  // Host memory that copies to and from the device go through without blocking (pinned on
  // CUDA).
  absl::StatusOr<void*> AllocateHost(int64_t bytes, absl::string_view what);
  // Bytes the device can still allocate (CPU: the memory the system reports available).
  absl::StatusOr<int64_t> FreeBytes() const;
  // Copies between any two of runner memory, runner host memory and other host memory,
  // ordered with the steps on the runner's stream. May return before the copy ends: the
  // source must stay unchanged and the destination unread until Sync.
  absl::Status Copy(void* dst, const void* src, int64_t bytes);
  // Copies Weight `weight`'s bytes as a file stores them (host memory, weight.bytes()) to
  // runner memory at `dst`, in the layout the runner's dispatcher reads
  // (KernelDispatch::RepackWeight). Ordered as Copy; a repacked weight goes through a host
  // buffer of the call's own, and the call waits for its copy.
  absl::Status CopyWeight(void* dst, const void* src, const Tensor& weight);
  // Waits for every copy and step enqueued so far.
  absl::Status Sync();

  // ---- Steps.
  // Binds every Input, Weight and State of a step's graph (the runner binds the arena).
  using Binder = std::function<absl::Status(const Graph& graph, Bindings& bindings)>;
  // Plans `graph` and binds it; returns the step's index. Before Finalize only.
  absl::StatusOr<int> AddStep(Graph graph, const Binder& bind);
  // Allocates the arena for the largest step, prepares every step with the dispatcher and,
  // unless eager, captures each. Steps run only after this.
  absl::Status Finalize();
  // Runs step `step` once: a graph replay, or an eager pass through the executor.
  absl::Status Run(int step);

  int num_steps() const;
  const ExecutionPlan& plan(int step) const;
  const Bindings& bindings(int step) const;
  // An output of `step` (where it lives and what it holds); NotFound naming it otherwise.
  absl::StatusOr<TensorArg> Output(int step, absl::string_view name) const;
  int64_t arena_bytes() const;
  // CUDA graph nodes of a captured step (0 when eager).
  int64_t graph_nodes(int step) const;

  // The device loop of a captured step (CUDA, after Finalize): one launch runs the step up
  // to `max_steps` times with no host work between the steps (a conditional WHILE node
  // around the captured graph), its output `ids_output` ([rows] i32, the step's sampled
  // ids, which the step itself feeds to the next: a closed loop) copied into a ring on
  // the device after each. FailedPrecondition when the runner is eager or on the CPU, or
  // the driver cannot build the loop; InvalidArgument for a bad output or size.
  absl::Status AddLoop(int step, absl::string_view ids_output, int64_t max_steps);
  // Stop ids one RunLoop checks (the device keeps them beside the loop's state).
  static constexpr int kMaxLoopStopIds = 16;
  bool has_loop(int step) const;
  // One launch of `step`'s loop: up to `limit` (<= its max_steps) steps, fewer when after
  // a step every row r with live[r] != 0 has produced one of `stop_ids` (at most
  // kMaxLoopStopIds) in
  // some step of this launch. Waits for the device, writes step k's ids to
  // ids_out[k * ids_stride + r] (r < rows) and returns the steps run.
  absl::StatusOr<int64_t> RunLoop(int step, int64_t limit, absl::Span<const int32_t> stop_ids,
                                  absl::Span<const uint8_t> live, int32_t* ids_out,
                                  int64_t ids_stride);

  // The error-flag bits (stepgraph/base/error_flags.h) the kernels raised since the last call;
  // waits for the device.
  absl::StatusOr<uint32_t> TakeErrorFlags();

 private:
  // The device, the arena and the steps (runtime/step_runner.cc).
  struct Impl;
  // Runtime code beside the runner reaches its device (runtime/runner_device.h).
  friend class StepRunnerAccess;

  explicit StepRunner(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace sg

#endif  // STEPGRAPH_RUNTIME_STEP_RUNNER_H_
