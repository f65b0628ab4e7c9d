// Prefill attention (many query rows per sequence) in the flash-attention style, on CUDA
// cores with f32 products and sums for every storage type. Grid: (query tiles of the
// sequence, heads, sequences). A block of kThreads takes kPrefillQueryTile consecutive
// rows of one sequence and one query head and walks the keys of the sequence's KV slot in
// tiles of kPrefillKeyTile up to the largest position among its rows, with an online
// softmax per row (base 2, keys past the row's position masked). Thread (ty, tx) =
// (tid / 8, tid % 8) owns rows 4ty .. 4ty + 3, and per key tile the keys tx + 8j (j < 4)
// of S and the 16-byte column groups tx + 8i (i < D / 32) of O, so that S is a 4x4 tile
// and O four rows of registers per thread. Q is converted to f32 once into shared memory;
// the key and value tiles arrive by cp.async in their storage type, the next tile's
// copies in flight while this one is multiplied, and are widened to f32 as they are read;
// a tile's P goes through shared memory to the threads that multiply it with V. Rows are
// padded by 16 bytes, so that the 8 lanes that read 8 keys' rows at one column hit
// different banks. Row i sees keys 0..pos[i], as in the decode kernel, so both agree row
// by row and a chunk's rows are causal among themselves (KvWrite stored them before this
// launch).
//
// Measured on an H200 (attention_bench, a chunk of 256 rows at keys 1,792..2,047, Llama-
// 3.2-1B's heads): 190 us for f32 and 194 for bf16, against the row-by-row decode kernel's
// 403 and 268 and, for bf16, the tensor-core (wmma) kernel this one replaced, 484: that
// kernel kept S and O in shared memory between its MMAs and a softmax of two lanes a row,
// and lost to the row kernel at every prefill size measured (docs/cuda_kernels.md).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention.cuh"
#include "kernels/common.cuh"
#include "stepgraph/base/error_flags.h"

namespace sg::kernels {
namespace {

constexpr int kBQ = kPrefillQueryTile;
constexpr int kBK = kPrefillKeyTile;
constexpr int kThreads = 128;
static_assert(kBQ == 4 * (kThreads / 8) && kBK == 4 * 8);

struct PrefillParams {
  const void* q;
  const void* k;
  const void* v;
  const int32_t* pos;
  const int32_t* seq_slots;
  void* out;
  float scale_log2;
  int heads;
  int kv_heads;
  int seq_len;
  int rows_per_seq;
  int slots;
  uint32_t* error_flags;
};

// Elements of a K or V row in shared memory (16 bytes of padding), of a Q row (f32) and of
// a P row.
template <typename T, int D>
constexpr int kKvLd = D + 16 / static_cast<int>(sizeof(T));
template <int D>
constexpr int kQLd = D + 4;
constexpr int kPLd = kBK + 4;

// Q (f32), two stages of K and V tiles (T), P (f32) and the rows' positions.
template <typename T, int D>
__host__ __device__ constexpr int64_t SmemBytes() {
  return static_cast<int64_t>(kBQ) * kQLd<D> * 4 +
         4 * static_cast<int64_t>(kBK) * kKvLd<T, D> * static_cast<int64_t>(sizeof(T)) +
         static_cast<int64_t>(kBQ) * kPLd * 4 + kBQ * 4;
}

// Four consecutive elements as f32 (one access of 4 · sizeof(T) bytes), and back.
template <typename T>
__device__ __forceinline__ float4 Load4(const T* p) {
  float f[4];
  LoadFloats<T, 4>(p, f);
  return make_float4(f[0], f[1], f[2], f[3]);
}
template <typename T>
__device__ __forceinline__ void Store4(T* p, float4 v) {
  StoreVec<T, 4>(p, Vec<T, 4>{{FromFloat<T>(v.x), FromFloat<T>(v.y), FromFloat<T>(v.z),
                              FromFloat<T>(v.w)}});
}

// Where a block's tile of kBQ rows of one head (blockIdx: tile, head, sequence) stands.
struct PrefillTile {
  int head;
  int local0;            // the tile's first row within its sequence
  int64_t row0;          // that row in the step
  int64_t q_stride;      // elements of a q (and out) row
  int64_t cache_offset;  // elements before the tile's (slot, kv head) in a cache
};

// The tile of this block, and its rows' positions into s_pos: -1 for padding and for rows
// past the sequence's end (they belong to the next sequence); a row whose position or
// slot is out of range is flagged (by the head-0 block) and gives zeros like padding.
// s_kmax gets the largest position. Every thread of the block (kBlockThreads) calls it;
// s_pos and s_kmax are for the block after its next barrier.
template <int kBlockThreads>
__device__ __forceinline__ PrefillTile StartPrefillTile(const PrefillParams& p, int head_dim,
                                                        int* s_pos, int& s_kmax) {
  PrefillTile t;
  t.head = static_cast<int>(blockIdx.y);
  const int seq = static_cast<int>(blockIdx.z);
  t.local0 = static_cast<int>(blockIdx.x) * kBQ;
  t.row0 = static_cast<int64_t>(seq) * p.rows_per_seq + t.local0;
  t.q_stride = static_cast<int64_t>(p.heads) * head_dim;
  const int kv_head = t.head / (p.heads / p.kv_heads);
  const int slot = p.seq_slots[seq];
  const bool slot_ok = slot >= 0 && slot < p.slots;
  t.cache_offset =
      (static_cast<int64_t>(slot_ok ? slot : 0) * p.kv_heads + kv_head) * p.seq_len * head_dim;
  if (threadIdx.x == 0) s_kmax = -1;
  __syncthreads();
  for (int r = static_cast<int>(threadIdx.x); r < kBQ; r += kBlockThreads) {
    int pos = -1;
    if (t.local0 + r < p.rows_per_seq) {
      pos = p.pos[t.row0 + r];
      if (pos >= 0 && (pos >= p.seq_len || !slot_ok)) {
        if (t.head == 0) atomicOr(p.error_flags, kErrorPositionOutOfRange);
        pos = -1;
      }
    }
    s_pos[r] = pos;
    if (pos >= 0) atomicMax(&s_kmax, pos);
  }
  return t;
}

// Keys kb .. kb + kKeys - 1 of a tile's K and V rows (k_rows, v_rows: its slot and kv
// head) into stage `stage` of k_s and v_s (rows of kLd elements), by cp.async in 16-byte
// chunks, committed as one group. Keys past kmax (never past seq_len - 1) arrive as zeros
// without a read: every row masks them, and a zero V row keeps P·V finite whatever the
// cache holds there. Every thread of the block (kBlockThreads) calls it.
template <typename T, int D, int kKeys, int kLd, int kBlockThreads>
__device__ __forceinline__ void LoadKvTile(T* k_s, T* v_s, int stage, int kb, int kmax,
                                           const T* k_rows, const T* v_rows) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements of a 16-byte chunk
  constexpr int kChunks = D / kVec;                         // chunks of a row
  T* ks = k_s + stage * kKeys * kLd;
  T* vs = v_s + stage * kKeys * kLd;
  for (int i = static_cast<int>(threadIdx.x); i < kKeys * kChunks; i += kBlockThreads) {
    const int r = i / kChunks, c = (i % kChunks) * kVec;
    const int key = kb + r;
    const bool valid = key <= kmax;
    const int64_t at = static_cast<int64_t>(valid ? key : 0) * D + c;
    CopyAsync16(ks + r * kLd + c, k_rows + at, valid);
    CopyAsync16(vs + r * kLd + c, v_rows + at, valid);
  }
  CommitCopies();
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) PrefillAttentionKernel(const PrefillParams p) {
  AwaitPrerequisiteGrids();
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int s_kmax;
  constexpr int kLd = kKvLd<T, D>;
  constexpr int kQ = kQLd<D>;
  constexpr int kGroups = D / 32;  // 16-byte f32 column groups of O a thread owns
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements of a 16-byte chunk
  constexpr int kChunks = D / kVec;                         // 16-byte chunks of a row
  float* q_s = reinterpret_cast<float*>(smem);
  T* k_s = reinterpret_cast<T*>(q_s + kBQ * kQ);  // [2][kBK][kLd]
  T* v_s = k_s + 2 * kBK * kLd;                   // [2][kBK][kLd]
  float* p_s = reinterpret_cast<float*>(v_s + 2 * kBK * kLd);  // [kBQ][kPLd]
  int* s_pos = reinterpret_cast<int*>(p_s + kBQ * kPLd);

  const int tid = threadIdx.x, ty = tid / 8, tx = tid % 8;
  const PrefillTile tile = StartPrefillTile<kThreads>(p, D, s_pos, s_kmax);
  const int head = tile.head, local0 = tile.local0;
  const int64_t row0 = tile.row0, q_stride = tile.q_stride;
  for (int i = tid; i < kBQ * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * kVec;
    float f[kVec] = {};
    if (local0 + r < p.rows_per_seq) {
      LoadFloatsVec16<T, kVec>(
          static_cast<const T*>(p.q) + (row0 + r) * q_stride + static_cast<int64_t>(head) * D + c,
          f);
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) q_s[r * kQ + c + j] = f[j];
  }
  __syncthreads();

  const int kmax = s_kmax;  // block-uniform, so is every loop bound below
  const T* k_rows = static_cast<const T*>(p.k) + tile.cache_offset;
  const T* v_rows = static_cast<const T*>(p.v) + tile.cache_offset;
  const auto load_tile = [&](int kb, int stage) {
    LoadKvTile<T, D, kBK, kLd, kThreads>(k_s, v_s, stage, kb, kmax, k_rows, v_rows);
  };

  int my_pos[4];
  float m[4], l[4];
  float4 o[4][kGroups];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    my_pos[i] = s_pos[4 * ty + i];
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) o[i][g] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }

  const int tiles = kmax < 0 ? 0 : kmax / kBK + 1;
  if (tiles > 0) load_tile(0, 0);
  for (int t = 0; t < tiles; ++t) {
    const int stage = t & 1;
    if (t + 1 < tiles) {
      load_tile((t + 1) * kBK, stage ^ 1);
      AwaitCopies<1>();
    } else {
      AwaitCopies<0>();
    }
    __syncthreads();
    const T* ks = k_s + stage * kBK * kLd;
    const T* vs = v_s + stage * kBK * kLd;

    // S[4 rows][4 keys] = Q · Kᵀ, four columns at a time.
    float sc[4][4] = {};
#pragma unroll 4
    for (int d = 0; d < D; d += 4) {
      float4 qv[4], kv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) qv[i] = *reinterpret_cast<const float4*>(q_s + (4 * ty + i) * kQ + d);
#pragma unroll
      for (int j = 0; j < 4; ++j) kv[j] = Load4(ks + (tx + 8 * j) * kLd + d);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          sc[i][j] = fmaf(qv[i].x, kv[j].x, sc[i][j]);
          sc[i][j] = fmaf(qv[i].y, kv[j].y, sc[i][j]);
          sc[i][j] = fmaf(qv[i].z, kv[j].z, sc[i][j]);
          sc[i][j] = fmaf(qv[i].w, kv[j].w, sc[i][j]);
        }
      }
    }

    // Online softmax per row; the row's kBK keys are spread over the 8 lanes tx.
    const int kb = t * kBK;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int key = kb + tx + 8 * j;
        sc[i][j] = key <= my_pos[i] ? sc[i][j] * p.scale_log2 : -INFINITY;
        mx = fmaxf(mx, sc[i][j]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 4));
      const float m_new = fmaxf(m[i], mx);
      // No key for this row yet (padding, or all masked): nothing to rescale.
      const float corr = m_new == -INFINITY ? 1.0f : exp2f(m[i] - m_new);
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float pv = sc[i][j] == -INFINITY ? 0.0f : exp2f(sc[i][j] - m_new);
        p_s[(4 * ty + i) * kPLd + tx + 8 * j] = pv;
        sum += pv;
      }
      l[i] = l[i] * corr + sum;  // this lane's share; the lanes' sum at the end
      m[i] = m_new;
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        o[i][g].x *= corr;
        o[i][g].y *= corr;
        o[i][g].z *= corr;
        o[i][g].w *= corr;
      }
    }
    __syncthreads();  // P complete

    // O[4 rows][groups] += P · V, four keys at a time.
#pragma unroll 2
    for (int kk = 0; kk < kBK; kk += 4) {
      float4 pr[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) pr[i] = *reinterpret_cast<const float4*>(p_s + (4 * ty + i) * kPLd + kk);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
          const float4 v = Load4(vs + (kk + u) * kLd + 4 * (tx + 8 * g));
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float w = u == 0 ? pr[i].x : u == 1 ? pr[i].y : u == 2 ? pr[i].z : pr[i].w;
            o[i][g].x = fmaf(w, v.x, o[i][g].x);
            o[i][g].y = fmaf(w, v.y, o[i][g].y);
            o[i][g].z = fmaf(w, v.z, o[i][g].z);
            o[i][g].w = fmaf(w, v.w, o[i][g].w);
          }
        }
      }
    }
    __syncthreads();  // this stage and P are rewritten next
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float sum = l[i];
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    sum += __shfl_xor_sync(kFullMask, sum, 2);
    sum += __shfl_xor_sync(kFullMask, sum, 4);
    const int r = 4 * ty + i;
    if (local0 + r >= p.rows_per_seq) continue;
    // l > 0 for every row with a position: key 0 is always seen.
    const float inv = my_pos[i] >= 0 ? 1.0f / sum : 0.0f;
    T* out = static_cast<T*>(p.out) + (row0 + r) * q_stride + static_cast<int64_t>(head) * D;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const float4 v = my_pos[i] >= 0 ? make_float4(o[i][g].x * inv, o[i][g].y * inv,
                                                    o[i][g].z * inv, o[i][g].w * inv)
                                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      Store4(out + 4 * (tx + 8 * g), v);
    }
  }
}

template <typename T, int D>
cudaError_t SetSmem() {
  return cudaFuncSetAttribute(PrefillAttentionKernel<T, D>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(SmemBytes<T, D>()));
}

template <typename T, int D>
cudaError_t LaunchPrefill(const PrefillParams& p, int tiles, int seqs, Stream stream) {
  cudaLaunchAttribute attribute[1];
  const cudaLaunchConfig_t config = MakeLaunchConfig(
      dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(p.heads),
           static_cast<unsigned>(seqs)),
      dim3(kThreads), static_cast<size_t>(SmemBytes<T, D>()), stream,
      stream.programmatic && ProgrammaticLaunchSupported(), attribute);
  const cudaError_t e = cudaLaunchKernelEx(&config, PrefillAttentionKernel<T, D>, p);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}


// ---- bf16 and f16 on tensor cores (FlashAttention-2's register layout) -----------------
//
// The same walk with S, P and O in registers: each of a block's four warps owns 16 of its
// 64 rows. Per key tile of kMmaKeys: S (16 × kMmaKeys) = Q · Kᵀ by m16n8k16 MMAs (Q's A
// fragments loaded once by ldmatrix, K's B fragments by ldmatrix from the key rows), the
// online softmax on the accumulators (a quad of lanes shares a row), P rounded to T and
// reused as the A fragments of P · V without leaving registers (the accumulator layout of
// two n8 tiles is the A layout of one k16 step), V's B fragments by ldmatrix.trans, O in
// f32 accumulators rescaled per row. Q, K and V arrive by cp.async (the next tile in
// flight); smem rows are padded by 16 bytes, so ldmatrix's eight row addresses hit
// different banks. A warp whose rows all end before a tile skips its MMAs. f32 rows
// (AttentionArgs::prefill_f32_f16) take the same walk in f16: Q, K and V rounded to f16 as
// they are loaded (plain loads, not cp.async), the output written back in f32.
constexpr int kMmaKeys = 64;
constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = kMmaWarps * kWarpSize;
static_assert(kBQ == 16 * kMmaWarps);

template <int D>
constexpr int kMmaLd = D + 8;  // elements of a Q, K or V row in shared memory

template <int D>
__host__ __device__ constexpr int64_t MmaSmemBytes() {
  return (static_cast<int64_t>(kBQ) + 4 * kMmaKeys) * kMmaLd<D> * 2 + kBQ * 4;
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#endif
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#endif
}

// d += a · b: one m16n8k16 MMA, T operands (bf16 or f16), f32 accumulators.
template <typename T>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#endif
}

// Two f32 values as a T pair in one register (x in the low half), rounded to nearest.
template <typename T>
__device__ __forceinline__ uint32_t PackPair(float x, float y) {
  uint32_t u;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    memcpy(&u, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(x, y);
    memcpy(&u, &v, 4);
  }
  return u;
}

// Eight consecutive f32 values rounded to T into `to` (16 bytes of T), or zeros without a
// read: how f32 rows enter the tensor-core kernel's shared tiles.
template <typename T>
__device__ __forceinline__ void ConvertChunk8(T* to, const float* from, bool valid) {
  float f[8];
  if (valid) {
    LoadFloatsVec16<float, 8>(from, f);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = 0.0f;
  }
  StoreFloatsVec16<T, 8>(to, f);
}

// LoadKvTile for f32 caches: the keys' rows rounded to T as they are stored (the stores
// are plain, complete when the block's next barrier is passed).
template <typename T, int D, int kKeys, int kLd, int kBlockThreads>
__device__ __forceinline__ void LoadKvTileF32(T* k_s, T* v_s, int stage, int kb, int kmax,
                                              const float* k_rows, const float* v_rows) {
  constexpr int kChunks = D / 8;  // 8-value chunks of a row
  T* ks = k_s + stage * kKeys * kLd;
  T* vs = v_s + stage * kKeys * kLd;
  for (int i = static_cast<int>(threadIdx.x); i < kKeys * kChunks; i += kBlockThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    const int key = kb + r;
    const bool valid = key <= kmax;
    const int64_t at = static_cast<int64_t>(valid ? key : 0) * D + c;
    ConvertChunk8(ks + r * kLd + c, k_rows + at, valid);
    ConvertChunk8(vs + r * kLd + c, v_rows + at, valid);
  }
}

// TIn: the rows' dtype in global memory; T: the MMAs' (TIn, or f16 for f32 rows).
template <typename TIn, typename T, int D>
__global__ void __launch_bounds__(kMmaThreads) PrefillAttentionMmaKernel(const PrefillParams p) {
  static_assert(std::is_same_v<TIn, T> || (std::is_same_v<TIn, float> && std::is_same_v<T, __half>));
  constexpr bool kConvert = !std::is_same_v<TIn, T>;
  AwaitPrerequisiteGrids();
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int s_kmax;
  constexpr int kLd = kMmaLd<D>;
  constexpr int kVec = 8;              // elements of a 16-byte chunk
  constexpr int kChunks = D / kVec;    // chunks of a row
  constexpr int kSTiles = kMmaKeys / 8;  // n8 tiles of S
  constexpr int kOTiles = D / 8;         // n8 tiles of O
  T* q_s = reinterpret_cast<T*>(smem);   // [kBQ][kLd]
  T* k_s = q_s + kBQ * kLd;              // [2][kMmaKeys][kLd]
  T* v_s = k_s + 2 * kMmaKeys * kLd;     // [2][kMmaKeys][kLd]
  int* s_pos = reinterpret_cast<int*>(v_s + 2 * kMmaKeys * kLd);

  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int g = lane / 4, t4 = lane % 4;  // the fragment's row and column pair
  const PrefillTile tile = StartPrefillTile<kMmaThreads>(p, D, s_pos, s_kmax);
  const int head = tile.head, local0 = tile.local0;
  const int64_t row0 = tile.row0, q_stride = tile.q_stride;
  // Q's rows (zeros past the sequence's end) in the same copy group as the first tile.
  for (int i = tid; i < kBQ * kChunks; i += kMmaThreads) {
    const int r = i / kChunks, c = (i % kChunks) * kVec;
    const bool valid = local0 + r < p.rows_per_seq;
    const TIn* from = static_cast<const TIn*>(p.q) + (valid ? (row0 + r) * q_stride : 0) +
                      static_cast<int64_t>(head) * D + c;
    if constexpr (kConvert) {
      ConvertChunk8(q_s + r * kLd + c, from, valid);
    } else {
      CopyAsync16(q_s + r * kLd + c, from, valid);
    }
  }
  __syncthreads();

  const int kmax = s_kmax;  // block-uniform
  const TIn* k_rows = static_cast<const TIn*>(p.k) + tile.cache_offset;
  const TIn* v_rows = static_cast<const TIn*>(p.v) + tile.cache_offset;
  const auto load_tile = [&](int kb, int stage) {
    if constexpr (kConvert) {
      LoadKvTileF32<T, D, kMmaKeys, kLd, kMmaThreads>(k_s, v_s, stage, kb, kmax, k_rows,
                                                      v_rows);
    } else {
      LoadKvTile<T, D, kMmaKeys, kLd, kMmaThreads>(k_s, v_s, stage, kb, kmax, k_rows, v_rows);
    }
  };

  // This warp's rows g and g + 8: positions, and the largest (its last useful key).
  const int pos_lo = s_pos[warp * 16 + g], pos_hi = s_pos[warp * 16 + g + 8];
  int warp_kmax = max(pos_lo, pos_hi);
#pragma unroll
  for (int off = 4; off < kWarpSize; off *= 2) {
    warp_kmax = max(warp_kmax, __shfl_xor_sync(kFullMask, warp_kmax, off));
  }

  const int tiles = kmax < 0 ? 0 : kmax / kMmaKeys + 1;
  if (tiles > 0) {
    load_tile(0, 0);  // closes Q's copies too
  } else {
    CommitCopies();
    AwaitCopies<0>();  // no copy outlives the block
  }

  uint32_t qf[D / 16][4];
  float o[kOTiles][4];
#pragma unroll
  for (int j = 0; j < kOTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;

  for (int t = 0; t < tiles; ++t) {
    const int stage = t & 1;
    if (t + 1 < tiles) {
      load_tile((t + 1) * kMmaKeys, stage ^ 1);
      AwaitCopies<1>();
    } else {
      AwaitCopies<0>();
    }
    __syncthreads();
    if (t == 0) {
      // Q's A fragments: matrices (rows 0-7 | 8-15) × (k 0-7 | 8-15) of the warp's rows.
      const int mat = lane / 8;
      const T* at = q_s + (warp * 16 + lane % 8 + (mat % 2) * 8) * kLd + (mat / 2) * 8;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) LdMatrixX4(qf[kk], at + kk * 16);
    }
    const int kb = t * kMmaKeys;
    if (kb <= warp_kmax) {
      const T* ks = k_s + stage * kMmaKeys * kLd;
      const T* vs = v_s + stage * kMmaKeys * kLd;
      float sc[kSTiles][4];
#pragma unroll
      for (int j = 0; j < kSTiles; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
      // S = Q · Kᵀ: per pair of n8 tiles and k16 step, one ldmatrix.x4 of key rows gives
      // both tiles' B fragments (keys n..n+7 | n+8..n+15) × (k lo | k hi).
      {
        const int mat = lane / 8;
        const T* at = ks + (lane % 8 + (mat / 2) * 8) * kLd + (mat % 2) * 8;
#pragma unroll
        for (int j = 0; j < kSTiles; j += 2) {
#pragma unroll
          for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t b[4];
            LdMatrixX4(b, at + j * 8 * kLd + kk * 16);
            Mma16816<T>(sc[j], qf[kk], b[0], b[1]);
            Mma16816<T>(sc[j + 1], qf[kk], b[2], b[3]);
          }
        }
      }
      // Online softmax (base 2): rows g (c0, c1) and g + 8 (c2, c3); a quad shares a row.
      float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
      for (int j = 0; j < kSTiles; ++j) {
        const int key = kb + j * 8 + 2 * t4;
        sc[j][0] = key <= pos_lo ? sc[j][0] * p.scale_log2 : -INFINITY;
        sc[j][1] = key + 1 <= pos_lo ? sc[j][1] * p.scale_log2 : -INFINITY;
        sc[j][2] = key <= pos_hi ? sc[j][2] * p.scale_log2 : -INFINITY;
        sc[j][3] = key + 1 <= pos_hi ? sc[j][3] * p.scale_log2 : -INFINITY;
        mx_lo = fmaxf(mx_lo, fmaxf(sc[j][0], sc[j][1]));
        mx_hi = fmaxf(mx_hi, fmaxf(sc[j][2], sc[j][3]));
      }
#pragma unroll
      for (int o2 = 1; o2 < 4; o2 *= 2) {
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(kFullMask, mx_lo, o2));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(kFullMask, mx_hi, o2));
      }
      const float new_lo = fmaxf(m_lo, mx_lo), new_hi = fmaxf(m_hi, mx_hi);
      // No key for a row yet (padding, or all masked): nothing to rescale.
      const float corr_lo = new_lo == -INFINITY ? 1.0f : exp2f(m_lo - new_lo);
      const float corr_hi = new_hi == -INFINITY ? 1.0f : exp2f(m_hi - new_hi);
      m_lo = new_lo;
      m_hi = new_hi;
      float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
      for (int j = 0; j < kSTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          sc[j][e] = sc[j][e] == -INFINITY ? 0.0f : exp2f(sc[j][e] - new_lo);
          sc[j][2 + e] = sc[j][2 + e] == -INFINITY ? 0.0f : exp2f(sc[j][2 + e] - new_hi);
          sum_lo += sc[j][e];
          sum_hi += sc[j][2 + e];
        }
      }
      l_lo = l_lo * corr_lo + sum_lo;  // this lane's share; the quad's sum at the end
      l_hi = l_hi * corr_hi + sum_hi;
#pragma unroll
      for (int j = 0; j < kOTiles; ++j) {
        o[j][0] *= corr_lo;
        o[j][1] *= corr_lo;
        o[j][2] *= corr_hi;
        o[j][3] *= corr_hi;
      }
      // O += P · V: k16 step s of P is S's n8 tiles 2s and 2s + 1; V's B fragments by
      // ldmatrix.trans of key rows (keys lo | hi) × (dims n..n+7 | n+8..n+15).
      const int mat = lane / 8;
      const T* at = vs + (lane % 8 + (mat % 2) * 8) * kLd + (mat / 2) * 8;
#pragma unroll
      for (int s2 = 0; s2 < kMmaKeys / 16; ++s2) {
        const uint32_t a[4] = {PackPair<T>(sc[2 * s2][0], sc[2 * s2][1]),
                               PackPair<T>(sc[2 * s2][2], sc[2 * s2][3]),
                               PackPair<T>(sc[2 * s2 + 1][0], sc[2 * s2 + 1][1]),
                               PackPair<T>(sc[2 * s2 + 1][2], sc[2 * s2 + 1][3])};
#pragma unroll
        for (int j = 0; j < kOTiles; j += 2) {
          uint32_t b[4];
          LdMatrixX4Trans(b, at + s2 * 16 * kLd + j * 8);
          Mma16816<T>(o[j], a, b[0], b[1]);
          Mma16816<T>(o[j + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // this stage is rewritten next
  }

#pragma unroll
  for (int o2 = 1; o2 < 4; o2 *= 2) {
    l_lo += __shfl_xor_sync(kFullMask, l_lo, o2);
    l_hi += __shfl_xor_sync(kFullMask, l_hi, o2);
  }
  // l > 0 for every row with a position: key 0 is always seen.
  const float inv_lo = pos_lo >= 0 ? 1.0f / l_lo : 0.0f;
  const float inv_hi = pos_hi >= 0 ? 1.0f / l_hi : 0.0f;
  const int r_lo = warp * 16 + g, r_hi = r_lo + 8;
  TIn* out = static_cast<TIn*>(p.out) + static_cast<int64_t>(head) * D + 2 * t4;
  // Two columns of a row: a T pair in one register, or two f32 values.
  const auto store_pair = [](TIn* at, float x, float y) {
    if constexpr (kConvert) {
      *reinterpret_cast<float2*>(at) = make_float2(x, y);
    } else {
      *reinterpret_cast<uint32_t*>(at) = PackPair<T>(x, y);
    }
  };
#pragma unroll
  for (int j = 0; j < kOTiles; ++j) {
    if (local0 + r_lo < p.rows_per_seq) {
      store_pair(out + (row0 + r_lo) * q_stride + j * 8, pos_lo >= 0 ? o[j][0] * inv_lo : 0.0f,
                 pos_lo >= 0 ? o[j][1] * inv_lo : 0.0f);
    }
    if (local0 + r_hi < p.rows_per_seq) {
      store_pair(out + (row0 + r_hi) * q_stride + j * 8, pos_hi >= 0 ? o[j][2] * inv_hi : 0.0f,
                 pos_hi >= 0 ? o[j][3] * inv_hi : 0.0f);
    }
  }
}

template <typename TIn, typename T, int D>
cudaError_t SetMmaSmem() {
  return cudaFuncSetAttribute(PrefillAttentionMmaKernel<TIn, T, D>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(MmaSmemBytes<D>()));
}

template <typename TIn, typename T, int D>
cudaError_t LaunchPrefillMma(const PrefillParams& p, int tiles, int seqs, Stream stream) {
  cudaLaunchAttribute attribute[1];
  const cudaLaunchConfig_t config = MakeLaunchConfig(
      dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(p.heads),
           static_cast<unsigned>(seqs)),
      dim3(kMmaThreads), static_cast<size_t>(MmaSmemBytes<D>()), stream,
      stream.programmatic && ProgrammaticLaunchSupported(), attribute);
  const cudaError_t e = cudaLaunchKernelEx(&config, PrefillAttentionMmaKernel<TIn, T, D>, p);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}

template <int D>
cudaError_t LaunchFor(const PrefillParams& p, DType dtype, bool tensor_cores, bool f32_f16,
                      int tiles, int seqs, Stream stream) {
  switch (dtype) {
    case DType::kF32:
      return tensor_cores && f32_f16 ? LaunchPrefillMma<float, __half, D>(p, tiles, seqs, stream)
                                     : LaunchPrefill<float, D>(p, tiles, seqs, stream);
    case DType::kBF16:
      return tensor_cores
                 ? LaunchPrefillMma<__nv_bfloat16, __nv_bfloat16, D>(p, tiles, seqs, stream)
                 : LaunchPrefill<__nv_bfloat16, D>(p, tiles, seqs, stream);
    default:
      return tensor_cores ? LaunchPrefillMma<__half, __half, D>(p, tiles, seqs, stream)
                          : LaunchPrefill<__half, D>(p, tiles, seqs, stream);
  }
}

}  // namespace

bool PrefillAttentionSupported(const AttentionShape& s, DType dtype, int rows_per_seq) {
  return AttentionShapeError(s)[0] == '\0' &&
         (dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32) &&
         (s.head_dim == 64 || s.head_dim == 128) && rows_per_seq >= 16 &&
         s.rows % rows_per_seq == 0 && s.rows / rows_per_seq <= 65535;
}

cudaError_t PreparePrefillAttention() {
  const cudaError_t errors[] = {SetSmem<float, 64>(),         SetSmem<float, 128>(),
                                SetSmem<__nv_bfloat16, 64>(), SetSmem<__nv_bfloat16, 128>(),
                                SetSmem<__half, 64>(),        SetSmem<__half, 128>(),
                                SetMmaSmem<__nv_bfloat16, __nv_bfloat16, 64>(),
                                SetMmaSmem<__nv_bfloat16, __nv_bfloat16, 128>(),
                                SetMmaSmem<__half, __half, 64>(),
                                SetMmaSmem<__half, __half, 128>(),
                                SetMmaSmem<float, __half, 64>(),
                                SetMmaSmem<float, __half, 128>()};
  for (const cudaError_t e : errors) {
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t LaunchPrefillAttention(const AttentionArgs& args, const AttentionShape& s,
                                   DType dtype, Stream stream) {
  if (args.seq_slots == nullptr || !PrefillAttentionSupported(s, dtype, args.rows_per_seq) ||
      args.window != 0 || args.softcap != 0.0f) {
    return cudaErrorInvalidValue;
  }
  const void* buffers[] = {args.q, args.k_cache, args.v_cache, args.out};
  for (const void* b : buffers) {
    if (!Aligned16(b)) return cudaErrorInvalidValue;
  }
  PrefillParams p;
  p.q = args.q;
  p.k = args.k_cache;
  p.v = args.v_cache;
  p.pos = args.pos;
  p.seq_slots = args.seq_slots;
  p.out = args.out;
  p.scale_log2 = args.scale * 1.4426950408889634f;
  p.heads = s.heads;
  p.kv_heads = s.kv_heads;
  p.seq_len = s.seq_len;
  p.rows_per_seq = args.rows_per_seq;
  p.slots = args.slots;
  p.error_flags = args.error_flags;
  const int tiles = (args.rows_per_seq + kBQ - 1) / kBQ;
  const int seqs = s.rows / args.rows_per_seq;
  const bool tensor_cores = !args.prefill_cuda_cores;
  const bool f32_f16 = args.prefill_f32_f16;
  return s.head_dim == 64
             ? LaunchFor<64>(p, dtype, tensor_cores, f32_f16, tiles, seqs, stream)
             : LaunchFor<128>(p, dtype, tensor_cores, f32_f16, tiles, seqs, stream);
}

}  // namespace sg::kernels
