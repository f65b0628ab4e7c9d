// The FusedElementwise unit of CudaDispatch: each chain is one kernel generated for the
// node's element count (codegen.h), compiled and loaded at Prepare and launched by Run;
// and the loading and launching of compiled kernels that the RmsNorm unit shares
// (generated.h).
#include "dispatch/cuda/generated.h"

#include <utility>

#include "dispatch/cuda/cuda_status.h"
#include "dispatch/cuda/op_units.h"
#include "stepgraph/base/status.h"
#include "stepgraph/dispatch/cuda_dispatch.h"

namespace sg {
namespace internal {
namespace {

struct FusedElementwiseState final : PreparedState<FusedElementwiseState> {
  CompiledKernel kernel;
};

codegen::EwOp ChainOp(ops::FusedElementwise::Kind kind) {
  switch (kind) {
    case ops::FusedElementwise::Kind::kAdd: return codegen::EwOp::kAdd;
    case ops::FusedElementwise::Kind::kMul: return codegen::EwOp::kMul;
    case ops::FusedElementwise::Kind::kSilu: return codegen::EwOp::kSilu;
    case ops::FusedElementwise::Kind::kSiluMul: return codegen::EwOp::kSiluMul;
  }
  return codegen::EwOp::kAdd;
}

}  // namespace

absl::StatusOr<CompiledKernel> LoadGenerated(const codegen::GeneratedKernel& g,
                                             CudaModuleCache& modules) {
  return modules.Load(g.source, g.entry, dim3(g.grid), dim3(g.block));
}

absl::Status LaunchCompiled(const CompiledKernel& kernel, const NodeArgs& args,
                            const kernels::Stream& stream) {
  // Kernel arguments: every input pointer, then the output's.
  void* pointers[kMaxNodeInputs + 1];
  void* arguments[kMaxNodeInputs + 1];
  const size_t n = args.inputs.size();
  for (size_t i = 0; i < n; ++i) pointers[i] = args.inputs[i].data;
  pointers[n] = args.output.data;
  for (size_t i = 0; i <= n; ++i) arguments[i] = &pointers[i];
  return ToStatus(kernel.Launch(stream, arguments), "launching a compiled kernel");
}

// Every chain the op holds fits one generated kernel.
static_assert(ops::FusedElementwise::kMaxInputs <= codegen::kMaxChainInputs);
static_assert(ops::FusedElementwise::kMaxSteps <= codegen::kMaxChainSteps);
bool Supports(const ops::FusedElementwise&, const CudaSupportQuery& q) {
  return q.input(0).shape.NumElements() <= codegen::kMaxChainElements;
}

PreparedOr Prepare(const ops::FusedElementwise& op, const CudaPrepareContext& c) {
  const Tensor& x = c.input(0);
  codegen::ElementwiseChain chain;
  chain.inputs.assign(c.node.inputs.size(), x.dtype);
  for (int i = 0; i < op.num_steps; ++i) {
    const ops::FusedElementwise::Step& st = op.steps[i];
    chain.steps.push_back(codegen::EwStep{.op = ChainOp(st.kind),
                                          .a = st.a,
                                          .b = IsBinaryKind(st.kind) ? st.b : -1});
  }
  chain.outputs = {static_cast<int32_t>(c.node.inputs.size()) + op.num_steps - 1};
  chain.elements = x.shape.NumElements();
  SG_ASSIGN_OR_RETURN(const codegen::GeneratedKernel g, codegen::GenerateElementwise(chain));
  auto state = std::make_unique<FusedElementwiseState>();
  SG_ASSIGN_OR_RETURN(state->kernel, LoadGenerated(g, c.modules));
  return Keep(std::move(state));
}

}  // namespace internal

absl::Status CudaDispatch::Run(const ops::FusedElementwise&, const NodeArgs& args) {
  SG_ASSIGN_OR_RETURN(const internal::FusedElementwiseState* s,
                      args.PreparedAs<internal::FusedElementwiseState>());
  return internal::LaunchCompiled(s->kernel, args, launch());
}

}  // namespace sg
