// Penalize and CountIds (see penalties.cuh). Penalize takes one block per row: a pass
// applies the count-based penalties elementwise and writes f32; one thread then adds the
// logit biases in list order (a short list, and the order fixes the rounding when an id
// repeats); with min-p, a block maximum and a masking pass follow. The row stays in L2
// between the passes. Every f32 operation is an explicitly rounded intrinsic, so nvcc
// cannot contract it into an FMA that the CPU reference does not do.
#include <cub/block/block_reduce.cuh>

#include "kernels/common.cuh"
#include "kernels/penalties.cuh"
#include "stepgraph/base/error_flags.h"
#include "stepgraph/base/penalty_params.h"

namespace sg::kernels {
namespace {

constexpr int kPenalizeThreads = 512;

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return b > a ? b : a; }
};

template <typename T>
__global__ void __launch_bounds__(kPenalizeThreads)
    PenalizeKernel(const T* __restrict__ logits, int vocab, const float* __restrict__ params,
                   int param_stride, const int32_t* __restrict__ counts, float* out) {
  AwaitPrerequisiteGrids();
  using Reduce = cub::BlockReduce<float, kPenalizeThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ float row_max;
  const int64_t row = blockIdx.x;
  const T* x = logits + row * vocab;
  float* o = out + row * vocab;
  const int32_t* c = counts + row * vocab;
  const float* p = params + row * param_stride;
  const float rep = p[ops::kPenaltyRepetition], presence = p[ops::kPenaltyPresence];
  const float frequency = p[ops::kPenaltyFrequency], margin = p[ops::kPenaltyMinPMargin];
  const float nb = p[ops::kPenaltyBiasCount];
  const int biases = nb > 0.0f ? static_cast<int>(fminf(nb, ops::kMaxLogitBias)) : 0;
  const bool penalties = rep != 1.0f || presence != 0.0f || frequency != 0.0f;

  for (int v = threadIdx.x; v < vocab; v += kPenalizeThreads) {
    float l = ToFloat(x[v]);
    const int32_t cv = penalties ? c[v] : 0;
    if (cv != 0) {
      l = l > 0.0f ? __fdiv_rn(l, rep) : __fmul_rn(l, rep);
      const int32_t g = cv >> 1;
      if (g > 0) l = __fsub_rn(l, __fadd_rn(presence, __fmul_rn(frequency, static_cast<float>(g))));
    }
    o[v] = l;
  }
  if (biases > 0) {
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int j = 0; j < biases; ++j) {
        const float id = p[ops::kPenaltyBiasFirst + 2 * j];
        if (!(id >= 0.0f && id < static_cast<float>(vocab))) continue;
        const int v = static_cast<int>(id);
        o[v] = __fadd_rn(o[v], p[ops::kPenaltyBiasFirst + 2 * j + 1]);
      }
    }
  }
  if (!(margin > -INFINITY)) return;
  __syncthreads();
  float mx = -INFINITY;
  for (int v = threadIdx.x; v < vocab; v += kPenalizeThreads) mx = MaxOp()(mx, o[v]);
  mx = Reduce(tmp).Reduce(mx, MaxOp());
  if (threadIdx.x == 0) row_max = mx;
  __syncthreads();
  mx = row_max;
  for (int v = threadIdx.x; v < vocab; v += kPenalizeThreads) {
    if (__fsub_rn(o[v], mx) < margin) o[v] = -INFINITY;
  }
}

__global__ void CountIdsKernel(const int32_t* ids, const int32_t* pos, int64_t rows, int vocab,
                               int32_t* counts, uint32_t* error_flags) {
  AwaitPrerequisiteGrids();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows || pos[i] < 0) return;
  const int32_t id = ids[i];
  if (id < 0 || id >= vocab) {
    if (error_flags != nullptr) atomicOr(error_flags, static_cast<uint32_t>(kErrorTokenOutOfRange));
    return;
  }
  int32_t* c = counts + i * vocab + id;
  if (*c <= 0x7fffffff - 2) *c += 2;  // one row per slot: no other thread writes it
}

}  // namespace

cudaError_t LaunchPenalize(const void* logits, DType dtype, int64_t rows, int64_t vocab,
                           const float* params, int64_t param_stride, const int32_t* counts,
                           float* out, Stream stream) {
  if (rows <= 0 || rows > INT32_MAX || vocab <= 0 || vocab > INT32_MAX ||
      param_stride < ops::kPenaltyParams || param_stride > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  return DispatchFloat(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    return LaunchKernel(PenalizeKernel<T>, dim3(static_cast<unsigned>(rows)),
                        dim3(kPenalizeThreads), stream, static_cast<const T*>(logits),
                        static_cast<int>(vocab), params, static_cast<int>(param_stride),
                        counts, out);
  });
}

cudaError_t LaunchCountIds(const int32_t* ids, const int32_t* pos, int64_t rows, int64_t vocab,
                           int32_t* counts, Stream stream, uint32_t* error_flags) {
  if (rows <= 0 || vocab <= 0 || vocab > INT32_MAX) return cudaErrorInvalidValue;
  constexpr int kThreads = 128;
  return LaunchKernel(CountIdsKernel, dim3(static_cast<unsigned>(CeilDiv(rows, kThreads))),
                      dim3(kThreads), stream, ids, pos, rows, static_cast<int>(vocab), counts,
                      error_flags);
}

}  // namespace sg::kernels
