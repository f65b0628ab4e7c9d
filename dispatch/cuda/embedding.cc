// The Embedding unit of CudaDispatch: one gather launch per node, of the table's rows
// (kernels/embedding.cuh) or, for a table in a GGUF block format, of its rows dequantized
// on the fly (kernels/quant_matmul.cuh); which one is decided at Prepare. Bad ids are
// caught by the kernel, which writes a zero row and raises kErrorTokenOutOfRange in the
// error word.
#include "dispatch/cuda/cuda_status.h"
#include "dispatch/cuda/op_units.h"
#include "kernels/embedding.cuh"
#include "kernels/quant_matmul.cuh"
#include "stepgraph/base/status.h"
#include "stepgraph/dispatch/cuda_dispatch.h"

namespace sg {
namespace internal {
namespace {

struct EmbeddingState final : PreparedState<EmbeddingState> {
  bool block_format = false;  // the table is in a GGUF block format
};

}  // namespace

// A block-format table's kernel takes up to 65535 rows (one grid row each); a plain one,
// any.
bool Supports(const ops::Embedding&, const CudaSupportQuery& q) {
  return !IsQuantized(q.input(0).dtype) || q.input(1).shape[0] <= 65535;
}

PreparedOr Prepare(const ops::Embedding&, const CudaPrepareContext& c) {
  auto state = std::make_unique<EmbeddingState>();
  state->block_format = IsQuantized(c.input(0).dtype);
  return Keep(std::move(state));
}

}  // namespace internal

absl::Status CudaDispatch::Run(const ops::Embedding&, const NodeArgs& args) {
  SG_ASSIGN_OR_RETURN(const internal::EmbeddingState* s,
                      args.PreparedAs<internal::EmbeddingState>());
  const TensorArg& table = args.inputs[0];
  const TensorArg& ids = args.inputs[1];
  if (s->block_format) {
    return ToStatus(kernels::LaunchQuantEmbedding(table.data, table.dtype,
                                                  ids.as<const int32_t>(), args.output.data,
                                                  ids.shape[0], table.shape[0], table.shape[1],
                                                  args.output.dtype, error_flags_, launch()),
                    "LaunchQuantEmbedding");
  }
  return ToStatus(kernels::LaunchEmbedding(table.data, ids.as<const int32_t>(), args.output.data,
                                           ids.shape[0], table.shape[0], table.shape[1],
                                           table.dtype, error_flags_, launch()),
                  "LaunchEmbedding");
}

}  // namespace sg
