// The device decode loop's control node (dispatch/cuda/device_loop.h).
#include "dispatch/cuda/device_loop.h"

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_status.h"
#include "kernels/loop_control.cuh"
#include "stepgraph/base/status.h"

namespace sg {

static_assert(DeviceLoopState::kSteps == kernels::kLoopSteps &&
              DeviceLoopState::kLimit == kernels::kLoopLimit &&
              DeviceLoopState::kStops == kernels::kLoopStops &&
              DeviceLoopState::kStopIds == kernels::kLoopStopIds &&
              DeviceLoopState::kRows == kernels::kLoopStateHead &&
              kDeviceLoopMaxStops == kernels::kLoopMaxStops &&
              kDeviceLoopMaxRows == kernels::kLoopMaxRows);

int64_t DeviceLoopStateInts(int64_t rows) { return DeviceLoopState::kRows + rows; }

absl::StatusOr<cudaGraphNode_t> AddLoopControlNode(cudaGraph_t graph, cudaGraphNode_t after,
                                                   cudaGraphConditionalHandle handle,
                                                   const DeviceLoopBuffers& b) {
  if (b.rows < 1 || b.rows > kDeviceLoopMaxRows || b.ring_stride < b.rows ||
      b.max_steps < 1 || b.ids == nullptr || b.ring == nullptr || b.state == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device loop: ", b.rows, " rows (1 to ", kDeviceLoopMaxRows, "), a ring of ",
        b.max_steps, " steps of ", b.ring_stride, " ids, and every buffer are needed"));
  }
  kernels::LoopControlArgs args;
  args.ids = b.ids;
  args.rows = b.rows;
  args.ring = b.ring;
  args.ring_stride = b.ring_stride;
  args.max_steps = b.max_steps;
  args.state = b.state;
  void* params[] = {&handle, &args};
  cudaKernelNodeParams p = {};
  p.func = const_cast<void*>(kernels::LoopControlKernel());
  p.gridDim = dim3(1);
  p.blockDim = dim3(static_cast<unsigned>(kernels::LoopControlThreads(b.rows)));
  p.sharedMemBytes = 0;
  p.kernelParams = params;
  cudaGraphNode_t node = nullptr;
  SG_RETURN_IF_ERROR(ToStatus(
      cudaGraphAddKernelNode(&node, graph, after != nullptr ? &after : nullptr,
                             after != nullptr ? 1 : 0, &p),
      "cudaGraphAddKernelNode(device loop control)"));
  return node;
}

}  // namespace sg
