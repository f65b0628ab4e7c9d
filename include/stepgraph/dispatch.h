// KernelDispatch: maps every node to exactly one launch. One pure virtual Run per op,
// generated from SG_OP_LIST, so a dispatcher that misses an op fails to compile.
#ifndef STEPGRAPH_DISPATCH_H_
#define STEPGRAPH_DISPATCH_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "stepgraph/ops.h"
#include "stepgraph/types.h"

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

// Everything one Run needs, built by the executor on its stack.
struct NodeArgs {
  int32_t node_index = -1;
  absl::string_view node_name;
  absl::Span<const TensorArg> inputs;
  TensorArg output;
};

class KernelDispatch {
 public:
  virtual ~KernelDispatch() = default;

  // Setup that must not happen per step (handles, matmul plans, workspace, RNG state),
  // done once for a plan before it is executed or captured.
  virtual absl::Status Prepare(const ExecutionPlan& plan) { return absl::OkStatus(); }

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

#endif  // STEPGRAPH_DISPATCH_H_
