// CpuDispatch: the f32 reference for every op, and so the definition of what each op
// means. Storage may be f32, bf16 or f16: values are converted on load and store and all
// math is f32, with Hugging Face's order of rounding where it matters (RmsNorm, RoPE).
// Slow by design: clarity over speed. Every other dispatcher is tested against it.
#ifndef STEPGRAPH_CPU_DISPATCH_H_
#define STEPGRAPH_CPU_DISPATCH_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "stepgraph/dispatch.h"
#include "stepgraph/error_flags.h"

namespace sg {

class CpuDispatch final : public KernelDispatch {
 public:
  // The RoPE frequency table of each Rope node.
  absl::StatusOr<PreparedPlan> Prepare(const ExecutionPlan& plan) override;

#define SG_CPU_RUN(Name) absl::Status Run(const ops::Name& op, const NodeArgs& args) override;
  SG_OP_LIST(SG_CPU_RUN)
#undef SG_CPU_RUN

  // ErrorFlag bits raised since the last call (out-of-range ids or positions); clears them.
  uint32_t TakeErrorFlags() {
    const uint32_t f = error_flags_;
    error_flags_ = 0;
    return f;
  }

 private:
  uint32_t error_flags_ = 0;
};

}  // namespace sg

#endif  // STEPGRAPH_CPU_DISPATCH_H_
