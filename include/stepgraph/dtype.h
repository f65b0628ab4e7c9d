// DType alone, with no Abseil, so that CUDA kernels and the C ABI can share it.
#ifndef STEPGRAPH_DTYPE_H_
#define STEPGRAPH_DTYPE_H_

#include <cstdint>

namespace sg {

// Storage types. Floating-point math always accumulates in f32; i32 holds token ids and
// positions.
enum class DType : uint8_t { kF32, kBF16, kF16, kI32 };

constexpr int64_t DTypeBytes(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
  }
  return 0;
}

constexpr bool IsFloat(DType t) { return t != DType::kI32; }

}  // namespace sg

#endif  // STEPGRAPH_DTYPE_H_
