// Prefill attention (many query rows per sequence) in the flash-attention style. Grid:
// (query tiles of the sequence, heads, sequences). A block of four warps takes
// kPrefillQueryTile consecutive rows of one sequence and one query head, 16 rows per warp,
// and walks the keys of the sequence's KV slot in tiles of kPrefillKeyTile up to the
// largest position among its rows. Per key tile: S = Q·Kᵀ on tensor cores (wmma,
// 16x16x16, f32 accumulation) into the warp's shared memory; an online softmax per row
// (two lanes a row, base-2 domain, keys past the row's position masked); P rounded to
// the storage type; O = O·corr + P·V on tensor cores, O kept in f32 in shared memory so
// that each row can be rescaled by its own factor. Row i sees keys 0..pos[i], as in the
// decode kernel, so both agree row by row and a chunk's rows are causal among themselves
// (KvWrite stored them before this launch).
//
// f32 (the activations of GGUF files with quantized matrices) has a kernel of its own
// below: the same tiles on CUDA cores, f32 products and sums.
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention.cuh"
#include "kernels/common.cuh"
#include "stepgraph/base/error_flags.h"

namespace sg::kernels {
namespace {

using namespace nvcuda;

constexpr int kBQ = kPrefillQueryTile;
constexpr int kBK = kPrefillKeyTile;
constexpr int kWarpsP = kBQ / 16;
constexpr int kThreadsP = kWarpsP * kWarpSize;
static_assert(kBK % 32 == 0 && kBQ % 16 == 0);

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

// Per warp: S (f32) and P (T) of 16 x kBK, O (f32) of 16 x D.
template <typename T, int D>
__host__ __device__ constexpr int64_t WarpBytes() {
  return 16 * kBK * 4 + 16 * kBK * static_cast<int64_t>(sizeof(T)) + 16 * D * 4;
}

// Q (kBQ x D), K and V (kBK x D) tiles, the warps' areas, the rows' positions. Every
// region is a multiple of 32 bytes, as wmma loads and stores need.
template <typename T, int D>
__host__ __device__ constexpr int64_t SmemBytes() {
  return (kBQ + 2 * kBK) * D * static_cast<int64_t>(sizeof(T)) + kWarpsP * WarpBytes<T, D>() +
         kBQ * 4;
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreadsP) PrefillAttentionKernel(const PrefillParams p) {
  AwaitPrerequisiteGrids();
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int s_kmax;
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte access
  constexpr int kVecsPerRow = D / kVec;

  T* q_s = reinterpret_cast<T*>(smem);
  T* k_s = q_s + kBQ * D;
  T* v_s = k_s + kBK * D;
  unsigned char* warps = reinterpret_cast<unsigned char*>(v_s + kBK * D);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  float* s_w = reinterpret_cast<float*>(warps + warp * WarpBytes<T, D>());
  T* p_w = reinterpret_cast<T*>(s_w + 16 * kBK);
  float* o_w = reinterpret_cast<float*>(p_w + 16 * kBK);
  int* s_pos = reinterpret_cast<int*>(warps + kWarpsP * WarpBytes<T, D>());

  const int head = blockIdx.y, seq = blockIdx.z;
  const int local0 = blockIdx.x * kBQ;  // the tile's first row within its sequence
  const int64_t row0 = static_cast<int64_t>(seq) * p.rows_per_seq + local0;
  const int kv_head = head / (p.heads / p.kv_heads);
  const int slot = p.seq_slots[seq];
  const bool slot_ok = slot >= 0 && slot < p.slots;
  const int64_t q_stride = static_cast<int64_t>(p.heads) * D;

  // Positions of the tile's rows; -1 for padding and for rows past the sequence's end
  // (they belong to the next sequence). A row whose position or slot is out of range is
  // flagged (by the head-0 block) and gives zeros like padding.
  if (threadIdx.x == 0) s_kmax = -1;
  __syncthreads();
  for (int r = threadIdx.x; r < kBQ; r += kThreadsP) {
    int pos = -1;
    if (local0 + r < p.rows_per_seq) {
      pos = p.pos[row0 + r];
      if (pos >= 0 && (pos >= p.seq_len || !slot_ok)) {
        if (head == 0) atomicOr(p.error_flags, kErrorPositionOutOfRange);
        pos = -1;
      }
    }
    s_pos[r] = pos;
    if (pos >= 0) atomicMax(&s_kmax, pos);
  }
  for (int i = threadIdx.x; i < kBQ * kVecsPerRow; i += kThreadsP) {
    const int r = i / kVecsPerRow, c = (i % kVecsPerRow) * kVec;
    uint4 w = make_uint4(0u, 0u, 0u, 0u);
    if (local0 + r < p.rows_per_seq) {
      w = __ldg(reinterpret_cast<const uint4*>(static_cast<const T*>(p.q) + (row0 + r) * q_stride +
                                               static_cast<int64_t>(head) * D + c));
    }
    *reinterpret_cast<uint4*>(q_s + r * D + c) = w;
  }
  for (int i = lane; i < 16 * D; i += kWarpSize) o_w[i] = 0.0f;
  __syncthreads();

  const int kmax = s_kmax;  // block-uniform, so is every loop bound below
  // Softmax state: lanes 2r and 2r + 1 hold row r of the warp, each half of its columns.
  const int my_row = lane / 2, half = lane % 2;
  const int my_pos = s_pos[warp * 16 + my_row];
  float m = -INFINITY, l = 0.0f;

  const int64_t cache_offset =
      (static_cast<int64_t>(slot_ok ? slot : 0) * p.kv_heads + kv_head) * p.seq_len * D;
  const T* k_rows = static_cast<const T*>(p.k) + cache_offset;
  const T* v_rows = static_cast<const T*>(p.v) + cache_offset;

  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> q_frag[D / 16];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    wmma::load_matrix_sync(q_frag[kk], q_s + warp * 16 * D + kk * 16, D);
  }

  for (int kb = 0; kb <= kmax; kb += kBK) {
    // Keys past kmax (never past seq_len - 1) load as zeros; every row masks them.
    for (int i = threadIdx.x; i < kBK * kVecsPerRow; i += kThreadsP) {
      const int r = i / kVecsPerRow, c = (i % kVecsPerRow) * kVec;
      const int key = kb + r;
      uint4 kw = make_uint4(0u, 0u, 0u, 0u), vw = kw;
      if (key <= kmax) {
        const int64_t at = static_cast<int64_t>(key) * D + c;
        kw = __ldg(reinterpret_cast<const uint4*>(k_rows + at));
        vw = __ldg(reinterpret_cast<const uint4*>(v_rows + at));
      }
      *reinterpret_cast<uint4*>(k_s + r * D + c) = kw;
      *reinterpret_cast<uint4*>(v_s + r * D + c) = vw;
    }
    __syncthreads();

    // S[16, kBK] = Q_w · Kᵀ: Kᵀ (D x keys) is K read column-major.
#pragma unroll
    for (int n = 0; n < kBK / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> s_frag;
      wmma::fill_fragment(s_frag, 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> k_frag;
        wmma::load_matrix_sync(k_frag, k_s + n * 16 * D + kk * 16, D);
        wmma::mma_sync(s_frag, q_frag[kk], k_frag, s_frag);
      }
      wmma::store_matrix_sync(s_w + n * 16, s_frag, kBK, wmma::mem_row_major);
    }
    __syncwarp();

    constexpr int kHalfK = kBK / 2;
    float* s_row = s_w + my_row * kBK + half * kHalfK;
    float mx = -INFINITY;
    for (int c = 0; c < kHalfK; ++c) {
      const int key = kb + half * kHalfK + c;
      const float sv = key <= my_pos ? s_row[c] * p.scale_log2 : -INFINITY;
      s_row[c] = sv;
      mx = fmaxf(mx, sv);
    }
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
    const float m_new = fmaxf(m, mx);
    // No key for this row yet (padding, or all masked): nothing to rescale.
    const float corr = m_new == -INFINITY ? 1.0f : exp2f(m - m_new);
    float sum = 0.0f;
    T* p_row = p_w + my_row * kBK + half * kHalfK;
    for (int c = 0; c < kHalfK; ++c) {
      const float pv = s_row[c] == -INFINITY ? 0.0f : exp2f(s_row[c] - m_new);
      p_row[c] = FromFloat<T>(pv);
      sum += pv;
    }
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    l = l * corr + sum;
    m = m_new;
    float* o_row = o_w + my_row * D + half * (D / 2);
    for (int c = 0; c < D / 2; ++c) o_row[c] *= corr;
    __syncwarp();

    // O[16, D] += P · V, the accumulators round-tripping through the warp's O.
#pragma unroll
    for (int j = 0; j < D / 16; ++j) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> o_frag;
      wmma::load_matrix_sync(o_frag, o_w + j * 16, D, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> p_frag;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> v_frag;
        wmma::load_matrix_sync(p_frag, p_w + kk * 16, kBK);
        wmma::load_matrix_sync(v_frag, v_s + kk * 16 * D + j * 16, D);
        wmma::mma_sync(o_frag, p_frag, v_frag, o_frag);
      }
      wmma::store_matrix_sync(o_w + j * 16, o_frag, D, wmma::mem_row_major);
    }
    __syncthreads();  // the K and V tiles are overwritten next
  }
  __syncwarp();

  const int local = local0 + warp * 16 + my_row;
  if (local < p.rows_per_seq) {
    T* o = static_cast<T*>(p.out) + (row0 + warp * 16 + my_row) * q_stride +
           static_cast<int64_t>(head) * D + half * (D / 2);
    const float* o_row = o_w + my_row * D + half * (D / 2);
    const float inv = my_pos >= 0 ? 1.0f / l : 0.0f;  // l > 0: key 0 is always seen
    for (int c = 0; c < D / 2; ++c) o[c] = FromFloat<T>(my_pos >= 0 ? o_row[c] * inv : 0.0f);
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
      dim3(kThreadsP), static_cast<size_t>(SmemBytes<T, D>()), stream,
      stream.programmatic && ProgrammaticLaunchSupported(), attribute);
  const cudaError_t e = cudaLaunchKernelEx(&config, PrefillAttentionKernel<T, D>, p);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}


// ---- f32 rows (GGUF files with quantized matrices compute in f32) ----------------------
//
// The same walk on CUDA cores, in f32 throughout (products and sums as the decode kernel
// and the CPU reference make them, up to their order). A block of kF32Threads takes
// kBQ rows of one sequence and head; thread (ty, tx) = (tid / 8, tid % 8) owns rows
// 4ty .. 4ty + 3 and, per key tile of kF32Keys, the keys tx + 8j (j < 4) of S, and for
// O the 16-byte column groups tx + 8i (i < D / 32). Key and value tiles arrive by cp.async,
// the next tile's copies in flight while this one is multiplied; a tile's P goes through
// shared memory to the threads that multiply it with V. Rows are padded by 4 floats, so
// that the 8 lanes that read 8 keys' rows at the same column hit 8 different banks.
constexpr int kF32Keys = 32;
constexpr int kF32Threads = 128;
static_assert(kBQ == 4 * (kF32Threads / 8) && kF32Keys == 4 * 8);

template <int D>
__host__ __device__ constexpr int64_t F32SmemBytes() {
  return (static_cast<int64_t>(kBQ) * (D + 4) + 4 * kF32Keys * (D + 4) + kBQ * (kF32Keys + 4)) *
             4 +
         kBQ * 4;
}

template <int D>
__global__ void __launch_bounds__(kF32Threads) PrefillAttentionF32Kernel(const PrefillParams p) {
  AwaitPrerequisiteGrids();
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int s_kmax;
  constexpr int kLd = D + 4;          // Q, K and V rows in shared memory
  constexpr int kPLd = kF32Keys + 4;  // P rows
  constexpr int kGroups = D / 32;     // 16-byte column groups of O a thread owns
  float* q_s = reinterpret_cast<float*>(smem);
  float* k_s = q_s + kBQ * kLd;         // [2][kF32Keys][kLd]
  float* v_s = k_s + 2 * kF32Keys * kLd;  // [2][kF32Keys][kLd]
  float* p_s = v_s + 2 * kF32Keys * kLd;  // [kBQ][kPLd]
  int* s_pos = reinterpret_cast<int*>(p_s + kBQ * kPLd);

  const int tid = threadIdx.x, ty = tid / 8, tx = tid % 8;
  const int head = blockIdx.y, seq = blockIdx.z;
  const int local0 = blockIdx.x * kBQ;
  const int64_t row0 = static_cast<int64_t>(seq) * p.rows_per_seq + local0;
  const int kv_head = head / (p.heads / p.kv_heads);
  const int slot = p.seq_slots[seq];
  const bool slot_ok = slot >= 0 && slot < p.slots;
  const int64_t q_stride = static_cast<int64_t>(p.heads) * D;

  if (tid == 0) s_kmax = -1;
  __syncthreads();
  for (int r = tid; r < kBQ; r += kF32Threads) {
    int pos = -1;
    if (local0 + r < p.rows_per_seq) {
      pos = p.pos[row0 + r];
      if (pos >= 0 && (pos >= p.seq_len || !slot_ok)) {
        if (head == 0) atomicOr(p.error_flags, kErrorPositionOutOfRange);
        pos = -1;
      }
    }
    s_pos[r] = pos;
    if (pos >= 0) atomicMax(&s_kmax, pos);
  }
  constexpr int kChunks = D / 4;  // 16-byte chunks of a row
  for (int i = tid; i < kBQ * kChunks; i += kF32Threads) {
    const int r = i / kChunks, c = (i % kChunks) * 4;
    float4 w = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (local0 + r < p.rows_per_seq) {
      w = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.q) +
                                                (row0 + r) * q_stride +
                                                static_cast<int64_t>(head) * D + c));
    }
    *reinterpret_cast<float4*>(q_s + r * kLd + c) = w;
  }
  __syncthreads();

  const int kmax = s_kmax;  // block-uniform
  const int64_t cache_offset =
      (static_cast<int64_t>(slot_ok ? slot : 0) * p.kv_heads + kv_head) * p.seq_len * D;
  const float* k_rows = static_cast<const float*>(p.k) + cache_offset;
  const float* v_rows = static_cast<const float*>(p.v) + cache_offset;
  // Keys past kmax (never past seq_len - 1) arrive as zeros without a read.
  const auto load_tile = [&](int kb, int stage) {
    float* ks = k_s + stage * kF32Keys * kLd;
    float* vs = v_s + stage * kF32Keys * kLd;
    for (int i = tid; i < kF32Keys * kChunks; i += kF32Threads) {
      const int r = i / kChunks, c = (i % kChunks) * 4;
      const int key = kb + r;
      const bool valid = key <= kmax;
      const int64_t at = static_cast<int64_t>(valid ? key : 0) * D + c;
      CopyAsync16(ks + r * kLd + c, k_rows + at, valid);
      CopyAsync16(vs + r * kLd + c, v_rows + at, valid);
    }
    CommitCopies();
  };

  int my_pos[4];
  float m[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    my_pos[i] = s_pos[4 * ty + i];
    m[i] = -INFINITY;
    l[i] = 0.0f;
  }
  float4 o[4][kGroups];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int g = 0; g < kGroups; ++g) o[i][g] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }

  const int tiles = kmax < 0 ? 0 : kmax / kF32Keys + 1;
  if (tiles > 0) load_tile(0, 0);
  for (int t = 0; t < tiles; ++t) {
    const int stage = t & 1;
    if (t + 1 < tiles) {
      load_tile((t + 1) * kF32Keys, stage ^ 1);
      AwaitCopies<1>();
    } else {
      AwaitCopies<0>();
    }
    __syncthreads();
    const float* ks = k_s + stage * kF32Keys * kLd;
    const float* vs = v_s + stage * kF32Keys * kLd;

    // S[4 rows][4 keys] = Q · Kᵀ, four columns at a time.
    float sc[4][4] = {};
#pragma unroll 4
    for (int d = 0; d < D; d += 4) {
      float4 qv[4], kv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) qv[i] = *reinterpret_cast<const float4*>(q_s + (4 * ty + i) * kLd + d);
#pragma unroll
      for (int j = 0; j < 4; ++j) kv[j] = *reinterpret_cast<const float4*>(ks + (tx + 8 * j) * kLd + d);
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

    // Online softmax per row (base 2); the row's 32 keys are spread over the 8 lanes tx.
    const int kb = t * kF32Keys;
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
    for (int kk = 0; kk < kF32Keys; kk += 4) {
      float4 pv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) pv[i] = *reinterpret_cast<const float4*>(p_s + (4 * ty + i) * kPLd + kk);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
          const float4 v = *reinterpret_cast<const float4*>(vs + (kk + u) * kLd + 4 * (tx + 8 * g));
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float w = u == 0 ? pv[i].x : u == 1 ? pv[i].y : u == 2 ? pv[i].z : pv[i].w;
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
    float* out = static_cast<float*>(p.out) + (row0 + r) * q_stride + static_cast<int64_t>(head) * D;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const float4 v = my_pos[i] >= 0
                           ? make_float4(o[i][g].x * inv, o[i][g].y * inv, o[i][g].z * inv,
                                         o[i][g].w * inv)
                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      *reinterpret_cast<float4*>(out + 4 * (tx + 8 * g)) = v;
    }
  }
}

template <int D>
cudaError_t SetF32Smem() {
  return cudaFuncSetAttribute(PrefillAttentionF32Kernel<D>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(F32SmemBytes<D>()));
}

template <int D>
cudaError_t LaunchPrefillF32(const PrefillParams& p, int tiles, int seqs, Stream stream) {
  cudaLaunchAttribute attribute[1];
  const cudaLaunchConfig_t config = MakeLaunchConfig(
      dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(p.heads),
           static_cast<unsigned>(seqs)),
      dim3(kF32Threads), static_cast<size_t>(F32SmemBytes<D>()), stream,
      stream.programmatic && ProgrammaticLaunchSupported(), attribute);
  const cudaError_t e = cudaLaunchKernelEx(&config, PrefillAttentionF32Kernel<D>, p);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}
}  // namespace

bool PrefillAttentionSupported(const AttentionShape& s, DType dtype, int rows_per_seq) {
  return AttentionShapeError(s)[0] == '\0' &&
         (dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32) &&
         (s.head_dim == 64 || s.head_dim == 128) && rows_per_seq >= 16 &&
         s.rows % rows_per_seq == 0 && s.rows / rows_per_seq <= 65535;
}

cudaError_t PreparePrefillAttention() {
  const cudaError_t errors[] = {SetSmem<__nv_bfloat16, 64>(), SetSmem<__nv_bfloat16, 128>(),
                                SetSmem<__half, 64>(), SetSmem<__half, 128>(),
                                SetF32Smem<64>(), SetF32Smem<128>()};
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
  if (dtype == DType::kF32) {
    return s.head_dim == 64 ? LaunchPrefillF32<64>(p, tiles, seqs, stream)
                            : LaunchPrefillF32<128>(p, tiles, seqs, stream);
  }
  const bool bf16 = dtype == DType::kBF16;
  if (s.head_dim == 64) {
    return bf16 ? LaunchPrefill<__nv_bfloat16, 64>(p, tiles, seqs, stream)
                : LaunchPrefill<__half, 64>(p, tiles, seqs, stream);
  }
  return bf16 ? LaunchPrefill<__nv_bfloat16, 128>(p, tiles, seqs, stream)
              : LaunchPrefill<__half, 128>(p, tiles, seqs, stream);
}

}  // namespace sg::kernels
