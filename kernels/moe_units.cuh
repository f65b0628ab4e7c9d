// Device pieces the mixture-of-experts kernels share (kernels/moe.cu, and the one-row
// kernel's down experts with their combine in kernels/quant_matmul.cu): the expert-id
// error flag, a row's routing weights, the order of its slots and the combine's sum. .cu
// files only.
#ifndef STEPGRAPH_KERNELS_MOE_UNITS_CUH_
#define STEPGRAPH_KERNELS_MOE_UNITS_CUH_

#include <cstdint>

#include "kernels/common.cuh"
#include "stepgraph/base/error_flags.h"

namespace sg::kernels {

__device__ __forceinline__ void RaiseExpertOutOfRange(uint32_t* error_flags) {
  if (error_flags != nullptr) atomicOr(error_flags, static_cast<uint32_t>(kErrorExpertOutOfRange));
}

// One warp: the routing weights of a row of logits z (`experts` of them) for its chosen
// ids, each handed to store(j, weight) by one lane; softmax over every expert in f32
// (transformers: softmax(router_logits, dtype=float)), divided by the chosen ones' sum
// when `renormalize`, rounded to T when `round_to_dtype`. A bad id: weight 0 and the flag.
// MoeRouteWeights and MoeCombine's `route` both call it, so their weights are the same bits.
template <typename T, typename Store>
__device__ __forceinline__ void RowRouteWeights(const T* z, const int32_t* chosen_ids,
                                                int experts, int top_k, bool renormalize,
                                                bool round_to_dtype, uint32_t* error_flags,
                                                int lane, Store&& store) {
  float mx = -INFINITY;
  for (int e = lane; e < experts; e += kWarpSize) mx = fmaxf(mx, ToFloat(z[e]));
  mx = WarpMax(mx);
  float total = 0.0f;
  for (int e = lane; e < experts; e += kWarpSize) total += expf(ToFloat(z[e]) - mx);
  total = WarpSum(total);
  auto probability = [&](int j, bool& valid) {
    const int32_t e = chosen_ids[j];
    valid = e >= 0 && e < experts;
    return valid ? expf(ToFloat(z[e]) - mx) / total : 0.0f;
  };
  float chosen = 0.0f;
  if (renormalize) {
    for (int j = lane; j < top_k; j += kWarpSize) {
      bool valid = false;
      chosen += probability(j, valid);
    }
    chosen = WarpSum(chosen);
  }
  for (int j = lane; j < top_k; j += kWarpSize) {
    bool valid = false;
    const float p = probability(j, valid);
    if (!valid) RaiseExpertOutOfRange(error_flags);
    float v = renormalize ? p / chosen : p;
    if (round_to_dtype) v = RoundTo<T>(v);
    store(j, v);
  }
}

// Slot j's place among a row's top_k ids in ascending id order, ties by slot (a stable
// sort of the slots): the order in which MoeCombine adds the experts' terms.
__device__ __forceinline__ int SlotRank(const int32_t* row_ids, int top_k, int j) {
  const int32_t mine = row_ids[j];
  int rank = 0;
  for (int i = 0; i < top_k; ++i) {
    const int32_t other = row_ids[i];
    rank += other < mine || (other == mine && i < j);
  }
  return rank;
}

// MoeCombine's running sum after one more term, weight · y with y as stored in T: the term
// and the sum each rounded to T, explicit _rn operations (no contraction into an FMA), bit
// for bit the CPU reference.
template <typename T>
__device__ __forceinline__ float AddCombineTerm(float sum, float weight, float y) {
  return RoundTo<T>(__fadd_rn(sum, RoundTo<T>(__fmul_rn(weight, y))));
}

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_MOE_UNITS_CUH_
