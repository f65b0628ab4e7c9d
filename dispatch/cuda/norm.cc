// RmsNorm and Softmax on CUDA: one row-wise launch each (kernels/norm.cuh, or an RmsNorm
// compiled for the node when CudaOptions::compiled_norm asks: dispatch/cuda/generated.h).
#include "dispatch/cuda/cuda_status.h"
#include "dispatch/cuda/generated.h"
#include "kernels/norm.cuh"
#include "stepgraph/dispatch/cuda_dispatch.h"

namespace sg {

absl::Status CudaDispatch::Run(const ops::RmsNorm& op, const NodeArgs& args) {
  if (args.prepared != nullptr) return internal::LaunchCompiled(args.prepared, args, stream_);
  const TensorArg& x = args.inputs[0];
  return ToStatus(kernels::LaunchRmsNorm(x.data, args.inputs[1].data, args.output.data,
                                         x.shape[0], x.shape[1], op.eps, x.dtype, stream_),
                  "LaunchRmsNorm");
}

absl::Status CudaDispatch::Run(const ops::Softmax&, const NodeArgs& args) {
  const TensorArg& x = args.inputs[0];
  return ToStatus(kernels::LaunchSoftmax(x.data, args.output.data, x.shape[0], x.shape[1],
                                         x.dtype, stream_),
                  "LaunchSoftmax");
}

}  // namespace sg
