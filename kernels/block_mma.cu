// The block-format matmul on tensor cores (kernels/block_mma.cuh says what it computes).
//
// Three launches. SplitXKernel splits x once into its bf16 parts in a scratch buffer, laid
// out as the MMA's B fragments (a lane's registers of both k16 steps of a unit as one
// 16-byte vector, so that a warp reads a fragment with one contiguous 512-byte load), with
// each row's sum per unit beside them. BlockMmaKernel: a thread block of four warps owns
// 64 output columns (16 a warp) over one split of K for up to 4 row tiles of 8 rows, or
// in the prefill shape 128 columns (two column tiles of 16 a warp) for 8 row tiles (more
// rows: more blocks along z); BlockMmaStagedKernel, the staged shape, is eight warps over
// 128 columns and 16 row tiles with x's fragments copied into shared memory (below). Each
// warp walks its units, the next unit's weights loaded
// while this one's are multiplied, one m16n8k16 MMA per k16 step, part and row tile (one
// accumulator per part, so that their MMAs overlap). A lane holds the codes of two
// columns (rows g and g + 8 of the A fragment, g = lane / 4), values 4t .. 4t+3 and
// 16+4t .. 16+4t+3 of the unit (t = lane % 4: QuadCodes, a quarter of the unit's quant
// bytes), which the MMA's k slots 2t, 2t+1, 2t+8, 2t+9 of the two steps take in that
// order; x's fragments put the same values in the same slots. A code becomes a bf16 by
// one byte permutation (the code under the exponent of 128: 128 + code exactly) and one
// bf16x2 subtraction of 128 + bias, exact; Q8_0's signed codes through f32. The
// accumulator fragment of a lane is (columns g, g + 8) × (rows 2t, 2t + 1), so the lane
// scales its own columns' sums: per unit acc += Scale·Σ code·x (per half for Q6_K's two
// sub-blocks), + Min·Σ x. Splits of K write f32 partial sums; SumSplitsKernel adds them
// in split order for a MatMul (the fused matmul's epilogue reads them itself).
// kBlockMmaInt8 puts x as int8 codes per row and unit into the same fragments' place (one
// m16n8k32 int8 MMA a unit and tile: the codes' quarters QuadCodes gives are the int8 A
// fragment's registers as they are, less the format's offset as signed bytes).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>

#include "kernels/block_mma.cuh"
#include "kernels/common.cuh"
#include "kernels/quant_blocks.cuh"
#include "stepgraph/base/error_flags.h"

namespace sg::kernels {
namespace {

constexpr int kWarps = kBlockMmaCols / 16;
constexpr int kThreads = kWarps * kWarpSize;
// Row tiles of 8 a block takes: up to 4 in the decode shape (64 columns a block), 8 in the
// prefill shape (128 columns: two column tiles a warp, so that each x fragment a warp loads
// feeds two MMAs).
constexpr int kDecodeRowTiles = 4;
constexpr int kPrefillRowTiles = 8;

__device__ __forceinline__ uint32_t Bits(__nv_bfloat162 v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}

// (x0, x1) as kTerms bf16 pairs whose sums are x0 and x1: each part is what the parts
// before it left, rounded; every difference is exact, and three parts hold all 24 bits.
template <int kTerms>
__device__ __forceinline__ void SplitPair(float x0, float x1, uint32_t (&out)[kTerms]) {
#pragma unroll
  for (int q = 0; q < kTerms; ++q) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    out[q] = Bits(h);
    x0 = __fsub_rn(x0, __low2float(h));
    x1 = __fsub_rn(x1, __high2float(h));
  }
}

// d += a·b: one m16n8k16 MMA, bf16 operands (f16 with kHalf), f32 accumulators.
template <bool kHalf = false>
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint2 b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kHalf) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
  }
#endif
}

// kBlockMmaF16x2 (terms 4): f32 x as two f16 parts of x·2^−e, e per row and unit (its
// largest magnitude in [2^(e−1), 2^e)), so each value is held to about 2^−23 of its unit's
// largest, f32's precision for the sums it enters; the codes are exact in f16 as in bf16,
// and each unit's sum is scaled by 2^e with the weights' scale. Two parts: two thirds of
// three bf16 parts' MMAs.
// kBlockMmaF16x1 (terms 6): the first of those parts alone.
template <int kTerms>
inline constexpr bool kHalfParts = BlockMmaScaledTerms(kTerms);
// kBlockMmaInt8 (terms 5): x as int8 codes of each row's unit, one 16-byte fragment a lane
// (SplitXKernel): the unit's 8 codes of row g the B fragment takes, and the scales of the
// accumulator's rows 2t and 2t + 1, so that no other array is read for them.
template <int kTerms>
inline constexpr bool kInt8Parts = kTerms == kBlockMmaInt8;
// The 16-byte fragments a lane holds per unit and row tile for `terms`.
constexpr int PartsOf(int terms) {
  return terms == kBlockMmaF16x2                              ? 2
         : terms == kBlockMmaInt8 || terms == kBlockMmaF16x1 ? 1
                                                              : terms;
}
template <int kTerms>
inline constexpr int kParts = PartsOf(kTerms);
// Bytes of x's fragments per row and unit (the scratch's, for every kind of part).
constexpr int64_t FragBytesPerRowUnit(int terms) {
  return PartsOf(terms) * quant::kUnitElems * 2;
}

// The largest magnitude of a row's unit: this lane's 8 values, then its quad's (the quad
// of lanes l / 4 holds the row's 32 values).
__device__ __forceinline__ float QuadAbsMax(const float (&v)[2][4]) {
  float amax = 0.0f;
#pragma unroll
  for (int step = 0; step < 2; ++step) {
#pragma unroll
    for (int i = 0; i < 4; ++i) amax = fmaxf(amax, fabsf(v[step][i]));
  }
  amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 1));
  return fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 2));
}

// d += a·b over int8: one m16n8k32 MMA (a: the A fragment's four registers of four codes,
// b0/b1: the B fragment's), s32 accumulators.
__device__ __forceinline__ void MmaS8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                      uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// The same over 16 values (m16n8k16): Q6_K's halves, each with its own scale.
__device__ __forceinline__ void MmaS8Half(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(b));
#endif
}

// Four codes (QuadCodes' bytes, each below 2·kBias, or Q8_0's signed bytes with kBias 0)
// less kBias as signed bytes: 128 + code − kBias borrows from no neighbour, and flipping
// the top bit makes the byte the two's complement of code − kBias.
template <int kBias>
__device__ __forceinline__ uint32_t SignedCodes(uint32_t codes) {
  if constexpr (kBias == 0) {
    return codes;
  } else {
    return ((codes | 0x80808080u) - kBias * 0x01010101u) ^ 0x80808080u;
  }
}

__device__ __forceinline__ uint32_t Bits(__half2 v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}

// (x0, x1), already scaled, as two f16 pairs: the first rounded, the second the rounded
// remainder (exact: a difference of f32 values within 2^−11 of each other's magnitude).
__device__ __forceinline__ void SplitPairHalf(float x0, float x1, uint32_t (&out)[2]) {
  const __half2 h = __floats2half2_rn(x0, x1);
  out[0] = Bits(h);
  out[1] = Bits(__floats2half2_rn(__fsub_rn(x0, __low2float(h)), __fsub_rn(x1, __high2float(h))));
}

// Bytes kI and kI + 1 of `codes` (each below 128) less kBias, as a bf16 pair, exactly: the
// byte under 0x43 is the bf16 128 + code, and (128 + code) − (128 + kBias) is an integer
// of at most 7 bits.
// With kHalfCodes the pair is f16: the byte under 0x64 is the f16 1024 + code, and
// (1024 + code) − (1024 + kBias) is as exact.
template <int kI, int kBias, bool kHalfCodes = false>
__device__ __forceinline__ uint32_t CodePair(uint32_t codes) {
  constexpr uint32_t kSelect = 0x4040u | kI | ((kI + 1) << 8);
  if constexpr (kHalfCodes) {
    const uint32_t biased = __byte_perm(codes, 0x64u, kSelect);
    // 1024 + kBias in f16: exponent 0x64, kBias in the mantissa's low bits.
    constexpr uint32_t kOne = 0x6400u | kBias;
    __half2 v, bias;
    memcpy(&v, &biased, 4);
    const uint32_t bias_bits = kOne | (kOne << 16);
    memcpy(&bias, &bias_bits, 4);
    return Bits(__hsub2(v, bias));
  } else {
    const uint32_t biased = __byte_perm(codes, 0x43u, kSelect);
    constexpr uint32_t kHalf = 0x4300u | kBias;
    __nv_bfloat162 v, bias;
    memcpy(&v, &biased, 4);
    const uint32_t bias_bits = kHalf | (kHalf << 16);
    memcpy(&bias, &bias_bits, 4);
    return Bits(__hsub2(v, bias));
  }
}

// The A-fragment registers of one column of a unit: pairs[s][0] values 16s+4t, +1 and
// pairs[s][1] values 16s+4t+2, +3 (QuadCodes' quarter t).
template <typename Q, bool kHalfCodes = false>
__device__ __forceinline__ void ColumnPairs(const typename Q::Unit& u, int t,
                                            uint32_t (&pairs)[2][2]) {
  uint32_t half[2];
  u.QuadCodes(t, half[0], half[1]);
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    if constexpr (std::is_same_v<Q, quant::Format<DType::kQ8_0>>) {
      // Signed bytes: exact floats (the sign bits flipped under a bias of 128), then pairs.
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#ifdef __CUDA_ARCH__
      quant::ByteCodes4<128>(half[s] ^ 0x80808080u, c);
#endif
      if constexpr (kHalfCodes) {
        pairs[s][0] = Bits(__floats2half2_rn(c[0], c[1]));
        pairs[s][1] = Bits(__floats2half2_rn(c[2], c[3]));
      } else {
        pairs[s][0] = Bits(__floats2bfloat162_rn(c[0], c[1]));
        pairs[s][1] = Bits(__floats2bfloat162_rn(c[2], c[3]));
      }
    } else {
      pairs[s][0] = CodePair<0, Q::Unit::kCodeBias, kHalfCodes>(half[s]);
      pairs[s][1] = CodePair<2, Q::Unit::kCodeBias, kHalfCodes>(half[s]);
    }
  }
}

// Rows of x padded to whole row tiles of 8 (the scratch's rows).
constexpr int64_t PaddedRows(int64_t m) { return (m + 7) / 8 * 8; }

// x [m, k] into the scratch: for unit u, row tile r and part q, lane l's fragment of both
// k16 steps as one 16-byte vector (steps 0 and 1, each the pair of values 4t, 4t+1 and
// the pair 4t+2, 4t+3, t = l % 4, of row 8r + l / 4) at frags[((u · tiles + r) · kTerms
// + q) · 32 + l]; and Σ x over the unit of each row at sums[u · rows + row] (rows past m
// are zeros). One thread per (u, r, l); a quad of lanes holds a row's 32 values.
// With kBlockMmaF16x2 the parts are f16 of x·2^−e and scales[u · rows + row] = 2^e. With
// kBlockMmaInt8 the one fragment is the lane's 8 int8 codes (values 4t .. 4t+3, then
// 16+4t .. 16+4t+3) and the scales of rows 8r + 2t and 8r + 2t + 1, as f32 bits.
// With a row map (MoE: kMapped) row r of the scratch is x's row row_map[r] / top_k, or
// row_map[r] itself with per_slot, and zeros where row_map[r] < 0.
struct SplitRowMap {
  const int32_t* rows = nullptr;
  int64_t top_k = 1;
  bool per_slot = false;
};

template <typename T, int kTerms, bool kMapped = false>
__global__ void __launch_bounds__(256)
    SplitXKernel(const T* __restrict__ x, int64_t m, int64_t k, uint4* __restrict__ frags,
                 float* __restrict__ sums, float* __restrict__ scales, bool vec_x,
                 SplitRowMap map) {
  constexpr int kP = kParts<kTerms>;
  AwaitPrerequisiteGrids();
  const int64_t tiles = PaddedRows(m) / 8, units = k / quant::kUnitElems;
  const int64_t entries = units * tiles * kWarpSize;  // whole warps
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < entries;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int l = static_cast<int>(e % kWarpSize);
    const int64_t tile = (e / kWarpSize) % tiles, u = e / (kWarpSize * tiles);
    const int64_t row = tile * 8 + l / 4;
    int64_t source = row < m ? row : -1;  // x's row, or none (zeros)
    if constexpr (kMapped) {
      if (source >= 0) {
        source = map.rows[row];
        if (source >= 0 && !map.per_slot) source /= map.top_k;
      }
    }
    float v[2][4] = {};
    if (source >= 0) {
#pragma unroll
      for (int step = 0; step < 2; ++step) {
        const T* p = x + source * k + u * quant::kUnitElems + 16 * step + 4 * (l % 4);
        if (vec_x) {
          LoadFloats<T, 4>(p, v[step]);
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) v[step][i] = ToFloat(p[i]);
        }
      }
    }
    if constexpr (kInt8Parts<kTerms>) {
      // The row's largest magnitude over the unit (the quad's 32 values), its scale
      // amax / 127 (NaN when a value is not finite, so that the row's sums are not), and
      // the codes rint(x · 127 / amax), within ±127.
      const float amax = QuadAbsMax(v);
      int finite = 1;
#pragma unroll
      for (int step = 0; step < 2; ++step) {
#pragma unroll
        for (int i = 0; i < 4; ++i) finite &= isfinite(v[step][i]) ? 1 : 0;
      }
      finite &= __shfl_xor_sync(kFullMask, finite, 1);
      finite &= __shfl_xor_sync(kFullMask, finite, 2);
      const float scale = finite ? amax / 127.0f : __int_as_float(0x7fc00000);
      const float inv = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
      uint32_t packed[2] = {0, 0};
      int code_sum = 0;
#pragma unroll
      for (int step = 0; step < 2; ++step) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int c = max(-127, min(127, __float2int_rn(v[step][i] * inv)));
          packed[step] |= (static_cast<uint32_t>(c) & 0xFFu) << (8 * i);
          code_sum += c;
        }
      }
      // The row's sum that the formats' mins multiply is the int8 x's (scale · Σ codes),
      // not x's own: the product is then exactly the weights' with x as rounded, whose
      // error is Σ w·δx; with x's own sum a min of the weights' whole range would multiply
      // Σ δx as well (2–4× the error on the Q4_1 and Q5_1 fixtures).
      code_sum += __shfl_xor_sync(kFullMask, code_sum, 1);
      code_sum += __shfl_xor_sync(kFullMask, code_sum, 2);
      if (l % 4 == 0) sums[u * tiles * 8 + row] = scale * static_cast<float>(code_sum);
      // The accumulator rows of lane l are 2t and 2t + 1 (t = l % 4): their scales are
      // those of quads 2t and 2t + 1, lanes 8t and 8t + 4.
      const float s0 = __shfl_sync(kFullMask, scale, 8 * (l % 4));
      const float s1 = __shfl_sync(kFullMask, scale, 8 * (l % 4) + 4);
      frags[(u * tiles + tile) * kWarpSize + l] =
          make_uint4(packed[0], packed[1], __float_as_uint(s0), __float_as_uint(s1));
    } else {
      uint32_t part[2][2][kP];
      if constexpr (kHalfParts<kTerms>) {
        // The row's largest magnitude over the unit (the quad's 32 values), and 2^−e for it.
        const float amax = QuadAbsMax(v);
        int e = 0;
        if (isfinite(amax)) (void)frexpf(amax, &e);  // an infinity or NaN stays one scaled
        e = max(min(e, 127), -126);
        const float inv = ldexpf(1.0f, -e);
#pragma unroll
        for (int step = 0; step < 2; ++step) {
          if constexpr (kP == 1) {  // kBlockMmaF16x1: the first part alone
            part[step][0][0] = Bits(__floats2half2_rn(v[step][0] * inv, v[step][1] * inv));
            part[step][1][0] = Bits(__floats2half2_rn(v[step][2] * inv, v[step][3] * inv));
          } else {
            SplitPairHalf(v[step][0] * inv, v[step][1] * inv, part[step][0]);
            SplitPairHalf(v[step][2] * inv, v[step][3] * inv, part[step][1]);
          }
        }
        if (l % 4 == 0) scales[u * tiles * 8 + row] = ldexpf(1.0f, e);
      } else {
#pragma unroll
        for (int step = 0; step < 2; ++step) {
          SplitPair<kTerms>(v[step][0], v[step][1], part[step][0]);
          SplitPair<kTerms>(v[step][2], v[step][3], part[step][1]);
        }
      }
#pragma unroll
      for (int q = 0; q < kP; ++q) {
        frags[((u * tiles + tile) * kP + q) * kWarpSize + l] =
            make_uint4(part[0][0][q], part[0][1][q], part[1][0][q], part[1][1][q]);
      }
    }
    if constexpr (!kInt8Parts<kTerms>) {
      // The row's sum: this lane's 8 values, then the quad's (same order in every quad).
      float sum = ((v[0][0] + v[0][1]) + (v[0][2] + v[0][3])) +
                  ((v[1][0] + v[1][1]) + (v[1][2] + v[1][3]));
      sum += __shfl_xor_sync(kFullMask, sum, 1);
      sum += __shfl_xor_sync(kFullMask, sum, 2);
      if (l % 4 == 0) sums[u * tiles * 8 + row] = sum;
    }
  }
}

// A warp's columns in a launch of `cols` columns a block: the block's weight, the product
// columns before it, and for column tile c the first column col_a[c] (A-fragment row g;
// col_a[c] + 8 is row g + 8) and the first units of both in the weight.
template <int kColTiles>
struct WarpColumns {
  int64_t before = 0, n = 0, units = 0, w_blocks = 0;
  const uint8_t* w = nullptr;
  int64_t col_a[kColTiles], first_a[kColTiles], first_b[kColTiles];
};

// The block's weight and this warp's columns: block column cb of the launch, warp column
// tile warp_col (kColTiles tiles of 16 columns each a warp).
template <typename Q, int kColTiles>
__device__ __forceinline__ WarpColumns<kColTiles> ColumnsOf(const BlockMmaArgs& a,
                                                            int64_t cols, int warp_col,
                                                            int g) {
  WarpColumns<kColTiles> wc;
  int64_t cb = blockIdx.x;
  int wi = 0;
  for (; wi + 1 < a.weights; ++wi) {
    const int64_t blocks = CeilDiv(a.n[wi], cols);
    if (cb < blocks) break;
    cb -= blocks;
    wc.before += a.n[wi];
  }
  wc.n = a.n[wi];
  wc.w = static_cast<const uint8_t*>(a.w[wi]);
  wc.units = a.k / quant::kUnitElems;
  wc.w_blocks = wc.n * (a.k / Q::kElems);
#pragma unroll
  for (int c = 0; c < kColTiles; ++c) {
    wc.col_a[c] = cb * cols + (warp_col * kColTiles + c) * 16 + g;
    // A column past n reads the last one again and is discarded.
    wc.first_a[c] = std::min<int64_t>(wc.col_a[c], wc.n - 1) * wc.units;
    wc.first_b[c] = std::min<int64_t>(wc.col_a[c] + 8, wc.n - 1) * wc.units;
  }
  return wc;
}

// One unit of a warp's columns, ready for the MMAs: the A fragments (rows g: column a,
// g + 8: column b; slots 2t.. and 2t+8..), scales (sa1/sb1: Q6_K's second half) and mins.
template <int kColTiles>
struct UnitFragments {
  uint32_t frag[kColTiles][2][4];
  float sa0[kColTiles], sb0[kColTiles], sa1[kColTiles], sb1[kColTiles];
  float ma[kColTiles], mb[kColTiles];
};

// With kBlockMmaInt8 frag[c][0] is the int8 MMA's A fragment (signed codes: rows g, g + 8
// of values 4t.., then of 16+4t..) and frag[c][1] is not used.
template <typename Q, int kColTiles, int kTerms>
__device__ __forceinline__ void DecodeUnit(const typename Q::Unit (&wa)[kColTiles],
                                           const typename Q::Unit (&wb)[kColTiles], int t,
                                           UnitFragments<kColTiles>& f) {
#pragma unroll
  for (int c = 0; c < kColTiles; ++c) {
    if constexpr (kInt8Parts<kTerms>) {
      uint32_t a_lo, a_hi, b_lo, b_hi;
      wa[c].QuadCodes(t, a_lo, a_hi);
      wb[c].QuadCodes(t, b_lo, b_hi);
      constexpr int kBias = Q::Unit::kCodeBias;
      f.frag[c][0][0] = SignedCodes<kBias>(a_lo);
      f.frag[c][0][1] = SignedCodes<kBias>(b_lo);
      f.frag[c][0][2] = SignedCodes<kBias>(a_hi);
      f.frag[c][0][3] = SignedCodes<kBias>(b_hi);
    } else {
      uint32_t pa[2][2], pb[2][2];
      ColumnPairs<Q, kHalfParts<kTerms>>(wa[c], t, pa);
      ColumnPairs<Q, kHalfParts<kTerms>>(wb[c], t, pb);
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        f.frag[c][s][0] = pa[s][0];
        f.frag[c][s][1] = pb[s][0];
        f.frag[c][s][2] = pa[s][1];
        f.frag[c][s][3] = pb[s][1];
      }
    }
    f.sa0[c] = wa[c].Scale(0);
    f.sb0[c] = wb[c].Scale(0);
    f.sa1[c] = wa[c].Scale(2);
    f.sb1[c] = wb[c].Scale(2);
    if constexpr (Q::Unit::kHasMin) {
      f.ma[c] = wa[c].Min(0);
      f.mb[c] = wb[c].Min(0);
    }
  }
}

// acc[c] += one unit's products for one row tile: x's parts b (both k16 steps) times the
// unit's codes, summed over the parts, scaled, plus min · Σx (x0, x1: rows 2t, 2t + 1).
// With kBlockMmaF16x2 the parts' sums are of x·2^−e: times xs0, xs1 = 2^e of rows 2t and
// 2t + 1 (exact) before the weights' scale. With kBlockMmaInt8 one int8 MMA a unit (two of
// 16 values for Q6_K's halves) gives the integer sums, times the rows' scales that the
// fragment carries (xs0, xs1 are not used).
template <typename Q, int kColTiles, int kTerms>
__device__ __forceinline__ void MultiplyTile(const UnitFragments<kColTiles>& f,
                                             const uint4 (&b)[kParts<kTerms>], float x0,
                                             float x1, float xs0, float xs1,
                                             float (&acc)[kColTiles][4]) {
  constexpr bool kHalves = std::is_same_v<Q, quant::Format<DType::kQ6_K>>;
  constexpr int kP = kParts<kTerms>;
  constexpr bool kHalf = kHalfParts<kTerms>;
#pragma unroll
  for (int c = 0; c < kColTiles; ++c) {
    float s0[4], s1[4];
    if constexpr (kInt8Parts<kTerms>) {
      // The integer sums start at the bits of 1.5·2^23: a sum below 2^22 in magnitude (at
      // most 32 · 128 · 127 here) leaves the exponent alone, so the bits read as a float
      // are 1.5·2^23 + sum exactly and one subtraction gives it, where a conversion would
      // run at an eighth of the float rate.
      constexpr int kMagicBits = 0x4B400000;
      constexpr float kMagic = 12582912.0f;
      int d0[4] = {kMagicBits, kMagicBits, kMagicBits, kMagicBits};
      int d1[4] = {kMagicBits, kMagicBits, kMagicBits, kMagicBits};
      const uint32_t (&a)[4] = f.frag[c][0];
      if constexpr (kHalves) {
        MmaS8Half(d0, a[0], a[1], b[0].x);
        MmaS8Half(d1, a[2], a[3], b[0].y);
      } else {
        MmaS8(d0, a, b[0].x, b[0].y);
      }
      const float r0 = __uint_as_float(b[0].z), r1 = __uint_as_float(b[0].w);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float xs = (j & 1) ? r1 : r0;  // elements 0, 2: row 2t; 1, 3: row 2t + 1
        s0[j] = (__int_as_float(d0[j]) - kMagic) * xs;
        s1[j] = (__int_as_float(d1[j]) - kMagic) * xs;
      }
    } else {
      // One accumulator per part, so that the parts' MMAs do not wait on each other.
      float d0[kP][4], d1[kP][4];
#pragma unroll
      for (int q = 0; q < kP; ++q) {
#pragma unroll
        for (int j = 0; j < 4; ++j) d0[q][j] = d1[q][j] = 0.0f;
        Mma<kHalf>(d0[q], f.frag[c][0], make_uint2(b[q].x, b[q].y));
        Mma<kHalf>(kHalves ? d1[q] : d0[q], f.frag[c][1], make_uint2(b[q].z, b[q].w));
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // The parts from the smallest up (3 parts: exact as long as the sums are).
        s0[j] = d0[kP - 1][j];
        s1[j] = d1[kP - 1][j];
#pragma unroll
        for (int q = kP - 2; q >= 0; --q) {
          s0[j] += d0[q][j];
          s1[j] += d1[q][j];
        }
        if constexpr (kHalf) {
          const float xs = (j & 1) ? xs1 : xs0;  // elements 0, 2: row 2t; 1, 3: row 2t + 1
          s0[j] *= xs;
          s1[j] *= xs;
        }
      }
    }
    float* o = acc[c];
    o[0] = fmaf(f.sa0[c], s0[0], o[0]);
    o[1] = fmaf(f.sa0[c], s0[1], o[1]);
    o[2] = fmaf(f.sb0[c], s0[2], o[2]);
    o[3] = fmaf(f.sb0[c], s0[3], o[3]);
    if constexpr (kHalves) {
      o[0] = fmaf(f.sa1[c], s1[0], o[0]);
      o[1] = fmaf(f.sa1[c], s1[1], o[1]);
      o[2] = fmaf(f.sb1[c], s1[2], o[2]);
      o[3] = fmaf(f.sb1[c], s1[3], o[3]);
    }
    if constexpr (Q::Unit::kHasMin) {
      o[0] = fmaf(f.ma[c], x0, o[0]);
      o[1] = fmaf(f.ma[c], x1, o[1]);
      o[2] = fmaf(f.mb[c], x0, o[2]);
      o[3] = fmaf(f.mb[c], x1, o[3]);
    }
  }
}

// A row tile's sums: acc[c] holds columns a (0, 1) and b (2, 3) of rows tile·8 + 2t (0, 2)
// and + 1 (1, 3); to the split's partial sums, or with y and one split to y (+ bias).
template <typename T, int kColTiles>
__device__ __forceinline__ void StoreTile(const BlockMmaArgs& a,
                                          const WarpColumns<kColTiles>& wc, int64_t tile,
                                          int t, int split,
                                          const float (&acc)[kColTiles][4]) {
  const bool direct = a.y != nullptr && a.splits == 1;
  const T* bias = static_cast<const T*>(a.bias);
#pragma unroll
  for (int c = 0; c < kColTiles; ++c) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t row = tile * 8 + 2 * t + (j & 1);
      const int64_t col = j < 2 ? wc.col_a[c] : wc.col_a[c] + 8;
      if (row >= a.m || col >= wc.n) continue;
      const int64_t out = a.col0 + wc.before + col;
      if (!direct) {
        a.partials[(split * a.m + row) * a.ld + out] = acc[c][j];
      } else {
        float v = acc[c][j];
        if (bias != nullptr) v += ToFloat(bias[wc.before + col]);
        static_cast<T*>(a.y)[row * a.ld + out] = FromFloat<T>(v);
      }
    }
  }
}

// A warp's products over units [u0, u1) for row tiles tile0 .. tile0 + kRowTiles (those
// below `tile_end`, at most `tiles`, the scratch's row tiles: the others are neither read
// nor multiplied and their acc stays as it was) and kColTiles column tiles, added to acc:
// load_w(u, wa, wb) loads unit u of the columns of A rows g (wa) and g + 8 (wb). Each
// unit's codes are decoded once for the row tiles, the next unit's weights (and x's
// fragments with kXAhead, else each row tile's just before its MMAs, from L1: a block's
// warps read the same ones) in flight while this one's are multiplied.
template <typename Q, int kRowTiles, int kColTiles, int kTerms, bool kXAhead, typename LoadW>
__device__ __forceinline__ void MultiplyUnits(LoadW&& load_w, const uint4* __restrict__ frags,
                                              const float* __restrict__ sums,
                                              const float* __restrict__ scales, int64_t tiles,
                                              int64_t tile_end, int64_t tile0, int64_t u0,
                                              int64_t u1,
                                              float (&acc)[kRowTiles][kColTiles][4]) {
  using Unit = typename Q::Unit;
  constexpr int kP = kParts<kTerms>;
  constexpr bool kHalf = kHalfParts<kTerms>;
  const int lane = threadIdx.x % kWarpSize, t = lane % 4;
  const int64_t rows = tiles * 8;  // rows of the sums
  // x's fragments of unit u and row tile `tile` of the block (zeros from tile_end on).
  auto load_tile = [&](int64_t u, int tile, uint4 (&b)[kP]) {
#pragma unroll
    for (int q = 0; q < kP; ++q) {
      b[q] = tile0 + tile < tile_end
                 ? frags[((u * tiles + tile0 + tile) * kP + q) * kWarpSize + lane]
                 : make_uint4(0, 0, 0, 0);
    }
  };
  Unit next_a[kColTiles], next_b[kColTiles];
  uint4 next_x[kXAhead ? kRowTiles : 1][kP];
  auto load_unit = [&](int64_t u) {
    load_w(u, next_a, next_b);
    if constexpr (kXAhead) {
#pragma unroll
      for (int tile = 0; tile < kRowTiles; ++tile) load_tile(u, tile, next_x[tile]);
    }
  };
  if (u0 < u1) load_unit(u0);
  for (int64_t u = u0; u < u1; ++u) {
    // This unit's fragments, before the next unit's loads take the registers.
    UnitFragments<kColTiles> f;
    DecodeUnit<Q, kColTiles, kTerms>(next_a, next_b, t, f);
    uint4 x_now[kXAhead ? kRowTiles : 1][kP];
    if constexpr (kXAhead) {
#pragma unroll
      for (int tile = 0; tile < kRowTiles; ++tile) {
#pragma unroll
        for (int q = 0; q < kP; ++q) x_now[tile][q] = next_x[tile][q];
      }
    }
    // The next unit's weights (and x) fly while this one is multiplied.
    if (u + 1 < u1) load_unit(u + 1);
#pragma unroll
    for (int tile = 0; tile < kRowTiles; ++tile) {
      if (tile0 + tile >= tile_end) break;  // past m, or a MoE tile's empty row groups
      uint4 b[kP];
      if constexpr (kXAhead) {
#pragma unroll
        for (int q = 0; q < kP; ++q) b[q] = x_now[tile][q];
      } else {
        load_tile(u, tile, b);
      }
      const int64_t r = (tile0 + tile) * 8 + 2 * t;  // a tile within `tiles`
      float x0 = 0.0f, x1 = 0.0f, xs0 = 1.0f, xs1 = 1.0f;
      if constexpr (Unit::kHasMin) {
        x0 = sums[u * rows + r];
        x1 = sums[u * rows + r + 1];
      }
      if constexpr (kHalf) {
        xs0 = scales[u * rows + r];
        xs1 = scales[u * rows + r + 1];
      }
      MultiplyTile<Q, kColTiles, kTerms>(f, b, x0, x1, xs0, xs1, acc[tile]);
    }
  }
}

// The units [u0, u1) of split blockIdx.y.
__device__ __forceinline__ void SplitUnits(const BlockMmaArgs& a, int64_t units, int64_t& u0,
                                           int64_t& u1) {
  const int64_t per_split = CeilDiv(units, a.splits);
  u0 = static_cast<int64_t>(blockIdx.y) * per_split;
  u1 = std::min<int64_t>(units, u0 + per_split);
}

template <typename T, typename Q, int kRowTiles, int kColTiles, int kTerms>
__global__ void __launch_bounds__(kThreads)
    BlockMmaKernel(BlockMmaArgs a, const uint4* __restrict__ frags,
                   const float* __restrict__ sums, const float* __restrict__ scales) {
  using Unit = typename Q::Unit;
  constexpr int64_t kCols = kBlockMmaCols * kColTiles;
  // x's fragments of a whole unit are loaded a unit ahead with the weights when they are
  // few; the prefill shape loads each row tile's just before its MMAs, or its registers
  // would not fit.
  constexpr bool kXAhead = kRowTiles <= 4;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const WarpColumns<kColTiles> wc = ColumnsOf<Q, kColTiles>(a, kCols, warp, g);
  int64_t u0, u1;
  SplitUnits(a, wc.units, u0, u1);
  const int64_t tiles = PaddedRows(a.m) / 8;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.z) * kRowTiles;
  AwaitPrerequisiteGrids();
  float acc[kRowTiles][kColTiles][4] = {};
  MultiplyUnits<Q, kRowTiles, kColTiles, kTerms, kXAhead>(
      [&](int64_t u, Unit (&wa)[kColTiles], Unit (&wb)[kColTiles]) {
#pragma unroll
        for (int c = 0; c < kColTiles; ++c) {
          wa[c] = Q::Load(wc.w, wc.w_blocks, wc.first_a[c] + u);
          wb[c] = Q::Load(wc.w, wc.w_blocks, wc.first_b[c] + u);
        }
      },
      frags, sums, scales, tiles, tiles, tile0, u0, u1, acc);
#pragma unroll
  for (int tile = 0; tile < kRowTiles; ++tile) {
    StoreTile<T>(a, wc, tile0 + tile, t, static_cast<int>(blockIdx.y), acc[tile]);
  }
}

// ---- the staged shape: x through shared memory -----------------------------------------
// Eight warps as 2 (row halves of 64) × 4 (column quarters of 32) over 128 columns × 128
// rows. A unit's x fragments for the block's 16 row tiles (and its rows' sums) are copied
// into shared memory by cp.async, kStages units in flight, so that each fragment leaves
// global memory once per block and reaches its four column warps by LDS.128; each warp
// decodes the units of its 32 columns once for its 64 rows, its weights a unit ahead in
// registers as in the other shapes. One block an SM (its 64 accumulators a lane and the
// stages take it).
constexpr int kStagedWarpRows = 2, kStagedWarpCols = 4;
constexpr int kStagedThreads = kStagedWarpRows * kStagedWarpCols * kWarpSize;
constexpr int kStagedWarpRowTiles = 8;  // a warp's row tiles of 8
constexpr int kStagedRowTiles = kStagedWarpRows * kStagedWarpRowTiles;  // a block's
constexpr int kStagedColTiles = 2;  // a warp's column tiles of 16
constexpr int64_t kStagedCols = kStagedWarpCols * kStagedColTiles * 16;
constexpr int kStages = 3;

template <int kTerms>
constexpr int StagedEntries() {  // 16-byte fragments of one unit for the block's rows
  return kStagedRowTiles * kParts<kTerms> * kWarpSize;
}
// A stage: the unit's fragments, its rows' sums and (scaled f16 parts) their scales.
template <int kTerms>
constexpr size_t StagedSmemBytes() {
  return kStages * (StagedEntries<kTerms>() * size_t{16} +
                    (kHalfParts<kTerms> ? 2 : 1) * kStagedRowTiles * 8 * sizeof(float));
}

template <typename T, typename Q, int kTerms>
__global__ void __launch_bounds__(kStagedThreads, 1)
    BlockMmaStagedKernel(BlockMmaArgs a, const uint4* __restrict__ frags,
                         const float* __restrict__ sums, const float* __restrict__ scales) {
  using Unit = typename Q::Unit;
  constexpr int kP = kParts<kTerms>;
  constexpr bool kHalf = kHalfParts<kTerms>;
  constexpr int kEntries = StagedEntries<kTerms>();
  constexpr int kRowsStaged = kStagedRowTiles * 8;
  extern __shared__ uint4 staged[];
  uint4* x_stage = staged;                                                     // [kStages][kEntries]
  float* sum_stage = reinterpret_cast<float*>(staged + kStages * kEntries);  // [kStages][128]
  float* scale_stage = sum_stage + kStages * kRowsStaged;  // [kStages][128], kHalf only
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int warp_row = warp / kStagedWarpCols, warp_col = warp % kStagedWarpCols;
  const WarpColumns<kStagedColTiles> wc =
      ColumnsOf<Q, kStagedColTiles>(a, kStagedCols, warp_col, g);
  int64_t u0, u1;
  SplitUnits(a, wc.units, u0, u1);
  const int64_t tiles = PaddedRows(a.m) / 8, rows = tiles * 8;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.z) * kStagedRowTiles;
  const int64_t valid = std::min<int64_t>(kStagedRowTiles, tiles - tile0) * kP * kWarpSize;
  AwaitPrerequisiteGrids();
  // Unit u's fragments of the block's row tiles (zeros past the last) into stage s.
  auto stage = [&](int64_t u, int s) {
    const uint4* from = frags + (u * tiles + tile0) * kP * kWarpSize;
    uint4* to = x_stage + s * kEntries;
    for (int e = static_cast<int>(threadIdx.x); e < kEntries; e += kStagedThreads) {
      CopyAsync16(to + e, e < valid ? from + e : frags, e < valid);
    }
    if constexpr (Unit::kHasMin) {
      if (threadIdx.x < kRowsStaged / 4) {
        const int64_t r = tile0 * 8 + 4 * threadIdx.x;
        CopyAsync16(sum_stage + s * kRowsStaged + 4 * threadIdx.x,
                    r < rows ? sums + u * rows + r : sums, r < rows);
      }
    }
    if constexpr (kHalf) {
      const int i = static_cast<int>(threadIdx.x) - kRowsStaged / 4;  // other threads
      if (i >= 0 && i < kRowsStaged / 4) {
        const int64_t r = tile0 * 8 + 4 * i;
        CopyAsync16(scale_stage + s * kRowsStaged + 4 * i,
                    r < rows ? scales + u * rows + r : scales, r < rows);
      }
    }
  };
  const int64_t count = u1 - u0;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < count) stage(u0 + s, s);
    CommitCopies();
  }
  Unit next_a[kStagedColTiles], next_b[kStagedColTiles];
  auto load_unit = [&](int64_t u) {
#pragma unroll
    for (int c = 0; c < kStagedColTiles; ++c) {
      next_a[c] = Q::Load(wc.w, wc.w_blocks, wc.first_a[c] + u);
      next_b[c] = Q::Load(wc.w, wc.w_blocks, wc.first_b[c] + u);
    }
  };
  if (count > 0) load_unit(u0);

  float acc[kStagedWarpRowTiles][kStagedColTiles][4] = {};
  int now = 0;  // the stage of unit u0 + i
  for (int64_t i = 0; i < count; ++i) {
    // Unit i's copies (this thread's) are in; the barrier makes everyone's visible and
    // frees the stage unit i − 1 used, which the copies of unit i + kStages − 1 take.
    AwaitCopies<kStages - 2>();
    __syncthreads();
    const int later = now == 0 ? kStages - 1 : now - 1;
    if (i + kStages - 1 < count) stage(u0 + i + kStages - 1, later);
    CommitCopies();
    UnitFragments<kStagedColTiles> f;
    DecodeUnit<Q, kStagedColTiles, kTerms>(next_a, next_b, t, f);
    if (i + 1 < count) load_unit(u0 + i + 1);
    const uint4* xs = x_stage + now * kEntries;
    const float* ss = sum_stage + now * kRowsStaged;
    const float* sc = scale_stage + now * kRowsStaged;
#pragma unroll
    for (int tile = 0; tile < kStagedWarpRowTiles; ++tile) {
      const int bt = warp_row * kStagedWarpRowTiles + tile;  // the block's row tile
      if (tile0 + bt >= tiles) break;
      uint4 b[kP];
#pragma unroll
      for (int q = 0; q < kP; ++q) b[q] = xs[(bt * kP + q) * kWarpSize + lane];
      float x0 = 0.0f, x1 = 0.0f, xs0 = 1.0f, xs1 = 1.0f;
      if constexpr (Unit::kHasMin) {
        x0 = ss[bt * 8 + 2 * t];
        x1 = ss[bt * 8 + 2 * t + 1];
      }
      if constexpr (kHalf) {
        xs0 = sc[bt * 8 + 2 * t];
        xs1 = sc[bt * 8 + 2 * t + 1];
      }
      MultiplyTile<Q, kStagedColTiles, kTerms>(f, b, x0, x1, xs0, xs1, acc[tile]);
    }
    now = now + 1 == kStages ? 0 : now + 1;
  }
  AwaitCopies<0>();
#pragma unroll
  for (int tile = 0; tile < kStagedWarpRowTiles; ++tile) {
    StoreTile<T>(a, wc, tile0 + warp_row * kStagedWarpRowTiles + tile, t,
                 static_cast<int>(blockIdx.y), acc[tile]);
  }
}

// y = the splits' partial sums added in split order, + bias, rounded to T.
template <typename T>
__global__ void __launch_bounds__(256)
    SumSplitsKernel(BlockMmaArgs a, int64_t n_total) {
  AwaitPrerequisiteGrids();
  const int64_t cells = a.m * n_total;
  const T* bias = static_cast<const T*>(a.bias);
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < cells;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = e / n_total, col = e % n_total;
    const int64_t at = row * a.ld + a.col0 + col;
    float v = 0.0f;
    for (int s = 0; s < a.splits; ++s) v += a.partials[s * a.m * a.ld + at];
    if (bias != nullptr) v += ToFloat(bias[col]);
    static_cast<T*>(a.y)[at] = FromFloat<T>(v);
  }
}

// The shape a launch of m rows of a w_dtype weight takes (never kAuto; kAuto resolves by
// rows and format alone, never to the staged shape: BlockMmaWorkspaceFor chooses that).
BlockMmaShape ShapeFor(int64_t m, DType w_dtype, BlockMmaShape shape) {
  if (shape != BlockMmaShape::kAuto) return shape;
  if (m >= kBlockMmaPrefillMinRows && (w_dtype == DType::kQ4_K || w_dtype == DType::kQ5_K)) {
    return BlockMmaShape::kPrefill;
  }
  return BlockMmaShape::kDecode;
}

// ---- MoeMatMul's experts (LaunchMoeBlockMma) -------------------------------------------
// MoeSortKernel (one block) lists the step's (row, slot) pairs by expert: each expert's
// segment starts at a multiple of kMoeBlockMmaRows, row_pair[r] is the pair of sorted row r
// (−1 for padding) and tile_expert[t] the expert of rows 32t .. 32t + 31 (−1 past the last
// segment); a pair whose id is out of range gets zeros and the error flag. SplitXKernel
// then reads x through row_pair, and MoeBlockMmaKernel multiplies each tile of 32 sorted
// rows by its expert's matrix as BlockMmaKernel multiplies a tile by a weight (the same
// fragments, units and sums), storing each row to its pair. Gated (gate and up experts
// with silu): a column tile's A rows g and g + 8 are the gate and the up rows of one
// output column, so each lane holds both products of its column and applies the epilogue
// itself. Every launch's grid depends on the shapes only: the sort reads the ids.
constexpr int kMoeSortThreads = 1024;
constexpr int kMoeRowTiles = static_cast<int>(kMoeBlockMmaRows / 8);
constexpr int kMoeColTiles = 2;

// Sorted rows a launch may use: every pair, plus up to kMoeBlockMmaRows − 1 of padding per
// expert, in whole segments.
int64_t MoeSortedRows(int64_t pairs, int64_t experts) {
  return CeilDiv(pairs + experts * (kMoeBlockMmaRows - 1), kMoeBlockMmaRows) *
         kMoeBlockMmaRows;
}

template <typename T>
__global__ void __launch_bounds__(kMoeSortThreads)
    MoeSortKernel(const int32_t* __restrict__ ids, int64_t pairs, int experts,
                  int64_t sorted_rows, int32_t* __restrict__ row_pair,
                  int32_t* __restrict__ tile_expert, T* __restrict__ y, int64_t n,
                  uint32_t* error_flags) {
  __shared__ int counts[kMoeBlockMmaMaxExperts];
  __shared__ int starts[kMoeBlockMmaMaxExperts + 1];
  __shared__ int bad;
  AwaitPrerequisiteGrids();
  const int tid = static_cast<int>(threadIdx.x);
  for (int e = tid; e < experts; e += kMoeSortThreads) counts[e] = 0;
  if (tid == 0) bad = 0;
  for (int64_t r = tid; r < sorted_rows; r += kMoeSortThreads) row_pair[r] = -1;
  __syncthreads();
  for (int64_t p = tid; p < pairs; p += kMoeSortThreads) {
    const int32_t e = ids[p];
    if (e >= 0 && e < experts) {
      atomicAdd(&counts[e], 1);
    } else {
      bad = 1;
    }
  }
  __syncthreads();
  if (bad != 0) {
    // Out-of-range ids (an error path): their pairs' outputs are zeros, written by the
    // whole block, and the flag is raised once.
    for (int64_t i = tid; i < pairs * n; i += kMoeSortThreads) {
      const int32_t e = ids[i / n];
      if (e < 0 || e >= experts) y[i] = FromFloat<T>(0.0f);
    }
    if (tid == 0 && error_flags != nullptr) {
      atomicOr(error_flags, static_cast<uint32_t>(kErrorExpertOutOfRange));
    }
  }
  if (tid == 0) {
    int start = 0;
    for (int e = 0; e < experts; ++e) {
      starts[e] = start;
      start += (counts[e] + static_cast<int>(kMoeBlockMmaRows) - 1) /
               static_cast<int>(kMoeBlockMmaRows) * static_cast<int>(kMoeBlockMmaRows);
      counts[e] = 0;  // now each segment's cursor
    }
    starts[experts] = start;
  }
  __syncthreads();
  const int64_t tiles = sorted_rows / kMoeBlockMmaRows;
  for (int64_t t = tid; t < tiles; t += kMoeSortThreads) {
    const int64_t r = t * kMoeBlockMmaRows;
    int expert = -1;
    if (r < starts[experts]) {
      // The last expert whose segment starts at or before r (empty segments start where
      // the next one does, so it is the one holding r).
      int lo = 0, hi = experts - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (starts[mid] <= r) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      expert = lo;
    }
    tile_expert[t] = expert;
  }
  for (int64_t p = tid; p < pairs; p += kMoeSortThreads) {
    const int32_t e = ids[p];
    if (e >= 0 && e < experts) row_pair[starts[e] + atomicAdd(&counts[e], 1)] = static_cast<int32_t>(p);
  }
}

struct MoeKernelArgs {
  const uint8_t* w = nullptr;
  const uint8_t* w_up = nullptr;
  int64_t experts = 0, n = 0, k = 0, sorted_rows = 0;
  void* y = nullptr;
};

// One tile of 32 sorted rows (blockIdx.z) of one expert times kMoeColTiles column tiles a
// warp: 128 output columns a block, or gated 64 (each column tile 8 columns' gate and up).
template <typename T, typename Q, int kTerms, bool kGated>
__global__ void __launch_bounds__(kThreads)
    MoeBlockMmaKernel(MoeKernelArgs a, const uint4* __restrict__ frags,
                      const float* __restrict__ sums, const float* __restrict__ scales,
                      const int32_t* __restrict__ row_pair,
                      const int32_t* __restrict__ tile_expert) {
  using Unit = typename Q::Unit;
  constexpr int kP = kParts<kTerms>;
  constexpr int kRowTiles = kMoeRowTiles, kColTiles = kMoeColTiles;
  constexpr int64_t kTileCols = kGated ? 8 : 16;  // output columns of a column tile
  constexpr int64_t kCols = kWarps * kColTiles * kTileCols;
  AwaitPrerequisiteGrids();
  const int expert = tile_expert[blockIdx.z];
  if (expert < 0) return;  // past the last segment
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int64_t units = a.k / quant::kUnitElems;
  const int64_t w_blocks = a.experts * a.n * (a.k / Q::kElems);
  const uint8_t* w_b = kGated ? a.w_up : a.w;
  // Column tile c: A row g is output column col_a[c] (gated: its gate row), row g + 8
  // column col_a[c] + 8 (gated: the up row of col_a[c]); a column past n reads the last
  // one again and is not stored.
  int64_t col_a[kColTiles], first_a[kColTiles], first_b[kColTiles];
#pragma unroll
  for (int c = 0; c < kColTiles; ++c) {
    col_a[c] = static_cast<int64_t>(blockIdx.x) * kCols + (warp * kColTiles + c) * kTileCols + g;
    const int64_t row0 = static_cast<int64_t>(expert) * a.n;
    first_a[c] = (row0 + std::min<int64_t>(col_a[c], a.n - 1)) * units;
    first_b[c] = (row0 + std::min<int64_t>(kGated ? col_a[c] : col_a[c] + 8, a.n - 1)) * units;
  }
  const int64_t tile0 = static_cast<int64_t>(blockIdx.z) * kRowTiles;
  // A segment's rows are filled from its start, so a tile's pairs are a prefix of its rows:
  // its row tiles of 8 up to the first whose first row is padding hold every pair (a tile
  // of an expert with 2 pairs multiplies one row tile, not four).
  int live = 0;
#pragma unroll
  for (int tile = 0; tile < kRowTiles; ++tile) live += row_pair[(tile0 + tile) * 8] >= 0;
  // x's fragments go a unit ahead with the weights' loads where they are one part (int8,
  // bf16); more parts load each row tile's just before its MMAs, or the registers would
  // not fit (two column tiles a warp).
  float acc[kRowTiles][kColTiles][4] = {};
  MultiplyUnits<Q, kRowTiles, kColTiles, kTerms, kP == 1>(
      [&](int64_t u, Unit (&wa)[kColTiles], Unit (&wb)[kColTiles]) {
#pragma unroll
        for (int c = 0; c < kColTiles; ++c) {
          wa[c] = Q::Load(a.w, w_blocks, first_a[c] + u);
          wb[c] = Q::Load(w_b, w_blocks, first_b[c] + u);
        }
      },
      frags, sums, scales, a.sorted_rows / 8, tile0 + live, tile0, 0, units, acc);
  T* y = static_cast<T*>(a.y);
#pragma unroll
  for (int tile = 0; tile < kRowTiles; ++tile) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // rows 2t and 2t + 1 of the tile
      const int32_t pair = row_pair[(tile0 + tile) * 8 + 2 * t + i];
      if (pair < 0) continue;  // padding
      T* out = y + static_cast<int64_t>(pair) * a.n;
#pragma unroll
      for (int c = 0; c < kColTiles; ++c) {
        if constexpr (kGated) {
          // The gate and up products, each rounded to T first (ops::MoeMatMul's silu_mul).
          if (col_a[c] < a.n) {
            out[col_a[c]] = FromFloat<T>(Silu(RoundTo<T>(acc[tile][c][i])) *
                                         RoundTo<T>(acc[tile][c][2 + i]));
          }
        } else {
          if (col_a[c] < a.n) out[col_a[c]] = FromFloat<T>(acc[tile][c][i]);
          if (col_a[c] + 8 < a.n) out[col_a[c] + 8] = FromFloat<T>(acc[tile][c][2 + i]);
        }
      }
    }
  }
}

// The block shape for `tiles` tiles of 8 rows: f(row tiles, column tiles a warp) with 1,
// 2 or 4 row tiles and one column tile (decode), or 8 and 2 (prefill); more rows: more
// blocks along z.
template <typename F>
cudaError_t DispatchShape(int64_t tiles, bool prefill, F&& f) {
  using One = std::integral_constant<int, 1>;
  if (prefill) {
    return f(std::integral_constant<int, kPrefillRowTiles>{}, std::integral_constant<int, 2>{});
  }
  if (tiles <= 1) return f(One{}, One{});
  if (tiles <= 2) return f(std::integral_constant<int, 2>{}, One{});
  return f(std::integral_constant<int, kDecodeRowTiles>{}, One{});
}

// The kernel's (activation type, parts) pairs: f32 x in 1, 2 or 3 parts, two scaled f16
// parts or int8, bf16 in 1, f16 in 2.
template <typename T, typename F>
cudaError_t DispatchTerms(int terms, F&& f) {
  if constexpr (std::is_same_v<T, float>) {
    if (terms == 1) return f(std::integral_constant<int, 1>{});
    if (terms == 2) return f(std::integral_constant<int, 2>{});
    if (terms == kBlockMmaF16x2) return f(std::integral_constant<int, kBlockMmaF16x2>{});
    if (terms == kBlockMmaF16x1) return f(std::integral_constant<int, kBlockMmaF16x1>{});
    if (terms == kBlockMmaInt8) return f(std::integral_constant<int, kBlockMmaInt8>{});
    return f(std::integral_constant<int, 3>{});
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return f(std::integral_constant<int, 1>{});
  } else {
    return f(std::integral_constant<int, 2>{});
  }
}

// The most splits of K: each at least 4 units, at most 16.
int64_t MostSplits(int64_t k) {
  return std::clamp<int64_t>(k / (4 * quant::kUnitElems), 1, 16);
}

// The staged shape's split-K factor for `blocks` blocks on `sms` SMs: as many as fit in one
// wave of one block an SM, 1 from a wave on.
int StagedSplits(int64_t blocks, int64_t k, int sms) {
  if (blocks >= sms) return 1;
  return static_cast<int>(
      std::clamp<int64_t>(sms / std::max<int64_t>(blocks, 1), 1, MostSplits(k)));
}

}  // namespace

int BlockMmaTerms(DType x_dtype, int f32_terms) {
  if (x_dtype == DType::kBF16) return 1;
  if (x_dtype == DType::kF16) return 2;
  if (f32_terms == kBlockMmaF16x2 || f32_terms == kBlockMmaF16x1 || f32_terms == kBlockMmaInt8) {
    return f32_terms;
  }
  return std::clamp(f32_terms, 1, 3);
}

int BlockMmaSplitsFor(int64_t column_blocks, int64_t k, int sm_count, int blocks_per_sm) {
  // Each warp walks its units one after the other, a unit's loads in flight while the one
  // before is multiplied: latency hides behind other warps, so the launch wants several
  // blocks per SM.
  const int64_t want = CeilDiv(std::max(blocks_per_sm, 1) * static_cast<int64_t>(std::max(sm_count, 1)),
                               std::max<int64_t>(column_blocks, 1));
  return static_cast<int>(std::clamp<int64_t>(want, 1, MostSplits(k)));
}

BlockMmaTile BlockMmaTileFor(int64_t m, DType w_dtype, BlockMmaShape shape) {
  switch (ShapeFor(m, w_dtype, shape)) {
    case BlockMmaShape::kStaged: return {kStagedCols, 8 * kStagedRowTiles, 1};
    case BlockMmaShape::kPrefill: return {2 * kBlockMmaCols, 8 * kPrefillRowTiles, 2};
    default: return {kBlockMmaCols, 8 * kDecodeRowTiles, 4};
  }
}

int64_t BlockMmaColumnBlocks(const int64_t* n, int weights, int64_t cols) {
  int64_t blocks = 0;
  for (int g = 0; g < weights; ++g) blocks += CeilDiv(n[g], cols);
  return blocks;
}

bool BlockMmaWorkspaceFor(int64_t m, int64_t k, const int64_t* n, int weights, DType w_dtype,
                          int terms, int sm_count, bool keep_partials, BlockMmaWorkspace* out,
                          BlockMmaShape shape) {
  if (m <= 0 || weights < 1 || weights > kBlockMmaMaxWeights) return false;
  const int64_t scratch = BlockMmaScratchBytes(m, k, terms);
  int64_t n_total = 0;
  for (int g = 0; g < weights; ++g) {
    if (n[g] <= 0 || n[g] > (int64_t{1} << 40)) return false;
    n_total += n[g];
  }
  if (scratch < 0 || m > (int64_t{1} << 40)) return false;
  // The staged shape runs one block an SM: its splits fill whole waves (1.45 waves of
  // blocks lost to the other shapes' rule), and kAuto takes it where they fill 85% of them.
  const int sms = std::max(sm_count, 1);
  const int64_t staged_blocks =
      BlockMmaColumnBlocks(n, weights, kStagedCols) * CeilDiv(m, 8 * kStagedRowTiles);
  const int staged_splits = StagedSplits(staged_blocks, k, sms);
  if (shape == BlockMmaShape::kAuto && m >= kBlockMmaStagedMinRows) {
    const int64_t blocks = staged_blocks * staged_splits;
    if (blocks * 100 >= CeilDiv(blocks, sms) * sms * 85) shape = BlockMmaShape::kStaged;
  }
  out->shape = ShapeFor(m, w_dtype, shape);
  const BlockMmaTile tile = BlockMmaTileFor(m, w_dtype, out->shape);
  out->splits = out->shape == BlockMmaShape::kStaged
                    ? staged_splits
                    : BlockMmaSplitsFor(BlockMmaColumnBlocks(n, weights, tile.cols) *
                                            CeilDiv(m, tile.rows),
                                        k, sm_count, tile.blocks_per_sm);
  // splits ≤ 16, m and Σn ≤ 2^40 each: the product fits when m · Σn does.
  if (n_total > INT64_MAX / 64 / m) return false;
  const int64_t partials = out->splits * m * n_total * 4;
  out->partial_bytes = keep_partials || out->splits > 1 ? CeilDiv(partials, 256) * 256 : 0;
  out->bytes = out->partial_bytes + scratch;
  return true;
}

int64_t BlockMmaScratchBytes(int64_t m, int64_t k, int terms) {
  if (m <= 0 || k <= 0 || terms < 1 || terms > kBlockMmaF16x1 || m > (int64_t{1} << 40) ||
      k > (int64_t{1} << 40)) {
    return -1;
  }
  const int64_t rows = PaddedRows(m), units = CeilDiv(k, quant::kUnitElems);
  // Per unit and row: the fragments (parts of 32 values at 2 bytes; int8's codes and
  // scales take one part's bytes), one f32 sum, and with scaled f16 parts one f32 scale.
  const int64_t frag = FragBytesPerRowUnit(terms);
  const int64_t floats = BlockMmaScaledTerms(terms) ? 2 : 1;
  const int64_t per = frag + 4 * floats;
  if (units > INT64_MAX / rows / per) return -1;
  return (units * rows * frag + 15) / 16 * 16 + units * rows * 4 * floats;
}

cudaError_t LaunchBlockMma(const BlockMmaArgs& a, Stream stream) {
  if (!IsQuantized(a.w_dtype) || a.m <= 0 || a.k <= 0 ||
      a.k % DTypeBlockElems(a.w_dtype) != 0 || a.weights < 1 ||
      a.weights > kBlockMmaMaxWeights || a.splits < 1 ||
      a.terms != BlockMmaTerms(a.dtype, a.terms) || a.x == nullptr || a.scratch == nullptr ||
      (a.splits > 1 && a.partials == nullptr) || (a.y == nullptr && a.partials == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (!Aligned16(a.scratch)) return cudaErrorMisalignedAddress;
  int64_t n_total = 0;
  for (int g = 0; g < a.weights; ++g) {
    if (a.n[g] <= 0 || a.w[g] == nullptr) return cudaErrorInvalidValue;
    if (!Aligned16(a.w[g])) return cudaErrorMisalignedAddress;
    n_total += a.n[g];
  }
  if (a.ld < a.col0 + n_total) return cudaErrorInvalidValue;
  const BlockMmaShape shape = ShapeFor(a.m, a.w_dtype, a.shape);
  const BlockMmaTile tile = BlockMmaTileFor(a.m, a.w_dtype, a.shape);
  const int64_t column_blocks = BlockMmaColumnBlocks(a.n, a.weights, tile.cols);
  const int64_t tiles = PaddedRows(a.m) / 8;
  const int64_t frag_bytes =
      (tiles * 8 * (a.k / quant::kUnitElems) * FragBytesPerRowUnit(a.terms) + 15) / 16 * 16;
  if (column_blocks > INT32_MAX || a.splits > 65535 || CeilDiv(a.m, tile.rows) > 65535) {
    return cudaErrorInvalidValue;
  }
  auto* frags = static_cast<uint4*>(a.scratch);
  auto* sums = reinterpret_cast<float*>(static_cast<uint8_t*>(a.scratch) + frag_bytes);
  // Scaled f16 parts: the rows' scales per unit after the sums.
  float* scales =
      BlockMmaScaledTerms(a.terms) ? sums + (a.k / quant::kUnitElems) * tiles * 8 : nullptr;
  return DispatchFloat(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return DispatchTerms<T>(a.terms, [&](auto terms) -> cudaError_t {
      constexpr int kTerms = decltype(terms)::value;
      // Every unit starts at a multiple of 32 elements: one aligned x makes every load of 4
      // activations a vector load.
      const int64_t entries = (a.k / quant::kUnitElems) * tiles * kWarpSize;
      const int64_t split_blocks = std::min<int64_t>(CeilDiv(entries, 256), 4096);
      cudaError_t e = cudaSuccess;
      if (!a.x_in_scratch) {
        e = LaunchKernel(SplitXKernel<T, kTerms>, dim3(static_cast<unsigned>(split_blocks)),
                         dim3(256), stream, static_cast<const T*>(a.x), a.m, a.k, frags, sums,
                         scales, Aligned16(a.x), SplitRowMap{});
        if (e != cudaSuccess) return e;
      }
      e = quant::DispatchFormat(a.w_dtype, [&](auto format) {
        using Q = decltype(format);
        if (shape == BlockMmaShape::kStaged) {
          const auto kernel = BlockMmaStagedKernel<T, Q, kTerms>;
          constexpr size_t kSmem = StagedSmemBytes<kTerms>();
          const cudaError_t set = cudaFuncSetAttribute(
              kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem));
          if (set != cudaSuccess) {
            (void)cudaGetLastError();
            return set;
          }
          const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(a.splits),
                          static_cast<unsigned>(CeilDiv(tiles, kStagedRowTiles)));
          return LaunchKernelShared(kernel, grid, dim3(kStagedThreads), kSmem, stream, a,
                                    static_cast<const uint4*>(frags),
                                    static_cast<const float*>(sums),
                                    static_cast<const float*>(scales));
        }
        return DispatchShape(tiles, shape == BlockMmaShape::kPrefill,
                             [&](auto row_tiles, auto col_tiles) {
          constexpr int kRowTiles = decltype(row_tiles)::value;
          constexpr int kColTiles = decltype(col_tiles)::value;
          const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(a.splits),
                          static_cast<unsigned>(CeilDiv(tiles, kRowTiles)));
          return LaunchKernel(BlockMmaKernel<T, Q, kRowTiles, kColTiles, kTerms>, grid,
                              dim3(kThreads),
                              stream, a, static_cast<const uint4*>(frags),
                              static_cast<const float*>(sums),
                              static_cast<const float*>(scales));
        });
      });
      if (e != cudaSuccess || a.y == nullptr || a.splits == 1) return e;
      const int64_t sum_blocks = std::min<int64_t>(CeilDiv(a.m * n_total, 256), 8192);
      return LaunchKernel(SumSplitsKernel<T>, dim3(static_cast<unsigned>(sum_blocks)),
                          dim3(256), stream, a, n_total);
    });
  });
}

bool MoeBlockMmaTakes(int64_t rows, int64_t experts, int64_t n, int64_t k, int64_t top_k,
                      DType dtype, DType w_dtype) {
  if (!IsFloat(dtype) || !IsQuantized(w_dtype)) return false;
  if (rows <= 0 || experts <= 0 || n <= 0 || k <= 0 || top_k <= 0) return false;
  if (experts > kMoeBlockMmaMaxExperts || k % DTypeBlockElems(w_dtype) != 0) return false;
  if (n > (int64_t{1} << 30) || k > (int64_t{1} << 30) || top_k > (int64_t{1} << 20) ||
      rows > (int64_t{1} << 30) / top_k) {
    return false;
  }
  // The sorted rows' tiles along the grid's z, pair indices within 32 bits, and the
  // stacked weight's units (E · n rows of k / 32) within 63 bits.
  const int64_t pairs = rows * top_k;
  return MoeSortedRows(pairs, experts) / kMoeBlockMmaRows <= 65535 && pairs <= INT32_MAX &&
         experts * n <= (int64_t{1} << 40) / std::max<int64_t>(k / quant::kUnitElems, 1);
}

int64_t MoeBlockMmaWorkspaceBytes(int64_t rows, int64_t experts, int64_t k, int64_t top_k,
                                  int terms) {
  if (rows <= 0 || experts <= 0 || experts > kMoeBlockMmaMaxExperts || top_k <= 0 ||
      top_k > (int64_t{1} << 20) || rows > (int64_t{1} << 30) / top_k) {
    return -1;
  }
  const int64_t sorted = MoeSortedRows(rows * top_k, experts);
  const int64_t scratch = BlockMmaScratchBytes(sorted, k, terms);
  if (scratch < 0) return -1;
  // row_pair [sorted], tile_expert [sorted / 32], then the scratch.
  return CeilDiv(sorted * 4, 256) * 256 + CeilDiv(sorted / kMoeBlockMmaRows * 4, 256) * 256 +
         scratch;
}

cudaError_t LaunchMoeBlockMma(const MoeBlockMmaArgs& a, Stream stream) {
  if (!MoeBlockMmaTakes(a.rows, a.experts, a.n, a.k, a.top_k, a.dtype, a.w_dtype) ||
      a.terms != BlockMmaTerms(a.dtype, a.terms) || a.x == nullptr || a.w == nullptr ||
      a.ids == nullptr || a.y == nullptr || a.workspace == nullptr ||
      (a.per_slot && a.w_up != nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (!Aligned16(a.w) || (a.w_up != nullptr && !Aligned16(a.w_up)) || !Aligned16(a.workspace)) {
    return cudaErrorMisalignedAddress;
  }
  const bool gated = a.w_up != nullptr;
  const int64_t pairs = a.rows * a.top_k, sorted = MoeSortedRows(pairs, a.experts);
  const int64_t tiles = sorted / 8, units = a.k / quant::kUnitElems;
  auto* row_pair = static_cast<int32_t*>(a.workspace);
  auto* tile_expert = reinterpret_cast<int32_t*>(static_cast<uint8_t*>(a.workspace) +
                                                 CeilDiv(sorted * 4, 256) * 256);
  uint8_t* scratch = reinterpret_cast<uint8_t*>(tile_expert) +
                     CeilDiv(sorted / kMoeBlockMmaRows * 4, 256) * 256;
  const int64_t frag_bytes = (sorted * units * FragBytesPerRowUnit(a.terms) + 15) / 16 * 16;
  auto* frags = reinterpret_cast<uint4*>(scratch);
  auto* sums = reinterpret_cast<float*>(scratch + frag_bytes);
  float* scales = BlockMmaScaledTerms(a.terms) ? sums + units * sorted : nullptr;
  const int64_t cols = kWarps * kMoeColTiles * (gated ? 8 : 16);
  MoeKernelArgs products;
  products.w = static_cast<const uint8_t*>(a.w);
  products.w_up = static_cast<const uint8_t*>(a.w_up);
  products.experts = a.experts;
  products.n = a.n;
  products.k = a.k;
  products.sorted_rows = sorted;
  products.y = a.y;
  return DispatchFloat(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    cudaError_t e = LaunchKernel(MoeSortKernel<T>, dim3(1), dim3(kMoeSortThreads), stream,
                                 a.ids, pairs, static_cast<int>(a.experts), sorted, row_pair,
                                 tile_expert, static_cast<T*>(a.y), a.n, a.error_flags);
    if (e != cudaSuccess) return e;
    return DispatchTerms<T>(a.terms, [&](auto terms) -> cudaError_t {
      constexpr int kTerms = decltype(terms)::value;
      const int64_t entries = units * tiles * kWarpSize;
      const int64_t split_blocks = std::min<int64_t>(CeilDiv(entries, 256), 4096);
      const SplitRowMap map{row_pair, a.top_k, a.per_slot};
      cudaError_t split = LaunchKernel(
          SplitXKernel<T, kTerms, true>, dim3(static_cast<unsigned>(split_blocks)), dim3(256),
          stream, static_cast<const T*>(a.x), sorted, a.k, frags, sums, scales, Aligned16(a.x),
          map);
      if (split != cudaSuccess) return split;
      const dim3 grid(static_cast<unsigned>(CeilDiv(a.n, cols)), 1,
                      static_cast<unsigned>(sorted / kMoeBlockMmaRows));
      return quant::DispatchFormat(a.w_dtype, [&](auto format) {
        using Q = decltype(format);
        auto launch = [&](auto kernel) {
          return LaunchKernel(kernel, grid, dim3(kThreads), stream, products,
                              static_cast<const uint4*>(frags), static_cast<const float*>(sums),
                              static_cast<const float*>(scales),
                              static_cast<const int32_t*>(row_pair),
                              static_cast<const int32_t*>(tile_expert));
        };
        return gated ? launch(MoeBlockMmaKernel<T, Q, kTerms, true>)
                     : launch(MoeBlockMmaKernel<T, Q, kTerms, false>);
      });
    });
  });
}

}  // namespace sg::kernels
