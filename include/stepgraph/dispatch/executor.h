// The executor: the only loop over nodes. It resolves each node's tensors to bound
// buffers or arena offsets and makes exactly one dispatch.Run per node.
#ifndef STEPGRAPH_DISPATCH_EXECUTOR_H_
#define STEPGRAPH_DISPATCH_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stepgraph/dispatch/dispatch.h"
#include "stepgraph/graph/bindings.h"
#include "stepgraph/graph/memory_plan.h"

namespace sg {

struct ExecStats {
  int64_t launches = 0;
};

// Optional controls of one Execute call, used by capture: a hook after each node's Run
// (to map the launches a node made).
struct ExecOptions {
  // Called after each node's Run succeeded; an error stops execution and is returned.
  std::function<absl::Status(int32_t node_index)> after_node;
};

// Runs every node of a prepared plan once, in order, with `dispatch` (the dispatcher that
// prepared it; InvalidArgument otherwise). A dispatch error stops execution and is
// returned with the node's index, name and op. Nothing here allocates or formats unless a
// node fails.
absl::StatusOr<ExecStats> Execute(const PreparedPlan& prepared, const Bindings& bindings,
                                  KernelDispatch& dispatch, const ExecOptions& options = {});

// Prepares `plan` with `dispatch` and executes it: for one-off runs (tests, tools). Steps
// that run repeatedly keep their PreparedPlan (see StepRunner).
absl::StatusOr<ExecStats> Execute(const ExecutionPlan& plan, const Bindings& bindings,
                                  KernelDispatch& dispatch);
absl::StatusOr<ExecStats> Execute(const ExecutionPlan& plan, const Bindings& bindings,
                                  KernelDispatch& dispatch, const ExecOptions& options);

// The argument of `tensor_index` as Execute resolves it; for dispatchers and tools that
// need a tensor's address outside a step (e.g. reading an output). Bindings must be
// checked.
TensorArg ResolveTensor(const ExecutionPlan& plan, const Bindings& bindings,
                        int32_t tensor_index);

}  // namespace sg

#endif  // STEPGRAPH_DISPATCH_EXECUTOR_H_
