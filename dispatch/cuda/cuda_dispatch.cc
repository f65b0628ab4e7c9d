// CudaDispatch: creation, per-plan preparation and the error word. The Run overloads live
// with their op families (matmul.cc, elementwise.cc, norm.cc, rope.cc, attention.cc,
// sampling.cc, embedding.cc).
#include "stepgraph/cuda_dispatch.h"

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/attention.h"
#include "dispatch/cuda/cuda_handles.h"
#include "dispatch/cuda/cuda_status.h"
#include "dispatch/cuda/matmul.h"
#include "dispatch/cuda/rope.h"
#include "dispatch/cuda/sampling.h"
#include "stepgraph/status.h"

namespace sg {

CudaDispatch::CudaDispatch(cudaStream_t stream, CudaDeviceInfo info)
    : stream_(stream), info_(info) {}

CudaDispatch::~CudaDispatch() {
  if (error_flags_ != nullptr) DeviceFree()(error_flags_);
}

absl::StatusOr<std::unique_ptr<CudaDispatch>> CudaDispatch::Create(cudaStream_t stream,
                                                                   const Options& options) {
  if (!CudaDeviceAvailable()) {
    return absl::FailedPreconditionError("CudaDispatch: no CUDA device is available");
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

  auto dispatch = std::unique_ptr<CudaDispatch>(new CudaDispatch(stream, info));
  SG_ASSIGN_OR_RETURN(DeviceMemory flags, AllocateDevice(sizeof(uint32_t), "the error word"));
  SG_RETURN_IF_ERROR(ToStatus(cudaMemset(flags.get(), 0, sizeof(uint32_t)), "cudaMemset(error word)"));
  // The memset runs on the legacy stream, which `stream` need not wait for.
  SG_RETURN_IF_ERROR(ToStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize after cudaMemset"));
  dispatch->error_flags_ = static_cast<uint32_t*>(flags.release());
  SG_ASSIGN_OR_RETURN(dispatch->matmul_,
                      internal::MatmulRunner::Create(info, options.matmul_workspace_bytes));
  SG_ASSIGN_OR_RETURN(dispatch->rope_, internal::RopeTables::Create(info));
  SG_ASSIGN_OR_RETURN(dispatch->attention_, internal::AttentionWorkspace::Create(info));
  SG_ASSIGN_OR_RETURN(dispatch->sampling_, internal::SamplingWorkspace::Create(info));
  return dispatch;
}

absl::Status CudaDispatch::Prepare(const ExecutionPlan& plan) {
  SG_RETURN_IF_ERROR(matmul_->Prepare(plan));
  SG_RETURN_IF_ERROR(rope_->Prepare(plan));
  SG_RETURN_IF_ERROR(attention_->Prepare(plan));
  SG_RETURN_IF_ERROR(sampling_->Prepare(plan));
  return absl::OkStatus();
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
