// The device decode loop's control kernel (kernels/loop_control.cuh): what capture/ needs to
// build a loop around a step without including a kernel header (rooms: capture reaches
// kernels through dispatch/cuda).
#ifndef STEPGRAPH_DISPATCH_CUDA_DEVICE_LOOP_H_
#define STEPGRAPH_DISPATCH_CUDA_DEVICE_LOOP_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/statusor.h"

namespace sg {

// The device buffers of a loop (kernels/loop_control.cuh's LoopControlArgs): the step's
// sampled ids [rows], the ring the control kernel copies them into ([max_steps] rows of
// `ring_stride` ids), and the state the host writes before a launch and reads after it.
struct DeviceLoopBuffers {
  const int32_t* ids = nullptr;
  int32_t rows = 0;
  int32_t* ring = nullptr;
  int32_t ring_stride = 0;
  int32_t max_steps = 0;
  int32_t* state = nullptr;
};

// Ints of the state for `rows` rows, and where its fields are: the steps run, the limit,
// the stop ids' count and the stop ids, then a flag per row (0: not live, 1: live without a
// stop id yet, 2: produced one).
int64_t DeviceLoopStateInts(int64_t rows);
inline constexpr int kDeviceLoopMaxStops = 16;
inline constexpr int kDeviceLoopMaxRows = 1024;
struct DeviceLoopState {
  static constexpr int kSteps = 0, kLimit = 1, kStops = 2, kStopIds = 3;
  static constexpr int kRows = 3 + kDeviceLoopMaxStops;
};

// Launches the control kernel on `stream` (capturing the loop's body, after the step): one
// block that copies the ids into the ring, counts the step, marks the rows that produced
// a stop id and sets `handle` to 1 while fewer than the limit steps ran and a live row has
// no stop id yet. InvalidArgument for rows outside [1, kDeviceLoopMaxRows], a ring
// narrower than them or a missing buffer.
absl::Status LaunchLoopControl(cudaGraphConditionalHandle handle,
                               const DeviceLoopBuffers& buffers, cudaStream_t stream);

}  // namespace sg

#endif  // STEPGRAPH_DISPATCH_CUDA_DEVICE_LOOP_H_
