// DType names, Shape helpers and the f16 conversions of half.h.
#include <cmath>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stepgraph/half.h"
#include "stepgraph/types.h"

namespace sg {

absl::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    if (name == DTypeName(t)) return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "' (expected f32, bf16, f16 or i32)"));
}

absl::string_view TensorKindName(TensorKind k) {
  switch (k) {
    case TensorKind::kInput:
      return "Input";
    case TensorKind::kWeight:
      return "Weight";
    case TensorKind::kState:
      return "State";
    case TensorKind::kIntermediate:
      return "Intermediate";
  }
  return "?";
}

Shape::Shape(std::initializer_list<int64_t> dims)
    : Shape(absl::Span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(absl::Span<const int64_t> dims) {
  if (dims.size() > static_cast<size_t>(kMaxRank)) {
    valid_ = false;
    rank_ = kMaxRank;
    for (int i = 0; i < kMaxRank; ++i) dims_[i] = dims[i];
    return;
  }
  rank_ = static_cast<int8_t>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    dims_[i] = dims[i];
    if (dims[i] <= 0) valid_ = false;
  }
}

int64_t Shape::rows() const {
  int64_t r = 1;
  for (int i = 0; i + 1 < rank_; ++i) r *= dims_[i];
  return r;
}

int64_t Shape::NumElements() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

std::string Shape::ToString() const {
  return absl::StrCat("[", absl::StrJoin(dims(), ","), valid_ ? "]" : ",...] (invalid)");
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u);
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000u) {                         // below the smallest normal half
    if (abs < 0x33000000u) return sign;            // < 2^-25 rounds to zero
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;
    // value = mant * 2^(exp-150); half subnormal unit is 2^-24: q = mant >> (126 - exp).
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  uint32_t h = ((abs >> 13) - (112u << 10));  // rebias exponent 127 -> 15
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}

}  // namespace sg
