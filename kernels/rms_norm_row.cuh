// RmsNorm's row math, once, for both of its kernels: kernels/norm.cu's built-in kernel and
// the kernel compiled for a plan through NVRTC (dispatch/cuda/codegen.cc), which includes
// this file with the row's size and eps as compile-time constants. Device code only, like
// kernels/device_common.cuh.
#ifndef STEPGRAPH_KERNELS_RMS_NORM_ROW_CUH_
#define STEPGRAPH_KERNELS_RMS_NORM_ROW_CUH_

#include "kernels/device_common.cuh"

namespace sg::kernels {

// Vectors of the row each thread keeps in registers in the built-in kernel (and the
// compiled one's fallback for unaligned buffers).
constexpr int kRmsNormRowCache = 4;

// y = round(x · rsqrt(mean(x²) + eps)) · w over one row of h elements by one block, with
// the intermediate rounded to T as Hugging Face does (weight * (x * rsqrt(var +
// eps)).to(input_dtype)); f32 math. W elements per access (16-byte vectors, or 1 for
// buffers not 16-byte aligned or h not a multiple of the vector). Each thread keeps its
// first kCache vectors of the row in registers between the sum of squares and the write,
// so a row of up to blockDim.x * kCache vectors is read from memory once. With
// kWeightEarly, w is a graph Weight that no kernel writes: its first kCache vectors per
// thread are loaded before AwaitPrerequisiteGrids, overlapping the previous kernel's tail.
// `scratch` is __shared__ float[kWarpSize + 1].
template <typename T, int W, int kCache, bool kWeightEarly>
__device__ __forceinline__ void RmsNormRow(const T* __restrict__ xr, const T* __restrict__ w,
                                           T* __restrict__ yr, long long h, float eps,
                                           float* scratch) {
  const long long vectors = h / W;
  const long long stride = blockDim.x;
  Vec<T, W> early_w[kWeightEarly ? kCache : 1];
  if constexpr (kWeightEarly) {
#pragma unroll
    for (int c = 0; c < kCache; ++c) {
      const long long i = threadIdx.x + c * stride;
      if (i < vectors) early_w[c] = LoadVec<T, W>(w + i * W);
    }
  }
  AwaitPrerequisiteGrids();

  Vec<T, W> cache[kCache];
  float sum_sq = 0.0f;
  auto accumulate = [&](const Vec<T, W>& v) {
#pragma unroll
    for (int e = 0; e < W; ++e) {
      const float f = ToFloat(v.v[e]);
      sum_sq += f * f;
    }
  };
#pragma unroll
  for (int c = 0; c < kCache; ++c) {
    const long long i = threadIdx.x + c * stride;
    if (i < vectors) cache[c] = LoadVec<T, W>(xr + i * W);
  }
#pragma unroll
  for (int c = 0; c < kCache; ++c) {
    if (threadIdx.x + c * stride < vectors) accumulate(cache[c]);
  }
  for (long long i = threadIdx.x + kCache * stride; i < vectors; i += stride) {
    accumulate(LoadVec<T, W>(xr + i * W));
  }
  sum_sq = BlockSum(sum_sq, scratch);
  // 1 / sqrt rather than rsqrtf: both correctly rounded, as the reference computes it.
  const float inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(h) + eps);

  auto write = [&](long long i, const Vec<T, W>& v, const Vec<T, W>& wv) {
    Vec<T, W> out;
#pragma unroll
    for (int e = 0; e < W; ++e) {
      out.v[e] = FromFloat<T>(RoundTo<T>(ToFloat(v.v[e]) * inv_rms) * ToFloat(wv.v[e]));
    }
    StoreVec<T, W>(yr + i * W, out);
  };
#pragma unroll
  for (int c = 0; c < kCache; ++c) {
    const long long i = threadIdx.x + c * stride;
    if (i >= vectors) continue;
    if constexpr (kWeightEarly) {
      write(i, cache[c], early_w[c]);
    } else {
      write(i, cache[c], LoadVec<T, W>(w + i * W));
    }
  }
  for (long long i = threadIdx.x + kCache * stride; i < vectors; i += stride) {
    write(i, LoadVec<T, W>(xr + i * W), LoadVec<T, W>(w + i * W));
  }
}

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_RMS_NORM_ROW_CUH_
