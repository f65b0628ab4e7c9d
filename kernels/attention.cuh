// Launcher for decode attention: one query token per row against the first pos[i] + 1
// entries of that row's KV-cache slot, split over the KV length into chunks whose partial
// softmax states are merged inside the same launch (the last block to finish a (row, kv
// head) merges). The launch shape is a function of the shapes and the device only, never
// of the positions, so a captured launch stays valid as they move; how many of its chunks
// take part is decided in the kernel from each row's position (one chunk, no merge, for
// short contexts).
#ifndef STEPGRAPH_KERNELS_ATTENTION_CUH_
#define STEPGRAPH_KERNELS_ATTENTION_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/launch.h"
#include "stepgraph/base/dtype.h"

namespace sg::kernels {

// q[rows, heads·head_dim]; caches [slots, kv_heads, seq_len, head_dim], row i reading slot
// i (AttentionArgs::seq_slots null, slots >= rows) or the slot of its sequence.
struct AttentionShape {
  int rows = 0;
  int heads = 0;
  int kv_heads = 0;
  int seq_len = 0;
  int head_dim = 0;
};

// The largest head dim the kernels take; any even head dim up to it works, and 32, 64,
// 128 and 256 get 16-byte loads.
inline constexpr int kAttentionMaxHeadDim = 256;
// Upper bound on chunks (the merging block keeps one weight per chunk in shared memory).
inline constexpr int kAttentionMaxChunks = 256;

// Empty when the kernels take `s`, else what is wrong with it.
const char* AttentionShapeError(const AttentionShape& s);

// Blocks of the decode kernel for `s` in `dtype` a multiprocessor holds at once, which the
// grid aims at: 2 for f32 rows of 32, 64 or 128 values whose query heads go eight to a
// block (their threads take two keys a round: 163 registers, three blocks an SM; H200,
// Qwen3-MoE's shape at 4,095 keys: 24.2 µs at 64 chunks, 31.7 at 132), 4 otherwise.
int AttentionBlocksPerSm(const AttentionShape& s, DType dtype);

// KV-length chunks for `s` in `dtype` on a device with `sm_count` multiprocessors: enough
// blocks to fill the device (AttentionBlocksPerSm) at pos = seq_len - 1, but at least 64
// keys per chunk, 16 where a chunk is fewer than 8 blocks, rows · kv heads · head tiles
// (at a shorter position, where a chunk is fewer than 32 blocks, the launch lets chunks of
// 16 keys take part); above 8 where a chunk has fewer than 8 blocks, a multiple of 8 (the
// chunks of a thread block cluster, AttentionClusters). `target_blocks` overrides the
// block count aimed at (0: the default). The chunks never exceed bf16's for the same shape
// (the most any dtype takes).
int ChooseAttentionChunks(const AttentionShape& s, DType dtype, int sm_count,
                          int target_blocks = 0);

// Bytes of device workspace a launch with `chunks` needs: per-(row, head) arrival
// counters, which must be zero before the first launch (every launch leaves them zero),
// then the chunks' partial softmax states.
int64_t AttentionWorkspaceBytes(const AttentionShape& s, int chunks);

// How decode attention merges a row's chunks. Within thread block clusters of up to 8
// chunks (sm_90 and later; a single chunk never merges): each cluster's blocks merge their
// partials through distributed shared memory, so that a context whose chunks fit one
// cluster skips the workspace's write, fence, count and read back, and longer ones merge
// one partial a cluster there. kAuto does so where a chunk has fewer than 8 blocks (rows ·
// KV heads · head tiles: Qwen3-MoE's 4 KV heads at batch 1), whose grid ChooseAttentionChunks
// makes a multiple of 8 chunks; elsewhere every chunk merges through the workspace. H200,
// 2026-12-02: the 12-layer Qwen3-MoE Q4_K_M step at position 1,000 took 0.878 ms with
// clusters against 0.913 without (0.840 against 0.837 at 100); the 1B bf16 step (8
// blocks a chunk), 1.060 against 1.043 at 1,000 and 1.025 against 1.009 at 100, so it
// keeps the workspace. kAlways: clusters wherever a row has several chunks (tests,
// benchmarks); kNever: the workspace alone.
enum class AttentionClusters : uint8_t { kAuto, kAlways, kNever };

struct AttentionArgs {
  const void* q = nullptr;
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  const int32_t* pos = nullptr;  // device, [rows]
  void* out = nullptr;           // [rows, heads·head_dim], same dtype as q
  float scale = 0.0f;            // multiplies q·k before the softmax
  // ops::Attention's sliding window (> 0: the last `window` positions) and score
  // soft-capping (> 0: s -> softcap·tanh(s / softcap)). LaunchAttention only; the prefill
  // kernel takes neither (PrefillAttentionSupported's caller keeps such nodes off it).
  int window = 0;
  float softcap = 0.0f;
  void* workspace = nullptr;     // AttentionWorkspaceBytes(shape, chunks)
  uint32_t* error_flags = nullptr;  // kErrorPositionOutOfRange is OR-ed in for pos >= seq_len
  // A prefill step: rows are sequences of rows_per_seq consecutive rows, sequence b in
  // KV slot seq_slots[b] (device, [rows / rows_per_seq]); a non-padding row whose slot is
  // outside [0, slots) gets zeros and raises the flag. Null: row i is slot i.
  const int32_t* seq_slots = nullptr;
  int rows_per_seq = 1;
  int slots = 0;
  // LaunchAttention: how a row's chunks merge (AttentionClusters).
  AttentionClusters clusters = AttentionClusters::kAuto;
  // LaunchPrefillAttention: bf16 and f16 on the CUDA-core kernel that f32 takes instead of
  // the tensor-core one (benchmarks compare them).
  bool prefill_cuda_cores = false;
  // LaunchPrefillAttention: f32 rows on the tensor-core kernel, q, k, v and the softmax's
  // probabilities rounded to f16 before their products (sums and the output in f32)
  // instead of the CUDA-core kernel's f32 products (CudaOptions::prefill_attention_f16).
  bool prefill_f32_f16 = false;
};

// One launch. Rows with pos < 0 get zeros; rows with pos >= seq_len get zeros and raise
// the flag. cudaErrorInvalidValue for a shape AttentionShapeError refuses, a chunk count
// outside [1, kAttentionMaxChunks] or buffers not aligned to two elements.
cudaError_t LaunchAttention(const AttentionArgs& args, const AttentionShape& shape, int chunks,
                            DType dtype, Stream stream);

// ---- Prefill: many query rows per sequence (kernels/attention_prefill.cu).
//
// Flash attention over tiles: a block takes kPrefillQueryTile consecutive rows of one
// sequence and one query head, walks the sequence's keys in tiles of kPrefillKeyTile up to
// the largest position among its rows, and keeps an online softmax per row; products and
// sums in f32 on CUDA cores for every storage type. Row i attends to keys 0..pos[i] of its
// slot, as the decode kernel does, so the two kernels agree row by row.
inline constexpr int kPrefillQueryTile = 64;
inline constexpr int kPrefillKeyTile = 32;

// Whether the prefill kernel takes the shape, dtype and rows per sequence (f32, bf16 or
// f16; head_dim 64 or 128, at least 16 rows per sequence). Where it does not,
// LaunchAttention's row-by-row kernel serves prefill steps too.
bool PrefillAttentionSupported(const AttentionShape& s, DType dtype, int rows_per_seq);

// Sets what the prefill kernel needs once per process (its shared memory carve-out),
// outside any capture: call it when a dispatcher is made.
cudaError_t PreparePrefillAttention();

// One launch; args.seq_slots must be set. cudaErrorInvalidValue where
// PrefillAttentionSupported refuses or buffers are not 16-byte aligned.
cudaError_t LaunchPrefillAttention(const AttentionArgs& args, const AttentionShape& shape,
                                   DType dtype, Stream stream);

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_ATTENTION_CUH_
