// GraphBuilder: appends one node per call, infers its output type, and keeps the first
// error so that model code can be written without checking every call.
#include <cctype>
#include <cmath>
#include <string>

#include "absl/base/optimization.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/base/status.h"

namespace sg {

namespace {

// A well-formed id of another builder, as opposed to a default or out-of-range one of this
// builder: the two mistakes have different fixes, so the message tells them apart.
bool IsForeign(TensorId id, uint32_t owner) { return id.valid() && id.owner != owner; }

}  // namespace

GraphBuilder::GraphBuilder() : owner_(NewGraphOwnerTag()) {}

TensorId GraphBuilder::Fail(absl::Status status) {
  if (status_.ok()) status_ = std::move(status);
  return TensorId{};
}

bool GraphBuilder::CheckUsable(absl::string_view what) {
  if (built_) {
    Fail(absl::FailedPreconditionError(
        absl::StrCat("GraphBuilder used after Build(): ", what, " was called on a spent builder")));
    return false;
  }
  return status_.ok();
}

TensorId GraphBuilder::Declare(absl::string_view name, TensorKind kind, DType dtype,
                               Shape shape) {
  // Every call starts so; the message naming the call is only formatted when it is needed.
  if (ABSL_PREDICT_FALSE(built_ || !status_.ok())) {
    CheckUsable(absl::StrCat(TensorKindName(kind), "('", name, "')"));
    return TensorId{};
  }
  if (name.empty()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat(TensorKindName(kind), " declared with an empty name")));
  }
  if (!IsValidDType(dtype)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat(TensorKindName(kind), " '", name, "' has an unknown dtype (value ",
                     static_cast<int>(dtype), "; there are ", kNumDTypes, ")")));
  }
  if (!shape.valid() || shape.rank() == 0) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        TensorKindName(kind), " '", name, "' has an invalid shape ", shape.ToString(), ": ",
        shape.rank() == 0 ? "rank 0" : shape.Invalidity(), " (need rank 1 to ",
        Shape::kMaxRank, ", every dim > 0, at most 2^48 elements)")));
  }
  if (IsQuantized(dtype)) {
    // Block formats hold weights only, as rows of whole blocks; which ops may read them is
    // shape inference's to say (MatMul's w, Embedding's table, MoeMatMul's stacked experts).
    if (kind != TensorKind::kWeight || shape.rank() < 2 || shape.rank() > 3) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          TensorKindName(kind), " '", name, "' ", shape.ToString(), " is ", DTypeName(dtype),
          ": a quantized dtype is only for rank-2 weights (those MatMul and Embedding read) ",
          "and rank-3 stacked expert weights (MoeMatMul)")));
    }
    if (shape.cols() % DTypeBlockElems(dtype) != 0) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "Weight '", name, "' ", shape.ToString(), " is ", DTypeName(dtype), ": its rows of ",
          shape.cols(), " elements are not a whole number of ", DTypeBlockElems(dtype),
          "-element blocks")));
    }
  }
  if (!tensor_names_.emplace(name).second) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("duplicate name: ", TensorKindName(kind), " '", name,
                     "' is already a tensor or node of this graph")));
  }
  tensors_.push_back(Tensor{std::string(name), kind, dtype, shape});
  writer_of_.push_back(-1);
  return TensorId{static_cast<int32_t>(tensors_.size() - 1), owner_};
}

TensorId GraphBuilder::Input(absl::string_view name, DType dtype, Shape shape) {
  return Declare(name, TensorKind::kInput, dtype, shape);
}
TensorId GraphBuilder::Weight(absl::string_view name, DType dtype, Shape shape) {
  return Declare(name, TensorKind::kWeight, dtype, shape);
}
TensorId GraphBuilder::State(absl::string_view name, DType dtype, Shape shape) {
  return Declare(name, TensorKind::kState, dtype, shape);
}

TensorId GraphBuilder::AddNode(Op op, absl::string_view name,
                               absl::Span<const TensorId> inputs) {
  if (ABSL_PREDICT_FALSE(built_ || !status_.ok())) {
    CheckUsable(absl::StrCat(OpName(op), "('", name, "')"));
    return TensorId{};
  }
  // The name is claimed here, once; should the node fail below, the builder is spent anyway.
  std::string node_name(name);
  if (node_name.empty()) {
    std::string base(OpName(op));
    for (char& ch : base) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    do {
      node_name = absl::StrCat(base, "_", auto_name_counter_++);
    } while (!tensor_names_.insert(node_name).second);
  } else if (!tensor_names_.insert(node_name).second) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "duplicate name: ", OpName(op), " node '", node_name,
        "' is already a tensor or node of this graph")));
  }

  absl::InlinedVector<const Tensor*, 4> input_tensors;
  int arg = 0;
  for (const TensorId id : inputs) {
    if (id.owner != owner_ || id.index < 0 ||
        id.index >= static_cast<int32_t>(tensors_.size())) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          OpName(op), " node '", node_name, "': input ", arg, " is ",
          IsForeign(id, owner_) ? "a TensorId of another builder" : "an invalid TensorId",
          " (index ", id.index, ")")));
    }
    input_tensors.push_back(&tensors_[id.index]);
    ++arg;
  }
  absl::StatusOr<TensorType> type = InferOutputType(op, node_name, input_tensors);
  if (!type.ok()) return Fail(type.status());

  const int32_t node_index = static_cast<int32_t>(nodes_.size());
  TensorId output;
  if (IsInPlace(op)) {
    output = *(inputs.end() - 1);
    const Tensor& target = tensors_[output.index];
    if (writer_of_[output.index] >= 0) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          OpName(op), " node '", node_name, "': ", TensorKindName(target.kind), " '",
          target.name, "' is already written by node '", nodes_[writer_of_[output.index]].name,
          "'; a State or Input may be written by one node only")));
    }
  } else {
    tensors_.push_back(Tensor{node_name, TensorKind::kIntermediate, type->dtype, type->shape});
    writer_of_.push_back(-1);
    output = TensorId{static_cast<int32_t>(tensors_.size() - 1), owner_};
  }
  writer_of_[output.index] = node_index;
  nodes_.push_back(Node{std::move(node_name), std::move(op), {inputs.begin(), inputs.end()},
                        output});
  return output;
}

TensorId GraphBuilder::Embedding(TensorId table, TensorId ids, absl::string_view name) {
  return AddNode(ops::Embedding{}, name, {table, ids});
}
TensorId GraphBuilder::Embedding(TensorId table, TensorId ids, DType dequant_dtype,
                                 absl::string_view name) {
  return AddNode(ops::Embedding{dequant_dtype}, name, {table, ids});
}
TensorId GraphBuilder::MatMul(TensorId x, TensorId w, absl::string_view name) {
  return AddNode(ops::MatMul{}, name, {x, w});
}
TensorId GraphBuilder::MatMul(TensorId x, TensorId w, TensorId bias, absl::string_view name) {
  return AddNode(ops::MatMul{.has_bias = true}, name, {x, w, bias});
}
TensorId GraphBuilder::RmsNorm(TensorId x, TensorId w, float eps, absl::string_view name) {
  return AddNode(ops::RmsNorm{.eps = eps}, name, {x, w});
}
TensorId GraphBuilder::FusedMatMul(const ops::FusedMatMul& op,
                                   absl::Span<const TensorId> inputs, absl::string_view name) {
  return AddNode(op, name, inputs);
}
TensorId GraphBuilder::RopeKvWrite(TensorId qkv, TensorId pos, TensorId k_cache,
                                   TensorId v_cache, const ops::Rope& rope,
                                   absl::string_view name) {
  return AddNode(ops::RopeKvWrite{rope}, name, {qkv, pos, k_cache, v_cache});
}
TensorId GraphBuilder::RopeKvWrite(TensorId qkv, TensorId pos, TensorId k_cache,
                                   TensorId v_cache, TensorId q_norm, TensorId k_norm, float eps,
                                   const ops::Rope& rope, absl::string_view name) {
  return AddNode(ops::RopeKvWrite{.rope = rope, .head_norm = true, .eps = eps}, name,
                 {qkv, pos, k_cache, v_cache, q_norm, k_norm});
}
TensorId GraphBuilder::FusedElementwise(const ops::FusedElementwise& op,
                                        absl::Span<const TensorId> inputs,
                                        absl::string_view name) {
  return AddNode(op, name, inputs);
}
TensorId GraphBuilder::Add(TensorId a, TensorId b, absl::string_view name) {
  return AddNode(ops::Add{}, name, {a, b});
}
TensorId GraphBuilder::Mul(TensorId a, TensorId b, absl::string_view name) {
  return AddNode(ops::Mul{}, name, {a, b});
}
TensorId GraphBuilder::Silu(TensorId x, absl::string_view name) {
  return AddNode(ops::Silu{}, name, {x});
}
TensorId GraphBuilder::SiluMul(TensorId gate, TensorId up, absl::string_view name) {
  return AddNode(ops::SiluMul{}, name, {gate, up});
}
TensorId GraphBuilder::Rope(TensorId x, TensorId pos, const ops::Rope& params,
                            absl::string_view name) {
  return AddNode(params, name, {x, pos});
}
TensorId GraphBuilder::KvWrite(TensorId kv, TensorId pos, TensorId cache,
                               absl::string_view name) {
  return AddNode(ops::KvWrite{}, name, {kv, pos, cache});
}
TensorId GraphBuilder::KvWrite(TensorId kv, TensorId pos, TensorId seq_slots, TensorId cache,
                               absl::string_view name) {
  return AddNode(ops::KvWrite{.has_slots = true}, name, {kv, pos, seq_slots, cache});
}
float GraphBuilder::DefaultAttentionScale(TensorId k_cache) const {
  // The default scale needs head_dim, the last dim of the cache; when the cache id is bad,
  // any positive value lets inference report the real problem.
  float scale = 1.0f;
  if (k_cache.owner == owner_ && k_cache.index >= 0 &&
      k_cache.index < static_cast<int32_t>(tensors_.size()) &&
      tensors_[k_cache.index].shape.rank() == 4) {
    scale = 1.0f / std::sqrt(static_cast<float>(tensors_[k_cache.index].shape[3]));
  }
  return scale;
}
TensorId GraphBuilder::Attention(TensorId q, TensorId k_cache, TensorId v_cache, TensorId pos,
                                 absl::string_view name) {
  return Attention(q, k_cache, v_cache, pos, DefaultAttentionScale(k_cache), name);
}
TensorId GraphBuilder::Attention(TensorId q, TensorId k_cache, TensorId v_cache, TensorId pos,
                                 TensorId seq_slots, absl::string_view name) {
  return AddNode(ops::Attention{.scale = DefaultAttentionScale(k_cache), .has_slots = true},
                 name, {q, k_cache, v_cache, pos, seq_slots});
}
TensorId GraphBuilder::Attention(TensorId q, TensorId k_cache, TensorId v_cache, TensorId pos,
                                 float scale, absl::string_view name) {
  return AddNode(ops::Attention{.scale = scale}, name, {q, k_cache, v_cache, pos});
}
TensorId GraphBuilder::Attention(const ops::Attention& params, TensorId q, TensorId k_cache,
                                 TensorId v_cache, TensorId pos, TensorId seq_slots,
                                 absl::string_view name) {
  ops::Attention op = params;
  if (op.scale == 0.0f) op.scale = DefaultAttentionScale(k_cache);
  op.has_slots = seq_slots.valid();
  if (op.has_slots) return AddNode(op, name, {q, k_cache, v_cache, pos, seq_slots});
  return AddNode(op, name, {q, k_cache, v_cache, pos});
}
TensorId GraphBuilder::HeadRmsNorm(TensorId x, TensorId w, float eps, absl::string_view name) {
  return AddNode(ops::HeadRmsNorm{eps}, name, {x, w});
}
TensorId GraphBuilder::GeluTanhMul(TensorId gate, TensorId up, absl::string_view name) {
  return AddNode(ops::GeluTanhMul{}, name, {gate, up});
}
TensorId GraphBuilder::Scale(TensorId x, float factor, absl::string_view name) {
  return AddNode(ops::Scale{factor}, name, {x});
}
TensorId GraphBuilder::Softcap(TensorId x, float cap, absl::string_view name) {
  return AddNode(ops::Softcap{cap}, name, {x});
}

TensorId GraphBuilder::MoeTopK(TensorId logits, int32_t top_k, absl::string_view name) {
  return AddNode(ops::MoeTopK{top_k}, name, {logits});
}

TensorId GraphBuilder::MoeRouteWeights(TensorId logits, TensorId ids,
                                       const ops::MoeRouteWeights& params,
                                       absl::string_view name) {
  return AddNode(params, name, {logits, ids});
}

TensorId GraphBuilder::MoeMatMul(TensorId x, TensorId w, TensorId ids, absl::string_view name) {
  return AddNode(ops::MoeMatMul{}, name, {x, w, ids});
}
TensorId GraphBuilder::MoeGateUpSiluMul(TensorId x, TensorId w_gate, TensorId w_up, TensorId ids,
                                        absl::string_view name) {
  return AddNode(ops::MoeMatMul{.silu_mul = true}, name, {x, w_gate, w_up, ids});
}

TensorId GraphBuilder::MoeCombine(TensorId y, TensorId weights, TensorId ids,
                                  absl::string_view name) {
  return AddNode(ops::MoeCombine{}, name, {y, weights, ids});
}
TensorId GraphBuilder::MoeCombineAdd(TensorId y, TensorId weights, TensorId ids,
                                     TensorId residual, absl::string_view name) {
  return AddNode(ops::MoeCombine{.residual = true}, name, {y, weights, ids, residual});
}

TensorId GraphBuilder::MoeCombineRouted(TensorId y, TensorId logits, TensorId ids,
                                        const ops::MoeRouteWeights& route, TensorId residual,
                                        absl::string_view name) {
  const ops::MoeCombine op{.residual = residual.valid(), .route = true,
                           .renormalize = route.renormalize,
                           .round_to_dtype = route.round_to_dtype};
  if (residual.valid()) return AddNode(op, name, {y, logits, ids, residual});
  return AddNode(op, name, {y, logits, ids});
}

TensorId GraphBuilder::MoeDownCombine(TensorId x, TensorId w, TensorId weights, TensorId ids,
                                      ops::MoeCombine op, TensorId residual,
                                      absl::string_view name) {
  op.matmul = true;
  op.residual = residual.valid();
  if (residual.valid()) return AddNode(op, name, {x, weights, ids, residual, w});
  return AddNode(op, name, {x, weights, ids, w});
}

TensorId GraphBuilder::AllReduce(TensorId x, int32_t ranks, absl::string_view name,
                                 TensorId residual) {
  if (residual.valid()) return AddNode(ops::AllReduce{ranks, true}, name, {x, residual});
  return AddNode(ops::AllReduce{ranks}, name, {x});
}

TensorId GraphBuilder::AllGather(TensorId x, int32_t ranks, absl::string_view name) {
  return AddNode(ops::AllGather{ranks}, name, {x});
}
TensorId GraphBuilder::Softmax(TensorId x, absl::string_view name) {
  return AddNode(ops::Softmax{}, name, {x});
}
TensorId GraphBuilder::Argmax(TensorId x, absl::string_view name) {
  return AddNode(ops::Argmax{}, name, {x});
}
TensorId GraphBuilder::Sample(TensorId logits, TensorId seeds, TensorId pos,
                              const ops::Sample& params, absl::string_view name) {
  return AddNode(params, name, {logits, seeds, pos});
}
TensorId GraphBuilder::Penalize(TensorId logits, TensorId params, TensorId counts,
                                absl::string_view name) {
  return AddNode(ops::Penalize{}, name, {logits, params, counts});
}
TensorId GraphBuilder::CountIds(TensorId ids, TensorId pos, TensorId counts,
                                absl::string_view name) {
  return AddNode(ops::CountIds{}, name, {ids, pos, counts});
}
TensorId GraphBuilder::Copy(TensorId src, TensorId dst, absl::string_view name) {
  return AddNode(ops::Copy{}, name, {src, dst});
}
TensorId GraphBuilder::Advance(TensorId pos, absl::string_view name) {
  return AddNode(ops::Advance{}, name, {pos});
}

void GraphBuilder::Output(absl::string_view name, TensorId t) {
  if (ABSL_PREDICT_FALSE(built_ || !status_.ok())) {
    CheckUsable(absl::StrCat("Output('", name, "')"));
    return;
  }
  if (name.empty()) {
    Fail(absl::InvalidArgumentError("Output declared with an empty name"));
    return;
  }
  if (t.owner != owner_ || t.index < 0 || t.index >= static_cast<int32_t>(tensors_.size())) {
    Fail(absl::InvalidArgumentError(absl::StrCat(
        "Output '", name, "' names ",
        IsForeign(t, owner_) ? "a TensorId of another builder" : "an invalid TensorId")));
    return;
  }
  if (!output_names_.emplace(name).second) {
    absl::string_view previous = "?";
    for (const GraphOutput& o : outputs_) {
      if (o.name == name) previous = tensors_[o.tensor.index].name;
    }
    Fail(absl::InvalidArgumentError(
        absl::StrCat("duplicate output name '", name, "': it already names tensor '", previous,
                     "' and cannot also name '", tensors_[t.index].name, "'")));
    return;
  }
  outputs_.push_back(GraphOutput{std::string(name), t});
}

absl::StatusOr<Graph> GraphBuilder::Build() && {
  if (built_) {
    return absl::FailedPreconditionError("GraphBuilder::Build() called twice");
  }
  built_ = true;
  if (!status_.ok()) return status_;
  if (nodes_.empty()) {
    return absl::InvalidArgumentError("graph is empty: the builder made no nodes");
  }
  return Graph(owner_, std::move(tensors_), std::move(nodes_), std::move(outputs_));
}

}  // namespace sg
