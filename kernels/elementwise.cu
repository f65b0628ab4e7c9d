// The elementwise family. One templated map kernel serves every op: each thread handles
// kUnroll 16-byte vectors per input (all loads issued before the first use), a grid of
// n / (threads * kUnroll * W) blocks covers the tensor, and the n % W tail elements are
// done by the first threads of block 0. Unaligned buffers fall back to W = 1. Decode-sized
// tensors (a few thousand vectors) take one vector per thread in blocks of 128, so that
// they still spread over dozens of SMs instead of queueing on a few.
#include <algorithm>

#include "kernels/common.cuh"
#include "kernels/elementwise.cuh"
#include "stepgraph/base/error_flags.h"

namespace sg::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;
constexpr int kSmallThreads = 128;
// Below this many vectors (one full-size block per SM of an H100) the small configuration
// is used.
constexpr int64_t kSmallVectors = int64_t{kThreads} * kUnroll * 132;

struct AddOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return FromFloat<T>(ToFloat(a) + ToFloat(b));
  }
  // Two's-complement wrap, as the CPU reference does.
  __device__ int32_t operator()(int32_t a, int32_t b) const {
    return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
  }
};
struct MulOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return FromFloat<T>(ToFloat(a) * ToFloat(b));
  }
};
struct SiluOp {
  template <typename T>
  __device__ T operator()(T x) const {
    return FromFloat<T>(Silu(ToFloat(x)));
  }
};
struct SiluMulOp {
  template <typename T>
  __device__ T operator()(T g, T u) const {
    return FromFloat<T>(Silu(ToFloat(g)) * ToFloat(u));
  }
};

template <int kInputs, typename T, typename Op>
__device__ __forceinline__ T Apply(const Op& op, T a, T b) {
  if constexpr (kInputs == 2) {
    return op(a, b);
  } else {
    return op(a);
  }
}

// y[i] = op(a[i] (, b[i])) for i < n. W elements per access.
template <typename T, int W, int kInputs, int kUnroll, typename Op>
__global__ void __launch_bounds__(kThreads)
    MapKernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, int64_t n,
              Op op) {
  AwaitPrerequisiteGrids();
  const int64_t vectors = n / W;
  const int64_t stride = blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * stride * kUnroll + threadIdx.x;
  Vec<T, W> va[kUnroll], vb[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t i = first + u * stride;
    if (i < vectors) {
      va[u] = LoadVec<T, W>(a + i * W);
      if constexpr (kInputs == 2) vb[u] = LoadVec<T, W>(b + i * W);
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t i = first + u * stride;
    if (i < vectors) {
      Vec<T, W> out;
#pragma unroll
      for (int e = 0; e < W; ++e) {
        out.v[e] = Apply<kInputs>(op, va[u].v[e], kInputs == 2 ? vb[u].v[e] : va[u].v[e]);
      }
      StoreVec<T, W>(y + i * W, out);
    }
  }
  if constexpr (W > 1) {
    const int64_t tail = vectors * W + threadIdx.x;
    if (blockIdx.x == 0 && tail < n) {
      y[tail] = Apply<kInputs>(op, a[tail], kInputs == 2 ? b[tail] : a[tail]);
    }
  }
}

template <typename T, int kInputs, typename Op>
cudaError_t LaunchMap(const void* a, const void* b, void* y, int64_t n, Op op,
                      Stream stream) {
  const bool vectorize = Aligned16(a) && Aligned16(y) && (kInputs == 1 || Aligned16(b));
  return DispatchVecWidth<T>(vectorize, [&](auto width) {
    constexpr int W = decltype(width)::value;
    const int64_t vectors = n / W;
    if (vectors < kSmallVectors) {
      const int64_t blocks = std::max<int64_t>(1, CeilDiv(vectors, kSmallThreads));
      return LaunchKernel(MapKernel<T, W, kInputs, 1, Op>, dim3(static_cast<unsigned>(blocks)),
                          dim3(kSmallThreads), stream, static_cast<const T*>(a),
                          static_cast<const T*>(b), static_cast<T*>(y), n, op);
    }
    const int64_t blocks = CeilDiv(vectors, kThreads * kUnroll);
    return LaunchKernel(MapKernel<T, W, kInputs, kUnroll, Op>, dim3(static_cast<unsigned>(blocks)),
                        dim3(kThreads), stream, static_cast<const T*>(a),
                        static_cast<const T*>(b), static_cast<T*>(y), n, op);
  });
}

template <int kInputs, typename Op>
cudaError_t LaunchFloatMap(const void* a, const void* b, void* y, int64_t n, DType dtype,
                           Op op, Stream stream) {
  if (n <= 0) return n == 0 ? cudaSuccess : cudaErrorInvalidValue;
  return DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return LaunchMap<T, kInputs>(a, b, y, n, op, stream);
  });
}

__global__ void AdvanceKernel(int32_t* pos, int64_t n, uint32_t* error_flags) {
  AwaitPrerequisiteGrids();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n || pos[i] < 0) return;
  if (pos[i] == INT32_MAX) {
    // Stays rather than wrapping to a negative position, which would read as padding.
    if (error_flags != nullptr) atomicOr(error_flags, static_cast<uint32_t>(kErrorPositionOutOfRange));
    return;
  }
  pos[i] += 1;
}

}  // namespace

cudaError_t LaunchAdd(const void* a, const void* b, void* y, int64_t n, DType dtype,
                      Stream stream) {
  if (dtype == DType::kI32) {
    if (n <= 0) return n == 0 ? cudaSuccess : cudaErrorInvalidValue;
    return LaunchMap<int32_t, 2>(a, b, y, n, AddOp{}, stream);
  }
  return LaunchFloatMap<2>(a, b, y, n, dtype, AddOp{}, stream);
}

cudaError_t LaunchMul(const void* a, const void* b, void* y, int64_t n, DType dtype,
                      Stream stream) {
  return LaunchFloatMap<2>(a, b, y, n, dtype, MulOp{}, stream);
}

cudaError_t LaunchSilu(const void* x, void* y, int64_t n, DType dtype, Stream stream) {
  return LaunchFloatMap<1>(x, nullptr, y, n, dtype, SiluOp{}, stream);
}

cudaError_t LaunchSiluMul(const void* gate, const void* up, void* y, int64_t n, DType dtype,
                          Stream stream) {
  return LaunchFloatMap<2>(gate, up, y, n, dtype, SiluMulOp{}, stream);
}

cudaError_t LaunchAdvance(int32_t* pos, int64_t n, Stream stream,
                          uint32_t* error_flags) {
  if (n <= 0) return n == 0 ? cudaSuccess : cudaErrorInvalidValue;
  constexpr int kAdvanceThreads = 128;
  return LaunchKernel(AdvanceKernel, dim3(static_cast<unsigned>(CeilDiv(n, kAdvanceThreads))),
                      dim3(kAdvanceThreads), stream, pos, n, error_flags);
}

}  // namespace sg::kernels
