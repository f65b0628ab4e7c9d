// The quantized matmul at decode: y = x·wᵀ with w in a GGUF block format. A thread block
// computes one output column (one row of w) for a group of up to kRows rows of x: its
// threads walk the row's blocks in parts of 8 values (kernels/quant_blocks.cuh), so a warp
// reads a contiguous run of the row, each byte once; the parts are dequantized in
// registers and multiplied with the activations, which stay float (read through L1/L2:
// every column's block re-reads the same few KiB of x). f32 accumulation, a warp-shuffle
// and shared-memory reduction per row of x, bias added in f32, one rounding to the
// output dtype.
//
// Quantized rows are short (a 2048-wide Q4_0 row is 1152 bytes), so a block of up to 4
// warps per column and many resident blocks per SM keep enough loads in flight; the grid
// has one block per output column and per group of rows.
#include <algorithm>

#include "kernels/common.cuh"
#include "kernels/quant_blocks.cuh"
#include "kernels/quant_matmul.cuh"

namespace sg::kernels {
namespace {

constexpr int kMaxWarps = 4;

// Four consecutive activations as f32: one 16- or 8-byte load when `vec`, else four.
template <typename T>
__device__ __forceinline__ void LoadX4(const T* p, bool vec, float (&out)[4]) {
  if (vec) {
    LoadFloats<T, 4>(p, out);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = ToFloat(p[i]);
  }
}

template <typename T, typename Q, int kRows>
__global__ void __launch_bounds__(kMaxWarps* kWarpSize)
    QuantMatmulKernel(const T* __restrict__ x, const uint8_t* __restrict__ w,
                      const T* __restrict__ bias, T* __restrict__ y, int64_t m, int64_t n,
                      int64_t k, bool vec_x) {
  AwaitPrerequisiteGrids();
  __shared__ float partial[kMaxWarps][kRows];
  const int64_t col = blockIdx.x;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kRows;
  const int rows = static_cast<int>(std::min<int64_t>(kRows, m - row0));
  const int64_t blocks = k / Q::kElems;
  const uint8_t* wrow = w + col * blocks * Q::kBytes;
  const T* xg = x + row0 * k;

  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;

  const int64_t parts = blocks * Q::kParts;
#pragma unroll 2
  for (int64_t t = threadIdx.x; t < parts; t += blockDim.x) {
    const int64_t blk = t / Q::kParts;
    const quant::Part part = Q::Read(wrow + blk * Q::kBytes, static_cast<int>(t % Q::kParts));
    const int64_t e0 = blk * Q::kElems + part.first, e1 = blk * Q::kElems + part.second;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r < rows) {
        float a[4], b[4];
        LoadX4(xg + r * k + e0, vec_x, a);
        LoadX4(xg + r * k + e1, vec_x, b);
        float s = acc[r];
#pragma unroll
        for (int i = 0; i < 4; ++i) s = fmaf(part.v[i], a[i], s);
#pragma unroll
        for (int i = 0; i < 4; ++i) s = fmaf(part.v[4 + i], b[i], s);
        acc[r] = s;
      }
    }
  }

  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float s = WarpSum(acc[r]);
    if (lane == 0) partial[warp][r] = s;
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    const int r = threadIdx.x;
    float total = 0.0f;
    for (int i = 0; i < warps; ++i) total += partial[i][r];
    if (bias != nullptr) total += ToFloat(bias[col]);
    y[(row0 + r) * n + col] = FromFloat<T>(total);
  }
}

// Kernels for 1, 2, 4 and 8 rows; other counts run the next larger one with the surplus
// rows skipped (a uniform branch), which keeps the number of instantiations down.
template <typename F>
cudaError_t DispatchGroupRows(int64_t m, F&& f) {
  if (m <= 1) return f(std::integral_constant<int, 1>{});
  if (m <= 2) return f(std::integral_constant<int, 2>{});
  if (m <= 4) return f(std::integral_constant<int, 4>{});
  return f(std::integral_constant<int, 8>{});
}
static_assert(kQuantMatmulGroupRows == 8, "DispatchGroupRows tops out at 8");

}  // namespace

cudaError_t LaunchQuantMatmul(const void* x, const void* w, DType w_dtype, const void* bias,
                              void* y, int64_t m, int64_t n, int64_t k, DType dtype,
                              Stream stream) {
  if (!IsQuantized(w_dtype) || m <= 0 || n <= 0 || k <= 0 || n > 0x7fffffff ||
      k % DTypeBlockElems(w_dtype) != 0 ||
      (m + kQuantMatmulGroupRows - 1) / kQuantMatmulGroupRows > 65535) {
    return cudaErrorInvalidValue;
  }
  if ((reinterpret_cast<uintptr_t>(w) & 1u) != 0) return cudaErrorMisalignedAddress;
  return DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Every run of 4 activations starts at a multiple of 4 elements and k is a multiple
    // of 32, so one aligned x makes every load of 4 a vector load.
    const bool vec_x = (reinterpret_cast<uintptr_t>(x) % (4 * sizeof(T))) == 0;
    return quant::DispatchFormat(w_dtype, [&](auto format) {
      using Q = decltype(format);
      const int64_t parts = k / Q::kElems * Q::kParts;
      const int64_t warps = std::clamp<int64_t>(CeilDiv(parts, kWarpSize), 1, kMaxWarps);
      return DispatchGroupRows(m, [&](auto rows) {
        constexpr int kRows = decltype(rows)::value;
        const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(CeilDiv(m, kRows)));
        return LaunchKernel(QuantMatmulKernel<T, Q, kRows>, grid,
                            dim3(static_cast<unsigned>(warps * kWarpSize)), stream,
                            static_cast<const T*>(x), static_cast<const uint8_t*>(w),
                            static_cast<const T*>(bias), static_cast<T*>(y), m, n, k, vec_x);
      });
    });
  });
}

}  // namespace sg::kernels
