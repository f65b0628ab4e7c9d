// RoPE frequencies, following transformers' _compute_default_rope_parameters and
// _compute_llama3_parameters (and _compute_linear_scaling_rope_parameters) step by step
// in f32.
#include "stepgraph/graph/rope.h"

#include <cmath>

namespace sg {

std::vector<float> RopeInvFreq(const ops::Rope& rope) {
  const int half = rope.head_dim / 2;
  std::vector<float> inv(half);
  for (int j = 0; j < half; ++j) {
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(rope.head_dim);
    inv[j] = 1.0f / std::pow(rope.theta, exponent);
  }
  if (rope.scaling.type == ops::RopeScaling::Type::kLinear) {
    for (float& f : inv) f /= rope.scaling.factor;
    return inv;
  }
  if (rope.scaling.type != ops::RopeScaling::Type::kLlama3) return inv;

  const ops::RopeScaling& s = rope.scaling;
  const float old_context = static_cast<float>(s.original_max_position);
  const float low_freq_wavelen = old_context / s.low_freq_factor;
  const float high_freq_wavelen = old_context / s.high_freq_factor;
  constexpr float kTwoPi = static_cast<float>(2.0 * M_PI);
  for (int j = 0; j < half; ++j) {
    const float wavelen = kTwoPi / inv[j];
    float f = wavelen > low_freq_wavelen ? inv[j] / s.factor : inv[j];
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (medium) {
      const float smooth =
          (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = (1.0f - smooth) * f / s.factor + smooth * f;
    }
    inv[j] = f;
  }
  return inv;
}

}  // namespace sg
