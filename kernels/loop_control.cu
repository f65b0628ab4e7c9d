// The decode loop's control kernel (kernels/loop_control.cuh says what it does).
#include <cuda_runtime.h>

#include "kernels/loop_control.cuh"

namespace sg::kernels {
namespace {

__global__ void LoopControl(cudaGraphConditionalHandle handle, LoopControlArgs a) {
  const int i = static_cast<int>(threadIdx.x);
  int32_t* state = a.state;
  const int32_t step = state[kLoopSteps];
  bool done = true;  // this row does not keep the loop going
  if (i < a.rows) {
    const int32_t id = a.ids[i];
    if (step < a.max_steps) a.ring[static_cast<int64_t>(step) * a.ring_stride + i] = id;
    int32_t& row = state[kLoopStateHead + i];
    if (row == 1) {
      const int stops = min(state[kLoopStops], kLoopMaxStops);
      for (int s = 0; s < stops; ++s) {
        if (state[kLoopStopIds + s] == id) row = 2;
      }
    }
    done = row != 1;
  }
  const bool all_done = __syncthreads_and(done);
  if (i == 0) {
    const int32_t ran = step + 1;
    state[kLoopSteps] = ran;
    const int32_t limit = min(state[kLoopLimit], a.max_steps);
    cudaGraphSetConditional(handle, ran < limit && !all_done ? 1u : 0u);
  }
}

}  // namespace

cudaError_t LaunchLoopControl(cudaGraphConditionalHandle handle, const LoopControlArgs& a,
                              cudaStream_t stream) {
  if (a.rows < 1 || a.rows > kLoopMaxRows || a.ring_stride < a.rows || a.max_steps < 1 ||
      a.ids == nullptr || a.ring == nullptr || a.state == nullptr) {
    return cudaErrorInvalidValue;
  }
  // After the whole step (no programmatic early start): it reads the step's ids.
  LoopControl<<<1, (a.rows + 31) / 32 * 32, 0, stream>>>(handle, a);
  return cudaGetLastError();
}

}  // namespace sg::kernels
