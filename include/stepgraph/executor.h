// The executor: the only loop over nodes. It resolves each node's tensors to bound
// buffers or arena offsets and makes exactly one dispatch.Run per node.
#ifndef STEPGRAPH_EXECUTOR_H_
#define STEPGRAPH_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stepgraph/dispatch.h"
#include "stepgraph/plan.h"

namespace sg {

// Caller-owned memory for a plan: the arena and one buffer per Input, Weight and State.
// Host memory for the CPU reference, device memory for CUDA; the executor never looks
// inside. A buffer may be larger than its tensor (e.g. sized for the largest batch).
class Bindings {
 public:
  struct Buffer {
    void* data = nullptr;
    int64_t bytes = 0;
  };

  explicit Bindings(const Graph& graph);

  // InvalidArgument for intermediates (they live in the arena), null data or a foreign id;
  // NotFound for an unknown name. Sizes are checked by CheckBindings.
  absl::Status Bind(absl::string_view tensor_name, void* data, int64_t bytes);
  absl::Status Bind(TensorId id, void* data, int64_t bytes);
  void SetArena(void* data, int64_t bytes) { arena_ = {data, bytes}; }

  const Buffer& arena() const { return arena_; }
  const Buffer& buffer(int32_t tensor_index) const { return buffers_[tensor_index]; }
  uint32_t graph_owner() const { return owner_; }

 private:
  uint32_t owner_;
  std::vector<TensorKind> kinds_;
  absl::flat_hash_map<std::string, int32_t> index_by_name_;
  Buffer arena_;
  std::vector<Buffer> buffers_;
};

struct ExecStats {
  int64_t launches = 0;
};

// Optional controls of one Execute call, used by capture: a subset of nodes and a hook
// after each node's Run (to map the launches a node made).
struct ExecOptions {
  // When non-empty, only these nodes run, in this order (each once).
  absl::Span<const int32_t> only_nodes;
  // Called after each node's Run succeeded; an error stops execution and is returned.
  std::function<absl::Status(int32_t node_index)> after_node;
};

// Refuses, before anything runs, bindings made for another graph, a missing or too-small
// buffer for any Input, Weight or State, and an arena smaller than the plan's.
absl::Status CheckBindings(const ExecutionPlan& plan, const Bindings& bindings);

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

#endif  // STEPGRAPH_EXECUTOR_H_
