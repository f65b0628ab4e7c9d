// The row-wise family.
//
// RmsNorm: one block per row, up to 1024 threads, 16-byte vectors. Each thread keeps its
// first kRowCache vectors of the row in registers between the sum-of-squares pass and the
// write pass, so a row of up to 1024 * kRowCache vectors is read from memory once
// (kernels/rms_norm_row.cuh, shared with the RmsNorm compiled for a plan).
//
// Softmax: rows reach 128256 elements (a vocabulary), too long for one SM to finish fast,
// so each row is spread over a cluster of kSoftmaxCluster blocks. Every block makes one
// pass over its slice keeping a running (max, sum of exp) per thread, reduces it over the
// block with shuffles and over the cluster through distributed shared memory, and then
// writes exp(x − max) / sum from the registers it kept (or by re-reading what did not fit).
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>

#include "kernels/common.cuh"
#include "kernels/norm.cuh"
#include "kernels/rms_norm_row.cuh"

namespace sg::kernels {
namespace {

namespace cg = cooperative_groups;

constexpr int kRowCache = kRmsNormRowCache;
constexpr int kMaxThreads = 1024;

// One block per row; the row math is kernels/rms_norm_row.cuh's, which the RmsNorm
// compiled for a plan runs too.
template <typename T, int W>
__global__ void __launch_bounds__(kMaxThreads)
    RmsNormKernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                  int64_t h, float eps) {
  __shared__ float scratch[kWarpSize + 1];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * h;
  RmsNormRow<T, W, kRowCache, false>(x + row, w, y + row, h, eps, scratch);
}

constexpr int kSoftmaxCluster = 8;
constexpr int kSoftmaxThreads = 512;

// A running softmax denominator: sum = Σ exp(x − max) over the elements seen.
struct MaxSum {
  float max;
  float sum;
};

__device__ __forceinline__ MaxSum Combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  // A part that saw only -inf has sum 0 and must not turn into exp(-inf - -inf) = NaN.
  const float sa = a.sum == 0.0f ? 0.0f : a.sum * expf(a.max - m);
  const float sb = b.sum == 0.0f ? 0.0f : b.sum * expf(b.max - m);
  return {m, sa + sb};
}

__device__ __forceinline__ MaxSum WarpCombine(MaxSum v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    MaxSum other{__shfl_xor_sync(kFullMask, v.max, offset),
                 __shfl_xor_sync(kFullMask, v.sum, offset)};
    v = Combine(v, other);
  }
  return v;
}

template <typename T, int W>
__device__ __forceinline__ void AccumulateVec(const Vec<T, W>& v, MaxSum& acc) {
  float f[W];
  float vmax = -INFINITY;
#pragma unroll
  for (int e = 0; e < W; ++e) {
    f[e] = ToFloat(v.v[e]);
    vmax = fmaxf(vmax, f[e]);
  }
  if (vmax == -INFINITY) return;  // contributes nothing
  if (vmax > acc.max) {
    acc.sum = acc.sum == 0.0f ? 0.0f : acc.sum * expf(acc.max - vmax);
    acc.max = vmax;
  }
#pragma unroll
  for (int e = 0; e < W; ++e) acc.sum += expf(f[e] - acc.max);
}

// grid (kSoftmaxCluster, min(rows, 65535)): the blocks of one cluster share a row; rank r
// owns the r-th slice of its vectors.
template <typename T, int W>
__global__ void __launch_bounds__(kSoftmaxThreads, 1) __cluster_dims__(kSoftmaxCluster, 1, 1)
    SoftmaxKernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n) {
  AwaitPrerequisiteGrids();
  __shared__ MaxSum warp_stats[kWarpSize];
  __shared__ MaxSum block_stats;
  __shared__ MaxSum row_stats;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int64_t vectors = n / W;
  const int64_t slice = CeilDiv(vectors, kSoftmaxCluster);
  const int64_t begin = std::min<int64_t>(vectors, rank * slice);
  const int64_t end = std::min<int64_t>(vectors, begin + slice);
  const int64_t stride = blockDim.x;

  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const T* xr = x + row * n;
    T* yr = y + row * n;
    Vec<T, W> cache[kRowCache];
#pragma unroll
    for (int c = 0; c < kRowCache; ++c) {
      const int64_t i = begin + threadIdx.x + c * stride;
      if (i < end) cache[c] = LoadVec<T, W>(xr + i * W);
    }
    MaxSum acc{-INFINITY, 0.0f};
#pragma unroll
    for (int c = 0; c < kRowCache; ++c) {
      if (begin + threadIdx.x + c * stride < end) AccumulateVec<T, W>(cache[c], acc);
    }
    for (int64_t i = begin + threadIdx.x + kRowCache * stride; i < end; i += stride) {
      AccumulateVec<T, W>(LoadVec<T, W>(xr + i * W), acc);
    }

    acc = WarpCombine(acc);
    if (lane == 0) warp_stats[warp] = acc;
    __syncthreads();
    if (warp == 0) {
      const int warps = blockDim.x / kWarpSize;
      acc = WarpCombine(lane < warps ? warp_stats[lane] : MaxSum{-INFINITY, 0.0f});
      if (lane == 0) block_stats = acc;
    }
    cluster.sync();  // every block's stats are visible to the cluster
    if (warp == 0) {
      MaxSum part{-INFINITY, 0.0f};
      if (lane < kSoftmaxCluster) part = *cluster.map_shared_rank(&block_stats, lane);
      part = WarpCombine(part);
      if (lane == 0) row_stats = part;
    }
    // No block may move on (and overwrite block_stats, or exit) while another still reads
    // its stats; this also publishes row_stats to the block.
    cluster.sync();
    const float row_max = row_stats.max;
    const float inv_sum = 1.0f / row_stats.sum;

    auto write = [&](int64_t i, const Vec<T, W>& v) {
      Vec<T, W> out;
#pragma unroll
      for (int e = 0; e < W; ++e) {
        out.v[e] = FromFloat<T>(expf(ToFloat(v.v[e]) - row_max) * inv_sum);
      }
      StoreVec<T, W>(yr + i * W, out);
    };
#pragma unroll
    for (int c = 0; c < kRowCache; ++c) {
      const int64_t i = begin + threadIdx.x + c * stride;
      if (i < end) write(i, cache[c]);
    }
    for (int64_t i = begin + threadIdx.x + kRowCache * stride; i < end; i += stride) {
      write(i, LoadVec<T, W>(xr + i * W));
    }
  }
}

}  // namespace

cudaError_t LaunchRmsNorm(const void* x, const void* w, void* y, int64_t rows, int64_t h,
                          float eps, DType dtype, Stream stream) {
  if (rows <= 0 || h <= 0) return cudaErrorInvalidValue;
  return DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vectorize =
        h % kVec16<T> == 0 && Aligned16(x) && Aligned16(w) && Aligned16(y);
    return DispatchVecWidth<T>(vectorize, [&](auto width) {
      constexpr int W = decltype(width)::value;
      const int64_t threads = std::min<int64_t>(kMaxThreads, CeilDiv(h / W, kWarpSize) * kWarpSize);
      return LaunchKernel(RmsNormKernel<T, W>, dim3(static_cast<unsigned>(rows)),
                          dim3(static_cast<unsigned>(threads)), stream, static_cast<const T*>(x),
                          static_cast<const T*>(w), static_cast<T*>(y), h, eps);
    });
  });
}

cudaError_t LaunchSoftmax(const void* x, void* y, int64_t rows, int64_t n, DType dtype,
                          Stream stream) {
  if (rows <= 0 || n <= 0) return cudaErrorInvalidValue;
  return DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vectorize = n % kVec16<T> == 0 && Aligned16(x) && Aligned16(y);
    return DispatchVecWidth<T>(vectorize, [&](auto width) {
      constexpr int W = decltype(width)::value;
      const dim3 grid(kSoftmaxCluster, static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
      return LaunchKernel(SoftmaxKernel<T, W>, grid, dim3(kSoftmaxThreads), stream,
                          static_cast<const T*>(x), static_cast<T*>(y), rows, n);
    });
  });
}

}  // namespace sg::kernels
