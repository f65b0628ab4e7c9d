// Launcher of the C ABI's top-k (stepgraph_topk): the k largest of each row, largest first,
// ties by lower index, NaN above everything (as torch.topk).
#ifndef STEPGRAPH_KERNELS_TOPK_CUH_
#define STEPGRAPH_KERNELS_TOPK_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/launch.h"
#include "stepgraph/base/dtype.h"

namespace sg::kernels {

constexpr int64_t kTopkMaxK = 1024;

// values [rows, k] of dtype, indices [rows, k] int32, from x [rows, n]; n < 2^31,
// 1 <= k <= min(n, kTopkMaxK), rows < 2^31. values may be null: the indices only (MoeTopK).
cudaError_t LaunchTopk(const void* x, void* values, int32_t* indices, int64_t rows, int64_t n,
                       int64_t k, DType dtype, Stream stream);

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_TOPK_CUH_
