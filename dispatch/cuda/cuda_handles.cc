#include "dispatch/cuda/cuda_handles.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_status.h"
#include "stepgraph/base/status.h"

namespace sg {

absl::StatusOr<DeviceMemory> AllocateDevice(int64_t bytes, const char* what) {
  void* p = nullptr;
  SG_RETURN_IF_ERROR(ToStatus(cudaMalloc(&p, static_cast<size_t>(bytes)),
                              absl::StrCat("cudaMalloc(", bytes, " bytes) for ", what)));
  return DeviceMemory(p);
}

absl::StatusOr<UniqueStream> CreateStream(const char* what) {
  cudaStream_t s = nullptr;
  SG_RETURN_IF_ERROR(ToStatus(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                              absl::StrCat("cudaStreamCreate for ", what)));
  return UniqueStream(s);
}

absl::StatusOr<UniqueEvent> CreateEvent(const char* what) {
  cudaEvent_t e = nullptr;
  SG_RETURN_IF_ERROR(ToStatus(cudaEventCreate(&e), absl::StrCat("cudaEventCreate for ", what)));
  return UniqueEvent(e);
}

absl::Status GrowingWorkspace::Reserve(int64_t bytes, const char* what) {
  if (bytes <= bytes_) return absl::OkStatus();
  SG_ASSIGN_OR_RETURN(DeviceMemory grown, AllocateDevice(bytes, what));
  // The memset runs on the legacy stream: wait for it before any launch on another stream.
  SG_RETURN_IF_ERROR(ToStatus(cudaMemset(grown.get(), 0, static_cast<size_t>(bytes)),
                              absl::StrCat("cudaMemset(", what, ")")));
  SG_RETURN_IF_ERROR(ToStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize after cudaMemset"));
  if (buffer_ != nullptr) retired_.push_back(std::move(buffer_));
  buffer_ = std::move(grown);
  bytes_ = bytes;
  return absl::OkStatus();
}

absl::StatusOr<void*> GrowingWorkspace::For(int64_t bytes, absl::string_view op,
                                            absl::string_view node) const {
  if (bytes > bytes_) {
    return absl::InternalError(absl::StrCat(op, " node '", node, "' needs ", bytes,
                                            " bytes of workspace but ", bytes_,
                                            " were reserved"));
  }
  return buffer_.get();
}

}  // namespace sg
