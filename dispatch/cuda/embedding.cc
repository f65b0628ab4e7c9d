// Embedding on CUDA: one gather launch (kernels/embedding.cuh). Bad ids are caught by the
// kernel, which writes a zero row and raises kErrorTokenOutOfRange in the error word.
#include "dispatch/cuda/cuda_status.h"
#include "dispatch/cuda/quant_matmul.h"
#include "kernels/embedding.cuh"
#include "stepgraph/dispatch/cuda_dispatch.h"

namespace sg {

absl::Status CudaDispatch::Run(const ops::Embedding&, const NodeArgs& args) {
  const TensorArg& table = args.inputs[0];
  const TensorArg& ids = args.inputs[1];
  if (IsQuantized(table.dtype)) return internal::RunQuantEmbedding(args, error_flags_, stream_);
  return ToStatus(kernels::LaunchEmbedding(table.data, ids.as<const int32_t>(), args.output.data,
                                           ids.shape[0], table.shape[0], table.shape[1],
                                           table.dtype, error_flags_, stream_),
                  "LaunchEmbedding");
}

}  // namespace sg
