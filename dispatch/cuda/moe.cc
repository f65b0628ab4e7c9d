// The mixture-of-experts ops on CUDA: not yet. Supports says no for every one of them, so
// the passes never make work for them here, and Prepare refuses a plan that holds one with
// Unimplemented naming the op: such a model runs on the CPU reference (--cpu) until the
// kernels come (one block per (row, chosen expert) reading the expert ids on the device).
#include "absl/strings/str_cat.h"
#include "dispatch/cuda/op_units.h"

namespace sg {
namespace internal {
namespace {

absl::Status NotOnCuda(absl::string_view op) {
  return absl::UnimplementedError(absl::StrCat(
      "CUDA has no ", op, " kernel yet (mixture-of-experts models run on the CPU reference: "
      "--cpu)"));
}

}  // namespace

PreparedOr Prepare(const ops::MoeTopK&, const CudaPrepareContext&) {
  return NotOnCuda("MoeTopK");
}
PreparedOr Prepare(const ops::MoeRouteWeights&, const CudaPrepareContext&) {
  return NotOnCuda("MoeRouteWeights");
}
PreparedOr Prepare(const ops::MoeMatMul&, const CudaPrepareContext&) {
  return NotOnCuda("MoeMatMul");
}
PreparedOr Prepare(const ops::MoeCombine&, const CudaPrepareContext&) {
  return NotOnCuda("MoeCombine");
}

bool Supports(const ops::MoeTopK&, const CudaSupportQuery&) { return false; }
bool Supports(const ops::MoeRouteWeights&, const CudaSupportQuery&) { return false; }
bool Supports(const ops::MoeMatMul&, const CudaSupportQuery&) { return false; }
bool Supports(const ops::MoeCombine&, const CudaSupportQuery&) { return false; }

}  // namespace internal

// Prepare refuses every plan holding one of these ops, so no Run is reached; a Run
// without a plan says the same.
absl::Status CudaDispatch::Run(const ops::MoeTopK&, const NodeArgs&) {
  return internal::NotOnCuda("MoeTopK");
}
absl::Status CudaDispatch::Run(const ops::MoeRouteWeights&, const NodeArgs&) {
  return internal::NotOnCuda("MoeRouteWeights");
}
absl::Status CudaDispatch::Run(const ops::MoeMatMul&, const NodeArgs&) {
  return internal::NotOnCuda("MoeMatMul");
}
absl::Status CudaDispatch::Run(const ops::MoeCombine&, const NodeArgs&) {
  return internal::NotOnCuda("MoeCombine");
}

}  // namespace sg
