// The device decode loop's control kernel (kernels/loop_control.cuh) as capture/ and
// runtime/ use it: its buffers and state layout under the dispatcher's names, and its
// launch with a Status (rooms: capture reaches kernels through dispatch/cuda).
#ifndef STEPGRAPH_DISPATCH_CUDA_DEVICE_LOOP_H_
#define STEPGRAPH_DISPATCH_CUDA_DEVICE_LOOP_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/loop_control.cuh"

namespace sg {

// The step's sampled ids [rows], the ring the control kernel copies them into
// ([max_steps] rows of `ring_stride` ids), and the state the host writes before a launch
// and reads after it.
using DeviceLoopBuffers = kernels::LoopControlArgs;
inline constexpr int kDeviceLoopMaxRows = kernels::kLoopMaxRows;
inline constexpr int kDeviceLoopMaxStops = kernels::kLoopMaxStops;
// Where the state's fields are: the steps run, the limit, the stop ids' count and the stop
// ids, then a flag per row (0: not live, 1: live without a stop id yet, 2: produced one).
struct DeviceLoopState {
  static constexpr int kSteps = kernels::kLoopSteps, kLimit = kernels::kLoopLimit,
                       kStops = kernels::kLoopStops, kStopIds = kernels::kLoopStopIds,
                       kRows = kernels::kLoopStateHead;
};
// Ints of the state for `rows` rows.
inline int64_t DeviceLoopStateInts(int64_t rows) { return DeviceLoopState::kRows + rows; }

// Launches the control kernel on `stream` (capturing the loop's body, after the step): one
// block that copies the ids into the ring, counts the step, marks the rows that produced
// a stop id and sets `handle` to 1 while fewer than the limit steps ran and a live row has
// no stop id yet. InvalidArgument for rows outside [1, kDeviceLoopMaxRows], a ring
// narrower than them or a missing buffer.
absl::Status LaunchLoopControl(cudaGraphConditionalHandle handle,
                               const DeviceLoopBuffers& buffers, cudaStream_t stream);

}  // namespace sg

#endif  // STEPGRAPH_DISPATCH_CUDA_DEVICE_LOOP_H_
