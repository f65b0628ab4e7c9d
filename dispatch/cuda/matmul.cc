// The MatMul unit of CudaDispatch: its Prepare, its Run, and the MatmulRunner behind the
// float paths (dispatch/cuda/matmul.h). Prepare decides a node's path once (block-format
// weights, else cuBLASLt or the small-M kernel by the runner's policy and the shape) and
// keeps it with the launch's sizes in the node's MatmulState; Run reads it and launches.
//
// cuBLASLt is column-major; stepgraph's tensors are row-major. Read column-major, the
// row-major y[M,N] is yᵀ (N×M, ld N), x[M,K] is xᵀ (K×M, ld K) and w[N,K] is wᵀ (K×N,
// ld K). So y = x·wᵀ is computed as yᵀ = op(A)·B with A = w laid out K×N and op(A) = Aᵀ,
// B = x laid out K×M, D = C = y laid out N×M; the bias epilogue adds bias[N] along D's
// rows, which are y's columns. Compute is CUBLAS_COMPUTE_32F with f32 scale for every
// dtype: for f32 that rules out TF32, for bf16/f16 it accumulates in f32.
#include "dispatch/cuda/matmul.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_status.h"
#include "dispatch/cuda/op_units.h"
#include "kernels/gemv.cuh"
#include "kernels/quant_matmul.cuh"
#include "stepgraph/base/status.h"

namespace sg {
namespace internal {
namespace {

// Where the automatic policy takes the small-M kernel. At decode a matmul only streams its
// weight; the kernel does so with 16-byte loads over the whole GPU, where cuBLASLt's tiles
// are sized for larger M. kernel_bench on an H100 (bf16, Llama-3.2-1B projections, µs):
// at M = 1 and 2 the kernel wins every projection (q/o 4.7 against 6.4, lm head 169 against
// 187); from M = 4 cuBLASLt wins the wide ones (gate/up at M = 8: 14.7 against 22.3), while
// the kernel keeps narrow outputs (k/v, N = 512: 3.7 against 5.7 at M = 8).
constexpr int64_t kAutoGemvAlwaysRows = 2;
constexpr int64_t kAutoGemvNarrowN = 1024;

bool AutoTakesGemv(const MatmulShape& s) {
  if (s.m > kernels::kGemvMaxRows) return false;
  return s.m <= kAutoGemvAlwaysRows || s.n <= kAutoGemvNarrowN;
}

// cuBLASLt's default alignment assumption for A, B, C and D.
constexpr uintptr_t kCublasLtAlignment = 256;

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

std::string Describe(const MatmulShape& s) {
  return absl::StrCat("M=", s.m, " N=", s.n, " K=", s.k, " ", DTypeName(s.dtype),
                      s.bias ? " with bias" : "");
}

template <typename T>
absl::Status SetDesc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                     const T& value, const char* what) {
  return ToStatus(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)), what);
}

template <typename T>
absl::Status SetPreference(cublasLtMatmulPreference_t pref,
                           cublasLtMatmulPreferenceAttributes_t attr, const T& value,
                           const char* what) {
  return ToStatus(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)), what);
}

}  // namespace


// Everything one shape needs at Run. For cuBLASLt two algorithms: one that may assume
// cuBLASLt's default 256-byte alignment of every buffer (the arena and cudaMalloc give
// that), and one that assumes only element alignment, for buffers bound at odd offsets.
struct MatmulRunner::Plan {
  MatmulPath path = MatmulPath::kGemv;
  UniqueMatmulDesc desc;
  UniqueMatrixLayout a, b, c;
  cublasLtMatmulAlgo_t aligned_algo{};
  cublasLtMatmulAlgo_t any_algo{};
  bool has_aligned_algo = false;
  bool has_any_algo = false;
};

MatmulRunner::MatmulRunner(const CudaDeviceInfo& info, MatmulPolicy policy)
    : info_(info), policy_(policy) {}

MatmulRunner::~MatmulRunner() = default;

absl::StatusOr<std::unique_ptr<MatmulRunner>> MatmulRunner::Create(const CudaDeviceInfo& info,
                                                                   int64_t workspace_bytes,
                                                                   MatmulPolicy policy) {
  if (workspace_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("matmul workspace must be >= 0 bytes, got ", workspace_bytes));
  }
  auto runner = std::unique_ptr<MatmulRunner>(new MatmulRunner(info, policy));
  cublasLtHandle_t handle = nullptr;
  SG_RETURN_IF_ERROR(ToStatus(cublasLtCreate(&handle), "cublasLtCreate"));
  runner->handle_.reset(handle);
  if (workspace_bytes > 0) {
    SG_ASSIGN_OR_RETURN(runner->workspace_,
                        AllocateDevice(workspace_bytes, "the cuBLASLt workspace"));
    runner->workspace_bytes_ = workspace_bytes;
  }
  return runner;
}

absl::StatusOr<const MatmulRunner::Plan*> MatmulRunner::Prepare(const MatmulShape& shape) {
  if (auto it = plans_.find(shape); it != plans_.end()) return it->second.get();
  if (!Takes(shape)) {
    return absl::InvalidArgumentError(absl::StrCat("no matmul for ", Describe(shape)));
  }
  const bool small = shape.m <= kernels::kGemvMaxRows;
  const bool gemv = (policy_ == MatmulPolicy::kGemv && small) ||
                    (policy_ == MatmulPolicy::kAuto && AutoTakesGemv(shape));
  std::unique_ptr<Plan> plan;
  if (gemv) {
    plan = std::make_unique<Plan>();
    plan->path = MatmulPath::kGemv;
  } else {
    SG_ASSIGN_OR_RETURN(plan, MakeCublasLtPlan(shape));
  }
  return plans_.emplace(shape, std::move(plan)).first->second.get();
}

absl::StatusOr<std::unique_ptr<MatmulRunner::Plan>> MatmulRunner::MakeCublasLtPlan(
    const MatmulShape& s) const {
  auto plan = std::make_unique<Plan>();
  plan->path = MatmulPath::kCublasLt;
  const cudaDataType_t type = CudaType(s.dtype);

  cublasLtMatmulDesc_t desc = nullptr;
  SG_RETURN_IF_ERROR(ToStatus(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                              "cublasLtMatmulDescCreate"));
  plan->desc.reset(desc);
  SG_RETURN_IF_ERROR(SetDesc(desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T,
                             "cublasLtMatmulDescSetAttribute(TRANSA)"));
  SG_RETURN_IF_ERROR(SetDesc(desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N,
                             "cublasLtMatmulDescSetAttribute(TRANSB)"));
  if (s.bias) {
    SG_RETURN_IF_ERROR(SetDesc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS,
                               "cublasLtMatmulDescSetAttribute(EPILOGUE)"));
    SG_RETURN_IF_ERROR(SetDesc(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, type,
                               "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)"));
  }

  auto layout = [&](uint64_t rows, uint64_t cols, int64_t ld,
                    UniqueMatrixLayout& out) -> absl::Status {
    cublasLtMatrixLayout_t l = nullptr;
    SG_RETURN_IF_ERROR(
        ToStatus(cublasLtMatrixLayoutCreate(&l, type, rows, cols, ld), "cublasLtMatrixLayoutCreate"));
    out.reset(l);
    return absl::OkStatus();
  };
  SG_RETURN_IF_ERROR(layout(s.k, s.n, s.k, plan->a));  // w
  SG_RETURN_IF_ERROR(layout(s.k, s.m, s.k, plan->b));  // x
  SG_RETURN_IF_ERROR(layout(s.n, s.m, s.n, plan->c));  // y

  // One heuristic query per alignment assumption; element alignment may find nothing.
  auto choose = [&](uint32_t alignment, cublasLtMatmulAlgo_t& algo) -> absl::StatusOr<bool> {
    cublasLtMatmulPreference_t pref = nullptr;
    SG_RETURN_IF_ERROR(
        ToStatus(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate"));
    UniqueMatmulPreference owned(pref);
    const uint64_t workspace = static_cast<uint64_t>(workspace_bytes_);
    SG_RETURN_IF_ERROR(SetPreference(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace,
                                     "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE)"));
    if (alignment != 0) {
      for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
        SG_RETURN_IF_ERROR(SetPreference(pref, attr, alignment,
                                         "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)"));
      }
    }
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        handle_.get(), desc, plan->a.get(), plan->b.get(), plan->c.get(), plan->c.get(), pref,
        1, &result, &count);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && count == 0)) {
      return false;
    }
    SG_RETURN_IF_ERROR(ToStatus(status, "cublasLtMatmulAlgoGetHeuristic"));
    algo = result.algo;
    return true;
  };
  SG_ASSIGN_OR_RETURN(plan->has_aligned_algo, choose(0, plan->aligned_algo));
  SG_ASSIGN_OR_RETURN(plan->has_any_algo,
                      choose(static_cast<uint32_t>(DTypeBytes(s.dtype)), plan->any_algo));
  if (!plan->has_aligned_algo && !plan->has_any_algo) {
    return absl::UnimplementedError(
        absl::StrCat("cuBLASLt has no algorithm for ", Describe(s)));
  }
  return plan;
}

absl::StatusOr<MatmulPath> MatmulRunner::PathFor(const MatmulShape& shape) const {
  auto it = plans_.find(shape);
  if (it == plans_.end()) {
    return absl::NotFoundError(absl::StrCat("no matmul plan for ", Describe(shape)));
  }
  return it->second->path;
}

absl::Status MatmulRunner::Launch(const Plan& plan, const MatmulShape& shape, const void* x,
                                  const void* w, const void* bias, void* y,
                                  const kernels::Stream& stream) const {
  if (plan.path == MatmulPath::kGemv) {
    return ToStatus(kernels::LaunchGemv(x, w, bias, y, shape.m, shape.n, shape.k, shape.dtype,
                                        stream),
                    "LaunchGemv");
  }
  const uintptr_t addresses = reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w) |
                              reinterpret_cast<uintptr_t>(y) | reinterpret_cast<uintptr_t>(bias);
  const bool aligned = addresses % kCublasLtAlignment == 0;
  const cublasLtMatmulAlgo_t* algo = nullptr;
  if (aligned && plan.has_aligned_algo) {
    algo = &plan.aligned_algo;
  } else if (plan.has_any_algo) {
    algo = &plan.any_algo;
  }
  if (ABSL_PREDICT_FALSE(algo == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuBLASLt has no algorithm for ", Describe(shape), " with buffers not aligned to ",
        kCublasLtAlignment, " bytes"));  // cold: formats only on failure
  }
  if (bias != nullptr) {
    // The bias is bound per node; setting a descriptor attribute is host work only.
    SG_RETURN_IF_ERROR(SetDesc(plan.desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias,
                               "cublasLtMatmulDescSetAttribute(BIAS_POINTER)"));
  }
  const float alpha = 1.0f, beta = 0.0f;
  return ToStatus(cublasLtMatmul(handle_.get(), plan.desc.get(), &alpha, w, plan.a.get(), x,
                                 plan.b.get(), &beta, y, plan.c.get(), y, plan.c.get(), algo,
                                 workspace_.get(), static_cast<size_t>(workspace_bytes_),
                                 stream.stream),
                  "cublasLtMatmul");
}

// ---- The MatMul unit --------------------------------------------------------------------

namespace {

// A MatMul node's launch, its path decided once at Prepare.
struct MatmulState final : PreparedState<MatmulState> {
  MatmulPath path = MatmulPath::kGemv;
  MatmulShape shape;                        // dtype: x's and y's
  const MatmulRunner::Plan* plan = nullptr;  // the float paths; owned by the runner
  DType w_dtype = DType::kF32;              // kBlockFormat: the weight's block format
};

// Whether the block-format kernel takes x [m, k] with a w [n, k] in block format w_dtype:
// whole blocks per row, N within 32 bits and the rows in at most 65535 groups.
bool BlockFormatTakes(int64_t m, int64_t n, int64_t k, DType x_dtype, DType w_dtype) {
  const int64_t groups =
      (m + kernels::kQuantMatmulGroupRows - 1) / kernels::kQuantMatmulGroupRows;
  return IsQuantized(w_dtype) && IsFloat(x_dtype) && m > 0 && n > 0 && n <= 0x7fffffff &&
         k > 0 && k % DTypeBlockElems(w_dtype) == 0 && groups <= 65535;
}

}  // namespace

// Block-format weights where their kernel takes the shape; float weights of x's dtype (no
// device is asked: cuBLASLt's algorithm is chosen at Prepare).
bool Supports(const ops::MatMul& op, const CudaSupportQuery& q) {
  const Tensor& x = q.input(0);
  const Tensor& w = q.input(1);
  if (IsQuantized(w.dtype)) {
    return BlockFormatTakes(x.shape[0], w.shape[0], x.shape[1], x.dtype, w.dtype);
  }
  return w.dtype == x.dtype &&
         MatmulRunner::Takes({x.shape[0], w.shape[0], x.shape[1], x.dtype, op.has_bias});
}

PreparedOr Prepare(const ops::MatMul& op, const CudaPrepareContext& c) {
  const Tensor& x = c.input(0);
  const Tensor& w = c.input(1);
  auto state = std::make_unique<MatmulState>();
  state->shape = MatmulShape{x.shape[0], w.shape[0], x.shape[1], x.dtype, op.has_bias};
  state->w_dtype = w.dtype;
  if (IsQuantized(w.dtype)) {
    if (w.shape[1] != x.shape[1] ||
        !BlockFormatTakes(x.shape[0], w.shape[0], x.shape[1], x.dtype, w.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no CUDA matmul for x ", x.shape.ToString(), " ", DTypeName(x.dtype), " with w ",
          w.shape.ToString(), " ", DTypeName(w.dtype), " (a block-format w needs K a multiple of ",
          DTypeBlockElems(w.dtype), ", N <= 2^31-1 and M <= ",
          65535 * kernels::kQuantMatmulGroupRows, ")"));
    }
    state->path = MatmulPath::kBlockFormat;
    return Keep(std::move(state));
  }
  if (w.dtype != x.dtype) {
    return absl::UnimplementedError(
        absl::StrCat("no CUDA matmul for ", DTypeName(w.dtype), " weights yet"));
  }
  SG_ASSIGN_OR_RETURN(state->plan, c.matmul.Prepare(state->shape));
  state->path = state->plan->path;
  return Keep(std::move(state));
}

}  // namespace internal

absl::Status CudaDispatch::Run(const ops::MatMul& op, const NodeArgs& args) {
  SG_ASSIGN_OR_RETURN(const internal::MatmulState* s, args.PreparedAs<internal::MatmulState>());
  const void* x = args.inputs[0].data;
  const void* w = args.inputs[1].data;
  const void* bias = op.has_bias ? args.inputs[2].data : nullptr;
  void* y = args.output.data;
  const internal::MatmulShape& shape = s->shape;
  if (s->path == internal::MatmulPath::kBlockFormat) {
    return ToStatus(kernels::LaunchQuantMatmul(x, w, s->w_dtype, bias, y, shape.m, shape.n,
                                               shape.k, shape.dtype, launch()),
                    "LaunchQuantMatmul");
  }
  return matmul_->Launch(*s->plan, shape, x, w, bias, y, launch());
}

}  // namespace sg
