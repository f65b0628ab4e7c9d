// Embedding from a table in a GGUF block format (device layout: kernels/quant_blocks.cuh):
// the row of each id dequantized (exactly as the CPU reference's DequantizeRow) and
// rounded to the output dtype. grid (unit groups, rows); each thread dequantizes units of
// 32 values. The id is read by the kernel, so the launch shape never depends on it.
#include <algorithm>

#include "kernels/common.cuh"
#include "kernels/quant_blocks.cuh"
#include "kernels/quant_matmul.cuh"
#include "stepgraph/base/error_flags.h"

namespace sg::kernels {
namespace {

constexpr int kMaxThreads = 128;

template <typename T, typename Q>
__global__ void __launch_bounds__(kMaxThreads)
    QuantEmbeddingKernel(const uint8_t* __restrict__ table, const int32_t* __restrict__ ids,
                         T* __restrict__ out, int64_t vocab, int64_t hidden,
                         uint32_t* error_flags) {
  AwaitPrerequisiteGrids();
  const int64_t row = blockIdx.y;
  const int32_t id = ids[row];
  const bool valid = id >= 0 && id < vocab;
  if (!valid && blockIdx.x == 0 && threadIdx.x == 0) {
    atomicOr(error_flags, static_cast<uint32_t>(kErrorTokenOutOfRange));
  }
  const int64_t units = hidden / quant::kUnitElems;
  const int64_t blocks = vocab * (hidden / Q::kElems);
  // A bad id reads row 0 (in bounds) and writes zeros.
  const int64_t first = static_cast<int64_t>(valid ? id : 0) * units;
  T* dst = out + row * hidden;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < units;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const typename Q::Unit unit = Q::Load(table, blocks, first + t);
    T* d = dst + t * quant::kUnitElems;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float v[8];
      unit.Values8(j, v);
#pragma unroll
      for (int i = 0; i < 8; ++i) d[8 * j + i] = FromFloat<T>(valid ? v[i] : 0.0f);
    }
  }
}

}  // namespace

cudaError_t LaunchQuantEmbedding(const void* table, DType table_dtype, const int32_t* ids,
                                 void* out, int64_t rows, int64_t vocab, int64_t hidden,
                                 DType out_dtype, uint32_t* error_flags, Stream stream) {
  if (!IsQuantized(table_dtype) || rows <= 0 || rows > 65535 || vocab <= 0 || hidden <= 0 ||
      hidden % DTypeBlockElems(table_dtype) != 0 || error_flags == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (!Aligned16(table)) return cudaErrorMisalignedAddress;
  return DispatchFloat(out_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return quant::DispatchFormat(table_dtype, [&](auto format) {
      using Q = decltype(format);
      const int64_t units = hidden / quant::kUnitElems;
      const int64_t threads =
          std::min<int64_t>(kMaxThreads, CeilDiv(units, kWarpSize) * kWarpSize);
      const int64_t blocks = std::min<int64_t>(CeilDiv(units, threads), 65535);
      const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(rows));
      return LaunchKernel(QuantEmbeddingKernel<T, Q>, grid, dim3(static_cast<unsigned>(threads)),
                          stream, static_cast<const uint8_t*>(table), ids,
                          static_cast<T*>(out), vocab, hidden, error_flags);
    });
  });
}

}  // namespace sg::kernels
