// Launchers for the row-wise family: RmsNorm and Softmax over the last dim of a [rows, n]
// tensor (f32, bf16, f16 storage; f32 math). One launch on `stream` each; the result is
// cudaGetLastError() after it.
#ifndef STEPGRAPH_KERNELS_NORM_CUH_
#define STEPGRAPH_KERNELS_NORM_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/launch.h"
#include "stepgraph/base/dtype.h"

namespace sg::kernels {

// y = round(x · rsqrt(mean(x²) + eps)) · w per row, x and y [rows, h], w [h], with the
// intermediate rounded to `dtype` as Hugging Face does.
cudaError_t LaunchRmsNorm(const void* x, const void* w, void* y, int64_t rows, int64_t h,
                          float eps, DType dtype, Stream stream);

// y = exp(x − max) / Σ exp(x − max) per row of [rows, n]. Needs compute capability 9.0
// (each row is spread over a cluster of blocks).
cudaError_t LaunchSoftmax(const void* x, void* y, int64_t rows, int64_t n, DType dtype,
                          Stream stream);

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_NORM_CUH_
