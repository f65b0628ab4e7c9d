// The quantized dot products on x86 vectors (AVX2 + FMA + F16C, AVX-512): each block is
// unpacked in registers, 16 values at a time, into the f32 values DequantizeRow gives (bit
// for bit: every product of a scale and a code is exact in f32, so a fused multiply-add
// there rounds as the reference's multiply then add), and multiplied into 16-lane partial
// sums with fused multiply-adds. Only the order and rounding of the dot's own sums differ
// from the scalar path (quant.cc), as DotQuantizedRows allows.
//
// One source for both widths (quant_dot_kernels.inc: the blocks unpacked to 16 bytes of
// codes with SSE, the tiles of rows and vectors), compiled twice under target pragmas
// beside each width's 16-lane f32 vector. GCC and Clang on x86-64 only.
#include "base/quant_isa.h"

#if SG_QUANT_X86_PATHS

#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "stepgraph/base/quant.h"

#define SG_INLINE [[gnu::always_inline]] inline

// 64-byte vectors passed between helpers, all inlined: no call's ABI is involved (the
// warning comes at the end of the file, so it stays off to the end).
#pragma GCC diagnostic ignored "-Wpsabi"
#if !defined(__clang__)
// GCC 12 warns inside its own AVX-512 headers (their _mm512_undefined_* operands).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// Each path is the kernels compiled under its target, in a namespace of its own.
#if defined(__clang__)
#define SG_TARGET_BEGIN(isa) \
  _Pragma(SG_STR(clang attribute push(__attribute__((target(isa))), apply_to = function)))
#define SG_TARGET_END _Pragma("clang attribute pop")
#else
#define SG_TARGET_BEGIN(isa) _Pragma("GCC push_options") _Pragma(SG_STR(GCC target(isa)))
#define SG_TARGET_END _Pragma("GCC pop_options")
#endif
#define SG_STR(x) #x
#define SG_AVX2 "avx2,fma,f16c"
#define SG_AVX512 "avx512f,avx512bw,avx512vl,avx2,fma,f16c"

SG_TARGET_BEGIN(SG_AVX2)
namespace sg::quant_avx2 {
struct Isa {
  struct V {
    __m256 lo, hi;
  };
  SG_INLINE static V Zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  SG_INLINE static V Splat(float f) { return {_mm256_set1_ps(f), _mm256_set1_ps(f)}; }
  // An f16 scale in every lane (both halves hold the same register).
  SG_INLINE static V Half(const uint16_t* h) {
    const __m256 v = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(*h)));
    return {v, v};
  }
  template <bool kAdd>
  SG_INLINE static V Values(__m128i codes, const V& d, const V& m) {
    const __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes));
    const __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(codes, 8)));
    if constexpr (kAdd) {
      return {_mm256_fmadd_ps(d.lo, q0, m.lo), _mm256_fmadd_ps(d.lo, q1, m.lo)};
    }
    return {_mm256_mul_ps(d.lo, q0), _mm256_mul_ps(d.lo, q1)};
  }
  SG_INLINE static void Fma(const V& v, const float* x, V& acc) {
    acc.lo = _mm256_fmadd_ps(v.lo, _mm256_loadu_ps(x), acc.lo);
    acc.hi = _mm256_fmadd_ps(v.hi, _mm256_loadu_ps(x + 8), acc.hi);
  }
  SG_INLINE static float Sum(const V& v) {
    const __m256 s8 = _mm256_add_ps(v.lo, v.hi);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
  }
};

#include "base/quant_dot_kernels.inc"
}  // namespace sg::quant_avx2
SG_TARGET_END

SG_TARGET_BEGIN(SG_AVX512)
namespace sg::quant_avx512 {
struct Isa {
  using V = __m512;
  SG_INLINE static V Zero() { return _mm512_setzero_ps(); }
  SG_INLINE static V Splat(float f) { return _mm512_set1_ps(f); }
  // An f16 scale in every lane: broadcast as f16, converted once.
  SG_INLINE static V Half(const uint16_t* h) {
    return _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(*h)));
  }
  template <bool kAdd>
  SG_INLINE static V Values(__m128i codes, const V& d, const V& m) {
    const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes));
    if constexpr (kAdd) return _mm512_fmadd_ps(d, q, m);
    return _mm512_mul_ps(d, q);
  }
  SG_INLINE static void Fma(const V& v, const float* x, V& acc) {
    acc = _mm512_fmadd_ps(v, _mm512_loadu_ps(x), acc);
  }
  SG_INLINE static float Sum(const V& v) {
    const __m256 top = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), top);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
  }
};

#include "base/quant_dot_kernels.inc"
}  // namespace sg::quant_avx512
SG_TARGET_END

namespace sg {

// AVX2 has 16 registers of 8 lanes (a 16-lane sum takes two): 4 rows or 4 vectors at once.
[[gnu::target(SG_AVX2)]] bool DotRowsAvx2(DType t, const void* blocks, int64_t rows,
                                                  int64_t n, const float* x, int64_t x_stride,
                                                  int64_t m, float* out, int64_t out_stride) {
  return quant_avx2::AllFormats<4, 4>(t, blocks, rows, n, x, x_stride, m, out, out_stride);
}

// AVX-512 has 32 registers of 16 lanes: 4 rows or 8 vectors at once.
[[gnu::target(SG_AVX512)]] bool DotRowsAvx512(
    DType t, const void* blocks, int64_t rows, int64_t n, const float* x, int64_t x_stride,
    int64_t m, float* out, int64_t out_stride) {
  return quant_avx512::AllFormats<4, 8>(t, blocks, rows, n, x, x_stride, m, out, out_stride);
}

}  // namespace sg

#endif  // SG_QUANT_X86_PATHS
