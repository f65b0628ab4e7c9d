// Launchers for the fused ops of the graph passes (ops::FusedMatMul, ops::RopeKvWrite):
// the small-M matmul with an RmsNorm folded into its loads, several weight matrices in one
// launch, split-K reduced in the same launch, and an epilogue (residual add, SiluMul,
// argmax, RoPE of q and k with the KV-cache write); and RoPE of q and k with the KV-cache
// write as a launch of its own. Plain launchers: pointers, sizes, a stream; the result is
// the launch's cudaError_t.
#ifndef STEPGRAPH_KERNELS_FUSED_MATMUL_CUH_
#define STEPGRAPH_KERNELS_FUSED_MATMUL_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/block_mma.cuh"
#include "kernels/launch.h"
#include "stepgraph/base/dtype.h"

namespace sg::kernels {

inline constexpr int kFusedMaxRows = 8;
inline constexpr int kFusedMaxWeights = 3;
// Output columns (weight rows) one block computes.
inline constexpr int kFusedCols = 4;

enum class FusedEpilogue : int {
  kNone = 0,
  kAdd = 1,
  kSiluMul = 2,
  kArgmax = 3,
  kRopeKvWrite = 4,
};

// The kRopeKvWrite epilogue's arguments: the product is q, k, v side by side (n[0] = h·d,
// n[1] = n[2] = kv_heads·d); the output y is the rotated q [m, n[0]] and the rotated k and
// the v of row r go to cache slot r at pos[r], as LaunchRopeKvWrite. head_dim % 4 == 0,
// so that a block's four product columns hold two whole RoPE pairs.
struct FusedRopeArgs {
  const int32_t* pos = nullptr;       // [m]
  const float* inv_freq = nullptr;    // [head_dim / 2]
  void* k_cache = nullptr;            // [slots >= m, kv_heads, seq, head_dim]
  void* v_cache = nullptr;
  uint32_t* error_flags = nullptr;    // kErrorPositionOutOfRange for pos >= seq
  int64_t kv_heads = 0, seq = 0;
  int head_dim = 0;
  bool interleaved = false;
  // Set by LaunchFusedMatmul: head_dim / 4, head_dim / 2 and (n[0] + n[1]) / 4, the column
  // blocks of the rotated q and k heads.
  int blocks_per_head = 0, half = 0, rotated_blocks = 0;
};

// How the threads of a block-format launch of one row walk the 32-value units of their
// columns (four threads to a unit). kSerial: a warp per 32 units (up to 8 warps), each
// thread walking several units of its columns one after another; kWide: a warp per 8 units,
// so that each thread takes one unit per column where 8 warps suffice. H200, the 1B shape
// at one row (quant_bench's FusedWalkF32, 2026-11-29): wide wins alone on q/o (Q8_0 3.7
// against 4.9 us) and loses on gate/up (Q4_0 13.0 against 7.5) and the lm head, and the
// Q4_0 step took 0.993 ms wide against 0.790 serial (decode_bench's QuantWalk); a thread
// asking for its next units before multiplying the current ones took 120 registers and
// made the step 0.918 ms.
enum class FusedUnitWalk : uint8_t { kSerial, kWide };
// FusedMatmulArgs::walk's default.
constexpr FusedUnitWalk FusedArgsDefaultWalk() { return FusedUnitWalk::kSerial; }

struct FusedMatmulArgs {
  const void* x = nullptr;       // [m, k]
  int64_t m = 0, k = 0;
  const void* norm_w = nullptr;  // [k], or null: x is used as it is
  float eps = 0.0f;
  const void* w[kFusedMaxWeights] = {};  // w[g]: [n[g], k]
  int64_t n[kFusedMaxWeights] = {};
  // Each weight's dtype: x's float dtype (any value that is no block format reads so), or
  // GGUF block formats for all of them, each weight its own, in the device layout of
  // kernels/quant_blocks.cuh at 16-byte aligned addresses, K a multiple of every
  // format's block. Weights of different formats must not share a column block
  // (FusedBlockFormatsFit).
  DType w_dtype[kFusedMaxWeights] = {DType::kF32, DType::kF32, DType::kF32};
  int weights = 1;
  FusedEpilogue epilogue = FusedEpilogue::kNone;
  const void* residual = nullptr;  // kAdd: [m, Σn]
  void* y = nullptr;  // [m, Σn]; kSiluMul and kRopeKvWrite [m, n[0]]; kArgmax i32 [m]
  DType dtype = DType::kF32;
  // The weights are no node's output in the step (graph Weights): each thread asks for
  // its first weight vectors before waiting on the kernels it depends on, so the loads
  // overlap the predecessor's tail.
  bool weights_constant = false;
  // Float weights at one row, 16-byte vectors: the kernel compiled to hold this many blocks
  // an SM, 5 or 6, or 0 for the one without a bound (CudaOptions::fused_float_min_blocks).
  int min_blocks = 0;
  // Block formats of 32-value blocks at one row (four threads to a unit): how a block's
  // threads walk its units (FusedUnitWalk).
  FusedUnitWalk walk = FusedArgsDefaultWalk();
  // Split-K: `splits` blocks share a column group; each writes f32 partial sums and the
  // last to finish (counted in counters[column group]) adds them in split order, applies
  // the epilogue and resets its counter to 0, so the next launch (or graph replay) finds
  // the counters zeroed. partials: [splits, m, Σn] f32; counters: FusedColumnBlocks()
  // zeroed u32 (only when splits > 1).
  int splits = 1;
  float* partials = nullptr;
  uint32_t* counters = nullptr;
  // kArgmax: per column block best value and index of each row ([m, column blocks]) and
  // one zeroed counter; the last column block reduces them (lowest index on ties).
  float* argmax_value = nullptr;
  int32_t* argmax_index = nullptr;
  uint32_t* argmax_counter = nullptr;
  FusedRopeArgs rope;  // kRopeKvWrite only
  // Block formats on tensor cores (kernels/block_mma.cuh), without a folded norm: the
  // products of all m rows go first to `products` ([product_splits, m, Σn] f32, split-K
  // sums of the block MMA kernel, `mma_terms` the parts x is split into; both laid out by
  // BlockMmaWorkspaceFor with keep_partials), then the epilogue launches read them,
  // kFusedMaxMmaRows rows at a time. Null: the CUDA-core kernels.
  float* products = nullptr;
  int product_splits = 1;
  int mma_terms = 3;
  BlockMmaShape mma_shape = BlockMmaShape::kAuto;  // BlockMmaArgs::shape
  void* mma_scratch = nullptr;  // BlockMmaArgs::scratch for x [m, k]
  // Set by LaunchFusedMatmul: the rows between two splits of `products` (the op's m).
  int64_t product_rows = 0;
  // Set by LaunchFusedMatmul for block formats: x (and the norm weight) 16-byte aligned.
  bool x_aligned = false;
};

// Rows one epilogue launch of the tensor-core path takes (its products read, not summed).
inline constexpr int kFusedMaxMmaRows = 64;

// Whether the weights' block formats fit the kernel's column blocks: all weights float or
// all in block formats; where formats differ, no column block spans two weights (every
// weight but the last a whole number of kFusedCols columns, and kSiluMul's gate and up,
// whose columns every block pairs, of one format). Sizes as FusedMatmulArgs says.
bool FusedBlockFormatsFit(const FusedMatmulArgs& a);

// Column blocks of a launch (the grid's x): ceil(Σn / kFusedCols), or ceil(n / 2) for
// kSiluMul (each block pairs 2 gate with 2 up columns).
int64_t FusedColumnBlocks(const FusedMatmulArgs& a);

// The split-K factor for `sm_count` SMs: enough blocks for about two per SM, each split
// at least 512 elements of K.
int FusedSplitsFor(const FusedMatmulArgs& a, int sm_count);

// Whether `a` (one row, its splits set) walked kWide runs its blocks in one wave of
// sm_count SMs, taking the kernel's one-row registers as at most 64 a thread.
bool FusedWideFitsOneWave(const FusedMatmulArgs& a, int sm_count);

// Any m >= 1: launches of at most kFusedMaxRows rows (block formats: 8, 4, 2 or 1 rows
// each, the row counts their kernel is compiled for). cudaErrorInvalidValue for
// inconsistent arguments; cudaErrorMisalignedAddress for a block-format weight not 16-byte
// aligned.
cudaError_t LaunchFusedMatmul(const FusedMatmulArgs& a, Stream stream);

// The head norms of ops::RopeKvWrite (weights [head_dim] of the activations' dtype), or
// none (both null).
struct RopeHeadNorms {
  const void* q = nullptr;
  const void* k = nullptr;
  float eps = 0.0f;
};

// qkv [rows, q_cols + 2 * kv_heads * head_dim]; q [rows, q_cols]; caches [slots, kv_heads,
// seq, head_dim]; inv_freq [head_dim / 2]. With `norms`, RmsNorms each q and k head first
// (as LaunchRmsNorm over heads, rounded as it stores). Rotates the q and k heads (as
// LaunchRope), writes q and stores k and v at (row, pos[row]) of the caches (as
// LaunchKvWrite).
cudaError_t LaunchRopeKvWrite(const void* qkv, const int32_t* pos, const float* inv_freq,
                              void* q, void* k_cache, void* v_cache, int64_t rows,
                              int64_t q_cols, int64_t kv_heads, int64_t seq, int head_dim,
                              bool interleaved, DType dtype, uint32_t* error_flags,
                              Stream stream, const RopeHeadNorms& norms = {});

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_FUSED_MATMUL_CUH_
