// Device-side reading of GGUF's block formats (layouts in stepgraph/base/quant.h), shared by the
// quantized matmul and embedding kernels (.cu files only).
//
// A block is read in parts: each part is 8 of the block's values, in two runs of 4
// consecutive elements (at `first` and `second`, counted from the block's first element),
// so that a thread can load the matching activations as two short vectors. The 32-element
// formats have 4 parts per block, the 256-element ones 32, so consecutive threads read
// consecutive bytes of a block and a warp's loads are contiguous.
//
// Every value is computed with the f32 operations, in the order, of the CPU reference's
// DequantizeRow (which is bit-exact with gguf.quants.dequantize): the _rn intrinsics keep
// the compiler from contracting d·q + m into one fused multiply-add, so a dequantized
// value here equals the reference's bit for bit.
#ifndef STEPGRAPH_KERNELS_QUANT_BLOCKS_CUH_
#define STEPGRAPH_KERNELS_QUANT_BLOCKS_CUH_

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "stepgraph/base/dtype.h"
#include "stepgraph/base/quant.h"

namespace sg::kernels::quant {

// 8 values of one block and where they sit in it.
struct Part {
  float v[8];
  int first;   // elements first .. first+3 are v[0..3]
  int second;  // elements second .. second+3 are v[4..7]
};

// An f16 scale (bit pattern) as f32, exactly.
__device__ __forceinline__ float F16(const uint8_t* p) {
  return __half2float(__ushort_as_half(__ldg(reinterpret_cast<const unsigned short*>(p))));
}

// n bytes (n even) from an even address, two at a time, with the streaming hint: the
// bulk of a block is read once per step and should not push the activations out of L2.
template <int N>
__device__ __forceinline__ void LoadBytes(const uint8_t* p, uint8_t (&out)[N]) {
  static_assert(N % 2 == 0);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const unsigned short u = __ldcs(reinterpret_cast<const unsigned short*>(p) + i);
    out[2 * i] = static_cast<uint8_t>(u & 0xFF);
    out[2 * i + 1] = static_cast<uint8_t>(u >> 8);
  }
}

// The little-endian 32-bit word at an even address (Q5_0/Q5_1's high bits).
__device__ __forceinline__ uint32_t LoadWord(const uint8_t* p) {
  const auto* h = reinterpret_cast<const unsigned short*>(p);
  return static_cast<uint32_t>(__ldg(h)) | static_cast<uint32_t>(__ldg(h + 1)) << 16;
}

// d·(q − offset), as DequantBlock of Q4_0/Q5_0/Q6_K; q·d for Q8_0 (same product).
__device__ __forceinline__ float Scaled(float d, int q) { return __fmul_rn(d, static_cast<float>(q)); }
// d·q + m (Q4_1, Q5_1).
__device__ __forceinline__ float ScaledPlus(float d, int q, float m) {
  return __fadd_rn(__fmul_rn(d, static_cast<float>(q)), m);
}
// d·q − m (Q4_K, Q5_K).
__device__ __forceinline__ float ScaledMinus(float d, int q, float m) {
  return __fsub_rn(__fmul_rn(d, static_cast<float>(q)), m);
}

template <DType kType>
struct Format;

// Q8_0: part p holds values 8p .. 8p+7.
template <>
struct Format<DType::kQ8_0> {
  static constexpr int kElems = 32, kParts = 4, kBytes = 34;
  __device__ static Part Read(const uint8_t* b, int p) {
    Part r;
    const float d = F16(b);
    uint8_t q[8];
    LoadBytes(b + 2 + 8 * p, q);
#pragma unroll
    for (int i = 0; i < 8; ++i) r.v[i] = Scaled(d, static_cast<int8_t>(q[i]));
    r.first = 8 * p;
    r.second = 8 * p + 4;
    return r;
  }
};

// Q4_0: part p reads qs[4p .. 4p+3]: values 4p.. (low nibbles) and 16+4p.. (high).
template <>
struct Format<DType::kQ4_0> {
  static constexpr int kElems = 32, kParts = 4, kBytes = 18;
  __device__ static Part Read(const uint8_t* b, int p) {
    Part r;
    const float d = F16(b);
    uint8_t q[4];
    LoadBytes(b + 2 + 4 * p, q);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      r.v[i] = Scaled(d, (q[i] & 0xF) - 8);
      r.v[4 + i] = Scaled(d, (q[i] >> 4) - 8);
    }
    r.first = 4 * p;
    r.second = 16 + 4 * p;
    return r;
  }
};

template <>
struct Format<DType::kQ4_1> {
  static constexpr int kElems = 32, kParts = 4, kBytes = 20;
  __device__ static Part Read(const uint8_t* b, int p) {
    Part r;
    const float d = F16(b), m = F16(b + 2);
    uint8_t q[4];
    LoadBytes(b + 4 + 4 * p, q);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      r.v[i] = ScaledPlus(d, q[i] & 0xF, m);
      r.v[4 + i] = ScaledPlus(d, q[i] >> 4, m);
    }
    r.first = 4 * p;
    r.second = 16 + 4 * p;
    return r;
  }
};

// Bit j of qh is bit 4 of value j.
__device__ __forceinline__ int Code5(uint8_t nibble_byte, bool high_nibble, uint32_t qh, int j) {
  const int low = high_nibble ? nibble_byte >> 4 : nibble_byte & 0xF;
  return low | static_cast<int>((qh >> j) & 1u) << 4;
}

template <>
struct Format<DType::kQ5_0> {
  static constexpr int kElems = 32, kParts = 4, kBytes = 22;
  __device__ static Part Read(const uint8_t* b, int p) {
    Part r;
    const float d = F16(b);
    const uint32_t qh = LoadWord(b + 2);
    uint8_t q[4];
    LoadBytes(b + 6 + 4 * p, q);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int j = 4 * p + i;
      r.v[i] = Scaled(d, Code5(q[i], false, qh, j) - 16);
      r.v[4 + i] = Scaled(d, Code5(q[i], true, qh, j + 16) - 16);
    }
    r.first = 4 * p;
    r.second = 16 + 4 * p;
    return r;
  }
};

template <>
struct Format<DType::kQ5_1> {
  static constexpr int kElems = 32, kParts = 4, kBytes = 24;
  __device__ static Part Read(const uint8_t* b, int p) {
    Part r;
    const float d = F16(b), m = F16(b + 2);
    const uint32_t qh = LoadWord(b + 4);
    uint8_t q[4];
    LoadBytes(b + 8 + 4 * p, q);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int j = 4 * p + i;
      r.v[i] = ScaledPlus(d, Code5(q[i], false, qh, j), m);
      r.v[4 + i] = ScaledPlus(d, Code5(q[i], true, qh, j + 16), m);
    }
    r.first = 4 * p;
    r.second = 16 + 4 * p;
    return r;
  }
};

// Q4_K and Q5_K: part p (0..31) reads qs[32c + l0 .. +3] with c = p/8, l0 = 4·(p%8):
// values 64c + l0.. of sub-block 2c (low nibbles) and 64c + 32 + l0.. of sub-block 2c+1
// (high nibbles). Q5_K adds bit 2c (low) or 2c+1 (high) of qh[l0 + i] as bit 4.
template <bool kFiveBit>
struct FormatK {
  static constexpr int kElems = 256, kParts = 32, kBytes = kFiveBit ? 176 : 144;
  __device__ static Part Read(const uint8_t* b, int p) {
    Part r;
    const int c = p >> 3, l0 = 4 * (p & 7);
    const float d = F16(b), dmin = F16(b + 2);
    // Straight from the block (cached): a local copy indexed by the runtime c would
    // live in local memory.
    uint8_t sc0, mn0, sc1, mn1;
    Q4KScaleMin(b + 4, 2 * c, &sc0, &mn0);
    Q4KScaleMin(b + 4, 2 * c + 1, &sc1, &mn1);
    const float d0 = __fmul_rn(d, static_cast<float>(sc0)), m0 = __fmul_rn(dmin, static_cast<float>(mn0));
    const float d1 = __fmul_rn(d, static_cast<float>(sc1)), m1 = __fmul_rn(dmin, static_cast<float>(mn1));
    uint8_t q[4];
    LoadBytes(b + (kFiveBit ? 48 : 16) + 32 * c + l0, q);
    uint8_t h[4] = {0, 0, 0, 0};
    if constexpr (kFiveBit) LoadBytes(b + 16 + l0, h);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int lo = q[i] & 0xF, hi = q[i] >> 4;
      if constexpr (kFiveBit) {
        lo |= ((h[i] >> (2 * c)) & 1) << 4;
        hi |= ((h[i] >> (2 * c + 1)) & 1) << 4;
      }
      r.v[i] = ScaledMinus(d0, lo, m0);
      r.v[4 + i] = ScaledMinus(d1, hi, m1);
    }
    r.first = 64 * c + l0;
    r.second = 64 * c + 32 + l0;
    return r;
  }
};
template <>
struct Format<DType::kQ4_K> : FormatK<false> {};
template <>
struct Format<DType::kQ5_K> : FormatK<true> {};

// Q6_K: part p (0..31) holds the 8 values 128h + 32s + l0 .. +7 with h = p/16,
// s = (p/4)%4, l0 = 8·(p%4): low 4 bits from ql[64h + 32(s&1) + l0 + i] (low nibble for
// s < 2, high for s >= 2), high 2 bits from qh[32h + l0 + i] >> 2s; all 8 lie in the
// sub-block of 16 with scale scales[8h + 2s + l0/16] (see Q6KCode).
template <>
struct Format<DType::kQ6_K> {
  static constexpr int kElems = 256, kParts = 32, kBytes = 210;
  __device__ static Part Read(const uint8_t* b, int p) {
    Part r;
    const int h = p >> 4, s = (p >> 2) & 3, l0 = 8 * (p & 3);
    const float d = F16(b + 208);
    const int8_t scale = static_cast<int8_t>(__ldg(b + 192 + 8 * h + 2 * s + (l0 >> 4)));
    const float ds = __fmul_rn(d, static_cast<float>(scale));
    uint8_t ql[8], qh[8];
    LoadBytes(b + 64 * h + 32 * (s & 1) + l0, ql);
    LoadBytes(b + 128 + 32 * h + l0, qh);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int low = (ql[i] >> (4 * (s >> 1))) & 0xF;
      const int high = (qh[i] >> (2 * s)) & 3;
      r.v[i] = Scaled(ds, (low | high << 4) - 32);
    }
    r.first = 128 * h + 32 * s + l0;
    r.second = r.first + 4;
    return r;
  }
};

template <DType kType>
constexpr bool kFormatMatchesDType = Format<kType>::kElems == DTypeBlockElems(kType) &&
                                     Format<kType>::kBytes == DTypeBlockBytes(kType);
static_assert(kFormatMatchesDType<DType::kQ8_0> && kFormatMatchesDType<DType::kQ4_0> &&
              kFormatMatchesDType<DType::kQ4_1> && kFormatMatchesDType<DType::kQ5_0> &&
              kFormatMatchesDType<DType::kQ5_1> && kFormatMatchesDType<DType::kQ4_K> &&
              kFormatMatchesDType<DType::kQ5_K> && kFormatMatchesDType<DType::kQ6_K>);
static_assert(sizeof(BlockQ6_K) == 210 && offsetof(BlockQ6_K, d) == 208 &&
              offsetof(BlockQ6_K, scales) == 192 && offsetof(BlockQ5_K, qs) == 48 &&
              offsetof(BlockQ5_K, qh) == 16 && offsetof(BlockQ4_K, qs) == 16 &&
              offsetof(BlockQ5_1, qs) == 8 && offsetof(BlockQ5_0, qs) == 6,
              "the byte offsets Read uses are those of stepgraph/base/quant.h's layouts");

// Calls f(Format<t>{}) for a block format t; cudaErrorInvalidValue for any other dtype.
template <typename F>
cudaError_t DispatchFormat(DType t, F&& f) {
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

}  // namespace sg::kernels::quant

#endif  // STEPGRAPH_KERNELS_QUANT_BLOCKS_CUH_
