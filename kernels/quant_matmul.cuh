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

// How the one-row kernel multiplies x with the weights' values. kF32: exactly as the other
// block kernels (each weight value the CPU reference's, f32 products; the default). kInt8,
// kInt16: x quantized per 32 values (a unit) to int8 or int16 with one f32 scale (its
// largest magnitude over 127 or 32767, round to nearest), and each unit's codes multiplied
// with it in integer dot products (dp4a: four products an instruction; dp2a: two), then
// scaled in f32: Scale·dx·(Σ code·q − bias·Σ q) + Min·Σ x. Not the reference's numbers:
// x carries 8 or 16 bits a value relative to its unit's largest (docs/gguf.md's parity
// study), for far fewer instructions a weight. kInt16x2: x as two int16 parts per unit
// with a power-of-two scale (2^(14−e) for a largest magnitude in [2^(e−1), 2^e)): the first
// rounds x·scale, the second the exact remainder times 2^15, so a value is held to 2^-30 of
// its unit's largest, finer than f32's rounding of the products it meets; each part's dot
// products summed in integers and the two joined in f32. The reference's numbers to f32's
// noise (like a change of summation order), at twice kInt16's dot products.
enum class QuantRowX { kF32, kInt8, kInt16, kInt16x2 };

// y[1, n] = x[1, k] · w[n, k]ᵀ for one row of x (no bias), or with `residual` [1, n]
// (nullable) y = residual + that product rounded to `dtype` (FusedMatMul's add epilogue);
// w in block format `w_dtype` as
// LaunchQuantMatmul takes it: a grid of persistent warps, each walking whole columns with
// its next loads in flight, for outputs too wide for one wave of LaunchQuantMatmul's
// column blocks (an lm head). w_constant: w is no kernel's output in the step (its first
// loads may start before the wait on the kernel before). cudaErrorInvalidValue where
// QuantRowMatmulTakes says no or sm_count < 1; cudaErrorMisalignedAddress for a w not
// 16-byte aligned. x_mode: how x meets the weights (QuantRowX).
cudaError_t LaunchQuantRowMatmul(const void* x, const void* w, DType w_dtype,
                                 const void* residual, void* y, int64_t n, int64_t k,
                                 DType dtype, bool w_constant, int sm_count, QuantRowX x_mode,
                                 Stream stream);

// y[1, n] = silu(x · w_gateᵀ) · (x · w_upᵀ) for one row of x (FusedMatMul's SiluMul
// epilogue: the two f32 sums, rounded once), w_gate and w_up [n, k] both in `w_dtype`:
// LaunchQuantRowMatmul's kernel, each warp walking a column's gate row, then its up row.
// Refusals as LaunchQuantRowMatmul's (a null w_up: cudaErrorInvalidValue).
cudaError_t LaunchQuantRowSiluMul(const void* x, const void* w_gate, const void* w_up,
                                  DType w_dtype, void* y, int64_t n, int64_t k, DType dtype,
                                  bool w_constant, int sm_count, QuantRowX x_mode,
                                  Stream stream);

// A mixture of experts' matmul at decode on the one-row kernel (ops::MoeMatMul: y [rows,
// top_k · n], y[i, j·n + c] = x_ij · w[ids[i, j], c, :], x_ij row i of x [rows, k] or with
// per_slot its slot j of x [rows, top_k · k]; with w_up silu(g)·u of the gate and up
// products, each rounded to `dtype` first). Each (row, slot) pair takes an equal share of
// the GPU's blocks, stages its x once per block (x_mode as LaunchQuantRowMatmul's) and its
// warps walk the chosen expert's columns with their next loads in flight; the expert id is
// read on the device after the wait on the kernel before. w (and w_up) [experts, n, k] in
// block format `w_dtype`, held whole in the device layout of kernels/quant_blocks.cuh at a
// 16-byte aligned address. A bad id gives zeros and raises kErrorExpertOutOfRange in
// *error_flags (nullable). cudaErrorInvalidValue where QuantRowMoeTakes says no, for null
// ids, sm_count < 1 or w_up with per_slot.
struct QuantRowMoe {
  const int32_t* ids = nullptr;
  int top_k = 1;
  bool per_slot = false;
  int experts = 1;
  uint32_t* error_flags = nullptr;
};
// The most (row, slot) pairs LaunchQuantRowMoe takes (a grid dimension).
inline constexpr int64_t kQuantRowMoeMaxPairs = 65535;
bool QuantRowMoeTakes(int64_t rows, int64_t experts, int64_t n, int64_t k, int64_t top_k,
                      DType w_dtype);
cudaError_t LaunchQuantRowMoe(const void* x, const void* w, const void* w_up, DType w_dtype,
                              const int32_t* ids, void* y, int64_t rows, int64_t experts,
                              int64_t n, int64_t k, int64_t top_k, bool per_slot, DType dtype,
                              uint32_t* error_flags, int sm_count, QuantRowX x_mode,
                              Stream stream);

// MoeCombine with `matmul` on the one-row kernel (a routed MLP's down experts and their
// weighted sum in one launch, for decode): out [rows, n] = Σ_j weights[i, j] · y[i, j·n ..]
// of y = MoeMatMul(x, w, ids) with per_slot (x [rows, top_k · k], each slot its own k
// values; each product rounded to `dtype` as MoeMatMul stores it, a bad id's zeros and
// kErrorExpertOutOfRange), summed as LaunchMoeCombine sums (kernels/moe.cuh: ascending
// expert id, each term and partial sum rounded to `dtype`; `residual` added, rounded once;
// with route_experts > 0 `weights` is the router's logits [rows, route_experts] and the
// weights are computed from them as LaunchMoeRouteWeights does). y is never stored: a
// block takes a row and a run of columns, stages the row's top_k slices of x once (x_mode
// as LaunchQuantRowMatmul's), its warps walk the run's (column, slot) expert rows with
// their next loads in flight, and the products meet in shared memory, where a thread per
// column sums them. w [experts, n, k] in block format `w_dtype` (or of x's dtype: then x
// meets it in f32), held whole in the device layout at a 16-byte aligned address.
struct QuantRowMoeCombine {
  const void* x = nullptr;
  const void* w = nullptr;
  DType w_dtype = DType::kQ8_0;
  const int32_t* ids = nullptr;  // [rows, top_k]
  const void* weights = nullptr;  // [rows, top_k] of weights_dtype, or the logits
  DType weights_dtype = DType::kF32;
  int64_t route_experts = 0;  // > 0: weights are the router's logits [rows, route_experts]
  bool renormalize = true, round_to_dtype = false;  // the route's (MoeRouteWeights')
  const void* residual = nullptr;  // [rows, n] of dtype, nullable; may be out itself
  void* out = nullptr;             // [rows, n] of dtype
  int64_t rows = 0, experts = 0, n = 0, k = 0, top_k = 0;
  DType dtype = DType::kF32;
  uint32_t* error_flags = nullptr;  // nullable
};
// The most chosen experts a row LaunchQuantRowMoeCombine takes (a block keeps their
// products in shared memory), and the most top_k · k (its row of x staged there too).
inline constexpr int64_t kQuantRowMoeCombineMaxTopK = 8;
inline constexpr int64_t kQuantRowMoeCombineMaxXs = 4 * kQuantRowMaxK;
// Whether LaunchQuantRowMoeCombine takes these sizes: w in a block format with k a
// multiple of its block, or of x's dtype with k a multiple of 32; k at most
// kQuantRowMaxK; rows up to 65535; top_k up to kQuantRowMoeCombineMaxTopK; top_k · k up to
// kQuantRowMoeCombineMaxXs; n up to 65535 · 64; experts · n within 31 bits; x's dtype f32,
// bf16 or f16.
bool QuantRowMoeCombineTakes(int64_t rows, int64_t experts, int64_t n, int64_t k,
                             int64_t top_k, DType dtype, DType w_dtype);
// cudaErrorInvalidValue where QuantRowMoeCombineTakes says no, for a null pointer (but
// residual and error_flags), a weights_dtype not float, route_experts past 2^31 − 1 or
// sm_count < 1; cudaErrorMisalignedAddress for a w not 16-byte aligned.
cudaError_t LaunchQuantRowMoeCombine(const QuantRowMoeCombine& args, int sm_count,
                                     QuantRowX x_mode, Stream stream);

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
