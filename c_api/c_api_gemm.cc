// stepgraph_gemm and stepgraph_gemm_batched through cuBLASLt (CUDA build only). Row-major
// C = op(A) · op(B) is column-major Cᵀ = op(B)ᵀ · op(A)ᵀ, and a row-major matrix read as
// column-major is its transpose, so cuBLASLt gets B as its first operand and A as its
// second, each with its own transpose flag, and writes C as an n × m column-major matrix.
// A handle, descriptors and a heuristic query are made per call: the C ABI keeps no state.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "c_api/c_api_internal.h"
#include "stepgraph/c_api/c_api.h"

namespace sg::capi {
namespace {

int32_t FromCublas(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return STEPGRAPH_OK;
    case CUBLAS_STATUS_ALLOC_FAILED:
      return STEPGRAPH_ERROR_OUT_OF_MEMORY;
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return STEPGRAPH_ERROR_NO_CUDA;
    default:
      return STEPGRAPH_ERROR_LAUNCH_FAILED;
  }
}

cudaDataType_t CudaType(int32_t dtype) {
  switch (dtype) {
    case STEPGRAPH_BF16:
      return CUDA_R_16BF;
    case STEPGRAPH_F16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// The largest power of two up to 256 that divides the address and every batch offset.
uint32_t Alignment(const void* p, int64_t stride_bytes) {
  uint64_t v = reinterpret_cast<uintptr_t>(p) | static_cast<uint64_t>(stride_bytes) | 256u;
  return static_cast<uint32_t>(v & (~v + 1));
}

// Frees whatever was made, in any case.
struct Objects {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t x = nullptr, y = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Objects() {
    if (pref != nullptr) (void)cublasLtMatmulPreferenceDestroy(pref);
    if (d != nullptr) (void)cublasLtMatrixLayoutDestroy(d);
    if (y != nullptr) (void)cublasLtMatrixLayoutDestroy(y);
    if (x != nullptr) (void)cublasLtMatrixLayoutDestroy(x);
    if (desc != nullptr) (void)cublasLtMatmulDescDestroy(desc);
    if (handle != nullptr) (void)cublasLtDestroy(handle);
  }
};

#define SG_CUBLAS(call)                                     \
  do {                                                      \
    const cublasStatus_t sg_status = (call);                \
    if (sg_status != CUBLAS_STATUS_SUCCESS) return FromCublas(sg_status); \
  } while (0)

cublasStatus_t Layout(cublasLtMatrixLayout_t* l, cudaDataType_t type, int64_t rows, int64_t cols,
                      int64_t batch, int64_t stride) {
  cublasStatus_t s = cublasLtMatrixLayoutCreate(l, type, static_cast<uint64_t>(rows),
                                                static_cast<uint64_t>(cols), rows);
  if (s != CUBLAS_STATUS_SUCCESS || batch == 1) return s;
  const int32_t count = static_cast<int32_t>(batch);
  s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                       sizeof(count));
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  return cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                          &stride, sizeof(stride));
}

int32_t Gemm(const void* a, const void* b, void* c, int64_t batch, int64_t m, int64_t n,
             int64_t k, int64_t stride_a, int64_t stride_b, int64_t stride_c, int32_t trans_a,
             int32_t trans_b, float alpha, float beta, int32_t dtype, void* workspace,
             int64_t workspace_bytes, void* stream) noexcept {
  const cudaDataType_t type = CudaType(dtype);
  const int64_t esize = dtype == STEPGRAPH_F32 ? 4 : 2;
  Objects o;
  SG_CUBLAS(cublasLtCreate(&o.handle));
  SG_CUBLAS(cublasLtMatmulDescCreate(&o.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // cuBLASLt's first operand is B (column-major: n × k after its op), its second A (k × m).
  const cublasOperation_t op_x = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_y = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  SG_CUBLAS(cublasLtMatmulDescSetAttribute(o.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_x,
                                           sizeof(op_x)));
  SG_CUBLAS(cublasLtMatmulDescSetAttribute(o.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_y,
                                           sizeof(op_y)));
  // Stored shapes (column-major rows × cols, leading dimension = rows).
  SG_CUBLAS(trans_b ? Layout(&o.x, type, k, n, batch, stride_b)
                    : Layout(&o.x, type, n, k, batch, stride_b));
  SG_CUBLAS(trans_a ? Layout(&o.y, type, m, k, batch, stride_a)
                    : Layout(&o.y, type, k, m, batch, stride_a));
  SG_CUBLAS(Layout(&o.d, type, n, m, batch, stride_c));

  SG_CUBLAS(cublasLtMatmulPreferenceCreate(&o.pref));
  const uint64_t ws = static_cast<uint64_t>(workspace != nullptr ? workspace_bytes : 0);
  SG_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      o.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t align_x = Alignment(b, stride_b * esize);
  const uint32_t align_y = Alignment(a, stride_a * esize);
  const uint32_t align_d = Alignment(c, stride_c * esize);
  SG_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      o.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_x, sizeof(align_x)));
  SG_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      o.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_y, sizeof(align_y)));
  SG_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      o.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
  SG_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      o.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  SG_CUBLAS(cublasLtMatmulAlgoGetHeuristic(o.handle, o.desc, o.x, o.y, o.d, o.d, o.pref, 1,
                                           &result, &found));
  if (found == 0) return STEPGRAPH_ERROR_LAUNCH_FAILED;  // no algorithm for this case
  SG_CUBLAS(cublasLtMatmul(o.handle, o.desc, &alpha, b, o.x, a, o.y, &beta, c, o.d, c, o.d,
                           &result.algo, workspace, ws, static_cast<cudaStream_t>(stream)));
  return STEPGRAPH_OK;
}

#undef SG_CUBLAS

}  // namespace

int32_t RunGemm(const void* a, const void* b, void* c, int64_t m, int64_t n, int64_t k,
                int32_t trans_a, int32_t trans_b, float alpha, float beta, int32_t dtype,
                void* workspace, int64_t workspace_bytes, void* stream) noexcept {
  return Gemm(a, b, c, 1, m, n, k, 0, 0, 0, trans_a, trans_b, alpha, beta, dtype, workspace,
              workspace_bytes, stream);
}

int32_t RunGemmBatched(const void* a, const void* b, void* c, int64_t batch, int64_t m,
                       int64_t n, int64_t k, int64_t stride_a, int64_t stride_b,
                       int64_t stride_c, int32_t trans_a, int32_t trans_b, float alpha,
                       float beta, int32_t dtype, void* workspace, int64_t workspace_bytes,
                       void* stream) noexcept {
  return Gemm(a, b, c, batch, m, n, k, stride_a, stride_b, stride_c, trans_a, trans_b, alpha,
              beta, dtype, workspace, workspace_bytes, stream);
}

}  // namespace sg::capi
