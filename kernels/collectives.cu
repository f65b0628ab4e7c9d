// The one-shot all-reduce (kernels/collectives.cuh). Block b of every rank handles the
// same 16-byte vectors; it meets block b of the other ranks through flag words
// flags[rank][b][q], each holding the count of all-reduces rank q's block b has entered.
#include <algorithm>

#include "kernels/collectives.cuh"
#include "kernels/common.cuh"

namespace sg::kernels {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ void StoreRelease(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t LoadAcquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    OneShotAllReduceKernel(const T* __restrict__ x, const T* __restrict__ residual,
                           T* __restrict__ out, int64_t vectors, OneShotPeers p) {
  constexpr int W = kVec16<T>;
  AwaitPrerequisiteGrids();
  const int b = static_cast<int>(blockIdx.x);
  // This all-reduce's count: its parity picks the slot, and the peers' flag words reach
  // it when their block b has written its part.
  const uint32_t count = p.counts[b] + 1;
  const int64_t slot = static_cast<int64_t>(count & 1u) * (p.slot_bytes / static_cast<int64_t>(sizeof(T)));
  const int64_t per_block = (vectors + gridDim.x - 1) / gridDim.x;
  const int64_t first = per_block * b, last = min(vectors, first + per_block);
  T* mine = static_cast<T*>(p.data[p.rank]) + slot;
  for (int64_t i = first + threadIdx.x; i < last; i += blockDim.x) {
    StoreVec<T, W>(mine + i * W, LoadVec<T, W>(x + i * W));
  }
  __syncthreads();
  if (threadIdx.x < static_cast<unsigned>(p.ranks)) {
    const int q = static_cast<int>(threadIdx.x);
    // This block's part is in place: say so to rank q, then wait for rank q's word.
    __threadfence_system();
    StoreRelease(p.flags[q] + b * kOneShotMaxRanks + p.rank, count);
    const uint32_t* word = p.flags[p.rank] + b * kOneShotMaxRanks + q;
    // A rank that never comes has failed on the host, which aborts the group and reports
    // it; the wait ends after 10 s so that the other GPUs do not spin forever.
    const uint64_t start = GlobalTimerNs();
    while (static_cast<int32_t>(LoadAcquire(word) - count) < 0 &&
           GlobalTimerNs() - start < 10'000'000'000ull) {
    }
  }
  __syncthreads();
  for (int64_t i = first + threadIdx.x; i < last; i += blockDim.x) {
    float acc[W];
#pragma unroll
    for (int j = 0; j < W; ++j) acc[j] = 0.0f;
    for (int q = 0; q < p.ranks; ++q) {
      // Volatile loads: the peer's buffer is written by another GPU.
      const uint4 u =
          __ldcv(reinterpret_cast<const uint4*>(static_cast<const T*>(p.data[q]) + slot + i * W));
      Vec<T, W> v;
      memcpy(&v, &u, sizeof(v));
#pragma unroll
      for (int j = 0; j < W; ++j) acc[j] += ToFloat(v.v[j]);
    }
    Vec<T, W> r;
#pragma unroll
    for (int j = 0; j < W; ++j) r.v[j] = FromFloat<T>(acc[j]);
    if (residual != nullptr) {
      // Add(residual, sum): the rounded sum plus the residual, rounded again (ops.h).
      const Vec<T, W> add = LoadVec<T, W>(residual + i * W);
#pragma unroll
      for (int j = 0; j < W; ++j) r.v[j] = FromFloat<T>(ToFloat(r.v[j]) + ToFloat(add.v[j]));
    }
    StoreVec<T, W>(out + i * W, r);
  }
  __syncthreads();
  if (threadIdx.x == 0) p.counts[b] = count;
}

}  // namespace

bool OneShotFits(const void* x, const void* residual, const void* out, int64_t n, DType dtype,
                 const OneShotPeers& p) {
  const int64_t bytes = n * DTypeBytes(dtype);
  return p.counts != nullptr && p.ranks >= 1 && p.ranks <= kOneShotMaxRanks && n > 0 &&
         (dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16) &&
         Aligned16(x) && Aligned16(out) && (residual == nullptr || Aligned16(residual)) &&
         bytes % 16 == 0 && bytes <= p.slot_bytes;
}

cudaError_t LaunchOneShotAllReduce(const void* x, const void* residual, void* out, int64_t n,
                                   DType dtype, const OneShotPeers& peers, Stream stream) {
  if (!OneShotFits(x, residual, out, n, dtype, peers)) return cudaErrorInvalidValue;
  return DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t vectors = n / kVec16<T>;
    // A block for every 4 vectors a thread, up to the flags' blocks: 8 KiB is one block.
    const int64_t blocks = std::clamp<int64_t>(CeilDiv(vectors, 4 * kThreads), 1, kOneShotMaxBlocks);
    return LaunchKernel(OneShotAllReduceKernel<T>, dim3(static_cast<unsigned>(blocks)),
                        dim3(kThreads), stream, static_cast<const T*>(x),
                        static_cast<const T*>(residual), static_cast<T*>(out), vectors, peers);
  });
}

}  // namespace sg::kernels
