// The sampling family of CudaDispatch (Argmax, Sample): the workspace Argmax merges the
// blocks of a row in (a best key and an arrival counter per row), sized in Prepare for
// the largest Argmax node of every plan prepared. Sample needs none.
#ifndef STEPGRAPH_DISPATCH_CUDA_SAMPLING_H_
#define STEPGRAPH_DISPATCH_CUDA_SAMPLING_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dispatch/cuda/cuda_handles.h"
#include "stepgraph/cuda_dispatch.h"
#include "stepgraph/plan.h"

namespace sg::internal {

class SamplingWorkspace {
 public:
  static absl::StatusOr<std::unique_ptr<SamplingWorkspace>> Create(const CudaDeviceInfo& info);

  // Grows the workspace to the most rows of the plan's Argmax nodes. An outgrown buffer is
  // kept until the dispatcher is destroyed (graphs captured earlier point into it).
  absl::Status Prepare(const ExecutionPlan& plan);

  // Blocks per row of an Argmax over [rows, vocab] on this device.
  int ArgmaxBlocks(int64_t rows, int64_t vocab) const;

  // The workspace for an Argmax over `rows` rows; FailedPrecondition naming the node when
  // Prepare did not size it.
  absl::StatusOr<void*> ForArgmax(int64_t rows, absl::string_view node) const;

 private:
  explicit SamplingWorkspace(const CudaDeviceInfo& info) : info_(info) {}

  CudaDeviceInfo info_;
  DeviceMemory buffer_;
  int64_t bytes_ = 0;
  std::vector<DeviceMemory> retired_;
};

}  // namespace sg::internal

#endif  // STEPGRAPH_DISPATCH_CUDA_SAMPLING_H_
