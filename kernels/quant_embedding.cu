// Embedding from a table in a GGUF block format: the row of each id dequantized (exactly
// as the CPU reference's DequantizeRow) and rounded to the output dtype. grid (part
// groups, rows); each thread dequantizes parts of 8 values (kernels/quant_blocks.cuh). The
// id is read by the kernel, so the launch shape never depends on it.
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
  const int64_t blocks = hidden / Q::kElems;
  const uint8_t* src = table + static_cast<int64_t>(valid ? id : 0) * blocks * Q::kBytes;
  T* dst = out + row * hidden;
  const int64_t parts = blocks * Q::kParts;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < parts;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t blk = t / Q::kParts;
    T* d = dst + blk * Q::kElems;
    // A bad id reads row 0 (in bounds) for the positions and writes zeros there.
    const quant::Part part = Q::Read(src + blk * Q::kBytes, static_cast<int>(t % Q::kParts));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      d[part.first + i] = FromFloat<T>(valid ? part.v[i] : 0.0f);
      d[part.second + i] = FromFloat<T>(valid ? part.v[4 + i] : 0.0f);
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
  if ((reinterpret_cast<uintptr_t>(table) & 1u) != 0) return cudaErrorMisalignedAddress;
  return DispatchFloat(out_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return quant::DispatchFormat(table_dtype, [&](auto format) {
      using Q = decltype(format);
      const int64_t parts = hidden / Q::kElems * Q::kParts;
      const int64_t threads =
          std::min<int64_t>(kMaxThreads, CeilDiv(parts, kWarpSize) * kWarpSize);
      const int64_t blocks = std::min<int64_t>(CeilDiv(parts, threads), 65535);
      const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(rows));
      return LaunchKernel(QuantEmbeddingKernel<T, Q>, grid, dim3(static_cast<unsigned>(threads)),
                          stream, static_cast<const uint8_t*>(table), ids,
                          static_cast<T*>(out), vocab, hidden, error_flags);
    });
  });
}

}  // namespace sg::kernels
