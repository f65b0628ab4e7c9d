// What the C ABI's sources share. Every device function of c_api.h is split in two, both
// declared here from the generated list (c_api_list.inc, read from c_api.h):
//   - Check<Name>(args): the argument checks, compiled into both builds
//     (c_api_checks.cc), so that a bad argument gets the same code with or without CUDA;
//   - Run<Name>(args): the launch, in the CUDA build only (c_api_cuda.cc), called once the
//     checks passed and a device was found.
// c_api_entry.cc defines the exported functions from the same list. A function declared in
// c_api.h without its Check or Run fails to link.
#ifndef STEPGRAPH_C_API_C_API_INTERNAL_H_
#define STEPGRAPH_C_API_C_API_INTERNAL_H_

#include <cstdint>
#include <initializer_list>
#include <optional>

#include "stepgraph/c_api/c_api.h"
#include "stepgraph/base/dtype.h"

namespace sg::capi {

#define SG_C_API_HOST(Name, c_name, ret, params, args)
#define SG_C_API_DEVICE(Name, c_name, ret, params, args) \
  int32_t Check##Name params noexcept;                   \
  ret Run##Name params noexcept;
#include "stepgraph/c_api_list.inc"
#undef SG_C_API_HOST
#undef SG_C_API_DEVICE

constexpr int64_t kMaxElements = STEPGRAPH_MAX_ELEMENTS;
// Launchers that put rows on grid.y or grid.z take at most this many.
constexpr int64_t kMaxGridRows = 65535;
// The largest count that a launcher takes as an int (and grid.x takes in blocks).
constexpr int64_t kMaxInt = 2147483647;
// Sample gives each row of long vocabularies a cluster of this many blocks on grid.x
// (kernels/sampling.cu), which must stay below 2^31.
constexpr int64_t kSampleBlocksPerRow = 8;
// The launchers' workspace layouts hold 8-byte fields; 16 leaves room to grow.
constexpr int64_t kWorkspaceAlign = 16;
// cuBLASLt's workspace alignment.
constexpr int64_t kGemmWorkspaceAlign = 256;
// Larger RoPE head dims exist in no model; the bound keeps every head_dim an int.
constexpr int64_t kMaxRopeHeadDim = 1 << 16;

enum class Allowed { kFloat, kFloatOrI32 };

// The dtype of a C `dtype` argument, or nullopt for a value the function does not take.
std::optional<DType> ParseDType(int32_t value, Allowed allowed);

// Argument checks, chained so that each check reads as its list of requirements.
class Require {
 public:
  // A buffer of elements `align` bytes wide.
  Require& Buffer(const void* p, int64_t align) {
    ok_ = ok_ && p != nullptr && Aligned(p, align);
    return *this;
  }
  Require& OptionalBuffer(const void* p, int64_t align) {
    ok_ = ok_ && (p == nullptr || Aligned(p, align));
    return *this;
  }
  // A tensor of these dims: each positive, their product at most kMaxElements. Checked
  // without overflow, so later products of these dims are safe.
  Require& Tensor(std::initializer_list<int64_t> dims) {
    int64_t elements = 1;
    for (const int64_t d : dims) {
      if (!ok_ || d <= 0 || d > kMaxElements / elements) {
        ok_ = false;
        return *this;
      }
      elements *= d;
    }
    return *this;
  }
  Require& AtMost(int64_t v, int64_t max) {
    ok_ = ok_ && v <= max;
    return *this;
  }
  Require& That(bool condition) {
    ok_ = ok_ && condition;
    return *this;
  }
  Require& Finite(float v) { return That(v - v == 0.0f); }  // false for NaN and inf
  // workspace NULL with 0 bytes, or an `align`-aligned buffer with bytes >= 0.
  Require& Workspace(const void* p, int64_t bytes, int64_t align = kWorkspaceAlign) {
    ok_ = ok_ && bytes >= 0 && (p != nullptr ? Aligned(p, align) : bytes == 0);
    return *this;
  }

  bool ok() const { return ok_; }
  int32_t code() const { return ok_ ? STEPGRAPH_OK : STEPGRAPH_ERROR_INVALID_VALUE; }

 private:
  static bool Aligned(const void* p, int64_t align) {
    return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(align) == 0;
  }

  bool ok_ = true;
};

}  // namespace sg::capi

#endif  // STEPGRAPH_C_API_C_API_INTERNAL_H_
