// The switches of the CUDA dispatcher, in a header without CUDA so that sessions, the step
// runner and the program can carry them on any build. The program maps the environment
// (STEPGRAPH_MATMUL, STEPGRAPH_PDL) onto these once; library code reads no environment.
#ifndef STEPGRAPH_DISPATCH_CUDA_OPTIONS_H_
#define STEPGRAPH_DISPATCH_CUDA_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sg {

// How the CUDA dispatcher picks a path for each MatMul. kAuto: stepgraph's small-M kernel
// where it is faster (decode shapes), cuBLASLt elsewhere; kGemv: the small-M kernel
// wherever it applies (M <= 8); kCublasLt: cuBLASLt everywhere. The forced ones let tests
// and benchmarks run each path.
enum class MatmulPolicy : uint8_t { kAuto, kCublasLt, kGemv };

absl::string_view MatmulPolicyName(MatmulPolicy p);  // "auto", "cublaslt", "gemv"
// Inverse of MatmulPolicyName; InvalidArgument naming the choices otherwise.
absl::StatusOr<MatmulPolicy> ParseMatmulPolicy(absl::string_view name);

struct CudaOptions {
  MatmulPolicy matmul = MatmulPolicy::kAuto;
  // Programmatic dependent launch on sm_90 and later (each kernel may start while its
  // predecessor drains). The dispatcher's own: other dispatchers of the process launch as
  // their options say.
  bool programmatic_launch = true;
  int64_t matmul_workspace_bytes = int64_t{32} << 20;
  // Kernels compiled for the plan through NVRTC (docs/nvrtc.md) are cached in memory per
  // process and, when this names a folder, on disk there (created if missing; a folder
  // that cannot be written leaves the cache in memory). The program passes
  // ${XDG_CACHE_HOME:-$HOME/.cache}/stepgraph/kernels.
  std::string kernel_cache_folder;
  // RmsNorm through a kernel compiled for the node's hidden size, eps and dtype (NVRTC)
  // instead of the built-in kernel. FusedElementwise nodes are always compiled.
  bool compiled_norm = false;
};

}  // namespace sg

#endif  // STEPGRAPH_DISPATCH_CUDA_OPTIONS_H_
