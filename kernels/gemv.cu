// The small-M matmul. A block computes kCols consecutive outputs columns (rows of w) for all
// M rows of x; its warps split K between them, and each lane walks K in 16-byte vectors, so
// a warp's load of one column is 512 contiguous bytes and a block keeps kCols · 16 bytes per
// thread in flight. w is read with the streaming hint (evict-first: it is used once per
// step and should not push x or the KV cache out of L2); x is re-read by every block and
// comes from L1/L2.
//
// Reduction: a lane ends with kRows · kCols partial sums. Instead of one 5-step shuffle
// tree per sum, a transposing reduction halves the values each lane holds at every step
// (the lane sends the half its partner keeps), so 32 sums cost 31 shuffles instead of 160
// and end spread one per lane. The warps' results meet in shared memory, where kRows ·
// kCols threads add them, add the bias and store.
#include <algorithm>
#include <cstring>

#include "kernels/common.cuh"
#include "kernels/gemv.cuh"

namespace sg::kernels {
namespace {

constexpr int kCols = 4;
constexpr int kMaxWarps = 8;

constexpr int NextPow2(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}
constexpr int Log2(int v) {
  int l = 0;
  while ((1 << l) < v) ++l;
  return l;
}

// Transposing reduction of kLen sums held by every lane: each step pairs lanes `offset`
// apart, and a lane keeps one half of its sums (adding its partner's copy of that half)
// while handing over the other, so the count per lane halves. After log2(kLen) steps lane
// L holds sum index L >> (5 - log2(kLen)), added over the lanes that share that index.
// A template recursion rather than a loop, so that every index into acc is a constant
// and acc stays in registers.
template <int kLen, int kOffset>
__device__ __forceinline__ void TransposeReduce(float* acc, int lane) {
  if constexpr (kLen > 1) {
    constexpr int kHalf = kLen / 2;
    const bool upper = (lane & kOffset) != 0;
#pragma unroll
    for (int i = 0; i < kHalf; ++i) {
      const float send = upper ? acc[i] : acc[i + kHalf];
      const float keep = upper ? acc[i + kHalf] : acc[i];
      acc[i] = keep + __shfl_xor_sync(kFullMask, send, kOffset);
    }
    TransposeReduce<kHalf, kOffset / 2>(acc, lane);
  }
}

template <typename T, int W, int kRows>
__global__ void __launch_bounds__(kMaxWarps* kWarpSize)
    GemvKernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
               T* __restrict__ y, int64_t n, int64_t k) {
  AwaitPrerequisiteGrids();
  constexpr int kAcc = kRows * kCols;
  constexpr int kPadded = NextPow2(kAcc);
  constexpr int kStages = Log2(kPadded);
  static_assert(kPadded <= kWarpSize, "one reduced sum per lane at most");
  __shared__ float partial[kMaxWarps][kPadded];

  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kCols;
  // Columns past n (last block) read row n-1 and are discarded: no branch in the loop.
  const T* wrow[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) wrow[c] = w + std::min<int64_t>(n0 + c, n - 1) * k;

  float acc[kPadded];
#pragma unroll
  for (int i = 0; i < kPadded; ++i) acc[i] = 0.0f;

  const int64_t vectors = k / W;
  for (int64_t v = static_cast<int64_t>(warp) * kWarpSize + lane; v < vectors;
       v += static_cast<int64_t>(warps) * kWarpSize) {
    Vec<T, W> wv[kCols];
    Vec<T, W> xv[kRows];
#pragma unroll
    for (int c = 0; c < kCols; ++c) wv[c] = LoadStreaming<T, W>(wrow[c] + v * W);
#pragma unroll
    for (int r = 0; r < kRows; ++r) xv[r] = LoadVec<T, W>(x + r * k + v * W);
#pragma unroll
    for (int e = 0; e < W; ++e) {
      float xf[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) xf[r] = ToFloat(xv[r].v[e]);
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const float wf = ToFloat(wv[c].v[e]);
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r * kCols + c] = fmaf(xf[r], wf, acc[r * kCols + c]);
      }
    }
  }

  TransposeReduce<kPadded, kWarpSize / 2>(acc, lane);
  float sum = acc[0];
#pragma unroll
  for (int offset = (kWarpSize / 2) >> kStages; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(kFullMask, sum, offset);
  }
  constexpr int kLanesPerSum = kWarpSize >> kStages;
  if (lane % kLanesPerSum == 0) partial[warp][lane / kLanesPerSum] = sum;
  __syncthreads();

  if (threadIdx.x < kAcc) {
    float total = 0.0f;
    for (int i = 0; i < warps; ++i) total += partial[i][threadIdx.x];
    const int r = threadIdx.x / kCols;
    const int64_t col = n0 + threadIdx.x % kCols;
    if (col < n) {
      if (bias != nullptr) total += ToFloat(bias[col]);
      y[r * n + col] = FromFloat<T>(total);
    }
  }
}

static_assert(kGemvMaxRows == kMaxDispatchRows, "DispatchRows covers every row count");

}  // namespace

cudaError_t LaunchGemv(const void* x, const void* w, const void* bias, void* y, int64_t m,
                       int64_t n, int64_t k, DType dtype, Stream stream) {
  if (n <= 0 || k <= 0) return cudaErrorInvalidValue;
  return DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Row starts of x and w stay 16-byte aligned only when K fills whole vectors.
    const bool vectorize = k % kVec16<T> == 0 && Aligned16(x) && Aligned16(w);
    return DispatchVecWidth<T>(vectorize, [&](auto width) {
      constexpr int W = decltype(width)::value;
      return DispatchRows(m, [&](auto rows) {
        constexpr int kRows = decltype(rows)::value;
        const int64_t warps = std::clamp<int64_t>(CeilDiv(k / W, kWarpSize), 1, kMaxWarps);
        return LaunchKernel(GemvKernel<T, W, kRows>, dim3(static_cast<unsigned>(CeilDiv(n, kCols))),
                            dim3(static_cast<unsigned>(warps * kWarpSize)), stream,
                            static_cast<const T*>(x), static_cast<const T*>(w),
                            static_cast<const T*>(bias), static_cast<T*>(y), n, k);
      });
    });
  });
}

}  // namespace sg::kernels
