// y = alpha · x. A grid-stride loop over W-wide vectors (16-byte accesses when both buffers
// are aligned and n is a multiple of W, else scalars), at most a few waves of blocks: the
// kernel is memory bound and a C ABI caller's sizes vary widely.
#include <algorithm>

#include "kernels/common.cuh"
#include "kernels/scale.cuh"

namespace sg::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

template <typename T, int W>
__global__ void ScaleKernel(const T* __restrict__ x, T* __restrict__ y, int64_t vectors,
                            float alpha) {
  AwaitPrerequisiteGrids();
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < vectors; i += stride) {
    Vec<T, W> v = LoadVec<T, W>(x + i * W);
#pragma unroll
    for (int j = 0; j < W; ++j) v.v[j] = FromFloat<T>(alpha * ToFloat(v.v[j]));
    StoreVec<T, W>(y + i * W, v);
  }
}

}  // namespace

cudaError_t LaunchScale(const void* x, void* y, int64_t n, float alpha, DType dtype,
                        Stream stream) {
  if (n <= 0) return cudaErrorInvalidValue;
  return DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vectorize = Aligned16(x) && Aligned16(y) && n % kVec16<T> == 0;
    return DispatchVecWidth<T>(vectorize, [&](auto width) {
      constexpr int W = decltype(width)::value;
      const int64_t vectors = n / W;
      const int64_t blocks = std::min(CeilDiv(vectors, kThreads), kMaxBlocks);
      return LaunchKernel(ScaleKernel<T, W>, dim3(static_cast<unsigned>(blocks)),
                          dim3(kThreads), stream, static_cast<const T*>(x), static_cast<T*>(y),
                          vectors, alpha);
    });
  });
}

}  // namespace sg::kernels
