// The training kernels of the C ABI (see training.cuh). Row kernels (cross entropy) give one
// block to a row and make three passes over it (max, sum of exponentials, write), which
// reads the row three times but needs no workspace; the elementwise ones (AdamW, the
// clipping scale) are grid-stride loops over a few waves of blocks.
#include <algorithm>
#include <cmath>

#include "kernels/common.cuh"
#include "kernels/training.cuh"

namespace sg::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

int GridFor(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>(CeilDiv(n, kThreads), 1, kMaxBlocks));
}

// A max that keeps NaN, so that a NaN logit makes the row's loss NaN as in PyTorch.
__device__ __forceinline__ float MaxNan(float a, float b) {
  return (a > b || a != a) ? a : b;
}

__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = MaxNan(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
    v = lane < warps ? scratch[lane] : -INFINITY;
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      v = MaxNan(v, __shfl_xor_sync(kFullMask, v, offset));
    }
    if (lane == 0) scratch[kWarpSize] = v;
  }
  __syncthreads();
  const float r = scratch[kWarpSize];
  __syncthreads();  // the scratch may be reused at once
  return r;
}

// logsumexp of one row, returned to every thread of the block.
template <typename T>
__device__ float RowLogSumExp(const T* row, int64_t vocab, float* scratch) {
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) m = MaxNan(m, ToFloat(row[j]));
  m = BlockMax(m, scratch);
  if (m == -INFINITY || m != m) return m;  // all -inf, or a NaN: nothing to normalise
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) s += expf(ToFloat(row[j]) - m);
  s = BlockSum(s, scratch);
  return m + logf(s);
}

template <typename T>
__global__ void CrossEntropyKernel(const T* __restrict__ logits, const int32_t* __restrict__ targets,
                                   float* __restrict__ loss, T* __restrict__ log_probs,
                                   int64_t vocab, int32_t ignore_index,
                                   uint32_t* __restrict__ error_flags, uint32_t token_flag) {
  AwaitPrerequisiteGrids();
  __shared__ float scratch[kWarpSize + 1];
  const int64_t i = blockIdx.x;
  const T* row = logits + i * vocab;
  const float lse = RowLogSumExp(row, vocab, scratch);
  if (log_probs != nullptr) {
    T* out = log_probs + i * vocab;
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
      out[j] = FromFloat<T>(ToFloat(row[j]) - lse);
    }
  }
  if (threadIdx.x == 0) {
    const int32_t t = targets[i];
    float l = 0.0f;
    if (t != ignore_index) {
      if (t >= 0 && t < vocab) {
        l = lse - ToFloat(row[t]);
      } else {
        atomicOr(error_flags, token_flag);
      }
    }
    loss[i] = l;
  }
}

template <typename T>
__global__ void CrossEntropyBackwardKernel(const T* __restrict__ logits,
                                           const int32_t* __restrict__ targets,
                                           const float* __restrict__ dloss,
                                           T* __restrict__ dlogits, int64_t vocab,
                                           int32_t ignore_index,
                                           uint32_t* __restrict__ error_flags,
                                           uint32_t token_flag) {
  AwaitPrerequisiteGrids();
  __shared__ float scratch[kWarpSize + 1];
  const int64_t i = blockIdx.x;
  const T* row = logits + i * vocab;
  T* out = dlogits + i * vocab;
  const int32_t t = targets[i];
  const bool in_range = t >= 0 && t < vocab;
  if (t == ignore_index || !in_range) {
    if (t != ignore_index && threadIdx.x == 0) atomicOr(error_flags, token_flag);
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) out[j] = FromFloat<T>(0.0f);
    return;
  }
  const float lse = RowLogSumExp(row, vocab, scratch);
  const float g = dloss[i];
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float p = expf(ToFloat(row[j]) - lse);
    out[j] = FromFloat<T>(g * (p - (j == t ? 1.0f : 0.0f)));
  }
}

template <typename T>
__global__ void MoeAuxLossKernel(const T* __restrict__ probs, const int32_t* __restrict__ ids,
                                 float* __restrict__ loss, int64_t tokens, int64_t experts,
                                 int64_t top_k, uint32_t* __restrict__ error_flags,
                                 uint32_t token_flag) {
  AwaitPrerequisiteGrids();
  __shared__ float prob_sum[kMoeMaxExperts];
  __shared__ unsigned int count[kMoeMaxExperts];
  __shared__ float scratch[kWarpSize + 1];
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) {
    prob_sum[e] = 0.0f;
    count[e] = 0;
  }
  __syncthreads();
  const int64_t n = tokens * experts;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    atomicAdd(&prob_sum[i % experts], ToFloat(probs[i]));
  }
  const int64_t choices = tokens * top_k;
  bool bad = false;
  for (int64_t i = threadIdx.x; i < choices; i += blockDim.x) {
    const int32_t e = ids[i];
    if (e >= 0 && e < experts) {
      atomicAdd(&count[e], 1u);
    } else {
      bad = true;
    }
  }
  if (bad) atomicOr(error_flags, token_flag);
  __syncthreads();
  float s = 0.0f;
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) {
    s += static_cast<float>(count[e]) * prob_sum[e];
  }
  s = BlockSum(s, scratch);
  if (threadIdx.x == 0) {
    const float t = static_cast<float>(tokens);
    *loss = static_cast<float>(experts) * s / (t * t);
  }
}

template <typename G>
__global__ void AdamWKernel(float* __restrict__ param, const G* __restrict__ grad,
                            float* __restrict__ m, float* __restrict__ v, int64_t n, float beta1,
                            float beta2, float eps, float decay, float step_size,
                            float bc2_sqrt) {
  AwaitPrerequisiteGrids();
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = ToFloat(grad[i]);
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float p = param[i] * decay;
    param[i] = p - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
  }
}

template <typename T>
__global__ void SumSquaresKernel(const T* __restrict__ g, int64_t n, float* __restrict__ acc) {
  AwaitPrerequisiteGrids();
  __shared__ float scratch[kWarpSize + 1];
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  float s = 0.0f;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = ToFloat(g[i]);
    s += x * x;
  }
  s = BlockSum(s, scratch);
  if (threadIdx.x == 0) atomicAdd(acc, s);
}

__global__ void SqrtKernel(float* __restrict__ v) {
  AwaitPrerequisiteGrids();
  *v = sqrtf(*v);
}

template <typename T>
__global__ void ClipKernel(T* __restrict__ g, int64_t n, const float* __restrict__ norm,
                           float max_norm) {
  AwaitPrerequisiteGrids();
  const float coef = max_norm / (*norm + 1e-6f);
  if (!(coef < 1.0f)) return;  // PyTorch clamps the coefficient to 1: nothing changes
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    g[i] = FromFloat<T>(ToFloat(g[i]) * coef);
  }
}

}  // namespace

cudaError_t LaunchCrossEntropy(const void* logits, const int32_t* targets, float* loss,
                               void* log_probs, int64_t rows, int64_t vocab,
                               int32_t ignore_index, DType dtype, uint32_t* error_flags,
                               uint32_t token_flag, Stream stream) {
  if (rows <= 0 || rows > 0x7fffffff || vocab <= 0) return cudaErrorInvalidValue;
  return DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return LaunchKernel(CrossEntropyKernel<T>, dim3(static_cast<unsigned>(rows)),
                        dim3(kThreads), stream, static_cast<const T*>(logits), targets, loss,
                        static_cast<T*>(log_probs), vocab, ignore_index, error_flags,
                        token_flag);
  });
}

cudaError_t LaunchCrossEntropyBackward(const void* logits, const int32_t* targets,
                                       const float* dloss, void* dlogits, int64_t rows,
                                       int64_t vocab, int32_t ignore_index, DType dtype,
                                       uint32_t* error_flags, uint32_t token_flag,
                                       Stream stream) {
  if (rows <= 0 || rows > 0x7fffffff || vocab <= 0) return cudaErrorInvalidValue;
  return DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return LaunchKernel(CrossEntropyBackwardKernel<T>, dim3(static_cast<unsigned>(rows)),
                        dim3(kThreads), stream, static_cast<const T*>(logits), targets, dloss,
                        static_cast<T*>(dlogits), vocab, ignore_index, error_flags,
                        token_flag);
  });
}

cudaError_t LaunchMoeAuxLoss(const void* router_probs, const int32_t* expert_ids, float* loss,
                             int64_t tokens, int64_t experts, int64_t top_k, DType dtype,
                             uint32_t* error_flags, uint32_t token_flag, Stream stream) {
  if (tokens <= 0 || experts <= 0 || experts > kMoeMaxExperts || top_k <= 0 ||
      top_k > experts) {
    return cudaErrorInvalidValue;
  }
  return DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return LaunchKernel(MoeAuxLossKernel<T>, dim3(1), dim3(1024), stream,
                        static_cast<const T*>(router_probs), expert_ids, loss, tokens, experts,
                        top_k, error_flags, token_flag);
  });
}

cudaError_t LaunchAdamW(float* param, const void* grad, float* exp_avg, float* exp_avg_sq,
                        int64_t n, float beta1, float beta2, float eps, float decay,
                        float step_size, float bc2_sqrt, DType grad_dtype,
                        Stream stream) {
  if (n <= 0) return cudaErrorInvalidValue;
  return DispatchFloat(grad_dtype, [&](auto tag) {
    using G = typename decltype(tag)::type;
    return LaunchKernel(AdamWKernel<G>, dim3(GridFor(n)), dim3(kThreads), stream, param,
                        static_cast<const G*>(grad), exp_avg, exp_avg_sq, n, beta1, beta2, eps,
                        decay, step_size, bc2_sqrt);
  });
}

cudaError_t LaunchClipGradNorm(void* const* grads, const int64_t* sizes, int64_t count,
                               float max_norm, DType dtype, float* total_norm,
                               Stream stream) {
  if (count <= 0) return cudaErrorInvalidValue;
  return DispatchFloat(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    cudaError_t e = cudaMemsetAsync(total_norm, 0, sizeof(float), stream.stream);
    for (int64_t b = 0; b < count && e == cudaSuccess; ++b) {
      e = LaunchKernel(SumSquaresKernel<T>, dim3(GridFor(sizes[b])), dim3(kThreads), stream,
                       static_cast<const T*>(grads[b]), sizes[b], total_norm);
    }
    if (e == cudaSuccess) e = LaunchKernel(SqrtKernel, dim3(1), dim3(1), stream, total_norm);
    for (int64_t b = 0; b < count && e == cudaSuccess; ++b) {
      e = LaunchKernel(ClipKernel<T>, dim3(GridFor(sizes[b])), dim3(kThreads), stream,
                       static_cast<T*>(grads[b]), sizes[b],
                       static_cast<const float*>(total_norm), max_norm);
    }
    return e;
  });
}

}  // namespace sg::kernels
