// The quantized matmul at decode: y = x·wᵀ with w in a GGUF block format, held in the
// device layout of kernels/quant_blocks.cuh. A thread block of four warps computes kCols
// output columns (rows of w) for a group of up to kRows rows of x. Its lanes split K four
// to a unit of 32 values: lane l takes values 8·(l % 4) .. +7 of unit l / 4 of each step,
// so a warp step covers 8 consecutive units (256 values) and the four warps cover the next
// ones. Each lane loads its unit of every one of the block's columns (one or two 16-byte
// loads; the four lanes of a unit ask for the same bytes, which the load coalesces), and
// its 8 activations of every row once, with contiguous loads across the warp, then meets
// them with its part of every column: an activation is read once per kCols columns, not
// once per column, and every load of x and w moves whole cache lines. (One row of a K
// format takes whole units per lane instead: PartsFor says why.) The weights are read
// factored (quant_blocks.cuh's Codes8, Scale, Min): the codes as exact floats meet x in
// one FMA each and every 8 values' sum is scaled once, about a third fewer instructions
// per weight (the kernel is bound by them, not by memory, at one row); f32 accumulation, a
// warp-shuffle and shared-memory reduction per (row, column), bias added in f32, one
// rounding to the output dtype.
#include <algorithm>
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/moe_units.cuh"
#include "kernels/quant_blocks.cuh"
#include "kernels/quant_matmul.cuh"
#include "stepgraph/base/error_flags.h"

namespace sg::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;

// Lanes per unit: 4, each taking 8 of its 32 values; or 1, a lane taking whole units, for
// one row of a K format (Q4_K, Q5_K, Q6_K), whose unit loads decode a block head, work
// that four lanes would each repeat. Measured on an H100 (the lm head of the 1B shape,
// f32 activations): Q4_0 119 us against 308 for the kernel of one column per block
// before this one; Q6_K 364 us either way, against 320 before, so its unit loads, not
// the activations, bound it (docs/gguf.md).
template <typename Q, int kRows>
constexpr int PartsFor() {
  return kRows == 1 && Q::kUnits > 1 ? 1 : quant::kUnitElems / 8;
}

// Columns per block: 8 for 2 and 4 rows, while a lane's accumulators and its columns'
// units fit in registers beside the activations; 4 for 8 rows, and for one row, where the
// kernel mostly runs the lm head and 4 columns took fewer registers (Q6_K 80 against 128)
// and less time for every format measured (H200, f32 activations, 128,256 x 2048: Q4_K
// 158 against 209 us, Q5_K 189 against 267, Q6_K 134 against 141, Q4_0 and Q8_0 within 2%).
template <int kRows>
constexpr int ColsFor() {
  return kRows == 1 || kRows >= 8 ? 4 : 8;
}

template <typename T, typename Q, int kRows>
__global__ void __launch_bounds__(kThreads)
    QuantMatmulKernel(const T* __restrict__ x, const uint8_t* __restrict__ w,
                      const T* __restrict__ bias, T* __restrict__ y, int64_t m, int64_t n,
                      int64_t k, bool vec_x) {
  constexpr int kCols = ColsFor<kRows>();
  constexpr int kAcc = kRows * kCols;
  constexpr int kParts = PartsFor<Q, kRows>();
  constexpr int kUnitsPerWarp = kWarpSize / kParts;
  __shared__ float partial[kWarps][kAcc];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int part = lane % kParts;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kCols;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kRows;
  const int rows = static_cast<int>(std::min<int64_t>(kRows, m - row0));
  const int64_t units = k / quant::kUnitElems;
  const int64_t blocks = n * (k / Q::kElems);
  // A column past n reads the last column again and is discarded.
  int64_t first[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) first[c] = std::min<int64_t>(col0 + c, n - 1) * units;
  const T* xg = x + row0 * k;
  AwaitPrerequisiteGrids();

  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;

  for (int64_t u = static_cast<int64_t>(warp) * kUnitsPerWarp + lane / kParts; u < units;
       u += kWarps * kUnitsPerWarp) {
    typename Q::Unit wu[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) wu[c] = Q::Load(w, blocks, first[c] + u);
    // A lane's 8 values of the unit (four lanes a unit), or all four groups of 8.
#pragma unroll
    for (int jj = 0; jj < quant::kUnitElems / 8 / kParts; ++jj) {
      const int j = kParts == 1 ? jj : part;
      const int64_t e0 = u * quant::kUnitElems + 8 * j;
      float xf[kRows][8];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r < rows) {
          quant::LoadX8(xg + r * k + e0, vec_x, xf[r]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) xf[r][e] = 0.0f;
        }
      }
      // Σ value·x over the 8 as Scale·Σ code·x (+ Min·Σ x): one FMA per value and row,
      // the codes decoded once for every row.
      float xsum[kRows];
      if constexpr (Q::Unit::kHasMin) quant::XSums8<kRows>(xf, xsum);
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        quant::AccumulateUnit8<kCols, kRows>(wu[c], j, xf, xsum, acc + c);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    const float s = WarpSum(acc[i]);
    if (lane == 0) partial[warp][i] = s;
  }
  __syncthreads();
  if (threadIdx.x < kAcc) {
    const int r = threadIdx.x / kCols, c = threadIdx.x % kCols;
    const int64_t col = col0 + c;
    if (r < rows && col < n) {
      float total = 0.0f;
#pragma unroll
      for (int i = 0; i < kWarps; ++i) total += partial[i][threadIdx.x];
      if (bias != nullptr) total += ToFloat(bias[col]);
      y[(row0 + r) * n + col] = FromFloat<T>(total);
    }
  }
}

// Kernels for 1, 2, 4 and 8 rows; other counts run the next larger one with the surplus
// rows skipped (a uniform branch), which keeps the number of instantiations down.
template <typename F>
cudaError_t DispatchGroupRows(int64_t m, F&& f) {
  if (m <= 1) return f(std::integral_constant<int, 1>{});
  if (m <= 2) return f(std::integral_constant<int, 2>{});
  if (m <= 4) return f(std::integral_constant<int, 4>{});
  return f(std::integral_constant<int, 8>{});
}
static_assert(kQuantMatmulGroupRows == 8, "DispatchGroupRows tops out at 8");

// ---- one row, many columns: persistent warps ---------------------------------------------
//
// QuantRowKernel: y[0, :] = x[0, :] · wᵀ for one row of x and an output too wide for one
// wave of column blocks (an lm head). Each warp takes whole columns (rows of w), one after
// another over a grid that just fills the GPU, and walks each in chunks of 64 units: lane
// l takes units l and 32 + l of the chunk (each load of the warp 32 consecutive units).
// While a lane multiplies one chunk it has already asked for the units of its next one,
// so every lane keeps a chunk of loads in flight through the whole walk, where a block
// that owns four columns waits for its loads once and is done. x is read once per block
// into shared memory as f32, each unit's eight 16-byte chunks stored in the order
// q ^ (unit & 7), so that the eight lanes of a quarter warp, reading chunk q of eight
// consecutive units, hit different banks. Sums as the other kernels (Codes8, Scale, Min:
// AccumulateUnit8), a warp reduction per column, one rounding to y's dtype (and, with a
// residual, its sum with the rounded product rounded again, as FusedMatMul's add).
constexpr int kRowWarps = 8;
constexpr int kRowThreads = kRowWarps * kWarpSize;
constexpr int kRowChunkUnits = 2 * kWarpSize;

// Row x's values 8j .. 8j+7 of unit t from the staged copy.
__device__ __forceinline__ void StagedX8(const float4* stage, int64_t t, int j, float (&out)[8]) {
  const float4* unit = stage + t * 8;
  const int swizzle = static_cast<int>(t & 7);
  const float4 lo = unit[(2 * j) ^ swizzle], hi = unit[(2 * j + 1) ^ swizzle];
  out[0] = lo.x, out[1] = lo.y, out[2] = lo.z, out[3] = lo.w;
  out[4] = hi.x, out[5] = hi.y, out[6] = hi.z, out[7] = hi.w;
}

// ---- x as integers (QuantRowX::kInt8, kInt16, kInt16x2) -----------------------------
//
// The staged copy holds each unit's 32 values quantized, kChunks 16-byte chunks a unit
// (int8: values 0..15, 16..31; int16: eight values a chunk; int16x2: the first part's four
// chunks, then the second's), chunk c of unit t stored at c ^ Swizzle(t) so that the eight
// lanes of a quarter warp, reading chunk c of eight consecutive units, hit different banks;
// then kParts float4s a unit: its scale dx, the exact f32 sum of its 32 values and the
// integer sums of its first part's halves (values 0..15 and 16..31, as int bits), which
// take the codes' bias out of the dot products; with two parts a second float4 holds the
// second part's sums.
template <QuantRowX kX>
struct IntStage {
  static constexpr int kParts = kX == QuantRowX::kInt16x2 ? 2 : 1;
  static constexpr int kChunks = kX == QuantRowX::kInt8 ? 2 : 4 * kParts;
  // The largest code, the scale being the unit's largest over it (int16x2 scales by a power
  // of two instead).
  static constexpr float Top() { return kX == QuantRowX::kInt8 ? 127.0f : 32767.0f; }
  static __device__ __forceinline__ int Swizzle(int64_t t) {
    return static_cast<int>((t / (8 / kChunks)) % kChunks);
  }
  // float4s of shared memory for `units` units.
  static constexpr int64_t Float4s(int64_t units) { return units * (kChunks + kParts); }
};

// Packs int16 values q[0..7] into four words, two values a word.
__device__ __forceinline__ uint4 PackInt16(const int (&q)[8]) {
  uint32_t word[4];
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    word[h] = (q[2 * h] & 0xFFFF) | static_cast<uint32_t>(q[2 * h + 1]) << 16;
  }
  return make_uint4(word[0], word[1], word[2], word[3]);
}

// The sum of q over the half (16 values, lanes j and j ^ 1 of a unit's four) in lane j,
// and in lane j = 0 also the other half's (from lane 2) in *other.
__device__ __forceinline__ int HalfSums(const int (&q)[8], int* other) {
  int sum = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e) sum += q[e];
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  *other = __shfl_down_sync(0xffffffffu, sum, 2);
  return sum;
}

// Quantizes x's `units` units into the staged copy (every thread of the block, kThreads of
// them, calls it; four consecutive lanes take a unit, 8 values each).
template <QuantRowX kX, typename T, int kThreads = kRowThreads>
__device__ __forceinline__ void StageIntX(const T* x, bool vec_x, int64_t units,
                                          float4* stage) {
  using S = IntStage<kX>;
  float4* meta = stage + units * S::kChunks;
  for (int64_t base = 0; base < units * 4; base += kThreads) {
    const int64_t i = base + threadIdx.x;
    const bool active = i < units * 4;  // the four lanes of a unit are active together
    const int64_t t = i >> 2;
    const int j = static_cast<int>(i & 3);
    float v[8] = {};
    if (active) quant::LoadX8(x + t * quant::kUnitElems + 8 * j, vec_x, v);
    float amax = 0.0f, sum = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      amax = fmaxf(amax, fabsf(v[e]));
      sum += v[e];
    }
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
    float inv, dx;
    if constexpr (kX == QuantRowX::kInt16x2) {
      // 2^(14−e) with amax in [2^(e−1), 2^e): amax·inv < 2^14, so both parts fit int16 and
      // every product with inv is exact (e bounded below: inv stays finite).
      int e = 0;
      (void)frexpf(amax, &e);
      e = max(e, -100);
      inv = ldexpf(1.0f, 14 - e);
      dx = ldexpf(1.0f, e - 14);
    } else {
      inv = amax > 0.0f ? S::Top() / amax : 0.0f;
      dx = amax / S::Top();
    }
    // A NaN or an infinity among the 32 (the sum is then not finite) makes every sum the
    // unit enters NaN, as the f32 products would, instead of a finite code.
    if (!isfinite(sum)) dx = __int_as_float(0x7fc00000);
    int q[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) q[e] = __float2int_rn(v[e] * inv);
    int qsum_hi = 0;
    const int qsum = HalfSums(q, &qsum_hi);
    // The second part: the remainder v·inv − q (exact) times 2^15, within ±2^14.
    int r[8], rsum = 0, rsum_hi = 0;
    if constexpr (S::kParts == 2) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        r[e] = __float2int_rn((v[e] * inv - static_cast<float>(q[e])) * 32768.0f);
      }
      rsum = HalfSums(r, &rsum_hi);
    }
    if (!active) continue;
    if constexpr (kX == QuantRowX::kInt8) {
      uint32_t word[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        word[h] = (q[4 * h] & 0xFF) | (q[4 * h + 1] & 0xFF) << 8 |
                  (q[4 * h + 2] & 0xFF) << 16 | static_cast<uint32_t>(q[4 * h + 3]) << 24;
      }
      auto* chunk = reinterpret_cast<uint2*>(stage + t * 2 + ((j >> 1) ^ S::Swizzle(t)));
      chunk[j & 1] = make_uint2(word[0], word[1]);
    } else {
      uint4* chunks = reinterpret_cast<uint4*>(stage) + t * S::kChunks;
      chunks[j ^ S::Swizzle(t)] = PackInt16(q);
      if constexpr (S::kParts == 2) chunks[(4 + j) ^ S::Swizzle(t)] = PackInt16(r);
    }
    if (j == 0) {
      meta[t * S::kParts] =
          make_float4(dx, sum, __int_as_float(qsum), __int_as_float(qsum_hi));
      if constexpr (S::kParts == 2) {
        meta[t * 2 + 1] = make_float4(__int_as_float(rsum), __int_as_float(rsum_hi), 0.0f, 0.0f);
      }
    }
  }
}

// Stages x's `units` units as the one-row kernels hold them: f32 (each unit's eight
// 16-byte chunks stored in the order q ^ (unit & 7)), or quantized as StageIntX says
// (every thread of the block, kThreads of them, calls it).
template <QuantRowX kX, typename T, int kThreads = kRowThreads>
__device__ __forceinline__ void StageX(const T* x, bool vec_x, int64_t units, float4* stage) {
  if constexpr (kX == QuantRowX::kF32) {
    for (int64_t i = threadIdx.x; i < units * 4; i += kThreads) {
      const int64_t t = i >> 2;
      const int j = static_cast<int>(i & 3);
      float v[8];
      quant::LoadX8(x + t * quant::kUnitElems + 8 * j, vec_x, v);
      float4* unit = stage + t * 8;
      const int swizzle = static_cast<int>(t & 7);
      unit[(2 * j) ^ swizzle] = make_float4(v[0], v[1], v[2], v[3]);
      unit[(2 * j + 1) ^ swizzle] = make_float4(v[4], v[5], v[6], v[7]);
    }
  } else {
    StageIntX<kX, T, kThreads>(x, vec_x, units, stage);
  }
}

// Σ over the unit's halves of 16-bit x (its chunks first .. first + 3, swizzled) times the
// codes: s_lo over values 0..15, s_hi over 16..31, added to what they hold.
__device__ __forceinline__ void Int16Dots(const uint4* chunks, int first, int swizzle,
                                          const uint32_t (&lo)[4], const uint32_t (&hi)[4],
                                          int& s_lo, int& s_hi) {
  uint4 c[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) c[i] = chunks[(first + i) ^ swizzle];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int w = 2 * (i & 1);
    s_lo = __dp2a_lo(static_cast<int>(quant::Word(c[i >> 1], w)), static_cast<int>(lo[i]), s_lo);
    s_lo = __dp2a_hi(static_cast<int>(quant::Word(c[i >> 1], w + 1)), static_cast<int>(lo[i]),
                     s_lo);
    s_hi = __dp2a_lo(static_cast<int>(quant::Word(c[2 + (i >> 1)], w)), static_cast<int>(hi[i]),
                     s_hi);
    s_hi = __dp2a_hi(static_cast<int>(quant::Word(c[2 + (i >> 1)], w + 1)),
                     static_cast<int>(hi[i]), s_hi);
  }
}

// Unit t's share of the dot product from the staged integers: the codes of values 4i ..
// 4i+3 and 16+4i .. (QuadCodes, biased by kCodeBias; signed bytes for Q8_0) meet the
// quantized x in integer dot products per half, then Scale·dx·(Σ − bias·Σq) per half
// (Q6_K's halves have their own scales; with two parts the second's sums over 2^15 added
// in f32) and Min·Σx.
template <QuantRowX kX, typename Unit>
__device__ __forceinline__ float IntDotUnit(const Unit& u, const float4* stage, int64_t units,
                                            int64_t t) {
  using S = IntStage<kX>;
  const uint4* chunks = reinterpret_cast<const uint4*>(stage) + t * S::kChunks;
  const int swizzle = S::Swizzle(t);
  uint32_t lo_codes[4], hi_codes[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) u.QuadCodes(i, lo_codes[i], hi_codes[i]);
  int s_lo = 0, s_hi = 0;
  if constexpr (kX == QuantRowX::kInt8) {
    const uint4 a = chunks[0 ^ swizzle], b = chunks[1 ^ swizzle];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s_lo = __dp4a(static_cast<int>(lo_codes[i]), static_cast<int>(quant::Word(a, i)), s_lo);
      s_hi = __dp4a(static_cast<int>(hi_codes[i]), static_cast<int>(quant::Word(b, i)), s_hi);
    }
  } else {
    Int16Dots(chunks, 0, swizzle, lo_codes, hi_codes, s_lo, s_hi);
  }
  const float4* meta = stage + units * S::kChunks + t * S::kParts;
  const float4 m = meta[0];
  constexpr int kBias = Unit::kCodeBias;
  float lo = static_cast<float>(s_lo - kBias * __float_as_int(m.z));
  float hi = static_cast<float>(s_hi - kBias * __float_as_int(m.w));
  if constexpr (S::kParts == 2) {
    int r_lo = 0, r_hi = 0;
    Int16Dots(chunks, 4, swizzle, lo_codes, hi_codes, r_lo, r_hi);
    const float4 m2 = meta[1];
    lo = fmaf(static_cast<float>(r_lo - kBias * __float_as_int(m2.x)), 1.0f / 32768.0f, lo);
    hi = fmaf(static_cast<float>(r_hi - kBias * __float_as_int(m2.y)), 1.0f / 32768.0f, hi);
  }
  float r = m.x * fmaf(u.Scale(0), lo, u.Scale(2) * hi);
  if constexpr (Unit::kHasMin) r = fmaf(u.Min(0), m.y, r);
  return r;
}

// The gate and up rows of a mixture's gate/up experts as separate tasks (MoeSplitGateUp):
// with rows of 33 to 64 units (one chunk each: K from 1,056 to 2,048, as Qwen3-30B-A3B's
// 2,048), a block takes a run of columns and its warps take their gate and up rows one
// row a task, round robin, each sum to shared memory, and the block writes silu(gate)·up
// after a barrier. Walking a column's two rows in one warp left a pair's 528 warps with
// one or two of its 768 columns each: the launch lasted two columns' walks while a third
// of the SMs' time went idle (ncu, H200). As tasks the warps take at most three rows each.
// Rows of at most 32 units keep the narrow walk (two columns a chunk).
__host__ __device__ constexpr bool MoeSplitGateUp(bool moe, bool gated, int64_t units) {
  return moe && gated && units > kWarpSize && units <= kRowChunkUnits;
}

// Four blocks per SM (at most 64 registers a thread): without the bound the compiler took
// 80 to 108 registers at f32 and every format ran slower, 1.1 to 2.1 times (H200, the 1B
// lm head, both built side by side, 2026-11-29: Q4_0 76 against 127 us, Q8_0 85 against
// 179, Q6_K 107 against 192).
// kMoe: a mixture of experts' matmul (MoeMatMul at decode). blockIdx.y is a (row, slot)
// pair, whose expert the block reads from `moe.ids` after the wait; x is the pair's row
// (or with per_slot its own slot's row), y the pair's n outputs, the columns rows
// expert · n + c of the stacked w (its planes span every expert), and with w_up each
// product rounded to T before silu(gate)·up, as the op rounds them. A bad id writes zeros
// and raises kErrorExpertOutOfRange.
template <typename T, typename Q, QuantRowX kX, bool kMoe>
__global__ void __launch_bounds__(kRowThreads, 4)
    QuantRowKernel(const T* __restrict__ x, const uint8_t* __restrict__ w,
                   const uint8_t* __restrict__ w_up, const T* __restrict__ residual,
                   T* __restrict__ y, int64_t n, int64_t k, bool vec_x, bool w_constant,
                   QuantRowMoe moe) {
  extern __shared__ float4 row_x[];  // f32: k / 32 units of 8 chunks; else IntStage
  const int lane = threadIdx.x % kWarpSize;
  const int64_t units = k / quant::kUnitElems;
  const int64_t blocks = (kMoe ? moe.experts : 1) * n * (k / Q::kElems);
  // With w_up a column walks its gate row's chunks, then its up row's.
  const int64_t row_chunks = CeilDiv(units, int64_t{kRowChunkUnits});
  const int64_t chunks = w_up != nullptr ? 2 * row_chunks : row_chunks;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kRowWarps;
  // With kMoe a row of at most 32 units (K up to 1,024, as the down experts' K of 768)
  // fills half a chunk: a narrow chunk's halves are then two columns' rows, col and col +
  // warps (lane: unit), so that a warp has as many loads in flight as with a long row and
  // walks its columns in half the steps (the pairs share the GPU's warps, so each warp has
  // several columns). Plain matmuls keep one column a chunk: their warps seldom have more
  // than one column of so short a row, and the second accumulator costs the K formats'
  // kernels registers.
  const bool narrow = kMoe && units <= kWarpSize;
  const int64_t col_step = narrow ? 2 * warps : warps;
  int64_t col = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarpSize;
  int64_t chunk = 0;
  int64_t first_row = 0;  // w's row of column 0: expert · n

  if constexpr (kMoe) {
    AwaitPrerequisiteGrids();  // the ids are the kernel before's output
    const int64_t pair = blockIdx.y;
    const int32_t expert = moe.ids[pair];
    x += (moe.per_slot ? pair : pair / moe.top_k) * k;
    y += pair * n;
    if (expert < 0 || expert >= moe.experts) {
      for (int64_t c = static_cast<int64_t>(blockIdx.x) * kRowThreads + threadIdx.x; c < n;
           c += static_cast<int64_t>(gridDim.x) * kRowThreads) {
        y[c] = FromFloat<T>(0.0f);
      }
      if (blockIdx.x == 0 && threadIdx.x == 0 && moe.error_flags != nullptr) {
        atomicOr(moe.error_flags, static_cast<uint32_t>(kErrorExpertOutOfRange));
      }
      return;
    }
    first_row = static_cast<int64_t>(expert) * n;
  }

  using Unit = typename Q::Unit;
  using Raw = typename Q::Raw;
  // The units of (column c, chunk q) this lane takes, as loaded (decoded at the use, so
  // that nothing waits for them before then); a unit past the row is not loaded.
  auto load = [&](int64_t c, int64_t q, Raw (&u)[2]) {
    const uint8_t* wq = q < row_chunks ? w : w_up;
    if (q >= row_chunks) q -= row_chunks;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t t = narrow ? lane : q * kRowChunkUnits + h * kWarpSize + lane;
      const int64_t ch = narrow ? c + h * warps : c;
      if (t < units && ch < n) u[h] = Q::Fetch(wq, blocks, (first_row + ch) * units + t);
    }
  };
  Raw cur[2], next[2];
  // MoeSplitGateUp: the block's columns c0 .. c0 + per_block − 1 as 2 · per_block tasks
  // (task i: column c0 + i / 2, its gate row for even i, its up row for odd i); this warp
  // takes tasks warp, warp + kRowWarps, ...
  const bool split = MoeSplitGateUp(kMoe, w_up != nullptr, units);
  const int warp = threadIdx.x / kWarpSize;
  // The block's first column and tasks (computed where used, not held across the staging).
  auto split_c0 = [&] { return static_cast<int64_t>(blockIdx.x) * CeilDiv(n, int64_t{gridDim.x}); };
  auto split_tasks = [&](int64_t c0) {
    return 2 * std::max<int64_t>(0, std::min(n, c0 + CeilDiv(n, int64_t{gridDim.x})) - c0);
  };
  if constexpr (kMoe) {
    if (split) {
      const int64_t c0 = split_c0();
      if (warp < split_tasks(c0)) load(c0 + warp / 2, warp % 2, cur);
    } else if (col < n) {
      load(col, 0, cur);
    }
  } else {
    // Constant weights: the first chunk is asked for before the wait.
    if (w_constant && col < n) load(col, 0, cur);
    AwaitPrerequisiteGrids();
    if (!w_constant && col < n) load(col, 0, cur);
  }

  StageX<kX>(x, vec_x, units, row_x);
  __syncthreads();

  // Unit t of a row (its words as loaded) times the staged x, added to sum.
  auto add_unit = [&](const Raw& raw, int64_t t, float& sum) {
    const Unit unit = Q::Decode(raw);
    if constexpr (kX != QuantRowX::kF32) {
      sum += IntDotUnit<kX>(unit, row_x, units, t);
    } else {
#pragma unroll
      for (int j = 0; j < quant::kUnitElems / 8; ++j) {
        float xf[1][8];
        StagedX8(row_x, t, j, xf[0]);
        float xsum[1];
        if constexpr (Unit::kHasMin) quant::XSums8<1>(xf, xsum);
        quant::AccumulateUnit8<1, 1>(unit, j, xf, xsum, &sum);
      }
    }
  };

  if (split) {
    const int64_t c0 = split_c0();
    const int tasks = static_cast<int>(split_tasks(c0));  // 2 · n / gridDim.x at most
    // After the staged x: a float per task (each row's sum rounded to T, as the op rounds
    // each product; the launch sized it).
    float* sums = reinterpret_cast<float*>(
        row_x + (kX == QuantRowX::kF32 ? units * 8 : IntStage<kX>::Float4s(units)));
    for (int task = warp; task < tasks; task += kRowWarps) {
      const int next_task = task + kRowWarps;
      if (next_task < tasks) load(c0 + next_task / 2, next_task % 2, next);
      float sum = 0.0f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t t = h * kWarpSize + lane;
        if (t >= units) continue;
        add_unit(cur[h], t, sum);
      }
      const float total = WarpSum(sum);
      if (lane == 0) sums[task] = RoundTo<T>(total);
#pragma unroll
      for (int h = 0; h < 2; ++h) cur[h] = next[h];
    }
    __syncthreads();
    for (int i = static_cast<int>(threadIdx.x); 2 * i < tasks; i += kRowThreads) {
      y[c0 + i] = FromFloat<T>(Silu(sums[2 * i]) * sums[2 * i + 1]);
    }
    return;
  }

  // acc[1] and acc_gate[1]: a narrow chunk's second column.
  float acc[2] = {0.0f, 0.0f}, acc_gate[2] = {0.0f, 0.0f};
  while (col < n) {
    int64_t next_col = col, next_chunk = chunk + 1;
    if (next_chunk == chunks) {
      next_chunk = 0;
      next_col += col_step;
    }
    if (next_col < n) load(next_col, next_chunk, next);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t t = narrow ? lane
                               : (chunk < row_chunks ? chunk : chunk - row_chunks) *
                                         kRowChunkUnits +
                                     h * kWarpSize + lane;
      if (t >= units || (narrow && col + h * warps >= n)) continue;
      // A long row's halves add into one sum, in the order of its units.
      add_unit(cur[h], t, narrow ? acc[h] : acc[0]);
    }
    if (next_chunk == 0) {  // the column (a narrow chunk: both columns) is done
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t c = col + h * warps;
        if (h == 1 && (!narrow || c >= n)) break;  // warp-uniform
        const float total = WarpSum(acc[h]);
        const float gate = w_up != nullptr ? WarpSum(acc_gate[h]) : 0.0f;
        if (lane == 0) {
          // With a residual, as FusedMatMul's add: the product rounded first. With w_up,
          // as its SiluMul: silu(gate)·up of the f32 sums, rounded once. With kMoe and
          // w_up, as MoeMatMul's silu_mul: each product rounded first.
          y[c] = w_up != nullptr && kMoe ? FromFloat<T>(Silu(RoundTo<T>(gate)) * RoundTo<T>(total))
                 : w_up != nullptr       ? FromFloat<T>(Silu(gate) * total)
                 : residual == nullptr   ? FromFloat<T>(total)
                                         : FromFloat<T>(ToFloat(residual[c]) + RoundTo<T>(total));
        }
      }
      acc[0] = acc[1] = 0.0f;
    } else if (next_chunk == row_chunks && w_up != nullptr) {  // the gate row is done
      acc_gate[0] = acc[0];
      acc_gate[1] = acc[1];
      acc[0] = acc[1] = 0.0f;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) cur[h] = next[h];
    col = next_col;
    chunk = next_chunk;
  }
}

// f(std::integral_constant<QuantRowX, mode>) for the run-time mode.
template <typename F>
cudaError_t DispatchRowX(QuantRowX mode, F&& f) {
  switch (mode) {
    case QuantRowX::kF32: return f(std::integral_constant<QuantRowX, QuantRowX::kF32>{});
    case QuantRowX::kInt8: return f(std::integral_constant<QuantRowX, QuantRowX::kInt8>{});
    case QuantRowX::kInt16: return f(std::integral_constant<QuantRowX, QuantRowX::kInt16>{});
    case QuantRowX::kInt16x2:
      return f(std::integral_constant<QuantRowX, QuantRowX::kInt16x2>{});
  }
  return cudaErrorInvalidValue;
}

// Dynamic shared memory of a one-row kernel that stages `units` units of x as kX says.
template <QuantRowX kX>
size_t StagedXBytes(int64_t units) {
  return 16 * static_cast<size_t>(kX == QuantRowX::kF32 ? units * 8
                                                         : IntStage<kX>::Float4s(units));
}

// Lets `kernel` take `bytes` of dynamic shared memory, which past the default 48 KiB it
// must ask for.
template <typename Kernel>
cudaError_t AllowSharedBytes(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(bytes));
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}

// The one-row kernel's launch: a plain matmul (moe null) or a mixture of experts' (one
// grid row of blocks per pair).
cudaError_t LaunchRow(const void* x, const void* w, const void* w_up, DType w_dtype,
                      const void* residual, void* y, int64_t n, int64_t k, DType dtype,
                      bool w_constant, int sm_count, QuantRowX x_mode, Stream stream,
                      const QuantRowMoe* moe = nullptr, int64_t pairs = 1) {
  if (!QuantRowMatmulTakes(n, k, w_dtype) || sm_count <= 0) return cudaErrorInvalidValue;
  if (!Aligned16(w) || (w_up != nullptr && !Aligned16(w_up))) return cudaErrorMisalignedAddress;
  const int64_t units = k / quant::kUnitElems;
  return DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vec_x = Aligned16(x);
    return quant::DispatchFormat(w_dtype, [&](auto format) {
      using Q = decltype(format);
      auto launch = [&](auto mode, auto is_moe) {
        constexpr QuantRowX kX = decltype(mode)::value;
        const auto kernel = QuantRowKernel<T, Q, kX, decltype(is_moe)::value>;
        // Two parts of a K past 9,830 stage more than the default 48 KiB.
        const size_t shared_bytes = StagedXBytes<kX>(units);
        if (const cudaError_t e = AllowSharedBytes(kernel, shared_bytes); e != cudaSuccess) {
          return e;
        }
        // As many blocks as fit the GPU at once (shared by the pairs), and no more than the
        // columns need.
        int per_sm = 0;
        const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, kernel, kRowThreads, shared_bytes);
        if (e != cudaSuccess) return e;
        const int64_t blocks = std::clamp<int64_t>(
            std::max(per_sm, 1) * static_cast<int64_t>(sm_count) / pairs, 1,
            CeilDiv(n, int64_t{kRowWarps}));
        size_t launch_bytes = shared_bytes;
        if (MoeSplitGateUp(moe != nullptr, w_up != nullptr, units)) {
          // A float per task after the staged x: two a column of the block's run.
          launch_bytes += 2 * sizeof(float) * static_cast<size_t>(CeilDiv(n, blocks));
          if (const cudaError_t a = AllowSharedBytes(kernel, launch_bytes); a != cudaSuccess) {
            return a;
          }
        }
        return LaunchKernelShared(
            kernel, dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(pairs)),
            dim3(kRowThreads), launch_bytes, stream, static_cast<const T*>(x),
            static_cast<const uint8_t*>(w), static_cast<const uint8_t*>(w_up),
            static_cast<const T*>(residual), static_cast<T*>(y), n, k, vec_x, w_constant,
            moe != nullptr ? *moe : QuantRowMoe{});
      };
      auto dispatch_mode = [&](auto is_moe) {
        return DispatchRowX(x_mode, [&](auto mode) { return launch(mode, is_moe); });
      };
      return moe != nullptr ? dispatch_mode(std::true_type{}) : dispatch_mode(std::false_type{});
    });
  });
}

// ---- a mixture's down experts and their combine (MoeCombine's matmul) ---------------------
//
// A block per (row, run of up to kMoeCombineMaxCols columns). Its first warp ranks the
// row's slots by expert id (ties by slot: the order of MoeCombine's sum) into shared
// memory, with each slot's weight given, or computed from the router's logits by the last
// warp (RowRouteWeights, the bits MoeRouteWeights stores); meanwhile the block stages the
// row's top_k slices of x as one row of top_k · units units (slot j's unit t is staged unit
// j · units + t), as the one-row kernel stages its x. Then the block's (column, slot) rows
// are tasks, round robin over its warps (rank r of column c is task c · top_k + r), each
// walked as the one-row kernel walks a row: chunks of 64 units, lane l taking units l and
// 32 + l, the next chunk's (or the next task's) loads in flight while this one's are
// multiplied; each task's sum, rounded to T as MoeMatMul stores y, goes to shared memory.
// After a barrier a thread per column adds its column's terms in rank order with
// MoeCombine's roundings (explicit _rn operations), then the residual. The products never
// reach memory, and the block's warps all stream weights (a warp per column walking its
// top_k rows alone took 18 µs). Still 17 µs a Qwen3-30B-A3B layer against 8 + 5 for the
// launch pair (H200, eager): the pass that makes this node is off by default
// (stepgraph/graph/passes.h).
constexpr int kMoeCombineMaxTopK = static_cast<int>(kQuantRowMoeCombineMaxTopK);
constexpr int kMoeCombineMaxCols = 64;
constexpr int kMoeCombineWarps = 16;
constexpr int kMoeCombineThreads = kMoeCombineWarps * kWarpSize;
static_assert(kMoeCombineMaxTopK <= kWarpSize && kMoeCombineMaxCols <= kMoeCombineThreads);

// The routing of a row as the block holds it: rank r is slot slot[r] of expert expert[r]
// (−1: an id out of range, whose products are zeros); scale[j] is slot j's weight.
struct MoeCombineRouting {
  int slot[kMoeCombineMaxTopK];
  int32_t expert[kMoeCombineMaxTopK];
  float scale[kMoeCombineMaxTopK];
};

__device__ __forceinline__ float LoadAsFloat(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16: return ToFloat(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kF16: return ToFloat(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// Float experts of x's dtype read as a block format of one unit a block (Fetch, Decode,
// and a Unit whose codes are the values, scale 1 and no min), so that the f32 path of the
// kernel below takes them: AccumulateUnit8's fmaf(1, Σ, acc) is Σ + acc exactly.
template <typename T>
struct FloatExperts {
  static constexpr int kElems = quant::kUnitElems;
  static constexpr int kW = kVec16<T>;
  struct Raw {
    Vec<T, kW> q[quant::kUnitElems / kW];
  };
  struct Unit {
    static constexpr bool kHasMin = false;
    Raw r;
    __device__ __forceinline__ void Codes8(int j, float (&c)[8]) const {
#pragma unroll
      for (int i = 0; i < 8; ++i) c[i] = ToFloat(r.q[(8 * j + i) / kW].v[(8 * j + i) % kW]);
    }
    __device__ __forceinline__ float Scale(int) const { return 1.0f; }
    __device__ __forceinline__ float Min(int) const { return 0.0f; }
  };
  static __device__ __forceinline__ Raw Fetch(const uint8_t* base, int64_t, int64_t g) {
    const T* p = reinterpret_cast<const T*>(base) + g * quant::kUnitElems;
    Raw raw;
#pragma unroll
    for (int i = 0; i < quant::kUnitElems / kW; ++i) raw.q[i] = LoadStreaming<T, kW>(p + i * kW);
    return raw;
  }
  static __device__ __forceinline__ Unit Decode(const Raw& raw) { return Unit{raw}; }
};

// The launch's fixed arguments.
struct MoeCombineParams {
  const int32_t* ids = nullptr;
  const void* weights = nullptr;
  DType weights_dtype = DType::kF32;
  int route_experts = 0;  // > 0: weights are the router's logits
  bool renormalize = true, round_to_dtype = false;
  int n = 0, k = 0, top_k = 0, experts = 0;
  int cols = 0;  // columns a block takes (the last block of a row fewer)
  bool vec_x = false;
  uint32_t* error_flags = nullptr;
};

// Two blocks an SM (at most 64 registers a thread), as the one-row kernel's four of 256;
// one for float experts, whose two chunks of units in flight are 64 or 128 bytes a lane
// (at two blocks they spilled 482 and 740 bytes, ptxas -v, sm_90).
template <typename Q>
constexpr int MoeCombineMinBlocks() {
  return sizeof(typename Q::Raw) <= 48 ? 2 : 1;
}

template <typename T, typename Q, QuantRowX kX>
__global__ void __launch_bounds__(kMoeCombineThreads, MoeCombineMinBlocks<Q>())
    QuantRowMoeCombineKernel(const T* __restrict__ x, const uint8_t* __restrict__ w,
                             const T* residual, T* out, MoeCombineParams p) {
  extern __shared__ float4 row_x[];  // as QuantRowKernel's, for top_k · units units
  __shared__ MoeCombineRouting routing;
  __shared__ float sums[kMoeCombineMaxTopK][kMoeCombineMaxCols];  // by rank and column
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int64_t row = blockIdx.y;
  const int units = p.k / quant::kUnitElems;
  const int staged = p.top_k * units;  // within 31 bits: QuantRowMoeCombineTakes
  const int64_t blocks = static_cast<int64_t>(p.experts) * p.n * (p.k / Q::kElems);
  const int c0 = static_cast<int>(blockIdx.x) * p.cols;
  const int cols = min(p.cols, p.n - c0);
  AwaitPrerequisiteGrids();  // the ids, the weights and x are the kernels before's outputs
  const int32_t* row_ids = p.ids + row * p.top_k;
  uint32_t* flags = blockIdx.x == 0 ? p.error_flags : nullptr;  // one block of the row
  if (warp == 0 && lane < p.top_k) {
    const int32_t mine = row_ids[lane];
    const int rank = SlotRank(row_ids, p.top_k, lane);
    const bool valid = mine >= 0 && mine < p.experts;
    if (!valid) RaiseExpertOutOfRange(flags);
    routing.slot[rank] = lane;
    routing.expert[rank] = valid ? mine : -1;
    if (p.route_experts == 0) {
      routing.scale[lane] = LoadAsFloat(p.weights, p.weights_dtype, row * p.top_k + lane);
    }
  }
  if (p.route_experts > 0 && warp == kMoeCombineWarps - 1) {
    auto store = [&](int j, float v) { routing.scale[j] = v; };
    const int64_t at = row * p.route_experts;
    switch (p.weights_dtype) {
      case DType::kBF16:
        RowRouteWeights(static_cast<const __nv_bfloat16*>(p.weights) + at, row_ids,
                        p.route_experts, p.top_k, p.renormalize, p.round_to_dtype, flags, lane,
                        store);
        break;
      case DType::kF16:
        RowRouteWeights(static_cast<const __half*>(p.weights) + at, row_ids, p.route_experts,
                        p.top_k, p.renormalize, p.round_to_dtype, flags, lane, store);
        break;
      default:
        RowRouteWeights(static_cast<const float*>(p.weights) + at, row_ids, p.route_experts,
                        p.top_k, p.renormalize, p.round_to_dtype, flags, lane, store);
        break;
    }
  }
  StageX<kX, T, kMoeCombineThreads>(x + row * staged * quant::kUnitElems, p.vec_x, staged,
                                     row_x);
  __syncthreads();

  // Task i: rank i % top_k of column c0 + i / top_k; its row walked in chunks of
  // kRowChunkUnits units (lane l: units l and 32 + l of the chunk).
  const int tasks = cols * p.top_k;
  const int chunks = (units + kRowChunkUnits - 1) / kRowChunkUnits;
  using Raw = typename Q::Raw;
  auto load = [&](int task, int chunk, Raw (&u)[2]) {
    const int r = task % p.top_k;
    const int32_t e = routing.expert[r];
    if (e < 0) return;  // a bad id: nothing loaded, its sum zero
    const int64_t first = (static_cast<int64_t>(e) * p.n + c0 + task / p.top_k) * units;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = chunk * kRowChunkUnits + h * kWarpSize + lane;
      if (t < units) u[h] = Q::Fetch(w, blocks, first + t);
    }
  };
  Raw cur[2], next[2];
  int task = warp, chunk = 0;
  if (task < tasks) load(task, 0, cur);
  float sum = 0.0f;
  while (task < tasks) {
    int next_task = task, next_chunk = chunk + 1;
    if (next_chunk == chunks) {
      next_chunk = 0;
      next_task += kMoeCombineWarps;
    }
    if (next_task < tasks) load(next_task, next_chunk, next);
    const int r = task % p.top_k;
    if (routing.expert[r] >= 0) {
      const int at = routing.slot[r] * units;  // the slot's first staged unit
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int t = chunk * kRowChunkUnits + h * kWarpSize + lane;
        if (t >= units) continue;
        const typename Q::Unit unit = Q::Decode(cur[h]);
        if constexpr (kX != QuantRowX::kF32) {
          sum += IntDotUnit<kX>(unit, row_x, staged, at + t);
        } else {
#pragma unroll
          for (int j = 0; j < quant::kUnitElems / 8; ++j) {
            float xf[1][8];
            StagedX8(row_x, at + t, j, xf[0]);
            float xsum[1];
            if constexpr (Q::Unit::kHasMin) quant::XSums8<1>(xf, xsum);
            quant::AccumulateUnit8<1, 1>(unit, j, xf, xsum, &sum);
          }
        }
      }
    }
    if (next_chunk == 0) {  // the task's row is done: y as MoeMatMul stores it
      const float total = WarpSum(sum);
      if (lane == 0) {
        sums[r][task / p.top_k] = routing.expert[r] >= 0 ? RoundTo<T>(total) : 0.0f;
      }
      sum = 0.0f;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) cur[h] = next[h];
    task = next_task;
    chunk = next_chunk;
  }
  __syncthreads();
  const int i = static_cast<int>(threadIdx.x);
  if (i >= cols) return;
  float total = 0.0f;
  for (int r = 0; r < p.top_k; ++r) {
    total = AddCombineTerm<T>(total, routing.scale[routing.slot[r]], sums[r][i]);
  }
  // The residual add as Add computes it (out may be residual itself: this thread alone
  // reads and writes the element).
  const int64_t at = row * p.n + c0 + i;
  if (residual != nullptr) total = __fadd_rn(total, ToFloat(residual[at]));
  out[at] = FromFloat<T>(total);
}

}  // namespace

cudaError_t LaunchQuantRowMatmul(const void* x, const void* w, DType w_dtype,
                                 const void* residual, void* y, int64_t n, int64_t k,
                                 DType dtype, bool w_constant, int sm_count, QuantRowX x_mode,
                                 Stream stream) {
  return LaunchRow(x, w, nullptr, w_dtype, residual, y, n, k, dtype, w_constant, sm_count,
                   x_mode, stream);
}

cudaError_t LaunchQuantRowSiluMul(const void* x, const void* w_gate, const void* w_up,
                                  DType w_dtype, void* y, int64_t n, int64_t k, DType dtype,
                                  bool w_constant, int sm_count, QuantRowX x_mode,
                                  Stream stream) {
  if (w_up == nullptr) return cudaErrorInvalidValue;
  return LaunchRow(x, w_gate, w_up, w_dtype, nullptr, y, n, k, dtype, w_constant, sm_count,
                   x_mode, stream);
}

bool QuantRowMoeTakes(int64_t rows, int64_t experts, int64_t n, int64_t k, int64_t top_k,
                      DType w_dtype) {
  if (rows <= 0 || experts <= 0 || top_k <= 0 || experts > 0x7fffffff || top_k > 0x7fffffff) {
    return false;
  }
  if (rows > kQuantRowMoeMaxPairs / top_k || n > 0x7fffffff / experts) return false;
  return QuantRowMatmulTakes(experts * n, k, w_dtype);
}

cudaError_t LaunchQuantRowMoe(const void* x, const void* w, const void* w_up, DType w_dtype,
                              const int32_t* ids, void* y, int64_t rows, int64_t experts,
                              int64_t n, int64_t k, int64_t top_k, bool per_slot, DType dtype,
                              uint32_t* error_flags, int sm_count, QuantRowX x_mode,
                              Stream stream) {
  if (!QuantRowMoeTakes(rows, experts, n, k, top_k, w_dtype) || ids == nullptr ||
      (w_up != nullptr && per_slot)) {
    return cudaErrorInvalidValue;
  }
  const QuantRowMoe moe{ids, static_cast<int>(top_k), per_slot, static_cast<int>(experts),
                        error_flags};
  return LaunchRow(x, w, w_up, w_dtype, nullptr, y, n, k, dtype, false, sm_count, x_mode,
                   stream, &moe, rows * top_k);
}

bool QuantRowMoeCombineTakes(int64_t rows, int64_t experts, int64_t n, int64_t k,
                             int64_t top_k, DType dtype, DType w_dtype) {
  if (!IsFloat(dtype) || rows <= 0 || rows > 65535 || experts <= 0 || top_k <= 0 ||
      top_k > kQuantRowMoeCombineMaxTopK || k > kQuantRowMoeCombineMaxXs / top_k) {
    return false;
  }
  // experts · n within 31 bits; a grid row of at most 65535 blocks of kMoeCombineMaxCols.
  if (n <= 0 || n > 65535 * kMoeCombineMaxCols || experts > 0x7fffffff / n) return false;
  if (w_dtype == dtype) return k % quant::kUnitElems == 0 && k <= kQuantRowMaxK;
  return QuantRowMatmulTakes(experts * n, k, w_dtype);
}

cudaError_t LaunchQuantRowMoeCombine(const QuantRowMoeCombine& a, int sm_count,
                                     QuantRowX x_mode, Stream stream) {
  if (!QuantRowMoeCombineTakes(a.rows, a.experts, a.n, a.k, a.top_k, a.dtype, a.w_dtype) ||
      a.x == nullptr || a.w == nullptr || a.ids == nullptr || a.weights == nullptr ||
      a.out == nullptr || !IsFloat(a.weights_dtype) || a.route_experts < 0 ||
      a.route_experts > 0x7fffffff || sm_count <= 0) {
    return cudaErrorInvalidValue;
  }
  if (!Aligned16(a.w)) return cudaErrorMisalignedAddress;
  const int staged = static_cast<int>(a.top_k * (a.k / quant::kUnitElems));
  MoeCombineParams params;
  params.ids = a.ids;
  params.weights = a.weights;
  params.weights_dtype = a.weights_dtype;
  params.route_experts = static_cast<int>(a.route_experts);
  params.renormalize = a.renormalize;
  params.round_to_dtype = a.round_to_dtype;
  params.n = static_cast<int>(a.n);
  params.k = static_cast<int>(a.k);
  params.top_k = static_cast<int>(a.top_k);
  params.experts = static_cast<int>(a.experts);
  params.vec_x = Aligned16(a.x);  // every unit starts at a multiple of 32 elements of x
  params.error_flags = a.error_flags;
  return DispatchFloat(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto with_format = [&](auto format) -> cudaError_t {
      using Q = decltype(format);
      auto launch = [&](auto mode) {
        constexpr QuantRowX kX = decltype(mode)::value;
        const auto kernel = QuantRowMoeCombineKernel<T, Q, kX>;
        const size_t shared_bytes = StagedXBytes<kX>(staged);
        if (const cudaError_t e = AllowSharedBytes(kernel, shared_bytes); e != cudaSuccess) {
          return e;
        }
        // As many blocks as the GPU holds at once over the rows (each stages its row's x),
        // each at most kMoeCombineMaxCols columns.
        int per_sm = 0;
        const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, kernel, kMoeCombineThreads, shared_bytes);
        if (e != cudaSuccess) return e;
        const int64_t blocks = std::clamp<int64_t>(
            std::max(per_sm, 1) * static_cast<int64_t>(sm_count) / a.rows,
            CeilDiv(a.n, int64_t{kMoeCombineMaxCols}), a.n);
        params.cols = static_cast<int>(CeilDiv(a.n, blocks));
        const dim3 grid(static_cast<unsigned>(CeilDiv(a.n, int64_t{params.cols})),
                        static_cast<unsigned>(a.rows));
        return LaunchKernelShared(kernel, grid, dim3(kMoeCombineThreads), shared_bytes, stream,
                                  static_cast<const T*>(a.x), static_cast<const uint8_t*>(a.w),
                                  static_cast<const T*>(a.residual), static_cast<T*>(a.out),
                                  params);
      };
      // Float experts meet x in f32 only.
      if constexpr (std::is_same_v<Q, FloatExperts<T>>) {
        return launch(std::integral_constant<QuantRowX, QuantRowX::kF32>{});
      } else {
        return DispatchRowX(x_mode, launch);
      }
    };
    if (a.w_dtype == a.dtype) return with_format(FloatExperts<T>{});
    return quant::DispatchFormat(a.w_dtype, with_format);
  });
}

cudaError_t LaunchQuantMatmul(const void* x, const void* w, DType w_dtype, const void* bias,
                              void* y, int64_t m, int64_t n, int64_t k, DType dtype,
                              Stream stream) {
  if (!IsQuantized(w_dtype) || m <= 0 || n <= 0 || k <= 0 || n > 0x7fffffff ||
      k % DTypeBlockElems(w_dtype) != 0 ||
      (m + kQuantMatmulGroupRows - 1) / kQuantMatmulGroupRows > 65535) {
    return cudaErrorInvalidValue;
  }
  if (!Aligned16(w)) return cudaErrorMisalignedAddress;
  return DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Every unit starts at a multiple of 32 elements, so one aligned x makes every load of
    // 8 activations a vector load.
    const bool vec_x = Aligned16(x);
    return quant::DispatchFormat(w_dtype, [&](auto format) {
      using Q = decltype(format);
      return DispatchGroupRows(m, [&](auto rows) {
        constexpr int kRows = decltype(rows)::value;
        const dim3 grid(static_cast<unsigned>(CeilDiv(n, ColsFor<kRows>())),
                        static_cast<unsigned>(CeilDiv(m, kRows)));
        return LaunchKernel(QuantMatmulKernel<T, Q, kRows>, grid, dim3(kThreads), stream,
                            static_cast<const T*>(x), static_cast<const uint8_t*>(w),
                            static_cast<const T*>(bias), static_cast<T*>(y), m, n, k, vec_x);
      });
    });
  });
}

}  // namespace sg::kernels
