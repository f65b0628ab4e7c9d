// The host-only part of the C ABI (the functions c_api.h marks STEPGRAPH_C_HOST), the same
// in both builds: the version, the error strings and the RoPE frequency table (computed by
// the code the CPU reference and the CUDA dispatcher use, so a C caller rotates by the same
// angles).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "c_api/c_api_internal.h"
#include "stepgraph/c_api/c_api.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/ops.h"
#include "stepgraph/graph/rope.h"

namespace {

using sg::capi::kMaxRopeHeadDim;

bool Finite(float v) { return std::isfinite(v); }

}  // namespace

extern "C" {

int32_t stepgraph_abi_version(void) noexcept { return STEPGRAPH_C_API_VERSION; }

const char* stepgraph_error_string(int32_t code) noexcept {
  switch (code) {
    case STEPGRAPH_OK:
      return "ok";
    case STEPGRAPH_ERROR_NO_CUDA:
      return "CUDA not available: no device or driver, a device this build has no kernels "
             "for, or a build without CUDA";
    case STEPGRAPH_ERROR_INVALID_VALUE:
      return "invalid value: a null or misaligned pointer, a size, shape, dtype or parameter "
             "out of range";
    case STEPGRAPH_ERROR_LAUNCH_FAILED:
      return "launch failed: CUDA refused or failed the kernel launch";
    case STEPGRAPH_ERROR_OUT_OF_MEMORY:
      return "out of memory";
    default:
      return "unknown error code";
  }
}

int32_t stepgraph_rope_inv_freq(int32_t head_dim, float theta, int32_t scaling, float factor,
                                float low_freq_factor, float high_freq_factor,
                                int32_t original_max_position, float* inv_freq) noexcept {
  // The C ABI's own bounds first: a base below 1 makes frequencies grow with the dimension
  // (no model does that), and a tiny one overflows them to infinity.
  if (inv_freq == nullptr || reinterpret_cast<uintptr_t>(inv_freq) % alignof(float) != 0 ||
      head_dim <= 0 || head_dim > kMaxRopeHeadDim || !Finite(theta) || !(theta >= 1.0f)) {
    return STEPGRAPH_ERROR_INVALID_VALUE;
  }
  sg::ops::Rope rope;
  rope.head_dim = head_dim;
  rope.theta = theta;
  switch (scaling) {
    case STEPGRAPH_ROPE_SCALING_NONE:
      break;
    case STEPGRAPH_ROPE_SCALING_LLAMA3:
      if (!Finite(factor) || !Finite(low_freq_factor) || !Finite(high_freq_factor)) {
        return STEPGRAPH_ERROR_INVALID_VALUE;
      }
      rope.scaling.type = sg::ops::RopeScaling::Type::kLlama3;
      rope.scaling.factor = factor;
      rope.scaling.low_freq_factor = low_freq_factor;
      rope.scaling.high_freq_factor = high_freq_factor;
      rope.scaling.original_max_position = original_max_position;
      break;
    default:
      return STEPGRAPH_ERROR_INVALID_VALUE;
  }
  try {
    // The rest (head_dim even, theta, the Llama-3 factors) is the Rope op's own rule: asked
    // of its shape inference on a one-row input.
    sg::Tensor x, pos;
    x.dtype = sg::DType::kF32;
    x.shape = sg::Shape{1, head_dim};
    pos.dtype = sg::DType::kI32;
    pos.shape = sg::Shape{1};
    const sg::Tensor* inputs[] = {&x, &pos};
    if (!sg::InferOutputType(rope, "stepgraph_rope_inv_freq", inputs).ok()) {
      return STEPGRAPH_ERROR_INVALID_VALUE;
    }
    const std::vector<float> table = sg::RopeInvFreq(rope);
    for (const float f : table) {
      if (!Finite(f)) return STEPGRAPH_ERROR_INVALID_VALUE;  // nothing written
    }
    std::memcpy(inv_freq, table.data(), table.size() * sizeof(float));
  } catch (const std::bad_alloc&) {
    return STEPGRAPH_ERROR_OUT_OF_MEMORY;
  }
  return STEPGRAPH_OK;
}

}  // extern "C"
