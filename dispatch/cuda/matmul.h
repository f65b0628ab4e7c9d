// The matmul family of CudaDispatch: y = x·wᵀ (+ bias), w in the PyTorch / HF layout
// [N, K]. Two paths: cuBLASLt, and stepgraph's small-M kernel (kernels/gemv.cuh) for
// decode. Prepare picks the path per shape and, for cuBLASLt, makes the descriptors,
// layouts and algorithm; Run does one hash lookup and one launch.
#ifndef STEPGRAPH_DISPATCH_CUDA_MATMUL_H_
#define STEPGRAPH_DISPATCH_CUDA_MATMUL_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "dispatch/cuda/cuda_handles.h"
#include "stepgraph/cuda_dispatch.h"
#include "stepgraph/plan.h"

namespace sg::internal {

enum class MatmulPath : uint8_t { kCublasLt, kGemv };

// How paths are picked. kAuto: the small-M kernel for M <= kAutoGemvMaxRows, cuBLASLt
// above. kGemv forces the small-M kernel wherever it applies (M <= 8), kCublasLt forces
// cuBLASLt everywhere.
enum class MatmulPolicy : uint8_t { kAuto, kCublasLt, kGemv };

// The policy named by the environment variable STEPGRAPH_MATMUL ("auto" or unset,
// "cublaslt", "gemv"), so that tests and benchmarks can run each path; InvalidArgument for
// any other value.
absl::StatusOr<MatmulPolicy> MatmulPolicyFromEnv();

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
  // The policy comes from STEPGRAPH_MATMUL.
  static absl::StatusOr<std::unique_ptr<MatmulRunner>> Create(const CudaDeviceInfo& info,
                                                              int64_t workspace_bytes);
  static absl::StatusOr<std::unique_ptr<MatmulRunner>> Create(const CudaDeviceInfo& info,
                                                              int64_t workspace_bytes,
                                                              MatmulPolicy policy);
  ~MatmulRunner();
  MatmulRunner(const MatmulRunner&) = delete;
  MatmulRunner& operator=(const MatmulRunner&) = delete;

  // A plan for every MatMul node of `plan` that has none yet.
  absl::Status Prepare(const ExecutionPlan& plan);
  absl::Status Prepare(const MatmulShape& shape);

  // One launch of node `args` on `stream`. FailedPrecondition when its shape was not
  // prepared.
  absl::Status Run(const ops::MatMul& op, const NodeArgs& args, cudaStream_t stream);

  // The path Prepare chose for `shape`; NotFound if it was not prepared.
  absl::StatusOr<MatmulPath> PathFor(const MatmulShape& shape) const;
  MatmulPolicy policy() const { return policy_; }

 private:
  struct Plan;

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
