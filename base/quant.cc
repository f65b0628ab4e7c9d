// Host reading and writing of GGUF's block formats (layouts in stepgraph/base/quant.h). The
// dequantizers are the reference: each value is computed with the same f32 operations in
// the same order as gguf.quants.dequantize, so the results are equal bit for bit (this file
// is compiled without floating-point contraction for that reason).
#include "stepgraph/base/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "base/dot.h"
#include "base/quant_isa.h"
#include "stepgraph/base/half.h"

// Sanitizer builds compile this file uninstrumented (base/CMakeLists.txt): its loops check
// each byte and float they load, which made the CPU reference ten times slower there. The
// entry points check their whole buffers against ASan's shadow once instead (CheckRange).
#ifdef SG_CHECK_RANGES_AT_ENTRY
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>

#include <cstdio>
#include <cstdlib>
#endif

namespace sg {
namespace {

// f16 bits to f32, exactly (HalfToFloat's result), inline and branch-light: it runs once
// or twice per block in the dot product's inner loop. The exponent and mantissa shifted
// into place read as an f32 2^112 times too small (a subnormal half becomes a subnormal
// f32); scaling by 2^112 is exact and normalises it. Exponent 31 (inf, NaN) lands at or
// above 2^16 and gets the all-ones exponent back.
inline float F16(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h & 0x7fffu) << 13;
  float f;
  std::memcpy(&f, &bits, 4);
  f *= 0x1p112f;
  std::memcpy(&bits, &f, 4);
  if (f >= 65536.0f) bits |= 0xffu << 23;
  bits |= static_cast<uint32_t>(h & 0x8000u) << 16;
  std::memcpy(&f, &bits, 4);
  return f;
}

// ---- one block to f32 -----------------------------------------------------------------

void DequantBlock(const BlockQ8_0& b, float* y) {
  const float d = F16(b.d);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
}

void DequantBlock(const BlockQ4_0& b, float* y) {
  const float d = F16(b.d);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((b.qs[j] & 0xF) - 8);
    y[j + 16] = d * static_cast<float>((b.qs[j] >> 4) - 8);
  }
}

void DequantBlock(const BlockQ4_1& b, float* y) {
  const float d = F16(b.d), m = F16(b.m);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(b.qs[j] & 0xF) + m;
    y[j + 16] = d * static_cast<float>(b.qs[j] >> 4) + m;
  }
}

uint32_t HighBits(const uint8_t* qh) {
  return static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 |
         static_cast<uint32_t>(qh[2]) << 16 | static_cast<uint32_t>(qh[3]) << 24;
}

void DequantBlock(const BlockQ5_0& b, float* y) {
  const float d = F16(b.d);
  const uint32_t qh = HighBits(b.qh);
  for (int j = 0; j < 16; ++j) {
    const int lo = (b.qs[j] & 0xF) | static_cast<int>((qh >> j) & 1) << 4;
    const int hi = (b.qs[j] >> 4) | static_cast<int>((qh >> (j + 16)) & 1) << 4;
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}

void DequantBlock(const BlockQ5_1& b, float* y) {
  const float d = F16(b.d), m = F16(b.m);
  const uint32_t qh = HighBits(b.qh);
  for (int j = 0; j < 16; ++j) {
    const int lo = (b.qs[j] & 0xF) | static_cast<int>((qh >> j) & 1) << 4;
    const int hi = (b.qs[j] >> 4) | static_cast<int>((qh >> (j + 16)) & 1) << 4;
    y[j] = d * static_cast<float>(lo) + m;
    y[j + 16] = d * static_cast<float>(hi) + m;
  }
}

void DequantBlock(const BlockQ4_K& b, float* y) {
  const float d = F16(b.d), dmin = F16(b.dmin);
  for (int c = 0; c < 4; ++c) {
    uint8_t sc0, mn0, sc1, mn1;
    Q4KScaleMin(b.scales, 2 * c, &sc0, &mn0);
    Q4KScaleMin(b.scales, 2 * c + 1, &sc1, &mn1);
    const float d0 = d * static_cast<float>(sc0), m0 = dmin * static_cast<float>(mn0);
    const float d1 = d * static_cast<float>(sc1), m1 = dmin * static_cast<float>(mn1);
    const uint8_t* q = b.qs + 32 * c;
    for (int l = 0; l < 32; ++l) {
      y[64 * c + l] = d0 * static_cast<float>(q[l] & 0xF) - m0;
      y[64 * c + 32 + l] = d1 * static_cast<float>(q[l] >> 4) - m1;
    }
  }
}

void DequantBlock(const BlockQ5_K& b, float* y) {
  const float d = F16(b.d), dmin = F16(b.dmin);
  for (int c = 0; c < 4; ++c) {
    uint8_t sc0, mn0, sc1, mn1;
    Q4KScaleMin(b.scales, 2 * c, &sc0, &mn0);
    Q4KScaleMin(b.scales, 2 * c + 1, &sc1, &mn1);
    const float d0 = d * static_cast<float>(sc0), m0 = dmin * static_cast<float>(mn0);
    const float d1 = d * static_cast<float>(sc1), m1 = dmin * static_cast<float>(mn1);
    const uint8_t* q = b.qs + 32 * c;
    for (int l = 0; l < 32; ++l) {
      const int lo = (q[l] & 0xF) | ((b.qh[l] >> (2 * c)) & 1) << 4;
      const int hi = (q[l] >> 4) | ((b.qh[l] >> (2 * c + 1)) & 1) << 4;
      y[64 * c + l] = d0 * static_cast<float>(lo) - m0;
      y[64 * c + 32 + l] = d1 * static_cast<float>(hi) - m1;
    }
  }
}

void DequantBlock(const BlockQ6_K& b, float* y) {
  const float d = F16(b.d);
  for (int s = 0; s < 16; ++s) {
    const float ds = d * static_cast<float>(b.scales[s]);
    for (int l = 0; l < 16; ++l) y[16 * s + l] = ds * static_cast<float>(Q6KCode(b, 16 * s + l) - 32);
  }
}

// ---- f32 to one block -----------------------------------------------------------------
// The Q8_0 .. Q5_1 quantizers repeat the reference's f32 operations, so that their bytes
// match gguf.quants.quantize: the scale is computed in f32, stored as f16, and the codes
// are made with the f32 scale's reciprocal (not the stored one).

float Reciprocal(float d) { return d == 0.0f ? 0.0f : 1.0f / d; }

// The element of largest magnitude, with its sign; the first one on ties.
float SignedAbsMax(const float* x, int n) {
  float amax = std::fabs(x[0]), max = x[0];
  for (int j = 1; j < n; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

int Code(float v, int hi) { return std::clamp(static_cast<int>(v), 0, hi); }  // truncates

void QuantBlock(const float* x, BlockQ8_0& b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f, id = Reciprocal(d);
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  b.d = FloatToHalf(d);
}

void QuantBlock(const float* x, BlockQ4_0& b) {
  const float d = SignedAbsMax(x, 32) / -8.0f, id = Reciprocal(d);
  for (int j = 0; j < 16; ++j) {
    b.qs[j] = static_cast<uint8_t>(Code(x[j] * id + 8.5f, 15) | Code(x[j + 16] * id + 8.5f, 15) << 4);
  }
  b.d = FloatToHalf(d);
}

void QuantBlock(const float* x, BlockQ4_1& b) {
  const float mn = *std::min_element(x, x + 32), mx = *std::max_element(x, x + 32);
  const float d = (mx - mn) / 15.0f, id = Reciprocal(d);
  for (int j = 0; j < 16; ++j) {
    b.qs[j] = static_cast<uint8_t>(Code((x[j] - mn) * id + 0.5f, 15) |
                                   Code((x[j + 16] - mn) * id + 0.5f, 15) << 4);
  }
  b.d = FloatToHalf(d);
  b.m = FloatToHalf(mn);
}

// Low nibbles into qs (value j and j+16 share a byte), bit 4 of value j into bit j of qh.
void Pack5(const int* q, uint8_t* qs, uint8_t* qh) {
  uint32_t high = 0;
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>((q[j] & 0xF) | (q[j + 16] & 0xF) << 4);
  for (int j = 0; j < 32; ++j) high |= static_cast<uint32_t>(q[j] >> 4) << j;
  for (int i = 0; i < 4; ++i) qh[i] = static_cast<uint8_t>(high >> (8 * i));
}

void QuantBlock(const float* x, BlockQ5_0& b) {
  const float d = SignedAbsMax(x, 32) / -16.0f, id = Reciprocal(d);
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = Code(x[j] * id + 16.5f, 31);
  Pack5(q, b.qs, b.qh);
  b.d = FloatToHalf(d);
}

void QuantBlock(const float* x, BlockQ5_1& b) {
  const float mn = *std::min_element(x, x + 32), mx = *std::max_element(x, x + 32);
  const float d = (mx - mn) / 31.0f, id = Reciprocal(d);
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = Code((x[j] - mn) * id + 0.5f, 31);
  Pack5(q, b.qs, b.qh);
  b.d = FloatToHalf(d);
  b.m = FloatToHalf(mn);
}

int NearestCode(float v, int hi) {
  return std::isfinite(v) ? std::clamp(static_cast<int>(std::lround(v)), 0, hi) : 0;
}

// The K formats with 6-bit scale and min per sub-block of 32 (Q4_K: 4-bit codes, Q5_K:
// 5-bit). Each sub-block's range [min(0, lo), hi] is mapped onto the codes; the scales
// and mins are then quantized against the largest of each, and the codes are chosen
// against the stored (rounded) scales.
void QuantSubBlocksK(const float* x, int max_code, uint16_t* d16, uint16_t* dmin16,
                     uint8_t* scales, int* q) {
  float scale[8], neg_min[8], max_scale = 0.0f, max_neg_min = 0.0f;
  for (int s = 0; s < 8; ++s) {
    const float* xs = x + 32 * s;
    const float lo = std::min(0.0f, *std::min_element(xs, xs + 32));
    const float hi = *std::max_element(xs, xs + 32);
    scale[s] = (hi - lo) / static_cast<float>(max_code);
    neg_min[s] = -lo;
    max_scale = std::max(max_scale, scale[s]);
    max_neg_min = std::max(max_neg_min, neg_min[s]);
  }
  *d16 = FloatToHalf(max_scale / 63.0f);
  *dmin16 = FloatToHalf(max_neg_min / 63.0f);
  const float d = HalfToFloat(*d16), dmin = HalfToFloat(*dmin16);
  uint8_t sc[8], mn[8];
  for (int s = 0; s < 8; ++s) {
    sc[s] = static_cast<uint8_t>(d > 0.0f ? NearestCode(scale[s] / d, 63) : 0);
    mn[s] = static_cast<uint8_t>(dmin > 0.0f ? NearestCode(neg_min[s] / dmin, 63) : 0);
  }
  for (int j = 0; j < 4; ++j) {
    scales[j] = static_cast<uint8_t>(sc[j] | (sc[j + 4] >> 4) << 6);
    scales[j + 4] = static_cast<uint8_t>(mn[j] | (mn[j + 4] >> 4) << 6);
    scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | (mn[j + 4] & 0xF) << 4);
  }
  for (int s = 0; s < 8; ++s) {
    const float ds = d * static_cast<float>(sc[s]), dm = dmin * static_cast<float>(mn[s]);
    for (int l = 0; l < 32; ++l) {
      q[32 * s + l] = ds > 0.0f ? NearestCode((x[32 * s + l] + dm) / ds, max_code) : 0;
    }
  }
}

void QuantBlock(const float* x, BlockQ4_K& b) {
  int q[256];
  QuantSubBlocksK(x, 15, &b.d, &b.dmin, b.scales, q);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      b.qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | q[64 * c + 32 + l] << 4);
    }
  }
}

void QuantBlock(const float* x, BlockQ5_K& b) {
  int q[256];
  QuantSubBlocksK(x, 31, &b.d, &b.dmin, b.scales, q);
  std::memset(b.qh, 0, sizeof(b.qh));
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
      b.qs[32 * c + l] = static_cast<uint8_t>((lo & 0xF) | (hi & 0xF) << 4);
      b.qh[l] |= static_cast<uint8_t>((lo >> 4) << (2 * c) | (hi >> 4) << (2 * c + 1));
    }
  }
}

// Sub-blocks of 16 with a signed int8 scale each: the element of largest magnitude maps
// to code 0 (value −32·scale), as Q4_0 does with −8.
void QuantBlock(const float* x, BlockQ6_K& b) {
  float scale[16], max_scale = 0.0f;
  for (int s = 0; s < 16; ++s) {
    scale[s] = SignedAbsMax(x + 16 * s, 16) / -32.0f;
    max_scale = std::max(max_scale, std::fabs(scale[s]));
  }
  b.d = FloatToHalf(max_scale / 127.0f);
  const float d = HalfToFloat(b.d);
  std::memset(b.ql, 0, sizeof(b.ql));
  std::memset(b.qh, 0, sizeof(b.qh));
  for (int s = 0; s < 16; ++s) {
    const float r = d > 0.0f ? scale[s] / d : 0.0f;
    b.scales[s] = static_cast<int8_t>(std::isfinite(r) ? std::clamp(std::lround(r), -127L, 127L) : 0);
    const float ds = d * static_cast<float>(b.scales[s]);
    for (int l = 0; l < 16; ++l) {
      const int e = 16 * s + l;
      const int code = ds != 0.0f ? NearestCode(x[e] / ds + 32.0f, 63) : 32;
      const int h = e >> 7, sub = (e >> 5) & 3, i = e & 31;
      b.ql[64 * h + i + 32 * (sub & 1)] |= static_cast<uint8_t>((code & 0xF) << (4 * (sub >> 1)));
      b.qh[32 * h + i] |= static_cast<uint8_t>((code >> 4) << (2 * sub));
    }
  }
}

// ---- rows -----------------------------------------------------------------------------

template <typename Block>
constexpr int kElems = 32;
template <>
constexpr int kElems<BlockQ4_K> = 256;
template <>
constexpr int kElems<BlockQ5_K> = 256;
template <>
constexpr int kElems<BlockQ6_K> = 256;

// Calls f(Block-typed null pointer) for the block type of t; false if t has none.
template <typename F>
bool WithBlockType(DType t, F&& f) {
  switch (t) {
    case DType::kQ8_0: return f(static_cast<const BlockQ8_0*>(nullptr)), true;
    case DType::kQ4_0: return f(static_cast<const BlockQ4_0*>(nullptr)), true;
    case DType::kQ4_1: return f(static_cast<const BlockQ4_1*>(nullptr)), true;
    case DType::kQ5_0: return f(static_cast<const BlockQ5_0*>(nullptr)), true;
    case DType::kQ5_1: return f(static_cast<const BlockQ5_1*>(nullptr)), true;
    case DType::kQ4_K: return f(static_cast<const BlockQ4_K*>(nullptr)), true;
    case DType::kQ5_K: return f(static_cast<const BlockQ5_K*>(nullptr)), true;
    case DType::kQ6_K: return f(static_cast<const BlockQ6_K*>(nullptr)), true;
    default: return false;
  }
}

bool ValidRow(DType t, int64_t n) {
  return IsQuantized(t) && n >= 0 && n % DTypeBlockElems(t) == 0;
}

// In sanitizer builds, what an instrumented load or store in the loops would have reported:
// the first unaddressable byte of [p, p + bytes), described by ASan, then the abort that
// ASan's own reports end in. Nothing in other builds.
inline void CheckRange([[maybe_unused]] const void* p, [[maybe_unused]] int64_t bytes,
                       [[maybe_unused]] const char* what) {
#ifdef SG_CHECK_RANGES_AT_ENTRY
  if (bytes <= 0) return;
  void* bad = __asan_region_is_poisoned(const_cast<void*>(p), static_cast<size_t>(bytes));
  if (bad == nullptr) return;
  std::fprintf(stderr, "stepgraph: %s [%p, +%lld bytes) reaches unaddressable memory at %p\n",
               what, p, static_cast<long long>(bytes), bad);
  __asan_describe_address(bad);
  __sanitizer_print_stack_trace();
  std::abort();
#endif
}

}  // namespace

bool DequantizeRow(DType t, const void* blocks, float* out, int64_t n) {
  if (!ValidRow(t, n)) return false;
  CheckRange(blocks, DTypeRowBytes(t, n), "DequantizeRow: blocks");
  CheckRange(out, n * 4, "DequantizeRow: out");
  return WithBlockType(t, [&](auto* tag) {
    using Block = std::remove_cv_t<std::remove_pointer_t<decltype(tag)>>;
    const auto* b = static_cast<const Block*>(blocks);
    for (int64_t i = 0; i < n / kElems<Block>; ++i) DequantBlock(b[i], out + i * kElems<Block>);
  });
}

namespace {

// The scalar dot products, the definition the vector paths are tested against: blocks
// dequantized one at a time as DequantizeRow does, kLanes independent partial sums.
bool DotRows(DType t, const void* blocks, int64_t rows, int64_t n, const float* x,
             int64_t x_stride, int64_t m, float* out, int64_t out_stride) {
  return WithBlockType(t, [&](auto* tag) {
    using Block = std::remove_cv_t<std::remove_pointer_t<decltype(tag)>>;
    constexpr int kBlock = kElems<Block>;
    const int64_t nb = n / kBlock;
    // Up to kGroup vectors at a time, each with its own lane sums: a block is dequantized
    // once per group.
    constexpr int64_t kGroup = 4;
    float values[kBlock];
    for (int64_t r = 0; r < rows; ++r) {
      const Block* b = static_cast<const Block*>(blocks) + r * nb;
      for (int64_t i0 = 0; i0 < m; i0 += kGroup) {
        const int64_t group = std::min(kGroup, m - i0);
        float acc[kGroup][cpu::kLanes] = {};
        for (int64_t blk = 0; blk < nb; ++blk) {
          DequantBlock(b[blk], values);
          for (int64_t i = 0; i < group; ++i) {
            cpu::AccumulateFixed<kBlock>(values, x + (i0 + i) * x_stride + blk * kBlock, acc[i]);
          }
        }
        for (int64_t i = 0; i < group; ++i) out[(i0 + i) * out_stride + r] = cpu::Fold(acc[i]);
      }
    }
  });
}

QuantIsa ProbeQuantIsa() {
#if SG_QUANT_X86_PATHS
  // The paths also use F16C, which every processor with AVX2 has (and not every compiler
  // can ask about).
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma")) {
    return QuantIsa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return QuantIsa::kAvx2;
#endif
  return QuantIsa::kBaseline;
}

}  // namespace

QuantIsa BestQuantIsa() {
  static const QuantIsa best = ProbeQuantIsa();
  return best;
}

bool QuantIsaSupported(QuantIsa isa) {
  return static_cast<int>(isa) <= static_cast<int>(BestQuantIsa());
}

bool DotQuantizedRowsWith(QuantIsa isa, DType t, const void* blocks, int64_t rows, int64_t n,
                          const float* x, int64_t x_stride, int64_t m, float* out,
                          int64_t out_stride) {
  if (!ValidRow(t, n) || m < 0 || rows < 0 || !QuantIsaSupported(isa)) return false;
  CheckRange(blocks, rows * DTypeRowBytes(t, n), "DotQuantizedRows: blocks");
  for (int64_t i = 0; i < m; ++i) {
    CheckRange(x + i * x_stride, n * 4, "DotQuantizedRows: x row");
    CheckRange(out + i * out_stride, rows * 4, "DotQuantizedRows: out");
  }
  switch (isa) {
#if SG_QUANT_X86_PATHS
    case QuantIsa::kAvx512:
      return DotRowsAvx512(t, blocks, rows, n, x, x_stride, m, out, out_stride);
    case QuantIsa::kAvx2:
      return DotRowsAvx2(t, blocks, rows, n, x, x_stride, m, out, out_stride);
#endif
    default: return DotRows(t, blocks, rows, n, x, x_stride, m, out, out_stride);
  }
}

bool DotQuantizedRows(DType t, const void* blocks, int64_t rows, int64_t n, const float* x,
                      int64_t x_stride, int64_t m, float* out, int64_t out_stride) {
  return DotQuantizedRowsWith(BestQuantIsa(), t, blocks, rows, n, x, x_stride, m, out,
                              out_stride);
}

bool DotQuantizedRow(DType t, const void* blocks, int64_t n, const float* x, int64_t x_stride,
                     int64_t m, float* out, int64_t out_stride) {
  // One row: out[i·out_stride] is the rows form's element (i, 0).
  return DotQuantizedRows(t, blocks, 1, n, x, x_stride, m, out, out_stride);
}

bool QuantizeRow(DType t, const float* in, void* blocks, int64_t n) {
  if (!ValidRow(t, n)) return false;
  CheckRange(in, n * 4, "QuantizeRow: in");
  CheckRange(blocks, DTypeRowBytes(t, n), "QuantizeRow: blocks");
  return WithBlockType(t, [&](auto* tag) {
    using Block = std::remove_cv_t<std::remove_pointer_t<decltype(tag)>>;
    auto* b = static_cast<Block*>(blocks);
    for (int64_t i = 0; i < n / kElems<Block>; ++i) QuantBlock(in + i * kElems<Block>, b[i]);
  });
}

}  // namespace sg
