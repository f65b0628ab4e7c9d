// The device decode loop's control kernel launch (dispatch/cuda/device_loop.h).
#include "dispatch/cuda/device_loop.h"

#include "absl/strings/str_cat.h"

namespace sg {

absl::Status LaunchLoopControl(cudaGraphConditionalHandle handle, const DeviceLoopBuffers& b,
                               cudaStream_t stream) {
  const cudaError_t e = kernels::LaunchLoopControl(handle, b, stream);
  if (e == cudaErrorInvalidValue) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device loop: ", b.rows, " rows (1 to ", kDeviceLoopMaxRows, "), a ring of ",
        b.max_steps, " steps of ", b.ring_stride, " ids, and every buffer are needed"));
  }
  if (e != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("device loop control launch: ", cudaGetErrorString(e)));
  }
  return absl::OkStatus();
}

}  // namespace sg
