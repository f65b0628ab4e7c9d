// The MatMul unit's shared piece (matmul.cc holds the unit): y = x·wᵀ (+ bias), w in the
// PyTorch / HF layout [N, K]. Five paths: cuBLASLt and stepgraph's small-M kernel
// (kernels/gemv.cuh) for float weights, picked per shape by the MatmulRunner below; for
// weights in GGUF block formats the block-format kernel (kernels/quant_matmul.cuh) at few
// rows, its tensor-core kernel (kernels/block_mma.cuh) from CudaOptions::block_mma_min_rows
// rows and, from CudaOptions::block_gemm_min_rows rows on, the block GEMM: w dequantized
// in chunks of rows into the runner's block workspace (kernels/dequant.cuh), one cuBLASLt
// GEMM per chunk.
// Preparing a node picks its path once; for cuBLASLt the runner makes the descriptors,
// layouts and algorithm (shared by nodes of one shape); Run only launches.
#ifndef STEPGRAPH_DISPATCH_CUDA_MATMUL_H_
#define STEPGRAPH_DISPATCH_CUDA_MATMUL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "dispatch/cuda/cuda_handles.h"
#include "kernels/block_mma.cuh"
#include "kernels/launch.h"
#include "kernels/quant_matmul.cuh"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/dispatch/cuda_options.h"
#include "stepgraph/graph/memory_plan.h"

namespace sg::internal {

enum class MatmulPath : uint8_t {
  kCublasLt,
  kGemv,
  kBlockFormat,
  kBlockGemm,
  kBlockMma,
  kBlockFused,  // one row of x, block weights wide enough to fill the GPU: the fused kernel
  kBlockRow,    // one row of x, block weights at least block_row_min_cols wide
};

// What a plan is made for: everything cuBLASLt's choice of algorithm depends on.
struct MatmulShape {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  DType dtype = DType::kF32;
  bool bias = false;
  // The block GEMM's chunks (always cuBLASLt): y's leading dimension when it is wider than
  // n (0: n), w's and x's dtype when not `dtype` (bf16 operands with an f32 y), and TF32
  // tensor cores for f32 operands.
  int64_t ld_y = 0;
  std::optional<DType> operands;
  bool tf32 = false;
  // A plan whose alpha and beta are read from device memory (Launch's device_alpha): the
  // f16 chunks' x scaled down by a power of two, alpha scaling y back.
  bool device_alpha = false;

  friend bool operator==(const MatmulShape& a, const MatmulShape& b) {
    return a.m == b.m && a.n == b.n && a.k == b.k && a.dtype == b.dtype && a.bias == b.bias &&
           a.ld_y == b.ld_y && a.operands == b.operands && a.tf32 == b.tf32 &&
           a.device_alpha == b.device_alpha;
  }
  template <typename H>
  friend H AbslHashValue(H h, const MatmulShape& s) {
    return H::combine(std::move(h), s.m, s.n, s.k, s.dtype, s.bias, s.ld_y, s.operands, s.tf32,
                      s.device_alpha);
  }
};

// How a MatMul node with x [m, k] in `x_dtype` and a block-format w [n, k] runs the block
// GEMM: the dtype w is dequantized into (and x multiplied in), the rows of w per chunk,
// and where in the block workspace x (when it must be rounded first) and the chunk live.
struct BlockGemmLayout {
  DType operand = DType::kF32;
  bool tf32 = false;
  bool round_x = false;       // x is f32 and the GEMM reads it as `operand` from the workspace
  int64_t x_offset = 0;       // bytes from the workspace's start to the rounded x
  int64_t chunk_rows = 0;     // rows of w per GEMM (the last chunk may hold fewer)
  int64_t chunk_offset = 0;   // bytes from the workspace's start to the dequantized chunk
  int64_t bytes = 0;          // workspace bytes the node needs

  // x rounded to f16 is scaled by a power of two as it is rounded
  // (kernels::LaunchRoundFloatsF16Scaled), its scratch (alpha and beta among it) at the
  // workspace's start.
  bool scale_x() const { return round_x && operand == DType::kF16; }
};

// The layout for these sizes under `options` on a device with `l2_bytes` of L2; no
// device is touched. InvalidArgument when a size product overflows.
absl::StatusOr<BlockGemmLayout> BlockGemmLayoutFor(int64_t m, int64_t n, int64_t k,
                                                   DType x_dtype, const CudaOptions& options,
                                                   int64_t l2_bytes);

// Whether a MatMul node's prepared state (its PreparedPlan::node) runs the block GEMM on
// the x its predecessor rounded into the workspace, rounding none itself (for tests).
bool BlockGemmReusesX(const PreparedNode* state);

// The parts the tensor-core block kernel splits x [m, k] of `x_dtype` into under `options`
// (kernels::BlockMmaTerms; block_gemm_precision auto chooses by m).
int BlockMmaTermsFor(DType x_dtype, int64_t m, const CudaOptions& options);

// How the one-row block kernel takes x for weights in `w_dtype` under `options`
// (block_gemv_precision; kAuto by format).
kernels::QuantRowX RowXFor(const CudaOptions& options, DType w_dtype);

// The tensor-core block kernel's shape under `options` (kernels::BlockMmaShape).
kernels::BlockMmaShape BlockMmaShapeFor(const CudaOptions& options);

// Bytes of the block workspace a FusedMatMul node takes on the tensor-core path (its
// products, fused.cc); 0 for any other node or path. InvalidArgument when they overflow.
absl::StatusOr<int64_t> FusedMmaWorkspaceBytes(const Graph& graph, const Node& node,
                                               const CudaOptions& options,
                                               const CudaDeviceInfo& info);

// Bytes of the block workspace a MoeMatMul node takes on the tensor-core path (moe.cc:
// CudaOptions::moe_block_mma); 0 for any other node or path. InvalidArgument when they
// overflow.
absl::StatusOr<int64_t> MoeMmaWorkspaceBytes(const Graph& graph, const Node& node,
                                             const CudaOptions& options,
                                             const CudaDeviceInfo& info);

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
    return shape.m > 0 && shape.n > 0 && shape.k > 0 && IsFloat(shape.dtype) &&
           (!shape.operands.has_value() || IsFloat(*shape.operands)) &&
           (shape.ld_y == 0 || shape.ld_y >= shape.n);
  }
  // A plan for `shape` (float weights of x's dtype) unless there is one; the plan stays
  // valid while the runner lives.
  absl::StatusOr<const Plan*> Prepare(const MatmulShape& shape);

  // One launch of `plan` (made by Prepare for `shape`) on `stream`; for a plan made with
  // shape.device_alpha, alpha and beta are the two floats at `device_alpha` (device memory,
  // read when the launch runs).
  absl::Status Launch(const Plan& plan, const MatmulShape& shape, const void* x, const void* w,
                      const void* bias, void* y, const kernels::Stream& stream,
                      const float* device_alpha = nullptr) const;

  // The path (kCublasLt or kGemv) Prepare chose for `shape`; NotFound if it was not
  // prepared.
  absl::StatusOr<MatmulPath> PathFor(const MatmulShape& shape) const;
  MatmulPolicy policy() const { return policy_; }

  // Grows the block workspace to the largest need of the plan's block GEMM nodes under
  // `options` (Prepare, never Run). Outgrown buffers stay alive for plans prepared earlier.
  absl::Status ReserveBlockGemm(const ExecutionPlan& plan, const CudaOptions& options);
  // The block workspace for a node that needs `bytes` (ReserveBlockGemm first).
  absl::StatusOr<void*> BlockWorkspace(int64_t bytes, absl::string_view node) const {
    return block_workspace_.For(bytes, "MatMul", node);
  }
  const CudaDeviceInfo& info() const { return info_; }

 private:
  MatmulRunner(const CudaDeviceInfo& info, MatmulPolicy policy);
  absl::StatusOr<std::unique_ptr<Plan>> MakeCublasLtPlan(const MatmulShape& shape) const;

  CudaDeviceInfo info_;
  MatmulPolicy policy_;
  UniqueCublasLt handle_;
  DeviceMemory workspace_;
  int64_t workspace_bytes_ = 0;
  absl::flat_hash_map<MatmulShape, std::unique_ptr<Plan>> plans_;
  GrowingWorkspace block_workspace_;
};

}  // namespace sg::internal

#endif  // STEPGRAPH_DISPATCH_CUDA_MATMUL_H_
