// The MatMul unit of CudaDispatch: its Prepare, its Run, and the MatmulRunner behind the
// float paths (dispatch/cuda/matmul.h). Prepare decides a node's path once (block-format
// weights: their CUDA-core kernel below CudaOptions::block_mma_min_rows rows, the
// tensor-core block kernel (kernels/block_mma.cuh) from there, the block GEMM from
// CudaOptions::block_gemm_min_rows rows on; float weights: cuBLASLt or the small-M kernel
// by the runner's policy and the shape) and keeps it with the launch's sizes in the
// node's MatmulState; Run reads it and launches.
//
// The block GEMM (docs/cuda_kernels.md, "Block weights on tensor cores"): w is dequantized
// a chunk of its rows at a time into the runner's block workspace, and each chunk is one
// cuBLASLt GEMM writing its columns of y (y's leading dimension stays N). The workspace is
// sized at Prepare for the plan's largest need, bounded by
// CudaOptions::block_gemm_workspace_bytes, so an lm head of 128256 rows never needs its
// whole dequantized copy; the chunks reuse it one after another on the stream.
//
// cuBLASLt is column-major; stepgraph's tensors are row-major. Read column-major, the
// row-major y[M,N] is yᵀ (N×M, ld N), x[M,K] is xᵀ (K×M, ld K) and w[N,K] is wᵀ (K×N,
// ld K). So y = x·wᵀ is computed as yᵀ = op(A)·B with A = w laid out K×N and op(A) = Aᵀ,
// B = x laid out K×M, D = C = y laid out N×M; the bias epilogue adds bias[N] along D's
// rows, which are y's columns. Compute is CUBLAS_COMPUTE_32F with f32 scale for every
// dtype: for f32 that rules out TF32 (unless the block GEMM is asked for it), for bf16/f16
// it accumulates in f32.
#include "dispatch/cuda/matmul.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <variant>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_status.h"
#include "dispatch/cuda/op_units.h"
#include "kernels/block_mma.cuh"
#include "kernels/dequant.cuh"
#include "kernels/fused_matmul.cuh"
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
                      s.bias ? " with bias" : "",
                      s.operands ? absl::StrCat(" from ", DTypeName(*s.operands)) : "",
                      s.tf32 ? " in TF32" : "", s.ld_y != 0 ? absl::StrCat(" ld_y=", s.ld_y) : "",
                      s.device_alpha ? " alpha on the device" : "");
}

// Block GEMM chunks hold a multiple of this many rows of w, so that each chunk's first
// column of y (and of the bias) keeps cuBLASLt's 256-byte alignment for 16-bit and f32 y.
constexpr int64_t kBlockGemmRowQuantum = 128;
// Up to this many rows of x a chunk's GEMM is bound by reading the dequantized chunk: the
// chunk is then sized to stay in L2 (a quarter of it) between its dequantization and its
// GEMM. Larger M is bound by the tensor cores and wants wide chunks (whole waves of tiles).
constexpr int64_t kBlockGemmL2MaxRows = 128;

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
  bool device_alpha = false;  // made for alpha and beta in device memory
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
  // The block GEMM's chunks (marked by their explicit ld_y) always run on cuBLASLt.
  const bool chunk = shape.ld_y != 0 || shape.operands.has_value() || shape.tf32;
  const bool gemv = !chunk && ((policy_ == MatmulPolicy::kGemv && small) ||
                               (policy_ == MatmulPolicy::kAuto && AutoTakesGemv(shape)));
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
  const DType operand_dtype = s.operands.value_or(s.dtype);
  const cudaDataType_t operand = CudaType(operand_dtype);

  cublasLtMatmulDesc_t desc = nullptr;
  SG_RETURN_IF_ERROR(ToStatus(
      cublasLtMatmulDescCreate(&desc, s.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                               CUDA_R_32F),
      "cublasLtMatmulDescCreate"));
  plan->desc.reset(desc);
  SG_RETURN_IF_ERROR(SetDesc(desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T,
                             "cublasLtMatmulDescSetAttribute(TRANSA)"));
  SG_RETURN_IF_ERROR(SetDesc(desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N,
                             "cublasLtMatmulDescSetAttribute(TRANSB)"));
  plan->device_alpha = s.device_alpha;
  if (s.device_alpha) {
    SG_RETURN_IF_ERROR(SetDesc(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE,
                               static_cast<int32_t>(CUBLASLT_POINTER_MODE_DEVICE),
                               "cublasLtMatmulDescSetAttribute(POINTER_MODE)"));
  }
  if (s.bias) {
    SG_RETURN_IF_ERROR(SetDesc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS,
                               "cublasLtMatmulDescSetAttribute(EPILOGUE)"));
    SG_RETURN_IF_ERROR(SetDesc(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, type,
                               "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)"));
  }

  auto layout = [&](cudaDataType_t t, uint64_t rows, uint64_t cols, int64_t ld,
                    UniqueMatrixLayout& out) -> absl::Status {
    cublasLtMatrixLayout_t l = nullptr;
    SG_RETURN_IF_ERROR(
        ToStatus(cublasLtMatrixLayoutCreate(&l, t, rows, cols, ld), "cublasLtMatrixLayoutCreate"));
    out.reset(l);
    return absl::OkStatus();
  };
  SG_RETURN_IF_ERROR(layout(operand, s.k, s.n, s.k, plan->a));  // w
  SG_RETURN_IF_ERROR(layout(operand, s.k, s.m, s.k, plan->b));  // x
  SG_RETURN_IF_ERROR(layout(type, s.n, s.m, s.ld_y != 0 ? s.ld_y : s.n, plan->c));  // y

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
                      choose(static_cast<uint32_t>(std::min(DTypeBytes(s.dtype),
                                                            DTypeBytes(operand_dtype))),
                             plan->any_algo));
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
                                  const kernels::Stream& stream,
                                  const float* device_alpha) const {
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
  const float host_alpha_beta[2] = {1.0f, 0.0f};
  const float* alpha_beta = host_alpha_beta;
  if (plan.device_alpha) {
    if (ABSL_PREDICT_FALSE(device_alpha == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the matmul ", Describe(shape), " reads alpha on the device but was given none"));
    }
    alpha_beta = device_alpha;
  }
  return ToStatus(cublasLtMatmul(handle_.get(), plan.desc.get(), alpha_beta, w, plan.a.get(), x,
                                 plan.b.get(), alpha_beta + 1, y, plan.c.get(), y, plan.c.get(),
                                 algo, workspace_.get(), static_cast<size_t>(workspace_bytes_),
                                 stream.stream),
                  "cublasLtMatmul");
}

absl::StatusOr<BlockGemmLayout> BlockGemmLayoutFor(int64_t m, int64_t n, int64_t k,
                                                   DType x_dtype, const CudaOptions& options,
                                                   int64_t l2_bytes) {
  BlockGemmLayout l;
  l.operand = x_dtype;
  if (x_dtype == DType::kF32) {
    l.tf32 = options.block_gemm_precision == BlockGemmPrecision::kTf32;
    // auto's block GEMM is f16's.
    if (options.block_gemm_precision == BlockGemmPrecision::kBf16 ||
        options.block_gemm_precision == BlockGemmPrecision::kF16 ||
        options.block_gemm_precision == BlockGemmPrecision::kAuto) {
      l.operand = options.block_gemm_precision == BlockGemmPrecision::kBf16 ? DType::kBF16
                                                                           : DType::kF16;
      l.round_x = true;
      // f16 holds f32's values only to 65,504: x is scaled into range on the device.
      if (l.scale_x()) l.x_offset = kernels::kRoundScaleBytes;
    }
  }
  const auto overflow = [&] {
    return absl::InvalidArgumentError(absl::StrCat("block GEMM workspace for M=", m, " N=", n,
                                                   " K=", k, " overflows"));
  };
  int64_t row_bytes = 0, x_bytes = 0, chunk_bytes = 0;
  if (!CheckedMul(k, DTypeBytes(l.operand), &row_bytes) || row_bytes <= 0) return overflow();
  if (l.round_x) {
    if (!CheckedMul(m, row_bytes, &x_bytes) || !CheckedAdd(x_bytes, 255, &x_bytes)) {
      return overflow();
    }
    x_bytes = x_bytes / 256 * 256;  // the chunk after it keeps 256-byte alignment
  }
  int64_t budget = std::max<int64_t>(options.block_gemm_workspace_bytes, 0);
  if (m <= kBlockGemmL2MaxRows && l2_bytes > 0) budget = std::min(budget, l2_bytes / 4);
  const int64_t rows = std::max(budget / row_bytes / kBlockGemmRowQuantum * kBlockGemmRowQuantum,
                                kBlockGemmRowQuantum);
  l.chunk_rows = std::min(rows, n);
  l.chunk_offset = l.x_offset + x_bytes;
  if (!CheckedMul(l.chunk_rows, row_bytes, &chunk_bytes) ||
      !CheckedAdd(l.chunk_offset, chunk_bytes, &l.bytes)) {
    return overflow();
  }
  return l;
}

// ---- The MatMul unit --------------------------------------------------------------------

namespace {

// A MatMul node's launch, its path decided once at Prepare.
struct MatmulState final : PreparedState<MatmulState> {
  MatmulPath path = MatmulPath::kGemv;
  MatmulShape shape;                        // dtype: x's and y's
  const MatmulRunner::Plan* plan = nullptr;  // the float paths, the block GEMM's full chunks
  DType w_dtype = DType::kF32;              // block formats: the weight's format
  // kBlockGemm: the chunking, the plan of the last chunk when it holds fewer rows, the
  // workspace (a chunk of rows of w is named by its first row: the device layout's planes
  // span the whole weight).
  BlockGemmLayout block;
  const MatmulRunner::Plan* tail_plan = nullptr;
  void* workspace = nullptr;
  int32_t x_tensor = -1;           // x's index in the graph
  bool x_rounded_before = false;   // the node before rounded this x into the workspace
  // kBlockMma: the parts x is split into and the workspace's layout (partial sums when
  // split, then the kernel's scratch).
  int mma_terms = 3;
  kernels::BlockMmaShape mma_shape = kernels::BlockMmaShape::kAuto;
  kernels::BlockMmaWorkspace mma;
  // kBlockFused: the launch but its pointers.
  kernels::FusedMatmulArgs fused;
  // kBlockRow: whether w is a graph Weight (no kernel of the step writes it), and how x
  // meets it.
  bool w_constant = false;
  kernels::QuantRowX row_x = kernels::QuantRowX::kF32;
};

// Whether the block-format kernel takes x [m, k] with a w [n, k] in block format w_dtype:
// whole blocks per row, N within 32 bits and the rows in at most 65535 groups.
bool BlockFormatTakes(int64_t m, int64_t n, int64_t k, DType x_dtype, DType w_dtype) {
  const int64_t groups =
      (m + kernels::kQuantMatmulGroupRows - 1) / kernels::kQuantMatmulGroupRows;
  return IsQuantized(w_dtype) && IsFloat(x_dtype) && m > 0 && n > 0 && n <= 0x7fffffff &&
         k > 0 && k % DTypeBlockElems(w_dtype) == 0 && groups <= 65535;
}

// Whether the block GEMM runs x [m, k] with a block-format w [n, k] under `options`.
bool BlockGemmTakes(int64_t m, int64_t n, int64_t k, DType x_dtype, DType w_dtype,
                    const CudaOptions& options) {
  const int64_t min_rows = BlockGemmMinRows(options, x_dtype);
  return min_rows > 0 && m >= min_rows && IsQuantized(w_dtype) && IsFloat(x_dtype) && n > 0 && n <= 0x7fffffff && k > 0 &&
         k % DTypeBlockElems(w_dtype) == 0;
}

// Whether the tensor-core block kernel runs x [m, k] with a w [n, k] in block format
// w_dtype (fewer rows than the block GEMM takes): kernels/block_mma.cuh.
bool BlockMmaTakes(int64_t m, int64_t n, int64_t k, DType x_dtype, DType w_dtype,
                   const CudaOptions& options, int compute_capability) {
  return options.block_mma_min_rows > 0 && m >= options.block_mma_min_rows &&
         kernels::BlockMmaRuns(compute_capability) &&
         BlockFormatTakes(m, n, k, x_dtype, w_dtype);
}

// The tensor-core kernel's workspace for y [m, n] = x [m, k]·wᵀ: the partial sums when
// split, then the scratch for x.
absl::StatusOr<kernels::BlockMmaWorkspace> BlockMmaWorkspaceOf(int64_t m, int64_t n, int64_t k,
                                                               DType w_dtype, int terms,
                                                               int sm_count,
                                                               kernels::BlockMmaShape shape) {
  kernels::BlockMmaWorkspace ws;
  if (!kernels::BlockMmaWorkspaceFor(m, k, &n, 1, w_dtype, terms, sm_count, false, &ws,
                                     shape)) {
    return absl::InvalidArgumentError(
        absl::StrCat("block MMA workspace for M=", m, " N=", n, " K=", k, " overflows"));
  }
  return ws;
}

// The fused kernel's launch of a MatMul of one row of x [1, k] with a block-format w [n, k]
// (a shape BlockFormatTakes) and no bias, when the fused kernel takes it unsplit (n wide
// enough that its column blocks fill the GPU: an lm head) and w's format is one it runs
// faster there than the block-format kernel: the K formats, whose block heads the fused
// kernel decodes once per unit where the block-format kernel's rows of threads each decode
// them (H200, the 1B lm head at one row: Q6_K 107 against 130 us, Q4_K 119 against 168).
// Nothing otherwise.
std::optional<kernels::FusedMatmulArgs> FusedRowLaunch(int64_t m, int64_t n, int64_t k,
                                                       DType x_dtype, DType w_dtype, bool bias,
                                                       bool w_constant, int sm_count) {
  const bool k_format =
      w_dtype == DType::kQ4_K || w_dtype == DType::kQ5_K || w_dtype == DType::kQ6_K;
  if (m != 1 || bias || !k_format) return std::nullopt;
  kernels::FusedMatmulArgs a;
  a.m = 1;
  a.k = k;
  a.weights = 1;
  a.n[0] = n;
  a.w_dtype[0] = w_dtype;
  a.dtype = x_dtype;
  a.weights_constant = w_constant;
  a.splits = kernels::FusedSplitsFor(a, sm_count);
  if (a.splits != 1) return std::nullopt;
  return a;
}

// Whether `node` is a MatMul that runs the tensor-core block kernel.
bool IsBlockMmaNode(const Graph& graph, const Node& node, const CudaOptions& options,
                    int compute_capability) {
  if (!std::holds_alternative<ops::MatMul>(node.op)) return false;
  const Tensor& x = graph.tensor(node.inputs[0]);
  const Tensor& w = graph.tensor(node.inputs[1]);
  return x.shape.rank() == 2 && w.shape.rank() == 2 && w.shape[1] == x.shape[1] &&
         !BlockGemmTakes(x.shape[0], w.shape[0], x.shape[1], x.dtype, w.dtype, options) &&
         BlockMmaTakes(x.shape[0], w.shape[0], x.shape[1], x.dtype, w.dtype, options,
                       compute_capability);
}

// x, w and whether the node's w is in a block format the block GEMM takes.
bool IsBlockGemmNode(const Graph& graph, const Node& node, const CudaOptions& options) {
  if (!std::holds_alternative<ops::MatMul>(node.op)) return false;
  const Tensor& x = graph.tensor(node.inputs[0]);
  const Tensor& w = graph.tensor(node.inputs[1]);
  return x.shape.rank() == 2 && w.shape.rank() == 2 && w.shape[1] == x.shape[1] &&
         BlockGemmTakes(x.shape[0], w.shape[0], x.shape[1], x.dtype, w.dtype, options);
}

}  // namespace

kernels::BlockMmaShape BlockMmaShapeFor(const CudaOptions& options) {
  static_assert(static_cast<int>(BlockMmaShapeOption::kStaged) ==
                static_cast<int>(kernels::BlockMmaShape::kStaged));
  return static_cast<kernels::BlockMmaShape>(options.block_mma_shape);
}

int BlockMmaTermsFor(DType x_dtype, int64_t m, const CudaOptions& options) {
  switch (options.block_gemm_precision) {
    case BlockGemmPrecision::kAuto:
      return kernels::BlockMmaTerms(
          x_dtype, m >= kBlockGemmAutoF16Rows ? kernels::kBlockMmaF16x1 : 3);
    case BlockGemmPrecision::kBf16:
      return kernels::BlockMmaTerms(x_dtype, 1);
    case BlockGemmPrecision::kBf16x2:
      return kernels::BlockMmaTerms(x_dtype, 2);
    case BlockGemmPrecision::kF16x2:
      return kernels::BlockMmaTerms(x_dtype, kernels::kBlockMmaF16x2);
    case BlockGemmPrecision::kF16:  // below the GEMM's rows
      return kernels::BlockMmaTerms(x_dtype, kernels::kBlockMmaF16x1);
    case BlockGemmPrecision::kInt8:
      return kernels::BlockMmaTerms(x_dtype, kernels::kBlockMmaInt8);
    default:
      return kernels::BlockMmaTerms(x_dtype, 3);
  }
}

kernels::QuantRowX RowXFor(const CudaOptions& options, DType w_dtype) {
  switch (options.block_gemv_precision) {
    case BlockGemvPrecision::kAuto:
      return w_dtype == DType::kQ8_0 ? kernels::QuantRowX::kF32 : kernels::QuantRowX::kInt16x2;
    case BlockGemvPrecision::kInt16:
      return kernels::QuantRowX::kInt16;
    case BlockGemvPrecision::kInt8:
      return kernels::QuantRowX::kInt8;
    case BlockGemvPrecision::kInt16x2:
      return kernels::QuantRowX::kInt16x2;
    case BlockGemvPrecision::kF32:
      break;
  }
  return kernels::QuantRowX::kF32;
}

absl::Status MatmulRunner::ReserveBlockGemm(const ExecutionPlan& plan, const CudaOptions& options) {
  const Graph& graph = plan.graph();
  int64_t need = 0;
  for (const Node& node : graph.nodes()) {
    SG_ASSIGN_OR_RETURN(const int64_t fused, FusedMmaWorkspaceBytes(graph, node, options, info_));
    need = std::max(need, fused);
    SG_ASSIGN_OR_RETURN(const int64_t moe, MoeMmaWorkspaceBytes(graph, node, options, info_));
    need = std::max(need, moe);
    if (IsBlockMmaNode(graph, node, options, info_.compute_capability)) {
      const Tensor& x = graph.tensor(node.inputs[0]);
      const Tensor& w = graph.tensor(node.inputs[1]);
      SG_ASSIGN_OR_RETURN(const kernels::BlockMmaWorkspace ws,
                          BlockMmaWorkspaceOf(x.shape[0], w.shape[0], x.shape[1], w.dtype,
                                              BlockMmaTermsFor(x.dtype, x.shape[0], options),
                                              info_.sm_count, BlockMmaShapeFor(options)));
      need = std::max(need, ws.bytes);
    }
    if (!IsBlockGemmNode(graph, node, options)) continue;
    const Tensor& x = graph.tensor(node.inputs[0]);
    SG_ASSIGN_OR_RETURN(const BlockGemmLayout l,
                        BlockGemmLayoutFor(x.shape[0], graph.tensor(node.inputs[1]).shape[0],
                                           x.shape[1], x.dtype, options, info_.l2_bytes));
    need = std::max(need, l.bytes);
  }
  return block_workspace_.Reserve(need, "the block GEMM workspace");
}

// Block-format weights where their kernel or the block GEMM takes the shape; float weights
// of x's dtype (no device is asked: cuBLASLt's algorithm is chosen at Prepare).
bool Supports(const ops::MatMul& op, const CudaSupportQuery& q) {
  const Tensor& x = q.input(0);
  const Tensor& w = q.input(1);
  if (IsQuantized(w.dtype)) {
    return BlockGemmTakes(x.shape[0], w.shape[0], x.shape[1], x.dtype, w.dtype, q.options) ||
           BlockFormatTakes(x.shape[0], w.shape[0], x.shape[1], x.dtype, w.dtype);
  }
  return w.dtype == x.dtype &&
         MatmulRunner::Takes({x.shape[0], w.shape[0], x.shape[1], x.dtype, op.has_bias});
}

namespace {

// Whether the node before (its state `previous`) is a block GEMM that rounded the same x
// into the same place of the workspace as `state` would: q, k and v (and gate and up)
// read one x, and the executor runs a plan's nodes in order on one stream with nothing
// between two neighbours, so the rounded x (and its alpha) is still there and need not be
// made again. Only the chunk region after it is rewritten by the dequantization.
bool RoundedBefore(const PreparedNode* previous, const MatmulState& state) {
  if (!state.block.round_x || previous == nullptr ||
      previous->tag() != PreparedState<MatmulState>::Tag()) {
    return false;
  }
  const auto& p = static_cast<const MatmulState&>(*previous);
  return p.path == MatmulPath::kBlockGemm && p.x_tensor == state.x_tensor &&
         p.workspace == state.workspace && p.block.round_x &&
         p.block.operand == state.block.operand && p.block.x_offset == state.block.x_offset &&
         p.shape.m == state.shape.m && p.shape.k == state.shape.k &&
         p.shape.dtype == state.shape.dtype;
}

}  // namespace

bool BlockGemmReusesX(const PreparedNode* state) {
  if (state == nullptr || state->tag() != PreparedState<MatmulState>::Tag()) return false;
  const auto& s = static_cast<const MatmulState&>(*state);
  return s.path == MatmulPath::kBlockGemm && s.x_rounded_before;
}

namespace {

// The block GEMM's state: the chunking, the workspace and a cuBLASLt plan per chunk width.
absl::Status PrepareBlockGemm(const CudaPrepareContext& c, MatmulState& state) {
  const MatmulShape& s = state.shape;
  SG_ASSIGN_OR_RETURN(state.block, BlockGemmLayoutFor(s.m, s.n, s.k, s.dtype, c.options,
                                                      c.info.l2_bytes));
  SG_ASSIGN_OR_RETURN(state.workspace, c.matmul.BlockWorkspace(state.block.bytes, c.node.name));
  MatmulShape chunk = s;
  chunk.n = state.block.chunk_rows;
  chunk.ld_y = s.n;
  chunk.tf32 = state.block.tf32;
  if (state.block.operand != s.dtype) chunk.operands = state.block.operand;
  chunk.device_alpha = state.block.scale_x();
  SG_ASSIGN_OR_RETURN(state.plan, c.matmul.Prepare(chunk));
  if (const int64_t tail = s.n % state.block.chunk_rows; tail != 0) {
    chunk.n = tail;
    SG_ASSIGN_OR_RETURN(state.tail_plan, c.matmul.Prepare(chunk));
  }
  state.path = MatmulPath::kBlockGemm;
  state.x_tensor = c.node.inputs[0].index;
  state.x_rounded_before = RoundedBefore(c.previous, state);
  return absl::OkStatus();
}

}  // namespace

PreparedOr Prepare(const ops::MatMul& op, const CudaPrepareContext& c) {
  const Tensor& x = c.input(0);
  const Tensor& w = c.input(1);
  auto state = std::make_unique<MatmulState>();
  state->shape = MatmulShape{x.shape[0], w.shape[0], x.shape[1], x.dtype, op.has_bias};
  state->w_dtype = w.dtype;
  if (IsQuantized(w.dtype)) {
    if (w.shape[1] == x.shape[1] && BlockGemmTakes(x.shape[0], w.shape[0], x.shape[1], x.dtype,
                                                   w.dtype, c.options)) {
      SG_RETURN_IF_ERROR(PrepareBlockGemm(c, *state));
      return Keep(std::move(state));
    }
    if (w.shape[1] != x.shape[1] ||
        !BlockFormatTakes(x.shape[0], w.shape[0], x.shape[1], x.dtype, w.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no CUDA matmul for x ", x.shape.ToString(), " ", DTypeName(x.dtype), " with w ",
          w.shape.ToString(), " ", DTypeName(w.dtype), " (a block-format w needs K a multiple of ",
          DTypeBlockElems(w.dtype), ", N <= 2^31-1 and M <= ",
          65535 * kernels::kQuantMatmulGroupRows, ")"));
    }
    state->path = MatmulPath::kBlockFormat;
    // The one-row kernel for a wide output (an lm head) in every format but Q5_K, whose
    // fused kernel stays faster there (H200, 1B lm head, f32 x, 2026-11-29: 121 against
    // 138 us; the others 76 to 116 us against 92 to 119 on the kernels they took before);
    // at any width and format under an integer block_gemv_precision.
    const kernels::QuantRowX row_x = RowXFor(c.options, w.dtype);
    const bool integer = row_x != kernels::QuantRowX::kF32;
    if (x.shape[0] == 1 && !op.has_bias &&
        (integer || (c.options.block_row_min_cols > 0 &&
                     w.shape[0] >= c.options.block_row_min_cols && w.dtype != DType::kQ5_K)) &&
        kernels::QuantRowMatmulTakes(w.shape[0], w.shape[1], w.dtype)) {
      state->path = MatmulPath::kBlockRow;
      state->w_constant = w.kind == TensorKind::kWeight;
      state->row_x = row_x;
    } else if (BlockMmaTakes(x.shape[0], w.shape[0], x.shape[1], x.dtype, w.dtype, c.options,
                      c.info.compute_capability)) {
      state->path = MatmulPath::kBlockMma;
      state->mma_terms = BlockMmaTermsFor(x.dtype, x.shape[0], c.options);
      SG_ASSIGN_OR_RETURN(state->mma,
                          BlockMmaWorkspaceOf(x.shape[0], w.shape[0], x.shape[1], w.dtype,
                                              state->mma_terms, c.info.sm_count,
                                              BlockMmaShapeFor(c.options)));
      state->mma_shape = state->mma.shape;
      SG_ASSIGN_OR_RETURN(state->workspace, c.matmul.BlockWorkspace(state->mma.bytes, c.node.name));
    } else if (const std::optional<kernels::FusedMatmulArgs> fused = FusedRowLaunch(
                   x.shape[0], w.shape[0], x.shape[1], x.dtype, w.dtype, op.has_bias,
                   w.kind == TensorKind::kWeight, c.info.sm_count)) {
      state->path = MatmulPath::kBlockFused;
      state->fused = *fused;
    }
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

namespace {

// The block GEMM's launches: x rounded into the workspace when the GEMM reads it in
// another dtype, then per chunk of w's rows its dequantization and its GEMM into y's
// columns [n0, n0 + rows). Each launch waits for the one before on the stream, so the
// chunks share one workspace.
absl::Status RunBlockGemm(const MatmulState& s, const MatmulRunner& runner, const void* x,
                          const void* w, const void* bias, void* y,
                          const kernels::Stream& stream) {
  const MatmulShape& shape = s.shape;
  auto* workspace = static_cast<uint8_t*>(s.workspace);
  const void* gemm_x = x;
  const float* alpha = nullptr;
  // x rounded into the workspace, unless the node before left this x there.
  if (s.block.scale_x()) {
    auto* scratch = reinterpret_cast<float*>(workspace);
    if (!s.x_rounded_before) {
      SG_RETURN_IF_ERROR(ToStatus(
          kernels::LaunchRoundFloatsF16Scaled(static_cast<const float*>(x),
                                              workspace + s.block.x_offset, shape.m * shape.k,
                                              scratch, stream),
          "LaunchRoundFloatsF16Scaled"));
    }
    gemm_x = workspace + s.block.x_offset;
    alpha = scratch + kernels::kRoundScaleAlpha;
  } else if (s.block.round_x) {
    if (!s.x_rounded_before) {
      SG_RETURN_IF_ERROR(ToStatus(kernels::LaunchRoundFloats(static_cast<const float*>(x),
                                                             workspace + s.block.x_offset,
                                                             s.block.operand, shape.m * shape.k,
                                                             stream),
                                  "LaunchRoundFloats"));
    }
    gemm_x = workspace + s.block.x_offset;
  }
  void* chunk = workspace + s.block.chunk_offset;
  const int64_t y_bytes = DTypeBytes(shape.dtype);
  const auto* w_bytes = static_cast<const uint8_t*>(w);
  for (int64_t n0 = 0; n0 < shape.n; n0 += s.block.chunk_rows) {
    const int64_t rows = std::min(s.block.chunk_rows, shape.n - n0);
    const MatmulRunner::Plan& plan = rows == s.block.chunk_rows ? *s.plan : *s.tail_plan;
    SG_RETURN_IF_ERROR(ToStatus(kernels::LaunchDequantize(w_bytes, s.w_dtype, shape.n, n0, rows,
                                                          shape.k, chunk, s.block.operand,
                                                          stream),
                                "LaunchDequantize"));
    MatmulShape chunk_shape = shape;
    chunk_shape.n = rows;
    SG_RETURN_IF_ERROR(runner.Launch(
        plan, chunk_shape, gemm_x, chunk,
        bias == nullptr ? nullptr : static_cast<const uint8_t*>(bias) + n0 * y_bytes,
        static_cast<uint8_t*>(y) + n0 * y_bytes, stream, alpha));
  }
  return absl::OkStatus();
}

}  // namespace
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
  if (s->path == internal::MatmulPath::kBlockRow) {
    return ToStatus(kernels::LaunchQuantRowMatmul(x, w, s->w_dtype, nullptr, y, shape.n,
                                                  shape.k, shape.dtype, s->w_constant,
                                                  info_.sm_count, s->row_x, launch()),
                    "LaunchQuantRowMatmul");
  }
  if (s->path == internal::MatmulPath::kBlockFused) {
    kernels::FusedMatmulArgs a = s->fused;
    a.x = x;
    a.w[0] = w;
    a.y = y;
    return ToStatus(kernels::LaunchFusedMatmul(a, launch()), "LaunchFusedMatmul");
  }
  if (s->path == internal::MatmulPath::kBlockMma) {
    kernels::BlockMmaArgs a;
    a.x = x;
    a.m = shape.m;
    a.k = shape.k;
    a.dtype = shape.dtype;
    a.w[0] = w;
    a.n[0] = shape.n;
    a.w_dtype = s->w_dtype;
    a.terms = s->mma_terms;
    a.y = y;
    a.bias = bias;
    a.ld = shape.n;
    a.splits = s->mma.splits;
    a.shape = s->mma_shape;
    auto* workspace = static_cast<char*>(s->workspace);
    a.partials = s->mma.partial_bytes > 0 ? reinterpret_cast<float*>(workspace) : nullptr;
    a.scratch = workspace + s->mma.partial_bytes;
    return ToStatus(kernels::LaunchBlockMma(a, launch()), "LaunchBlockMma");
  }
  if (s->path == internal::MatmulPath::kBlockGemm) {
    return internal::RunBlockGemm(*s, *matmul_, x, w, bias, y, launch());
  }
  return matmul_->Launch(*s->plan, shape, x, w, bias, y, launch());
}

}  // namespace sg
