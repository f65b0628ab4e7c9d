// CudaDispatch's ops on weights in GGUF block formats (kernels/quant_matmul.cuh): MatMul
// with a quantized w (any M, in groups of kernels::kQuantMatmulGroupRows rows, each group
// reading the weight once and dequantizing in registers) and Embedding with a quantized
// table. MatmulRunner and CudaDispatch::Run(Embedding) hand such nodes here.
#ifndef STEPGRAPH_DISPATCH_CUDA_QUANT_MATMUL_H_
#define STEPGRAPH_DISPATCH_CUDA_QUANT_MATMUL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stepgraph/dispatch/dispatch.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/ops.h"

namespace sg::internal {

// The prepared state of a MatMul node whose w is in a block format: its shape, checked
// once (InvalidArgument naming the shape when the kernel cannot run it).
absl::StatusOr<std::unique_ptr<PreparedNode>> PrepareQuantMatmul(const ops::MatMul& op,
                                                                 const Tensor& x,
                                                                 const Tensor& w);

// One launch of a node prepared by PrepareQuantMatmul.
absl::Status RunQuantMatmul(const ops::MatMul& op, const NodeArgs& args, cudaStream_t stream);

// Embedding with a quantized table: one launch, bad ids flagged in *error_flags.
absl::Status RunQuantEmbedding(const NodeArgs& args, uint32_t* error_flags,
                               cudaStream_t stream);

}  // namespace sg::internal

#endif  // STEPGRAPH_DISPATCH_CUDA_QUANT_MATMUL_H_
