// FusedElementwise (and, when asked, RmsNorm) on CUDA: kernels generated for the node's
// sizes (codegen.h), compiled and loaded at Prepare, one launch per Run.
#include "dispatch/cuda/generated.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/codegen.h"
#include "dispatch/cuda/cuda_status.h"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace internal {
namespace {

codegen::EwOp ChainOp(ops::FusedElementwise::Kind kind) {
  switch (kind) {
    case ops::FusedElementwise::Kind::kAdd: return codegen::EwOp::kAdd;
    case ops::FusedElementwise::Kind::kMul: return codegen::EwOp::kMul;
    case ops::FusedElementwise::Kind::kSilu: return codegen::EwOp::kSilu;
    case ops::FusedElementwise::Kind::kSiluMul: return codegen::EwOp::kSiluMul;
  }
  return codegen::EwOp::kAdd;
}

absl::StatusOr<std::unique_ptr<PreparedNode>> Load(const codegen::GeneratedKernel& g,
                                                   CudaModuleCache& modules) {
  auto node = std::make_unique<CompiledNode>();
  SG_ASSIGN_OR_RETURN(node->kernel,
                      modules.Load(g.source, g.entry, dim3(g.grid), dim3(g.block)));
  return std::unique_ptr<PreparedNode>(std::move(node));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PreparedNode>> PrepareFusedElementwise(
    const ops::FusedElementwise& op, const Graph& graph, const Node& node,
    CudaModuleCache& modules) {
  const Tensor& x = graph.tensor(node.inputs[0]);
  codegen::ElementwiseChain chain;
  chain.inputs.assign(node.inputs.size(), x.dtype);
  for (int i = 0; i < op.num_steps; ++i) {
    const ops::FusedElementwise::Step& st = op.steps[i];
    chain.steps.push_back(codegen::EwStep{.op = ChainOp(st.kind),
                                          .a = st.a,
                                          .b = IsBinaryKind(st.kind) ? st.b : -1});
  }
  chain.outputs = {static_cast<int32_t>(node.inputs.size()) + op.num_steps - 1};
  chain.elements = x.shape.NumElements();
  SG_ASSIGN_OR_RETURN(codegen::GeneratedKernel g, codegen::GenerateElementwise(chain));
  return Load(g, modules);
}

absl::StatusOr<std::unique_ptr<PreparedNode>> PrepareCompiledRmsNorm(const ops::RmsNorm& op,
                                                                    const Graph& graph,
                                                                    const Node& node,
                                                                    CudaModuleCache& modules) {
  const Tensor& x = graph.tensor(node.inputs[0]);
  if (x.shape[1] > codegen::kMaxRmsNormHidden) {
    return absl::UnimplementedError(absl::StrCat("a compiled RmsNorm takes hidden sizes up to ",
                                                 codegen::kMaxRmsNormHidden, ", got ",
                                                 x.shape[1]));
  }
  const codegen::RmsNormSpec spec{
      .rows = x.shape[0],
      .hidden = x.shape[1],
      .eps = op.eps,
      .dtype = x.dtype,
      .weight_is_constant = graph.tensor(node.inputs[1]).kind == TensorKind::kWeight};
  SG_ASSIGN_OR_RETURN(codegen::GeneratedKernel g, codegen::GenerateRmsNorm(spec));
  return Load(g, modules);
}

absl::Status LaunchCompiled(const PreparedNode* prepared, const NodeArgs& args,
                            cudaStream_t stream) {
  const auto* node = static_cast<const CompiledNode*>(prepared);
  // Kernel arguments: every input pointer, then the output's.
  void* pointers[kMaxNodeInputs + 1];
  void* arguments[kMaxNodeInputs + 1];
  const size_t n = args.inputs.size();
  for (size_t i = 0; i < n; ++i) pointers[i] = args.inputs[i].data;
  pointers[n] = args.output.data;
  for (size_t i = 0; i <= n; ++i) arguments[i] = &pointers[i];
  return ToStatus(node->kernel.Launch(stream, arguments), "launching a compiled kernel");
}

}  // namespace internal

absl::Status CudaDispatch::Run(const ops::FusedElementwise&, const NodeArgs& args) {
  if (ABSL_PREDICT_FALSE(args.prepared == nullptr)) return NotPrepared();
  return internal::LaunchCompiled(args.prepared, args, stream_);
}

}  // namespace sg
