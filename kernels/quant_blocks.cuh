// The device layout of GGUF's block formats and its readers: the one definition of how
// stepgraph's CUDA kernels (quantized matmul, quantized embedding, fused matmul, and the
// dequantization of the prefill path) find a value of a weight in a block format. .cu
// files only; host code reaches the layout through kernels/quant_layout.h.
//
// Layout. At upload a weight's blocks (stepgraph/base/quant.h, as the file stores them,
// 2-byte aligned) are repacked, in the same number of bytes, into planes: each plane holds
// one field group of every block of the tensor, plane after plane. The first plane holds
// the quants (and, for the K formats, the whole block but its f16 scale), a multiple of 16
// bytes per block, so that a thread reads 32 values with one or two 16-byte loads; the
// small planes after it hold the remaining scales and high bits, each naturally aligned.
// Within a block the quants are reordered so that every format reads in units of 32
// consecutive values, unit u of a row being values 32u .. 32u+31:
//   Q4_0, Q4_1   [16 qs][2 d | 4 d,m]       qs as the file's (byte i: values i, 16+i)
//   Q5_0, Q5_1   [16 qs][4 qh][2 d | 4 d,m]
//   Q8_0         [32 qs][2 d]
//   Q4_K         [144: d, dmin, scales[12], qs'[8][16]]               qs' per sub-block
//   Q5_K         [176: d, dmin, scales[12], qs'[8][16], qh'[8] u32]   bit l: value 32u+l
//   Q6_K         [208: ql'[8][16], qh'[8] u64, scales[16]][2 d]
// where the 16 quant bytes of a unit hold value i in the low and value 16+i in the high
// nibble of byte i (as Q4_0 does), and Q6_K's 2-bit highs of value i in bits 2i, 2i+1 of
// the unit's 64-bit word. Every unit of every format covers the same 32 consecutive
// values, so a kernel that mixes formats (one per weight) loads the activations once.
//
// Every value is computed with the f32 operations, in the order, of the CPU reference's
// DequantizeRow (bit-exact with gguf.quants.dequantize): the _rn intrinsics keep the
// compiler from contracting d·q + m into one fused multiply-add, so a dequantized value
// here equals the reference's bit for bit. The readers are __host__ __device__, so that
// kernels/quant_layout.cu checks the layout on the host against the reference.
#ifndef STEPGRAPH_KERNELS_QUANT_BLOCKS_CUH_
#define STEPGRAPH_KERNELS_QUANT_BLOCKS_CUH_

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/device_common.cuh"
#include "stepgraph/base/dtype.h"
#include "stepgraph/base/quant.h"

namespace sg::kernels::quant {

#define SG_QB __host__ __device__ __forceinline__
// Unrolled in device code; the host compiler knows no such pragma.
#ifdef __CUDA_ARCH__
#define SG_QB_UNROLL _Pragma("unroll")
#else
#define SG_QB_UNROLL
#endif

// Values of one unit, the granule every reader works in.
inline constexpr int kUnitElems = 32;

// ---- loads (device: quants streamed, scales through the read-only cache) ---------------

SG_QB uint4 LoadQuants16(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return __ldcs(reinterpret_cast<const uint4*>(p));
#else
  uint4 v;
  std::memcpy(&v, p, 16);
  return v;
#endif
}
SG_QB uint2 LoadQuants8(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return __ldcs(reinterpret_cast<const uint2*>(p));
#else
  uint2 v;
  std::memcpy(&v, p, 8);
  return v;
#endif
}
SG_QB uint32_t Load4(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return __ldcs(reinterpret_cast<const unsigned int*>(p));
#else
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}
// One byte and one 4-byte word (4-byte aligned) of a block head, through the read-only
// cache (the 8 units of a block read the same head).
SG_QB uint32_t LoadCached1(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return __ldg(p);
#else
  return *p;
#endif
}
SG_QB uint32_t LoadCached4(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return __ldg(reinterpret_cast<const unsigned int*>(p));
#else
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}
SG_QB uint32_t Load2(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return __ldcs(reinterpret_cast<const unsigned short*>(p));
#else
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
#endif
}

// ---- exact f32 arithmetic --------------------------------------------------------------

// f16 bits to f32, exactly.
SG_QB float F16(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
#else
  // As base/quant.cc: the shifted exponent and mantissa read as an f32 2^112 too small.
  const uint16_t h = static_cast<uint16_t>(bits);
  uint32_t u = static_cast<uint32_t>(h & 0x7fffu) << 13;
  float f;
  std::memcpy(&f, &u, 4);
  f *= 0x1p112f;
  std::memcpy(&u, &f, 4);
  if (f >= 65536.0f) u |= 0xffu << 23;
  u |= static_cast<uint32_t>(h & 0x8000u) << 16;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
SG_QB float MulRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
SG_QB float AddRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
SG_QB float SubRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// code − kOffset as f32, exactly, for a code in [0, 2^22). On the device without an
// integer-to-float conversion, whose throughput (16 per SM and cycle) would bound a 4-bit
// kernel below the memory's rate: 2^23 + code is an f32 with the code in its mantissa, and
// subtracting 2^23 + kOffset leaves code − kOffset (both operands and the result exact).
template <int kOffset>
SG_QB float CodeValue(uint32_t code) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(__uint_as_float(0x4B000000u | code), 8388608.0f + static_cast<float>(kOffset));
#else
  return static_cast<float>(static_cast<int>(code) - kOffset);
#endif
}

// Word i (a constant once unrolled) of a 16-byte vector.
SG_QB uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The 4-bit codes of values 8j .. 8j+7 of a unit whose quants are `q` (value e: the low
// nibble of byte e for e < 16, the high nibble of byte e - 16 otherwise): the two words
// and the shift that hold them, chosen once, so that a j known only at run time (a lane's
// part of a unit) costs three selections rather than three per value.
struct Nibbles8 {
  uint32_t lo, hi;  // bytes 8(j&1) .. 8(j&1)+3 and the next four
  int shift;        // 4·(j >> 1): the high nibbles for values 16..31
  SG_QB Nibbles8(const uint4& q, int j)
      : lo((j & 1) ? q.z : q.x), hi((j & 1) ? q.w : q.y), shift(4 * (j >> 1)) {}
  // The code of value 8j + i (i a constant once unrolled).
  SG_QB uint32_t operator[](int i) const {
    return ((i < 4 ? lo : hi) >> (8 * (i & 3) + shift)) & 0xFu;
  }
};

// Device: the four codes held one per byte of w, minus kOffset, as exact floats: each
// becomes the float 2^23 + code by one byte permutation (its byte under 0x4B), so a code
// costs a permutation and a subtraction rather than a shift, a mask and an or.
#ifdef __CUDA_ARCH__
template <int kOffset>
__device__ __forceinline__ void ByteCodes4(uint32_t w, float* c) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    c[i] = __fsub_rn(__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u + i)),
                     8388608.0f + static_cast<float>(kOffset));
  }
}
// Bits 2i, 2i+1 of b (b < 256, i < 4) to bits 4, 5 of byte i; bit i of b (b < 16) to bit
// 4 of byte i. Each product adds copies of b shifted so far apart that none overlaps
// another (no carries): fields 0 and 2 move by 4 and 16, fields 1 and 3 by 10 and 22.
__device__ __forceinline__ uint32_t SpreadPairsToByteBit4(uint32_t b) {
  return ((b & 0x33u) * 0x00010010u | (b & 0xCCu) * 0x00400400u) & 0x30303030u;
}
__device__ __forceinline__ uint32_t SpreadBitsToByteBit4(uint32_t b) {
  return (b * 0x02040810u) & 0x10101010u;
}
#endif

// The codes of values 8j .. 8j+7 of a unit whose quants are `q` (Nibbles8's layout), with
// kBits (4, 5 or 6) bits a code: the fifth bit of value i is bit i of `high`, the fifth
// and sixth bits 2i, 2i+1; minus kOffset, as exact floats. On the device a word's four
// nibbles are masked at once and the high bits spread to their bytes at once.
template <int kBits, int kOffset>
SG_QB void NibbleCodes8(const uint4& q, int j, uint32_t high, float (&c)[8]) {
  const Nibbles8 codes(q, j);
#ifdef __CUDA_ARCH__
  uint32_t lo = (codes.lo >> codes.shift) & 0x0F0F0F0Fu;
  uint32_t hi = (codes.hi >> codes.shift) & 0x0F0F0F0Fu;
  if constexpr (kBits == 5) {
    lo |= SpreadBitsToByteBit4(high & 0xFu);
    hi |= SpreadBitsToByteBit4((high >> 4) & 0xFu);
  } else if constexpr (kBits == 6) {
    lo |= SpreadPairsToByteBit4(high & 0xFFu);
    hi |= SpreadPairsToByteBit4((high >> 8) & 0xFFu);
  }
  ByteCodes4<kOffset>(lo, c);
  ByteCodes4<kOffset>(hi, c + 4);
#else
  for (int i = 0; i < 8; ++i) {
    uint32_t code = codes[i];
    if constexpr (kBits == 5) code |= ((high >> i) & 1u) << 4;
    if constexpr (kBits == 6) code |= ((high >> (2 * i)) & 3u) << 4;
    c[i] = CodeValue<kOffset>(code);
  }
#endif
}

// The quarter of a nibble unit's codes that QuadCodes gives (see the formats below): the
// quant word w holds values 4t+i in the low and 16+4t+i in the high nibble of byte i;
// with kBits 5 or 6 the fifth bit of each of the first four values is bit i of high_lo
// (of the next four, of high_hi), or the fifth and sixth bits 2i, 2i+1.
template <int kBits>
SG_QB void QuadNibbles(uint32_t w, uint32_t high_lo, uint32_t high_hi, uint32_t& lo,
                       uint32_t& hi) {
  lo = w & 0x0F0F0F0Fu;
  hi = (w >> 4) & 0x0F0F0F0Fu;
#ifdef __CUDA_ARCH__
  if constexpr (kBits == 5) {
    lo |= SpreadBitsToByteBit4(high_lo & 0xFu);
    hi |= SpreadBitsToByteBit4(high_hi & 0xFu);
  } else if constexpr (kBits == 6) {
    lo |= SpreadPairsToByteBit4(high_lo & 0xFFu);
    hi |= SpreadPairsToByteBit4(high_hi & 0xFFu);
  }
#else
  for (int i = 0; i < 4 && kBits > 4; ++i) {
    const int bits = kBits - 4, mask = (1 << bits) - 1;
    lo |= ((high_lo >> (bits * i)) & mask) << (8 * i + 4);
    hi |= ((high_hi >> (bits * i)) & mask) << (8 * i + 4);
  }
#endif
}

// The values of a unit from its factored reading, for the kernels that want them whole
// (embedding, dequantization, experts): one definition of a format's values, its Codes8,
// Scale and Min, for those and the matmul kernels alike. Values8(j, v): values 8j .. 8j+7,
// computed with the reference's f32 operations (the value d·q + m or d·(q − offset)).
template <typename Unit>
struct FactoredValues {
  SG_QB void Values8(int j, float (&v)[8]) const {
    const Unit& u = static_cast<const Unit&>(*this);
    u.Codes8(j, v);
    const float scale = u.Scale(j);
SG_QB_UNROLL
    for (int i = 0; i < 8; ++i) {
      v[i] = MulRn(scale, v[i]);
      if constexpr (Unit::kHasMin) v[i] = AddRn(v[i], u.Min(j));
    }
  }
};

// ---- one format per specialisation ------------------------------------------------------
// Format<t>: kElems, kBytes (as stepgraph/base/quant.h), kUnits = kElems / 32 per block,
// kPlane0 (bytes of the first plane per block); Unit Load(base, blocks, g): unit g of the
// tensor (g = row · units per row + unit in the row) of a tensor of `blocks` blocks in the
// device layout at `base` (16-byte aligned), which is Decode(Fetch(base, blocks, g)): Raw
// Fetch only loads (the unit's words as stored), Unit Decode turns them into scales, so a
// kernel that asks for its next units early holds Raws and decodes at the use (a scale
// computed at the load would make the warp wait for that load right there, and a branch
// around the loads keeps the compiler from moving it); for the 32-value formats also LoadPart(base,
// blocks, g, j), the same unit with only the quant bytes Codes8(j) reads loaded (8 of them),
// for a thread that multiplies values 8j .. 8j+7 alone. A unit is read factored: Unit::Codes8(j, c)
// gives the codes of values 8j .. 8j+7 as exact floats (the format's offset subtracted),
// Scale(j) and, where kHasMin, Min(j) the run's scale and min (j a constant once unrolled,
// or a lane's part of the unit known at run time); value = AddRn(MulRn(Scale, code), Min),
// which is FactoredValues' Values8. A dot product over the 8 takes one FMA per value and the
// scale (and min) once: Scale·Σ code·x + Min·Σ x, which rounds differently from
// Σ value·x by a few ulp of the partial sums (AccumulateUnit8).
// kernels/quant_layout.cu writes the layout.
//
// The tensor-core kernel (kernels/block_mma.cu) reads a unit by quarters instead:
// QuadCodes(t, lo, hi) gives the codes of values 4t .. 4t+3 (byte i of lo: value 4t + i)
// and 16+4t .. 16+4t+3 (byte i of hi), unsigned, kCodeBias above the code the Codes8
// reading gives (value = Scale·(byte − kCodeBias) + Min); values 0..15 take Scale(0) and
// Min(0), values 16..31 Scale(2) and Min(2) (Q6_K's two sub-blocks; one scale elsewhere).
// Q8_0's bytes are its signed codes, kCodeBias 0.

template <DType kType>
struct Format;

template <>
struct Format<DType::kQ8_0> {
  static constexpr int kElems = 32, kBytes = 34, kUnits = 1, kPlane0 = 32;
  struct Unit : FactoredValues<Unit> {
    uint4 q[2];
    float d;
    static constexpr bool kHasMin = false;
    SG_QB void Codes8(int j, float (&c)[8]) const {
      // Values 8j .. 8j+7 are bytes 8(j&1) .. of q[j >> 1]: two words, chosen once, each
      // member named (an index into q at run time would put q in local memory).
      const uint32_t lo = (j & 2) ? ((j & 1) ? q[1].z : q[1].x) : ((j & 1) ? q[0].z : q[0].x);
      const uint32_t hi = (j & 2) ? ((j & 1) ? q[1].w : q[1].y) : ((j & 1) ? q[0].w : q[0].y);
#ifdef __CUDA_ARCH__
      // The int8 codes biased by 128 (sign bits flipped), four at once.
      ByteCodes4<128>(lo ^ 0x80808080u, c);
      ByteCodes4<128>(hi ^ 0x80808080u, c + 4);
#else
      for (int i = 0; i < 8; ++i) {
        c[i] = CodeValue<128>((((i < 4 ? lo : hi) >> (8 * (i & 3))) & 0xFFu) ^ 0x80u);
      }
#endif
    }
    SG_QB float Scale(int) const { return d; }
    static constexpr int kCodeBias = 0;  // signed bytes
    SG_QB void QuadCodes(int t, uint32_t& lo, uint32_t& hi) const {
      lo = Word(q[0], t);
      hi = Word(q[1], t);
    }
  };
  struct Raw {
    uint4 q[2];
    uint32_t d;
  };
  SG_QB static Raw Fetch(const uint8_t* base, int64_t blocks, int64_t g) {
    Raw r;
    r.q[0] = LoadQuants16(base + 32 * g);
    r.q[1] = LoadQuants16(base + 32 * g + 16);
    r.d = Load2(base + 32 * blocks + 2 * g);
    return r;
  }
  SG_QB static Unit Decode(const Raw& r) {
    Unit u;
    u.q[0] = r.q[0];
    u.q[1] = r.q[1];
    u.d = F16(r.d);
    return u;
  }
  SG_QB static Unit Load(const uint8_t* base, int64_t blocks, int64_t g) {
    return Decode(Fetch(base, blocks, g));
  }
  // Only what Codes8(j) reads: bytes 8j .. 8j+7, in every word Codes8 may pick for any j.
  SG_QB static Unit LoadPart(const uint8_t* base, int64_t blocks, int64_t g, int j) {
    Unit u;
    const uint2 v = LoadQuants8(base + 32 * g + 8 * j);
    u.q[0] = uint4{v.x, v.y, v.x, v.y};
    u.q[1] = u.q[0];
    u.d = F16(Load2(base + 32 * blocks + 2 * g));
    return u;
  }
};

// Q4_0, Q4_1, Q5_0, Q5_1: one unit per block.
template <bool kMin, bool kFive>
struct Format32 {
  static constexpr int kElems = 32, kUnits = 1, kPlane0 = 16;
  static constexpr int kBytes = 2 + (kMin ? 2 : 0) + (kFive ? 4 : 0) + 16;
  struct Unit : FactoredValues<Unit> {
    uint4 q;
    uint32_t qh;
    float d, m;
    static constexpr bool kHasMin = kMin;
    SG_QB void Codes8(int j, float (&c)[8]) const {
      NibbleCodes8<kFive ? 5 : 4, kMin ? 0 : kFive ? 16 : 8>(q, j, qh >> (8 * j), c);
    }
    SG_QB float Scale(int) const { return d; }
    SG_QB float Min(int) const { return m; }
    static constexpr int kCodeBias = kMin ? 0 : kFive ? 16 : 8;
    SG_QB void QuadCodes(int t, uint32_t& lo, uint32_t& hi) const {
      QuadNibbles<kFive ? 5 : 4>(Word(q, t), qh >> (4 * t), qh >> (16 + 4 * t), lo, hi);
    }
  };
  struct Raw {
    uint4 q;
    uint32_t qh, dm;  // high bits; d's f16 bits (and m's above them with a min)
  };
  SG_QB static Raw Fetch(const uint8_t* base, int64_t blocks, int64_t g) {
    Raw r = FetchScales(base, blocks, g);
    r.q = LoadQuants16(base + 16 * g);
    return r;
  }
  SG_QB static Unit Decode(const Raw& r) {
    Unit u;
    u.q = r.q;
    u.qh = r.qh;
    u.d = F16(r.dm & 0xFFFFu);
    u.m = kMin ? F16(r.dm >> 16) : 0.0f;
    return u;
  }
  SG_QB static Unit Load(const uint8_t* base, int64_t blocks, int64_t g) {
    return Decode(Fetch(base, blocks, g));
  }
  // Only what Codes8(j) reads: the 8 quant bytes 8(j & 1) .. (values 8j .. 8j+7 are their
  // low or high nibbles), in both word pairs Nibbles8 may pick, and the unit's scales and
  // high bits.
  SG_QB static Unit LoadPart(const uint8_t* base, int64_t blocks, int64_t g, int j) {
    Unit u = LoadScales(base, blocks, g);
    const uint2 v = LoadQuants8(base + 16 * g + 8 * (j & 1));
    u.q = uint4{v.x, v.y, v.x, v.y};
    return u;
  }
  // The unit's fields after its quants: high bits, scale and min (q left zero).
  SG_QB static Raw FetchScales(const uint8_t* base, int64_t blocks, int64_t g) {
    Raw r;
    r.q = uint4{0u, 0u, 0u, 0u};
    const uint8_t* after = base + 16 * blocks;
    r.qh = 0;
    if constexpr (kFive) {
      r.qh = Load4(after + 4 * g);
      after += 4 * blocks;
    }
    r.dm = kMin ? Load4(after + 4 * g) : Load2(after + 2 * g);
    return r;
  }
  SG_QB static Unit LoadScales(const uint8_t* base, int64_t blocks, int64_t g) {
    return Decode(FetchScales(base, blocks, g));
  }
};
template <>
struct Format<DType::kQ4_0> : Format32<false, false> {};
template <>
struct Format<DType::kQ4_1> : Format32<true, false> {};
template <>
struct Format<DType::kQ5_0> : Format32<false, true> {};
template <>
struct Format<DType::kQ5_1> : Format32<true, true> {};

// Q4_K and Q5_K: unit u of a block is its sub-block u, with one scale and one min.
template <bool kFive>
struct FormatK {
  static constexpr int kElems = 256, kUnits = 8;
  static constexpr int kBytes = kFive ? 176 : 144, kPlane0 = kBytes;
  struct Unit : FactoredValues<Unit> {
    uint4 q;
    uint32_t qh;
    float d, m;  // d·sc and dmin·mn of the sub-block
    static constexpr bool kHasMin = true;
    SG_QB void Codes8(int j, float (&c)[8]) const {
      NibbleCodes8<kFive ? 5 : 4, 0>(q, j, qh >> (8 * j), c);
    }
    SG_QB float Scale(int) const { return d; }
    // x − m == x + (−m) exactly: the value is AddRn(MulRn(d, code), −m).
    SG_QB float Min(int) const { return -m; }
    static constexpr int kCodeBias = 0;
    SG_QB void QuadCodes(int t, uint32_t& lo, uint32_t& hi) const {
      QuadNibbles<kFive ? 5 : 4>(Word(q, t), qh >> (4 * t), qh >> (16 + 4 * t), lo, hi);
    }
  };
  // Raw: what the unit reads of its block's head (d and dmin, and the three bytes its 6-bit
  // scale and min are made of) rather than the whole head, decoded without a branch per
  // lane (a Raw of the 16-byte head decoded with one ran slower than decoding at the load:
  // docs/cuda_kernels.md).
  struct Raw {
    uint4 q;
    uint32_t qh;
    uint32_t dm;       // the block's d and dmin (f16 bits)
    uint32_t a, b, c;  // head bytes 4 + s, 8 + s and s
    int s;
  };
  SG_QB static Raw Fetch(const uint8_t* base, int64_t, int64_t g) {
    Raw r;
    r.s = static_cast<int>(g & 7);
    const uint8_t* block = base + kBytes * (g >> 3);
    r.dm = LoadCached4(block);
    r.a = LoadCached1(block + 4 + r.s);
    r.b = LoadCached1(block + 8 + r.s);
    r.c = LoadCached1(block + r.s);
    r.q = LoadQuants16(block + 16 + 16 * r.s);
    r.qh = kFive ? Load4(block + 144 + 4 * r.s) : 0u;
    return r;
  }
  // Q4KScaleMin over head bytes 4..15 (scales[k] is head byte 4 + k): sub-blocks 0..3 take
  // the low 6 bits of bytes 4 + s (scale) and 8 + s (min); 4..7 the nibbles of byte 8 + s
  // below the top 2 bits of bytes s (scale) and 4 + s (min).
  SG_QB static Unit Decode(const Raw& r) {
    const bool low = r.s < 4;
    const uint32_t sc = low ? (r.a & 63u) : ((r.b & 0xFu) | ((r.c >> 6) << 4));
    const uint32_t mn = low ? (r.b & 63u) : ((r.b >> 4) | ((r.a >> 6) << 4));
    Unit u;
    u.d = MulRn(F16(r.dm & 0xFFFFu), static_cast<float>(sc));
    u.m = MulRn(F16(r.dm >> 16), static_cast<float>(mn));
    u.q = r.q;
    u.qh = r.qh;
    return u;
  }
  SG_QB static Unit Load(const uint8_t* base, int64_t blocks, int64_t g) {
    return Decode(Fetch(base, blocks, g));
  }
};
template <>
struct Format<DType::kQ4_K> : FormatK<false> {};
template <>
struct Format<DType::kQ5_K> : FormatK<true> {};

// Q6_K: unit u holds sub-blocks 2u (values 0..15) and 2u+1 (16..31).
template <>
struct Format<DType::kQ6_K> {
  static constexpr int kElems = 256, kBytes = 210, kUnits = 8, kPlane0 = 208;
  struct Unit : FactoredValues<Unit> {
    uint4 ql;
    uint2 qh;
    float d0, d1;  // d·scales[2u], d·scales[2u+1]
    static constexpr bool kHasMin = false;
    SG_QB void Codes8(int j, float (&c)[8]) const {
      NibbleCodes8<6, 32>(ql, j, (j < 2 ? qh.x : qh.y) >> (16 * (j & 1)), c);
    }
    SG_QB float Scale(int j) const { return j < 2 ? d0 : d1; }
    static constexpr int kCodeBias = 32;
    SG_QB void QuadCodes(int t, uint32_t& lo, uint32_t& hi) const {
      // The 2-bit highs of value i are bits 2i, 2i+1 of the unit's 64-bit word.
      QuadNibbles<6>(Word(ql, t), qh.x >> (8 * t), qh.y >> (8 * t), lo, hi);
    }
  };
  struct Raw {
    uint4 ql;
    uint2 qh;
    uint32_t d, scales;  // the block's f16 bits; the unit's two int8 scales
  };
  SG_QB static Raw Fetch(const uint8_t* base, int64_t blocks, int64_t g) {
    const int64_t b = g >> 3;
    const int s = static_cast<int>(g & 7);
    const uint8_t* block = base + kPlane0 * b;
    Raw r;
    r.d = Load2(base + kPlane0 * blocks + 2 * b);
    r.scales = Load2(block + 192 + 2 * s);
    r.ql = LoadQuants16(block + 16 * s);
    r.qh = LoadQuants8(block + 128 + 8 * s);
    return r;
  }
  SG_QB static Unit Decode(const Raw& r) {
    const float d = F16(r.d);
    Unit u;
    u.d0 = MulRn(d, static_cast<float>(static_cast<int8_t>(r.scales & 0xFFu)));
    u.d1 = MulRn(d, static_cast<float>(static_cast<int8_t>(r.scales >> 8)));
    u.ql = r.ql;
    u.qh = r.qh;
    return u;
  }
  SG_QB static Unit Load(const uint8_t* base, int64_t blocks, int64_t g) {
    return Decode(Fetch(base, blocks, g));
  }
};

template <DType kType>
constexpr bool kFormatMatchesDType = Format<kType>::kElems == DTypeBlockElems(kType) &&
                                     Format<kType>::kBytes == DTypeBlockBytes(kType) &&
                                     Format<kType>::kPlane0 % 16 == 0;
static_assert(kFormatMatchesDType<DType::kQ8_0> && kFormatMatchesDType<DType::kQ4_0> &&
              kFormatMatchesDType<DType::kQ4_1> && kFormatMatchesDType<DType::kQ5_0> &&
              kFormatMatchesDType<DType::kQ5_1> && kFormatMatchesDType<DType::kQ4_K> &&
              kFormatMatchesDType<DType::kQ5_K> && kFormatMatchesDType<DType::kQ6_K>);

// The activations that meet values 8j .. 8j+7 of a unit: 8 consecutive elements of x as
// f32, through 16-byte loads when `vec` (x 16-byte aligned: a unit starts at a multiple of
// 32 elements), else one element at a time.
template <typename T>
__device__ __forceinline__ void LoadX8(const T* p, bool vec, float (&out)[8]) {
  if (vec) {
    constexpr int W = kVec16<T>;
#pragma unroll
    for (int h = 0; h < 8; h += W) {
      float f[W];
      LoadFloats<T, W>(p + h, f);
#pragma unroll
      for (int i = 0; i < W; ++i) out[h + i] = f[i];
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = ToFloat(p[i]);
  }
}

// The matmul kernels' product of one unit's values 8j .. 8j+7 with 8 activations of each
// of kRows rows, factored (Codes8, Scale, Min): acc[r · kStride] += Scale·Σ code·x[r]
// (+ Min·xsum[r]), the codes decoded once for every row. xsum[r] = Σ x[r] (XSums8), read
// only by formats with a min.
template <int kRows>
__device__ __forceinline__ void XSums8(const float (&x)[kRows][8], float (&xsum)[kRows]) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    xsum[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) xsum[r] += x[r][e];
  }
}
template <int kStride, int kRows, typename Unit>
__device__ __forceinline__ void AccumulateUnit8(const Unit& unit, int j,
                                                const float (&x)[kRows][8],
                                                const float (&xsum)[kRows], float* acc) {
  float code[8];
  unit.Codes8(j, code);
  const float scale = unit.Scale(j);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) s = fmaf(code[e], x[r][e], s);
    float a = fmaf(scale, s, acc[r * kStride]);
    if constexpr (Unit::kHasMin) a = fmaf(unit.Min(j), xsum[r], a);
    acc[r * kStride] = a;
  }
}

// Calls f(Format<t>{}) for a block format t; cudaErrorInvalidValue for any other dtype.
template <typename F>
__host__ cudaError_t DispatchFormat(DType t, F&& f) {
  switch (t) {
    case DType::kQ8_0: return f(Format<DType::kQ8_0>{});
    case DType::kQ4_0: return f(Format<DType::kQ4_0>{});
    case DType::kQ4_1: return f(Format<DType::kQ4_1>{});
    case DType::kQ5_0: return f(Format<DType::kQ5_0>{});
    case DType::kQ5_1: return f(Format<DType::kQ5_1>{});
    case DType::kQ4_K: return f(Format<DType::kQ4_K>{});
    case DType::kQ5_K: return f(Format<DType::kQ5_K>{});
    case DType::kQ6_K: return f(Format<DType::kQ6_K>{});
    default: return cudaErrorInvalidValue;
  }
}

#undef SG_QB_UNROLL
#undef SG_QB

}  // namespace sg::kernels::quant

#endif  // STEPGRAPH_KERNELS_QUANT_BLOCKS_CUH_
