// Philox4x32-10, the counter-based generator Sample uses on every dispatcher, so that a
// (seed, position) pair gives the same random number on the CPU and on the GPU.
// Header only; compiles as host code and, under nvcc, as device code too.
#ifndef STEPGRAPH_BASE_PHILOX_H_
#define STEPGRAPH_BASE_PHILOX_H_

#include <cstdint>

#if defined(__CUDACC__)
#define SG_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SG_HOST_DEVICE inline
#endif

namespace sg {

struct Philox4 {
  uint32_t v[4];
};

SG_HOST_DEVICE Philox4 Philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                     uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// The uniform number in [0, 1) that Sample draws for a row with `seed` at position `pos`:
// 24 random bits, so every value is exact in f32.
SG_HOST_DEVICE float SampleUniform(int32_t seed, int32_t pos) {
  const Philox4 r = Philox4x32_10(static_cast<uint32_t>(pos), 0u, 0x5a6e5031u, 0u,
                                  static_cast<uint32_t>(seed), 0x243F6A88u);
  return static_cast<float>(r.v[0] >> 8) * (1.0f / 16777216.0f);
}

}  // namespace sg

#endif  // STEPGRAPH_BASE_PHILOX_H_
