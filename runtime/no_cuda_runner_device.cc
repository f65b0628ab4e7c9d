// A build without CUDA: the StepRunner has the CPU device only.
#include "runtime/runner_device.h"

namespace sg {

bool BuiltWithCuda() { return false; }
bool CudaDeviceFound() { return false; }

absl::StatusOr<std::unique_ptr<OpSupport>> CudaOpSupport(const CudaOptions&) {
  return absl::FailedPreconditionError("this build of stepgraph has no CUDA");
}

absl::StatusOr<std::unique_ptr<CollectiveGroup>> MakeCudaCollectives(int) {
  return absl::FailedPreconditionError("this build of stepgraph has no CUDA");
}

absl::StatusOr<std::unique_ptr<RunnerDevice>> MakeCudaRunnerDevice(const RunnerOptions&) {
  return absl::FailedPreconditionError("this build of stepgraph has no CUDA");
}

}  // namespace sg
