// The device decode loop's control kernel launch (dispatch/cuda/device_loop.h).
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

absl::Status LaunchLoopControl(cudaGraphConditionalHandle handle, const DeviceLoopBuffers& b,
                               cudaStream_t stream) {
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
  return ToStatus(kernels::LaunchLoopControl(handle, args, stream), "device loop control");
}

}  // namespace sg
