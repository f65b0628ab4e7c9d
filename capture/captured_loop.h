// CapturedLoop: a captured step run as a loop on the device. One launch runs the step again
// and again with no host work between the steps: a conditional WHILE node whose body holds
// the step (its kernels recorded by stream capture into the body, as CapturedStep records
// them) followed by the loop's control kernel (dispatch/cuda/device_loop.h), which copies
// each step's ids into a ring and decides whether another step follows. Internal to
// capture/ and runtime/.
#ifndef STEPGRAPH_CAPTURE_CAPTURED_LOOP_H_
#define STEPGRAPH_CAPTURE_CAPTURED_LOOP_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dispatch/cuda/cuda_handles.h"
#include "dispatch/cuda/device_loop.h"
#include "stepgraph/capture/cuda_graph.h"

namespace sg {

class CapturedLoop {
 public:
  // The loop around `step` (which must outlive it), controlled through `buffers`.
  // FailedPrecondition naming the CUDA call where the driver cannot build or instantiate
  // it (conditional nodes need CUDA 12.4 and a driver that has them).
  static absl::StatusOr<std::unique_ptr<CapturedLoop>> Create(const CapturedStep& step,
                                                              const DeviceLoopBuffers& buffers);
  ~CapturedLoop();
  CapturedLoop(const CapturedLoop&) = delete;
  CapturedLoop& operator=(const CapturedLoop&) = delete;

  // Launches the loop on the step's stream (the state must hold the limit first).
  absl::Status Launch();

 private:
  CapturedLoop() = default;
  cudaStream_t stream_ = nullptr;
  UniqueGraph graph_;
  cudaGraphExec_t exec_ = nullptr;  // owned
};

}  // namespace sg

#endif  // STEPGRAPH_CAPTURE_CAPTURED_LOOP_H_
