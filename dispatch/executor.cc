// The executor: the only loop over nodes in stepgraph. Bindings are checked once before
// the loop; inside it, each node's arguments are resolved on the stack (no allocation)
// and handed to the dispatcher through std::visit, one Run per node.
#include <array>
#include <variant>

#include "absl/strings/str_cat.h"
#include "stepgraph/executor.h"
#include "stepgraph/status.h"

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
  if (id.owner != owner_ || id.index < 0 || id.index >= static_cast<int32_t>(kinds_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot bind tensor id ", id.index, ": it belongs to another graph"));
  }
  if (kinds_[id.index] == TensorKind::kIntermediate) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot bind tensor ", id.index,
                     ": it is an Intermediate, which lives in the planned arena"));
  }
  if (data == nullptr || bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot bind tensor ", id.index, ": null or empty buffer"));
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
    if (b.bytes < t.bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          TensorKindName(t.kind), " '", t.name, "' ", t.shape.ToString(), " ",
          DTypeName(t.dtype), " needs ", t.bytes(), " bytes but its buffer has ", b.bytes));
    }
  }
  return absl::OkStatus();
}

TensorArg ResolveTensor(const ExecutionPlan& plan, const Bindings& bindings,
                        int32_t tensor_index) {
  const Tensor& t = plan.graph().tensors()[tensor_index];
  TensorArg arg;
  arg.dtype = t.dtype;
  arg.shape = t.shape;
  arg.kind = t.kind;
  arg.tensor = tensor_index;
  arg.name = t.name;
  if (t.kind == TensorKind::kIntermediate) {
    arg.arena_offset = plan.memory().offsets[tensor_index];
    arg.data = static_cast<char*>(bindings.arena().data) + arg.arena_offset;
  } else {
    arg.data = bindings.buffer(tensor_index).data;
  }
  return arg;
}

absl::StatusOr<ExecStats> Execute(const ExecutionPlan& plan, const Bindings& bindings,
                                  KernelDispatch& dispatch) {
  SG_RETURN_IF_ERROR(CheckBindings(plan, bindings));
  const Graph& graph = plan.graph();
  ExecStats stats;
  std::array<TensorArg, 4> inputs;
  for (int32_t i = 0; i < graph.num_nodes(); ++i) {
    const Node& node = graph.nodes()[i];
    const size_t n = node.inputs.size();
    for (size_t k = 0; k < n; ++k) inputs[k] = ResolveTensor(plan, bindings, node.inputs[k].index);
    NodeArgs args;
    args.node_index = i;
    args.node_name = node.name;
    args.inputs = absl::MakeConstSpan(inputs.data(), n);
    args.output = ResolveTensor(plan, bindings, node.output.index);
    absl::Status status =
        std::visit([&](const auto& op) { return dispatch.Run(op, args); }, node.op);
    if (ABSL_PREDICT_FALSE(!status.ok())) {
      return absl::Status(status.code(),
                          absl::StrCat("node ", i, " '", node.name, "' (", OpName(node.op),
                                       "): ", status.message()));
    }
    ++stats.launches;
  }
  return stats;
}

}  // namespace sg
