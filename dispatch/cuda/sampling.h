// The sampling unit's shared piece (sampling.cc holds the Argmax and Sample unit): the
// workspace Argmax merges the blocks of a row in (a best key and an arrival counter per
// row), sized in Prepare for the largest Argmax node of every plan prepared. Sample needs
// none.
#ifndef STEPGRAPH_DISPATCH_CUDA_SAMPLING_H_
#define STEPGRAPH_DISPATCH_CUDA_SAMPLING_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dispatch/cuda/cuda_handles.h"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/graph/memory_plan.h"

namespace sg::internal {

class SamplingWorkspace {
 public:
  static absl::StatusOr<std::unique_ptr<SamplingWorkspace>> Create(const CudaDeviceInfo& info);

  // Grows the workspace to the most rows of the plan's Argmax nodes. An outgrown buffer is
  // kept until the dispatcher is destroyed (plans prepared and graphs captured earlier
  // point into it).
  absl::Status Reserve(const ExecutionPlan& plan);

  // Blocks per row of an Argmax over [rows, vocab] on this device.
  int ArgmaxBlocks(int64_t rows, int64_t vocab) const;
  // The workspace for a node that needs `bytes` (Reserve first); Internal naming the node
  // when Reserve did not cover them.
  absl::StatusOr<void*> For(int64_t bytes, absl::string_view node) const {
    return workspace_.For(bytes, "Argmax", node);
  }

 private:
  explicit SamplingWorkspace(const CudaDeviceInfo& info) : info_(info) {}

  CudaDeviceInfo info_;
  GrowingWorkspace workspace_;
};

}  // namespace sg::internal

#endif  // STEPGRAPH_DISPATCH_CUDA_SAMPLING_H_
