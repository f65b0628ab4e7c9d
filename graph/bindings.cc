// Bindings: the caller's buffers for a plan's Inputs, Weights, States and arena, and the
// check that they fit the plan before anything runs.
#include "stepgraph/graph/bindings.h"

#include "absl/strings/str_cat.h"
#include "stepgraph/base/status.h"

namespace sg {

Bindings::Bindings(const Graph& graph)
    : owner_(graph.owner()), buffers_(graph.tensors().size()) {
  kinds_.reserve(graph.tensors().size());
  for (int32_t i = 0; i < graph.num_tensors(); ++i) {
    kinds_.push_back(graph.tensors()[i].kind);
    index_by_name_.emplace(graph.tensors()[i].name, i);
  }
}

absl::Status Bindings::Bind(absl::string_view tensor_name, void* data, int64_t bytes) {
  auto it = index_by_name_.find(tensor_name);
  if (it == index_by_name_.end()) {
    return absl::NotFoundError(
        absl::StrCat("cannot bind '", tensor_name, "': the graph has no tensor of that name"));
  }
  return Bind(TensorId{it->second, owner_}, data, bytes);
}

absl::Status Bindings::Bind(TensorId id, void* data, int64_t bytes) {
  if (id.owner != owner_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot bind tensor id ", id.index, ": it belongs to another graph (owner ", id.owner,
        ", these bindings are for ", owner_, ")"));
  }
  if (id.index < 0 || id.index >= static_cast<int32_t>(kinds_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("cannot bind tensor id ", id.index,
                                                   ": the graph has ", kinds_.size(),
                                                   " tensors"));
  }
  // Errors name the tensor; the reverse lookup is only paid on this cold path.
  auto describe = [&] {
    for (const auto& [name, index] : index_by_name_) {
      if (index == id.index) {
        return absl::StrCat(TensorKindName(kinds_[id.index]), " '", name, "'");
      }
    }
    return absl::StrCat("tensor ", id.index);
  };
  if (kinds_[id.index] == TensorKind::kIntermediate) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot bind ", describe(), ": intermediates live in the planned arena"));
  }
  if (data == nullptr || bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot bind ", describe(), ": ", data == nullptr ? "null" : "empty", " buffer (",
        bytes, " bytes)"));
  }
  buffers_[id.index] = Buffer{data, bytes};
  return absl::OkStatus();
}

absl::Status CheckBindings(const ExecutionPlan& plan, const Bindings& bindings) {
  const Graph& graph = plan.graph();
  if (bindings.graph_owner() != graph.owner()) {
    return absl::InvalidArgumentError("bindings were made for another graph");
  }
  if (plan.arena_bytes() > 0 &&
      (bindings.arena().data == nullptr || bindings.arena().bytes < plan.arena_bytes())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "arena is ", bindings.arena().data == nullptr ? "not bound" : "too small", ": ",
        bindings.arena().bytes, " bytes bound, the plan needs ", plan.arena_bytes()));
  }
  for (int32_t i = 0; i < graph.num_tensors(); ++i) {
    const Tensor& t = graph.tensors()[i];
    if (t.kind == TensorKind::kIntermediate) continue;
    const Bindings::Buffer& b = bindings.buffer(i);
    if (b.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          TensorKindName(t.kind), " '", t.name, "' ", t.shape.ToString(), " ",
          DTypeName(t.dtype), " is not bound"));
    }
    // TensorBytes is -1 for a shape without a valid size; such a tensor must never pass
    // as needing less than any buffer.
    const int64_t need = t.bytes();
    if (need < 0 || b.bytes < need) {
      return absl::InvalidArgumentError(absl::StrCat(
          TensorKindName(t.kind), " '", t.name, "' ", t.shape.ToString(), " ",
          DTypeName(t.dtype),
          need < 0 ? " has no valid size"
                   : absl::StrCat(" needs ", need, " bytes but its buffer has ", b.bytes)));
    }
  }
  return absl::OkStatus();
}

}  // namespace sg
