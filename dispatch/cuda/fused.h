// Preparation of the fused ops' CUDA nodes (dispatch/cuda/fused.cc).
#ifndef STEPGRAPH_DISPATCH_CUDA_FUSED_H_
#define STEPGRAPH_DISPATCH_CUDA_FUSED_H_

#include <memory>

#include "absl/status/statusor.h"
#include "dispatch/cuda/cuda_handles.h"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/graph/graph.h"

namespace sg::internal {

class RopeTables;

// Unimplemented for weights that are not of x's float dtype (quantized weights: the
// passes leave those matmuls unfused), more than kFusedMaxWeights weights, or the
// rope_kv_write epilogue with head_dim not a multiple of kFusedCols (4). That epilogue's
// frequency table comes from `tables`.
absl::StatusOr<std::unique_ptr<PreparedNode>> PrepareFusedMatmul(const ops::FusedMatMul& op,
                                                                const Graph& graph,
                                                                const Node& node,
                                                                const CudaDeviceInfo& info,
                                                                RopeTables& tables);
absl::StatusOr<std::unique_ptr<PreparedNode>> PrepareRopeKvWrite(const ops::RopeKvWrite& op,
                                                                RopeTables& tables);

}  // namespace sg::internal

#endif  // STEPGRAPH_DISPATCH_CUDA_FUSED_H_
