// The C ABI over the kernel launchers (kernels/*.cuh), built with STEPGRAPH_WITH_CUDA. Each
// entry point checks every argument on the host first, so that a bad one is reported as
// STEPGRAPH_ERROR_INVALID_VALUE with or without a GPU and no launch ever sees it, then
// checks for a device, then enqueues and turns the cudaError_t into a return code.
#include <cuda_runtime_api.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>

#include "kernels/attention.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/embedding.cuh"
#include "kernels/gemv.cuh"
#include "kernels/norm.cuh"
#include "kernels/rope.cuh"
#include "kernels/sampling.cuh"
#include "stepgraph/c_api.h"
#include "stepgraph/dtype.h"
#include "stepgraph/error_flags.h"

namespace {

using sg::DType;

static_assert(static_cast<int>(DType::kF32) == STEPGRAPH_F32 &&
              static_cast<int>(DType::kBF16) == STEPGRAPH_BF16 &&
              static_cast<int>(DType::kF16) == STEPGRAPH_F16 &&
              static_cast<int>(DType::kI32) == STEPGRAPH_I32);
static_assert(sg::kErrorTokenOutOfRange == STEPGRAPH_FLAG_TOKEN_OUT_OF_RANGE &&
              sg::kErrorPositionOutOfRange == STEPGRAPH_FLAG_POSITION_OUT_OF_RANGE);
static_assert(sg::kernels::kGemvMaxRows == STEPGRAPH_MATMUL_MAX_ROWS);
static_assert(sg::kernels::kAttentionMaxHeadDim == STEPGRAPH_ATTENTION_MAX_HEAD_DIM);

constexpr int64_t kMaxElements = STEPGRAPH_MAX_ELEMENTS;
// Launchers that put rows on grid.y or grid.z take at most this many.
constexpr int64_t kMaxGridRows = 65535;
// Sample gives each row of long vocabularies a cluster of this many blocks on grid.x
// (kernels/sampling.cu), which must stay below 2^31.
constexpr int64_t kSampleBlocksPerRow = 8;
// The launchers' workspace layouts hold 8-byte fields; 16 leaves room to grow.
constexpr int64_t kWorkspaceAlign = 16;

enum class Allowed { kFloat, kFloatOrI32 };

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

// Argument checks, chained so that each entry point reads as its list of requirements.
class Require {
 public:
  // A buffer of elements `align` bytes wide.
  Require& Buffer(const void* p, int64_t align) {
    ok_ = ok_ && p != nullptr && Aligned(p, align);
    return *this;
  }
  Require& OptionalBuffer(const void* p, int64_t align) {
    ok_ = ok_ && (p == nullptr || Aligned(p, align));
    return *this;
  }
  // A tensor of these dims: each positive, their product at most kMaxElements. Checked
  // without overflow, so later products of these dims are safe.
  Require& Tensor(std::initializer_list<int64_t> dims) {
    int64_t elements = 1;
    for (const int64_t d : dims) {
      if (!ok_ || d <= 0 || d > kMaxElements / elements) {
        ok_ = false;
        return *this;
      }
      elements *= d;
    }
    return *this;
  }
  Require& AtMost(int64_t v, int64_t max) {
    ok_ = ok_ && v <= max;
    return *this;
  }
  Require& That(bool condition) {
    ok_ = ok_ && condition;
    return *this;
  }
  // workspace NULL with 0 bytes, or an aligned buffer with bytes >= 0.
  Require& Workspace(const void* p, int64_t bytes) {
    ok_ = ok_ && bytes >= 0 && (p != nullptr ? Aligned(p, kWorkspaceAlign) : bytes == 0);
    return *this;
  }

  bool ok() const { return ok_; }

 private:
  static bool Aligned(const void* p, int64_t align) {
    return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(align) == 0;
  }

  bool ok_ = true;
};

// Probed once: the answer does not change within a process (the runtime itself keeps a
// failed initialisation).
bool DeviceAvailable() {
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

// The common tail of every entry point whose arguments passed: device, then launch.
template <typename Launch>
int32_t Enqueue(Launch&& launch) {
  if (!DeviceAvailable()) return STEPGRAPH_ERROR_NO_CUDA;
  return ToCode(launch());
}

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

cudaError_t CurrentSmCount(int* sm_count) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  return cudaDeviceGetAttribute(sm_count, cudaDevAttrMultiProcessorCount, device);
}

// The launcher's shape, or nullopt when the dims do not make one it takes.
std::optional<sg::kernels::AttentionShape> AttentionShapeOf(int64_t rows, int64_t heads,
                                                            int64_t kv_heads, int64_t seq_len,
                                                            int64_t head_dim) {
  for (const int64_t d : {rows, heads, kv_heads, seq_len, head_dim}) {
    if (d <= 0 || d > INT_MAX) return std::nullopt;
  }
  sg::kernels::AttentionShape s;
  s.rows = static_cast<int>(rows);
  s.heads = static_cast<int>(heads);
  s.kv_heads = static_cast<int>(kv_heads);
  s.seq_len = static_cast<int>(seq_len);
  s.head_dim = static_cast<int>(head_dim);
  if (sg::kernels::AttentionShapeError(s)[0] != '\0') return std::nullopt;
  return s;
}

// The launcher's preferred split, cut down to what `workspace_bytes` holds.
int AttentionChunks(const sg::kernels::AttentionShape& s, int sm_count, int64_t workspace_bytes) {
  int chunks = sg::kernels::ChooseAttentionChunks(s, sm_count);
  while (chunks > 1 && sg::kernels::AttentionWorkspaceBytes(s, chunks) > workspace_bytes) {
    --chunks;
  }
  return chunks;
}

std::optional<DType> CheckElementwise(std::initializer_list<const void*> buffers, int64_t n,
                                      int32_t dtype, Allowed allowed) {
  const std::optional<DType> t = ParseDType(dtype, allowed);
  if (!t) return std::nullopt;
  Require r;
  for (const void* b : buffers) r.Buffer(b, sg::DTypeBytes(*t));
  if (!r.Tensor({n}).ok()) return std::nullopt;
  return t;
}

}  // namespace

extern "C" {

int32_t stepgraph_embedding(const void* table, const int32_t* ids, void* out, int64_t rows,
                            int64_t vocab, int64_t hidden, int32_t dtype, uint32_t* error_flags,
                            void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return STEPGRAPH_ERROR_INVALID_VALUE;
  const int64_t elem = sg::DTypeBytes(*t);
  if (!Require()
           .Buffer(table, elem)
           .Buffer(ids, sizeof(int32_t))
           .Buffer(out, elem)
           .Buffer(error_flags, sizeof(uint32_t))
           .Tensor({vocab, hidden})
           .Tensor({rows, hidden})
           .AtMost(rows, kMaxGridRows)
           .ok()) {
    return STEPGRAPH_ERROR_INVALID_VALUE;
  }
  return Enqueue([&] {
    return sg::kernels::LaunchEmbedding(table, ids, out, rows, vocab, hidden, *t, error_flags,
                                        AsStream(stream));
  });
}

int32_t stepgraph_matmul(const void* x, const void* w, const void* bias, void* y, int64_t m,
                         int64_t n, int64_t k, int32_t dtype, void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return STEPGRAPH_ERROR_INVALID_VALUE;
  const int64_t elem = sg::DTypeBytes(*t);
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
    return STEPGRAPH_ERROR_INVALID_VALUE;
  }
  return Enqueue([&] {
    return sg::kernels::LaunchGemv(x, w, bias, y, m, n, k, *t, AsStream(stream));
  });
}

int32_t stepgraph_rmsnorm(const void* x, const void* weight, void* y, int64_t rows,
                          int64_t hidden, float eps, int32_t dtype, void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return STEPGRAPH_ERROR_INVALID_VALUE;
  const int64_t elem = sg::DTypeBytes(*t);
  if (!Require()
           .Buffer(x, elem)
           .Buffer(weight, elem)
           .Buffer(y, elem)
           .Tensor({rows, hidden})
           .AtMost(rows, INT_MAX)  // one block per row on grid.x
           .That(std::isfinite(eps) && eps >= 0.0f)
           .ok()) {
    return STEPGRAPH_ERROR_INVALID_VALUE;
  }
  return Enqueue([&] {
    return sg::kernels::LaunchRmsNorm(x, weight, y, rows, hidden, eps, *t, AsStream(stream));
  });
}

int32_t stepgraph_add(const void* a, const void* b, void* y, int64_t n, int32_t dtype,
                      void* stream) noexcept {
  const std::optional<DType> t = CheckElementwise({a, b, y}, n, dtype, Allowed::kFloatOrI32);
  if (!t) return STEPGRAPH_ERROR_INVALID_VALUE;
  return Enqueue([&] { return sg::kernels::LaunchAdd(a, b, y, n, *t, AsStream(stream)); });
}

int32_t stepgraph_mul(const void* a, const void* b, void* y, int64_t n, int32_t dtype,
                      void* stream) noexcept {
  const std::optional<DType> t = CheckElementwise({a, b, y}, n, dtype, Allowed::kFloat);
  if (!t) return STEPGRAPH_ERROR_INVALID_VALUE;
  return Enqueue([&] { return sg::kernels::LaunchMul(a, b, y, n, *t, AsStream(stream)); });
}

int32_t stepgraph_silu(const void* x, void* y, int64_t n, int32_t dtype, void* stream) noexcept {
  const std::optional<DType> t = CheckElementwise({x, y}, n, dtype, Allowed::kFloat);
  if (!t) return STEPGRAPH_ERROR_INVALID_VALUE;
  return Enqueue([&] { return sg::kernels::LaunchSilu(x, y, n, *t, AsStream(stream)); });
}

int32_t stepgraph_silu_mul(const void* gate, const void* up, void* y, int64_t n, int32_t dtype,
                           void* stream) noexcept {
  const std::optional<DType> t = CheckElementwise({gate, up, y}, n, dtype, Allowed::kFloat);
  if (!t) return STEPGRAPH_ERROR_INVALID_VALUE;
  return Enqueue(
      [&] { return sg::kernels::LaunchSiluMul(gate, up, y, n, *t, AsStream(stream)); });
}

int32_t stepgraph_rope(const void* x, const int32_t* pos, const float* inv_freq, void* y,
                       int64_t rows, int64_t cols, int64_t head_dim, int32_t interleaved,
                       int32_t dtype, void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return STEPGRAPH_ERROR_INVALID_VALUE;
  const int64_t elem = sg::DTypeBytes(*t);
  if (!Require()
           .Buffer(x, elem)
           .Buffer(pos, sizeof(int32_t))
           .Buffer(inv_freq, sizeof(float))
           .Buffer(y, elem)
           .Tensor({rows, cols})
           .Tensor({head_dim})
           .That(head_dim % 2 == 0 && cols % head_dim == 0)
           .That(interleaved == 0 || interleaved == 1)
           .ok()) {
    return STEPGRAPH_ERROR_INVALID_VALUE;
  }
  return Enqueue([&] {
    return sg::kernels::LaunchRope(x, pos, inv_freq, y, rows, cols, static_cast<int>(head_dim),
                                   interleaved == 1, *t, AsStream(stream));
  });
}

int32_t stepgraph_kv_write(const void* kv, const int32_t* pos, void* cache, int64_t rows,
                           int64_t slots, int64_t kv_heads, int64_t seq_len, int64_t head_dim,
                           int32_t dtype, uint32_t* error_flags, void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return STEPGRAPH_ERROR_INVALID_VALUE;
  const int64_t elem = sg::DTypeBytes(*t);
  if (!Require()
           .Buffer(kv, elem)
           .Buffer(pos, sizeof(int32_t))
           .Buffer(cache, elem)
           .Buffer(error_flags, sizeof(uint32_t))
           .Tensor({rows, kv_heads, head_dim})
           .Tensor({slots, kv_heads, seq_len, head_dim})
           .That(slots >= rows)
           .ok()) {
    return STEPGRAPH_ERROR_INVALID_VALUE;
  }
  return Enqueue([&] {
    return sg::kernels::LaunchKvWrite(kv, pos, cache, rows, kv_heads, seq_len, head_dim, *t,
                                      error_flags, AsStream(stream));
  });
}

int32_t stepgraph_attention_workspace_bytes(int64_t rows, int64_t heads, int64_t kv_heads,
                                            int64_t seq_len, int64_t head_dim,
                                            int64_t* bytes) noexcept {
  const std::optional<sg::kernels::AttentionShape> s =
      AttentionShapeOf(rows, heads, kv_heads, seq_len, head_dim);
  if (!s || bytes == nullptr) return STEPGRAPH_ERROR_INVALID_VALUE;
  if (!DeviceAvailable()) return STEPGRAPH_ERROR_NO_CUDA;
  int sm_count = 0;
  if (const cudaError_t e = CurrentSmCount(&sm_count); e != cudaSuccess) return ToCode(e);
  const int chunks = sg::kernels::ChooseAttentionChunks(*s, sm_count);
  *bytes = chunks > 1 ? sg::kernels::AttentionWorkspaceBytes(*s, chunks) : 0;
  return STEPGRAPH_OK;
}

int32_t stepgraph_attention(const void* q, const void* k_cache, const void* v_cache,
                            const int32_t* pos, void* out, int64_t rows, int64_t heads,
                            int64_t kv_heads, int64_t slots, int64_t seq_len, int64_t head_dim,
                            float scale, int32_t dtype, void* workspace, int64_t workspace_bytes,
                            uint32_t* error_flags, void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return STEPGRAPH_ERROR_INVALID_VALUE;
  // The kernels read element pairs.
  const int64_t pair = 2 * sg::DTypeBytes(*t);
  const std::optional<sg::kernels::AttentionShape> s =
      AttentionShapeOf(rows, heads, kv_heads, seq_len, head_dim);
  if (!s || !Require()
                 .Buffer(q, pair)
                 .Buffer(k_cache, pair)
                 .Buffer(v_cache, pair)
                 .Buffer(pos, sizeof(int32_t))
                 .Buffer(out, pair)
                 .Buffer(error_flags, sizeof(uint32_t))
                 .Tensor({rows, heads, head_dim})
                 .Tensor({slots, kv_heads, seq_len, head_dim})
                 .That(slots >= rows)
                 .That(std::isfinite(scale))
                 .Workspace(workspace, workspace_bytes)
                 .ok()) {
    return STEPGRAPH_ERROR_INVALID_VALUE;
  }
  return Enqueue([&]() -> cudaError_t {
    int chunks = 1;
    if (workspace != nullptr) {
      int sm_count = 0;
      if (const cudaError_t e = CurrentSmCount(&sm_count); e != cudaSuccess) return e;
      chunks = AttentionChunks(*s, sm_count, workspace_bytes);
    }
    if (chunks > 1) {
      // The launcher wants its per-(row, head) arrival counters, at the workspace's start,
      // zero; clearing them here spares the caller that contract.
      const int64_t counter_bytes = rows * heads * static_cast<int64_t>(sizeof(uint32_t));
      if (const cudaError_t e = cudaMemsetAsync(workspace, 0, static_cast<size_t>(counter_bytes),
                                                AsStream(stream));
          e != cudaSuccess) {
        return e;
      }
    }
    sg::kernels::AttentionArgs a;
    a.q = q;
    a.k_cache = k_cache;
    a.v_cache = v_cache;
    a.pos = pos;
    a.out = out;
    a.scale = scale;
    a.workspace = chunks > 1 ? workspace : nullptr;
    a.error_flags = error_flags;
    return sg::kernels::LaunchAttention(a, *s, chunks, *t, AsStream(stream));
  });
}

int32_t stepgraph_softmax(const void* x, void* y, int64_t rows, int64_t n, int32_t dtype,
                          void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return STEPGRAPH_ERROR_INVALID_VALUE;
  const int64_t elem = sg::DTypeBytes(*t);
  if (!Require().Buffer(x, elem).Buffer(y, elem).Tensor({rows, n}).ok()) {
    return STEPGRAPH_ERROR_INVALID_VALUE;
  }
  return Enqueue(
      [&] { return sg::kernels::LaunchSoftmax(x, y, rows, n, *t, AsStream(stream)); });
}

int32_t stepgraph_argmax_workspace_bytes(int64_t rows, int64_t vocab, int64_t* bytes) noexcept {
  if (bytes == nullptr || !Require()
                               .Tensor({rows, vocab})
                               .AtMost(rows, kMaxGridRows)
                               .AtMost(vocab, INT32_MAX)
                               .ok()) {
    return STEPGRAPH_ERROR_INVALID_VALUE;
  }
  if (!DeviceAvailable()) return STEPGRAPH_ERROR_NO_CUDA;
  int sm_count = 0;
  if (const cudaError_t e = CurrentSmCount(&sm_count); e != cudaSuccess) return ToCode(e);
  const int blocks = sg::kernels::ArgmaxBlocksPerRow(rows, vocab, sm_count);
  *bytes = blocks > 1 ? sg::kernels::ArgmaxWorkspaceBytes(rows) : 0;
  return STEPGRAPH_OK;
}

int32_t stepgraph_argmax(const void* logits, int32_t* ids, int64_t rows, int64_t vocab,
                         int32_t dtype, void* workspace, int64_t workspace_bytes,
                         void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return STEPGRAPH_ERROR_INVALID_VALUE;
  if (!Require()
           .Buffer(logits, sg::DTypeBytes(*t))
           .Buffer(ids, sizeof(int32_t))
           .Tensor({rows, vocab})
           .AtMost(rows, kMaxGridRows)
           .AtMost(vocab, INT32_MAX)
           .Workspace(workspace, workspace_bytes)
           .ok()) {
    return STEPGRAPH_ERROR_INVALID_VALUE;
  }
  return Enqueue([&]() -> cudaError_t {
    const int64_t need = sg::kernels::ArgmaxWorkspaceBytes(rows);
    int blocks = 1;
    if (workspace != nullptr && workspace_bytes >= need) {
      int sm_count = 0;
      if (const cudaError_t e = CurrentSmCount(&sm_count); e != cudaSuccess) return e;
      blocks = sg::kernels::ArgmaxBlocksPerRow(rows, vocab, sm_count);
    }
    if (blocks > 1) {
      // Best keys and arrival counters must start at zero (kernels/sampling.cuh).
      if (const cudaError_t e =
              cudaMemsetAsync(workspace, 0, static_cast<size_t>(need), AsStream(stream));
          e != cudaSuccess) {
        return e;
      }
    }
    return sg::kernels::LaunchArgmax(logits, *t, rows, vocab, blocks,
                                     blocks > 1 ? workspace : nullptr, ids, AsStream(stream));
  });
}

int32_t stepgraph_sample(const void* logits, const int32_t* seeds, const int32_t* pos,
                         int32_t* ids, int64_t rows, int64_t vocab, float temperature,
                         int32_t top_k, float top_p, int32_t dtype, void* stream) noexcept {
  const std::optional<DType> t = ParseDType(dtype, Allowed::kFloat);
  if (!t) return STEPGRAPH_ERROR_INVALID_VALUE;
  if (!Require()
           .Buffer(logits, sg::DTypeBytes(*t))
           .Buffer(seeds, sizeof(int32_t))
           .Buffer(pos, sizeof(int32_t))
           .Buffer(ids, sizeof(int32_t))
           .Tensor({rows, vocab})
           .AtMost(rows, INT32_MAX / kSampleBlocksPerRow)
           .AtMost(vocab, INT32_MAX)
           .That(std::isfinite(temperature) && temperature > 0.0f)
           .That(top_k >= 0)
           .That(top_p > 0.0f && top_p <= 1.0f)  // false for NaN too
           .ok()) {
    return STEPGRAPH_ERROR_INVALID_VALUE;
  }
  sg::kernels::SampleParams params;
  params.temperature = temperature;
  params.top_k = top_k;
  params.top_p = top_p;
  return Enqueue([&] {
    return sg::kernels::LaunchSample(logits, *t, rows, vocab, seeds, pos, params, ids,
                                     AsStream(stream));
  });
}

int32_t stepgraph_copy(const void* src, void* dst, int64_t n, int32_t dtype,
                       void* stream) noexcept {
  const std::optional<DType> t = CheckElementwise({src, dst}, n, dtype, Allowed::kFloatOrI32);
  if (!t) return STEPGRAPH_ERROR_INVALID_VALUE;
  return Enqueue([&] {
    if (src == dst) return cudaSuccess;
    return cudaMemcpyAsync(dst, src, static_cast<size_t>(n * sg::DTypeBytes(*t)),
                           cudaMemcpyDeviceToDevice, AsStream(stream));
  });
}

int32_t stepgraph_advance(int32_t* pos, int64_t n, void* stream) noexcept {
  if (!Require().Buffer(pos, sizeof(int32_t)).Tensor({n}).ok()) {
    return STEPGRAPH_ERROR_INVALID_VALUE;
  }
  return Enqueue([&] { return sg::kernels::LaunchAdvance(pos, n, AsStream(stream)); });
}

}  // extern "C"
