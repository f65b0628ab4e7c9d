// Device-side helpers shared by stepgraph's kernel families (.cu files only; host code
// includes the per-family launcher headers instead): the runtime-dtype to compile-time-type
// dispatch, 16-byte vectors, f32 conversions and loads that round as the CPU reference
// does, and warp/block reductions built on shuffles.
#ifndef STEPGRAPH_KERNELS_COMMON_CUH_
#define STEPGRAPH_KERNELS_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/launch.h"
#include "stepgraph/base/dtype.h"

namespace sg::kernels {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpSize = 32;

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

// Elements of T in one 16-byte access.
template <typename T>
constexpr int kVec16 = static_cast<int>(16 / sizeof(T));

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

// ---- Programmatic dependent launch -----------------------------------------------------
// On sm_90 and later a kernel launched with programmatic stream serialization may start
// while the kernel before it on the stream is still running; in a captured graph that
// hides most of the gap between dependent kernel nodes. It is safe because every stepgraph
// kernel calls AwaitPrerequisiteGrids() before its first access to global memory (reads
// and writes alike: the arena is reused): the call returns only once the kernels it
// depends on have completed and their writes are visible. The one exception reads before
// it what no kernel writes: graph Weights (the fused matmul at M = 1, when its dispatcher
// says the weights are Weights). Kernels that do not make the call (cuBLASLt's) are
// launched without the attribute and wait as usual.

// Waits for the prerequisite grids, then lets the next kernel on the stream begin to
// launch. The first statement of every stepgraph kernel (but the one above); a no-op when
// the kernel was not launched programmatically or is compiled for an architecture before
// sm_90.
__device__ __forceinline__ void AwaitPrerequisiteGrids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && STEPGRAPH_KERNELS_PDL
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches `kernel` on `stream`, programmatically serialised when the caller allows it and
// the kernels and device can take it. Returns the launch's error and, like a <<<>>> launch
// followed by cudaGetLastError, leaves no error pending.
template <typename... Params, typename... Args>
cudaError_t LaunchKernel(void (*kernel)(Params...), dim3 grid, dim3 block, const Stream& stream,
                         Args&&... args) {
  cudaLaunchAttribute attribute[1];
  const cudaLaunchConfig_t config = MakeLaunchConfig(
      grid, block, 0, stream, stream.programmatic && ProgrammaticLaunchSupported(), attribute);
  const cudaError_t e = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}

// W elements of T loaded or stored as one access of W * sizeof(T) bytes.
template <typename T, int W>
struct alignas(sizeof(T) * W) Vec {
  T v[W];
};

template <typename T, int W>
__device__ __forceinline__ Vec<T, W> LoadVec(const T* p) {
  return *reinterpret_cast<const Vec<T, W>*>(p);
}
template <typename T, int W>
__device__ __forceinline__ void StoreVec(T* p, const Vec<T, W>& v) {
  *reinterpret_cast<Vec<T, W>*>(p) = v;
}
// The same load for data read once (weights): ld.global.cs, so that it does not stay in
// the caches.
template <typename T, int W>
__device__ __forceinline__ Vec<T, W> LoadStreaming(const T* p) {
  if constexpr (sizeof(Vec<T, W>) == 16) {
    const uint4 u = __ldcs(reinterpret_cast<const uint4*>(p));
    Vec<T, W> v;
    memcpy(&v, &u, sizeof(v));
    return v;
  } else {
    static_assert(W == 1);
    return Vec<T, 1>{{__ldcs(p)}};
  }
}

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }

// Round to nearest even, as the CPU reference's FloatToBF16 / FloatToHalf.
template <typename T>
__device__ __forceinline__ T FromFloat(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    static_assert(std::is_same_v<T, __half>);
    return __float2half_rn(v);
  }
}

// v as T would hold it, back in f32: models Hugging Face's intermediate roundings.
template <typename T>
__device__ __forceinline__ float RoundTo(float v) {
  return ToFloat(FromFloat<T>(v));
}

// W consecutive elements of T as f32: one W * sizeof(T)-byte access (W = 1: a scalar one).
template <typename T, int W>
__device__ __forceinline__ void LoadFloats(const T* p, float (&f)[W]) {
  if constexpr (W == 1) {
    f[0] = ToFloat(p[0]);
  } else {
    const Vec<T, W> v = LoadVec<T, W>(p);
#pragma unroll
    for (int i = 0; i < W; ++i) f[i] = ToFloat(v.v[i]);
  }
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(kFullMask, v, offset);
  }
  return v;
}

// Sum over the block, returned to every thread. `scratch` is __shared__ float[33]; calls
// may follow one another with the same scratch.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  v = WarpSum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
    v = WarpSum(lane < warps ? scratch[lane] : 0.0f);
    if (lane == 0) scratch[kWarpSize] = v;
  }
  __syncthreads();
  return scratch[kWarpSize];
}

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_COMMON_CUH_
