// The layout of ops::Penalize's per-slot parameters (stepgraph/graph/ops.h), here in base
// without Abseil so that the CUDA kernels (kernels/penalties.cu) and the graph share it.
#ifndef STEPGRAPH_BASE_PENALTY_PARAMS_H_
#define STEPGRAPH_BASE_PENALTY_PARAMS_H_

#include <cstdint>

namespace sg::ops {

// Logit biases a sequence may carry (OpenAI's API allows 300; each costs the Penalize row
// one serial add, and the parameters of every slot live on the device).
inline constexpr int32_t kMaxLogitBias = 64;
// Offsets in a slot's row of params[slots, kPenaltyParams] f32.
enum PenaltyParam : int32_t {
  kPenaltyRepetition = 0,  // r, 1: off
  kPenaltyPresence = 1,    // a, 0: off
  kPenaltyFrequency = 2,   // f, 0: off
  kPenaltyMinPMargin = 3,  // T * ln(min_p), -inf: off
  kPenaltyBiasCount = 4,   // n <= kMaxLogitBias
  kPenaltyBiasFirst = 5,   // n pairs (id, bias), ids as floats (exact below 2^24)
};
inline constexpr int32_t kPenaltyParams = kPenaltyBiasFirst + 2 * kMaxLogitBias;

}  // namespace sg::ops

#endif  // STEPGRAPH_BASE_PENALTY_PARAMS_H_
