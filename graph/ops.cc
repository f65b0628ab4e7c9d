// Op names, parameter printing and shape/dtype inference: one function per op, chosen by
// overload resolution inside std::visit.
#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/ops.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace {

constexpr absl::string_view kOpNames[] = {
#define SG_OP_NAME(Name) #Name,
    SG_OP_LIST(SG_OP_NAME)
#undef SG_OP_NAME
};
static_assert(sizeof(kOpNames) / sizeof(kOpNames[0]) == kNumOps);

std::string Params(const ops::Embedding& op) {
  return op.dequant_dtype == DType::kF32 ? ""
                                         : absl::StrCat("dequant=", DTypeName(op.dequant_dtype));
}
std::string Params(const ops::MatMul& op) { return op.has_bias ? "bias" : ""; }
std::string Params(const ops::RmsNorm& op) { return absl::StrFormat("eps=%g", op.eps); }
std::string Params(const ops::Rope& op) {
  std::string s = absl::StrFormat("head_dim=%d theta=%g", op.head_dim, op.theta);
  if (op.interleaved) absl::StrAppend(&s, " interleaved");
  if (op.scaling.type == ops::RopeScaling::Type::kLlama3) {
    absl::StrAppendFormat(&s, " llama3(factor=%g low=%g high=%g original_max=%d)",
                          op.scaling.factor, op.scaling.low_freq_factor,
                          op.scaling.high_freq_factor, op.scaling.original_max_position);
  } else if (op.scaling.type == ops::RopeScaling::Type::kLinear) {
    absl::StrAppendFormat(&s, " linear(factor=%g)", op.scaling.factor);
  }
  return s;
}
std::string Params(const ops::KvWrite& op) { return op.has_slots ? "slots" : ""; }
std::string Params(const ops::Attention& op) {
  std::string s = absl::StrFormat("scale=%g", op.scale);
  if (op.window > 0) absl::StrAppendFormat(&s, " window=%d", op.window);
  if (op.softcap > 0.0f) absl::StrAppendFormat(&s, " softcap=%g", op.softcap);
  if (op.has_slots) absl::StrAppend(&s, " slots");
  return s;
}
std::string Params(const ops::HeadRmsNorm& op) { return absl::StrFormat("eps=%g", op.eps); }
std::string Params(const ops::Scale& op) { return absl::StrFormat("factor=%g", op.factor); }
std::string Params(const ops::Softcap& op) { return absl::StrFormat("cap=%g", op.cap); }
std::string Params(const ops::AllReduce& op) {
  return absl::StrCat("ranks=", op.ranks, op.residual ? " residual" : "");
}
std::string Params(const ops::AllGather& op) { return absl::StrCat("ranks=", op.ranks); }
std::string Params(const ops::MoeTopK& op) { return absl::StrCat("top_k=", op.top_k); }
std::string Params(const ops::MoeMatMul& op) { return op.silu_mul ? "silu_mul" : ""; }
std::string Params(const ops::MoeCombine& op) {
  std::string s = op.matmul ? "matmul" : "";
  if (op.residual) absl::StrAppend(&s, s.empty() ? "" : " ", "residual");
  if (op.route) {
    absl::StrAppend(&s, s.empty() ? "" : " ", "route renormalize=", op.renormalize ? 1 : 0,
                    " round_to_dtype=", op.round_to_dtype ? 1 : 0);
  }
  return s;
}
std::string Params(const ops::MoeRouteWeights& op) {
  std::string s = op.renormalize ? "renormalize" : "";
  if (op.round_to_dtype) absl::StrAppend(&s, s.empty() ? "" : " ", "round_to_dtype");
  return s;
}
std::string Params(const ops::Sample& op) {
  return absl::StrFormat("temperature=%g top_k=%d top_p=%g", op.temperature, op.top_k,
                         op.top_p);
}
std::string Params(const ops::FusedMatMul& op) {
  std::string s = absl::StrCat("weights=", op.weights);
  if (op.norm) absl::StrAppendFormat(&s, " norm(eps=%g)", op.eps);
  switch (op.epilogue) {
    case ops::FusedMatMul::Epilogue::kNone: break;
    case ops::FusedMatMul::Epilogue::kAdd: absl::StrAppend(&s, " +add"); break;
    case ops::FusedMatMul::Epilogue::kSiluMul: absl::StrAppend(&s, " +silu_mul"); break;
    case ops::FusedMatMul::Epilogue::kArgmax: absl::StrAppend(&s, " +argmax"); break;
    case ops::FusedMatMul::Epilogue::kRopeKvWrite:
      absl::StrAppend(&s, " +rope_kv_write(", Params(op.rope), ")");
      break;
  }
  return s;
}
std::string Params(const ops::RopeKvWrite& op) {
  std::string s = Params(op.rope);
  if (op.head_norm) absl::StrAppendFormat(&s, " head_norm eps=%g", op.eps);
  return s;
}
// "silu_mul(0,1) add(2,0)": each step and the values it reads, numbered as
// ops::FusedElementwise numbers them (the node's inputs first, then the steps).
std::string Params(const ops::FusedElementwise& op) {
  std::string s;
  const int n = std::clamp(op.num_steps, 0, ops::FusedElementwise::kMaxSteps);
  for (int i = 0; i < n; ++i) {
    const ops::FusedElementwise::Step& st = op.steps[i];
    absl::StrAppend(&s, i == 0 ? "" : " ", ElementwiseKindName(st.kind), "(", int{st.a});
    if (IsBinaryKind(st.kind)) absl::StrAppend(&s, ",", int{st.b});
    absl::StrAppend(&s, ")");
  }
  return s;
}
template <typename T>
std::string Params(const T&) {
  return "";
}

// Describes a tensor for an error message: "'q' [1,2048] bf16".
std::string Describe(const Tensor& t) {
  return absl::StrCat("'", t.name, "' ", t.shape.ToString(), " ", DTypeName(t.dtype));
}

// The checks shared by the per-op inference functions; every error names the op, the
// node and the offending tensor.
class Checker {
 public:
  Checker(absl::string_view op_name, absl::string_view node,
          absl::Span<const Tensor* const> in)
      : op_name_(op_name), node_(node), in_(in) {}

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(op_name_, " node '", node_, "': ", what));
  }
  absl::Status Arity(size_t n) const {
    if (in_.size() == n) return absl::OkStatus();
    return Error(absl::StrCat("takes ", n, " inputs, got ", in_.size()));
  }
  absl::Status Rank(int i, int rank, absl::string_view role) const {
    if (in_[i]->shape.rank() == rank) return absl::OkStatus();
    return Error(absl::StrCat(role, " ", Describe(*in_[i]), " must have rank ", rank));
  }
  absl::Status Float(int i, absl::string_view role) const {
    if (IsFloat(in_[i]->dtype)) return absl::OkStatus();
    return Error(absl::StrCat(role, " ", Describe(*in_[i]), " must be f32, bf16 or f16"));
  }
  // A float tensor, or a Weight in one of the quantized block formats (the builder has
  // checked that its rows are whole blocks).
  absl::Status FloatOrQuantizedWeight(int i, absl::string_view role) const {
    const DType t = in_[i]->dtype;
    if (IsFloat(t)) return absl::OkStatus();
    if (IsQuantized(t) && in_[i]->kind == TensorKind::kWeight) return absl::OkStatus();
    return Error(absl::StrCat(role, " ", Describe(*in_[i]),
                              " must be f32, bf16, f16 or a quantized Weight"));
  }
  absl::Status Int(int i, absl::string_view role) const {
    if (in_[i]->dtype == DType::kI32) return absl::OkStatus();
    return Error(absl::StrCat(role, " ", Describe(*in_[i]), " must be i32"));
  }
  absl::Status SameDType(int i, int j) const {
    if (in_[i]->dtype == in_[j]->dtype) return absl::OkStatus();
    return Error(
        absl::StrCat("dtype mismatch: ", Describe(*in_[i]), " vs ", Describe(*in_[j])));
  }
  absl::Status SameShape(int i, int j) const {
    if (in_[i]->shape == in_[j]->shape) return absl::OkStatus();
    return Error(
        absl::StrCat("shape mismatch: ", Describe(*in_[i]), " vs ", Describe(*in_[j])));
  }
  // An i32 vector with one entry per row (ids, positions, seeds).
  absl::Status PerRow(int i, int64_t rows, absl::string_view role) const {
    SG_RETURN_IF_ERROR(Rank(i, 1, role));
    SG_RETURN_IF_ERROR(Int(i, role));
    if (in_[i]->shape[0] == rows) return absl::OkStatus();
    return Error(absl::StrCat(role, " ", Describe(*in_[i]), " must have ", rows,
                              " entries, one per row"));
  }
  // The written tensor of an in-place op must be bound memory that may change.
  absl::Status Writable(int i, absl::string_view role) const {
    const TensorKind k = in_[i]->kind;
    if (k == TensorKind::kState || k == TensorKind::kInput) return absl::OkStatus();
    return Error(absl::StrCat(role, " ", Describe(*in_[i]), " is ", TensorKindName(k),
                              "; only a State or Input can be written in place"));
  }
  const Tensor& operator[](int i) const { return *in_[i]; }
  int size() const { return static_cast<int>(in_.size()); }

 private:
  absl::string_view op_name_;
  absl::string_view node_;
  absl::Span<const Tensor* const> in_;
};

using Result = absl::StatusOr<TensorType>;

Result Infer(const ops::Embedding& op, const Checker& c) {
  SG_RETURN_IF_ERROR(c.Arity(2));
  SG_RETURN_IF_ERROR(c.Rank(0, 2, "table"));
  SG_RETURN_IF_ERROR(c.FloatOrQuantizedWeight(0, "table"));
  SG_RETURN_IF_ERROR(c.Rank(1, 1, "ids"));
  SG_RETURN_IF_ERROR(c.Int(1, "ids"));
  DType out = c[0].dtype;
  if (IsQuantized(out)) {
    if (!IsFloat(op.dequant_dtype)) {
      return c.Error(absl::StrCat("dequant_dtype ", DTypeName(op.dequant_dtype),
                                  " of the quantized table must be f32, bf16 or f16"));
    }
    out = op.dequant_dtype;
  }
  return TensorType{out, Shape{c[1].shape[0], c[0].shape[1]}};
}

Result Infer(const ops::MatMul& op, const Checker& c) {
  SG_RETURN_IF_ERROR(c.Arity(op.has_bias ? 3 : 2));
  SG_RETURN_IF_ERROR(c.Rank(0, 2, "x"));
  SG_RETURN_IF_ERROR(c.Rank(1, 2, "w"));
  SG_RETURN_IF_ERROR(c.Float(0, "x"));
  SG_RETURN_IF_ERROR(c.FloatOrQuantizedWeight(1, "w"));
  if (!IsQuantized(c[1].dtype)) SG_RETURN_IF_ERROR(c.SameDType(0, 1));
  if (c[0].shape[1] != c[1].shape[1]) {
    return c.Error(absl::StrCat("shape mismatch: x ", Describe(c[0]), " has K=",
                                c[0].shape[1], " but w ", Describe(c[1]), " [N,K] has K=",
                                c[1].shape[1]));
  }
  if (op.has_bias) {
    SG_RETURN_IF_ERROR(c.Rank(2, 1, "bias"));
    SG_RETURN_IF_ERROR(c.SameDType(0, 2));
    if (c[2].shape[0] != c[1].shape[0]) {
      return c.Error(absl::StrCat("bias ", Describe(c[2]), " must have N=", c[1].shape[0],
                                  " entries"));
    }
  }
  return TensorType{c[0].dtype, Shape{c[0].shape[0], c[1].shape[0]}};
}

Result Infer(const ops::RmsNorm& op, const Checker& c) {
  SG_RETURN_IF_ERROR(c.Arity(2));
  SG_RETURN_IF_ERROR(c.Rank(0, 2, "x"));
  SG_RETURN_IF_ERROR(c.Rank(1, 1, "w"));
  SG_RETURN_IF_ERROR(c.Float(0, "x"));
  SG_RETURN_IF_ERROR(c.SameDType(0, 1));
  if (c[1].shape[0] != c[0].shape[1]) {
    return c.Error(absl::StrCat("shape mismatch: w ", Describe(c[1]), " must have H=",
                                c[0].shape[1], " entries for x ", Describe(c[0])));
  }
  if (!(op.eps >= 0.0f) || !std::isfinite(op.eps)) {
    return c.Error(absl::StrCat("eps must be finite and >= 0, got ", op.eps));
  }
  return TensorType{c[0].dtype, c[0].shape};
}

Result InferBinary(const Checker& c, bool allow_int) {
  SG_RETURN_IF_ERROR(c.Arity(2));
  if (!allow_int) SG_RETURN_IF_ERROR(c.Float(0, "a"));
  SG_RETURN_IF_ERROR(c.SameDType(0, 1));
  SG_RETURN_IF_ERROR(c.SameShape(0, 1));
  return TensorType{c[0].dtype, c[0].shape};
}
Result Infer(const ops::Add&, const Checker& c) { return InferBinary(c, /*allow_int=*/true); }
Result Infer(const ops::Mul&, const Checker& c) { return InferBinary(c, /*allow_int=*/false); }
Result Infer(const ops::SiluMul&, const Checker& c) {
  return InferBinary(c, /*allow_int=*/false);
}
Result Infer(const ops::GeluTanhMul&, const Checker& c) {
  return InferBinary(c, /*allow_int=*/false);
}

Result Infer(const ops::HeadRmsNorm& op, const Checker& c) {
  SG_RETURN_IF_ERROR(c.Arity(2));
  SG_RETURN_IF_ERROR(c.Rank(0, 2, "x"));
  SG_RETURN_IF_ERROR(c.Rank(1, 1, "w"));
  SG_RETURN_IF_ERROR(c.Float(0, "x"));
  SG_RETURN_IF_ERROR(c.SameDType(0, 1));
  const int64_t d = c[1].shape[0];
  if (d <= 0 || c[0].shape[1] % d != 0) {
    return c.Error(absl::StrCat("w ", Describe(c[1]), " must have head_dim entries dividing ",
                                "the columns of x ", Describe(c[0])));
  }
  if (!(op.eps >= 0.0f) || !std::isfinite(op.eps)) {
    return c.Error(absl::StrCat("eps must be finite and >= 0, got ", op.eps));
  }
  return TensorType{c[0].dtype, c[0].shape};
}

// x -> same shape and dtype, a float; `value` names the parameter that must be finite and
// positive.
Result InferUnaryFloat(const Checker& c, absl::string_view what, float value) {
  SG_RETURN_IF_ERROR(c.Arity(1));
  SG_RETURN_IF_ERROR(c.Float(0, "x"));
  if (!(value > 0.0f) || !std::isfinite(value)) {
    return c.Error(absl::StrCat(what, " must be finite and > 0, got ", value));
  }
  return TensorType{c[0].dtype, c[0].shape};
}
Result Infer(const ops::Scale& op, const Checker& c) {
  return InferUnaryFloat(c, "factor", op.factor);
}
Result Infer(const ops::Softcap& op, const Checker& c) {
  return InferUnaryFloat(c, "cap", op.cap);
}

Result Infer(const ops::Silu&, const Checker& c) {
  SG_RETURN_IF_ERROR(c.Arity(1));
  SG_RETURN_IF_ERROR(c.Float(0, "x"));
  return TensorType{c[0].dtype, c[0].shape};
}

Result Infer(const ops::FusedElementwise& op, const Checker& c) {
  using F = ops::FusedElementwise;
  const int n = c.size();
  if (n < 1 || n > F::kMaxInputs) {
    return c.Error(absl::StrCat("takes 1 to ", F::kMaxInputs, " inputs, got ", n));
  }
  if (op.num_steps < 1 || op.num_steps > F::kMaxSteps) {
    return c.Error(absl::StrCat("has ", op.num_steps, " steps; 1 to ", F::kMaxSteps,
                                " are allowed"));
  }
  SG_RETURN_IF_ERROR(c.Float(0, "input 0"));
  for (int i = 1; i < n; ++i) {
    SG_RETURN_IF_ERROR(c.SameDType(0, i));
    SG_RETURN_IF_ERROR(c.SameShape(0, i));
  }
  for (int i = 0; i < op.num_steps; ++i) {
    const F::Step& st = op.steps[i];
    const int defined = n + i;  // values a step may read: the inputs and earlier steps
    const bool binary = IsBinaryKind(st.kind);
    if (st.kind > F::Kind::kSiluMul) {
      return c.Error(absl::StrCat("step ", i, " has unknown kind ", static_cast<int>(st.kind)));
    }
    if (st.a >= defined || (binary && st.b >= defined) || (!binary && st.b != 0)) {
      return c.Error(absl::StrCat("step ", i, " (", ElementwiseKindName(st.kind),
                                  ") reads value ", int{st.a},
                                  binary ? absl::StrCat(" and ", int{st.b}) : "",
                                  "; only values 0 to ", defined - 1,
                                  " exist there", binary ? "" : " (and b must be 0)"));
    }
  }
  return TensorType{c[0].dtype, c[0].shape};
}

absl::Status CheckRopeParams(const ops::Rope& op, const Checker& c);

Result Infer(const ops::Rope& op, const Checker& c) {
  SG_RETURN_IF_ERROR(c.Arity(2));
  SG_RETURN_IF_ERROR(c.Rank(0, 2, "x"));
  SG_RETURN_IF_ERROR(c.Float(0, "x"));
  SG_RETURN_IF_ERROR(c.PerRow(1, c[0].shape[0], "pos"));
  if (op.head_dim <= 0 || op.head_dim % 2 != 0 || c[0].shape[1] % op.head_dim != 0) {
    return c.Error(absl::StrCat("head_dim ", op.head_dim, " must be even, positive and divide ",
                                "the columns of x ", Describe(c[0])));
  }
  SG_RETURN_IF_ERROR(CheckRopeParams(op, c));
  return TensorType{c[0].dtype, c[0].shape};
}

absl::Status CheckRopeParams(const ops::Rope& op, const Checker& c) {
  if (!(op.theta > 0.0f) || !std::isfinite(op.theta)) {
    return c.Error(absl::StrCat("theta must be finite and > 0, got ", op.theta));
  }
  if (op.scaling.type == ops::RopeScaling::Type::kLlama3) {
    const ops::RopeScaling& s = op.scaling;
    if (!(s.factor > 0.0f) || !(s.low_freq_factor > 0.0f) ||
        !(s.high_freq_factor > s.low_freq_factor) || s.original_max_position <= 0) {
      return c.Error(absl::StrCat(
          "llama3 rope scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
          "original_max_position > 0; got factor=", s.factor, " low_freq_factor=",
          s.low_freq_factor, " high_freq_factor=", s.high_freq_factor,
          " original_max_position=", s.original_max_position));
    }
  }
  if (op.scaling.type == ops::RopeScaling::Type::kLinear &&
      (!(op.scaling.factor > 0.0f) || !std::isfinite(op.scaling.factor))) {
    return c.Error(absl::StrCat("linear rope scaling needs a finite factor > 0, got ",
                                op.scaling.factor));
  }
  return absl::OkStatus();
}

// The cache layout [slots, kvh, S, d] shared by KvWrite and Attention. `rows` is the
// number of slots the step addresses by row (0 when a seq_slots input picks them).
absl::Status CheckCache(const Checker& c, int i, absl::string_view role, int64_t rows) {
  SG_RETURN_IF_ERROR(c.Rank(i, 4, role));
  SG_RETURN_IF_ERROR(c.Float(i, role));
  if (c[i].kind != TensorKind::kState) {
    return c.Error(absl::StrCat(role, " ", Describe(c[i]), " must be a State, not ",
                                TensorKindName(c[i].kind)));
  }
  if (c[i].shape[0] < rows) {
    return c.Error(absl::StrCat(role, " ", Describe(c[i]), " has ", c[i].shape[0],
                                " slots, fewer than the ", rows, " rows of the step"));
  }
  return absl::OkStatus();
}

// pos[rows], k_cache, v_cache at inputs first .. first + 2 of a RoPE + KV-cache write
// (ops::RopeKvWrite, or the FusedMatMul epilogue) whose values have x's (input 0's) dtype.
absl::Status CheckRopeKvWriteInputs(const ops::Rope& rope, const Checker& c, int first,
                                    int64_t rows) {
  SG_RETURN_IF_ERROR(c.PerRow(first, rows, "pos"));
  SG_RETURN_IF_ERROR(CheckCache(c, first + 1, "k_cache", rows));
  SG_RETURN_IF_ERROR(CheckCache(c, first + 2, "v_cache", rows));
  SG_RETURN_IF_ERROR(c.SameShape(first + 1, first + 2));
  SG_RETURN_IF_ERROR(c.SameDType(0, first + 1));
  SG_RETURN_IF_ERROR(c.SameDType(0, first + 2));
  const int64_t d = c[first + 1].shape[3];
  if (rope.head_dim != d || d % 2 != 0) {
    return c.Error(absl::StrCat("rope head_dim ", rope.head_dim,
                                " must be even and equal the head_dim of k_cache ",
                                Describe(c[first + 1])));
  }
  return CheckRopeParams(rope, c);
}

// seq_slots[B] i32 of a step of M rows: B must divide M (B sequences of M / B rows).
absl::Status CheckSeqSlots(const Checker& c, int i, int64_t rows) {
  SG_RETURN_IF_ERROR(c.Rank(i, 1, "seq_slots"));
  SG_RETURN_IF_ERROR(c.Int(i, "seq_slots"));
  const int64_t seqs = c[i].shape[0];
  if (seqs > 0 && rows % seqs == 0) return absl::OkStatus();
  return c.Error(absl::StrCat("seq_slots ", Describe(c[i]), " must have a number of entries ",
                              "that divides the ", rows, " rows of the step (B sequences of ",
                              "M / B rows each)"));
}

Result Infer(const ops::KvWrite& op, const Checker& c) {
  SG_RETURN_IF_ERROR(c.Arity(op.has_slots ? 4 : 3));
  SG_RETURN_IF_ERROR(c.Rank(0, 2, "kv"));
  SG_RETURN_IF_ERROR(c.Float(0, "kv"));
  const int64_t rows = c[0].shape[0];
  SG_RETURN_IF_ERROR(c.PerRow(1, rows, "pos"));
  // The cache is written in place, so it is the last input.
  const int ci = op.has_slots ? 3 : 2;
  if (op.has_slots) SG_RETURN_IF_ERROR(CheckSeqSlots(c, 2, rows));
  SG_RETURN_IF_ERROR(CheckCache(c, ci, "cache", op.has_slots ? 0 : rows));
  SG_RETURN_IF_ERROR(c.SameDType(0, ci));
  const Shape& cache = c[ci].shape;
  int64_t kv_cols = 0;
  if (!CheckedMul(cache[1], cache[3], &kv_cols) || c[0].shape[1] != kv_cols) {
    return c.Error(absl::StrCat("shape mismatch: kv ", Describe(c[0]),
                                " must have kvh*d columns for cache ", Describe(c[ci])));
  }
  return TensorType{c[ci].dtype, cache};
}

Result Infer(const ops::Attention& op, const Checker& c) {
  SG_RETURN_IF_ERROR(c.Arity(op.has_slots ? 5 : 4));
  SG_RETURN_IF_ERROR(c.Rank(0, 2, "q"));
  SG_RETURN_IF_ERROR(c.Float(0, "q"));
  const int64_t rows = c[0].shape[0];
  const int64_t slot_rows = op.has_slots ? 0 : rows;
  if (op.has_slots) SG_RETURN_IF_ERROR(CheckSeqSlots(c, 4, rows));
  SG_RETURN_IF_ERROR(CheckCache(c, 1, "k_cache", slot_rows));
  SG_RETURN_IF_ERROR(CheckCache(c, 2, "v_cache", slot_rows));
  SG_RETURN_IF_ERROR(c.SameShape(1, 2));
  SG_RETURN_IF_ERROR(c.SameDType(0, 1));
  SG_RETURN_IF_ERROR(c.SameDType(0, 2));
  SG_RETURN_IF_ERROR(c.PerRow(3, rows, "pos"));
  const int64_t kv_heads = c[1].shape[1];
  const int64_t head_dim = c[1].shape[3];
  if (c[0].shape[1] % head_dim != 0) {
    return c.Error(absl::StrCat("q ", Describe(c[0]), " columns are not a multiple of head_dim ",
                                head_dim, " of k_cache ", Describe(c[1])));
  }
  const int64_t heads = c[0].shape[1] / head_dim;
  if (heads % kv_heads != 0) {
    return c.Error(absl::StrCat("GQA: ", heads, " query heads of q ", Describe(c[0]),
                                " are not divisible by the ", kv_heads,
                                " kv heads of k_cache ", Describe(c[1])));
  }
  if (!(op.scale > 0.0f) || !std::isfinite(op.scale)) {
    return c.Error(absl::StrCat("scale must be finite and > 0, got ", op.scale));
  }
  if (op.window < 0) return c.Error(absl::StrCat("window must be >= 0, got ", op.window));
  if (!(op.softcap >= 0.0f) || !std::isfinite(op.softcap)) {
    return c.Error(absl::StrCat("softcap must be finite and >= 0, got ", op.softcap));
  }
  return TensorType{c[0].dtype, c[0].shape};
}

Result Infer(const ops::Softmax&, const Checker& c) {
  SG_RETURN_IF_ERROR(c.Arity(1));
  SG_RETURN_IF_ERROR(c.Rank(0, 2, "x"));
  SG_RETURN_IF_ERROR(c.Float(0, "x"));
  return TensorType{c[0].dtype, c[0].shape};
}

Result Infer(const ops::Argmax&, const Checker& c) {
  SG_RETURN_IF_ERROR(c.Arity(1));
  SG_RETURN_IF_ERROR(c.Rank(0, 2, "x"));
  SG_RETURN_IF_ERROR(c.Float(0, "x"));
  return TensorType{DType::kI32, Shape{c[0].shape[0]}};
}

Result Infer(const ops::Sample& op, const Checker& c) {
  SG_RETURN_IF_ERROR(c.Arity(3));
  SG_RETURN_IF_ERROR(c.Rank(0, 2, "logits"));
  SG_RETURN_IF_ERROR(c.Float(0, "logits"));
  const int64_t rows = c[0].shape[0];
  SG_RETURN_IF_ERROR(c.PerRow(1, rows, "seeds"));
  SG_RETURN_IF_ERROR(c.PerRow(2, rows, "pos"));
  if (!(op.temperature > 0.0f) || !std::isfinite(op.temperature)) {
    return c.Error(absl::StrCat("temperature must be finite and > 0, got ", op.temperature,
                                " (use Argmax for greedy decoding)"));
  }
  if (op.top_k < 0) return c.Error(absl::StrCat("top_k must be >= 0, got ", op.top_k));
  if (!(op.top_p > 0.0f && op.top_p <= 1.0f)) {
    return c.Error(absl::StrCat("top_p must be in (0, 1], got ", op.top_p));
  }
  return TensorType{DType::kI32, Shape{rows}};
}

Result Infer(const ops::Penalize&, const Checker& c) {
  SG_RETURN_IF_ERROR(c.Arity(3));
  SG_RETURN_IF_ERROR(c.Rank(0, 2, "logits"));
  SG_RETURN_IF_ERROR(c.Float(0, "logits"));
  SG_RETURN_IF_ERROR(c.Rank(1, 2, "params"));
  SG_RETURN_IF_ERROR(c.Rank(2, 2, "counts"));
  if (c[1].dtype != DType::kF32 || c[1].shape[1] != ops::kPenaltyParams) {
    return c.Error(absl::StrCat("params ", Describe(c[1]), " must be f32 [slots, ",
                                ops::kPenaltyParams, "]"));
  }
  SG_RETURN_IF_ERROR(c.Int(2, "counts"));
  if (c[2].shape[1] != c[0].shape[1] || c[2].shape[0] != c[1].shape[0] ||
      c[2].shape[0] < c[0].shape[0]) {
    return c.Error(absl::StrCat("counts ", Describe(c[2]), " must be [slots, vocab] with the ",
                                "params' slots and the logits' vocab, slots >= rows (logits ",
                                Describe(c[0]), ", params ", Describe(c[1]), ")"));
  }
  return TensorType{DType::kF32, c[0].shape};
}

Result Infer(const ops::CountIds&, const Checker& c) {
  SG_RETURN_IF_ERROR(c.Arity(3));
  SG_RETURN_IF_ERROR(c.Rank(0, 1, "ids"));
  SG_RETURN_IF_ERROR(c.Int(0, "ids"));
  SG_RETURN_IF_ERROR(c.PerRow(1, c[0].shape[0], "pos"));
  SG_RETURN_IF_ERROR(c.Rank(2, 2, "counts"));
  SG_RETURN_IF_ERROR(c.Int(2, "counts"));
  SG_RETURN_IF_ERROR(c.Writable(2, "counts"));
  if (c[2].shape[0] < c[0].shape[0]) {
    return c.Error(absl::StrCat("counts ", Describe(c[2]), " has fewer slots than the ",
                                c[0].shape[0], " rows of ids"));
  }
  return TensorType{c[2].dtype, c[2].shape};
}

Result Infer(const ops::Copy&, const Checker& c) {
  SG_RETURN_IF_ERROR(c.Arity(2));
  SG_RETURN_IF_ERROR(c.Writable(1, "dst"));
  SG_RETURN_IF_ERROR(c.SameDType(0, 1));
  SG_RETURN_IF_ERROR(c.SameShape(0, 1));
  return TensorType{c[1].dtype, c[1].shape};
}

Result Infer(const ops::Advance&, const Checker& c) {
  SG_RETURN_IF_ERROR(c.Arity(1));
  SG_RETURN_IF_ERROR(c.Rank(0, 1, "pos"));
  SG_RETURN_IF_ERROR(c.Int(0, "pos"));
  SG_RETURN_IF_ERROR(c.Writable(0, "pos"));
  return TensorType{c[0].dtype, c[0].shape};
}

// A FusedMatMul's inputs: x, [norm_w], the weights from FirstWeight, then the epilogue's
// (residual, or pos, k_cache, v_cache) from FirstEpilogueInput.
int FirstWeight(const ops::FusedMatMul& op) { return op.norm ? 2 : 1; }
int FirstEpilogueInput(const ops::FusedMatMul& op) { return FirstWeight(op) + op.weights; }

Result Infer(const ops::FusedMatMul& op, const Checker& c) {
  using Epilogue = ops::FusedMatMul::Epilogue;
  if (op.weights < 1 || op.weights > 3) {
    return c.Error(absl::StrCat("weights must be in [1, 3], got ", op.weights));
  }
  const int first_w = FirstWeight(op);
  const int extra = op.epilogue == Epilogue::kAdd           ? 1
                    : op.epilogue == Epilogue::kRopeKvWrite ? 3
                                                            : 0;
  SG_RETURN_IF_ERROR(c.Arity(static_cast<size_t>(FirstEpilogueInput(op) + extra)));
  SG_RETURN_IF_ERROR(c.Rank(0, 2, "x"));
  SG_RETURN_IF_ERROR(c.Float(0, "x"));
  const int64_t m = c[0].shape[0], k = c[0].shape[1];
  if (op.norm) {
    SG_RETURN_IF_ERROR(c.Rank(1, 1, "norm_w"));
    SG_RETURN_IF_ERROR(c.SameDType(0, 1));
    if (c[1].shape[0] != k) {
      return c.Error(absl::StrCat("shape mismatch: norm_w ", Describe(c[1]), " must have K=", k,
                                  " entries for x ", Describe(c[0])));
    }
    if (!(op.eps >= 0.0f) || !std::isfinite(op.eps)) {
      return c.Error(absl::StrCat("eps must be finite and >= 0, got ", op.eps));
    }
  }
  int64_t n_total = 0;
  for (int g = 0; g < op.weights; ++g) {
    const int i = first_w + g;
    SG_RETURN_IF_ERROR(c.Rank(i, 2, "w"));
    SG_RETURN_IF_ERROR(c.FloatOrQuantizedWeight(i, "w"));
    if (!IsQuantized(c[i].dtype)) SG_RETURN_IF_ERROR(c.SameDType(0, i));
    if (c[i].shape[1] != k) {
      return c.Error(absl::StrCat("shape mismatch: x ", Describe(c[0]), " has K=", k,
                                  " but w ", Describe(c[i]), " [N,K] has K=", c[i].shape[1]));
    }
    if (!CheckedAdd(n_total, c[i].shape[0], &n_total)) return c.Error("N overflows");
  }
  switch (op.epilogue) {
    case Epilogue::kNone:
      return TensorType{c[0].dtype, Shape{m, n_total}};
    case Epilogue::kAdd: {
      const int r = FirstEpilogueInput(op);
      SG_RETURN_IF_ERROR(c.SameDType(0, r));
      if (c[r].shape != Shape{m, n_total}) {
        return c.Error(absl::StrCat("residual ", Describe(c[r]), " must be [", m, ",", n_total,
                                    "]"));
      }
      return TensorType{c[0].dtype, Shape{m, n_total}};
    }
    case Epilogue::kSiluMul:
      if (op.weights != 2 || c[first_w].shape[0] != c[first_w + 1].shape[0]) {
        return c.Error("the silu_mul epilogue takes two weights (gate, up) of equal N");
      }
      return TensorType{c[0].dtype, Shape{m, c[first_w].shape[0]}};
    case Epilogue::kArgmax:
      if (op.weights != 1) return c.Error("the argmax epilogue takes one weight");
      return TensorType{DType::kI32, Shape{m}};
    case Epilogue::kRopeKvWrite: {
      if (op.weights != 3) {
        return c.Error("the rope_kv_write epilogue takes three weights (q, k, v)");
      }
      const int p = FirstEpilogueInput(op);  // pos, k_cache, v_cache
      SG_RETURN_IF_ERROR(CheckRopeKvWriteInputs(op.rope, c, p, m));
      const int64_t kv_cols = c[p + 1].shape[1] * c[p + 1].shape[3];
      const int64_t d = op.rope.head_dim;
      const int64_t n_q = c[first_w].shape[0];
      if (c[first_w + 1].shape[0] != kv_cols || c[first_w + 2].shape[0] != kv_cols ||
          n_q % d != 0) {
        return c.Error(absl::StrCat("the rope_kv_write epilogue takes w_q [h*d, K] and w_k, w_v",
                                    " [kvh*d, K] for caches ", Describe(c[p + 1]), "; got ",
                                    Describe(c[first_w]), ", ", Describe(c[first_w + 1]), ", ",
                                    Describe(c[first_w + 2])));
      }
      return TensorType{c[0].dtype, Shape{m, n_q}};
    }
  }
  return c.Error("unknown epilogue");
}

Result Infer(const ops::RopeKvWrite& op, const Checker& c) {
  SG_RETURN_IF_ERROR(c.Arity(op.head_norm ? 6 : 4));
  SG_RETURN_IF_ERROR(c.Rank(0, 2, "qkv"));
  SG_RETURN_IF_ERROR(c.Float(0, "qkv"));
  const int64_t rows = c[0].shape[0];
  SG_RETURN_IF_ERROR(CheckRopeKvWriteInputs(op.rope, c, 1, rows));
  const int64_t kv_heads = c[2].shape[1], d = c[2].shape[3];
  const int64_t kv_cols = kv_heads * d;  // the cache's shape was checked for overflow
  const int64_t q_cols = c[0].shape[1] - 2 * kv_cols;
  if (q_cols <= 0 || q_cols % d != 0) {
    return c.Error(absl::StrCat("qkv ", Describe(c[0]), " must have (h + 2*kvh)*d columns, h > 0",
                                ", for caches ", Describe(c[2])));
  }
  if (op.head_norm) {
    for (int i : {4, 5}) {
      const char* role = i == 4 ? "q_norm" : "k_norm";
      SG_RETURN_IF_ERROR(c.Rank(i, 1, role));
      SG_RETURN_IF_ERROR(c.SameDType(0, i));
      if (c[i].shape[0] != d) {
        return c.Error(absl::StrCat(role, " ", Describe(c[i]), " must have head_dim ", d,
                                    " entries"));
      }
    }
    if (!(op.eps >= 0.0f) || !std::isfinite(op.eps)) {
      return c.Error(absl::StrCat("eps must be finite and >= 0, got ", op.eps));
    }
  }
  return TensorType{c[0].dtype, Shape{rows, q_cols}};
}

// ---- Mixture of experts: logits [M, E], ids [M, k], stacked weights [E, N, K].

Result Infer(const ops::MoeTopK& op, const Checker& c) {
  SG_RETURN_IF_ERROR(c.Arity(1));
  SG_RETURN_IF_ERROR(c.Rank(0, 2, "logits"));
  SG_RETURN_IF_ERROR(c.Float(0, "logits"));
  if (op.top_k < 1 || op.top_k > c[0].shape[1]) {
    return c.Error(absl::StrCat("top_k must be in [1, ", c[0].shape[1], "] (the experts of ",
                                "logits ", Describe(c[0]), "), got ", op.top_k));
  }
  return TensorType{DType::kI32, Shape{c[0].shape[0], op.top_k}};
}

// ids [M, k] i32 at input i for a step of `rows` rows.
absl::Status CheckExpertIds(const Checker& c, int i, int64_t rows) {
  SG_RETURN_IF_ERROR(c.Rank(i, 2, "ids"));
  SG_RETURN_IF_ERROR(c.Int(i, "ids"));
  if (c[i].shape[0] == rows && c[i].shape[1] >= 1) return absl::OkStatus();
  return c.Error(absl::StrCat("ids ", Describe(c[i]), " must be [", rows, ", top_k]"));
}

Result Infer(const ops::MoeRouteWeights&, const Checker& c) {
  SG_RETURN_IF_ERROR(c.Arity(2));
  SG_RETURN_IF_ERROR(c.Rank(0, 2, "logits"));
  SG_RETURN_IF_ERROR(c.Float(0, "logits"));
  SG_RETURN_IF_ERROR(CheckExpertIds(c, 1, c[0].shape[0]));
  return TensorType{DType::kF32, c[1].shape};
}

Result Infer(const ops::MoeMatMul& op, const Checker& c) {
  SG_RETURN_IF_ERROR(c.Arity(op.silu_mul ? 4 : 3));
  SG_RETURN_IF_ERROR(c.Rank(0, 2, "x"));
  SG_RETURN_IF_ERROR(c.Float(0, "x"));
  SG_RETURN_IF_ERROR(c.Rank(1, 3, "w"));
  SG_RETURN_IF_ERROR(c.FloatOrQuantizedWeight(1, "w"));
  if (!IsQuantized(c[1].dtype)) SG_RETURN_IF_ERROR(c.SameDType(0, 1));
  const int ids = op.silu_mul ? 3 : 2;
  if (op.silu_mul) {  // w_up: w_gate's shape and dtype
    SG_RETURN_IF_ERROR(c.FloatOrQuantizedWeight(2, "w_up"));
    SG_RETURN_IF_ERROR(c.SameShape(1, 2));
    SG_RETURN_IF_ERROR(c.SameDType(1, 2));
  }
  const int64_t m = c[0].shape[0], n = c[1].shape[1], k = c[1].shape[2];
  SG_RETURN_IF_ERROR(CheckExpertIds(c, ids, m));
  const int64_t top_k = c[ids].shape[1];
  if (op.silu_mul && c[0].shape[1] != k) {
    return c.Error(absl::StrCat("silu_mul: x ", Describe(c[0]), " must have K=", k,
                                " columns (one input for every chosen expert)"));
  }
  int64_t per_slot = 0, out_cols = 0;
  if (!CheckedMul(top_k, k, &per_slot) || !CheckedMul(top_k, n, &out_cols)) {
    return c.Error("top_k * N or top_k * K overflows");
  }
  if (c[0].shape[1] != k && c[0].shape[1] != per_slot) {
    return c.Error(absl::StrCat("shape mismatch: x ", Describe(c[0]), " must have K=", k,
                                " columns (one input for every chosen expert) or top_k*K=",
                                per_slot, " (one per expert) for w ", Describe(c[1]),
                                " [E,N,K]"));
  }
  return TensorType{c[0].dtype, Shape{m, out_cols}};
}

Result Infer(const ops::MoeCombine& op, const Checker& c) {
  const int w = op.residual ? 4 : 3;  // with `matmul`: the down experts' input
  SG_RETURN_IF_ERROR(c.Arity(op.matmul ? w + 1 : w));
  const char* first = op.matmul ? "x" : "y";
  SG_RETURN_IF_ERROR(c.Rank(0, 2, first));
  SG_RETURN_IF_ERROR(c.Float(0, first));
  const char* second = op.route ? "logits" : "weights";
  SG_RETURN_IF_ERROR(c.Rank(1, 2, second));
  SG_RETURN_IF_ERROR(c.Float(1, second));
  SG_RETURN_IF_ERROR(CheckExpertIds(c, 2, c[0].shape[0]));
  if (op.route) {
    if (c[1].shape[0] != c[0].shape[0] || c[1].shape[1] < 1) {
      return c.Error(absl::StrCat("logits ", Describe(c[1]), " must be [M, E] with the M of ",
                                  first, " ", Describe(c[0])));
    }
  } else {
    SG_RETURN_IF_ERROR(c.SameShape(1, 2));
  }
  const int64_t top_k = c[2].shape[1];
  // y's columns: y's own, or with `matmul` the top_k · N that w makes of x.
  int64_t cols = c[0].shape[1];
  if (op.matmul) {
    SG_RETURN_IF_ERROR(c.Rank(w, 3, "w"));
    SG_RETURN_IF_ERROR(c.FloatOrQuantizedWeight(w, "w"));
    if (!IsQuantized(c[w].dtype)) SG_RETURN_IF_ERROR(c.SameDType(0, w));
    int64_t per_slot = 0;
    if (!CheckedMul(top_k, c[w].shape[2], &per_slot) ||
        !CheckedMul(top_k, c[w].shape[1], &cols)) {
      return c.Error("top_k * N or top_k * K overflows");
    }
    if (c[0].shape[1] != per_slot) {
      return c.Error(absl::StrCat("matmul: x ", Describe(c[0]), " must have top_k*K=", per_slot,
                                  " columns (one input per chosen expert) for w ",
                                  Describe(c[w]), " [E,N,K] and ids ", Describe(c[2])));
    }
  }
  const char* y = op.matmul ? "x·w" : "y";
  if (c[1].shape[0] != c[0].shape[0] || top_k < 1 || cols % top_k != 0) {
    return c.Error(absl::StrCat(second, " ", Describe(c[1]), " and ids ", Describe(c[2]),
                                " must be [M, ", op.route ? "E" : "top_k",
                                "] and [M, top_k] with top_k dividing the columns of ", y,
                                " (", cols, ")"));
  }
  const Shape out{c[0].shape[0], cols / top_k};
  if (op.residual && (c[3].shape != out || c[3].dtype != c[0].dtype)) {
    return c.Error(absl::StrCat("residual ", Describe(c[3]), " must be ", out.ToString(), " ",
                                DTypeName(c[0].dtype), ", the combined output of ", y));
  }
  return TensorType{c[0].dtype, out};
}

// x[M,N] float of a group of `ranks` ranks; `columns` is N times what each rank's output
// holds per rank's input column (1 for AllReduce, ranks for AllGather).
Result InferCollective(int32_t ranks, int64_t columns, const Checker& c, bool residual = false) {
  SG_RETURN_IF_ERROR(c.Arity(residual ? 2 : 1));
  SG_RETURN_IF_ERROR(c.Rank(0, 2, "x"));
  SG_RETURN_IF_ERROR(c.Float(0, "x"));
  if (ranks < 1 || ranks > ops::kMaxRanks) {
    return c.Error(absl::StrCat("ranks must be in [1, ", ops::kMaxRanks, "], got ", ranks));
  }
  int64_t n = 0;
  if (!CheckedMul(c[0].shape[1], columns, &n)) {
    return c.Error(absl::StrCat("x ", Describe(c[0]), " times ", columns, " overflows"));
  }
  return TensorType{c[0].dtype, Shape{c[0].shape[0], n}};
}
Result Infer(const ops::AllReduce& op, const Checker& c) {
  SG_ASSIGN_OR_RETURN(TensorType out, InferCollective(op.ranks, 1, c, op.residual));
  if (op.residual && !(c[1].dtype == out.dtype && c[1].shape == out.shape)) {
    return c.Error(absl::StrCat("residual ", Describe(c[1]), " must match x ", Describe(c[0])));
  }
  return out;
}
Result Infer(const ops::AllGather& op, const Checker& c) {
  return InferCollective(op.ranks, op.ranks, c);
}

// What each op writes besides a new output of its own (ops.h, InputWrites). One overload
// per op and no template default: an op added to the list must say.
InputWrites Writes(const ops::Embedding&) { return {}; }
InputWrites Writes(const ops::MatMul&) { return {}; }
InputWrites Writes(const ops::RmsNorm&) { return {}; }
InputWrites Writes(const ops::Add&) { return {}; }
InputWrites Writes(const ops::Mul&) { return {}; }
InputWrites Writes(const ops::Silu&) { return {}; }
InputWrites Writes(const ops::SiluMul&) { return {}; }
InputWrites Writes(const ops::Rope&) { return {}; }
// The cache, the last input; the node's output is the cache.
InputWrites Writes(const ops::KvWrite& op) { return {{op.has_slots ? 3 : 2}, true}; }
InputWrites Writes(const ops::Attention&) { return {}; }
InputWrites Writes(const ops::Softmax&) { return {}; }
InputWrites Writes(const ops::Argmax&) { return {}; }
InputWrites Writes(const ops::Sample&) { return {}; }
InputWrites Writes(const ops::Penalize&) { return {}; }
InputWrites Writes(const ops::CountIds&) { return {{2}, true}; }  // counts
InputWrites Writes(const ops::Copy&) { return {{1}, true}; }     // dst
InputWrites Writes(const ops::Advance&) { return {{0}, true}; }  // pos
// The k and v caches beside the output q.
InputWrites Writes(const ops::RopeKvWrite&) { return {{2, 3}, false}; }
InputWrites Writes(const ops::FusedMatMul& op) {
  if (op.epilogue != ops::FusedMatMul::Epilogue::kRopeKvWrite) return {};
  const int32_t pos = FirstEpilogueInput(op);  // then k_cache, v_cache
  return {{pos + 1, pos + 2}, false};
}
InputWrites Writes(const ops::FusedElementwise&) { return {}; }
InputWrites Writes(const ops::HeadRmsNorm&) { return {}; }
InputWrites Writes(const ops::GeluTanhMul&) { return {}; }
InputWrites Writes(const ops::Scale&) { return {}; }
InputWrites Writes(const ops::Softcap&) { return {}; }
InputWrites Writes(const ops::MoeTopK&) { return {}; }
InputWrites Writes(const ops::MoeRouteWeights&) { return {}; }
InputWrites Writes(const ops::MoeMatMul&) { return {}; }
InputWrites Writes(const ops::MoeCombine&) { return {}; }
InputWrites Writes(const ops::AllReduce&) { return {}; }
InputWrites Writes(const ops::AllGather&) { return {}; }

}  // namespace

absl::string_view OpName(const Op& op) { return kOpNames[op.index()]; }

absl::Span<const absl::string_view> AllOpNames() { return kOpNames; }

InputWrites WrittenInputs(const Op& op) {
  return std::visit([](const auto& o) { return Writes(o); }, op);
}

bool IsInPlace(const Op& op) { return WrittenInputs(op).output_is_written; }

bool WritesInputs(const Op& op) { return !WrittenInputs(op).inputs.empty(); }

std::string OpParamsToString(const Op& op) {
  return std::visit([](const auto& o) { return Params(o); }, op);
}

absl::string_view ElementwiseKindName(ops::FusedElementwise::Kind kind) {
  switch (kind) {
    case ops::FusedElementwise::Kind::kAdd: return "add";
    case ops::FusedElementwise::Kind::kMul: return "mul";
    case ops::FusedElementwise::Kind::kSilu: return "silu";
    case ops::FusedElementwise::Kind::kSiluMul: return "silu_mul";
  }
  return "unknown";
}

absl::StatusOr<TensorType> InferOutputType(const Op& op, absl::string_view node_name,
                                           absl::Span<const Tensor* const> inputs) {
  const Checker checker(OpName(op), node_name, inputs);
  if (inputs.size() > static_cast<size_t>(kMaxNodeInputs)) {
    return checker.Error(absl::StrCat("takes at most ", kMaxNodeInputs, " inputs, got ",
                                      inputs.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i]->shape.valid()) {
      return checker.Error(absl::StrCat("input ", Describe(*inputs[i]), " has an invalid shape"));
    }
  }
  absl::StatusOr<TensorType> out = std::visit([&](const auto& o) { return Infer(o, checker); }, op);
  // Valid inputs can still imply an output past the bounds (MatMul of [2^31, k] by
  // [2^31, k] is 2^62 elements); its size would overflow every later product.
  if (out.ok() && !out->shape.valid()) {
    return checker.Error(absl::StrCat("output shape ", out->shape.ToString(), " is invalid: ",
                                      out->shape.Invalidity()));
  }
  return out;
}

}  // namespace sg
