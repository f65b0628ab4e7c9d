// The floor for capture_bench's kernel chain: n empty kernels, launched from the host or
// captured into one graph, with and without programmatic dependent launch.
#include "bench/empty_chain.h"

namespace sg::bench {
namespace {

__global__ void EmptyKernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace

cudaError_t LaunchEmptyKernels(cudaStream_t stream, int n, bool programmatic) {
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(1);
  config.blockDim = dim3(32);
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = programmatic ? 1 : 0;
  for (int i = 0; i < n; ++i) {
    if (const cudaError_t e = cudaLaunchKernelEx(&config, EmptyKernel); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace sg::bench
