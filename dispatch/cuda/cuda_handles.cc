#include "dispatch/cuda/cuda_handles.h"

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_status.h"
#include "stepgraph/status.h"

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

}  // namespace sg
