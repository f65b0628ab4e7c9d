// What stepgraph's kernel families share (.cu files only; host code includes the
// per-family launcher headers instead): the device code of kernels/device_common.cuh
// (conversions, 16-byte vectors, reductions, the programmatic-launch wait), and the
// host-side launch helpers: the runtime-dtype to compile-time-type dispatch, the vector
// width and row-count dispatch, and LaunchKernel.
#ifndef STEPGRAPH_KERNELS_COMMON_CUH_
#define STEPGRAPH_KERNELS_COMMON_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/device_common.cuh"
#include "kernels/launch.h"
#include "stepgraph/base/dtype.h"

namespace sg::kernels {

constexpr int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Calls f(std::type_identity<T>{}) with T the storage type of a float dtype, so that the
// kernel template is chosen at compile time; i32 and unknown values are refused.
template <typename F>
cudaError_t DispatchFloat(DType t, F&& f) {
  switch (t) {
    case DType::kF32:
      return f(std::type_identity<float>{});
    case DType::kBF16:
      return f(std::type_identity<__nv_bfloat16>{});
    case DType::kF16:
      return f(std::type_identity<__half>{});
    default:
      break;  // i32 and the block formats have kernels of their own
  }
  return cudaErrorInvalidValue;
}

// Calls f(std::integral_constant<int, W>{}) with W = kVec16<T> when every access can be a
// 16-byte vector, else W = 1 (scalar accesses for odd sizes or unaligned buffers).
template <typename T, typename F>
cudaError_t DispatchVecWidth(bool vectorize, F&& f) {
  if (vectorize) return f(std::integral_constant<int, kVec16<T>>{});
  return f(std::integral_constant<int, 1>{});
}

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Calls f(std::integral_constant<int, m>{}) for m in [1, kMaxDispatchRows], so that a
// small-M kernel is compiled once per row count; cudaErrorInvalidValue otherwise.
inline constexpr int kMaxDispatchRows = 8;
template <typename F>
cudaError_t DispatchRows(int64_t m, F&& f) {
  switch (m) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default: return cudaErrorInvalidValue;
  }
}

// LaunchKernelShared in thread block clusters of `cluster` consecutive blocks along x
// (sm_90 and later; grid.x a multiple of it), or without clusters for 1.
template <typename... Params, typename... Args>
cudaError_t LaunchKernelClustered(void (*kernel)(Params...), dim3 grid, dim3 block,
                                  size_t shared_bytes, unsigned cluster, const Stream& stream,
                                  Args&&... args) {
  cudaLaunchAttribute attributes[2];
  cudaLaunchConfig_t config =
      MakeLaunchConfig(grid, block, shared_bytes, stream,
                       stream.programmatic && ProgrammaticLaunchSupported(), attributes);
  if (cluster > 1) {
    cudaLaunchAttribute& c = attributes[config.numAttrs++];
    c.id = cudaLaunchAttributeClusterDimension;
    c.val.clusterDim.x = cluster;
    c.val.clusterDim.y = 1;
    c.val.clusterDim.z = 1;
  }
  const cudaError_t e = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}

// LaunchKernel with `shared_bytes` of dynamic shared memory (above 48 KiB the caller sets
// the kernel's cudaFuncAttributeMaxDynamicSharedMemorySize first).
template <typename... Params, typename... Args>
cudaError_t LaunchKernelShared(void (*kernel)(Params...), dim3 grid, dim3 block,
                               size_t shared_bytes, const Stream& stream, Args&&... args) {
  return LaunchKernelClustered(kernel, grid, block, shared_bytes, 1, stream,
                               std::forward<Args>(args)...);
}

// Launches `kernel` on `stream`, programmatically serialised when the caller allows it and
// the kernels and device can take it. Returns the launch's error and, like a <<<>>> launch
// followed by cudaGetLastError, leaves no error pending.
template <typename... Params, typename... Args>
cudaError_t LaunchKernel(void (*kernel)(Params...), dim3 grid, dim3 block, const Stream& stream,
                         Args&&... args) {
  return LaunchKernelShared(kernel, grid, block, 0, stream, std::forward<Args>(args)...);
}

// ---- Asynchronous copies into shared memory (sm_80 and later; no-ops before) ----------
// One 16-byte copy from global to shared memory, 16 zeros written when not `valid` (and
// nothing read); CommitCopies closes a group of them, AwaitCopies<n> waits until at most
// n groups are still in flight. The copies are visible to the whole block after the wait
// and a __syncthreads.
__device__ __forceinline__ void CopyAsync16(void* to, const void* from, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(to));
  // Zero bytes read (16 zeros written) when not valid.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(from),
               "r"(valid ? 16 : 0)
               : "memory");
#endif
}
__device__ __forceinline__ void CommitCopies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void AwaitCopies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_COMMON_CUH_
