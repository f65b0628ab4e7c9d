// Launchers that turn weights in GGUF's block formats (stepgraph/base/quant.h) into plain
// float matrices on the device, for the MatMul path that multiplies block weights on the
// tensor cores through cuBLASLt (dispatch/cuda/matmul.cc): the weight is dequantized in
// chunks of rows into a workspace and each chunk is one GEMM. One launch on `stream`; the
// result is cudaGetLastError() after it.
#ifndef STEPGRAPH_KERNELS_DEQUANT_CUH_
#define STEPGRAPH_KERNELS_DEQUANT_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/launch.h"
#include "stepgraph/base/dtype.h"

namespace sg::kernels {

// out[r, c] (row-major, `k` values a row) = value c of row first_row + r of `w`, for r in
// [0, rows): `w` is a whole [w_rows, k] weight in block format `w_dtype` in the device
// layout (kernels/quant_layout.h; its planes span the whole tensor, so a chunk of rows is
// named by its first row, not by an address inside the weight). Each value is the CPU
// reference's DequantizeRow value bit for bit, then rounded to `out_dtype` (f32:
// unchanged; bf16, f16: to nearest even, as base/half.h rounds). cudaErrorInvalidValue for
// a dtype or size out of range (k not a multiple of the block, rows past w_rows);
// cudaErrorMisalignedAddress for a w or an `out` not 16-byte aligned.
cudaError_t LaunchDequantize(const void* w, DType w_dtype, int64_t w_rows, int64_t first_row,
                             int64_t rows, int64_t k, void* out, DType out_dtype, Stream stream);

// out[i] = in[i] rounded to `out_dtype` (bf16 or f16) for i in [0, count): f32
// activations handed to a 16-bit GEMM. cudaErrorInvalidValue for another dtype or a
// negative count.
cudaError_t LaunchRoundFloats(const float* in, void* out, DType out_dtype, int64_t count,
                              Stream stream);

// The f16 GEMM's x without overflow (LaunchRoundFloatsF16Scaled): the blocks of its
// largest-magnitude pass, where its scratch keeps the GEMM's alpha and beta, and the
// scratch's bytes (a multiple of 256, so that what follows it keeps cuBLASLt's alignment).
inline constexpr int kRoundScaleBlocks = 254;
inline constexpr int64_t kRoundScaleAlpha = kRoundScaleBlocks;  // floats into the scratch
inline constexpr int64_t kRoundScaleBytes = 1024;
static_assert((kRoundScaleAlpha + 2) * 4 <= kRoundScaleBytes && kRoundScaleBytes % 256 == 0);

// out[i] = in[i] · 2^-e rounded to f16 for i in [0, count), e >= 0 the least exponent that
// brings the largest finite |in[i]| below 2^15 (0 when it is already: then out is
// LaunchRoundFloats' f16), so that f32 activations reach a 16-bit GEMM without becoming
// infinite past f16's 65,504 (infinities and NaNs stay what they are); floats
// kRoundScaleAlpha and kRoundScaleAlpha + 1 of `scratch` (kRoundScaleBytes, 16-byte
// aligned) become 2^e and 0, the GEMM's alpha and beta in cuBLASLt's device pointer mode,
// so that y is the product of the unscaled x. Two launches (the partial maxima, then the
// rounding), capturable; no host synchronisation. cudaErrorInvalidValue for a negative
// count, cudaErrorMisalignedAddress for a scratch not 16-byte aligned.
cudaError_t LaunchRoundFloatsF16Scaled(const float* in, void* out, int64_t count, float* scratch,
                                       Stream stream);

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_DEQUANT_CUH_
