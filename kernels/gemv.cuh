// Launcher for the small-M matmul used at decode: y[M,N] = x[M,K] · w[N,K]ᵀ (+ bias[N]) for
// M <= kGemvMaxRows, with w in the PyTorch / HF layout (each output column is a row of w).
// The weight is streamed once from memory with 16-byte loads; x stays in cache. One launch
// on `stream`; the result is cudaGetLastError() after it.
#ifndef STEPGRAPH_KERNELS_GEMV_CUH_
#define STEPGRAPH_KERNELS_GEMV_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/launch.h"
#include "stepgraph/base/dtype.h"

namespace sg::kernels {

inline constexpr int64_t kGemvMaxRows = 8;

// x [m, k], w [n, k], bias [n] or nullptr, y [m, n], all of `dtype` (f32, bf16, f16);
// f32 accumulation. cudaErrorInvalidValue for m outside [1, kGemvMaxRows].
cudaError_t LaunchGemv(const void* x, const void* w, const void* bias, void* y, int64_t m,
                       int64_t n, int64_t k, DType dtype, Stream stream);

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_GEMV_CUH_
