// Device code shared by stepgraph's kernels: f32 conversions that round as the CPU
// reference does, 16-byte vectors, warp and block sums, SiLU and the programmatic-launch
// wait. Device functions only, with no host API and no standard library, so that both nvcc
// (through kernels/common.cuh, which adds the host-side launch helpers) and NVRTC compile
// it: the kernels generated for a plan (dispatch/cuda/codegen.cc) include this very file,
// embedded in the library at build time, rather than a copy of it.
#ifndef STEPGRAPH_KERNELS_DEVICE_COMMON_CUH_
#define STEPGRAPH_KERNELS_DEVICE_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace sg::kernels {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpSize = 32;

// Elements of T in one 16-byte access.
template <typename T>
constexpr int kVec16 = static_cast<int>(16 / sizeof(T));

// ---- Programmatic dependent launch -----------------------------------------------------
// On sm_90 and later a kernel launched with programmatic stream serialization may start
// while the kernel before it on the stream is still running; in a captured graph that
// hides most of the gap between dependent kernel nodes. It is safe because every stepgraph
// kernel calls AwaitPrerequisiteGrids() before its first access to global memory (reads
// and writes alike: the arena is reused): the call returns only once the kernels it
// depends on have completed and their writes are visible. The exceptions read before it
// only what no kernel writes: graph Weights (the fused matmul at M = 1 and the compiled
// RmsNorm, when their dispatcher says the weights are Weights). Kernels that do not make
// the call (cuBLASLt's) are launched without the attribute and wait as usual.
// STEPGRAPH_KERNELS_PDL says the kernel is built for sm_90 or later only (kernels/
// CMakeLists.txt; NVRTC compiles for the device's own architecture and sets it).

// Waits for the prerequisite grids, then lets the next kernel on the stream begin to
// launch. The first statement of every stepgraph kernel (but the ones above); a no-op when
// the kernel was not launched programmatically or is compiled for an architecture before
// sm_90.
__device__ __forceinline__ void AwaitPrerequisiteGrids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && STEPGRAPH_KERNELS_PDL
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// ---- Vectors and conversions ------------------------------------------------------------

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
    static_assert(W == 1, "a streaming load is one element or 16 bytes");
    return Vec<T, 1>{{__ldcs(p)}};
  }
}

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }

// Round to nearest even, as the CPU reference's FloatToBF16 / FloatToHalf.
template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
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

// V consecutive elements of T as f32, through 16-byte accesses: p is 16-byte aligned and
// V elements are whole vectors (the kernels compiled for a plan read V of every input).
template <typename T, int V>
__device__ __forceinline__ void LoadFloatsVec16(const T* p, float (&f)[V]) {
  constexpr int W = kVec16<T>;
  static_assert(V % W == 0, "whole 16-byte vectors");
#pragma unroll
  for (int j = 0; j < V; j += W) {
    const Vec<T, W> v = LoadVec<T, W>(p + j);
#pragma unroll
    for (int e = 0; e < W; ++e) f[j + e] = ToFloat(v.v[e]);
  }
}
// The inverse: V values rounded to T and stored through 16-byte accesses.
template <typename T, int V>
__device__ __forceinline__ void StoreFloatsVec16(T* p, const float (&f)[V]) {
  constexpr int W = kVec16<T>;
  static_assert(V % W == 0, "whole 16-byte vectors");
#pragma unroll
  for (int j = 0; j < V; j += W) {
    Vec<T, W> v;
#pragma unroll
    for (int e = 0; e < W; ++e) v.v[e] = FromFloat<T>(f[j + e]);
    StoreVec<T, W>(p + j, v);
  }
}

// ---- Math -------------------------------------------------------------------------------

// x · sigmoid(x), as the CPU reference computes it.
__device__ __forceinline__ float Silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(kFullMask, v, offset);
  }
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
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

#endif  // STEPGRAPH_KERNELS_DEVICE_COMMON_CUH_
