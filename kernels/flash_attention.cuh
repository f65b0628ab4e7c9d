// Launcher of the C ABI's attention over whole sequences (stepgraph_flash_attention).
#ifndef STEPGRAPH_KERNELS_FLASH_ATTENTION_CUH_
#define STEPGRAPH_KERNELS_FLASH_ATTENTION_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/launch.h"
#include "stepgraph/base/dtype.h"

namespace sg::kernels {

constexpr int64_t kFlashMaxHeadDim = 256;

// out[b, i, h] = softmax(scale · q[b, i, h] · K[b, j, g]ᵀ over the keys j (j <= i when
// causal)) · V[b, j, g], g = h / (heads / kv_heads). q and out [batch, seq, heads,
// head_dim], k and v [batch, seq, kv_heads, head_dim]. seq < 2^31, heads and batch <= 65535,
// head_dim <= kFlashMaxHeadDim.
cudaError_t LaunchFlashAttention(const void* q, const void* k, const void* v, void* out,
                                 int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                 int64_t head_dim, float scale, bool causal, DType dtype,
                                 Stream stream);

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_FLASH_ATTENTION_CUH_
