// Embedding: a gather of rows. Rows are copied as raw bytes (the dtype only sets the row
// size), in 16-byte units where the row size and both buffers allow, else in units of one
// element. grid (units-per-row blocks, rows); the id is read by the kernel, so the launch
// shape never depends on it.
#include <algorithm>

#include "kernels/common.cuh"
#include "kernels/embedding.cuh"
#include "stepgraph/base/error_flags.h"

namespace sg::kernels {
namespace {

// 128 rather than more: a 2048-wide bf16 row then spreads over two blocks.
constexpr int kMaxThreads = 128;

template <typename U>
__global__ void __launch_bounds__(kMaxThreads)
    EmbeddingKernel(const U* __restrict__ table, const int32_t* __restrict__ ids,
                    U* __restrict__ out, int64_t vocab, int64_t units_per_row,
                    uint32_t* error_flags) {
  AwaitPrerequisiteGrids();
  const int64_t row = blockIdx.y;
  const int32_t id = ids[row];
  const bool valid = id >= 0 && id < vocab;
  if (!valid && blockIdx.x == 0 && threadIdx.x == 0) {
    atomicOr(error_flags, static_cast<uint32_t>(kErrorTokenOutOfRange));
  }
  const U* src = table + static_cast<int64_t>(valid ? id : 0) * units_per_row;
  U* dst = out + row * units_per_row;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       u < units_per_row; u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[u] = valid ? src[u] : U{};
  }
}

template <typename U>
cudaError_t Launch(const void* table, const int32_t* ids, void* out, int64_t rows,
                   int64_t vocab, int64_t row_bytes, uint32_t* error_flags,
                   Stream stream) {
  const int64_t units = row_bytes / static_cast<int64_t>(sizeof(U));
  const int64_t threads = std::min<int64_t>(kMaxThreads, CeilDiv(units, kWarpSize) * kWarpSize);
  const int64_t blocks = std::min<int64_t>(CeilDiv(units, threads), 65535);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(rows));
  return LaunchKernel(EmbeddingKernel<U>, grid, dim3(static_cast<unsigned>(threads)), stream,
                      static_cast<const U*>(table), ids, static_cast<U*>(out), vocab, units,
                      error_flags);
}

}  // namespace

cudaError_t LaunchEmbedding(const void* table, const int32_t* ids, void* out, int64_t rows,
                            int64_t vocab, int64_t hidden, DType dtype, uint32_t* error_flags,
                            Stream stream) {
  if (rows <= 0 || rows > 65535 || vocab <= 0 || hidden <= 0 || !IsFloat(dtype) ||
      error_flags == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int64_t row_bytes = hidden * DTypeBytes(dtype);
  if (row_bytes % 16 == 0 && Aligned16(table) && Aligned16(out)) {
    return Launch<uint4>(table, ids, out, rows, vocab, row_bytes, error_flags, stream);
  }
  if (DTypeBytes(dtype) == 4) {
    return Launch<uint32_t>(table, ids, out, rows, vocab, row_bytes, error_flags, stream);
  }
  return Launch<uint16_t>(table, ids, out, rows, vocab, row_bytes, error_flags, stream);
}

}  // namespace sg::kernels
