// Host-side conversions between f32 and the 16-bit storage types, round to nearest even,
// as the GPU's cvt.rn instructions do. Used by the CPU reference, the weight loader and
// tests; kernels use CUDA's own intrinsics.
#ifndef STEPGRAPH_BASE_HALF_H_
#define STEPGRAPH_BASE_HALF_H_

#include <cstdint>
#include <cstring>

#include "stepgraph/base/dtype.h"

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

// Element i of a plain (not quantized) tensor as f32, and the store back, rounding to the
// storage type. The one host definition of the plain dtypes' element access; 0 (and no
// store) for the block formats, which are read row by row (stepgraph/base/quant.h).
inline float LoadElement(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kBF16:
      return BF16ToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kF16:
      return HalfToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kI32:
      return static_cast<float>(static_cast<const int32_t*>(base)[i]);
    default:
      return 0.0f;
  }
}

inline void StoreElement(void* base, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(base)[i] = v;
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(base)[i] = FloatToBF16(v);
      return;
    case DType::kF16:
      static_cast<uint16_t*>(base)[i] = FloatToHalf(v);
      return;
    case DType::kI32:
      static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v);
      return;
    default:
      return;
  }
}

// `v` as a tensor of dtype `t` would hold it, back in f32: a store and a reload (the
// roundings the CPU reference models). Other dtypes return `v`.
inline float RoundTo(DType t, float v) {
  switch (t) {
    case DType::kBF16:
      return BF16ToFloat(FloatToBF16(v));
    case DType::kF16:
      return HalfToFloat(FloatToHalf(v));
    default:
      return v;
  }
}

}  // namespace sg

#endif  // STEPGRAPH_BASE_HALF_H_
