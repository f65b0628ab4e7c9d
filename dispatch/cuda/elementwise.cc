// The elementwise unit of CudaDispatch: Add, Mul, Silu, SiluMul, Copy and Advance, one
// launch each from the node's arguments alone, so they keep no state (Copy is one
// device-to-device cudaMemcpyAsync, a memcpy node when captured), for every input their
// shape inference accepts.
#include "dispatch/cuda/cuda_status.h"
#include "dispatch/cuda/op_units.h"
#include "kernels/elementwise.cuh"
#include "stepgraph/dispatch/cuda_dispatch.h"

namespace sg {
namespace internal {

PreparedOr Prepare(const ops::Add&, const CudaPrepareContext&) { return NoState(); }
PreparedOr Prepare(const ops::Mul&, const CudaPrepareContext&) { return NoState(); }
PreparedOr Prepare(const ops::Silu&, const CudaPrepareContext&) { return NoState(); }
PreparedOr Prepare(const ops::SiluMul&, const CudaPrepareContext&) { return NoState(); }
PreparedOr Prepare(const ops::Copy&, const CudaPrepareContext&) { return NoState(); }
PreparedOr Prepare(const ops::Advance&, const CudaPrepareContext&) { return NoState(); }

// Every dtype and shape their shape inference accepts.
bool Supports(const ops::Add&, const CudaSupportQuery&) { return true; }
bool Supports(const ops::Mul&, const CudaSupportQuery&) { return true; }
bool Supports(const ops::Silu&, const CudaSupportQuery&) { return true; }
bool Supports(const ops::SiluMul&, const CudaSupportQuery&) { return true; }
bool Supports(const ops::Copy&, const CudaSupportQuery&) { return true; }
bool Supports(const ops::Advance&, const CudaSupportQuery&) { return true; }

}  // namespace internal

absl::Status CudaDispatch::Run(const ops::Add&, const NodeArgs& args) {
  return ToStatus(kernels::LaunchAdd(args.inputs[0].data, args.inputs[1].data, args.output.data,
                                     args.output.shape.NumElements(), args.output.dtype, launch()),
                  "LaunchAdd");
}

absl::Status CudaDispatch::Run(const ops::Mul&, const NodeArgs& args) {
  return ToStatus(kernels::LaunchMul(args.inputs[0].data, args.inputs[1].data, args.output.data,
                                     args.output.shape.NumElements(), args.output.dtype, launch()),
                  "LaunchMul");
}

absl::Status CudaDispatch::Run(const ops::Silu&, const NodeArgs& args) {
  return ToStatus(kernels::LaunchSilu(args.inputs[0].data, args.output.data,
                                      args.output.shape.NumElements(), args.output.dtype, launch()),
                  "LaunchSilu");
}

absl::Status CudaDispatch::Run(const ops::SiluMul&, const NodeArgs& args) {
  return ToStatus(
      kernels::LaunchSiluMul(args.inputs[0].data, args.inputs[1].data, args.output.data,
                             args.output.shape.NumElements(), args.output.dtype, launch()),
      "LaunchSiluMul");
}

absl::Status CudaDispatch::Run(const ops::Copy&, const NodeArgs& args) {
  const void* src = args.inputs[0].data;
  void* dst = args.output.data;  // also inputs[1]
  if (src == dst) return absl::OkStatus();
  return ToStatus(cudaMemcpyAsync(dst, src, static_cast<size_t>(args.output.bytes()),
                                  cudaMemcpyDeviceToDevice, stream_),
                  "cudaMemcpyAsync(Copy)");
}

absl::Status CudaDispatch::Run(const ops::Advance&, const NodeArgs& args) {
  return ToStatus(kernels::LaunchAdvance(args.output.as<int32_t>(),
                                         args.output.shape.NumElements(), launch(), error_flags_),
                  "LaunchAdvance");
}

}  // namespace sg
