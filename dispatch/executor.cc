// The executor: the only loop over nodes in stepgraph. Bindings are checked once before
// the loop; inside it, each node's arguments are resolved on the stack (no allocation)
// and handed to the dispatcher through std::visit, one Run per node.
#include <array>
#include <variant>

#include "absl/strings/str_cat.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/base/status.h"

namespace sg {

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
  // Inference (and so Validate) refuses a node with more inputs than this.
  std::array<TensorArg, kMaxNodeInputs> inputs;
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
  if (ABSL_PREDICT_FALSE(n > scratch.inputs.size())) {
    return absl::InternalError(absl::StrCat("node '", node.name, "' has ", n,
                                            " inputs; the executor takes at most ",
                                            scratch.inputs.size()));
  }
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
  ExecStats stats;
  NodeScratch scratch;
  for (int32_t i = 0; i < num_nodes; ++i) {
    SG_RETURN_IF_ERROR(RunNode(prepared, bindings, dispatch, i, scratch));
    ++stats.launches;
    if (options.after_node) SG_RETURN_IF_ERROR(options.after_node(i));
  }
  return stats;
}

}  // namespace sg
