// GGUF's block formats for quantized weights: the byte layout of one block of each
// format, bit for bit as GGUF files store them, and the host functions that read and write
// rows of blocks. Plain C++ with no Abseil, so that CUDA kernels (the layouts and the
// inline unpackers below are usable in device code), tests and tools can include it.
//
// A row of n values (n a multiple of DTypeBlockElems) is n / DTypeBlockElems consecutive
// blocks. Scales are f16 bit patterns. Values are dequantized in f32 in exactly the order
// of operations of the `gguf` Python package's `gguf.quants.dequantize` (the reference the
// CPU path is tested against bit for bit):
//   Q8_0: q·d                              q int8
//   Q4_0: d·(q−8)     Q5_0: d·(q−16)       q the 4- or 5-bit code
//   Q4_1: d·q + m     Q5_1: d·q + m
//   Q4_K, Q5_K: (d·sc)·q − (dmin·mn)       8 sub-blocks of 32, 6-bit sc and mn
//   Q6_K: (d·sc)·(q−32)                    16 sub-blocks of 16, int8 sc
#ifndef STEPGRAPH_BASE_QUANT_H_
#define STEPGRAPH_BASE_QUANT_H_

#include <cstdint>

#include "stepgraph/base/dtype.h"

#if defined(__CUDACC__)
#define SG_QUANT_INLINE __host__ __device__ __forceinline__
#else
#define SG_QUANT_INLINE inline
#endif

namespace sg {

// Values 0..15 in the low nibbles of qs[0..15], 16..31 in the high nibbles.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
// As Q4_0/Q4_1, plus bit j of the little-endian 32-bit qh as bit 4 of value j.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
// 256 values in 8 sub-blocks of 32. Sub-blocks 2c and 2c+1 are the low and high nibbles
// of qs[32c .. 32c+31]; their 6-bit scales and mins are packed in `scales` (Q4KScaleMin).
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
// As Q4_K, plus bit s of qh[l] as bit 4 of value l of sub-block s.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
// 256 values in two halves of 128; value l + 32·s of half h (s = 0..3, l = 0..31) has
// low 4 bits from ql[64h + l + 32·(s&1)] (low nibble for s < 2, high for s >= 2) and high
// 2 bits from qh[32h + l] >> 2s. Sub-block of 16 values e/16 has scale scales[e/16].
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};

static_assert(sizeof(BlockQ4_0) == DTypeBlockBytes(DType::kQ4_0));
static_assert(sizeof(BlockQ4_1) == DTypeBlockBytes(DType::kQ4_1));
static_assert(sizeof(BlockQ5_0) == DTypeBlockBytes(DType::kQ5_0));
static_assert(sizeof(BlockQ5_1) == DTypeBlockBytes(DType::kQ5_1));
static_assert(sizeof(BlockQ8_0) == DTypeBlockBytes(DType::kQ8_0));
static_assert(sizeof(BlockQ4_K) == DTypeBlockBytes(DType::kQ4_K));
static_assert(sizeof(BlockQ5_K) == DTypeBlockBytes(DType::kQ5_K));
static_assert(sizeof(BlockQ6_K) == DTypeBlockBytes(DType::kQ6_K));

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K or Q5_K block. Bytes 0..3 hold
// the scales of 0..3 in their low 6 bits, bytes 4..7 the mins of 0..3; sub-blocks 4..7
// keep their low 4 bits in bytes 8..11 (scale low nibble, min high nibble) and their top 2
// bits in the top bits of bytes 0..3 (scales) and 4..7 (mins).
SG_QUANT_INLINE void Q4KScaleMin(const uint8_t* scales, int j, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *mn = scales[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// The 6-bit code of value e (0..255) of a Q6_K block.
SG_QUANT_INLINE int Q6KCode(const BlockQ6_K& b, int e) {
  const int h = e >> 7, s = (e >> 5) & 3, l = e & 31;
  const int low = (b.ql[64 * h + l + 32 * (s & 1)] >> (4 * (s >> 1))) & 0xF;
  const int high = (b.qh[32 * h + l] >> (2 * s)) & 3;
  return low | (high << 4);
}

// The functions below return false, and write nothing, when `t` is not a block format or
// n is negative or not a multiple of DTypeBlockElems(t).

// out[0..n) = the values of the row of blocks, bit-exact with gguf.quants.dequantize.
bool DequantizeRow(DType t, const void* blocks, float* out, int64_t n);

// out[i·out_stride] = Σ_c value[c] · x[i·x_stride + c] for i in [0, m): the dot products
// of one quantized row with m f32 vectors: the sum over the row of each dequantized value
// (exactly DequantizeRow's) times x. Blocks are dequantized one at a time into a small
// buffer, used for several vectors at once; no f32 copy of the row is made. The order of
// the f32 additions is unspecified.
bool DotQuantizedRow(DType t, const void* blocks, int64_t n, const float* x, int64_t x_stride,
                     int64_t m, float* out, int64_t out_stride);

// out[i·out_stride + r] = the dot product of row r of `rows` consecutive quantized rows of
// n values with vector i, for r in [0, rows), i in [0, m): DotQuantizedRow over a range of
// weight rows in one call. On x86-64 the blocks are unpacked in vector registers (AVX2 or
// AVX-512, whichever the processor has) into the same values; only the order and rounding
// of the sums differ from the scalar path. A row's result does not depend on `rows` or m.
bool DotQuantizedRows(DType t, const void* blocks, int64_t rows, int64_t n, const float* x,
                      int64_t x_stride, int64_t m, float* out, int64_t out_stride);

// Blocks of n values quantized from `in`. For Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 the result
// is byte for byte what gguf.quants.quantize writes. The K formats get a simple quantizer
// (one pass, nearest codes for rounded scales): valid blocks whose dequantized values
// track the input, for tests, benchmarks and random weights, not a match for any other
// tool's choice of scales.
bool QuantizeRow(DType t, const float* in, void* blocks, int64_t n);

}  // namespace sg

#endif  // STEPGRAPH_BASE_QUANT_H_
