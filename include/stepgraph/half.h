// Host-side conversions between f32 and the 16-bit storage types, round to nearest even,
// as the GPU's cvt.rn instructions do. Used by the CPU reference, the weight loader and
// tests; kernels use CUDA's own intrinsics.
#ifndef STEPGRAPH_HALF_H_
#define STEPGRAPH_HALF_H_

#include <cstdint>
#include <cstring>

namespace sg {

inline float BF16ToFloat(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t FloatToBF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN, keep the sign
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

}  // namespace sg

#endif  // STEPGRAPH_HALF_H_
