// The control of a decode loop captured on the device (capture/cuda_graph.h's
// CapturedLoop): a conditional WHILE node runs the captured step, then this kernel, again
// and again until the kernel says stop. After each step it copies the step's sampled ids
// into a ring on the device, counts the step, marks the rows that produced a stop id, and
// sets the loop's condition: another step while fewer than the limit ran and some live
// row has not yet produced a stop id. The host writes the limit, the live rows and zeros
// into `state` before a launch and reads the count and the ring once after it.
#ifndef STEPGRAPH_KERNELS_LOOP_CONTROL_CUH_
#define STEPGRAPH_KERNELS_LOOP_CONTROL_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace sg::kernels {

// Rows one control kernel takes (one thread each, one block).
inline constexpr int kLoopMaxRows = 1024;
// Stop ids one loop checks.
inline constexpr int kLoopMaxStops = 16;

// state: [kLoopStateHead + rows] int32: steps run, the limit, the stop ids' count, then
// per row 0 (not live), 1 (live, no stop id yet) or 2 (live, produced one).
inline constexpr int kLoopStateHead = 3 + kLoopMaxStops;
inline constexpr int kLoopSteps = 0, kLoopLimit = 1, kLoopStops = 2, kLoopStopIds = 3;

struct LoopControlArgs {
  const int32_t* ids = nullptr;  // [rows]: the step's sampled ids
  int32_t rows = 0;
  int32_t* ring = nullptr;       // [max_steps, ring_stride]
  int32_t ring_stride = 0;       // ids a ring row holds (>= rows)
  int32_t max_steps = 0;         // the ring's rows; the limit never exceeds it
  int32_t* state = nullptr;      // see above
};

// Launches the control kernel (one block, a thread per row) on `stream`, which is capturing
// the loop's body. cudaErrorInvalidValue for rows outside [1, kLoopMaxRows], a ring
// narrower than the rows or a missing buffer.
cudaError_t LaunchLoopControl(cudaGraphConditionalHandle handle, const LoopControlArgs& a,
                              cudaStream_t stream);

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_LOOP_CONTROL_CUH_
