// The MatMul unit's shared piece (matmul.cc holds the unit): y = x·wᵀ (+ bias), w in the
// PyTorch / HF layout [N, K]. Three paths: cuBLASLt and stepgraph's small-M kernel
// (kernels/gemv.cuh) for float weights, picked per shape by the MatmulRunner below, and the
// block-format kernel (kernels/quant_matmul.cuh) for weights in GGUF block formats.
// Preparing a node picks its path once; for cuBLASLt the runner makes the descriptors,
// layouts and algorithm (shared by nodes of one shape); Run only launches.
#ifndef STEPGRAPH_DISPATCH_CUDA_MATMUL_H_
#define STEPGRAPH_DISPATCH_CUDA_MATMUL_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "dispatch/cuda/cuda_handles.h"
#include "kernels/launch.h"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/dispatch/cuda_options.h"

namespace sg::internal {

enum class MatmulPath : uint8_t { kCublasLt, kGemv, kBlockFormat };

// What a plan is made for: everything cuBLASLt's choice of algorithm depends on.
struct MatmulShape {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  DType dtype = DType::kF32;
  bool bias = false;

  friend bool operator==(const MatmulShape& a, const MatmulShape& b) {
    return a.m == b.m && a.n == b.n && a.k == b.k && a.dtype == b.dtype && a.bias == b.bias;
  }
  template <typename H>
  friend H AbslHashValue(H h, const MatmulShape& s) {
    return H::combine(std::move(h), s.m, s.n, s.k, s.dtype, s.bias);
  }
};

class MatmulRunner {
 public:
  // Everything one shape needs at Run (opaque outside matmul.cc).
  struct Plan;

  static absl::StatusOr<std::unique_ptr<MatmulRunner>> Create(const CudaDeviceInfo& info,
                                                              int64_t workspace_bytes,
                                                              MatmulPolicy policy);
  ~MatmulRunner();
  MatmulRunner(const MatmulRunner&) = delete;
  MatmulRunner& operator=(const MatmulRunner&) = delete;

  // Whether the float paths take `shape` (Prepare refuses it otherwise).
  static bool Takes(const MatmulShape& shape) {
    return shape.m > 0 && shape.n > 0 && shape.k > 0 && IsFloat(shape.dtype);
  }
  // A plan for `shape` (float weights of x's dtype) unless there is one; the plan stays
  // valid while the runner lives.
  absl::StatusOr<const Plan*> Prepare(const MatmulShape& shape);

  // One launch of `plan` (made by Prepare for `shape`) on `stream`.
  absl::Status Launch(const Plan& plan, const MatmulShape& shape, const void* x, const void* w,
                      const void* bias, void* y, const kernels::Stream& stream) const;

  // The path (kCublasLt or kGemv) Prepare chose for `shape`; NotFound if it was not
  // prepared.
  absl::StatusOr<MatmulPath> PathFor(const MatmulShape& shape) const;
  MatmulPolicy policy() const { return policy_; }

 private:
  MatmulRunner(const CudaDeviceInfo& info, MatmulPolicy policy);
  absl::StatusOr<std::unique_ptr<Plan>> MakeCublasLtPlan(const MatmulShape& shape) const;

  CudaDeviceInfo info_;
  MatmulPolicy policy_;
  UniqueCublasLt handle_;
  DeviceMemory workspace_;
  int64_t workspace_bytes_ = 0;
  absl::flat_hash_map<MatmulShape, std::unique_ptr<Plan>> plans_;
};

}  // namespace sg::internal

#endif  // STEPGRAPH_DISPATCH_CUDA_MATMUL_H_
