// OpSupport: what a backend can run, asked by the graph passes before they make a node.
// A pass is backend-neutral: it knows what a fused op means (its CPU reference defines it
// for every input the op's shape inference accepts), not what each backend's kernel
// takes. So before it rewrites nodes into an op it asks the backend it prepares the graph
// for, through PassOptions::backend; every KernelDispatch answers (stepgraph/dispatch/
// dispatch.h). Declared in the graph room, which includes no dispatcher.
#ifndef STEPGRAPH_GRAPH_OP_SUPPORT_H_
#define STEPGRAPH_GRAPH_OP_SUPPORT_H_

#include "absl/types/span.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/ops.h"

namespace sg {

class OpSupport {
 public:
  virtual ~OpSupport() = default;

  // Whether this backend runs `op` over `inputs` (the node's inputs in the op's order, as
  // tensors of the graph: kind, dtype, shape). Answered on the host from the op and the
  // tensors alone, without a device: a backend that says yes accepts such a node in its
  // Prepare. Inputs the op's shape inference refuses may be answered no.
  virtual bool Supports(const Op& op, absl::Span<const Tensor* const> inputs) const = 0;
};

}  // namespace sg

#endif  // STEPGRAPH_GRAPH_OP_SUPPORT_H_
