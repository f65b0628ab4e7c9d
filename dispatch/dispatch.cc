// PreparedPlan, the default KernelDispatch::Prepare (a dispatcher that keeps no per-node
// state) and the cold message of a node whose state is missing or of another type.
#include "stepgraph/dispatch/dispatch.h"

#include "stepgraph/graph/memory_plan.h"

namespace sg {

PreparedPlan::PreparedPlan(const ExecutionPlan& plan, const KernelDispatch& dispatch,
                           std::vector<std::unique_ptr<PreparedNode>> nodes)
    : plan_(&plan), dispatch_(&dispatch), nodes_(std::move(nodes)) {
  nodes_.resize(static_cast<size_t>(plan.graph().num_nodes()));
}

namespace internal {

absl::Status WrongPreparedState(bool missing) {
  return absl::FailedPreconditionError(
      missing ? "the node has no prepared state: execute the PreparedPlan that this "
                "dispatcher's Prepare made for the plan"
              : "the node's prepared state is not of the type its op's Run expects: execute "
                "the PreparedPlan that this dispatcher's Prepare made for the plan");
}

}  // namespace internal

absl::StatusOr<PreparedPlan> KernelDispatch::Prepare(const ExecutionPlan& plan) {
  return PreparedPlan(plan, *this, {});
}

}  // namespace sg
