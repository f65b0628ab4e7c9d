// Top-k by k rounds of selection per row: each element gets a 64-bit key that orders it
// (the value's bits made monotonic in the high half, the inverted index in the low half,
// so that the keys are distinct and ties go to the lower index), and round r takes the
// largest key below the one round r − 1 took. O(k · n) reads per row, no workspace and no
// shared memory beyond the reduction: meant for sampling-sized k (tens), correct up to
// kTopkMaxK. Rows of up to kWarpMaxN elements (a mixture of experts' router logits) take
// a warp each instead, its keys held in registers and each round a warp-wide max, with no
// block barrier (H200, one row of 128 experts and top 8: the block kernel's 8 rounds of
// reads and three barriers each took 7.3 us a node in the eager step).
#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/topk.cuh"

namespace sg::kernels {
namespace {

constexpr int kThreads = 256;

// Monotonic in the float's value (-0 and +0 equal); every NaN maps to one value above +inf, and nothing
// reaches 0xFFFFFFFF, so no key equals the first round's bound.
__device__ __forceinline__ uint32_t Ordered(float v) {
  if (v != v) return 0xFFFFFFFEu;
  if (v == 0.0f) v = 0.0f;  // -0 ties with +0, as the values compare
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ uint64_t MaxKey(uint64_t v, uint64_t* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const uint64_t o = __shfl_xor_sync(kFullMask, v, offset);
    v = o > v ? o : v;
  }
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / kWarpSize) ? scratch[lane] : 0;
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      const uint64_t o = __shfl_xor_sync(kFullMask, v, offset);
      v = o > v ? o : v;
    }
    if (lane == 0) scratch[kWarpSize] = v;
  }
  __syncthreads();
  const uint64_t r = scratch[kWarpSize];
  __syncthreads();
  return r;
}

// The key of element j of value v.
__device__ __forceinline__ uint64_t Key(float v, int64_t j) {
  return (uint64_t{Ordered(v)} << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(j));
}
__device__ __forceinline__ int64_t KeyIndex(uint64_t key) {
  return 0xFFFFFFFFu - static_cast<uint32_t>(key & 0xFFFFFFFFu);
}

constexpr int kWarpKeys = 8;  // per lane
constexpr int64_t kWarpMaxN = kWarpKeys * kWarpSize;
constexpr int kWarpRows = 4;  // rows (warps) per block

template <typename T>
__global__ void __launch_bounds__(kWarpRows* kWarpSize)
    WarpTopkKernel(const T* __restrict__ x, T* __restrict__ values, int32_t* __restrict__ indices,
                   int64_t rows, int64_t n, int64_t k) {
  AwaitPrerequisiteGrids();
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpRows + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // the whole warp
  const T* in = x + row * n;
  // Key 0 is below every element's (Ordered maps no value to 0), so a slot past n or one
  // already taken never wins.
  uint64_t key[kWarpKeys];
#pragma unroll
  for (int i = 0; i < kWarpKeys; ++i) {
    const int64_t j = static_cast<int64_t>(i) * kWarpSize + lane;
    key[i] = j < n ? Key(ToFloat(in[j]), j) : 0;
  }
  for (int64_t r = 0; r < k; ++r) {
    uint64_t best = 0;
#pragma unroll
    for (int i = 0; i < kWarpKeys; ++i) best = key[i] > best ? key[i] : best;
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      const uint64_t o = __shfl_xor_sync(kFullMask, best, offset);
      best = o > best ? o : best;
    }
    // Keys are distinct: only the owner's slot matches.
#pragma unroll
    for (int i = 0; i < kWarpKeys; ++i) key[i] = key[i] == best ? 0 : key[i];
    if (lane == 0) {
      const int64_t j = KeyIndex(best);
      if (values != nullptr) values[row * k + r] = in[j];
      indices[row * k + r] = static_cast<int32_t>(j);
    }
  }
}

template <typename T>
__global__ void TopkKernel(const T* __restrict__ x, T* __restrict__ values,
                           int32_t* __restrict__ indices, int64_t n, int64_t k) {
  AwaitPrerequisiteGrids();
  __shared__ uint64_t scratch[kWarpSize + 1];
  const int64_t row = blockIdx.x;
  const T* in = x + row * n;
  uint64_t bound = ~uint64_t{0};
  for (int64_t r = 0; r < k; ++r) {
    uint64_t best = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const uint64_t key = Key(ToFloat(in[j]), j);
      if (key < bound && key > best) best = key;
    }
    best = MaxKey(best, scratch);
    bound = best;
    if (threadIdx.x == 0) {
      const int64_t j = KeyIndex(best);
      if (values != nullptr) values[row * k + r] = in[j];
      indices[row * k + r] = static_cast<int32_t>(j);
    }
  }
}

}  // namespace

cudaError_t LaunchTopk(const void* x, void* values, int32_t* indices, int64_t rows, int64_t n,
                       int64_t k, DType dtype, Stream stream) {
  if (rows <= 0 || rows > 0x7fffffff || n <= 0 || n > 0x7fffffff || k <= 0 || k > n ||
      k > kTopkMaxK) {
    return cudaErrorInvalidValue;
  }
  return DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (n <= kWarpMaxN) {
      return LaunchKernel(WarpTopkKernel<T>, dim3(static_cast<unsigned>(CeilDiv(rows, kWarpRows))),
                          dim3(kWarpRows * kWarpSize), stream, static_cast<const T*>(x),
                          static_cast<T*>(values), indices, rows, n, k);
    }
    return LaunchKernel(TopkKernel<T>, dim3(static_cast<unsigned>(rows)), dim3(kThreads), stream,
                        static_cast<const T*>(x), static_cast<T*>(values), indices, n, k);
  });
}

}  // namespace sg::kernels
