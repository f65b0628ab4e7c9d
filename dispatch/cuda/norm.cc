// The row-wise unit of CudaDispatch: RmsNorm and Softmax, one row-wise launch each
// (kernels/norm.cuh). RmsNorm runs the built-in kernel or, when CudaOptions::compiled_norm
// asks, a kernel compiled for the node's rows, hidden size, eps and dtype (generated.h);
// which one is decided at Prepare. Softmax keeps no state.
#include <utility>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/codegen.h"
#include "dispatch/cuda/cuda_status.h"
#include "dispatch/cuda/generated.h"
#include "dispatch/cuda/op_units.h"
#include "kernels/norm.cuh"
#include "stepgraph/base/status.h"
#include "stepgraph/dispatch/cuda_dispatch.h"

namespace sg {
namespace internal {
namespace {

struct RmsNormState final : PreparedState<RmsNormState> {
  bool compiled = false;
  CompiledKernel kernel;  // compiled only
};

}  // namespace

// The compiled kernel reads the weight before the programmatic-launch wait when it is a
// graph Weight (nothing in a step writes one). Unimplemented past
// codegen::kMaxRmsNormHidden.
PreparedOr Prepare(const ops::RmsNorm& op, const CudaPrepareContext& c) {
  auto state = std::make_unique<RmsNormState>();
  if (!c.options.compiled_norm) return Keep(std::move(state));
  const Tensor& x = c.input(0);
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
      .weight_is_constant = c.input(1).kind == TensorKind::kWeight};
  SG_ASSIGN_OR_RETURN(const codegen::GeneratedKernel g, codegen::GenerateRmsNorm(spec));
  SG_ASSIGN_OR_RETURN(state->kernel, LoadGenerated(g, c.modules));
  state->compiled = true;
  return Keep(std::move(state));
}

PreparedOr Prepare(const ops::Softmax&, const CudaPrepareContext&) { return NoState(); }

bool Supports(const ops::RmsNorm&, const CudaSupportQuery& q) {
  return !q.options.compiled_norm || q.input(0).shape[1] <= codegen::kMaxRmsNormHidden;
}

bool Supports(const ops::Softmax&, const CudaSupportQuery&) { return true; }

}  // namespace internal

absl::Status CudaDispatch::Run(const ops::RmsNorm& op, const NodeArgs& args) {
  SG_ASSIGN_OR_RETURN(const internal::RmsNormState* s, args.PreparedAs<internal::RmsNormState>());
  if (s->compiled) return internal::LaunchCompiled(s->kernel, args, launch());
  const TensorArg& x = args.inputs[0];
  return ToStatus(kernels::LaunchRmsNorm(x.data, args.inputs[1].data, args.output.data,
                                         x.shape[0], x.shape[1], op.eps, x.dtype, launch()),
                  "LaunchRmsNorm");
}

absl::Status CudaDispatch::Run(const ops::Softmax&, const NodeArgs& args) {
  const TensorArg& x = args.inputs[0];
  return ToStatus(kernels::LaunchSoftmax(x.data, args.output.data, x.shape[0], x.shape[1],
                                         x.dtype, launch()),
                  "LaunchSoftmax");
}

}  // namespace sg
