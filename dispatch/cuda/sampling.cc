// The sampling unit of CudaDispatch: Argmax and Sample, one launch of kernels/sampling.cu
// per node, and the per-sequence controls in front of them, Penalize and CountIds (one
// launch of kernels/penalties.cu each, no state). Argmax splits long rows over several
// blocks that merge through the workspace made in Prepare; Sample takes a row per block
// (or per cluster of blocks) and needs no workspace, so no state.
#include "dispatch/cuda/sampling.h"

#include <algorithm>
#include <climits>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_status.h"
#include "dispatch/cuda/op_units.h"
#include "kernels/penalties.cuh"
#include "kernels/sampling.cuh"
#include "stepgraph/base/status.h"

namespace sg {
namespace internal {
namespace {

absl::Status CheckLogits(absl::string_view op, const Shape& x, absl::string_view node) {
  if (x.rank() != 2 || x[1] > INT_MAX || x[0] > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, " node '", node, "': logits ", x.ToString(),
                     " must be [rows, vocab] with vocab below 2^31"));
  }
  return absl::OkStatus();
}

struct ArgmaxState final : PreparedState<ArgmaxState> {
  int blocks = 1;
  void* workspace = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SamplingWorkspace>> SamplingWorkspace::Create(
    const CudaDeviceInfo& info) {
  return std::unique_ptr<SamplingWorkspace>(new SamplingWorkspace(info));
}

int SamplingWorkspace::ArgmaxBlocks(int64_t rows, int64_t vocab) const {
  return kernels::ArgmaxBlocksPerRow(rows, vocab, info_.sm_count);
}

absl::Status SamplingWorkspace::Reserve(const ExecutionPlan& plan) {
  int64_t need = 0;
  for (const Node& node : plan.graph().nodes()) {
    if (!std::holds_alternative<ops::Argmax>(node.op)) continue;
    const int64_t rows = plan.graph().tensor(node.inputs[0]).shape[0];
    need = std::max(need, kernels::ArgmaxWorkspaceBytes(rows));
  }
  // Slots and counters must start at zero; launches leave them zero.
  return workspace_.Reserve(need, "the argmax workspace");
}

// Rows and vocabulary within the kernels' 32 bits; Argmax's grid takes up to 65535 rows.
bool Supports(const ops::Argmax&, const CudaSupportQuery& q) {
  const Shape& logits = q.input(0).shape;
  return CheckLogits("Argmax", logits, "").ok() && logits[0] <= 65535;
}
bool Supports(const ops::Sample&, const CudaSupportQuery& q) {
  return CheckLogits("Sample", q.input(0).shape, "").ok();
}

bool Supports(const ops::Penalize&, const CudaSupportQuery& q) {
  return CheckLogits("Penalize", q.input(0).shape, "").ok();
}
bool Supports(const ops::CountIds&, const CudaSupportQuery& q) {
  return q.input(2).shape[1] <= INT_MAX;
}
PreparedOr Prepare(const ops::Penalize&, const CudaPrepareContext& c) {
  SG_RETURN_IF_ERROR(CheckLogits("Penalize", c.input(0).shape, c.node.name));
  return NoState();
}
PreparedOr Prepare(const ops::CountIds&, const CudaPrepareContext&) { return NoState(); }

PreparedOr Prepare(const ops::Argmax&, const CudaPrepareContext& c) {
  const Shape& logits = c.input(0).shape;
  SG_RETURN_IF_ERROR(CheckLogits("Argmax", logits, c.node.name));
  auto state = std::make_unique<ArgmaxState>();
  state->blocks = c.sampling.ArgmaxBlocks(logits[0], logits[1]);
  if (state->blocks > 1) {
    SG_ASSIGN_OR_RETURN(state->workspace,
                        c.sampling.For(kernels::ArgmaxWorkspaceBytes(logits[0]), c.node.name));
  }
  return Keep(std::move(state));
}

PreparedOr Prepare(const ops::Sample&, const CudaPrepareContext& c) {
  SG_RETURN_IF_ERROR(CheckLogits("Sample", c.input(0).shape, c.node.name));
  return NoState();
}

}  // namespace internal

absl::Status CudaDispatch::Run(const ops::Argmax&, const NodeArgs& args) {
  SG_ASSIGN_OR_RETURN(const internal::ArgmaxState* node, args.PreparedAs<internal::ArgmaxState>());
  const TensorArg& x = args.inputs[0];
  return ToStatus(kernels::LaunchArgmax(x.data, x.dtype, x.shape[0], x.shape[1], node->blocks,
                                        node->workspace, args.output.as<int32_t>(), launch(),
                                        error_flags_),
                  "LaunchArgmax");
}

absl::Status CudaDispatch::Run(const ops::Sample& op, const NodeArgs& args) {
  const TensorArg& logits = args.inputs[0];  // shape checked in Prepare
  kernels::SampleParams params;
  params.temperature = op.temperature;
  params.top_k = op.top_k;
  params.top_p = op.top_p;
  return ToStatus(
      kernels::LaunchSample(logits.data, logits.dtype, logits.shape[0], logits.shape[1],
                            args.inputs[1].as<const int32_t>(), args.inputs[2].as<const int32_t>(),
                            params, args.output.as<int32_t>(), launch(), error_flags_),
      "LaunchSample");
}

absl::Status CudaDispatch::Run(const ops::Penalize&, const NodeArgs& args) {
  const TensorArg& logits = args.inputs[0];  // shape checked in Prepare
  return ToStatus(kernels::LaunchPenalize(logits.data, logits.dtype, logits.shape[0],
                                          logits.shape[1], args.inputs[1].as<const float>(),
                                          args.inputs[1].shape[1],
                                          args.inputs[2].as<const int32_t>(),
                                          args.output.as<float>(), launch()),
                  "LaunchPenalize");
}

absl::Status CudaDispatch::Run(const ops::CountIds&, const NodeArgs& args) {
  return ToStatus(kernels::LaunchCountIds(args.inputs[0].as<const int32_t>(),
                                          args.inputs[1].as<const int32_t>(),
                                          args.inputs[0].shape[0], args.output.shape[1],
                                          args.output.as<int32_t>(), launch(), error_flags_),
                  "LaunchCountIds");
}

}  // namespace sg
