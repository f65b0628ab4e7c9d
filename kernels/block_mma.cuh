// The block-format matmul on tensor cores, for batches of rows: y = x·wᵀ with w in a GGUF
// block format (the device layout of kernels/quant_blocks.cuh), for the decode batches
// where the CUDA-core kernels (quant_matmul.cuh, fused_matmul.cuh) pay for every row in
// FMAs and read the weights once per group of 8 rows. Each weight value is read once per
// 32 rows; its code (an integer of 4 to 8 bits) is exact in bf16, and x is split into
// `terms` bf16 parts (x = Σ parts; 3 parts hold an f32 exactly, 2 an f16), so the bf16
// MMA's f32 products are x·code without rounding and only the order of the additions
// differs from the CUDA-core kernels'; fewer terms round x (2: 16 bits of mantissa, 1:
// bf16). Each unit's sum is then scaled (and its min added) in f32, as the CUDA-core
// kernels do. Plain launcher: pointers, sizes, a stream; the result is the launch's
// cudaError_t.
#ifndef STEPGRAPH_KERNELS_BLOCK_MMA_CUH_
#define STEPGRAPH_KERNELS_BLOCK_MMA_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/launch.h"
#include "stepgraph/base/dtype.h"

namespace sg::kernels {

// BlockMmaArgs::terms for f32 x as two f16 parts of each row's unit scaled by a power of
// two (2^−e, its largest magnitude in [2^(e−1), 2^e)): each value to about 2^−23 of its
// unit's largest, f32's precision for the sums it enters, in two MMAs a k16 step where
// three bf16 parts take three; the unit's sum is scaled back by 2^e (exact).
inline constexpr int kBlockMmaF16x2 = 4;
// BlockMmaArgs::terms for f32 x quantized to int8 per row and 32 values (one f32 scale,
// its largest magnitude over 127, as llama.cpp quantizes activations for its block
// matmuls) and multiplied with the signed codes in int8 MMAs (m16n8k32: one a unit where
// a bf16 part takes two k16 steps, at twice the bf16 MMA's rate); each unit's integer sum
// is scaled by the row's scale and the weights'. Not the reference's numbers: x is held to
// half a step of 1/127 of its unit's largest magnitude (docs/cuda_kernels.md).
inline constexpr int kBlockMmaInt8 = 5;
// BlockMmaArgs::terms for f32 x as one f16 part of each row's unit scaled as
// kBlockMmaF16x2 scales it: each value rounded to 2^−12 of its unit's largest magnitude
// (f16's 11 bits of the largest), one MMA a k16 step. Not the reference's numbers, near
// them (the parity study's f16 x kept every greedy answer: docs/gguf.md).
inline constexpr int kBlockMmaF16x1 = 6;
// Whether `terms` carry a power-of-two scale per row and unit (scaled f16 parts).
inline constexpr bool BlockMmaScaledTerms(int terms) {
  return terms == kBlockMmaF16x2 || terms == kBlockMmaF16x1;
}

// Weights one launch takes (the fused matmul's grouped q/k/v), all of one block format.
inline constexpr int kBlockMmaMaxWeights = 3;
// Output columns (weight rows) a thread block computes; a weight's columns never share a
// block with another weight's.
inline constexpr int kBlockMmaCols = 64;
// From this many rows of x a launch of a Q4_K or Q5_K weight takes the prefill shape.
inline constexpr int64_t kBlockMmaPrefillMinRows = 33;
// From this many rows of x a launch may take the staged shape (BlockMmaWorkspaceFor).
inline constexpr int64_t kBlockMmaStagedMinRows = 128;

// How a launch's thread blocks cover the product. Decode: 64 columns (16 a warp) by up to
// 32 rows a block, x's fragments of a unit loaded with its weights. Prefill: 128 columns
// (32 a warp, so that each x fragment a warp loads feeds two MMAs and each decoded unit
// serves twice the rows) by 64 rows, x's fragments loaded per row tile. Staged: 128
// columns by 128 rows, eight warps as 2 × 4 (64 rows × 32 columns each), x's fragments of
// the block's rows copied into shared memory a few units ahead (cp.async) and read there by
// the four warps of a row half; one block an SM, K split to fill one wave where the blocks
// do not. kAuto: the staged shape from kBlockMmaStagedMinRows rows where its blocks and
// splits fill at least 85% of their waves (chosen by BlockMmaWorkspaceFor, which knows the
// SMs; a launch given kAuto never takes it), the prefill shape from
// kBlockMmaPrefillMinRows rows for Q4_K and Q5_K, whose units cost the most to decode, the
// decode shape otherwise. H200, quant_bench's MmaPrefillF32 at 512 rows, µs decode /
// prefill / staged: gate/up (256 staged blocks) Q4_0 286 / 336 / 252, Q8_0 314 / 536 /
// 280, Q4_K 573 / 487 / 367, Q6_K 360 / 374 / 315; down (64 blocks split twice) Q4_0 298 /
// 341 / 260, Q8_0 320 / 534 / 299, Q4_K 609 / 447 / 390, Q6_K 369 / 636 / 339; q/o Q4_0
// 77 / 71 / 73, Q8_0 85 / 105 / 76, Q4_K 152 / 97 / 103, Q6_K 95 / 135 / 89. The shapes
// give the same sums (the same additions in the same order within a split).
enum class BlockMmaShape { kAuto, kDecode, kPrefill, kStaged };

// Columns and rows of the product a thread block covers, and the blocks an SM wants in
// flight (split-K makes them when the columns do not): the decode shape's warps have one
// unit's loads in flight each, the prefill shape's more MMAs to hide them behind.
struct BlockMmaTile {
  int64_t cols = 0, rows = 0;
  int blocks_per_sm = 4;
};
BlockMmaTile BlockMmaTileFor(int64_t m, DType w_dtype, BlockMmaShape shape);

struct BlockMmaArgs {
  const void* x = nullptr;  // [m, k] of dtype
  int64_t m = 0, k = 0;
  DType dtype = DType::kF32;
  // w[g]: [n[g], k] in block format w_dtype (device layout, 16-byte aligned); the product's
  // columns are the weights' side by side.
  const void* w[kBlockMmaMaxWeights] = {};
  int64_t n[kBlockMmaMaxWeights] = {};
  int weights = 1;
  DType w_dtype = DType::kQ4_0;
  // Parts x is split into (1, 2 or 3 bf16 parts, kBlockMmaF16x2 or kBlockMmaInt8;
  // BlockMmaTerms).
  int terms = 3;
  // x split into its parts, laid out as the MMA's fragments, and its rows' sums per 32
  // values: BlockMmaScratchBytes(m, k, terms) bytes, 16-byte aligned. x_in_scratch: an
  // earlier launch of the same x and terms left it there (the split is not run again).
  void* scratch = nullptr;
  bool x_in_scratch = false;
  // Output. split s's f32 sums of row r, product column c go to
  // partials[(s · m + r) · ld + col0 + c] (every split writes all of its columns); with y,
  // y[r · ld + col0 + c] = their sum in split order + bias[c] (of dtype, or null), rounded
  // to dtype; with y and splits 1, y directly (partials may be null).
  float* partials = nullptr;
  void* y = nullptr;
  const void* bias = nullptr;
  int64_t ld = 0, col0 = 0;
  int splits = 1;
  BlockMmaShape shape = BlockMmaShape::kAuto;
};

// Bytes of BlockMmaArgs::scratch for x [m, k] in `terms` parts; -1 when they overflow.
int64_t BlockMmaScratchBytes(int64_t m, int64_t k, int terms);

// One workspace for a launch: the partial sums ([splits, m, Σn] f32) from its start, then
// the scratch at partial_bytes (a multiple of 256).
struct BlockMmaWorkspace {
  BlockMmaShape shape = BlockMmaShape::kDecode;  // the shape to launch (BlockMmaArgs::shape)
  int splits = 1;
  int64_t partial_bytes = 0;  // 0 when the sums are not kept
  int64_t bytes = 0;          // the whole workspace
};

// The workspace and split-K factor for x [m, k] in `terms` parts times the weights n[0 ..
// weights) in block format w_dtype (a launch's first format where they differ) on
// `sm_count` SMs, and the shape to launch (`shape`, or what kAuto chooses: the staged shape
// only here). The partial sums are kept when split, and always with `keep_partials` (the
// fused matmul's epilogue reads them). False when the sizes overflow.
bool BlockMmaWorkspaceFor(int64_t m, int64_t k, const int64_t* n, int weights, DType w_dtype,
                          int terms, int sm_count, bool keep_partials, BlockMmaWorkspace* out,
                          BlockMmaShape shape = BlockMmaShape::kAuto);

// Whether a device of this compute capability (90 for Hopper) runs the kernel (bf16 MMA:
// sm_80 and later).
inline bool BlockMmaRuns(int compute_capability) { return compute_capability >= 80; }

// The parts x of `x_dtype` is split into for `f32_terms` wished for f32 x: bf16 x is one
// part exactly, f16 two; f32 takes 1, 2 (16 significant bits), 3 (exact), kBlockMmaF16x2,
// kBlockMmaF16x1 or kBlockMmaInt8.
// BlockMmaArgs::terms must be one of these.
int BlockMmaTerms(DType x_dtype, int f32_terms);

// The split-K factor for a launch of `column_blocks` blocks (Σ ceil(n[g] / cols) times the
// row groups) on `sm_count` SMs: about `blocks_per_sm` blocks per SM, each split at least
// 128 values, at most 16 splits.
int BlockMmaSplitsFor(int64_t column_blocks, int64_t k, int sm_count, int blocks_per_sm = 4);

// Thread blocks along the columns for these weights, `cols` a block (BlockMmaTile::cols):
// Σ ceil(n[g] / cols).
int64_t BlockMmaColumnBlocks(const int64_t* n, int weights, int64_t cols);

// Launches the split of x into the scratch (unless x_in_scratch), the products and, with
// y and splits > 1, the sum of the splits. cudaErrorInvalidValue for inconsistent
// arguments (k not a multiple of the format's block, splits > 1 without partials, no
// scratch, terms not BlockMmaTerms(dtype, terms));
// cudaErrorMisalignedAddress for a weight or the scratch not 16-byte aligned.
cudaError_t LaunchBlockMma(const BlockMmaArgs& a, Stream stream);

// ---- MoeMatMul's experts on the tensor cores (a prefill step's) ----
// The step's (row, chosen expert) pairs are listed by expert on the device (segments of
// kMoeBlockMmaRows rows, padded), x's rows split through that list, and each segment's
// tiles multiplied by its expert's matrix as LaunchBlockMma multiplies by a weight: each
// expert's units are read once per 32 of its pairs, and its products are exact (terms 3),
// at f32's precision (kBlockMmaF16x2) or rounded as the dense kernel's terms say
// (kBlockMmaF16x1, kBlockMmaInt8, bf16 parts).

// Rows of a segment: each expert's pairs are padded to a multiple of it.
inline constexpr int64_t kMoeBlockMmaRows = 32;
// The most experts a launch takes (the listing counts them in shared memory).
inline constexpr int64_t kMoeBlockMmaMaxExperts = 1024;

struct MoeBlockMmaArgs {
  const void* x = nullptr;  // [rows, k], or with per_slot [rows · top_k, k], of dtype
  DType dtype = DType::kF32;
  // [experts, n, k] in block format w_dtype, the device layout of kernels/quant_blocks.cuh
  // over the whole stacked tensor, 16-byte aligned; w_up (gated; not with per_slot) the up
  // experts of w's shape and format, w the gate ones.
  const void* w = nullptr;
  const void* w_up = nullptr;
  DType w_dtype = DType::kQ4_0;
  const int32_t* ids = nullptr;  // [rows, top_k]
  int64_t rows = 0, experts = 0, n = 0, k = 0, top_k = 0;
  bool per_slot = false;
  void* y = nullptr;  // [rows, top_k · n] of dtype
  int terms = 3;      // BlockMmaTerms(dtype, terms), as BlockMmaArgs::terms
  void* workspace = nullptr;  // MoeBlockMmaWorkspaceBytes, 16-byte aligned
  uint32_t* error_flags = nullptr;  // nullable
};

// Whether LaunchMoeBlockMma takes these sizes and dtypes (x float, w a block format with
// k a multiple of its block, experts up to kMoeBlockMmaMaxExperts).
bool MoeBlockMmaTakes(int64_t rows, int64_t experts, int64_t n, int64_t k, int64_t top_k,
                      DType dtype, DType w_dtype);

// Bytes of MoeBlockMmaArgs::workspace (the listing and x's split); -1 when they overflow
// or the sizes are out of MoeBlockMmaTakes' range.
int64_t MoeBlockMmaWorkspaceBytes(int64_t rows, int64_t experts, int64_t k, int64_t top_k,
                                  int terms);

// y[i, j·n + c] = x_ij · w[ids[i, j], c, :] as LaunchMoeMatMul computes it, each sum of
// x's parts times the codes in f32 (the order of the additions and, below three parts,
// x's rounding differ from the CPU reference's), rounded once to dtype; gated, silu(g)·u
// of the gate and up products, each rounded to dtype first. A pair whose id is outside
// [0, experts) gets zeros and raises kErrorExpertOutOfRange. Three launches (the listing,
// x's split, the products). cudaErrorInvalidValue where MoeBlockMmaTakes says no or an
// argument is missing; cudaErrorMisalignedAddress for a weight or the workspace not
// 16-byte aligned.
cudaError_t LaunchMoeBlockMma(const MoeBlockMmaArgs& a, Stream stream);

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_BLOCK_MMA_CUH_
