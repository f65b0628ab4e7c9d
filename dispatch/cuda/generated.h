// CUDA nodes whose kernels are compiled for the plan through NVRTC (codegen.h,
// nvrtc_cache.h): FusedElementwise always, RmsNorm when CudaOptions::compiled_norm asks.
// Preparing such a node generates its source with the plan's sizes as constants, compiles
// it (or finds it in the memory or disk cache) and loads it; Run launches it.
#ifndef STEPGRAPH_DISPATCH_CUDA_GENERATED_H_
#define STEPGRAPH_DISPATCH_CUDA_GENERATED_H_

#include <memory>

#include "absl/status/statusor.h"
#include "dispatch/cuda/nvrtc_cache.h"
#include "stepgraph/dispatch/dispatch.h"
#include "stepgraph/graph/graph.h"

namespace sg::internal {

// A prepared node that is one launch of a compiled kernel.
struct CompiledNode final : PreparedNode {
  CompiledKernel kernel;
};

// The chain as one generated kernel over the node's element count.
absl::StatusOr<std::unique_ptr<PreparedNode>> PrepareFusedElementwise(
    const ops::FusedElementwise& op, const Graph& graph, const Node& node,
    CudaModuleCache& modules);

// RmsNorm with the node's rows, hidden size, eps and dtype as constants; the weight is read
// before the programmatic-launch wait when it is a graph Weight (nothing in a step writes
// one). Unimplemented past codegen::kMaxRmsNormHidden.
absl::StatusOr<std::unique_ptr<PreparedNode>> PrepareCompiledRmsNorm(const ops::RmsNorm& op,
                                                                    const Graph& graph,
                                                                    const Node& node,
                                                                    CudaModuleCache& modules);

// One launch of `prepared` (a CompiledNode): the node's input pointers, then its output's.
absl::Status LaunchCompiled(const PreparedNode* prepared, const NodeArgs& args,
                            cudaStream_t stream);

}  // namespace sg::internal

#endif  // STEPGRAPH_DISPATCH_CUDA_GENERATED_H_
