// Argmax and Sample over rows of logits.
//
// Argmax: a row is split over several blocks; each packs its best (value, index) into one
// 64-bit key (order-preserving bits of the value, then the complement of the index, so
// that the larger key is the larger value and, among equal values, the lower index) and
// atomicMax-es it into the row's slot; the last block to arrive, counted with an atomic,
// writes the id and resets the slot and the counter for the next launch.
//
// Sample: the CPU reference sorts the row, keeps the top_k, then the smallest prefix
// whose mass reaches top_p, and walks the kept tokens in index order. Here the same sets
// are found without sorting the row, by selection over several passes (the row stays in
// L2). Every element has a 64-bit candidate key `comb` (the order-preserving bits of
// z = logit / temperature, then the complement of the index): the CPU's order is
// descending comb, and both the top-k set and the top-p set are {comb >= cut} for some
// cut. A cut is found by `Select`: a histogram over 2048 bins by distance from the row's
// maximum picks the bin holding the wanted position of the cumulative count (top-k) or
// mass (top-p); bins too full are refined by histograms over key sub-ranges; the few
// candidates left are gathered into shared memory, sorted and scanned. The draw then
// scans the kept tokens in index order with block-wide prefix sums.
//
// Masses are integers: w = round(exp(z - max) · 2^32), summed exactly in 64 bits, so a
// sample is deterministic (no float atomics, no dependence on the launch shape) and equal
// to the CPU's except where float rounding on the CPU moves a boundary.
//
// Rows of kClusterMinVocab logits or more are shared by a cluster of kCluster blocks
// (thread block clusters, sm_90): each block takes a contiguous slice of the row, and the
// blocks exchange reductions, histograms and candidates through distributed shared memory,
// taking every decision redundantly from identical data.
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/common.cuh"
#include "kernels/sampling.cuh"
#include "stepgraph/base/error_flags.h"
#include "stepgraph/base/philox.h"

namespace sg::kernels {
namespace {

namespace cg = cooperative_groups;
using u64 = unsigned long long;

struct MaxOp {
  template <typename V>
  __device__ __forceinline__ V operator()(const V& a, const V& b) const {
    return a > b ? a : b;
  }
};
struct MinOp {
  template <typename V>
  __device__ __forceinline__ V operator()(const V& a, const V& b) const {
    return a < b ? a : b;
  }
};

// Order-preserving bits of a non-NaN float: a < b exactly when OrderedKey(a) < OrderedKey(b)
// (with -0 and +0 made equal by the callers).
__device__ __forceinline__ uint32_t OrderedKey(float z) {
  const uint32_t b = __float_as_uint(z);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float FromOrderedKey(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
// Larger for a larger key, then for a lower index.
__device__ __forceinline__ u64 Comb(uint32_t key, int j) {
  return (static_cast<u64>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(j));
}
__device__ __forceinline__ int CombIndex(u64 c) {
  return static_cast<int>(0xffffffffu - static_cast<uint32_t>(c));
}
__device__ __forceinline__ uint32_t CombKey(u64 c) { return static_cast<uint32_t>(c >> 32); }

// ---------------------------------------------------------------------------------------
// Argmax

constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxMinPerBlock = 4096;

template <typename T, int kVec>
__global__ void __launch_bounds__(kArgmaxThreads)
    ArgmaxKernel(const T* __restrict__ x, int64_t vocab, int blocks_per_row, u64* best,
                 uint32_t* arrivals, int32_t* ids, uint32_t* error_flags) {
  AwaitPrerequisiteGrids();
  using Reduce = cub::BlockReduce<u64, kArgmaxThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  constexpr int kU = 4;
  const int64_t row = blockIdx.y;
  const int64_t nvec = vocab / kVec;
  const int64_t vbeg = nvec * blockIdx.x / blocks_per_row;
  const int64_t vend = nvec * (blockIdx.x + 1) / blocks_per_row;
  const T* xr = x + row * vocab;

  u64 key = 0;  // 0: nothing seen (every real key is larger)
  bool nonfinite = false;
  for (int64_t v0 = vbeg + threadIdx.x; v0 < vend; v0 += kArgmaxThreads * kU) {
    float f[kU][kVec];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t v = v0 + u * kArgmaxThreads;
      if (v < vend) LoadFloats<T, kVec>(xr + v * kVec, f[u]);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t v = v0 + u * kArgmaxThreads;
      if (v >= vend) continue;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        float z = f[u][e];
        nonfinite |= !(z < INFINITY);    // NaN or +inf; -inf is an id masked out
        if (!(z > -INFINITY)) continue;  // NaN and -inf never win
        if (z == 0.0f) z = 0.0f;         // -0 ties with +0, as on the CPU
        key = MaxOp()(key, Comb(OrderedKey(z), static_cast<int>(v * kVec + e)));
      }
    }
  }
  // Rare (a broken model), so one atomic per thread that saw one costs nothing otherwise.
  if (nonfinite && error_flags != nullptr) {
    atomicOr(error_flags, static_cast<uint32_t>(kErrorNonFiniteLogits));
  }
  key = Reduce(tmp).Reduce(key, MaxOp());
  if (threadIdx.x != 0) return;
  if (blocks_per_row == 1) {
    ids[row] = key == 0 ? 0 : CombIndex(key);
    return;
  }
  atomicMax(&best[row], key);
  __threadfence();
  if (atomicAdd(&arrivals[row], 1u) == static_cast<uint32_t>(blocks_per_row - 1)) {
    const u64 final_key = atomicExch(&best[row], 0ull);
    arrivals[row] = 0u;
    ids[row] = final_key == 0 ? 0 : CombIndex(final_key);
  }
}

// ---------------------------------------------------------------------------------------
// Sample

constexpr int kBins = 2048;        // histogram bins per selection level
constexpr int kCandidates = 2048;  // candidates gathered, sorted and scanned at the end
constexpr int kXchgSlots = 4;      // exchange slots, reused round robin (see Publish)
constexpr int kCluster = 8;
constexpr int kClusterThreads = 512;
constexpr int kSingleThreads = 256;
constexpr int64_t kClusterMinVocab = 16384;
constexpr float kMassScale = 4294967296.0f;  // 2^32

// Block-group primitives: a cluster of kGroup blocks, or one block.
template <int kGroup>
struct Group {
  __device__ static int Rank() {
    if constexpr (kGroup == 1) {
      return 0;
    } else {
      return static_cast<int>(cg::this_cluster().block_rank());
    }
  }
  // Every thread of every block of the group; orders shared-memory writes before it with
  // reads (local or remote) after it.
  __device__ static void Sync() {
    if constexpr (kGroup == 1) {
      __syncthreads();
    } else {
      cg::this_cluster().sync();
    }
  }
  template <typename V>
  __device__ static V* Peer(V* local, int rank) {
    if constexpr (kGroup == 1) {
      return local;
    } else {
      return cg::this_cluster().map_shared_rank(local, rank);
    }
  }
};

// A cut: the kept set is {comb >= comb_cut}, with its count and exact mass.
struct Cut {
  u64 comb;
  u64 count;
  u64 mass;
};

// The bin holding a position of a cumulative metric, and what lies above it.
struct Crossing {
  int bin;
  u64 above_count, above_mass;
  u64 count, mass;
};

template <typename T, int kVec, int kThreads, int kGroup>
class RowSampler {
 public:
  using G = Group<kGroup>;
  using Scan = cub::BlockScan<u64, kThreads>;
  using ReduceU64 = cub::BlockReduce<u64, kThreads>;
  using ReduceF = cub::BlockReduce<float, kThreads>;
  static constexpr int kBinsPerThread = kBins / kThreads;
  static constexpr int kCandPerThread = kCandidates / kThreads;
  static_assert(kBins % kThreads == 0 && kCandidates % kThreads == 0);

  struct Smem {
    union {
      typename Scan::TempStorage scan;
      typename ReduceU64::TempStorage reduce_u64;
      typename ReduceF::TempStorage reduce_f;
    } cub;
    union {
      struct {
        uint32_t count[kBins];
        uint32_t mass_lo[kBins];
        uint32_t mass_hi[kBins];
      } hist;
      u64 cand[kCandidates];  // this block's candidates
    } local;
    u64 all[kCandidates];  // the whole group's candidates
    u64 xchg[kXchgSlots][2];
    uint32_t num_local;
    int found;
    u64 bcast[4];
  };

  __device__ RowSampler(Smem& sm, const T* row, int vocab, float temperature)
      : sm_(sm), row_(row), vocab_(vocab), temperature_(temperature) {
    rank_ = G::Rank();
    const int nvec = vocab / kVec;
    vbeg_ = static_cast<int>(static_cast<int64_t>(nvec) * rank_ / kGroup);
    vend_ = static_cast<int>(static_cast<int64_t>(nvec) * (rank_ + 1) / kGroup);
  }

  __device__ int rank() const { return rank_; }
  __device__ bool nonfinite() const { return nonfinite_; }

  // The whole algorithm; every block of the group returns the same id.
  __device__ int Run(int32_t top_k, float top_p, int32_t seed, int32_t pos) {
    // Pass A: the maximum (and the lowest index holding it) and the smallest finite z.
    u64 best = 0;
    float zmin = INFINITY;
    ForEach([&](int j, float z) {
      best = MaxOp()(best, Comb(OrderedKey(z), j));
      if (z > -INFINITY) zmin = fminf(zmin, z);
    });
    best = ReduceU64(sm_.cub.reduce_u64).Reduce(best, MaxOp());
    __syncthreads();
    zmin = ReduceF(sm_.cub.reduce_f).Reduce(zmin, MinOp());
    Publish(best, __float_as_uint(zmin));  // thread 0 holds the block's values
    best = 0;
    zmin = INFINITY;
#pragma unroll 1
    for (int r = 0; r < kGroup; ++r) {
      best = MaxOp()(best, PeerValue(r, 0));
      zmin = fminf(zmin, __uint_as_float(static_cast<uint32_t>(PeerValue(r, 1))));
    }
    const int argmax = CombIndex(best);
    mx_ = FromOrderedKey(CombKey(best));
    // All -inf (or NaN), an infinite maximum, or greedy: the top token, as Argmax.
    if (!(mx_ > -INFINITY && mx_ < INFINITY) || top_k == 1) return argmax;
    const float range = mx_ - zmin;
    bin_scale_ = range > 0.0f ? fminf(static_cast<float>(kBins) / range, 1e30f) : 0.0f;

    // Top-k: the k-th candidate in descending comb order is the cut.
    u64 cut = 0;  // everything
    u64 total = 0;
    bool total_known = false;
    if (top_k > 0 && top_k < vocab_) {
      BuildLevel1(0);
      const Cut c = Select(/*by_mass=*/false, static_cast<u64>(top_k) - 1, 0);
      cut = c.comb;
      total = c.mass;
      total_known = true;
    }
    // Top-p: the candidate holding mass position ceil(top_p · total) - 1 is the cut.
    if (top_p < 1.0f) {
      const u64 level1_total = BuildLevel1(cut);
      if (!total_known) total = level1_total;
      u64 want = static_cast<u64>(ceil(static_cast<double>(top_p) * static_cast<double>(total)));
      want = want < 1 ? 1 : (want > total ? total : want);
      const Cut c = Select(/*by_mass=*/true, want - 1, cut);
      cut = c.comb;
      total = c.mass;
    } else if (!total_known) {
      u64 local = 0;
      ForEach([&](int, float z) { local += Mass(z); });
      total = GroupSum(local);
    }

    // The draw: the first kept token in index order whose running mass exceeds u · total.
    const uint32_t u24 = static_cast<uint32_t>(SampleUniform(seed, pos) * 16777216.0f);
    const u64 lo = static_cast<u64>(u24) * total;
    const u64 hi = __umul64hi(static_cast<u64>(u24), total);
    const u64 target = (hi << 40) | (lo >> 24);  // floor(u24 · total / 2^24) < total
    const int j = FindInRow(target, [&](int j, float z) -> u64 {
      return Comb(OrderedKey(z), j) >= cut ? Mass(z) : 0;
    });
    return j >= 0 ? j : argmax;
  }

 private:
  // f(j, z) for every element of this block's slice, kU 16-byte loads in flight per
  // thread (one with 512 threads, where registers are capped at 128).
  template <typename F>
  __device__ __forceinline__ void ForEach(F&& f) {
    constexpr int kU = kThreads >= 512 ? 1 : 2;
    for (int v0 = vbeg_ + static_cast<int>(threadIdx.x); v0 < vend_; v0 += kThreads * kU) {
      float x[kU][kVec];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int v = v0 + u * kThreads;
        if (v < vend_) LoadFloats<T, kVec>(row_ + static_cast<int64_t>(v) * kVec, x[u]);
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int v = v0 + u * kThreads;
        if (v >= vend_) continue;
#pragma unroll
        for (int e = 0; e < kVec; ++e) f(v * kVec + e, Z(x[u][e]));
      }
    }
  }

  // logit / temperature as the CPU divides it; NaN counts as -inf, -0 as +0. A logit
  // that is not finite is remembered for the error flag.
  __device__ __forceinline__ float Z(float x) const {
    float z = x / temperature_;
    // NaN or +inf (a finite x whose z overflows too: the draw would be NaN); -inf is an
    // id masked out, which is never drawn.
    nonfinite_ |= !(z < INFINITY);
    if (z != z) z = -INFINITY;
    if (z == 0.0f) z = 0.0f;
    return z;
  }

  __device__ __forceinline__ u64 Mass(float z) const {
    if (z == -INFINITY) return 0;
    return __float2ull_rn(expf(z - mx_) * kMassScale);
  }

  // Level-1 bins: distance from the maximum, kBins over the row's finite range. Monotone
  // (a larger z never gets a larger bin), so bins hold contiguous runs of the order.
  __device__ __forceinline__ int Bin1(float z) const {
    if (z == -INFINITY) return kBins - 1;
    const float f = (mx_ - z) * bin_scale_;
    return f >= static_cast<float>(kBins - 1) ? kBins - 1 : static_cast<int>(f);
  }

  // Publishes two values of this block to the group (thread 0's values count) and syncs.
  // Slots are reused round robin: every peer reads a slot right after the Publish that
  // filled it and before it reaches the next group sync, so a slot is free again once a
  // later Publish has synced.
  __device__ void Publish(u64 a, u64 b) {
    slot_ = (slot_ + 1) % kXchgSlots;
    if (threadIdx.x == 0) {
      sm_.xchg[slot_][0] = a;
      sm_.xchg[slot_][1] = b;
    }
    G::Sync();
  }
  __device__ u64 PeerValue(int r, int k) { return *G::Peer(&sm_.xchg[slot_][k], r); }

  __device__ u64 GroupSum(u64 local) {
    local = ReduceU64(sm_.cub.reduce_u64).Sum(local);
    Publish(local, 0);
    u64 sum = 0;
#pragma unroll 1
    for (int r = 0; r < kGroup; ++r) sum += PeerValue(r, 0);
    return sum;
  }

  __device__ void ClearHist() {
    for (int i = threadIdx.x; i < kBins; i += kThreads) {
      sm_.local.hist.count[i] = 0;
      sm_.local.hist.mass_lo[i] = 0;
      sm_.local.hist.mass_hi[i] = 0;
    }
    __syncthreads();
  }

  // Exact 64-bit mass with 32-bit shared atomics (64-bit ones are a CAS loop).
  __device__ __forceinline__ void AddToHist(int bin, u64 w) {
    atomicAdd(&sm_.local.hist.count[bin], 1u);
    const uint32_t w_lo = static_cast<uint32_t>(w);
    uint32_t w_hi = static_cast<uint32_t>(w >> 32);
    if (w_lo != 0) {
      const uint32_t old = atomicAdd(&sm_.local.hist.mass_lo[bin], w_lo);
      if (old + w_lo < old) ++w_hi;  // carry
    }
    if (w_hi != 0) atomicAdd(&sm_.local.hist.mass_hi[bin], w_hi);
  }

  // Level-1 histogram of {comb >= cut}; returns the group's total mass of that set.
  __device__ u64 BuildLevel1(u64 cut) {
    ClearHist();
    u64 local = 0;
    ForEach([&](int j, float z) {
      if (Comb(OrderedKey(z), j) < cut) return;
      const u64 w = Mass(z);
      local += w;
      AddToHist(Bin1(z), w);
    });
    __syncthreads();
    return GroupSum(local);  // its group sync also completes every block's histogram
  }

  // The bin of the group's histogram holding position `t` (0-based) of the cumulative
  // count or mass, bins taken in order (bin 0 holds the largest values). The histograms
  // must be complete in every block (a group sync since they were built).
  __device__ Crossing FindCrossing(bool by_mass, u64 t) {
    u64 cnt[kBinsPerThread], mass[kBinsPerThread];
    u64 sum_c = 0, sum_m = 0;
#pragma unroll
    for (int i = 0; i < kBinsPerThread; ++i) {
      const int b = threadIdx.x * kBinsPerThread + i;
      cnt[i] = 0;
      mass[i] = 0;
#pragma unroll 1
      for (int r = 0; r < kGroup; ++r) {
        cnt[i] += *G::Peer(&sm_.local.hist.count[b], r);
        mass[i] += (static_cast<u64>(*G::Peer(&sm_.local.hist.mass_hi[b], r)) << 32) +
                   *G::Peer(&sm_.local.hist.mass_lo[b], r);
      }
      sum_c += cnt[i];
      sum_m += mass[i];
    }
    if (threadIdx.x == 0) sm_.found = -1;
    u64 before_c, before_m;
    Scan(sm_.cub.scan).ExclusiveSum(sum_c, before_c);
    __syncthreads();
    Scan(sm_.cub.scan).ExclusiveSum(sum_m, before_m);
#pragma unroll
    for (int i = 0; i < kBinsPerThread; ++i) {
      const u64 before = by_mass ? before_m : before_c;
      const u64 m = by_mass ? mass[i] : cnt[i];
      if (m != 0 && before <= t && t < before + m) {
        sm_.found = threadIdx.x * kBinsPerThread + i;
        sm_.bcast[0] = before_c;
        sm_.bcast[1] = before_m;
        sm_.bcast[2] = cnt[i];
        sm_.bcast[3] = mass[i];
      }
      before_c += cnt[i];
      before_m += mass[i];
    }
    __syncthreads();
    Crossing c;
    c.bin = sm_.found;
    c.above_count = sm_.bcast[0];
    c.above_mass = sm_.bcast[1];
    c.count = sm_.bcast[2];
    c.mass = sm_.bcast[3];
    if (c.bin < 0) c = Crossing{kBins - 1, 0, 0, 0, 0};  // unreachable for t below the total
    G::Sync();  // every block is done reading the others' histograms
    return c;
  }

  // The cut of {comb >= in_cut} at position t (0-based) of its cumulative count or mass
  // in descending comb order, given the level-1 histogram of that set.
  __device__ Cut Select(bool by_mass, u64 t, u64 in_cut) {
    Crossing c = FindCrossing(by_mass, t);
    u64 above_c = c.above_count, above_m = c.above_mass, count = c.count;
    int bin1 = c.bin;                   // candidates: level-1 bin bin1 ...
    uint32_t lo = 0, hi = 0xffffffffu;  // ... and keys in [lo, hi]
    auto candidate = [&](int j, float z, uint32_t key) {
      return Comb(key, j) >= in_cut && (bin1 < 0 || Bin1(z) == bin1) && key >= lo && key <= hi;
    };

    // Refine while the candidates do not fit in shared memory: each level narrows the key
    // range by up to kBins, so three levels reach single keys (the bound is a backstop).
    for (int level = 0; count > static_cast<u64>(kCandidates) && level < 8; ++level) {
      u64 kmax = 0, kneg = 0;  // max key and max of ~key
      ForEach([&](int j, float z) {
        const uint32_t key = OrderedKey(z);
        if (!candidate(j, z, key)) return;
        kmax = MaxOp()(kmax, static_cast<u64>(key));
        kneg = MaxOp()(kneg, static_cast<u64>(~key));
      });
      kmax = ReduceU64(sm_.cub.reduce_u64).Reduce(kmax, MaxOp());
      __syncthreads();
      kneg = ReduceU64(sm_.cub.reduce_u64).Reduce(kneg, MaxOp());
      Publish(kmax, kneg);
      kmax = 0;
      kneg = 0;
#pragma unroll 1
      for (int r = 0; r < kGroup; ++r) {
        kmax = MaxOp()(kmax, PeerValue(r, 0));
        kneg = MaxOp()(kneg, PeerValue(r, 1));
      }
      const uint32_t key_max = static_cast<uint32_t>(kmax);
      const uint32_t key_min = ~static_cast<uint32_t>(kneg);
      bin1 = -1;
      lo = key_min;
      hi = key_max;
      if (key_min == key_max) break;  // all tied

      // Sub-bins: uniform key sub-ranges of [key_min, key_max], largest keys first.
      const u64 span = static_cast<u64>(key_max) - key_min + 1;
      ClearHist();
      ForEach([&](int j, float z) {
        const uint32_t key = OrderedKey(z);
        if (!candidate(j, z, key)) return;
        AddToHist(static_cast<int>((static_cast<u64>(key_max - key) * kBins) / span), Mass(z));
      });
      G::Sync();
      const Crossing s = FindCrossing(by_mass, t - (by_mass ? above_m : above_c));
      above_c += s.above_count;
      above_m += s.above_mass;
      count = s.count;
      // Keys of sub-bin b: key_max - off for off in [ceil(b·span/B), ceil((b+1)·span/B) - 1].
      const u64 off_lo = (static_cast<u64>(s.bin) * span + kBins - 1) / kBins;
      const u64 off_hi = ((static_cast<u64>(s.bin) + 1) * span + kBins - 1) / kBins - 1;
      hi = key_max - static_cast<uint32_t>(off_lo);
      lo = key_max - static_cast<uint32_t>(off_hi);
    }

    if (count <= static_cast<u64>(kCandidates)) return SelectAmongCandidates(by_mass, t, above_c, above_m, candidate);

    // More than kCandidates candidates, all with one key (hence one mass): the cut is the
    // r-th of them in index order.
    const float z_tied = FromOrderedKey(lo);
    const u64 w_tied = Mass(z_tied);
    u64 r = by_mass ? (w_tied == 0 ? 0 : (t - above_m) / w_tied) : t - above_c;
    if (r > count - 1) r = count - 1;
    const int j = FindInRow(r, [&](int j, float z) -> u64 {
      return candidate(j, z, OrderedKey(z)) ? 1 : 0;
    });
    Cut cut;
    cut.comb = Comb(lo, j < 0 ? 0 : j);
    cut.count = above_c + r + 1;
    cut.mass = above_m + (r + 1) * w_tied;
    return cut;
  }

  // Gathers every block's candidates, sorts them by descending comb and finds the one
  // holding position t.
  template <typename Pred>
  __device__ Cut SelectAmongCandidates(bool by_mass, u64 t, u64 above_c, u64 above_m,
                                       Pred&& candidate) {
    if (threadIdx.x == 0) sm_.num_local = 0;
    __syncthreads();
    ForEach([&](int j, float z) {
      const uint32_t key = OrderedKey(z);
      if (!candidate(j, z, key)) return;
      const uint32_t slot = atomicAdd(&sm_.num_local, 1u);
      if (slot < kCandidates) sm_.local.cand[slot] = Comb(key, j);
    });
    __syncthreads();
    Publish(sm_.num_local, 0);
    int n = 0;
#pragma unroll 1
    for (int r = 0; r < kGroup; ++r) {
      const int nr = static_cast<int>(MinOp()(PeerValue(r, 0), static_cast<u64>(kCandidates - n)));
      const u64* src = G::Peer(sm_.local.cand, r);
      for (int i = threadIdx.x; i < nr; i += kThreads) sm_.all[n + i] = src[i];
      n += nr;
    }
    G::Sync();  // every block is done reading the others' candidates

    // Bitonic sort, descending, over the next power of two (padding sorts last).
    int size = 1;
    while (size < n) size *= 2;
    for (int i = n + threadIdx.x; i < size; i += kThreads) sm_.all[i] = 0;
    __syncthreads();
    for (int k = 2; k <= size; k *= 2) {
      for (int s = k / 2; s > 0; s /= 2) {
        for (int i = threadIdx.x; i < size; i += kThreads) {
          const int partner = i ^ s;
          if (partner > i) {
            const u64 a = sm_.all[i], b = sm_.all[partner];
            const bool descending = (i & k) == 0;
            if ((a < b) == descending) {
              sm_.all[i] = b;
              sm_.all[partner] = a;
            }
          }
        }
        __syncthreads();
      }
    }

    // Scan count and mass in sorted order; the candidate holding position t is the cut.
    u64 mass[kCandPerThread];
    u64 sum_c = 0, sum_m = 0;
#pragma unroll
    for (int i = 0; i < kCandPerThread; ++i) {
      const int at = threadIdx.x * kCandPerThread + i;
      mass[i] = at < n ? Mass(FromOrderedKey(CombKey(sm_.all[at]))) : 0;
      sum_c += at < n ? 1 : 0;
      sum_m += mass[i];
    }
    if (threadIdx.x == 0) sm_.found = -1;
    u64 before_c, before_m;
    Scan(sm_.cub.scan).ExclusiveSum(sum_c, before_c);
    __syncthreads();
    Scan(sm_.cub.scan).ExclusiveSum(sum_m, before_m);
    before_c += above_c;
    before_m += above_m;
#pragma unroll
    for (int i = 0; i < kCandPerThread; ++i) {
      const int at = threadIdx.x * kCandPerThread + i;
      if (at >= n) break;
      const u64 before = by_mass ? before_m : before_c;
      const u64 m = by_mass ? mass[i] : 1;
      if (m != 0 && before <= t && t < before + m) {
        sm_.found = at;
        sm_.bcast[0] = before_c + 1;
        sm_.bcast[1] = before_m + mass[i];
      }
      before_c += 1;
      before_m += mass[i];
    }
    __syncthreads();
    Cut cut;
    if (sm_.found >= 0) {
      cut.comb = sm_.all[sm_.found];
      cut.count = sm_.bcast[0];
      cut.mass = sm_.bcast[1];
    } else {  // unreachable for t below the total: keep every candidate
      cut.comb = n > 0 ? sm_.all[n - 1] : 0;
      cut.count = above_c + n;
      cut.mass = above_m + sum_m;
    }
    __syncthreads();
    return cut;
  }

  // The first element of the row, in index order, whose running metric exceeds t (the
  // element holding position t); -1 when the row's total is not above t. Same result in
  // every block of the group.
  template <typename Metric>
  __device__ int FindInRow(u64 t, Metric&& metric) {
    u64 prefix = 0;
    bool mine = true;
    if constexpr (kGroup > 1) {
      u64 local = 0;
      ForEach([&](int j, float z) { local += metric(j, z); });
      local = ReduceU64(sm_.cub.reduce_u64).Sum(local);
      Publish(local, 0);
#pragma unroll 1
      for (int r = 0; r < rank_; ++r) prefix += PeerValue(r, 0);
      mine = prefix <= t && t < prefix + PeerValue(rank_, 0);
    }
    int j = -1;
    if (mine) j = FindInSlice(t - prefix, metric);
    if constexpr (kGroup > 1) {
      Publish(static_cast<u64>(j + 1), 0);
      j = -1;
#pragma unroll 1
      for (int r = 0; r < kGroup; ++r) {
        const int jr = static_cast<int>(PeerValue(r, 0)) - 1;
        if (jr >= 0) j = jr;
      }
    }
    return j;
  }

  // FindInRow within this block's slice: tiles of kThreads vectors in index order, a
  // block-wide exclusive scan per tile, stopping at the tile that holds position t.
  template <typename Metric>
  __device__ int FindInSlice(u64 t, Metric&& metric) {
    if (threadIdx.x == 0) sm_.found = -1;
    __syncthreads();
    u64 running = 0;
    for (int tile = vbeg_; tile < vend_; tile += kThreads) {
      const int v = tile + static_cast<int>(threadIdx.x);
      u64 m[kVec];
      u64 local = 0;
      if (v < vend_) {
        float x[kVec];
        LoadFloats<T, kVec>(row_ + static_cast<int64_t>(v) * kVec, x);
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          m[e] = metric(v * kVec + e, Z(x[e]));
          local += m[e];
        }
      }
      u64 before, tile_total;
      Scan(sm_.cub.scan).ExclusiveSum(local, before, tile_total);
      before += running;
      if (local != 0 && before <= t && t < before + local) {
        u64 cum = before;
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          cum += m[e];
          if (cum > t) {
            sm_.found = v * kVec + e;
            break;
          }
        }
      }
      running += tile_total;
      __syncthreads();
      if (sm_.found >= 0) break;
    }
    const int j = sm_.found;
    __syncthreads();
    return j;
  }

  Smem& sm_;
  const T* row_;
  int vocab_;
  float temperature_;
  int rank_ = 0;
  int vbeg_ = 0, vend_ = 0;  // this block's slice, in vectors
  int slot_ = 0;
  float mx_ = 0.0f;
  float bin_scale_ = 0.0f;
  mutable bool nonfinite_ = false;
};

// Sampling below this temperature is greedy: 1 / T would overflow float (the CPU
// reference's and c_session.h's STEPGRAPH_SESSION_MIN_TEMPERATURE are the same).
constexpr float kGreedyTemperature = 1e-5f;

struct SampleArgs {
  const void* logits;
  int vocab;
  const int32_t* seeds;
  const int32_t* pos;
  SampleParams params;
  int32_t* ids;
  uint32_t* error_flags;
};

template <typename T, int kVec, int kThreads, int kGroup>
__device__ __forceinline__ void SampleRow(const SampleArgs& a) {
  using Sampler = RowSampler<T, kVec, kThreads, kGroup>;
  __shared__ typename Sampler::Smem sm;
  const int64_t row = blockIdx.x / kGroup;
  // Below kGreedyTemperature the draw is the argmax, as on the CPU (cpu_dispatch.cc).
  const bool greedy = a.params.temperature < kGreedyTemperature;
  Sampler sampler(sm, static_cast<const T*>(a.logits) + row * a.vocab, a.vocab,
                  greedy ? 1.0f : a.params.temperature);
  const int id = sampler.Run(greedy ? 1 : a.params.top_k, a.params.top_p, a.seeds[row],
                             a.pos[row]);
  if (sampler.rank() == 0 && threadIdx.x == 0) a.ids[row] = id;
  // Run's first pass reads every logit of the block's slice, whatever it returns early.
  if (sampler.nonfinite() && a.error_flags != nullptr) {
    atomicOr(a.error_flags, static_cast<uint32_t>(kErrorNonFiniteLogits));
  }
  Group<kGroup>::Sync();  // no block leaves while a peer may still read its shared memory
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kSingleThreads) SampleKernel(const SampleArgs a) {
  AwaitPrerequisiteGrids();
  SampleRow<T, kVec, kSingleThreads, 1>(a);
}

template <typename T, int kVec>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kClusterThreads)
    SampleClusterKernel(const SampleArgs a) {
  AwaitPrerequisiteGrids();
  SampleRow<T, kVec, kClusterThreads, kCluster>(a);
}

bool Vectorizable(const void* p, int64_t row_elems, int64_t elem_bytes) {
  return Aligned16(p) && (row_elems * elem_bytes) % 16 == 0;
}

}  // namespace

int ArgmaxBlocksPerRow(int64_t rows, int64_t vocab, int sm_count, int max_blocks_per_row) {
  int64_t blocks = CeilDiv(vocab, kArgmaxMinPerBlock);
  blocks = std::min<int64_t>(blocks, std::max<int64_t>(1, 2 * static_cast<int64_t>(sm_count) / std::max<int64_t>(rows, 1)));
  if (max_blocks_per_row > 0) blocks = std::min<int64_t>(blocks, max_blocks_per_row);
  return static_cast<int>(std::clamp<int64_t>(blocks, 1, 1024));
}

int64_t ArgmaxWorkspaceBytes(int64_t rows) {
  return rows * static_cast<int64_t>(sizeof(u64) + sizeof(uint32_t));
}

cudaError_t LaunchArgmax(const void* x, DType dtype, int64_t rows, int64_t vocab,
                         int blocks_per_row, void* workspace, int32_t* ids,
                         Stream stream, uint32_t* error_flags) {
  if (rows <= 0 || vocab <= 0 || vocab > INT32_MAX || rows > 65535) return cudaErrorInvalidValue;
  if (blocks_per_row < 1 || blocks_per_row > 1024) return cudaErrorInvalidValue;
  if (blocks_per_row > 1 && workspace == nullptr) return cudaErrorInvalidValue;
  u64* best = static_cast<u64*>(workspace);
  uint32_t* arrivals = best == nullptr ? nullptr : reinterpret_cast<uint32_t*>(best + rows);
  return DispatchFloat(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    return DispatchVecWidth<T>(Vectorizable(x, vocab, sizeof(T)), [&](auto width) -> cudaError_t {
      constexpr int kVec = decltype(width)::value;
      const dim3 grid(blocks_per_row, static_cast<unsigned>(rows));
      return LaunchKernel(ArgmaxKernel<T, kVec>, grid, dim3(kArgmaxThreads), stream,
                          static_cast<const T*>(x), vocab, blocks_per_row, best, arrivals, ids,
                          error_flags);
    });
  });
}

cudaError_t LaunchSample(const void* logits, DType dtype, int64_t rows, int64_t vocab,
                         const int32_t* seeds, const int32_t* pos, const SampleParams& params,
                         int32_t* ids, Stream stream, uint32_t* error_flags) {
  if (rows <= 0 || vocab <= 0 || vocab > INT32_MAX) return cudaErrorInvalidValue;
  if (!(params.temperature > 0.0f) || params.top_k < 0 ||
      !(params.top_p > 0.0f && params.top_p <= 1.0f)) {
    return cudaErrorInvalidValue;
  }
  const bool cluster = vocab >= kClusterMinVocab;
  if (rows * (cluster ? kCluster : 1) > INT32_MAX) return cudaErrorInvalidValue;
  SampleArgs a{logits, static_cast<int>(vocab), seeds, pos, params, ids, error_flags};
  return DispatchFloat(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    return DispatchVecWidth<T>(Vectorizable(logits, vocab, sizeof(T)), [&](auto width) -> cudaError_t {
      constexpr int kVec = decltype(width)::value;
      if (cluster) {
        return LaunchKernel(SampleClusterKernel<T, kVec>,
                            dim3(static_cast<unsigned>(rows * kCluster)), dim3(kClusterThreads),
                            stream, a);
      }
      return LaunchKernel(SampleKernel<T, kVec>, dim3(static_cast<unsigned>(rows)),
                          dim3(kSingleThreads), stream, a);
    });
  });
}

}  // namespace sg::kernels
