// Decode attention (flash-decoding). Grid: (chunks, kv_heads · head_tiles, rows). A block
// takes one row, one kv head and a tile of G query heads of that kv head's group, and the
// chunk-th share of keys 0..pos[row]: it reads each K and V row once and serves all G
// heads from it, which is what makes GQA bandwidth-efficient. Within the block a key is
// handled by a group of threads, one 16-byte vector each, with an online softmax in f32
// (scores in the base-2 domain); the key groups are merged through shared memory. Each
// block then writes its partial (max, sum, unnormalised output); the last block of a
// (row, kv head, tile) to arrive, counted with an atomic in the workspace, merges the
// chunks and writes the output, then resets the counter for the next launch.
//
// With AttentionClusters (sm_90 and later) the chunks of a row go to the device in thread
// block clusters of up to 8 (Params::cluster): the blocks of a cluster merge their partials
// through distributed shared memory, each block a share of the output's elements, so that
// a context whose chunks fit one cluster (up to 128 keys in 16-key chunks) is done without
// the workspace round trip (write, fence, count, read back); longer ones write one partial
// a cluster and the last block merges those as above.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/attention.cuh"
#include "kernels/common.cuh"
#include "stepgraph/base/error_flags.h"

namespace sg::kernels {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 128;
// The most chunks a cluster takes (the portable cluster size).
constexpr int kMaxCluster = 8;
static_assert(kAttentionMaxChunks % kMaxCluster == 0);
constexpr int kWarps = kThreads / kWarpSize;
// Keys a taking-part chunk holds at least: 64, or 16 when a chunk's blocks (rows · kv heads
// · head tiles) are fewer than kFewBlocks, as at batch 1 of a model with 4 or 8 KV heads:
// there one chunk of a short context is 4 or 8 blocks on a device of 132 SMs, each walking
// every key, and more chunks with their merge cost less than that wait (MinKeysPerChunk).
// The grid's chunks are sized with 64 (ChooseAttentionChunks), so that a long context
// keeps chunks of 64 keys or more, except where a chunk has fewer than kFewestBlocks
// blocks: there the grid too is sized with 16, so that a short cache has the chunks its
// contexts take part with (H200, batch 1 at positions 100 / 200 of a 241-position cache:
// the Qwen3-MoE file's step, 4 KV heads in f32, 4 blocks a chunk, 0.804 / 0.849 ms with
// the grid of 64-key chunks, 0.792 / 0.794 with 16; the bf16 1B step, 8 blocks a chunk,
// 1.002 / 1.010 against 1.008 / 1.012, so it keeps 64; 8-key chunks 0.801 / 0.812).
constexpr int kMinKeysPerChunk = 64;
constexpr int kFewBlocksMinKeys = 16;
constexpr int64_t kFewBlocks = 32;
constexpr int64_t kFewestBlocks = 8;
constexpr int kDefaultBlocksPerSm = 4;

constexpr int LargestPow2Divisor(int n, int cap) {
  int p = 1;
  while (p < cap && n % (2 * p) == 0) p *= 2;
  return p;
}

// Values of a key one thread holds (Traits::kElems) for elements of `elem_bytes` bytes and
// the head dim a kernel is compiled for (0: the generic path, pairs of elements).
constexpr int ElemsPerThreadKey(int elem_bytes, int head_dim) {
  const int vec = head_dim == 0 ? 2 : 16 / elem_bytes;
  const int vecs = (head_dim == 0 ? kAttentionMaxHeadDim : head_dim) / vec;
  return vecs / LargestPow2Divisor(vecs, kWarpSize) * vec;
}

// Whether the kernel for `tile` heads a block keeps two keys a key group a round where
// eight heads' accumulators would halve it to one: where a thread holds four values of a
// key (f32 rows of up to 128 values, 8 to 32 threads a key), whose eight heads' q and
// accumulators take 64 registers. With one key a group a 16-key chunk of Qwen3-MoE's shape
// (f32, 128 values, 4 key groups) was four rounds of loads, waited for about twice; two
// rounds are in flight together. It takes 163 registers a thread, three blocks an SM
// (four keys took 225 and two blocks), which the grid allows for (AttentionBlocksPerSm).
constexpr bool KeepsTwoKeys(int elem_bytes, int head_dim, int tile) {
  return tile >= 8 && ElemsPerThreadKey(elem_bytes, head_dim) <= 4;
}

// How a block of kThreads covers one key row. kHeadDim == 0 is the generic path (any even
// head dim up to kAttentionMaxHeadDim, pairs of elements per access, predicated on d).
template <typename T, int kHeadDim, int kTile>
struct Traits {
  static constexpr bool kGeneric = kHeadDim == 0;
  static constexpr int kMaxDim = kGeneric ? kAttentionMaxHeadDim : kHeadDim;
  static constexpr int kVecElems = kGeneric ? 2 : 16 / static_cast<int>(sizeof(T));
  static constexpr int kNumVecs = kMaxDim / kVecElems;
  static constexpr int kThreadsPerKey = LargestPow2Divisor(kNumVecs, kWarpSize);
  static constexpr int kVecsPerThread = kNumVecs / kThreadsPerKey;
  static constexpr int kElems = kVecsPerThread * kVecElems;  // per thread and key
  static_assert(kElems == ElemsPerThreadKey(static_cast<int>(sizeof(T)), kHeadDim));
  static constexpr int kKeyGroups = kThreads / kThreadsPerKey;
  // Keys per key group and iteration: two 16-byte loads each of K and V per thread, one
  // when eight heads' accumulators already fill the registers (KeepsTwoKeys says where
  // they do not); with the next iteration's loads in flight during this one's (the
  // kernel's loop), about four in flight.
  static constexpr int kUnrollBase = kVecsPerThread >= 2 ? 1 : 2 / kVecsPerThread;
  static constexpr int kUnroll =
      kTile >= 8 && kUnrollBase > 1 && !KeepsTwoKeys(static_cast<int>(sizeof(T)), kHeadDim, kTile)
          ? kUnrollBase / 2
          : kUnrollBase;
  static constexpr int kKeysPerIter = kKeyGroups * kUnroll;
  static constexpr int kWordsPerVec = kVecElems * static_cast<int>(sizeof(T)) / 4;
  static_assert(kNumVecs % kThreadsPerKey == 0);
  static_assert(kWordsPerVec == 1 || kWordsPerVec == 2 || kWordsPerVec == 4);
};

// One 32-bit word of storage as f32 values (two for 16-bit types, element 0 in the low half).
template <typename T>
__device__ __forceinline__ void WordToFloats(uint32_t w, float* f) {
  if constexpr (std::is_same_v<T, float>) {
    f[0] = __uint_as_float(w);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    f[0] = __uint_as_float(w << 16);
    f[1] = __uint_as_float(w & 0xffff0000u);
  } else {
    f[0] = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
    f[1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  }
}

// kWords words through the read-only path (K, V and q are not written by this launch).
template <int kWords>
__device__ __forceinline__ void LoadWords(const void* p, uint32_t (&w)[kWords]) {
  if constexpr (kWords == 4) {
    const uint4 u = __ldg(static_cast<const uint4*>(p));
    w[0] = u.x;
    w[1] = u.y;
    w[2] = u.z;
    w[3] = u.w;
  } else if constexpr (kWords == 2) {
    const uint2 u = __ldg(static_cast<const uint2*>(p));
    w[0] = u.x;
    w[1] = u.y;
  } else {
    w[0] = __ldg(static_cast<const unsigned int*>(p));
  }
}

template <typename T, int kWords>
__device__ __forceinline__ void WordsToFloats(const uint32_t (&w)[kWords], float* f) {
  constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));
#pragma unroll
  for (int i = 0; i < kWords; ++i) WordToFloats<T>(w[i], f + i * kPerWord);
}

struct Params {
  const void* q;
  const void* k;
  const void* v;
  const int32_t* pos;
  void* out;
  // q is multiplied by q_scale = scale · log2(e), so that scores come out in the base-2
  // domain; with soft-capping (inv_softcap > 0) q_scale is the scale alone, and each score
  // s becomes softcap_log2 · tanh(s · inv_softcap), softcap_log2 = softcap · log2(e).
  float q_scale;
  float inv_softcap;
  float softcap_log2;
  int window;  // > 0: a row sees its last `window` positions only
  int heads;
  int kv_heads;
  int seq_len;
  int head_dim;
  int group;       // heads / kv_heads
  int head_tiles;  // group / kTile
  int chunks;
  int min_keys;  // MinKeysPerChunk of the launch
  int cluster;   // chunks a thread block cluster (1: no clusters; divides chunks)
  uint32_t* counters;  // [rows · kv_heads · head_tiles]
  float2* partial_ml;  // [rows · heads · chunks]: (max in log2 units, sum of 2^(s - max))
  float* partial_o;    // [rows · heads · chunks · head_dim]: Σ 2^(s - max) · v
  uint32_t* error_flags;
  const int32_t* seq_slots;  // null: row i is slot i
  int rows_per_seq;
  int slots;
};

// How many of a row's chunks take part at length `len` (see the kernel).
__device__ __forceinline__ int ActiveChunks(int len, int chunks, int min_keys) {
  return len <= 2 * min_keys ? 1 : min(chunks, (len + min_keys - 1) / min_keys);
}

template <typename T, int kHeadDim, int kTile>
__global__ void __launch_bounds__(kThreads) AttentionKernel(const Params p) {
  using Tr = Traits<T, kHeadDim, kTile>;
  AwaitPrerequisiteGrids();
  constexpr int kTpk = Tr::kThreadsPerKey;
  constexpr int kVpt = Tr::kVecsPerThread;
  constexpr int kVe = Tr::kVecElems;
  constexpr int kE = Tr::kElems;
  constexpr int kU = Tr::kUnroll;
  constexpr int kG = kTile;
  constexpr int kWords = Tr::kWordsPerVec;
  constexpr int kMaxDim = Tr::kMaxDim;

  __shared__ float s_m[kWarps][kG];
  __shared__ float s_l[kWarps][kG];
  __shared__ float s_acc[kWarps][kG][kMaxDim];
  __shared__ float s_weight[kG][kAttentionMaxChunks];
  __shared__ float s_merge[kThreads * 4];
  __shared__ float s_cluster_max[kG];  // with clusters: this block's partial per head
  __shared__ float s_cluster_sum[kG];
  __shared__ bool s_last;

  const int d = Tr::kGeneric ? p.head_dim : kHeadDim;
  const int chunk = blockIdx.x;
  const int kv_head = blockIdx.y / p.head_tiles;
  const int tile = blockIdx.y % p.head_tiles;
  const int row = blockIdx.z;
  const int head0 = kv_head * p.group + tile * kG;
  const int64_t out_offset = (static_cast<int64_t>(row) * p.heads + head0) * d;
  T* out = static_cast<T*>(p.out) + out_offset;
  const int lane_in_key = threadIdx.x % kTpk;
  const int key_group = threadIdx.x / kTpk;
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  // First element of this thread's v-th vector within a head row.
  auto elem = [&](int v) { return (v * kTpk + lane_in_key) * kVe; };
  auto in_row = [&](int v) { return !Tr::kGeneric || elem(v) < d; };

  // q does not depend on the position: asked for before it, so the two loads overlap
  // (a padding row's q is read and not used).
  float q[kG][kE];
  {
    const T* qp = static_cast<const T*>(p.q) + out_offset;
#pragma unroll
    for (int g = 0; g < kG; ++g) {
#pragma unroll
      for (int v = 0; v < kVpt; ++v) {
        if (in_row(v)) {
          uint32_t w[kWords];
          LoadWords<kWords>(qp + g * d + elem(v), w);
          WordsToFloats<T, kWords>(w, &q[g][v * kVe]);
#pragma unroll
          for (int i = 0; i < kVe; ++i) q[g][v * kVe + i] *= p.q_scale;
        } else {
#pragma unroll
          for (int i = 0; i < kVe; ++i) q[g][v * kVe + i] = 0.0f;
        }
      }
    }
  }

  const int pos = p.pos[row];
  const int slot = p.seq_slots == nullptr ? row : p.seq_slots[row / p.rows_per_seq];
  const bool bad = pos >= p.seq_len || (pos >= 0 && (slot < 0 || slot >= p.slots));

  // Padding rows (pos < 0), positions outside the cache and slots out of range give zeros;
  // the block of chunk 0 writes them. The decision depends on the row only, so every block
  // of the row agrees and none of them touches the counter.
  if (pos < 0 || bad) {
    if (chunk == 0) {
      for (int i = threadIdx.x; i < kG * d; i += kThreads) out[i] = FromFloat<T>(0.0f);
      if (bad && blockIdx.y == 0 && threadIdx.x == 0) {
        atomicOr(p.error_flags, kErrorPositionOutOfRange);
      }
    }
    return;
  }

  // The chunks that take part follow pos, the grid does not: the grid is sized for the
  // longest context, and at a short one most chunks would hold a few keys each and the
  // merge would cost more than they save. So `active` chunks of at least p.min_keys keys
  // each take part (one chunk, merging nothing, up to twice that), and the others leave at
  // once without counting.
  // Keys first .. pos: all of them, or the last `window` with a sliding window.
  const int first = p.window > 0 ? max(0, pos - p.window + 1) : 0;
  const int len = pos + 1 - first;
  const int active = ActiveChunks(len, p.chunks, p.min_keys);
  // With clusters (and more than one chunk taking part) every block of a cluster that holds
  // a taking-part chunk joins the cluster's merge, the ones past `active` with no keys. The
  // decision depends on the row and the cluster only, so a cluster's blocks agree.
  const bool clustered = p.cluster > 1 && active > 1;
  const int cl = clustered ? p.cluster : 1;
  // Partials the last block merges: one a chunk, or with clusters one a cluster.
  const int units = (active + cl - 1) / cl;
  if (chunk >= units * cl) return;
  const bool keyless = chunk >= active;
  const int begin =
      keyless ? first + len : first + static_cast<int>(static_cast<int64_t>(len) * chunk / active);
  const int end = keyless
                      ? first + len
                      : first + static_cast<int>(static_cast<int64_t>(len) * (chunk + 1) / active);

  float m[kG], l[kG], acc[kG][kE];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < kE; ++i) acc[g][i] = 0.0f;
  }

  const int64_t cache_offset =
      (static_cast<int64_t>(slot) * p.kv_heads + kv_head) * p.seq_len * d;
  const T* k_rows = static_cast<const T*>(p.k) + cache_offset;
  const T* v_rows = static_cast<const T*>(p.v) + cache_offset;

  // The K and V words of the keys base + u · kKeyGroups + key_group (u < kU); keys past
  // `end` read nothing and hold zeros.
  auto load_keys = [&](int base, uint32_t (&kw)[kU][kVpt][kWords],
                       uint32_t (&vw)[kU][kVpt][kWords], bool (&valid)[kU]) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int t = base + u * Tr::kKeyGroups + key_group;
      valid[u] = t < end;
#pragma unroll
      for (int v = 0; v < kVpt; ++v) {
        if (valid[u] && in_row(v)) {
          const int64_t at = static_cast<int64_t>(t) * d + elem(v);
          LoadWords<kWords>(k_rows + at, kw[u][v]);
          LoadWords<kWords>(v_rows + at, vw[u][v]);
        } else {
#pragma unroll
          for (int i = 0; i < kWords; ++i) kw[u][v][i] = vw[u][v][i] = 0u;
        }
      }
    }
  };

  // Every thread runs the same iterations (keys past `end` are masked), so the shuffles
  // below always see a converged warp. The next iteration's keys are asked for before this
  // one's are used, so a chunk of several iterations waits for memory about once rather
  // than once per iteration (a chunk's keys are read from DRAM: a step's weights pass
  // through L2 between two steps).
  uint32_t next_kw[kU][kVpt][kWords], next_vw[kU][kVpt][kWords];
  bool next_valid[kU];
  load_keys(begin, next_kw, next_vw, next_valid);
  for (int base = begin; base < end; base += Tr::kKeysPerIter) {
    uint32_t kw[kU][kVpt][kWords], vw[kU][kVpt][kWords];
    bool valid[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      valid[u] = next_valid[u];
#pragma unroll
      for (int v = 0; v < kVpt; ++v) {
#pragma unroll
        for (int i = 0; i < kWords; ++i) {
          kw[u][v][i] = next_kw[u][v][i];
          vw[u][v][i] = next_vw[u][v][i];
        }
      }
    }
    load_keys(base + Tr::kKeysPerIter, next_kw, next_vw, next_valid);

    float s[kU][kG];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      float kf[kE];
#pragma unroll
      for (int v = 0; v < kVpt; ++v) WordsToFloats<T, kWords>(kw[u][v], &kf[v * kVe]);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kE; ++i) dot = fmaf(q[g][i], kf[i], dot);
        s[u][g] = dot;
      }
    }
#pragma unroll
    for (int off = kTpk / 2; off > 0; off /= 2) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
#pragma unroll
        for (int g = 0; g < kG; ++g) s[u][g] += __shfl_xor_sync(kFullMask, s[u][g], off);
      }
    }
    if (p.inv_softcap > 0.0f) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
#pragma unroll
        for (int g = 0; g < kG; ++g) s[u][g] = p.softcap_log2 * tanhf(s[u][g] * p.inv_softcap);
      }
    }

#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float m_new = m[g];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (valid[u]) m_new = fmaxf(m_new, s[u][g]);
      }
      if (m_new == -INFINITY) continue;  // this key group has seen no key yet
      const float corr = exp2f(m[g] - m_new);  // 0 while m[g] is still -inf
      l[g] *= corr;
#pragma unroll
      for (int i = 0; i < kE; ++i) acc[g][i] *= corr;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (!valid[u]) continue;
        const float pw = exp2f(s[u][g] - m_new);
        l[g] += pw;
        float vf[kE];
#pragma unroll
        for (int v = 0; v < kVpt; ++v) WordsToFloats<T, kWords>(vw[u][v], &vf[v * kVe]);
#pragma unroll
        for (int i = 0; i < kE; ++i) acc[g][i] = fmaf(pw, vf[i], acc[g][i]);
      }
      m[g] = m_new;
    }
  }

  // Merge the key groups: the block's max per head, then rescaled sums over the key groups
  // of each warp (shuffles) and over the warps (shared memory).
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    float mw = m[g];
#pragma unroll
    for (int off = kTpk; off < kWarpSize; off *= 2) {
      mw = fmaxf(mw, __shfl_xor_sync(kFullMask, mw, off));
    }
    if (lane == 0) s_m[warp][g] = mw;
  }
  __syncthreads();
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    float block_max = s_m[0][g];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) block_max = fmaxf(block_max, s_m[w][g]);
    const float corr = m[g] == -INFINITY ? 0.0f : exp2f(m[g] - block_max);
    float lw = l[g] * corr;
#pragma unroll
    for (int i = 0; i < kE; ++i) acc[g][i] *= corr;
#pragma unroll
    for (int off = kTpk; off < kWarpSize; off *= 2) {
      lw += __shfl_xor_sync(kFullMask, lw, off);
#pragma unroll
      for (int i = 0; i < kE; ++i) acc[g][i] += __shfl_xor_sync(kFullMask, acc[g][i], off);
    }
    if (lane < kTpk) {
#pragma unroll
      for (int v = 0; v < kVpt; ++v) {
        if (in_row(v)) {
#pragma unroll
          for (int i = 0; i < kVe; ++i) s_acc[warp][g][elem(v) + i] = acc[g][v * kVe + i];
        }
      }
      if (lane == 0) s_l[warp][g] = lw;
    }
  }
  __syncthreads();

  const int64_t part = (static_cast<int64_t>(row) * p.heads + head0) * p.chunks;
  // The block's partial of element (g, e): its warps' sums and their max, merged.
  auto block_partial = [&](int g, int e, float& o, float& sum, float& block_max) {
    o = 0.0f;
    sum = 0.0f;
    block_max = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      o += s_acc[w][g][e];
      sum += s_l[w][g];
      block_max = fmaxf(block_max, s_m[w][g]);
    }
  };
  if (clustered) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // This block's partial in its own shared memory: the unnormalised output over s_acc[0]
    // (a thread reads its elements' warp sums before it writes them, and no other thread
    // touches them), the max and sum per head beside it.
    for (int i = threadIdx.x; i < kG * d; i += kThreads) {
      const int g = i / d, e = i % d;
      float o, sum, block_max;
      block_partial(g, e, o, sum, block_max);
      s_acc[0][g][e] = o;
      if (e == 0) {
        s_cluster_max[g] = block_max;
        s_cluster_sum[g] = sum;
      }
    }
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every block's partial is visible to the cluster
    // Block r of the cluster merges elements r · kThreads + t, then every cl · kThreads on,
    // reading each block's partial of them: at the Qwen3-MoE shape (8 heads of 128 a
    // block) one element a thread from eight blocks.
    const int rank = static_cast<int>(cluster.block_rank());
    for (int i = rank * kThreads + threadIdx.x; i < kG * d; i += cl * kThreads) {
      const int g = i / d, e = i % d;
      float mq[kMaxCluster], lq[kMaxCluster], oq[kMaxCluster];
#pragma unroll
      for (int q = 0; q < kMaxCluster; ++q) {
        if (q < cl) {
          mq[q] = *cluster.map_shared_rank(&s_cluster_max[g], q);
          lq[q] = *cluster.map_shared_rank(&s_cluster_sum[g], q);
          oq[q] = *cluster.map_shared_rank(&s_acc[0][g][e], q);
        } else {
          mq[q] = -INFINITY;
          lq[q] = 0.0f;
          oq[q] = 0.0f;
        }
      }
      float mx = -INFINITY;
#pragma unroll
      for (int q = 0; q < kMaxCluster; ++q) mx = fmaxf(mx, mq[q]);
      // mx is finite: the cluster's first block holds keys (chunk cl · j < active).
      float sum = 0.0f, o = 0.0f;
#pragma unroll
      for (int q = 0; q < kMaxCluster; ++q) {
        const float w = lq[q] == 0.0f ? 0.0f : exp2f(mq[q] - mx);
        sum = fmaf(lq[q], w, sum);
        o = fmaf(oq[q], w, o);
      }
      if (units == 1) {
        out[i] = FromFloat<T>(o / sum);
      } else {
        const int unit = chunk / cl;
        p.partial_o[(part + static_cast<int64_t>(g) * p.chunks + unit) * d + e] = o;
        if (e == 0) {
          p.partial_ml[part + static_cast<int64_t>(g) * p.chunks + unit] = make_float2(mx, sum);
        }
      }
    }
    // No block leaves while another still reads its shared memory.
    cluster.sync();
#endif
    if (units == 1) return;
  } else {
    for (int i = threadIdx.x; i < kG * d; i += kThreads) {
      const int g = i / d, e = i % d;
      float o, sum, block_max;
      block_partial(g, e, o, sum, block_max);
      if (active == 1) {
        out[i] = FromFloat<T>(o / sum);  // sum > 0: the only chunk holds every key
      } else {
        p.partial_o[(part + static_cast<int64_t>(g) * p.chunks + chunk) * d + e] = o;
        if (e == 0) {
          p.partial_ml[part + static_cast<int64_t>(g) * p.chunks + chunk] =
              make_float2(block_max, sum);
        }
      }
    }
    if (active == 1) return;
  }

  // Publish the partial, then count arrivals (every block of the taking-part clusters, or
  // every taking-part chunk); the last block merges the `units` partials.
  __threadfence();
  __syncthreads();
  uint32_t* counter =
      p.counters + (static_cast<int64_t>(row) * p.kv_heads + kv_head) * p.head_tiles + tile;
  const int arrivals = units * cl;
  if (threadIdx.x == 0) s_last = atomicAdd(counter, 1u) == static_cast<uint32_t>(arrivals - 1);
  __syncthreads();
  if (!s_last) return;
  __threadfence();

  // The merge is a latency-bound tail on one multiprocessor, so every load it makes is
  // issued in batches. Weights of the chunks per head: 2^(max_c - max) / Σ_c sum_c ·
  // 2^(max_c - max). Partials are read through L2 (ld.cg): other blocks wrote them
  // during this launch.
  constexpr int kMlPerLane = kAttentionMaxChunks / kWarpSize;
  for (int g = warp; g < kG; g += kWarps) {
    const float2* ml = p.partial_ml + part + static_cast<int64_t>(g) * p.chunks;
    float2 x[kMlPerLane];
#pragma unroll
    for (int i = 0; i < kMlPerLane; ++i) {
      const int c = lane + i * kWarpSize;
      x[i] = c < units ? __ldcg(&ml[c]) : make_float2(-INFINITY, 0.0f);
    }
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kMlPerLane; ++i) mx = fmaxf(mx, x[i].x);
#pragma unroll
    for (int off = kWarpSize / 2; off > 0; off /= 2) {
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, off));
    }
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < kMlPerLane; ++i) {
      total += x[i].y == 0.0f ? 0.0f : x[i].y * exp2f(x[i].x - mx);
    }
    const float inv_total = 1.0f / WarpSum(total);
#pragma unroll
    for (int i = 0; i < kMlPerLane; ++i) {
      const int c = lane + i * kWarpSize;
      if (c < units) s_weight[g][c] = x[i].y == 0.0f ? 0.0f : exp2f(x[i].x - mx) * inv_total;
    }
  }
  __syncthreads();

  // Output columns of kW consecutive elements (never straddling a head); when there are
  // fewer columns than threads, several threads share a column's chunks and add up
  // through shared memory.
  constexpr int kW = Tr::kGeneric ? 2 : 4;
  constexpr int kBatch = 16;  // loads in flight per thread
  using Col = std::conditional_t<kW == 4, float4, float2>;
  const int columns = kG * d / kW;
  const int lanes = columns >= kThreads ? 1 : kThreads / columns;
  const int col0 = columns >= kThreads ? threadIdx.x : threadIdx.x % columns;
  const int lane_c = columns >= kThreads ? 0 : threadIdx.x / columns;
  const int col_step = columns >= kThreads ? kThreads : columns;
  for (int col = col0; col < columns; col += col_step) {
    float acc_c[kW] = {};
    if (lane_c < lanes) {
      const int g = col * kW / d, e = col * kW % d;
      const float* po = p.partial_o + (part + static_cast<int64_t>(g) * p.chunks) * d + e;
      for (int c0 = lane_c; c0 < units; c0 += lanes * kBatch) {
        Col v[kBatch];
        float w[kBatch];
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          const int c = c0 + i * lanes;
          if (c < units) {
            v[i] = __ldcg(reinterpret_cast<const Col*>(po + static_cast<int64_t>(c) * d));
            w[i] = s_weight[g][c];
          } else {
            v[i] = Col{};
            w[i] = 0.0f;
          }
        }
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          const float* f = reinterpret_cast<const float*>(&v[i]);
#pragma unroll
          for (int k = 0; k < kW; ++k) acc_c[k] = fmaf(w[i], f[k], acc_c[k]);
        }
      }
    }
    if (lanes > 1) {  // block-uniform
#pragma unroll
      for (int k = 0; k < kW; ++k) s_merge[threadIdx.x * kW + k] = acc_c[k];
      __syncthreads();
      if (lane_c == 0) {
        for (int l = 1; l < lanes; ++l) {
#pragma unroll
          for (int k = 0; k < kW; ++k) acc_c[k] += s_merge[(l * columns + col) * kW + k];
        }
      }
    }
    if (lane_c == 0) {
#pragma unroll
      for (int k = 0; k < kW; ++k) out[col * kW + k] = FromFloat<T>(acc_c[k]);
    }
  }
  if (threadIdx.x == 0) *counter = 0u;  // ready for the next launch
}

// Heads per block: the largest power of two up to 8 that divides the group.
int GroupTile(int group) {
  for (int t = 8; t > 1; t /= 2) {
    if (group % t == 0) return t;
  }
  return 1;
}

// The blocks of one chunk: rows · kv heads · head tiles.
int64_t BlocksPerChunk(const AttentionShape& s) {
  const int group = std::max(1, s.heads / std::max(1, s.kv_heads));
  return static_cast<int64_t>(s.rows) * s.kv_heads * (group / GroupTile(group));
}

// The fewest keys a taking-part chunk holds (see kMinKeysPerChunk).
int MinKeysPerChunk(const AttentionShape& s) {
  return BlocksPerChunk(s) < kFewBlocks ? kFewBlocksMinKeys : kMinKeysPerChunk;
}

bool AlignedTo(const void* p, int bytes) {
  return (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes)) == 0;
}

template <typename T, int kHeadDim, int kTile>
cudaError_t Launch(const Params& p, int rows, Stream stream) {
  const dim3 grid(p.chunks, p.kv_heads * p.head_tiles, rows);
  // Clusters (p.cluster > 1) of consecutive chunks of one (row, kv head, tile).
  return LaunchKernelClustered(AttentionKernel<T, kHeadDim, kTile>, grid, dim3(kThreads), 0,
                               static_cast<unsigned>(p.cluster), stream, p);
}

// The chunks a cluster takes for a launch of `chunks` of `s` (AttentionClusters): the
// largest divisor of chunks up to kMaxCluster (ChooseAttentionChunks makes a kAuto grid's
// chunks a multiple of it where they exceed it), or 1 (no clusters) for a single chunk,
// where `mode` says none or where the build or the device predates them (sm_90: the build
// flag and the device that programmatic launch needs).
int ClusterFor(const AttentionShape& s, int chunks, AttentionClusters mode) {
  const bool wanted = mode == AttentionClusters::kAlways ||
                      (mode == AttentionClusters::kAuto && BlocksPerChunk(s) < kFewestBlocks);
  if (!wanted || chunks < 2 || !ProgrammaticLaunchSupported()) return 1;
  for (int c = kMaxCluster; c >= 2; --c) {
    if (chunks % c == 0) return c;
  }
  return 1;
}

template <typename T, int kHeadDim>
cudaError_t LaunchForTile(const Params& p, int rows, int tile, Stream stream) {
  switch (tile) {
    case 8:
      return Launch<T, kHeadDim, 8>(p, rows, stream);
    case 4:
      return Launch<T, kHeadDim, 4>(p, rows, stream);
    case 2:
      return Launch<T, kHeadDim, 2>(p, rows, stream);
    default:
      return Launch<T, kHeadDim, 1>(p, rows, stream);
  }
}

int64_t RoundUp256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

const char* AttentionShapeError(const AttentionShape& s) {
  if (s.rows <= 0 || s.heads <= 0 || s.kv_heads <= 0 || s.seq_len <= 0 || s.head_dim <= 0) {
    return "every dimension must be positive";
  }
  if (s.heads % s.kv_heads != 0) return "heads must be a multiple of kv_heads";
  if (s.head_dim % 2 != 0) return "head_dim must be even";
  if (s.head_dim > kAttentionMaxHeadDim) return "head_dim must be at most 256";
  if (s.rows > 65535) return "at most 65535 rows per launch";
  if (static_cast<int64_t>(s.kv_heads) * (s.heads / s.kv_heads) > 65535) {
    return "too many heads for one launch";
  }
  return "";
}

// The kernels keeping two keys a round (f32 rows of 128 in head tiles of 8, the 1B's bf16
// rows of 64 in tiles of 4 as before).
static_assert(Traits<float, 128, 8>::kUnroll == 2 && Traits<float, 128, 4>::kUnroll == 2);
static_assert(Traits<__nv_bfloat16, 64, 4>::kUnroll == 2 &&
              Traits<__nv_bfloat16, 128, 8>::kUnroll == 1);

int AttentionBlocksPerSm(const AttentionShape& s, DType dtype) {
  const int group = std::max(1, s.heads / std::max(1, s.kv_heads));
  // The head dim the launcher compiles for (16-byte aligned buffers), else the generic path.
  const int d = s.head_dim == 32 || s.head_dim == 64 || s.head_dim == 128 || s.head_dim == 256
                    ? s.head_dim
                    : 0;
  return KeepsTwoKeys(static_cast<int>(DTypeBytes(dtype)), d, GroupTile(group))
             ? 2
             : kDefaultBlocksPerSm;
}

int ChooseAttentionChunks(const AttentionShape& s, DType dtype, int sm_count,
                          int target_blocks) {
  if (target_blocks <= 0) target_blocks = std::max(1, sm_count) * AttentionBlocksPerSm(s, dtype);
  const int64_t blocks_per_chunk = BlocksPerChunk(s);
  int64_t chunks = (target_blocks + blocks_per_chunk - 1) / blocks_per_chunk;
  // The grid: chunks of 64 keys at least at the longest context (MinKeysPerChunk's smaller
  // chunks are for short contexts, where the grid has chunks to spare), of 16 where a
  // chunk has fewer than kFewestBlocks blocks.
  const int grid_min_keys =
      blocks_per_chunk < kFewestBlocks ? MinKeysPerChunk(s) : kMinKeysPerChunk;
  chunks = std::min<int64_t>(chunks, CeilDiv(s.seq_len, grid_min_keys));
  // Where kAuto merges in clusters, more than a cluster's worth of chunks is a multiple of
  // the cluster (ClusterFor), so that the first eight chunks, which take short contexts,
  // share one cluster.
  if (blocks_per_chunk < kFewestBlocks && chunks > kMaxCluster) {
    chunks = CeilDiv(chunks, int64_t{kMaxCluster}) * kMaxCluster;
  }
  chunks = std::min<int64_t>(chunks, kAttentionMaxChunks);
  return static_cast<int>(std::max<int64_t>(chunks, 1));
}

int64_t AttentionWorkspaceBytes(const AttentionShape& s, int chunks) {
  const int64_t row_heads = static_cast<int64_t>(s.rows) * s.heads;
  return RoundUp256(row_heads * static_cast<int64_t>(sizeof(uint32_t))) +
         RoundUp256(row_heads * chunks * static_cast<int64_t>(sizeof(float2))) +
         RoundUp256(row_heads * chunks * s.head_dim * static_cast<int64_t>(sizeof(float)));
}

cudaError_t LaunchAttention(const AttentionArgs& args, const AttentionShape& s, int chunks,
                            DType dtype, Stream stream) {
  if (AttentionShapeError(s)[0] != '\0') return cudaErrorInvalidValue;
  if (chunks < 1 || chunks > kAttentionMaxChunks) return cudaErrorInvalidValue;
  if (chunks > 1 && args.workspace == nullptr) return cudaErrorInvalidValue;

  Params p;
  p.q = args.q;
  p.k = args.k_cache;
  p.v = args.v_cache;
  p.pos = args.pos;
  p.out = args.out;
  constexpr float kLog2e = 1.4426950408889634f;
  if (args.window < 0 || !(args.softcap >= 0.0f)) return cudaErrorInvalidValue;
  const bool capped = args.softcap > 0.0f;
  p.q_scale = capped ? args.scale : args.scale * kLog2e;
  p.inv_softcap = capped ? 1.0f / args.softcap : 0.0f;
  p.softcap_log2 = args.softcap * kLog2e;
  p.window = args.window;
  p.heads = s.heads;
  p.kv_heads = s.kv_heads;
  p.seq_len = s.seq_len;
  p.head_dim = s.head_dim;
  p.group = s.heads / s.kv_heads;
  const int tile = GroupTile(p.group);
  p.head_tiles = p.group / tile;
  p.chunks = chunks;
  p.min_keys = MinKeysPerChunk(s);
  p.cluster = ClusterFor(s, chunks, args.clusters);
  const int64_t row_heads = static_cast<int64_t>(s.rows) * s.heads;
  char* ws = static_cast<char*>(args.workspace);
  p.counters = reinterpret_cast<uint32_t*>(ws);
  p.partial_ml = ws == nullptr ? nullptr
                               : reinterpret_cast<float2*>(
                                     ws + RoundUp256(row_heads * static_cast<int64_t>(sizeof(uint32_t))));
  p.partial_o = ws == nullptr
                    ? nullptr
                    : reinterpret_cast<float*>(
                          reinterpret_cast<char*>(p.partial_ml) +
                          RoundUp256(row_heads * chunks * static_cast<int64_t>(sizeof(float2))));
  p.error_flags = args.error_flags;
  p.seq_slots = args.seq_slots;
  p.rows_per_seq = args.seq_slots == nullptr ? 1 : args.rows_per_seq;
  p.slots = args.seq_slots == nullptr ? s.rows : args.slots;
  if (p.rows_per_seq < 1 || s.rows % p.rows_per_seq != 0) return cudaErrorInvalidValue;

  return DispatchFloat(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    const void* buffers[] = {args.q, args.k_cache, args.v_cache, args.out};
    bool aligned16 = true, aligned_pair = true;
    for (const void* b : buffers) {
      aligned16 = aligned16 && AlignedTo(b, 16);
      aligned_pair = aligned_pair && AlignedTo(b, 2 * static_cast<int>(sizeof(T)));
    }
    if (!aligned_pair) return cudaErrorInvalidValue;
    switch (aligned16 ? s.head_dim : 0) {
      case 32:
        return LaunchForTile<T, 32>(p, s.rows, tile, stream);
      case 64:
        return LaunchForTile<T, 64>(p, s.rows, tile, stream);
      case 128:
        return LaunchForTile<T, 128>(p, s.rows, tile, stream);
      case 256:
        return LaunchForTile<T, 256>(p, s.rows, tile, stream);
      default:
        return LaunchForTile<T, 0>(p, s.rows, tile, stream);
    }
  });
}

}  // namespace sg::kernels
