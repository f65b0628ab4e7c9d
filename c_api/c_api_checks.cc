// The argument checks of every device function of the C ABI, compiled into both builds, so
// that a bad argument gets STEPGRAPH_ERROR_INVALID_VALUE with CUDA or without (c_api.h).
// Each checks what is the C ABI's own (pointers, alignment, the element bound, the limits
// of the launchers' grids); where a function is a graph op, the op's rules (dtypes, how
// the dims fit together, its parameters) are then asked of the op's shape inference
// (InferOutputType, graph/ops.cc), the same code the builder runs, so they are not written
// twice.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <new>
#include <optional>

#include "c_api/c_api_internal.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/ops.h"
#include "stepgraph/graph/types.h"

namespace sg::capi {

std::optional<DType> ParseDType(int32_t value, Allowed allowed) {
  switch (value) {
    case STEPGRAPH_F32:
      return DType::kF32;
    case STEPGRAPH_BF16:
      return DType::kBF16;
    case STEPGRAPH_F16:
      return DType::kF16;
    case STEPGRAPH_I32:
      if (allowed == Allowed::kFloatOrI32) return DType::kI32;
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

namespace {

constexpr int32_t kOk = STEPGRAPH_OK;
constexpr int32_t kInvalid = STEPGRAPH_ERROR_INVALID_VALUE;

static_assert(static_cast<int>(DType::kF32) == STEPGRAPH_F32 &&
              static_cast<int>(DType::kBF16) == STEPGRAPH_BF16 &&
              static_cast<int>(DType::kF16) == STEPGRAPH_F16 &&
              static_cast<int>(DType::kI32) == STEPGRAPH_I32);

// One input of a graph op, as the op's shape inference sees it.
struct Desc {
  DType dtype;
  Shape shape;
  TensorKind kind = TensorKind::kInput;
};

// Whether the op takes these inputs, by the op's own rules. Its messages are dropped: the
// C ABI reports a code.
int32_t OpAccepts(const Op& op, std::initializer_list<Desc> inputs) {
  try {
    std::array<Tensor, 4> tensors;
    std::array<const Tensor*, 4> pointers{};
    size_t n = 0;
    for (const Desc& d : inputs) {
      tensors[n].dtype = d.dtype;
      tensors[n].shape = d.shape;
      tensors[n].kind = d.kind;
      pointers[n] = &tensors[n];
      ++n;
    }
    const bool ok = InferOutputType(op, "c_api", {pointers.data(), n}).ok();
    return ok ? kOk : kInvalid;
  } catch (const std::bad_alloc&) {  // only the message of a refusal allocates
    return kInvalid;
  }
}

int32_t CheckElementwise(std::initializer_list<const void*> buffers, int64_t n, int32_t dtype,
                         Allowed allowed) {
  const std::optional<DType> t = ParseDType(dtype, allowed);
  if (!t) return kInvalid;
  Require r;
  for (const void* b : buffers) r.Buffer(b, DTypeBytes(*t));
  return r.Tensor({n}).code();
}

int32_t CheckBinaryOp(const Op& op, const void* a, const void* b, void* y, int64_t n, int32_t dtype,
                      Allowed allowed) {
  if (const int32_t rc = CheckElementwise({a, b, y}, n, dtype, allowed); rc != kOk) return rc;
  const DType t = static_cast<DType>(dtype);
  return OpAccepts(op, {{t, Shape{n}}, {t, Shape{n}}});
}

// The attention launcher's own limits (int dims, its head_dim bound).
int32_t CheckAttentionDims(int64_t rows, int64_t heads, int64_t kv_heads, int64_t seq_len,
                           int64_t head_dim) {
  for (const int64_t d : {rows, heads, kv_heads, seq_len, head_dim}) {
    if (d <= 0 || d > kMaxInt) return kInvalid;
  }
  return Require()
      .AtMost(rows, kMaxGridRows)
      .AtMost(head_dim, STEPGRAPH_ATTENTION_MAX_HEAD_DIM)
      .That(head_dim % 2 == 0 && heads % kv_heads == 0)
      .code();
}

}  // namespace

// ---- The decode ops: the C ABI's limits, then the op's rules ----------------------------

int32_t CheckEmbedding(const void* table, const int32_t* ids, void* out, int64_t rows,
                       int64_t vocab, int64_t hidden, int32_t dtype, uint32_t* error_flags,
                       void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return kInvalid;
  const int64_t elem = DTypeBytes(*t);
  if (!Require()
           .Buffer(table, elem)
           .Buffer(ids, sizeof(int32_t))
           .Buffer(out, elem)
           .Buffer(error_flags, sizeof(uint32_t))
           .Tensor({vocab, hidden})
           .Tensor({rows, hidden})
           .AtMost(rows, kMaxGridRows)
           .ok()) {
    return kInvalid;
  }
  return OpAccepts(ops::Embedding{},
                   {{*t, Shape{vocab, hidden}, TensorKind::kWeight}, {DType::kI32, Shape{rows}}});
}

int32_t CheckMatmul(const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n,
                    int64_t k, int32_t dtype, void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return kInvalid;
  const int64_t elem = DTypeBytes(*t);
  if (!Require()
           .Buffer(x, elem)
           .Buffer(w, elem)
           .OptionalBuffer(bias, elem)
           .Buffer(y, elem)
           .Tensor({m, k})
           .Tensor({n, k})
           .Tensor({m, n})
           .AtMost(m, STEPGRAPH_MATMUL_MAX_ROWS)
           .ok()) {
    return kInvalid;
  }
  if (bias == nullptr) {
    return OpAccepts(ops::MatMul{false},
                     {{*t, Shape{m, k}}, {*t, Shape{n, k}, TensorKind::kWeight}});
  }
  return OpAccepts(ops::MatMul{true}, {{*t, Shape{m, k}},
                                       {*t, Shape{n, k}, TensorKind::kWeight},
                                       {*t, Shape{n}, TensorKind::kWeight}});
}

int32_t CheckRmsnorm(const void* x, const void* weight, void* y, int64_t rows, int64_t hidden,
                     float eps, int32_t dtype, void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return kInvalid;
  const int64_t elem = DTypeBytes(*t);
  if (!Require()
           .Buffer(x, elem)
           .Buffer(weight, elem)
           .Buffer(y, elem)
           .Tensor({rows, hidden})
           .AtMost(rows, kMaxInt)  // one block per row on grid.x
           .ok()) {
    return kInvalid;
  }
  return OpAccepts(ops::RmsNorm{eps},
                   {{*t, Shape{rows, hidden}}, {*t, Shape{hidden}, TensorKind::kWeight}});
}

int32_t CheckAdd(const void* a, const void* b, void* y, int64_t n, int32_t dtype,
                 void* stream) noexcept {
  return CheckBinaryOp(ops::Add{}, a, b, y, n, dtype, Allowed::kFloatOrI32);
}

int32_t CheckMul(const void* a, const void* b, void* y, int64_t n, int32_t dtype,
                 void* stream) noexcept {
  return CheckBinaryOp(ops::Mul{}, a, b, y, n, dtype, Allowed::kFloat);
}

int32_t CheckSilu(const void* x, void* y, int64_t n, int32_t dtype, void* stream) noexcept {
  if (const int32_t rc = CheckElementwise({x, y}, n, dtype, Allowed::kFloat); rc != kOk) {
    return rc;
  }
  return OpAccepts(ops::Silu{}, {{static_cast<DType>(dtype), Shape{n}}});
}

int32_t CheckScale(const void* x, void* y, int64_t n, float alpha, int32_t dtype,
                   void* stream) noexcept {
  if (const int32_t rc = CheckElementwise({x, y}, n, dtype, Allowed::kFloat); rc != kOk) {
    return rc;
  }
  return Require().Finite(alpha).code();
}

int32_t CheckSiluMul(const void* gate, const void* up, void* y, int64_t n, int32_t dtype,
                     void* stream) noexcept {
  return CheckBinaryOp(ops::SiluMul{}, gate, up, y, n, dtype, Allowed::kFloat);
}

int32_t CheckRope(const void* x, const int32_t* pos, const float* inv_freq, void* y, int64_t rows,
                  int64_t cols, int64_t head_dim, int32_t interleaved, int32_t dtype,
                  void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return kInvalid;
  const int64_t elem = DTypeBytes(*t);
  // head_dim is an int for the op and the launcher: bounded before it is narrowed.
  if (!Require()
           .Buffer(x, elem)
           .Buffer(pos, sizeof(int32_t))
           .Buffer(inv_freq, sizeof(float))
           .Buffer(y, elem)
           .Tensor({rows, cols})
           .That(head_dim > 0 && head_dim <= kMaxRopeHeadDim)
           .That(interleaved == 0 || interleaved == 1)
           .ok()) {
    return kInvalid;
  }
  ops::Rope op;
  op.head_dim = static_cast<int32_t>(head_dim);
  op.interleaved = interleaved == 1;
  return OpAccepts(op, {{*t, Shape{rows, cols}}, {DType::kI32, Shape{rows}}});
}

int32_t CheckKvWrite(const void* kv, const int32_t* pos, void* cache, int64_t rows, int64_t slots,
                     int64_t kv_heads, int64_t seq_len, int64_t head_dim, int32_t dtype,
                     uint32_t* error_flags, void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return kInvalid;
  const int64_t elem = DTypeBytes(*t);
  if (!Require()
           .Buffer(kv, elem)
           .Buffer(pos, sizeof(int32_t))
           .Buffer(cache, elem)
           .Buffer(error_flags, sizeof(uint32_t))
           .Tensor({rows, kv_heads, head_dim})
           .Tensor({slots, kv_heads, seq_len, head_dim})
           .ok()) {
    return kInvalid;
  }
  return OpAccepts(ops::KvWrite{},
                   {{*t, Shape{rows, kv_heads * head_dim}},
                    {DType::kI32, Shape{rows}},
                    {*t, Shape{slots, kv_heads, seq_len, head_dim}, TensorKind::kState}});
}

int32_t CheckAttentionWorkspaceBytes(int64_t rows, int64_t heads, int64_t kv_heads, int64_t seq_len,
                                     int64_t head_dim, int64_t* bytes) noexcept {
  if (bytes == nullptr || reinterpret_cast<uintptr_t>(bytes) % alignof(int64_t) != 0) {
    return kInvalid;
  }
  if (!Require().Tensor({rows, heads, head_dim}).Tensor({kv_heads, seq_len, head_dim}).ok()) {
    return kInvalid;
  }
  return CheckAttentionDims(rows, heads, kv_heads, seq_len, head_dim);
}

int32_t CheckAttention(const void* q, const void* k_cache, const void* v_cache, const int32_t* pos,
                       void* out, int64_t rows, int64_t heads, int64_t kv_heads, int64_t slots,
                       int64_t seq_len, int64_t head_dim, float scale, int32_t dtype,
                       void* workspace, int64_t workspace_bytes, uint32_t* error_flags,
                       void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return kInvalid;
  const int64_t pair = 2 * DTypeBytes(*t);  // the kernels read element pairs
  if (!Require()
           .Buffer(q, pair)
           .Buffer(k_cache, pair)
           .Buffer(v_cache, pair)
           .Buffer(pos, sizeof(int32_t))
           .Buffer(out, pair)
           .Buffer(error_flags, sizeof(uint32_t))
           .Tensor({rows, heads, head_dim})
           .Tensor({slots, kv_heads, seq_len, head_dim})
           .Workspace(workspace, workspace_bytes)
           .ok()) {
    return kInvalid;
  }
  if (const int32_t rc = CheckAttentionDims(rows, heads, kv_heads, seq_len, head_dim); rc != kOk) {
    return rc;
  }
  const Shape cache{slots, kv_heads, seq_len, head_dim};
  return OpAccepts(ops::Attention{scale}, {{*t, Shape{rows, heads * head_dim}},
                                           {*t, cache, TensorKind::kState},
                                           {*t, cache, TensorKind::kState},
                                           {DType::kI32, Shape{rows}}});
}

int32_t CheckSoftmax(const void* x, void* y, int64_t rows, int64_t n, int32_t dtype,
                     void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return kInvalid;
  const int64_t elem = DTypeBytes(*t);
  if (!Require().Buffer(x, elem).Buffer(y, elem).Tensor({rows, n}).ok()) return kInvalid;
  return OpAccepts(ops::Softmax{}, {{*t, Shape{rows, n}}});
}

int32_t CheckArgmaxWorkspaceBytes(int64_t rows, int64_t vocab, int64_t* bytes) noexcept {
  return Require()
      .Buffer(bytes, alignof(int64_t))
      .Tensor({rows, vocab})
      .AtMost(rows, kMaxGridRows)
      .AtMost(vocab, kMaxInt)
      .code();
}

int32_t CheckArgmax(const void* logits, int32_t* ids, int64_t rows, int64_t vocab, int32_t dtype,
                    void* workspace, int64_t workspace_bytes, void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return kInvalid;
  if (!Require()
           .Buffer(logits, DTypeBytes(*t))
           .Buffer(ids, sizeof(int32_t))
           .Tensor({rows, vocab})
           .AtMost(rows, kMaxGridRows)
           .AtMost(vocab, kMaxInt)
           .Workspace(workspace, workspace_bytes)
           .ok()) {
    return kInvalid;
  }
  return OpAccepts(ops::Argmax{}, {{*t, Shape{rows, vocab}}});
}

int32_t CheckSample(const void* logits, const int32_t* seeds, const int32_t* pos, int32_t* ids,
                    int64_t rows, int64_t vocab, float temperature, int32_t top_k, float top_p,
                    int32_t dtype, void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return kInvalid;
  if (!Require()
           .Buffer(logits, DTypeBytes(*t))
           .Buffer(seeds, sizeof(int32_t))
           .Buffer(pos, sizeof(int32_t))
           .Buffer(ids, sizeof(int32_t))
           .Tensor({rows, vocab})
           .AtMost(rows, kMaxInt / kSampleBlocksPerRow)
           .AtMost(vocab, kMaxInt)
           .ok()) {
    return kInvalid;
  }
  return OpAccepts(
      ops::Sample{temperature, top_k, top_p},
      {{*t, Shape{rows, vocab}}, {DType::kI32, Shape{rows}}, {DType::kI32, Shape{rows}}});
}

int32_t CheckCopy(const void* src, void* dst, int64_t n, int32_t dtype, void* stream) noexcept {
  if (const int32_t rc = CheckElementwise({src, dst}, n, dtype, Allowed::kFloatOrI32); rc != kOk) {
    return rc;
  }
  const DType t = static_cast<DType>(dtype);
  return OpAccepts(ops::Copy{}, {{t, Shape{n}}, {t, Shape{n}, TensorKind::kState}});
}

int32_t CheckAdvance(int32_t* pos, int64_t n, void* stream) noexcept {
  if (!Require().Buffer(pos, sizeof(int32_t)).Tensor({n}).ok()) return kInvalid;
  return OpAccepts(ops::Advance{}, {{DType::kI32, Shape{n}, TensorKind::kState}});
}

// ---- top-k and attention over sequences ----

int32_t CheckTopk(const void* x, void* values, int32_t* indices, int64_t rows, int64_t n,
                  int64_t k, int32_t dtype, void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return kInvalid;
  const int64_t elem = DTypeBytes(*t);
  return Require()
      .Buffer(x, elem)
      .Buffer(values, elem)
      .Buffer(indices, sizeof(int32_t))
      .Tensor({rows, n})
      .Tensor({rows, k})
      .AtMost(rows, kMaxInt)
      .AtMost(n, kMaxInt)
      .AtMost(k, std::min<int64_t>(n, STEPGRAPH_TOPK_MAX_K))
      .code();
}

int32_t CheckFlashAttention(const void* q, const void* k, const void* v, void* out,
                            int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                            int64_t head_dim, float scale, int32_t causal, int32_t dtype,
                            void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return kInvalid;
  const int64_t elem = DTypeBytes(*t);
  Require r;
  r.Buffer(q, elem)
      .Buffer(k, elem)
      .Buffer(v, elem)
      .Buffer(out, elem)
      .Tensor({batch, seq, heads, head_dim})
      .Tensor({batch, seq, kv_heads, head_dim})
      .AtMost(batch, kMaxGridRows)
      .AtMost(heads, kMaxGridRows)
      .AtMost(seq, kMaxInt)
      .AtMost(head_dim, STEPGRAPH_FLASH_MAX_HEAD_DIM)
      .That(causal == 0 || causal == 1)
      .Finite(scale)
      .That(scale > 0.0f);
  return r.ok() && heads % kv_heads == 0 ? kOk : kInvalid;
}

// ---- gemm ----

namespace {

// The elements a strided batch spans: (batch − 1) · stride + size, or -1 past the bound.
int64_t Extent(int64_t batch, int64_t stride, int64_t size) {
  if (stride != 0 && batch - 1 > (kMaxElements - size) / stride) return -1;
  return (batch - 1) * stride + size;
}

int32_t CheckGemmArgs(const void* a, const void* b, const void* c, int64_t batch, int64_t m,
                      int64_t n, int64_t k, int64_t stride_a, int64_t stride_b,
                      int64_t stride_c, int32_t trans_a, int32_t trans_b, float alpha,
                      float beta, int32_t dtype, const void* workspace,
                      int64_t workspace_bytes) {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return kInvalid;
  const int64_t elem = DTypeBytes(*t);
  Require r;
  r.Buffer(a, elem)
      .Buffer(b, elem)
      .Buffer(c, elem)
      .Tensor({m, k})
      .Tensor({k, n})
      .Tensor({m, n})
      .Tensor({batch})
      .AtMost(m, kMaxInt)
      .AtMost(n, kMaxInt)
      .AtMost(k, kMaxInt)
      .AtMost(batch, kMaxInt)
      .That((trans_a == 0 || trans_a == 1) && (trans_b == 0 || trans_b == 1))
      .Finite(alpha)
      .Finite(beta)
      .Workspace(workspace, workspace_bytes, kGemmWorkspaceAlign);
  if (!r.ok()) return kInvalid;
  // m, n, k and their products are bounded now.
  return r.That(stride_a >= 0 && stride_b >= 0 && (batch == 1 || stride_c >= m * n))
      .That(Extent(batch, stride_a, m * k) >= 0)
      .That(Extent(batch, stride_b, k * n) >= 0)
      .That(Extent(batch, stride_c, m * n) >= 0)
      .code();
}

}  // namespace

int32_t CheckGemm(const void* a, const void* b, void* c, int64_t m, int64_t n, int64_t k,
                  int32_t trans_a, int32_t trans_b, float alpha, float beta, int32_t dtype,
                  void* workspace, int64_t workspace_bytes, void* stream) noexcept {
  return CheckGemmArgs(a, b, c, 1, m, n, k, 0, 0, 0, trans_a, trans_b, alpha, beta, dtype,
                       workspace, workspace_bytes);
}

int32_t CheckGemmBatched(const void* a, const void* b, void* c, int64_t batch, int64_t m,
                         int64_t n, int64_t k, int64_t stride_a, int64_t stride_b,
                         int64_t stride_c, int32_t trans_a, int32_t trans_b, float alpha,
                         float beta, int32_t dtype, void* workspace, int64_t workspace_bytes,
                         void* stream) noexcept {
  return CheckGemmArgs(a, b, c, batch, m, n, k, stride_a, stride_b, stride_c, trans_a, trans_b,
                       alpha, beta, dtype, workspace, workspace_bytes);
}

// ---- training ----

namespace {

int32_t CheckCrossEntropyArgs(const void* logits, const int32_t* targets, const float* loss,
                              const void* log_probs, bool log_probs_optional, int64_t rows,
                              int64_t vocab, int32_t dtype, const uint32_t* error_flags) {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return kInvalid;
  const int64_t elem = DTypeBytes(*t);
  Require r;
  r.Buffer(logits, elem).Buffer(targets, sizeof(int32_t)).Buffer(loss, sizeof(float));
  if (log_probs_optional) {
    r.OptionalBuffer(log_probs, elem);
  } else {
    r.Buffer(log_probs, elem);
  }
  return r.Buffer(error_flags, sizeof(uint32_t))
      .Tensor({rows, vocab})
      .AtMost(rows, kMaxInt)
      .AtMost(vocab, kMaxInt)
      .code();
}

}  // namespace

int32_t CheckCrossEntropy(const void* logits, const int32_t* targets, float* loss,
                          void* log_probs, int64_t rows, int64_t vocab, int32_t ignore_index,
                          int32_t dtype, uint32_t* error_flags, void* stream) noexcept {
  return CheckCrossEntropyArgs(logits, targets, loss, log_probs, true, rows, vocab, dtype,
                               error_flags);
}

int32_t CheckCrossEntropyBackward(const void* logits, const int32_t* targets,
                                  const float* dloss, void* dlogits, int64_t rows,
                                  int64_t vocab, int32_t ignore_index, int32_t dtype,
                                  uint32_t* error_flags, void* stream) noexcept {
  return CheckCrossEntropyArgs(logits, targets, dloss, dlogits, false, rows, vocab, dtype,
                               error_flags);
}

int32_t CheckMoeAuxLoss(const void* router_probs, const int32_t* expert_ids, float* loss,
                        int64_t tokens, int64_t experts, int64_t top_k, int32_t dtype,
                        uint32_t* error_flags, void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return kInvalid;
  return Require()
      .Buffer(router_probs, DTypeBytes(*t))
      .Buffer(expert_ids, sizeof(int32_t))
      .Buffer(loss, sizeof(float))
      .Buffer(error_flags, sizeof(uint32_t))
      .AtMost(experts, STEPGRAPH_MOE_MAX_EXPERTS)
      .Tensor({tokens, experts})
      .Tensor({tokens, top_k})
      .AtMost(top_k, experts)
      .code();
}

int32_t CheckAdamwStep(float* param, const void* grad, float* exp_avg, float* exp_avg_sq,
                       int64_t n, float lr, float beta1, float beta2, float eps,
                       float weight_decay, int64_t step, int32_t grad_dtype,
                       void* stream) noexcept {
  const std::optional<DType> t = ParseDType(grad_dtype, Allowed::kFloat);
  if (!t) return kInvalid;
  return Require()
      .Buffer(param, sizeof(float))
      .Buffer(grad, DTypeBytes(*t))
      .Buffer(exp_avg, sizeof(float))
      .Buffer(exp_avg_sq, sizeof(float))
      .Tensor({n})
      .Finite(lr)
      .Finite(eps)
      .Finite(weight_decay)
      .That(lr >= 0.0f && eps >= 0.0f && weight_decay >= 0.0f)
      .That(beta1 >= 0.0f && beta1 < 1.0f && beta2 >= 0.0f && beta2 < 1.0f)
      .That(step >= 1)
      .code();
}

int32_t CheckClipGradNorm(void* const* grads, const int64_t* sizes, int64_t count,
                          float max_norm, int32_t dtype, float* total_norm,
                          void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return kInvalid;
  Require r;
  r.That(grads != nullptr && sizes != nullptr)
      .Buffer(total_norm, sizeof(float))
      .That(count >= 1)
      .AtMost(count, STEPGRAPH_CLIP_MAX_BUFFERS)
      .Finite(max_norm)
      .That(max_norm > 0.0f);
  if (!r.ok()) return kInvalid;
  for (int64_t b = 0; b < count; ++b) r.Buffer(grads[b], DTypeBytes(*t)).Tensor({sizes[b]});
  return r.code();
}

}  // namespace sg::capi
