// CpuDispatch: the f32 reference for every op, and so the definition of what each op
// means. Storage may be f32, bf16 or f16: values are converted on load and store and all
// math is f32, with Hugging Face's order of rounding where it matters (RmsNorm, RoPE).
// Weights that MatMul and Embedding read may also be GGUF block formats, dequantized a
// block at a time exactly as GGUF's reference does (stepgraph/base/quant.h). Clarity first;
// MatMul and Attention split their output rows over a small thread pool, each output
// element computed whole by one thread, so the result is the same with any number of
// threads. Every other dispatcher is tested against it.
#ifndef STEPGRAPH_DISPATCH_CPU_DISPATCH_H_
#define STEPGRAPH_DISPATCH_CPU_DISPATCH_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "stepgraph/dispatch/dispatch.h"
#include "stepgraph/base/error_flags.h"

namespace sg {

namespace cpu {
class ThreadPool;
}

class HostCollectives;

class CpuDispatch final : public KernelDispatch {
 public:
  struct Options {
    // Threads that MatMul and Attention use, the caller's included; 0: one per core.
    int threads = 0;
    // The group the collective ops meet (not owned; must outlive the dispatcher) and this
    // dispatcher's rank in it. Null: a group of one, where collectives are copies.
    HostCollectives* collectives = nullptr;
    int rank = 0;
  };

  CpuDispatch();
  explicit CpuDispatch(Options options);
  ~CpuDispatch() override;
  CpuDispatch(const CpuDispatch&) = delete;
  CpuDispatch& operator=(const CpuDispatch&) = delete;

  // The threads in use (fewer than asked if the system refused some).
  int threads() const;

  // The RoPE frequency table of each Rope node.
  absl::StatusOr<PreparedPlan> Prepare(const ExecutionPlan& plan) override;

  // The reference defines every op for every input its shape inference accepts.
  bool Supports(const Op&, absl::Span<const Tensor* const>) const override { return true; }

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
  // Sizes scratch_ (one row per thread of at least floats_per_thread) before a parallel
  // loop, so that no part allocates.
  absl::Status PrepareScratch(int64_t floats_per_thread);
  // MoeMatMul's products x·w[ids]ᵀ into out [M, k·N] as f32 (not yet rounded to x's dtype);
  // xs is x as f32. An id outside [0, E) gives zeros and raises kErrorExpertOutOfRange.
  absl::Status MoeProducts(const TensorArg& x, const float* xs, const TensorArg& w,
                           const TensorArg& ids, float* out);

  std::unique_ptr<cpu::ThreadPool> pool_;
  std::vector<std::vector<float>> scratch_;
  std::vector<float> x_f32_, out_f32_;  // an op's inputs or outputs stored in bf16/f16
  uint32_t error_flags_ = 0;
  HostCollectives* collectives_ = nullptr;
  int rank_ = 0;
};

}  // namespace sg

#endif  // STEPGRAPH_DISPATCH_CPU_DISPATCH_H_
