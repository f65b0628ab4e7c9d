// CapturedLoop (capture/captured_loop.h): the WHILE node, its body and the launch.
#include "capture/captured_loop.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_status.h"
#include "stepgraph/base/status.h"
#include "stepgraph/dispatch/executor.h"

namespace sg {

absl::StatusOr<std::unique_ptr<CapturedLoop>> CapturedLoop::Create(
    const CapturedStep& step, const DeviceLoopBuffers& buffers) {
  auto loop = std::unique_ptr<CapturedLoop>(new CapturedLoop());
  loop->stream_ = step.stream();
  // A failed call here means the driver or the graph cannot hold the loop: say which.
  auto fail = [](cudaError_t e, const char* what) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("device loop: ", what, " failed: ", cudaGetErrorString(e),
                     " (conditional graph nodes need CUDA 12.4 or later and a driver that "
                     "has them)"));
  };
  cudaGraph_t graph = nullptr;
  if (cudaError_t e = cudaGraphCreate(&graph, 0); e != cudaSuccess) {
    return fail(e, "cudaGraphCreate");
  }
  loop->graph_.reset(graph);
  // The condition starts at 1 on every launch: the body runs at least once.
  cudaGraphConditionalHandle handle = 0;
  if (cudaError_t e = cudaGraphConditionalHandleCreate(&handle, graph, 1,
                                                       cudaGraphCondAssignDefault);
      e != cudaSuccess) {
    return fail(e, "cudaGraphConditionalHandleCreate");
  }
  cudaGraphNodeParams params = {};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = handle;
  params.conditional.type = cudaGraphCondTypeWhile;
  params.conditional.size = 1;
  cudaGraphNode_t node = nullptr;
  if (cudaError_t e = cudaGraphAddNode(&node, graph, nullptr, nullptr, 0, &params);
      e != cudaSuccess) {
    return fail(e, "cudaGraphAddNode(WHILE)");
  }
  // The body: the step as its replay runs it (recorded by stream capture into the body,
  // the way CapturedStep records it), then the control kernel.
  cudaGraph_t body = params.conditional.phGraph_out[0];
  const cudaStream_t stream = loop->stream_;
  if (cudaError_t e = cudaStreamBeginCaptureToGraph(stream, body, nullptr, nullptr, 0,
                                                    cudaStreamCaptureModeThreadLocal);
      e != cudaSuccess) {
    return fail(e, "cudaStreamBeginCaptureToGraph(the loop's body)");
  }
  absl::Status recorded = Execute(step.prepared(), step.bindings(), step.dispatch()).status();
  if (recorded.ok()) recorded = sg::LaunchLoopControl(handle, buffers, stream);
  cudaGraph_t captured = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &captured);
  if (!recorded.ok()) {
    cudaGetLastError();
    return absl::Status(recorded.code(), absl::StrCat("device loop: recording the step failed: ",
                                                      recorded.message()));
  }
  if (end != cudaSuccess) return fail(end, "cudaStreamEndCapture(the loop's body)");
  cudaGraphExec_t exec = nullptr;
  if (cudaError_t e = cudaGraphInstantiateWithFlags(&exec, graph, 0); e != cudaSuccess) {
    return fail(e, "cudaGraphInstantiateWithFlags(the loop)");
  }
  loop->exec_ = exec;
  if (cudaError_t e = cudaGraphUpload(exec, loop->stream_); e != cudaSuccess) {
    return fail(e, "cudaGraphUpload(the loop)");
  }
  return loop;
}

CapturedLoop::~CapturedLoop() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
}

absl::Status CapturedLoop::Launch() {
  return ToStatus(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch(device loop)");
}

}  // namespace sg
