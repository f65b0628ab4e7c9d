// PreparedPlan, the default KernelDispatch::Prepare (a dispatcher that keeps no per-node
// state), the default weight layout (the file's bytes) and the cold message of a node
// whose state is missing or of another type.
#include "stepgraph/dispatch/dispatch.h"

#include <cstring>

#include "absl/strings/str_cat.h"
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

absl::Status KernelDispatch::RepackWeight(const Tensor& weight,
                                          absl::Span<const std::byte> file_bytes,
                                          absl::Span<std::byte> out) const {
  const int64_t bytes = weight.bytes();
  if (static_cast<int64_t>(file_bytes.size()) != bytes ||
      static_cast<int64_t>(out.size()) != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight '", weight.name, "' holds ", bytes, " bytes; got ", file_bytes.size(),
        " to repack into ", out.size()));
  }
  if (bytes > 0) std::memcpy(out.data(), file_bytes.data(), static_cast<size_t>(bytes));
  return absl::OkStatus();
}

}  // namespace sg
