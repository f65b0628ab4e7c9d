// PreparedPlan and the default KernelDispatch::Prepare (a dispatcher that keeps no
// per-node state).
#include "stepgraph/dispatch/dispatch.h"

#include "stepgraph/graph/memory_plan.h"

namespace sg {

PreparedPlan::PreparedPlan(const ExecutionPlan& plan, const KernelDispatch& dispatch,
                           std::vector<std::unique_ptr<PreparedNode>> nodes)
    : plan_(&plan), dispatch_(&dispatch), nodes_(std::move(nodes)) {
  nodes_.resize(static_cast<size_t>(plan.graph().num_nodes()));
}

absl::StatusOr<PreparedPlan> KernelDispatch::Prepare(const ExecutionPlan& plan) {
  return PreparedPlan(plan, *this, {});
}

}  // namespace sg
