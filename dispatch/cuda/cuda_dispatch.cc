// CudaDispatch: creation, per-plan preparation, which routes each node to its op unit's
// Prepare (dispatch/cuda/op_units.h; each unit also holds its ops' Run), the Supports
// answer, routed the same way, and the error word.
#include "stepgraph/dispatch/cuda_dispatch.h"

#include <variant>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/attention.h"
#include "dispatch/cuda/cuda_handles.h"
#include "dispatch/cuda/cuda_status.h"
#include "dispatch/cuda/matmul.h"
#include "dispatch/cuda/nvrtc_cache.h"
#include "dispatch/cuda/op_units.h"
#include "dispatch/cuda/rope.h"
#include "dispatch/cuda/sampling.h"
#include "kernels/quant_layout.h"
#include "stepgraph/base/status.h"

namespace sg {

CudaDispatch::CudaDispatch(cudaStream_t stream, bool owns_stream, CudaDeviceInfo info,
                           const CudaOptions& options)
    : stream_(stream), owns_stream_(owns_stream), info_(info), options_(options) {}

CudaDispatch::~CudaDispatch() {
  if (error_flags_ != nullptr) DeviceFree()(error_flags_);
  if (owns_stream_ && stream_ != nullptr) StreamDeleter()(stream_);
}

absl::StatusOr<std::unique_ptr<CudaDispatch>> CudaDispatch::Create(const Options& options) {
  if (!CudaDeviceAvailable()) {
    return absl::FailedPreconditionError("CudaDispatch: no CUDA device is available");
  }
  if (options.cuda.matmul_workspace_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CudaDispatch: matmul workspace must be >= 0 bytes, got ",
                                                   options.cuda.matmul_workspace_bytes));
  }
  if (const int b = options.cuda.fused_float_min_blocks; b != 0 && b != 5 && b != 6) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaDispatch: fused_float_min_blocks must be 0, 5 or 6, got ", b));
  }
  CudaDeviceInfo info;
  SG_RETURN_IF_ERROR(ToStatus(cudaGetDevice(&info.device), "cudaGetDevice"));
  int value = 0;
  SG_RETURN_IF_ERROR(ToStatus(
      cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, info.device),
      "cudaDeviceGetAttribute(MultiProcessorCount)"));
  info.sm_count = value;
  SG_RETURN_IF_ERROR(ToStatus(cudaDeviceGetAttribute(&value, cudaDevAttrL2CacheSize, info.device),
                              "cudaDeviceGetAttribute(L2CacheSize)"));
  info.l2_bytes = value;
  int major = 0, minor = 0;
  SG_RETURN_IF_ERROR(ToStatus(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, info.device),
      "cudaDeviceGetAttribute(ComputeCapabilityMajor)"));
  SG_RETURN_IF_ERROR(ToStatus(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, info.device),
      "cudaDeviceGetAttribute(ComputeCapabilityMinor)"));
  info.compute_capability = major * 10 + minor;

  if (options.ranks < 1 || options.ranks > ops::kMaxRanks ||
      (options.ranks > 1 && options.nccl_comm == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaDispatch: a group of ", options.ranks, " ranks needs ranks in [1, ",
        ops::kMaxRanks, "] and, above one, an NCCL communicator"));
  }
#if !defined(STEPGRAPH_WITH_NCCL)
  if (options.ranks > 1) {
    return absl::FailedPreconditionError(
        "CudaDispatch: collectives over several GPUs need NCCL, and this build has none "
        "(see docs/parallel.md)");
  }
#endif
  cudaStream_t stream = options.stream;
  UniqueStream owned;
  if (stream == nullptr) {
    SG_ASSIGN_OR_RETURN(owned, CreateStream("the dispatcher's stream"));
    stream = owned.get();
  }
  auto dispatch = std::unique_ptr<CudaDispatch>(
      new CudaDispatch(stream, owned != nullptr, info, options.cuda));
  owned.release();
  dispatch->nccl_comm_ = options.nccl_comm;
  dispatch->ranks_ = options.ranks;
  dispatch->one_shot_peers_ = options.one_shot_peers;
  SG_ASSIGN_OR_RETURN(DeviceMemory flags, AllocateDevice(sizeof(uint32_t), "the error word"));
  SG_RETURN_IF_ERROR(ToStatus(cudaMemset(flags.get(), 0, sizeof(uint32_t)), "cudaMemset(error word)"));
  // The memset runs on the legacy stream, which `stream` need not wait for.
  SG_RETURN_IF_ERROR(ToStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize after cudaMemset"));
  dispatch->error_flags_ = static_cast<uint32_t*>(flags.release());
  SG_ASSIGN_OR_RETURN(dispatch->matmul_,
                      internal::MatmulRunner::Create(info, options.cuda.matmul_workspace_bytes,
                                                     options.cuda.matmul));
  SG_ASSIGN_OR_RETURN(dispatch->rope_, internal::RopeTables::Create(info));
  SG_ASSIGN_OR_RETURN(dispatch->attention_, internal::AttentionWorkspace::Create(info));
  SG_ASSIGN_OR_RETURN(dispatch->sampling_, internal::SamplingWorkspace::Create(info));
  dispatch->modules_ =
      std::make_unique<CudaModuleCache>(SharedCubinCache(options.cuda.kernel_cache_folder));
  return dispatch;
}

namespace internal {

bool CudaSupports(const CudaOptions& options, const Op& op,
                  absl::Span<const Tensor* const> inputs) {
  // A node the graph would refuse is not one CUDA runs; past this, every unit may rely on
  // its inputs being what the op takes.
  if (!InferOutputType(op, "", inputs).ok()) return false;
  const CudaSupportQuery query{inputs, options};
  return std::visit([&](const auto& o) { return Supports(o, query); }, op);
}

}  // namespace internal

bool CudaSupport::Supports(const Op& op, absl::Span<const Tensor* const> inputs) const {
  return internal::CudaSupports(options_, op, inputs);
}

bool CudaDispatch::RepacksWeight(const Tensor& weight) const { return IsQuantized(weight.dtype); }

absl::Status CudaDispatch::RepackWeight(const Tensor& weight,
                                        absl::Span<const std::byte> file_bytes,
                                        absl::Span<std::byte> out) const {
  const int64_t bytes = weight.bytes();
  if (!RepacksWeight(weight) || static_cast<int64_t>(file_bytes.size()) != bytes ||
      static_cast<int64_t>(out.size()) != bytes) {
    // The file's bytes, or the error naming the sizes.
    return KernelDispatch::RepackWeight(weight, file_bytes, out);
  }
  if (!kernels::RepackBlocksForDevice(weight.dtype, bytes / DTypeBlockBytes(weight.dtype),
                                      file_bytes.data(), out.data())) {
    return absl::InternalError(absl::StrCat("cannot repack weight '", weight.name, "' (",
                                            DTypeName(weight.dtype), ")"));
  }
  return absl::OkStatus();
}

bool CudaDispatch::Supports(const Op& op, absl::Span<const Tensor* const> inputs) const {
  return internal::CudaSupports(options_, op, inputs);
}

absl::StatusOr<PreparedPlan> CudaDispatch::Prepare(const ExecutionPlan& plan) {
  const Graph& graph = plan.graph();
  // Workspaces are sized for the whole plan first, so every node gets the final buffer.
  SG_RETURN_IF_ERROR(attention_->Reserve(plan));
  SG_RETURN_IF_ERROR(sampling_->Reserve(plan));
  SG_RETURN_IF_ERROR(matmul_->ReserveBlockGemm(plan, options_));
  std::vector<std::unique_ptr<PreparedNode>> nodes(static_cast<size_t>(graph.num_nodes()));
  for (int32_t i = 0; i < graph.num_nodes(); ++i) {
    const Node& node = graph.nodes()[i];
    const internal::CudaPrepareContext context{graph,      node,        info_,      options_,
                                               *matmul_,   *rope_,      *attention_, *sampling_,
                                               *modules_,  i > 0 ? nodes[i - 1].get() : nullptr};
    internal::PreparedOr state =
        std::visit([&](const auto& op) { return internal::Prepare(op, context); }, node.op);
    if (!state.ok()) {
      return absl::Status(state.status().code(),
                          absl::StrCat("preparing node ", i, " '", node.name, "' (",
                                       OpName(node.op), "): ", state.status().message()));
    }
    nodes[i] = *std::move(state);
  }
  return PreparedPlan(plan, *this, std::move(nodes));
}

absl::StatusOr<uint32_t> CudaDispatch::TakeErrorFlags() {
  uint32_t flags = 0;
  SG_RETURN_IF_ERROR(ToStatus(cudaMemcpyAsync(&flags, error_flags_, sizeof(flags),
                                              cudaMemcpyDeviceToHost, stream_),
                              "cudaMemcpyAsync(error word)"));
  SG_RETURN_IF_ERROR(ToStatus(cudaMemsetAsync(error_flags_, 0, sizeof(uint32_t), stream_),
                              "cudaMemsetAsync(error word)"));
  SG_RETURN_IF_ERROR(ToStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
  return flags;
}

}  // namespace sg
