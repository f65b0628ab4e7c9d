// What the units whose kernels are compiled for the plan through NVRTC (codegen.h,
// nvrtc_cache.h) share: FusedElementwise (generated.cc, which holds that unit) and RmsNorm
// when CudaOptions::compiled_norm asks (norm.cc). Such a node's Prepare generates the
// source with the plan's sizes as constants, compiles it (or finds it in the memory or
// disk cache) and loads it; its Run launches it.
#ifndef STEPGRAPH_DISPATCH_CUDA_GENERATED_H_
#define STEPGRAPH_DISPATCH_CUDA_GENERATED_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dispatch/cuda/codegen.h"
#include "dispatch/cuda/nvrtc_cache.h"
#include "kernels/launch.h"
#include "stepgraph/dispatch/dispatch.h"

namespace sg::internal {

// `generated` compiled for the current device and loaded, with its launch shape.
absl::StatusOr<CompiledKernel> LoadGenerated(const codegen::GeneratedKernel& generated,
                                             CudaModuleCache& modules);

// One launch of `kernel` with the node's input pointers, then its output's, as arguments.
absl::Status LaunchCompiled(const CompiledKernel& kernel, const NodeArgs& args,
                            const kernels::Stream& stream);

}  // namespace sg::internal

#endif  // STEPGRAPH_DISPATCH_CUDA_GENERATED_H_
