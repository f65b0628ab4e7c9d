// Whether the current device can take stepgraph's kernels launched with programmatic
// dependent launch (see AwaitPrerequisiteGrids and LaunchKernel in common.cuh). Whether a
// launch uses it is its caller's choice (kernels::Stream), never a process-wide switch.
#include <atomic>

#include <cuda_runtime.h>

#include "kernels/launch.h"

namespace sg::kernels {

bool ProgrammaticLaunchSupported() {
#if STEPGRAPH_KERNELS_PDL
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  // Per device: 0 not yet known, 1 supported, 2 not.
  constexpr int kDevices = 64;
  static std::atomic<int> known[kDevices];
  if (device < 0 || device >= kDevices) return false;
  int state = known[device].load(std::memory_order_relaxed);
  if (state == 0) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    state = major >= 9 ? 1 : 2;
    known[device].store(state, std::memory_order_relaxed);
  }
  return state == 1;
#else
  return false;
#endif
}

}  // namespace sg::kernels
