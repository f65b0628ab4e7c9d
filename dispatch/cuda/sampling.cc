// Argmax and Sample on CUDA: one launch of kernels/sampling.cu per node. Argmax splits
// long rows over several blocks that merge through the workspace made in Prepare; Sample
// takes a row per block (or per cluster of blocks) and needs no workspace.
#include "dispatch/cuda/sampling.h"

#include <algorithm>
#include <climits>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_status.h"
#include "kernels/sampling.cuh"
#include "stepgraph/status.h"

namespace sg {
namespace internal {
namespace {

absl::Status CheckLogits(absl::string_view op, const TensorArg& x, absl::string_view node) {
  if (x.shape.rank() != 2 || x.shape[1] > INT_MAX || x.shape[0] > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, " node '", node, "': logits ", x.shape.ToString(),
                     " must be [rows, vocab] with vocab below 2^31"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SamplingWorkspace>> SamplingWorkspace::Create(
    const CudaDeviceInfo& info) {
  return std::unique_ptr<SamplingWorkspace>(new SamplingWorkspace(info));
}

int SamplingWorkspace::ArgmaxBlocks(int64_t rows, int64_t vocab) const {
  return kernels::ArgmaxBlocksPerRow(rows, vocab, info_.sm_count);
}

absl::Status SamplingWorkspace::Prepare(const ExecutionPlan& plan) {
  int64_t need = 0;
  for (const Node& node : plan.graph().nodes()) {
    if (!std::holds_alternative<ops::Argmax>(node.op)) continue;
    const int64_t rows = plan.graph().tensor(node.inputs[0]).shape[0];
    need = std::max(need, kernels::ArgmaxWorkspaceBytes(rows));
  }
  if (need <= bytes_) return absl::OkStatus();
  SG_ASSIGN_OR_RETURN(DeviceMemory grown, AllocateDevice(need, "the argmax workspace"));
  // Slots and counters must start at zero; launches leave them zero. The memset runs on
  // the legacy stream, so wait for it before any launch on the dispatcher's stream.
  SG_RETURN_IF_ERROR(ToStatus(cudaMemset(grown.get(), 0, static_cast<size_t>(need)),
                              "cudaMemset(argmax workspace)"));
  SG_RETURN_IF_ERROR(ToStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize after cudaMemset"));
  if (buffer_ != nullptr) retired_.push_back(std::move(buffer_));
  buffer_ = std::move(grown);
  bytes_ = need;
  return absl::OkStatus();
}

absl::StatusOr<void*> SamplingWorkspace::ForArgmax(int64_t rows, absl::string_view node) const {
  const int64_t need = kernels::ArgmaxWorkspaceBytes(rows);
  if (need > bytes_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Argmax node '", node, "' needs ", need, " bytes of workspace but ", bytes_,
        " were prepared: call CudaDispatch::Prepare with the plan that holds this node"));
  }
  return buffer_.get();
}

}  // namespace internal

absl::Status CudaDispatch::Run(const ops::Argmax&, const NodeArgs& args) {
  const TensorArg& x = args.inputs[0];
  SG_RETURN_IF_ERROR(internal::CheckLogits("Argmax", x, args.node_name));
  const int64_t rows = x.shape[0], vocab = x.shape[1];
  const int blocks = sampling_->ArgmaxBlocks(rows, vocab);
  void* workspace = nullptr;
  if (blocks > 1) {
    SG_ASSIGN_OR_RETURN(workspace, sampling_->ForArgmax(rows, args.node_name));
  }
  return ToStatus(kernels::LaunchArgmax(x.data, x.dtype, rows, vocab, blocks, workspace,
                                        args.output.as<int32_t>(), stream_),
                  absl::StrCat("LaunchArgmax for node '", args.node_name, "'"));
}

absl::Status CudaDispatch::Run(const ops::Sample& op, const NodeArgs& args) {
  const TensorArg& logits = args.inputs[0];
  SG_RETURN_IF_ERROR(internal::CheckLogits("Sample", logits, args.node_name));
  kernels::SampleParams params;
  params.temperature = op.temperature;
  params.top_k = op.top_k;
  params.top_p = op.top_p;
  return ToStatus(
      kernels::LaunchSample(logits.data, logits.dtype, logits.shape[0], logits.shape[1],
                            args.inputs[1].as<const int32_t>(), args.inputs[2].as<const int32_t>(),
                            params, args.output.as<int32_t>(), stream_),
      absl::StrCat("LaunchSample for node '", args.node_name, "'"));
}

}  // namespace sg
