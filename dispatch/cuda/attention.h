// The Attention unit's shared piece (attention.cc holds the unit): the workspace its
// launches merge their KV chunks in (per-(row, head) arrival counters and partial softmax
// states), sized in Prepare for the largest Attention node of every plan prepared, so that
// Run never allocates.
#ifndef STEPGRAPH_DISPATCH_CUDA_ATTENTION_H_
#define STEPGRAPH_DISPATCH_CUDA_ATTENTION_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dispatch/cuda/cuda_handles.h"
#include "kernels/attention.cuh"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/graph/memory_plan.h"

namespace sg::internal {

// The kernel's view of an Attention node: q [rows, heads·d], caches [slots, kv_heads, S, d].
// InvalidArgument naming the node when the kernels do not take the shape.
absl::StatusOr<kernels::AttentionShape> AttentionShapeOf(const Shape& q, const Shape& cache,
                                                         absl::string_view node);

class AttentionWorkspace {
 public:
  static absl::StatusOr<std::unique_ptr<AttentionWorkspace>> Create(const CudaDeviceInfo& info);

  // Grows the workspace to the largest need of the plan's Attention nodes. A buffer that
  // is outgrown is kept (not freed) until the dispatcher is destroyed, since plans
  // prepared and graphs captured earlier still point into it.
  absl::Status Reserve(const ExecutionPlan& plan);

  // KV chunks per launch for `shape` with q and the caches in `dtype` on this device; a
  // function of the shape and dtype only.
  int Chunks(const kernels::AttentionShape& shape, DType dtype) const;
  // The workspace for a node that needs `bytes` (Reserve first); Internal naming the node
  // when Reserve did not cover them.
  absl::StatusOr<void*> For(int64_t bytes, absl::string_view node) const {
    return workspace_.For(bytes, "Attention", node);
  }

 private:
  explicit AttentionWorkspace(const CudaDeviceInfo& info) : info_(info) {}

  CudaDeviceInfo info_;
  GrowingWorkspace workspace_;
};

}  // namespace sg::internal

#endif  // STEPGRAPH_DISPATCH_CUDA_ATTENTION_H_
