// The CUDA dispatcher's op units. Each op family is one .cc file (elementwise.cc,
// embedding.cc, matmul.cc, norm.cc, rope.cc, attention.cc, sampling.cc, fused.cc,
// generated.cc) that holds, for every op of the family, three things side by side:
//   Prepare   the node's state, once per plan: a type derived from PreparedState that
//             records every decision (path, launch shape, workspace, table, kernel);
//   Supports  whether the dispatcher runs the op over inputs of these types, answered
//             without a device (graph passes ask it before they make a node); whatever it
//             says yes to, Prepare accepts;
//   Run       CudaDispatch::Run, which reads its state back checked (NodeArgs::PreparedAs)
//             and only launches.
// Prepare and Supports are declared here once for every op of SG_OP_LIST, so an op that
// no unit defines fails to link; cuda_dispatch.cc routes each node to them with one
// std::visit.
#ifndef STEPGRAPH_DISPATCH_CUDA_OP_UNITS_H_
#define STEPGRAPH_DISPATCH_CUDA_OP_UNITS_H_

#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/launch.h"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/ops.h"

namespace sg {

class CudaModuleCache;

namespace internal {

class MatmulRunner;
class RopeTables;
class AttentionWorkspace;
class SamplingWorkspace;

// What a unit's Prepare may use: the node in its graph, the device, the options and the
// dispatcher's shared resources (each family's own, made in CudaDispatch::Create).
struct CudaPrepareContext {
  const Graph& graph;
  const Node& node;
  const CudaDeviceInfo& info;
  const CudaOptions& options;
  MatmulRunner& matmul;
  RopeTables& rope;
  const AttentionWorkspace& attention;
  const SamplingWorkspace& sampling;
  CudaModuleCache& modules;
  // The state of the node just before this one in the plan (null for the first node and
  // after a node without state). The executor runs a plan's nodes in order on one stream,
  // so a unit may rely on what that node's Run left in a workspace they share (a MatMul
  // reuses the x its predecessor rounded: matmul.cc).
  const PreparedNode* previous = nullptr;

  const Tensor& input(int i) const { return graph.tensor(node.inputs[i]); }
};

// What a unit's Supports may use: the inputs, already accepted by the op's shape inference
// (so every input the op takes is there, of the kinds, dtypes and shapes it takes), and
// the dispatcher's options. No device.
struct CudaSupportQuery {
  absl::Span<const Tensor* const> inputs;
  const CudaOptions& options;

  const Tensor& input(int i) const { return *inputs[static_cast<size_t>(i)]; }
};

// CudaDispatch::Supports and CudaSupport::Supports: the op's shape inference, then its
// unit's answer.
bool CudaSupports(const CudaOptions& options, const Op& op,
                  absl::Span<const Tensor* const> inputs);

using PreparedOr = absl::StatusOr<std::unique_ptr<PreparedNode>>;

// The state of an op that launches from its arguments alone.
inline PreparedOr NoState() { return std::unique_ptr<PreparedNode>(); }

// A unit's state as the plan keeps it.
template <typename State>
PreparedOr Keep(std::unique_ptr<State> state) {
  return std::unique_ptr<PreparedNode>(std::move(state));
}

#define SG_CUDA_UNIT(Name)                                                   \
  PreparedOr Prepare(const ops::Name& op, const CudaPrepareContext& context); \
  bool Supports(const ops::Name& op, const CudaSupportQuery& query);
SG_OP_LIST(SG_CUDA_UNIT)
#undef SG_CUDA_UNIT

}  // namespace internal

inline kernels::Stream CudaDispatch::launch() const {
  return kernels::Stream(stream_, options_.programmatic_launch);
}

}  // namespace sg

#endif  // STEPGRAPH_DISPATCH_CUDA_OP_UNITS_H_
