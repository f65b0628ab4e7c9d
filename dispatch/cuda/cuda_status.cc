#include "dispatch/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace sg {
namespace internal {

absl::Status CudaError(cudaError_t e, absl::string_view what) {
  // Clear the sticky "last error" of a non-fatal failure so that the next call does not
  // report it again.
  (void)cudaGetLastError();
  const std::string msg =
      absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  switch (e) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidDevicePointer:
      return absl::InvalidArgumentError(msg);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status CublasError(cublasStatus_t s, absl::string_view what) {
  const std::string msg = absl::StrCat(what, ": ", cublasLtGetStatusName(s), " (",
                                       cublasLtGetStatusString(s), ")");
  switch (s) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(msg);
    case CUBLAS_STATUS_INVALID_VALUE:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace internal

bool CudaDeviceAvailable() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

}  // namespace sg
