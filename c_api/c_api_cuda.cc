// The launches of the C ABI's device functions over the kernel launchers (kernels/*.cuh),
// built with STEPGRAPH_WITH_CUDA. Each Run<Name> is called by the exported function
// (c_api_entry.cc) only once Check<Name> passed every argument and a device was found: it
// enqueues and turns the cudaError_t into a return code. The arguments are known good
// here, so dtype values are cast and dims narrowed without a second look.
#include <cuda_runtime_api.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <optional>

#include "c_api/c_api_internal.h"
#include "kernels/attention.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/embedding.cuh"
#include "kernels/flash_attention.cuh"
#include "kernels/gemv.cuh"
#include "kernels/norm.cuh"
#include "kernels/rope.cuh"
#include "kernels/sampling.cuh"
#include "kernels/scale.cuh"
#include "kernels/topk.cuh"
#include "kernels/training.cuh"
#include "stepgraph/c_api/c_api.h"
#include "stepgraph/base/dtype.h"
#include "stepgraph/base/error_flags.h"

namespace sg::capi {
namespace {

static_assert(sg::kErrorTokenOutOfRange == STEPGRAPH_FLAG_TOKEN_OUT_OF_RANGE &&
              sg::kErrorPositionOutOfRange == STEPGRAPH_FLAG_POSITION_OUT_OF_RANGE);
static_assert(kernels::kGemvMaxRows == STEPGRAPH_MATMUL_MAX_ROWS);
static_assert(kernels::kAttentionMaxHeadDim == STEPGRAPH_ATTENTION_MAX_HEAD_DIM);
static_assert(kernels::kMoeMaxExperts == STEPGRAPH_MOE_MAX_EXPERTS);
static_assert(kernels::kTopkMaxK == STEPGRAPH_TOPK_MAX_K);
static_assert(kernels::kFlashMaxHeadDim == STEPGRAPH_FLASH_MAX_HEAD_DIM);

}  // namespace

// Probed once: the answer does not change within a process (the runtime itself keeps a
// failed initialisation).
bool DeviceAvailable() noexcept {
  static const bool available = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      (void)cudaGetLastError();  // leave no error behind for the caller's next check
      return false;
    }
    return count > 0;
  }();
  return available;
}

namespace {

int32_t ToCode(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return STEPGRAPH_OK;
    // The launchers refuse what they cannot run with it, before launching.
    case cudaErrorInvalidValue:
      return STEPGRAPH_ERROR_INVALID_VALUE;
    case cudaErrorMemoryAllocation:
      return STEPGRAPH_ERROR_OUT_OF_MEMORY;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorStubLibrary:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return STEPGRAPH_ERROR_NO_CUDA;
    default:
      return STEPGRAPH_ERROR_LAUNCH_FAILED;
  }
}

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

cudaError_t CurrentSmCount(int* sm_count) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  return cudaDeviceGetAttribute(sm_count, cudaDevAttrMultiProcessorCount, device);
}

// The launcher's shape, or nullopt when the dims do not make one it takes.
std::optional<kernels::AttentionShape> AttentionShapeOf(int64_t rows, int64_t heads,
                                                        int64_t kv_heads, int64_t seq_len,
                                                        int64_t head_dim) {
  for (const int64_t d : {rows, heads, kv_heads, seq_len, head_dim}) {
    if (d <= 0 || d > INT_MAX) return std::nullopt;
  }
  kernels::AttentionShape s;
  s.rows = static_cast<int>(rows);
  s.heads = static_cast<int>(heads);
  s.kv_heads = static_cast<int>(kv_heads);
  s.seq_len = static_cast<int>(seq_len);
  s.head_dim = static_cast<int>(head_dim);
  if (kernels::AttentionShapeError(s)[0] != '\0') return std::nullopt;
  return s;
}

// The launcher's preferred split, cut down to what `workspace_bytes` holds.
int AttentionChunks(const kernels::AttentionShape& s, DType dtype, int sm_count,
                    int64_t workspace_bytes) {
  int chunks = kernels::ChooseAttentionChunks(s, dtype, sm_count);
  while (chunks > 1 && kernels::AttentionWorkspaceBytes(s, chunks) > workspace_bytes) {
    --chunks;
  }
  return chunks;
}

DType DTypeOf(int32_t dtype) { return static_cast<DType>(dtype); }

}  // namespace

int32_t RunEmbedding(const void* table, const int32_t* ids, void* out, int64_t rows, int64_t vocab,
                     int64_t hidden, int32_t dtype, uint32_t* error_flags, void* stream) noexcept {
  return ToCode(kernels::LaunchEmbedding(table, ids, out, rows, vocab, hidden, DTypeOf(dtype),
                                         error_flags, AsStream(stream)));
}

int32_t RunMatmul(const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n,
                  int64_t k, int32_t dtype, void* stream) noexcept {
  return ToCode(kernels::LaunchGemv(x, w, bias, y, m, n, k, DTypeOf(dtype), AsStream(stream)));
}

int32_t RunRmsnorm(const void* x, const void* weight, void* y, int64_t rows, int64_t hidden,
                   float eps, int32_t dtype, void* stream) noexcept {
  return ToCode(
      kernels::LaunchRmsNorm(x, weight, y, rows, hidden, eps, DTypeOf(dtype), AsStream(stream)));
}

int32_t RunAdd(const void* a, const void* b, void* y, int64_t n, int32_t dtype,
               void* stream) noexcept {
  return ToCode(kernels::LaunchAdd(a, b, y, n, DTypeOf(dtype), AsStream(stream)));
}

int32_t RunMul(const void* a, const void* b, void* y, int64_t n, int32_t dtype,
               void* stream) noexcept {
  return ToCode(kernels::LaunchMul(a, b, y, n, DTypeOf(dtype), AsStream(stream)));
}

int32_t RunSilu(const void* x, void* y, int64_t n, int32_t dtype, void* stream) noexcept {
  return ToCode(kernels::LaunchSilu(x, y, n, DTypeOf(dtype), AsStream(stream)));
}

int32_t RunScale(const void* x, void* y, int64_t n, float alpha, int32_t dtype,
                 void* stream) noexcept {
  return ToCode(kernels::LaunchScale(x, y, n, alpha, DTypeOf(dtype), AsStream(stream)));
}

int32_t RunSiluMul(const void* gate, const void* up, void* y, int64_t n, int32_t dtype,
                   void* stream) noexcept {
  return ToCode(kernels::LaunchSiluMul(gate, up, y, n, DTypeOf(dtype), AsStream(stream)));
}

int32_t RunRope(const void* x, const int32_t* pos, const float* inv_freq, void* y, int64_t rows,
                int64_t cols, int64_t head_dim, int32_t interleaved, int32_t dtype,
                void* stream) noexcept {
  // head_dim <= kMaxRopeHeadDim (checked): the narrowing is exact.
  return ToCode(kernels::LaunchRope(x, pos, inv_freq, y, rows, cols, static_cast<int>(head_dim),
                                    interleaved == 1, DTypeOf(dtype), AsStream(stream)));
}

int32_t RunKvWrite(const void* kv, const int32_t* pos, void* cache, int64_t rows, int64_t slots,
                   int64_t kv_heads, int64_t seq_len, int64_t head_dim, int32_t dtype,
                   uint32_t* error_flags, void* stream) noexcept {
  return ToCode(kernels::LaunchKvWrite(kv, pos, cache, rows, kv_heads, seq_len, head_dim,
                                       DTypeOf(dtype), error_flags, AsStream(stream)));
}

int32_t RunAttentionWorkspaceBytes(int64_t rows, int64_t heads, int64_t kv_heads, int64_t seq_len,
                                   int64_t head_dim, int64_t* bytes) noexcept {
  const std::optional<kernels::AttentionShape> s =
      AttentionShapeOf(rows, heads, kv_heads, seq_len, head_dim);
  if (!s) return STEPGRAPH_ERROR_INVALID_VALUE;
  int sm_count = 0;
  if (const cudaError_t e = CurrentSmCount(&sm_count); e != cudaSuccess) return ToCode(e);
  // The query has no dtype: bf16's chunks, the most any dtype's launch takes.
  const int chunks = kernels::ChooseAttentionChunks(*s, DType::kBF16, sm_count);
  *bytes = chunks > 1 ? kernels::AttentionWorkspaceBytes(*s, chunks) : 0;
  return STEPGRAPH_OK;
}

int32_t RunAttention(const void* q, const void* k_cache, const void* v_cache, const int32_t* pos,
                     void* out, int64_t rows, int64_t heads, int64_t kv_heads, int64_t slots,
                     int64_t seq_len, int64_t head_dim, float scale, int32_t dtype, void* workspace,
                     int64_t workspace_bytes, uint32_t* error_flags, void* stream) noexcept {
  const std::optional<kernels::AttentionShape> s =
      AttentionShapeOf(rows, heads, kv_heads, seq_len, head_dim);
  if (!s) return STEPGRAPH_ERROR_INVALID_VALUE;
  int chunks = 1;
  if (workspace != nullptr) {
    int sm_count = 0;
    if (const cudaError_t e = CurrentSmCount(&sm_count); e != cudaSuccess) return ToCode(e);
    chunks = AttentionChunks(*s, DTypeOf(dtype), sm_count, workspace_bytes);
  }
  if (chunks > 1) {
    // The launcher wants its per-(row, head) arrival counters, at the workspace's start,
    // zero; clearing them here spares the caller that contract.
    const int64_t counter_bytes = rows * heads * static_cast<int64_t>(sizeof(uint32_t));
    if (const cudaError_t e =
            cudaMemsetAsync(workspace, 0, static_cast<size_t>(counter_bytes), AsStream(stream));
        e != cudaSuccess) {
      return ToCode(e);
    }
  }
  kernels::AttentionArgs a;
  a.q = q;
  a.k_cache = k_cache;
  a.v_cache = v_cache;
  a.pos = pos;
  a.out = out;
  a.scale = scale;
  a.workspace = chunks > 1 ? workspace : nullptr;
  a.error_flags = error_flags;
  return ToCode(kernels::LaunchAttention(a, *s, chunks, DTypeOf(dtype), AsStream(stream)));
}

int32_t RunSoftmax(const void* x, void* y, int64_t rows, int64_t n, int32_t dtype,
                   void* stream) noexcept {
  return ToCode(kernels::LaunchSoftmax(x, y, rows, n, DTypeOf(dtype), AsStream(stream)));
}

int32_t RunArgmaxWorkspaceBytes(int64_t rows, int64_t vocab, int64_t* bytes) noexcept {
  int sm_count = 0;
  if (const cudaError_t e = CurrentSmCount(&sm_count); e != cudaSuccess) return ToCode(e);
  const int blocks = kernels::ArgmaxBlocksPerRow(rows, vocab, sm_count);
  *bytes = blocks > 1 ? kernels::ArgmaxWorkspaceBytes(rows) : 0;
  return STEPGRAPH_OK;
}

int32_t RunArgmax(const void* logits, int32_t* ids, int64_t rows, int64_t vocab, int32_t dtype,
                  void* workspace, int64_t workspace_bytes, void* stream) noexcept {
  const int64_t need = kernels::ArgmaxWorkspaceBytes(rows);
  int blocks = 1;
  if (workspace != nullptr && workspace_bytes >= need) {
    int sm_count = 0;
    if (const cudaError_t e = CurrentSmCount(&sm_count); e != cudaSuccess) return ToCode(e);
    blocks = kernels::ArgmaxBlocksPerRow(rows, vocab, sm_count);
  }
  if (blocks > 1) {
    // Best keys and arrival counters must start at zero (kernels/sampling.cuh).
    if (const cudaError_t e =
            cudaMemsetAsync(workspace, 0, static_cast<size_t>(need), AsStream(stream));
        e != cudaSuccess) {
      return ToCode(e);
    }
  }
  return ToCode(kernels::LaunchArgmax(logits, DTypeOf(dtype), rows, vocab, blocks,
                                      blocks > 1 ? workspace : nullptr, ids, AsStream(stream)));
}

int32_t RunSample(const void* logits, const int32_t* seeds, const int32_t* pos, int32_t* ids,
                  int64_t rows, int64_t vocab, float temperature, int32_t top_k, float top_p,
                  int32_t dtype, void* stream) noexcept {
  kernels::SampleParams params;
  params.temperature = temperature;
  params.top_k = top_k;
  params.top_p = top_p;
  return ToCode(kernels::LaunchSample(logits, DTypeOf(dtype), rows, vocab, seeds, pos, params, ids,
                                      AsStream(stream)));
}

int32_t RunCopy(const void* src, void* dst, int64_t n, int32_t dtype, void* stream) noexcept {
  if (src == dst) return STEPGRAPH_OK;
  return ToCode(cudaMemcpyAsync(dst, src, static_cast<size_t>(n * DTypeBytes(DTypeOf(dtype))),
                                cudaMemcpyDeviceToDevice, AsStream(stream)));
}

int32_t RunAdvance(int32_t* pos, int64_t n, void* stream) noexcept {
  return ToCode(kernels::LaunchAdvance(pos, n, AsStream(stream)));
}

// ---- top-k and attention over sequences ----

int32_t RunTopk(const void* x, void* values, int32_t* indices, int64_t rows, int64_t n,
                int64_t k, int32_t dtype, void* stream) noexcept {
  return ToCode(kernels::LaunchTopk(x, values, indices, rows, n, k, DTypeOf(dtype),
                                    AsStream(stream)));
}

int32_t RunFlashAttention(const void* q, const void* k, const void* v, void* out, int64_t batch,
                          int64_t seq, int64_t heads, int64_t kv_heads, int64_t head_dim,
                          float scale, int32_t causal, int32_t dtype, void* stream) noexcept {
  return ToCode(kernels::LaunchFlashAttention(q, k, v, out, batch, seq, heads, kv_heads,
                                              head_dim, scale, causal == 1, DTypeOf(dtype),
                                              AsStream(stream)));
}

// ---- training ----

int32_t RunCrossEntropy(const void* logits, const int32_t* targets, float* loss, void* log_probs,
                        int64_t rows, int64_t vocab, int32_t ignore_index, int32_t dtype,
                        uint32_t* error_flags, void* stream) noexcept {
  return ToCode(kernels::LaunchCrossEntropy(logits, targets, loss, log_probs, rows, vocab,
                                            ignore_index, DTypeOf(dtype), error_flags,
                                            STEPGRAPH_FLAG_TOKEN_OUT_OF_RANGE,
                                            AsStream(stream)));
}

int32_t RunCrossEntropyBackward(const void* logits, const int32_t* targets, const float* dloss,
                                void* dlogits, int64_t rows, int64_t vocab,
                                int32_t ignore_index, int32_t dtype, uint32_t* error_flags,
                                void* stream) noexcept {
  return ToCode(kernels::LaunchCrossEntropyBackward(
      logits, targets, dloss, dlogits, rows, vocab, ignore_index, DTypeOf(dtype), error_flags,
      STEPGRAPH_FLAG_TOKEN_OUT_OF_RANGE, AsStream(stream)));
}

int32_t RunMoeAuxLoss(const void* router_probs, const int32_t* expert_ids, float* loss,
                      int64_t tokens, int64_t experts, int64_t top_k, int32_t dtype,
                      uint32_t* error_flags, void* stream) noexcept {
  return ToCode(kernels::LaunchMoeAuxLoss(router_probs, expert_ids, loss, tokens, experts, top_k,
                                          DTypeOf(dtype), error_flags,
                                          STEPGRAPH_FLAG_TOKEN_OUT_OF_RANGE, AsStream(stream)));
}

int32_t RunAdamwStep(float* param, const void* grad, float* exp_avg, float* exp_avg_sq,
                     int64_t n, float lr, float beta1, float beta2, float eps,
                     float weight_decay, int64_t step, int32_t grad_dtype,
                     void* stream) noexcept {
  // PyTorch's bias corrections, in double as its Python floats are.
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
  if (!(bc1 > 0.0) || !(bc2 > 0.0)) return STEPGRAPH_ERROR_INVALID_VALUE;  // β^step rounds to 1
  const float decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);
  const float step_size = static_cast<float>(lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  return ToCode(kernels::LaunchAdamW(param, grad, exp_avg, exp_avg_sq, n, beta1, beta2, eps,
                                     decay, step_size, bc2_sqrt, DTypeOf(grad_dtype),
                                     AsStream(stream)));
}

int32_t RunClipGradNorm(void* const* grads, const int64_t* sizes, int64_t count, float max_norm,
                        int32_t dtype, float* total_norm, void* stream) noexcept {
  return ToCode(kernels::LaunchClipGradNorm(grads, sizes, count, max_norm, DTypeOf(dtype),
                                            total_norm, AsStream(stream)));
}

}  // namespace sg::capi
