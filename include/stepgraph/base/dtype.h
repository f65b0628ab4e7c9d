// DType alone, with no Abseil, so that CUDA kernels and the C ABI can share it.
#ifndef STEPGRAPH_BASE_DTYPE_H_
#define STEPGRAPH_BASE_DTYPE_H_

#include <cstdint>

namespace sg {

// Storage types. Floating-point math always accumulates in f32; i32 holds token ids and
// positions. The quantized types are GGUF's block formats, for weights that MatMul and
// Embedding read: a row of such a tensor is a sequence of blocks, each holding
// DTypeBlockElems values in DTypeBlockBytes bytes (layouts in stepgraph/base/quant.h). Shapes
// always count elements; a quantized tensor's last dim is a multiple of its block.
enum class DType : uint8_t {
  kF32,
  kBF16,
  kF16,
  kI32,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ4_K,
  kQ5_K,
  kQ6_K,
};

inline constexpr int kNumDTypes = 12;

// False for a value outside the enum, as a caller through the C ABI or a cast can pass;
// every other function here assumes a valid dtype.
constexpr bool IsValidDType(DType t) { return static_cast<int>(t) < kNumDTypes; }

constexpr bool IsQuantized(DType t) {
  return static_cast<int>(t) >= static_cast<int>(DType::kQ8_0) && IsValidDType(t);
}

// Plain floating-point storage (f32, bf16, f16): one element per DTypeBytes bytes.
constexpr bool IsFloat(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16;
}

// Elements per block: 1 for the plain types, 32 or 256 for the quantized ones.
constexpr int64_t DTypeBlockElems(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
    case DType::kI32:
      return 1;
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
      return 32;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return 256;
  }
  return 0;
}

// Bytes per block (for the plain types, per element).
constexpr int64_t DTypeBlockBytes(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kQ8_0:
      return 34;   // f16 scale, 32 × i8
    case DType::kQ4_0:
      return 18;   // f16 scale, 32 × 4 bits
    case DType::kQ4_1:
      return 20;   // f16 scale and min, 32 × 4 bits
    case DType::kQ5_0:
      return 22;   // f16 scale, 32 high bits, 32 × 4 bits
    case DType::kQ5_1:
      return 24;   // f16 scale and min, 32 high bits, 32 × 4 bits
    case DType::kQ4_K:
      return 144;  // f16 d and dmin, 12 bytes of 6-bit scales/mins, 256 × 4 bits
    case DType::kQ5_K:
      return 176;  // as Q4_K plus 32 bytes of high bits
    case DType::kQ6_K:
      return 210;  // 256 × 4 low bits, 256 × 2 high bits, 16 i8 scales, f16 d
  }
  return 0;
}

// Bytes per element of the plain types; 0 for the quantized ones, which have no size per
// element: use TensorBytes (stepgraph/graph/types.h) or DTypeRowBytes.
constexpr int64_t DTypeBytes(DType t) { return IsQuantized(t) ? 0 : DTypeBlockBytes(t); }

// Bytes of `cols` consecutive elements; -1 when cols is negative or not a whole number of
// blocks. Not overflow-checked: shapes are bounded (Shape::kMaxElements) before this is
// reached.
constexpr int64_t DTypeRowBytes(DType t, int64_t cols) {
  const int64_t block = DTypeBlockElems(t);
  if (cols < 0 || block <= 0 || cols % block != 0) return -1;
  return cols / block * DTypeBlockBytes(t);
}

}  // namespace sg

#endif  // STEPGRAPH_BASE_DTYPE_H_
