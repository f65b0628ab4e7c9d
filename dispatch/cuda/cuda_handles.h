// RAII owners for CUDA and cuBLASLt objects. Deleters never throw; a failed release is
// logged to stderr, since there is nobody to return it to.
#ifndef STEPGRAPH_DISPATCH_CUDA_CUDA_HANDLES_H_
#define STEPGRAPH_DISPATCH_CUDA_CUDA_HANDLES_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <type_traits>

#include "absl/status/statusor.h"

namespace sg {

namespace internal {
void LogReleaseFailure(const char* what, int code);
}  // namespace internal

struct StreamDeleter {
  void operator()(cudaStream_t s) const noexcept {
    if (cudaError_t e = cudaStreamDestroy(s); e != cudaSuccess) {
      internal::LogReleaseFailure("cudaStreamDestroy", e);
    }
  }
};
using UniqueStream = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter>;

struct EventDeleter {
  void operator()(cudaEvent_t e) const noexcept {
    if (cudaError_t r = cudaEventDestroy(e); r != cudaSuccess) {
      internal::LogReleaseFailure("cudaEventDestroy", r);
    }
  }
};
using UniqueEvent = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDeleter>;

struct DeviceFree {
  void operator()(void* p) const noexcept {
    if (cudaError_t e = cudaFree(p); e != cudaSuccess) {
      internal::LogReleaseFailure("cudaFree", e);
    }
  }
};
// Device memory from cudaMalloc.
using DeviceMemory = std::unique_ptr<void, DeviceFree>;

struct HostFree {
  void operator()(void* p) const noexcept {
    if (cudaError_t e = cudaFreeHost(p); e != cudaSuccess) {
      internal::LogReleaseFailure("cudaFreeHost", e);
    }
  }
};
// Pinned host memory from cudaMallocHost.
using PinnedMemory = std::unique_ptr<void, HostFree>;

struct GraphDeleter {
  void operator()(cudaGraph_t g) const noexcept {
    if (cudaError_t e = cudaGraphDestroy(g); e != cudaSuccess) {
      internal::LogReleaseFailure("cudaGraphDestroy", e);
    }
  }
};
using UniqueGraph = std::unique_ptr<std::remove_pointer_t<cudaGraph_t>, GraphDeleter>;

struct GraphExecDeleter {
  void operator()(cudaGraphExec_t g) const noexcept {
    if (cudaError_t e = cudaGraphExecDestroy(g); e != cudaSuccess) {
      internal::LogReleaseFailure("cudaGraphExecDestroy", e);
    }
  }
};
using UniqueGraphExec =
    std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>, GraphExecDeleter>;

struct CublasLtDeleter {
  void operator()(cublasLtHandle_t h) const noexcept {
    if (cublasStatus_t s = cublasLtDestroy(h); s != CUBLAS_STATUS_SUCCESS) {
      internal::LogReleaseFailure("cublasLtDestroy", s);
    }
  }
};
using UniqueCublasLt = std::unique_ptr<std::remove_pointer_t<cublasLtHandle_t>, CublasLtDeleter>;

struct MatmulDescDeleter {
  void operator()(cublasLtMatmulDesc_t d) const noexcept {
    if (cublasStatus_t s = cublasLtMatmulDescDestroy(d); s != CUBLAS_STATUS_SUCCESS) {
      internal::LogReleaseFailure("cublasLtMatmulDescDestroy", s);
    }
  }
};
using UniqueMatmulDesc =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, MatmulDescDeleter>;

struct MatrixLayoutDeleter {
  void operator()(cublasLtMatrixLayout_t l) const noexcept {
    if (cublasStatus_t s = cublasLtMatrixLayoutDestroy(l); s != CUBLAS_STATUS_SUCCESS) {
      internal::LogReleaseFailure("cublasLtMatrixLayoutDestroy", s);
    }
  }
};
using UniqueMatrixLayout =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, MatrixLayoutDeleter>;

struct MatmulPreferenceDeleter {
  void operator()(cublasLtMatmulPreference_t p) const noexcept {
    if (cublasStatus_t s = cublasLtMatmulPreferenceDestroy(p); s != CUBLAS_STATUS_SUCCESS) {
      internal::LogReleaseFailure("cublasLtMatmulPreferenceDestroy", s);
    }
  }
};
using UniqueMatmulPreference =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, MatmulPreferenceDeleter>;

// cudaMalloc of `bytes` as an owner; ResourceExhausted when the device is full.
absl::StatusOr<DeviceMemory> AllocateDevice(int64_t bytes, const char* what);
absl::StatusOr<UniqueStream> CreateStream(const char* what);
absl::StatusOr<UniqueEvent> CreateEvent(const char* what);

}  // namespace sg

#endif  // STEPGRAPH_DISPATCH_CUDA_CUDA_HANDLES_H_
