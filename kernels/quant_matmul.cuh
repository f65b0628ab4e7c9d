// Launchers for the ops that read weights in GGUF's block formats (stepgraph/base/quant.h):
// MatMul with a quantized w and Embedding with a quantized table. Blocks are dequantized
// in registers as they are read, never into a float copy of the weight. One launch on
// `stream`; the result is cudaGetLastError() after it.
#ifndef STEPGRAPH_KERNELS_QUANT_MATMUL_CUH_
#define STEPGRAPH_KERNELS_QUANT_MATMUL_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/launch.h"
#include "stepgraph/base/dtype.h"

namespace sg::kernels {

// Rows of x one pass of the quantized matmul computes; more rows are taken in groups of
// this many (each group reads the weight again, from L2 when it fits).
inline constexpr int64_t kQuantMatmulGroupRows = 8;

// y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n]), w in block format `w_dtype` (each of its n
// rows k / DTypeBlockElems(w_dtype) blocks), x, bias and y in `dtype` (f32, bf16, f16),
// f32 accumulation. Any m >= 1 (one launch: a grid row per group of
// kQuantMatmulGroupRows rows). cudaErrorInvalidValue for a dtype or size out of range
// (k not a multiple of the block); cudaErrorMisalignedAddress for a w at an odd address.
cudaError_t LaunchQuantMatmul(const void* x, const void* w, DType w_dtype, const void* bias,
                              void* y, int64_t m, int64_t n, int64_t k, DType dtype,
                              Stream stream);

// out[i, :] = table[ids[i], :] dequantized and rounded to `out_dtype` (f32, bf16, f16),
// bit for bit the CPU reference's row. table [vocab, hidden] in block format `table_dtype`.
// An id outside [0, vocab) writes a zero row and raises kErrorTokenOutOfRange in
// *error_flags. cudaErrorInvalidValue for a dtype or size out of range;
// cudaErrorMisalignedAddress for a table at an odd address.
cudaError_t LaunchQuantEmbedding(const void* table, DType table_dtype, const int32_t* ids,
                                 void* out, int64_t rows, int64_t vocab, int64_t hidden,
                                 DType out_dtype, uint32_t* error_flags, Stream stream);

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_QUANT_MATMUL_CUH_
