// Dequantization of block-format weights into float matrices (kernels/dequant.cuh). Blocks
// are read only through kernels/quant_blocks.cuh's Format<t>::Load, the one definition of
// their device layout: a thread takes one unit (32 values), consecutive threads the
// consecutive units of the tensor, so a warp reads contiguous runs of each plane and
// writes its values as short vectors. Bandwidth-bound: a Q4_0 weight reads
// 0.56 bytes a value and writes 2 (bf16) or 4 (f32).
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

// Four values as one store (16 bytes of f32, 8 of bf16/f16): the run starts at a multiple
// of 4 elements and `out` is aligned to 4 of them.
template <typename T>
__device__ __forceinline__ void StoreRun(T* p, const float* v) {
  if constexpr (sizeof(T) == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    struct alignas(8) Four {
      T e[4];
    } four;
#pragma unroll
    for (int i = 0; i < 4; ++i) four.e[i] = FromFloat<T>(v[i]);
    *reinterpret_cast<Four*>(p) = four;
  }
}

// Units [first, first + count) of a tensor of `blocks` blocks; unit g's values are
// elements 32·g .. 32·g + 31 of the tensor (rows are consecutive runs of units), written
// to out from element 32·first on.
template <typename T, typename Q>
__global__ void __launch_bounds__(kThreads)
    DequantizeKernel(const uint8_t* __restrict__ w, int64_t blocks, int64_t first, int64_t count,
                     T* __restrict__ out) {
  AwaitPrerequisiteGrids();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; u < count;
       u += stride) {
    const typename Q::Unit unit = Q::Load(w, blocks, first + u);
    T* base = out + u * 32;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float v[8];
      unit.Values8(j, v);
      StoreRun(base + 8 * j, v);
      StoreRun(base + 8 * j + 4, v + 4);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    RoundFloatsKernel(const float* __restrict__ in, T* __restrict__ out, int64_t count) {
  AwaitPrerequisiteGrids();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < count;
       i += stride) {
    out[i] = FromFloat<T>(in[i]);
  }
}

// Each block's largest finite |in[i]| over its grid-stride share into partial[blockIdx.x]
// (0 when it has none): LaunchRoundFloatsF16Scaled's first pass.
__global__ void __launch_bounds__(kThreads)
    AbsMaxKernel(const float* __restrict__ in, int64_t count, float* __restrict__ partial) {
  AwaitPrerequisiteGrids();
  __shared__ float warp_max[kThreads / kWarpSize];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  float m = 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < count;
       i += stride) {
    const float a = fabsf(in[i]);
    if (a <= FLT_MAX) m = fmaxf(m, a);  // false for infinities and NaN
  }
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
  const float s = scale;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < count;
       i += stride) {
    out[i] = FromFloat<__half>(in[i] * s);  // a power of two: exact but for subnormals
  }
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
    if (reinterpret_cast<uintptr_t>(out) % (4 * sizeof(T)) != 0) {
      return cudaErrorMisalignedAddress;
    }
    return quant::DispatchFormat(w_dtype, [&](auto format) {
      using Q = decltype(format);
      const int64_t units_per_row = k / 32;
      const int64_t units = rows * units_per_row;
      return LaunchKernel(DequantizeKernel<T, Q>, dim3(GridFor(units)), dim3(kThreads), stream,
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
    return LaunchKernel(RoundFloatsKernel<T>, dim3(GridFor(count)), dim3(kThreads), stream, in,
                        static_cast<T*>(out), count);
  });
}

cudaError_t LaunchRoundFloatsF16Scaled(const float* in, void* out, int64_t count, float* scratch,
                                       Stream stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (!Aligned16(scratch)) return cudaErrorMisalignedAddress;
  // With no x the GEMM still reads alpha and beta: the passes run on an empty range.
  if (cudaError_t e = LaunchKernel(AbsMaxKernel, dim3(kRoundScaleBlocks), dim3(kThreads),
                                   stream, in, count, scratch);
      e != cudaSuccess) {
    return e;
  }
  return LaunchKernel(RoundScaledF16Kernel, dim3(GridFor(count)), dim3(kThreads), stream, in,
                      static_cast<__half*>(out), count, scratch);
}

}  // namespace sg::kernels
