// KernelDispatch: maps every node to exactly one launch. One pure virtual Run per op,
// generated from SG_OP_LIST, so a dispatcher that misses an op fails to compile.
#ifndef STEPGRAPH_DISPATCH_DISPATCH_H_
#define STEPGRAPH_DISPATCH_DISPATCH_H_

#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "stepgraph/graph/op_support.h"
#include "stepgraph/graph/ops.h"
#include "stepgraph/graph/types.h"

namespace sg {

class ExecutionPlan;

// One resolved tensor argument: where its bytes are and what they hold.
struct TensorArg {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  TensorKind kind = TensorKind::kIntermediate;
  int32_t tensor = -1;        // index in the graph's tensors
  int64_t arena_offset = -1;  // offset in the arena for intermediates, else -1
  absl::string_view name;     // the tensor's name (owned by the graph)

  int64_t bytes() const { return TensorBytes(dtype, shape); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// What a dispatcher worked out once for one node of a plan (a matmul's path and cuBLASLt
// plan, an attention launch's split and workspace, a RoPE table): Run receives it as
// NodeArgs::prepared and only launches. Each dispatcher derives its own state types from
// PreparedState (below), which tags every object with its type, so that a Run reads its
// own type back checked (NodeArgs::PreparedAs) rather than through an unchecked cast.
class PreparedNode {
 public:
  virtual ~PreparedNode() = default;
  // Identifies the derived type: PreparedState<T>::Tag() for a T; null for a state made
  // without PreparedState, which PreparedAs never accepts.
  const void* tag() const { return tag_; }

 protected:
  PreparedNode() = default;
  explicit PreparedNode(const void* tag) : tag_(tag) {}

 private:
  const void* tag_ = nullptr;
};

// Base of a dispatcher's state type: `struct MatmulState final : PreparedState<MatmulState>`.
template <typename Self>
class PreparedState : public PreparedNode {
 public:
  // One address per state type: a non-const variable, so that no linker folds two alike.
  static const void* Tag() { return &tag_storage_; }

 protected:
  PreparedState() : PreparedNode(Tag()) {}

 private:
  static inline char tag_storage_ = 0;
};

namespace internal {
// Cold: the message of a Run whose node has no state of the type it expects.
absl::Status WrongPreparedState(bool missing);
}  // namespace internal

class KernelDispatch;

// A plan as one dispatcher prepared it: the state of each node by node index (null where a
// node needs none). Made by KernelDispatch::Prepare; the plan and the dispatcher must
// outlive it.
class PreparedPlan {
 public:
  PreparedPlan(const ExecutionPlan& plan, const KernelDispatch& dispatch,
               std::vector<std::unique_ptr<PreparedNode>> nodes);
  PreparedPlan(PreparedPlan&&) = default;
  PreparedPlan& operator=(PreparedPlan&&) = default;

  const ExecutionPlan& plan() const { return *plan_; }
  const KernelDispatch& dispatch() const { return *dispatch_; }
  const PreparedNode* node(int32_t index) const { return nodes_[index].get(); }

 private:
  const ExecutionPlan* plan_;
  const KernelDispatch* dispatch_;
  std::vector<std::unique_ptr<PreparedNode>> nodes_;
};

// Everything one Run needs, built by the executor on its stack.
struct NodeArgs {
  int32_t node_index = -1;
  absl::string_view node_name;
  absl::Span<const TensorArg> inputs;
  TensorArg output;
  // This node's state from Prepare, or null.
  const PreparedNode* prepared = nullptr;

  // The node's state as the State type its Run expects; FailedPrecondition when it has
  // none or one of another type (the plan executed is not the PreparedPlan this
  // dispatcher's Prepare made). A comparison of two pointers: no allocation and no
  // formatting unless it fails, so Run may call it on every step.
  template <typename State>
  absl::StatusOr<const State*> PreparedAs() const {
    static_assert(std::is_base_of_v<PreparedState<State>, State>,
                  "a state type derives from PreparedState<itself>");
    if (ABSL_PREDICT_TRUE(prepared != nullptr && prepared->tag() == PreparedState<State>::Tag())) {
      return static_cast<const State*>(prepared);
    }
    return internal::WrongPreparedState(prepared == nullptr);
  }
};

class KernelDispatch : public OpSupport {
 public:
  ~KernelDispatch() override = default;

  // Whether this dispatcher runs `op` over `inputs` (OpSupport), answered without a device
  // and before any Prepare: the graph passes ask it (PassOptions::backend) so that they
  // make only nodes it runs. Whatever it says yes to, its Prepare accepts.
  bool Supports(const Op& op, absl::Span<const Tensor* const> inputs) const override = 0;

  // Everything that must not happen per step (matmul plans, workspaces, tables, launch
  // shapes), done once for a plan before it is executed or captured. The default prepares
  // nothing. Errors name the node. A dispatcher may be prepared for several plans (batch
  // buckets); each PreparedPlan stays valid while the dispatcher lives.
  virtual absl::StatusOr<PreparedPlan> Prepare(const ExecutionPlan& plan);

  // Whether this dispatcher's Run for `op` only enqueues device work on its stream (no
  // host synchronisation, allocation or host-side reads of device data), so that it can
  // be recorded by stream capture. Capture refuses a plan with any op that is not.
  virtual bool CaptureSafe(const Op& op) const { return false; }

#define SG_DECLARE_RUN(Name) \
  virtual absl::Status Run(const ops::Name& op, const NodeArgs& args) = 0;
  SG_OP_LIST(SG_DECLARE_RUN)
#undef SG_DECLARE_RUN
};

}  // namespace sg

#endif  // STEPGRAPH_DISPATCH_DISPATCH_H_
