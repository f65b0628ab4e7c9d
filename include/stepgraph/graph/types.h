// Element types, shapes and tensor identities: the vocabulary every other stepgraph header
// speaks. Nothing here touches CUDA.
#ifndef STEPGRAPH_GRAPH_TYPES_H_
#define STEPGRAPH_GRAPH_TYPES_H_

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "stepgraph/base/dtype.h"

namespace sg {

// "f32", "bf16", "f16", "i32", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k",
// "q6_k".
absl::string_view DTypeName(DType t);
// Inverse of DTypeName; InvalidArgument for anything else.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// A dense row-major shape of rank 0..kMaxRank. Trivially copyable so that NodeArgs can be
// built on the stack in the per-step path. A shape built with more than kMaxRank dims, a
// non-positive dim, or more than kMaxElements elements is not valid(); the builder refuses
// such shapes. The element bound keeps every later size product (bytes, arena offsets,
// rows times columns) far from int64 overflow.
class Shape {
 public:
  static constexpr int kMaxRank = 4;
  static constexpr int64_t kMaxElements = int64_t{1} << 48;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(absl::Span<const int64_t> dims);

  int rank() const { return rank_; }
  bool valid() const { return invalid_ == Invalid::kNone; }
  int64_t dim(int i) const { return dims_[i]; }
  int64_t operator[](int i) const { return dims_[i]; }
  // Last dim, or 1 for a scalar.
  int64_t cols() const { return rank_ == 0 ? 1 : dims_[rank_ - 1]; }
  // Product of all dims but the last (1 for rank <= 1).
  int64_t rows() const;
  // The product of the dims; for a shape that is not valid() because it is too large,
  // kMaxElements + 1.
  int64_t NumElements() const { return elements_; }
  // Why the shape is not valid (empty when it is): "rank 5 > 4", "dim 1 is 0",
  // "2^62 elements overflow ...".
  std::string Invalidity() const;
  absl::Span<const int64_t> dims() const { return {dims_.data(), static_cast<size_t>(rank_)}; }
  std::string ToString() const;  // "[2,2048]"

  friend bool operator==(const Shape& a, const Shape& b) {
    return a.rank_ == b.rank_ && a.invalid_ == b.invalid_ && a.dims() == b.dims();
  }
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }

 private:
  std::array<int64_t, kMaxRank> dims_{};
  enum class Invalid : uint8_t { kNone, kRank, kDim, kTooLarge };
  int64_t elements_ = 1;
  int8_t rank_ = 0;
  Invalid invalid_ = Invalid::kNone;
};

// Bytes of a tensor of `dtype` and `shape`: elements times the element size, or whole
// blocks for the quantized types. -1 when the shape is not valid or its last dim is not a
// whole number of blocks. Never overflows: valid shapes are bounded by kMaxElements.
int64_t TensorBytes(DType dtype, const Shape& shape);

// a * b and a + b for sizes, false on int64 overflow or a negative operand.
bool CheckedMul(int64_t a, int64_t b, int64_t* out);
bool CheckedAdd(int64_t a, int64_t b, int64_t* out);

// Who owns a tensor's memory and when it is written.
//   Input:        bound by the caller, one value per step (token ids, positions, seeds).
//   Weight:       bound by the caller, read only.
//   State:        bound by the caller, persists across steps, updated in place (KV cache).
//   Intermediate: produced by exactly one node, placed in the arena by the memory plan.
enum class TensorKind : uint8_t { kInput, kWeight, kState, kIntermediate };

absl::string_view TensorKindName(TensorKind k);

// Names a tensor of one graph. `owner` identifies the builder (and the graph it built) so
// that an id from another graph is refused rather than silently aliasing a tensor here.
struct TensorId {
  int32_t index = -1;
  uint32_t owner = 0;

  bool valid() const { return index >= 0 && owner != 0; }
  friend bool operator==(TensorId a, TensorId b) {
    return a.index == b.index && a.owner == b.owner;
  }
  friend bool operator!=(TensorId a, TensorId b) { return !(a == b); }
};

}  // namespace sg

#endif  // STEPGRAPH_GRAPH_TYPES_H_
