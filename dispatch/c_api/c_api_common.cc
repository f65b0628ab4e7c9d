// The host-only part of the C ABI, the same in the CUDA build and in the stub: the version,
// the error strings and the RoPE frequency table (computed by the code the CPU reference
// and the CUDA dispatcher use, so a C caller rotates by the same angles).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "stepgraph/c_api.h"
#include "stepgraph/ops.h"
#include "stepgraph/rope.h"

namespace {

// Larger head dims exist in no model; the bound keeps the caller's array size sane.
constexpr int32_t kMaxRopeHeadDim = 1 << 16;

bool FinitePositive(float v) { return std::isfinite(v) && v > 0.0f; }

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
  if (inv_freq == nullptr || reinterpret_cast<uintptr_t>(inv_freq) % alignof(float) != 0 ||
      head_dim <= 0 || head_dim % 2 != 0 || head_dim > kMaxRopeHeadDim ||
      !FinitePositive(theta)) {
    return STEPGRAPH_ERROR_INVALID_VALUE;
  }
  sg::ops::Rope rope;
  rope.head_dim = head_dim;
  rope.theta = theta;
  switch (scaling) {
    case STEPGRAPH_ROPE_SCALING_NONE:
      break;
    case STEPGRAPH_ROPE_SCALING_LLAMA3:
      // high > low also keeps the smoothing's denominator away from zero.
      if (!FinitePositive(factor) || !FinitePositive(low_freq_factor) ||
          !FinitePositive(high_freq_factor) || !(high_freq_factor > low_freq_factor) ||
          original_max_position <= 0) {
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
    const std::vector<float> table = sg::RopeInvFreq(rope);
    std::memcpy(inv_freq, table.data(), table.size() * sizeof(float));
  } catch (const std::bad_alloc&) {
    return STEPGRAPH_ERROR_OUT_OF_MEMORY;
  }
  return STEPGRAPH_OK;
}

}  // extern "C"
