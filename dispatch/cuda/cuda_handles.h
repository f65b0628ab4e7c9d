// RAII owners for CUDA and cuBLASLt objects, and the calls that make them. Deleters never
// throw; a failed release is logged to stderr, since there is nobody to return it to.
#ifndef STEPGRAPH_DISPATCH_CUDA_CUDA_HANDLES_H_
#define STEPGRAPH_DISPATCH_CUDA_CUDA_HANDLES_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/unique_handle.h"

namespace sg {

// One deleter template (base/unique_handle.h) for every CUDA and cuBLASLt object; the
// names are kept for the code that calls a deleter by hand.
using StreamDeleter = HandleDeleter<cudaStream_t, cudaStreamDestroy, "cudaStreamDestroy">;
using UniqueStream = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter>;

using EventDeleter = HandleDeleter<cudaEvent_t, cudaEventDestroy, "cudaEventDestroy">;
using UniqueEvent = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDeleter>;

// Device memory from cudaMalloc.
using DeviceFree = HandleDeleter<void*, cudaFree, "cudaFree">;
using DeviceMemory = std::unique_ptr<void, DeviceFree>;

// Pinned host memory from cudaMallocHost.
using HostFree = HandleDeleter<void*, cudaFreeHost, "cudaFreeHost">;
using PinnedMemory = std::unique_ptr<void, HostFree>;

using GraphDeleter = HandleDeleter<cudaGraph_t, cudaGraphDestroy, "cudaGraphDestroy">;
using UniqueGraph = std::unique_ptr<std::remove_pointer_t<cudaGraph_t>, GraphDeleter>;

using GraphExecDeleter =
    HandleDeleter<cudaGraphExec_t, cudaGraphExecDestroy, "cudaGraphExecDestroy">;
using UniqueGraphExec =
    std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>, GraphExecDeleter>;

using UniqueCublasLt = UniqueHandle<cublasLtHandle_t, cublasLtDestroy, "cublasLtDestroy">;
using UniqueMatmulDesc = UniqueHandle<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy,
                                      "cublasLtMatmulDescDestroy">;
using UniqueMatrixLayout = UniqueHandle<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy,
                                        "cublasLtMatrixLayoutDestroy">;
using UniqueMatmulPreference =
    UniqueHandle<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy,
                 "cublasLtMatmulPreferenceDestroy">;

// cudaMalloc of `bytes` as an owner; ResourceExhausted when the device is full.
absl::StatusOr<DeviceMemory> AllocateDevice(int64_t bytes, const char* what);
absl::StatusOr<UniqueStream> CreateStream(const char* what);
absl::StatusOr<UniqueEvent> CreateEvent(const char* what);

// A device buffer that only grows, zeroed whenever it is (re)allocated: the workspace of
// kernels that merge partial results across blocks with arrival counters, which they
// leave at zero. Reserve runs in Prepare, never in Run. An outgrown buffer is kept until
// the owner is destroyed, since plans prepared and graphs captured earlier point into it.
class GrowingWorkspace {
 public:
  // Grows to at least `bytes`; nothing when it holds them already. `what` names the
  // workspace in errors. Zeroing runs on the legacy stream and is waited for.
  absl::Status Reserve(int64_t bytes, const char* what);
  // The buffer for a node that needs `bytes`: Internal naming the node when Reserve did
  // not cover them.
  absl::StatusOr<void*> For(int64_t bytes, absl::string_view op, absl::string_view node) const;
  int64_t bytes() const { return bytes_; }

 private:
  DeviceMemory buffer_;
  int64_t bytes_ = 0;
  std::vector<DeviceMemory> retired_;
};

}  // namespace sg

#endif  // STEPGRAPH_DISPATCH_CUDA_CUDA_HANDLES_H_
