// Launchers for the ops that read weights in GGUF's block formats (stepgraph/base/quant.h):
// MatMul with a quantized w and Embedding with a quantized table, both held in the device
// layout of kernels/quant_blocks.cuh (repacked at upload: kernels/quant_layout.h) at a
// 16-byte aligned address. Blocks are dequantized in registers as they are read, never
// into a float copy of the weight. One launch on
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
// (k not a multiple of the block); cudaErrorMisalignedAddress for a w not 16-byte aligned.
cudaError_t LaunchQuantMatmul(const void* x, const void* w, DType w_dtype, const void* bias,
                              void* y, int64_t m, int64_t n, int64_t k, DType dtype,
                              Stream stream);

// The most K the one-row kernel takes (its x is held in shared memory as f32).
inline constexpr int64_t kQuantRowMaxK = 10240;

// Whether LaunchQuantRowMatmul takes w [n, k] in `w_dtype`: a block format, k a multiple
// of its block and at most kQuantRowMaxK, n in [1, 2^31).
constexpr bool QuantRowMatmulTakes(int64_t n, int64_t k, DType w_dtype) {
  return IsQuantized(w_dtype) && n > 0 && n <= 0x7fffffff && k > 0 && k <= kQuantRowMaxK &&
         k % DTypeBlockElems(w_dtype) == 0;
}

// y[1, n] = x[1, k] · w[n, k]ᵀ for one row of x (no bias), or with `residual` [1, n]
// (nullable) y = residual + that product rounded to `dtype` (FusedMatMul's add epilogue);
// w in block format `w_dtype` as
// LaunchQuantMatmul takes it: a grid of persistent warps, each walking whole columns with
// its next loads in flight, for outputs too wide for one wave of LaunchQuantMatmul's
// column blocks (an lm head). w_constant: w is no kernel's output in the step (its first
// loads may start before the wait on the kernel before). cudaErrorInvalidValue where
// QuantRowMatmulTakes says no or sm_count < 1; cudaErrorMisalignedAddress for a w not
// 16-byte aligned.
cudaError_t LaunchQuantRowMatmul(const void* x, const void* w, DType w_dtype,
                                 const void* residual, void* y, int64_t n, int64_t k,
                                 DType dtype, bool w_constant, int sm_count, Stream stream);

// out[i, :] = table[ids[i], :] dequantized and rounded to `out_dtype` (f32, bf16, f16),
// bit for bit the CPU reference's row. table [vocab, hidden] in block format `table_dtype`.
// An id outside [0, vocab) writes a zero row and raises kErrorTokenOutOfRange in
// *error_flags. cudaErrorInvalidValue for a dtype or size out of range;
// cudaErrorMisalignedAddress for a table not 16-byte aligned.
cudaError_t LaunchQuantEmbedding(const void* table, DType table_dtype, const int32_t* ids,
                                 void* out, int64_t rows, int64_t vocab, int64_t hidden,
                                 DType out_dtype, uint32_t* error_flags, Stream stream);

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_QUANT_MATMUL_CUH_
