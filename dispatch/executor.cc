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
    if (b.bytes < t.bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          TensorKindName(t.kind), " '", t.name, "' ", t.shape.ToString(), " ",
          DTypeName(t.dtype), " needs ", t.bytes(), " bytes but its buffer has ", b.bytes));
    }
  }
  return absl::OkStatus();
}

namespace {

// ResolveTensor writing into an existing argument: the per-node path fills the executor's
// reused slots in place rather than building and copying a TensorArg per argument.
inline void ResolveInto(const ExecutionPlan& plan, const Bindings& bindings,
                        int32_t tensor_index, TensorArg& arg) {
  const Tensor& t = plan.graph().tensors()[tensor_index];
  arg.dtype = t.dtype;
  arg.shape = t.shape;
  arg.kind = t.kind;
  arg.tensor = tensor_index;
  arg.name = t.name;
  if (t.kind == TensorKind::kIntermediate) {
    arg.arena_offset = plan.memory().offsets[tensor_index];
    arg.data = static_cast<char*>(bindings.arena().data) + arg.arena_offset;
  } else {
    arg.arena_offset = -1;
    arg.data = bindings.buffer(tensor_index).data;
  }
}

// Argument slots reused by every node of one Execute, so that a node does not pay for
// constructing five TensorArgs before filling them.
struct NodeScratch {
  // Every op takes at most four inputs (Validate checks arities through inference).
  std::array<TensorArg, 4> inputs;
  NodeArgs args;
};

}  // namespace

TensorArg ResolveTensor(const ExecutionPlan& plan, const Bindings& bindings,
                        int32_t tensor_index) {
  TensorArg arg;
  ResolveInto(plan, bindings, tensor_index, arg);
  return arg;
}

namespace {

// Runs node `i`: resolves its arguments on the stack and makes its one Run.
absl::Status RunNode(const PreparedPlan& prepared, const Bindings& bindings,
                     KernelDispatch& dispatch, int32_t i, NodeScratch& scratch) {
  const ExecutionPlan& plan = prepared.plan();
  const Node& node = plan.graph().nodes()[i];
  const size_t n = node.inputs.size();
  for (size_t k = 0; k < n; ++k) {
    ResolveInto(plan, bindings, node.inputs[k].index, scratch.inputs[k]);
  }
  NodeArgs& args = scratch.args;
  args.node_index = i;
  args.node_name = node.name;
  args.inputs = absl::MakeConstSpan(scratch.inputs.data(), n);
  args.prepared = prepared.node(i);
  ResolveInto(plan, bindings, node.output.index, args.output);
  absl::Status status =
      std::visit([&](const auto& op) { return dispatch.Run(op, args); }, node.op);
  if (ABSL_PREDICT_TRUE(status.ok())) return status;
  return absl::Status(status.code(), absl::StrCat("node ", i, " '", node.name, "' (",
                                                  OpName(node.op), "): ", status.message()));
}

}  // namespace

PreparedPlan::PreparedPlan(const ExecutionPlan& plan, const KernelDispatch& dispatch,
                           std::vector<std::unique_ptr<PreparedNode>> nodes)
    : plan_(&plan), dispatch_(&dispatch), nodes_(std::move(nodes)) {
  nodes_.resize(static_cast<size_t>(plan.graph().num_nodes()));
}

absl::StatusOr<PreparedPlan> KernelDispatch::Prepare(const ExecutionPlan& plan) {
  return PreparedPlan(plan, *this, {});
}

absl::StatusOr<ExecStats> Execute(const ExecutionPlan& plan, const Bindings& bindings,
                                  KernelDispatch& dispatch) {
  return Execute(plan, bindings, dispatch, ExecOptions{});
}

absl::StatusOr<ExecStats> Execute(const ExecutionPlan& plan, const Bindings& bindings,
                                  KernelDispatch& dispatch, const ExecOptions& options) {
  SG_ASSIGN_OR_RETURN(const PreparedPlan prepared, dispatch.Prepare(plan));
  return Execute(prepared, bindings, dispatch, options);
}

absl::StatusOr<ExecStats> Execute(const PreparedPlan& prepared, const Bindings& bindings,
                                  KernelDispatch& dispatch, const ExecOptions& options) {
  if (&prepared.dispatch() != &dispatch) {
    return absl::InvalidArgumentError(
        "Execute: the plan was prepared by another dispatcher than the one given");
  }
  const ExecutionPlan& plan = prepared.plan();
  SG_RETURN_IF_ERROR(CheckBindings(plan, bindings));
  const int32_t num_nodes = plan.graph().num_nodes();
  for (const int32_t i : options.only_nodes) {
    if (i < 0 || i >= num_nodes) {
      return absl::InvalidArgumentError(
          absl::StrCat("Execute: node index ", i, " is outside the plan's ", num_nodes, " nodes"));
    }
  }
  ExecStats stats;
  NodeScratch scratch;
  const bool subset = !options.only_nodes.empty();
  const int32_t count = subset ? static_cast<int32_t>(options.only_nodes.size()) : num_nodes;
  for (int32_t k = 0; k < count; ++k) {
    const int32_t i = subset ? options.only_nodes[k] : k;
    SG_RETURN_IF_ERROR(RunNode(prepared, bindings, dispatch, i, scratch));
    ++stats.launches;
    if (options.after_node) SG_RETURN_IF_ERROR(options.after_node(i));
  }
  return stats;
}

}  // namespace sg
