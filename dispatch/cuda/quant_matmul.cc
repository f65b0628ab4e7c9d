// MatMul and Embedding on CUDA with weights in GGUF block formats. Preparing a MatMul
// checks its shape once; Run only launches (no allocation, formatting or sync).
#include "dispatch/cuda/quant_matmul.h"

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_status.h"
#include "kernels/quant_matmul.cuh"

namespace sg::internal {
namespace {

struct QuantMatmulNode final : PreparedNode {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  DType w_dtype = DType::kQ8_0;
  DType dtype = DType::kF32;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PreparedNode>> PrepareQuantMatmul(const ops::MatMul&,
                                                                 const Tensor& x,
                                                                 const Tensor& w) {
  auto node = std::make_unique<QuantMatmulNode>();
  node->m = x.shape[0];
  node->n = w.shape[0];
  node->k = x.shape[1];
  node->w_dtype = w.dtype;
  node->dtype = x.dtype;
  const int64_t groups =
      (node->m + kernels::kQuantMatmulGroupRows - 1) / kernels::kQuantMatmulGroupRows;
  if (!IsQuantized(w.dtype) || !IsFloat(x.dtype) || node->m <= 0 || node->n <= 0 ||
      node->n > 0x7fffffff || node->k <= 0 || node->k % DTypeBlockElems(w.dtype) != 0 ||
      w.shape[1] != node->k || groups > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("no CUDA matmul for x ", x.shape.ToString(), " ", DTypeName(x.dtype),
                     " with w ", w.shape.ToString(), " ", DTypeName(w.dtype),
                     " (a block-format w needs K a multiple of ", DTypeBlockElems(w.dtype),
                     ", N <= 2^31-1 and M <= ", 65535 * kernels::kQuantMatmulGroupRows, ")"));
  }
  return std::unique_ptr<PreparedNode>(std::move(node));
}

absl::Status RunQuantMatmul(const ops::MatMul& op, const NodeArgs& args, cudaStream_t stream) {
  const auto* node = static_cast<const QuantMatmulNode*>(args.prepared);
  if (ABSL_PREDICT_FALSE(node == nullptr)) return NotPrepared();
  const void* bias = op.has_bias ? args.inputs[2].data : nullptr;
  return ToStatus(kernels::LaunchQuantMatmul(args.inputs[0].data, args.inputs[1].data,
                                             node->w_dtype, bias, args.output.data, node->m,
                                             node->n, node->k, node->dtype, stream),
                  "LaunchQuantMatmul");
}

absl::Status RunQuantEmbedding(const NodeArgs& args, uint32_t* error_flags,
                               cudaStream_t stream) {
  const TensorArg& table = args.inputs[0];
  const TensorArg& ids = args.inputs[1];
  return ToStatus(kernels::LaunchQuantEmbedding(table.data, table.dtype,
                                                ids.as<const int32_t>(), args.output.data,
                                                ids.shape[0], table.shape[0], table.shape[1],
                                                args.output.dtype, error_flags, stream),
                  "LaunchQuantEmbedding");
}

}  // namespace sg::internal
