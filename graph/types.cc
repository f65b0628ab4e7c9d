// DType names, Shape helpers and the f16 conversions of half.h.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stepgraph/base/half.h"
#include "stepgraph/graph/types.h"

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
    case DType::kQ8_0:
      return "q8_0";
    case DType::kQ4_0:
      return "q4_0";
    case DType::kQ4_1:
      return "q4_1";
    case DType::kQ5_0:
      return "q5_0";
    case DType::kQ5_1:
      return "q5_1";
    case DType::kQ4_K:
      return "q4_k";
    case DType::kQ5_K:
      return "q5_k";
    case DType::kQ6_K:
      return "q6_k";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType t = static_cast<DType>(i);
    if (name == DTypeName(t)) return t;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype '", name,
      "' (expected f32, bf16, f16, i32, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k or q6_k)"));
}

bool CheckedMul(int64_t a, int64_t b, int64_t* out) {
  if (a < 0 || b < 0) return false;
  return !__builtin_mul_overflow(a, b, out);
}

bool CheckedAdd(int64_t a, int64_t b, int64_t* out) {
  if (a < 0 || b < 0) return false;
  return !__builtin_add_overflow(a, b, out);
}

int64_t TensorBytes(DType dtype, const Shape& shape) {
  if (!shape.valid()) return -1;
  const int64_t row = DTypeRowBytes(dtype, shape.cols());
  if (row < 0) return -1;
  return shape.rows() * row;
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
  const size_t rank = std::min(dims.size(), static_cast<size_t>(kMaxRank));
  rank_ = static_cast<int8_t>(rank);
  for (size_t i = 0; i < rank; ++i) dims_[i] = dims[i];
  if (dims.size() > static_cast<size_t>(kMaxRank)) {
    invalid_ = Invalid::kRank;
  } else {
    for (size_t i = 0; i < rank && invalid_ == Invalid::kNone; ++i) {
      if (dims[i] <= 0) invalid_ = Invalid::kDim;
    }
  }
  if (invalid_ != Invalid::kNone) {
    elements_ = 0;
    return;
  }
  for (size_t i = 0; i < rank; ++i) {
    int64_t next = 0;
    if (!CheckedMul(elements_, dims[i], &next) || next > kMaxElements) {
      invalid_ = Invalid::kTooLarge;
      elements_ = kMaxElements + 1;
      return;
    }
    elements_ = next;
  }
}

std::string Shape::Invalidity() const {
  switch (invalid_) {
    case Invalid::kNone:
      return "";
    case Invalid::kRank:
      return absl::StrCat("more than ", kMaxRank, " dims");
    case Invalid::kDim:
      for (int i = 0; i < rank_; ++i) {
        if (dims_[i] <= 0) return absl::StrCat("dim ", i, " is ", dims_[i], ", not > 0");
      }
      return "a dim is not > 0";
    case Invalid::kTooLarge:
      return absl::StrCat("the product of its dims exceeds 2^48 = ", kMaxElements,
                          " elements, far beyond any real tensor");
  }
  return "?";
}

int64_t Shape::rows() const {
  int64_t r = 1;
  for (int i = 0; i + 1 < rank_; ++i) r *= dims_[i];
  return r;
}

std::string Shape::ToString() const {
  return absl::StrCat("[", absl::StrJoin(dims(), ","), 
                      invalid_ == Invalid::kRank ? ",...] (invalid)"
                      : valid()                  ? "]"
                                                 : "] (invalid)");
}

}  // namespace sg
