// The collectives unit of CudaDispatch: AllReduce and AllGather over the dispatcher's NCCL
// communicator (CudaDispatch::Options::nccl_comm), one NCCL call each on the dispatcher's
// stream, which a capture records into the rank's CUDA graph; a small AllReduce through
// the one-shot kernel over peer memory instead where the group made its buffers. A group of one copies. In a
// build without NCCL a group of more than one is refused when the dispatcher is made.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_status.h"
#include "stepgraph/base/status.h"
#include "dispatch/cuda/op_units.h"
#include "kernels/collectives.cuh"
#include "kernels/elementwise.cuh"
#include "stepgraph/dispatch/cuda_dispatch.h"

#if defined(STEPGRAPH_WITH_NCCL)
#include <nccl.h>
#endif

namespace sg {
namespace internal {

PreparedOr Prepare(const ops::AllReduce&, const CudaPrepareContext&) { return NoState(); }
PreparedOr Prepare(const ops::AllGather&, const CudaPrepareContext&) { return NoState(); }

// Every float dtype and shape their shape inference accepts.
bool Supports(const ops::AllReduce&, const CudaSupportQuery&) { return true; }
bool Supports(const ops::AllGather&, const CudaSupportQuery&) { return true; }

}  // namespace internal

namespace {

#if defined(STEPGRAPH_WITH_NCCL)
ncclDataType_t NcclType(DType t) {
  switch (t) {
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    default: return ncclFloat32;
  }
}

absl::Status NcclStatus(ncclResult_t r, absl::string_view call, absl::string_view node) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, " failed for node '", node,
                                          "': ", ncclGetErrorString(r)));
}
#endif

// A collective of a group of one: its output is its input.
absl::Status CopyOfOneRank(const TensorArg& x, const TensorArg& out, cudaStream_t stream) {
  if (x.data == out.data) return absl::OkStatus();
  return ToStatus(cudaMemcpyAsync(out.data, x.data, static_cast<size_t>(x.bytes()),
                                  cudaMemcpyDeviceToDevice, stream),
                  "cudaMemcpyAsync (a collective of one rank)");
}

}  // namespace

absl::Status CudaDispatch::CheckRanks(int32_t ranks, absl::string_view op,
                                      const NodeArgs& args) const {
  if (ranks == ranks_) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "CudaDispatch: ", op, " '", args.output.name, "' is for ", ranks,
      " ranks, but the dispatcher's group has ", ranks_));
}

absl::Status CudaDispatch::Run(const ops::AllReduce& op, const NodeArgs& args) {
  SG_RETURN_IF_ERROR(CheckRanks(op.ranks, "AllReduce", args));
  const TensorArg& x = args.inputs[0];
  const void* residual = op.residual ? args.inputs[1].data : nullptr;
  const int64_t n = x.shape.NumElements();
  // The residual added to the sum in place: out = round(out + residual) (ops.h). Each
  // thread of the add reads its elements before it writes them, so y may be a.
  auto add_residual = [&]() -> absl::Status {
    if (residual == nullptr) return absl::OkStatus();
    return ToStatus(kernels::LaunchAdd(args.output.data, residual, args.output.data, n, x.dtype,
                                       launch()),
                    "LaunchAdd (the AllReduce's residual)");
  };
  if (ranks_ == 1) {
    SG_RETURN_IF_ERROR(CopyOfOneRank(x, args.output, stream_));
    return add_residual();
  }
  if (one_shot_peers_ != nullptr && x.bytes() <= options_.one_shot_all_reduce_bytes) {
    const auto& peers = *static_cast<const kernels::OneShotPeers*>(one_shot_peers_);
    if (kernels::OneShotFits(x.data, residual, args.output.data, n, x.dtype, peers)) {
      return ToStatus(kernels::LaunchOneShotAllReduce(x.data, residual, args.output.data, n,
                                                      x.dtype, peers, launch()),
                      "LaunchOneShotAllReduce");
    }
  }
#if defined(STEPGRAPH_WITH_NCCL)
  SG_RETURN_IF_ERROR(NcclStatus(ncclAllReduce(x.data, args.output.data, static_cast<size_t>(n),
                                              NcclType(x.dtype), ncclSum,
                                              static_cast<ncclComm_t>(nccl_comm_), stream_),
                                "ncclAllReduce", args.output.name));
  return add_residual();
#else
  return absl::FailedPreconditionError("CudaDispatch: built without NCCL");
#endif
}

absl::Status CudaDispatch::Run(const ops::AllGather& op, const NodeArgs& args) {
  SG_RETURN_IF_ERROR(CheckRanks(op.ranks, "AllGather", args));
  const TensorArg& x = args.inputs[0];
  if (ranks_ == 1) return CopyOfOneRank(x, args.output, stream_);
#if defined(STEPGRAPH_WITH_NCCL)
  // Row i of the output is every rank's row i side by side: one gather per row, all in
  // one NCCL group (one launch).
  const int64_t m = x.shape[0], n = x.shape[1];
  const int64_t row_bytes = n * DTypeBytes(x.dtype);
  const auto* in = static_cast<const std::byte*>(x.data);
  auto* out = static_cast<std::byte*>(args.output.data);
  auto comm = static_cast<ncclComm_t>(nccl_comm_);
  SG_RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), "ncclGroupStart", args.output.name));
  absl::Status status;
  for (int64_t i = 0; i < m && status.ok(); ++i) {
    status = NcclStatus(ncclAllGather(in + i * row_bytes, out + i * row_bytes * ranks_,
                                      static_cast<size_t>(n), NcclType(x.dtype), comm, stream_),
                        "ncclAllGather", args.output.name);
  }
  const absl::Status end = NcclStatus(ncclGroupEnd(), "ncclGroupEnd", args.output.name);
  return status.ok() ? end : status;
#else
  return absl::FailedPreconditionError("CudaDispatch: built without NCCL");
#endif
}

}  // namespace sg
