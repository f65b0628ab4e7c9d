// RoPE inverse frequencies as Hugging Face computes them (f32 throughout, Llama-3 scaling
// included). Computed once on the host and shared by every dispatcher, so the CPU
// reference and the GPU rotate by bit-identical angles' inputs.
#ifndef STEPGRAPH_GRAPH_ROPE_H_
#define STEPGRAPH_GRAPH_ROPE_H_

#include <vector>

#include "stepgraph/graph/ops.h"

namespace sg {

// head_dim / 2 frequencies: inv_freq[j] = 1 / theta^(2j / head_dim), then scaled.
std::vector<float> RopeInvFreq(const ops::Rope& rope);

}  // namespace sg

#endif  // STEPGRAPH_GRAPH_ROPE_H_
