// The f32 dot product of the CPU reference, written so that the compiler vectorises it:
// kLanes independent partial sums (the order of rounding differs from a serial sum, which
// no op's definition depends on), folded at the end.
#ifndef STEPGRAPH_BASE_DOT_H_
#define STEPGRAPH_BASE_DOT_H_

#include <cstdint>

namespace sg::cpu {

inline constexpr int kLanes = 16;

inline float Dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += a[c + l] * b[c + l];
  }
  for (; c < n; ++c) acc[0] += a[c] * b[c];
  float sum = 0.0f;
  for (int l = 0; l < kLanes; ++l) sum += acc[l];
  return sum;
}

// acc[l] += Σ a[c]·b[c] over c ≡ l (mod kLanes), for a length known at compile time (a
// multiple of kLanes): one quantized block into partial sums that are folded only at the
// end of the row (folding per block would cost a serial chain of adds every block).
template <int N>
inline void AccumulateFixed(const float* __restrict a, const float* __restrict b,
                            float* __restrict acc) {
  static_assert(N % kLanes == 0);
  for (int c = 0; c < N; c += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += a[c + l] * b[c + l];
  }
}

inline float Fold(const float* acc) {
  float sum = 0.0f;
  for (int l = 0; l < kLanes; ++l) sum += acc[l];
  return sum;
}

// out[i] += p · v[i] for i in [0, n).
inline void Axpy(float p, const float* __restrict v, float* __restrict out, int64_t n) {
  for (int64_t c = 0; c < n; ++c) out[c] += p * v[c];
}

}  // namespace sg::cpu

#endif  // STEPGRAPH_BASE_DOT_H_
