// CUDA and cuBLAS return codes become absl::Status here, and only here. The hot path
// checks for success inline; building the message is a cold call.
#ifndef STEPGRAPH_DISPATCH_CUDA_CUDA_STATUS_H_
#define STEPGRAPH_DISPATCH_CUDA_CUDA_STATUS_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace sg {
namespace internal {
absl::Status CudaError(cudaError_t e, absl::string_view what);
absl::Status CublasError(cublasStatus_t s, absl::string_view what);
}  // namespace internal

// OK for cudaSuccess; otherwise a Status naming `what` (the call and, in Run, the node)
// and CUDA's error. Out of memory is ResourceExhausted; an invalid value or launch
// configuration is InvalidArgument; everything else is Internal.
inline absl::Status ToStatus(cudaError_t e, absl::string_view what) {
  if (ABSL_PREDICT_TRUE(e == cudaSuccess)) return absl::OkStatus();
  return internal::CudaError(e, what);
}

inline absl::Status ToStatus(cublasStatus_t s, absl::string_view what) {
  if (ABSL_PREDICT_TRUE(s == CUBLAS_STATUS_SUCCESS)) return absl::OkStatus();
  return internal::CublasError(s, what);
}

// True when the CUDA runtime sees at least one device (tests skip otherwise).
bool CudaDeviceAvailable();

}  // namespace sg

#endif  // STEPGRAPH_DISPATCH_CUDA_CUDA_STATUS_H_
