// Attention over whole sequences with the online softmax (the flash-attention recurrence):
// no score matrix is stored. One warp per (batch, head, query): the lanes split head_dim
// (at most 8 dims each), and the warp walks the keys one by one, keeping the running max,
// the running sum and the weighted values in registers. Correct for every shape the C ABI
// takes, and not tuned: no tiling of keys through shared memory, no tensor cores.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/flash_attention.cuh"

namespace sg::kernels {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxPerLane = static_cast<int>(kFlashMaxHeadDim / kWarpSize);

template <typename T>
__global__ void FlashAttentionKernel(const T* __restrict__ q, const T* __restrict__ k,
                                     const T* __restrict__ v, T* __restrict__ out, int64_t seq,
                                     int64_t heads, int64_t kv_heads, int64_t head_dim,
                                     float scale, bool causal) {
  AwaitPrerequisiteGrids();
  const int lane = threadIdx.x % kWarpSize;
  const int64_t i = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (i >= seq) return;  // whole warps leave together
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t g = h / (heads / kv_heads);
  const T* qrow = q + ((b * seq + i) * heads + h) * head_dim;
  float qv[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int t = 0; t < kMaxPerLane; ++t) {
    const int64_t d = lane + int64_t{t} * kWarpSize;
    qv[t] = d < head_dim ? ToFloat(qrow[d]) : 0.0f;
    acc[t] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int64_t last = causal ? i : seq - 1;
  for (int64_t j = 0; j <= last; ++j) {
    const T* krow = k + ((b * seq + j) * kv_heads + g) * head_dim;
    const T* vrow = v + ((b * seq + j) * kv_heads + g) * head_dim;
    float s = 0.0f;
#pragma unroll
    for (int t = 0; t < kMaxPerLane; ++t) {
      const int64_t d = lane + int64_t{t} * kWarpSize;
      if (d < head_dim) s += qv[t] * ToFloat(krow[d]);
    }
    s = WarpSum(s) * scale;
    const float m_new = fmaxf(m, s);
    const float correction = expf(m - m_new);  // 0 on the first key (m = -inf)
    const float p = expf(s - m_new);
    l = l * correction + p;
#pragma unroll
    for (int t = 0; t < kMaxPerLane; ++t) {
      const int64_t d = lane + int64_t{t} * kWarpSize;
      if (d < head_dim) acc[t] = acc[t] * correction + p * ToFloat(vrow[d]);
    }
    m = m_new;
  }
  T* orow = out + ((b * seq + i) * heads + h) * head_dim;
  const float inv = 1.0f / l;
#pragma unroll
  for (int t = 0; t < kMaxPerLane; ++t) {
    const int64_t d = lane + int64_t{t} * kWarpSize;
    if (d < head_dim) orow[d] = FromFloat<T>(acc[t] * inv);
  }
}

}  // namespace

cudaError_t LaunchFlashAttention(const void* q, const void* k, const void* v, void* out,
                                 int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                 int64_t head_dim, float scale, bool causal, DType dtype,
                                 Stream stream) {
  if (batch <= 0 || batch > 65535 || seq <= 0 || seq > 0x7fffffff || heads <= 0 ||
      heads > 65535 || kv_heads <= 0 || heads % kv_heads != 0 || head_dim <= 0 ||
      head_dim > kFlashMaxHeadDim) {
    return cudaErrorInvalidValue;
  }
  return DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(static_cast<unsigned>(CeilDiv(seq, kWarpsPerBlock)),
                    static_cast<unsigned>(heads), static_cast<unsigned>(batch));
    return LaunchKernel(FlashAttentionKernel<T>, grid, dim3(kWarpsPerBlock * kWarpSize), stream,
                        static_cast<const T*>(q), static_cast<const T*>(k),
                        static_cast<const T*>(v), static_cast<T*>(out), seq, heads, kv_heads,
                        head_dim, scale, causal);
  });
}

}  // namespace sg::kernels
