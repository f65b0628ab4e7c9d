// Dequantization of block-format weights into float matrices (kernels/dequant.cuh). Blocks
// are read only through kernels/quant_blocks.cuh's Format<t>::Load, the one definition of
// their device layout: four threads take a unit (32 values), consecutive quartets the
// consecutive units of the tensor, so a warp reads contiguous runs of each plane and
// writes contiguous 16-byte vectors. Bandwidth-bound: a Q4_0 weight reads 0.56 bytes a
// value and writes 2 (bf16) or 4 (f32).
#include <algorithm>
#include <cfloat>

#include "kernels/common.cuh"
#include "kernels/dequant.cuh"
#include "kernels/quant_blocks.cuh"

namespace sg::kernels {
namespace {

constexpr int kThreads = 256;
// Grid-stride loops over more work than this many blocks would launch.
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

template <typename Q>
concept LoadsParts = requires(const uint8_t* b) { Q::LoadPart(b, int64_t{0}, int64_t{0}, 0); };

// Units [first, first + count) of a tensor of `blocks` blocks; unit g's values are
// elements 32·g .. 32·g + 31 of the tensor (rows are consecutive runs of units), written
// to out from element 32·first on. Four threads share a unit, each its eighth j of the
// values (8j .. 8j+7, one 16-byte store of a 16-bit T), so a warp's store covers 8 units'
// values contiguously (512 bytes of f16) where a thread per unit would scatter 8-byte
// stores 64 bytes apart; the 32-value formats load only the quant bytes that eighth
// reads (LoadPart), the others the unit (its quarter's loads coincide within the warp).
template <typename T, typename Q>
__global__ void __launch_bounds__(kThreads)
    DequantizeKernel(const uint8_t* __restrict__ w, int64_t blocks, int64_t first, int64_t count,
                     T* __restrict__ out) {
  AwaitPrerequisiteGrids();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; t < 4 * count;
       t += stride) {
    const int64_t u = t >> 2;
    const int j = static_cast<int>(t & 3);
    typename Q::Unit unit;
    if constexpr (LoadsParts<Q>) {
      unit = Q::LoadPart(w, blocks, first + u, j);
    } else {
      unit = Q::Load(w, blocks, first + u);
    }
    float v[8];
    unit.Values8(j, v);
    StoreFloatsVec16<T, 8>(out + 8 * t, v);  // one 16-byte store of 16-bit T, two of f32
  }
}

// The rounding passes read x four floats at a time (one 16-byte load) and write four
// values as one store where `in` is 16-byte aligned and `out` aligned to four of its
// elements (kVec), else one at a time; with kVec the last count % 4 values go to block 0's
// first threads. A pass over x is bound by its bytes only when enough loads are in flight:
// the largest-magnitude pass, with a fixed grid of kRoundScaleBlocks blocks, keeps four
// 16-byte loads in flight per thread.
template <bool kVec>
__device__ __forceinline__ float4 LoadFour(const float* __restrict__ in, int64_t q) {
  if constexpr (kVec) {
    const Vec<float, 4> v = LoadVec<float, 4>(in + 4 * q);
    return make_float4(v.v[0], v.v[1], v.v[2], v.v[3]);
  } else {
    return make_float4(in[4 * q], in[4 * q + 1], in[4 * q + 2], in[4 * q + 3]);
  }
}

template <typename T, bool kVec>
__device__ __forceinline__ void StoreFour(T* __restrict__ out, int64_t q, float4 v, float s) {
  const T a = FromFloat<T>(v.x * s), b = FromFloat<T>(v.y * s), c = FromFloat<T>(v.z * s),
          d = FromFloat<T>(v.w * s);
  if constexpr (kVec) {
    StoreVec<T, 4>(out + 4 * q, Vec<T, 4>{{a, b, c, d}});
  } else {
    out[4 * q] = a;
    out[4 * q + 1] = b;
    out[4 * q + 2] = c;
    out[4 * q + 3] = d;
  }
}

// out = in · s rounded to T over [0, count), s a power of two (1 for the plain rounding),
// so in · s is exact unless it falls below f32's normal range.
template <typename T, bool kVec>
__device__ __forceinline__ void RoundScaledRange(const float* __restrict__ in, T* __restrict__ out,
                                                 int64_t count, float s) {
  const int64_t quads = count / 4;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; q < quads;
       q += stride) {
    StoreFour<T, kVec>(out, q, LoadFour<kVec>(in, q), s);
  }
  const int64_t i = 4 * quads + threadIdx.x;
  if (blockIdx.x == 0 && i < count) out[i] = FromFloat<T>(in[i] * s);
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads)
    RoundFloatsKernel(const float* __restrict__ in, T* __restrict__ out, int64_t count) {
  AwaitPrerequisiteGrids();
  RoundScaledRange<T, kVec>(in, out, count, 1.0f);
}

__device__ __forceinline__ float FiniteAbsMax(float m, float v) {
  const float a = fabsf(v);
  return a <= FLT_MAX ? fmaxf(m, a) : m;  // false for infinities and NaN
}

__device__ __forceinline__ float FiniteAbsMax4(float m, float4 v) {
  return FiniteAbsMax(FiniteAbsMax(FiniteAbsMax(FiniteAbsMax(m, v.x), v.y), v.z), v.w);
}

// Each block's largest finite |in[i]| over its grid-stride share into partial[blockIdx.x]
// (0 when it has none): LaunchRoundFloatsF16Scaled's first pass.
template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    AbsMaxKernel(const float* __restrict__ in, int64_t count, float* __restrict__ partial) {
  AwaitPrerequisiteGrids();
  __shared__ float warp_max[kThreads / kWarpSize];
  const int64_t quads = count / 4;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  float m = 0.0f;
  int64_t q = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (; q + 3 * stride < quads; q += 4 * stride) {
    const float4 a = LoadFour<kVec>(in, q), b = LoadFour<kVec>(in, q + stride),
                 c = LoadFour<kVec>(in, q + 2 * stride), d = LoadFour<kVec>(in, q + 3 * stride);
    m = FiniteAbsMax4(FiniteAbsMax4(FiniteAbsMax4(FiniteAbsMax4(m, a), b), c), d);
  }
  for (; q < quads; q += stride) m = FiniteAbsMax4(m, LoadFour<kVec>(in, q));
  const int64_t i = 4 * quads + threadIdx.x;
  if (blockIdx.x == 0 && i < count) m = FiniteAbsMax(m, in[i]);
  m = WarpMax(m);
  if (threadIdx.x % kWarpSize == 0) warp_max[threadIdx.x / kWarpSize] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / kWarpSize; ++w) m = fmaxf(m, warp_max[w]);
    partial[blockIdx.x] = m;
  }
}

// The second pass: every block reduces the partial maxima to e (the same e in each), then
// rounds its share of in · 2^-e to f16; block 0 writes the GEMM's alpha 2^e and beta 0.
template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    RoundScaledF16Kernel(const float* __restrict__ in, __half* __restrict__ out, int64_t count,
                         float* __restrict__ scratch) {
  AwaitPrerequisiteGrids();
  __shared__ float scale;
  if (threadIdx.x < kWarpSize) {
    float m = 0.0f;
    for (int b = static_cast<int>(threadIdx.x); b < kRoundScaleBlocks; b += kWarpSize) {
      m = fmaxf(m, scratch[b]);
    }
    m = WarpMax(m);
    if (threadIdx.x == 0) {
      // 2^ilogb(m) <= m < 2^(ilogb(m) + 1): e = ilogb(m) - 14 puts m · 2^-e below 2^15.
      const int e = m >= 32768.0f ? ilogbf(m) - 14 : 0;
      scale = ldexpf(1.0f, -e);
      if (blockIdx.x == 0) {
        scratch[kRoundScaleAlpha] = ldexpf(1.0f, e);
        scratch[kRoundScaleAlpha + 1] = 0.0f;
      }
    }
  }
  __syncthreads();
  RoundScaledRange<__half, kVec>(in, out, count, scale);  // a power of two
}

// Whether the rounding passes take x four at a time: `in` 16-byte aligned, `out` aligned
// to four of its `elem`-byte elements.
bool VectorRounding(const void* in, const void* out, int elem) {
  return Aligned16(in) && reinterpret_cast<uintptr_t>(out) % (4 * elem) == 0;
}

unsigned GridFor(int64_t work) {
  return static_cast<unsigned>(std::clamp<int64_t>(CeilDiv(work, kThreads), 1, kMaxBlocks));
}

}  // namespace

cudaError_t LaunchDequantize(const void* w, DType w_dtype, int64_t w_rows, int64_t first_row,
                             int64_t rows, int64_t k, void* out, DType out_dtype, Stream stream) {
  if (!IsValidDType(w_dtype) || !IsQuantized(w_dtype) || rows < 0 || k <= 0 || first_row < 0 ||
      w_rows < 0 || k % DTypeBlockElems(w_dtype) != 0 || w_rows > (int64_t{1} << 40) / k ||
      first_row > w_rows || rows > w_rows - first_row) {
    return cudaErrorInvalidValue;
  }
  if ((reinterpret_cast<uintptr_t>(w) & 15u) != 0) return cudaErrorMisalignedAddress;
  if (rows == 0) return cudaSuccess;
  return DispatchFloat(out_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (!Aligned16(out)) return cudaErrorMisalignedAddress;
    return quant::DispatchFormat(w_dtype, [&](auto format) {
      using Q = decltype(format);
      const int64_t units_per_row = k / 32;
      const int64_t units = rows * units_per_row;
      return LaunchKernel(DequantizeKernel<T, Q>, dim3(GridFor(4 * units)), dim3(kThreads), stream,
                          static_cast<const uint8_t*>(w), w_rows * (k / Q::kElems),
                          first_row * units_per_row, units, static_cast<T*>(out));
    });
  });
}

cudaError_t LaunchRoundFloats(const float* in, void* out, DType out_dtype, int64_t count,
                              Stream stream) {
  if (count < 0 || (out_dtype != DType::kBF16 && out_dtype != DType::kF16)) {
    return cudaErrorInvalidValue;
  }
  if (count == 0) return cudaSuccess;
  return DispatchFloat(out_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(GridFor(CeilDiv(count, 4)));
    if (VectorRounding(in, out, sizeof(T))) {
      return LaunchKernel(RoundFloatsKernel<T, true>, grid, dim3(kThreads), stream, in,
                          static_cast<T*>(out), count);
    }
    return LaunchKernel(RoundFloatsKernel<T, false>, grid, dim3(kThreads), stream, in,
                        static_cast<T*>(out), count);
  });
}

cudaError_t LaunchRoundFloatsF16Scaled(const float* in, void* out, int64_t count, float* scratch,
                                       Stream stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (!Aligned16(scratch)) return cudaErrorMisalignedAddress;
  // With no x the GEMM still reads alpha and beta: the passes run on an empty range.
  const bool vec = VectorRounding(in, out, sizeof(__half));
  if (cudaError_t e = LaunchKernel(vec ? AbsMaxKernel<true> : AbsMaxKernel<false>,
                                   dim3(kRoundScaleBlocks), dim3(kThreads), stream, in, count,
                                   scratch);
      e != cudaSuccess) {
    return e;
  }
  return LaunchKernel(vec ? RoundScaledF16Kernel<true> : RoundScaledF16Kernel<false>,
                      dim3(GridFor(CeilDiv(count, 4))), dim3(kThreads), stream, in,
                      static_cast<__half*>(out), count, scratch);
}

}  // namespace sg::kernels
