// Empty-kernel launches for capture_bench's floor (see empty_chain.cu).
#ifndef STEPGRAPH_BENCH_EMPTY_CHAIN_H_
#define STEPGRAPH_BENCH_EMPTY_CHAIN_H_

#include <cuda_runtime_api.h>

namespace sg::bench {

// Launches n empty one-warp kernels on `stream` (programmatically serialised when asked),
// each after the one before; capturable.
cudaError_t LaunchEmptyKernels(cudaStream_t stream, int n, bool programmatic);

}  // namespace sg::bench

#endif  // STEPGRAPH_BENCH_EMPTY_CHAIN_H_
