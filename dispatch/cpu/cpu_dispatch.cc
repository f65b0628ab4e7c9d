// The CPU reference. Each Run reads its inputs as f32 rows, computes in f32 and stores in
// the output's dtype. Shapes were checked by inference when the graph was built, so Run
// only re-checks what inference cannot know (values: ids, positions).
#include "stepgraph/dispatch/cpu_dispatch.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/dot.h"
#include "dispatch/cpu/thread_pool.h"
#include "stepgraph/base/half.h"
#include "stepgraph/base/philox.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/base/quant.h"
#include "stepgraph/graph/rope.h"
#include "stepgraph/base/status.h"
#include "stepgraph/dispatch/collectives.h"

namespace sg {
namespace {

// Elements [offset, offset + n) of a tensor, as f32.
std::vector<float> LoadRange(const TensorArg& a, int64_t offset, int64_t n) {
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = LoadElement(a.data, a.dtype, offset + i);
  return out;
}

std::vector<float> LoadAll(const TensorArg& a) { return LoadRange(a, 0, a.shape.NumElements()); }

void StoreRange(const TensorArg& a, int64_t offset, const std::vector<float>& v) {
  for (size_t i = 0; i < v.size(); ++i) StoreElement(a.data, a.dtype, offset + i, v[i]);
}

const int32_t* Ints(const TensorArg& a) { return static_cast<const int32_t*>(a.data); }

float SiluOf(float x) { return x / (1.0f + std::exp(-x)); }

// PyTorch's gelu(approximate="tanh"), in f32.
float GeluTanhOf(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

// Resizes a scratch vector, turning allocation failure into a Status.
absl::Status Resize(std::vector<float>& v, int64_t n, absl::string_view what) {
  try {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("CPU reference: no memory for ", n,
                                                     " floats of ", what));
  }
  return absl::OkStatus();
}

// A whole tensor as contiguous f32: the tensor itself when it is stored in f32, else its
// values converted into `buffer`.
absl::StatusOr<const float*> F32Input(const TensorArg& a, std::vector<float>& buffer) {
  if (a.dtype == DType::kF32) return static_cast<const float*>(a.data);
  const int64_t n = a.shape.NumElements();
  SG_RETURN_IF_ERROR(Resize(buffer, n, a.name));
  for (int64_t i = 0; i < n; ++i) buffer[i] = LoadElement(a.data, a.dtype, i);
  return buffer.data();
}

// Where an op writes its f32 results: the output itself when stored in f32, else
// `buffer`, stored to the output by FinishF32Output.
absl::StatusOr<float*> F32Output(const TensorArg& a, std::vector<float>& buffer) {
  if (a.dtype == DType::kF32) return static_cast<float*>(a.data);
  SG_RETURN_IF_ERROR(Resize(buffer, a.shape.NumElements(), a.name));
  return buffer.data();
}

void FinishF32Output(const TensorArg& a, const float* values) {
  if (a.dtype == DType::kF32) return;
  for (int64_t i = 0; i < a.shape.NumElements(); ++i) StoreElement(a.data, a.dtype, i, values[i]);
}

// n elements of a plain tensor from element `offset`, as f32: in place for f32, else
// converted into `buffer` (n floats).
const float* F32Row(const TensorArg& a, int64_t offset, int64_t n, float* buffer) {
  if (a.dtype == DType::kF32) return static_cast<const float*>(a.data) + offset;
  for (int64_t i = 0; i < n; ++i) buffer[i] = LoadElement(a.data, a.dtype, offset + i);
  return buffer;
}

// Splitting work costs a wake-up per thread; below this many multiply-adds per chunk it
// is not worth it.
constexpr int64_t kMinWorkPerPart = 16384;

int64_t MinItemsPerChunk(int64_t work_per_item) {
  return std::max<int64_t>(1, kMinWorkPerPart / std::max<int64_t>(1, work_per_item));
}

// Rotates every head of `cols` values of one row at position `pos` (padding rows, pos < 0,
// pass through unchanged).
void RotateHeads(const ops::Rope& op, const std::vector<float>& inv_freq, DType t, int32_t pos,
                 float* v, int64_t cols) {
  if (pos < 0) return;
  const int d = op.head_dim, half = d / 2;
  for (int64_t head = 0; head < cols / d; ++head) {
    float* hv = v + head * d;
    for (int j = 0; j < half; ++j) {
      // HF: cos/sin of the f32 angle, cast to the model dtype, then q*cos +
      // rotate_half(q)*sin with each product and the sum in the model dtype.
      const float angle = static_cast<float>(pos) * inv_freq[j];
      const float c = RoundTo(t, std::cos(angle)), s = RoundTo(t, std::sin(angle));
      const int a = op.interleaved ? 2 * j : j;
      const int b = op.interleaved ? 2 * j + 1 : j + half;
      const float x1 = hv[a], x2 = hv[b];
      hv[a] = RoundTo(t, x1 * c) - RoundTo(t, x2 * s);
      hv[b] = RoundTo(t, x2 * c) + RoundTo(t, x1 * s);
    }
  }
}

// ops::RmsNorm of one row of h values of dtype t in place, stored as the op stores them:
// round(round(v·r)·w) with r = 1/sqrt(mean(v²) + eps). The one definition of the rows of
// RmsNorm, HeadRmsNorm and RopeKvWrite's head norms.
void RmsNormInPlace(float* v, int64_t h, const float* w, float eps, DType t) {
  float sum_sq = 0.0f;
  for (int64_t c = 0; c < h; ++c) sum_sq += v[c] * v[c];
  const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(h) + eps);
  // HF: weight * (x * rsqrt(var + eps)).to(input_dtype), the product in input_dtype.
  for (int64_t c = 0; c < h; ++c) v[c] = RoundTo(t, RoundTo(t, v[c] * inv_rms) * w[c]);
}

// A RopeKvWrite's head norms (ops::RopeKvWrite's head_norm): the weights, or none.
struct HeadNorms {
  const float* q = nullptr;
  const float* k = nullptr;
  float eps = 0.0f;
};

// ops::RopeKvWrite over `rows` rows of qkv values given as floats of the storage dtype
// (qkv [rows, cols], q's columns, then k's, then v's): the one definition shared by the
// RopeKvWrite op and FusedMatMul's kRopeKvWrite epilogue. Row i goes to cache slot i.
void RopeKvWriteRows(const ops::Rope& rope, const std::vector<float>& inv_freq,
                     const float* qkv, int64_t rows, int64_t cols, const int32_t* pos,
                     const TensorArg& kc, const TensorArg& vc, const TensorArg& q,
                     std::vector<float>& row, uint32_t& error_flags, HeadNorms norms = {}) {
  const DType t = q.dtype;
  const int64_t kv_heads = kc.shape[1], seq = kc.shape[2], d = kc.shape[3];
  const int64_t kv_cols = kv_heads * d, q_cols = cols - 2 * kv_cols;
  for (int64_t i = 0; i < rows; ++i) {
    row.assign(qkv + i * cols, qkv + (i + 1) * cols);
    if (norms.q != nullptr) {
      for (int64_t c = 0; c < q_cols + kv_cols; c += d) {
        RmsNormInPlace(row.data() + c, d, c < q_cols ? norms.q : norms.k, norms.eps, t);
      }
    }
    RotateHeads(rope, inv_freq, t, pos[i], row.data(), q_cols + kv_cols);
    for (int64_t c = 0; c < q_cols; ++c) StoreElement(q.data, t, i * q_cols + c, row[c]);
    if (pos[i] < 0) continue;
    if (pos[i] >= seq) {
      error_flags |= kErrorPositionOutOfRange;
      continue;
    }
    for (int64_t h = 0; h < kv_heads; ++h) {
      const int64_t dst = ((i * kv_heads + h) * seq + pos[i]) * d;
      for (int64_t e = 0; e < d; ++e) {
        StoreElement(kc.data, t, dst + e, row[q_cols + h * d + e]);
        StoreElement(vc.data, t, dst + e, row[q_cols + kv_cols + h * d + e]);
      }
    }
  }
}

}  // namespace

namespace {
// A Rope node's frequency table, computed once per plan.
struct CpuRopeNode final : PreparedState<CpuRopeNode> {
  std::vector<float> inv_freq;
};

// The frequency table Prepare made, checked by type, or for a Run without preparation one
// computed now into `unprepared`.
absl::StatusOr<const std::vector<float>*> InvFreqOf(const ops::Rope& rope, const NodeArgs& args,
                                                    std::vector<float>& unprepared) {
  if (args.prepared == nullptr) {
    unprepared = RopeInvFreq(rope);
    return &unprepared;
  }
  SG_ASSIGN_OR_RETURN(const CpuRopeNode* node, args.PreparedAs<CpuRopeNode>());
  return &node->inv_freq;
}
}  // namespace

CpuDispatch::CpuDispatch() : CpuDispatch(Options{}) {}

CpuDispatch::CpuDispatch(Options options)
    : pool_(std::make_unique<cpu::ThreadPool>(options.threads)),
      collectives_(options.collectives),
      rank_(options.rank) {}

CpuDispatch::~CpuDispatch() = default;

int CpuDispatch::threads() const { return pool_->size(); }

absl::Status CpuDispatch::PrepareScratch(int64_t floats_per_thread) {
  try {
    scratch_.resize(pool_->size());
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("CPU reference: no memory for scratch rows");
  }
  for (std::vector<float>& v : scratch_) {
    SG_RETURN_IF_ERROR(Resize(v, floats_per_thread, "scratch rows"));
  }
  return absl::OkStatus();
}


absl::StatusOr<PreparedPlan> CpuDispatch::Prepare(const ExecutionPlan& plan) {
  const Graph& graph = plan.graph();
  std::vector<std::unique_ptr<PreparedNode>> nodes(static_cast<size_t>(graph.num_nodes()));
  for (int32_t i = 0; i < graph.num_nodes(); ++i) {
    const ops::Rope* rope = std::get_if<ops::Rope>(&graph.nodes()[i].op);
    if (const auto* fused = std::get_if<ops::RopeKvWrite>(&graph.nodes()[i].op)) {
      rope = &fused->rope;
    }
    if (const auto* mm = std::get_if<ops::FusedMatMul>(&graph.nodes()[i].op);
        mm != nullptr && mm->epilogue == ops::FusedMatMul::Epilogue::kRopeKvWrite) {
      rope = &mm->rope;
    }
    if (rope != nullptr) {
      auto node = std::make_unique<CpuRopeNode>();
      node->inv_freq = RopeInvFreq(*rope);
      nodes[i] = std::move(node);
    }
  }
  return PreparedPlan(plan, *this, std::move(nodes));
}

absl::Status CpuDispatch::Run(const ops::Embedding&, const NodeArgs& args) {
  const TensorArg& table = args.inputs[0];
  const int64_t vocab = table.shape[0], hidden = table.shape[1];
  const int32_t* ids = Ints(args.inputs[1]);
  std::vector<float> row(hidden);
  for (int64_t i = 0; i < args.output.shape[0]; ++i) {
    if (ids[i] >= 0 && ids[i] < vocab) {
      if (IsQuantized(table.dtype)) {
        // The row's blocks dequantized, then rounded to the output dtype on store.
        const int64_t row_bytes = DTypeRowBytes(table.dtype, hidden);
        DequantizeRow(table.dtype, static_cast<const std::byte*>(table.data) + ids[i] * row_bytes,
                      row.data(), hidden);
      } else {
        for (int64_t c = 0; c < hidden; ++c) {
          row[c] = LoadElement(table.data, table.dtype, ids[i] * hidden + c);
        }
      }
    } else {
      std::fill(row.begin(), row.end(), 0.0f);
      error_flags_ |= kErrorTokenOutOfRange;
    }
    StoreRange(args.output, i * hidden, row);
  }
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::MatMul& op, const NodeArgs& args) {
  const TensorArg& x = args.inputs[0];
  const TensorArg& w = args.inputs[1];
  const int64_t m = x.shape[0], k = x.shape[1], n = w.shape[0];
  SG_ASSIGN_OR_RETURN(const float* xs, F32Input(x, x_f32_));
  SG_ASSIGN_OR_RETURN(float* out, F32Output(args.output, out_f32_));
  const std::vector<float> bias = op.has_bias ? LoadAll(args.inputs[2]) : std::vector<float>();
  const bool quantized = IsQuantized(w.dtype);
  const int64_t w_row_bytes = DTypeRowBytes(w.dtype, k);
  SG_RETURN_IF_ERROR(PrepareScratch(quantized ? 0 : k));
  // Chunks of whole output columns j (all m rows of them): a
  // weight row is read once per step whatever m is.
  pool_->ParallelFor(n, MinItemsPerChunk(m * k), [&](int thread, int64_t j0, int64_t j1) {
    const auto* w_bytes = static_cast<const std::byte*>(w.data);
    if (quantized) {
      DotQuantizedRows(w.dtype, w_bytes + j0 * w_row_bytes, j1 - j0, k, xs, k, m, out + j0, n);
    }
    for (int64_t j = j0; j < j1; ++j) {
      if (!quantized) {
        const float* wj = F32Row(w, j * k, k, scratch_[thread].data());
        for (int64_t i = 0; i < m; ++i) out[i * n + j] = cpu::Dot(xs + i * k, wj, k);
      }
      if (op.has_bias) {
        for (int64_t i = 0; i < m; ++i) out[i * n + j] += bias[j];
      }
    }
  });
  FinishF32Output(args.output, out);
  return absl::OkStatus();
}

namespace {
// ops::RmsNorm over `rows` rows of h values (HeadRmsNorm: every head is such a row).
void RmsNormRows(const TensorArg& x, const TensorArg& out, const std::vector<float>& w,
                 int64_t rows, int64_t h, float eps) {
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<float> v = LoadRange(x, i * h, h);
    RmsNormInPlace(v.data(), h, w.data(), eps, x.dtype);
    StoreRange(out, i * h, v);
  }
}
}  // namespace

absl::Status CpuDispatch::Run(const ops::HeadRmsNorm& op, const NodeArgs& args) {
  const TensorArg& x = args.inputs[0];
  const int64_t d = args.inputs[1].shape[0];
  // x [M, n·d] is [M·n, d] in memory.
  RmsNormRows(x, args.output, LoadAll(args.inputs[1]), x.shape.NumElements() / d, d, op.eps);
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::GeluTanhMul&, const NodeArgs& args) {
  std::vector<float> g = LoadAll(args.inputs[0]);
  const std::vector<float> u = LoadAll(args.inputs[1]);
  for (size_t i = 0; i < g.size(); ++i) g[i] = GeluTanhOf(g[i]) * u[i];
  StoreRange(args.output, 0, g);
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::Scale& op, const NodeArgs& args) {
  std::vector<float> x = LoadAll(args.inputs[0]);
  const float factor = RoundTo(args.output.dtype, op.factor);
  for (float& v : x) v *= factor;
  StoreRange(args.output, 0, x);
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::Softcap& op, const NodeArgs& args) {
  std::vector<float> x = LoadAll(args.inputs[0]);
  for (float& v : x) v = op.cap * std::tanh(v / op.cap);
  StoreRange(args.output, 0, x);
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::RmsNorm& op, const NodeArgs& args) {
  const TensorArg& x = args.inputs[0];
  RmsNormRows(x, args.output, LoadAll(args.inputs[1]), x.shape[0], x.shape[1], op.eps);
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::Add&, const NodeArgs& args) {
  const int64_t n = args.output.shape.NumElements();
  if (args.output.dtype == DType::kI32) {
    const int32_t* a = Ints(args.inputs[0]);
    const int32_t* b = Ints(args.inputs[1]);
    int32_t* out = args.output.as<int32_t>();
    for (int64_t i = 0; i < n; ++i) {
      out[i] = static_cast<int32_t>(static_cast<uint32_t>(a[i]) + static_cast<uint32_t>(b[i]));
    }
    return absl::OkStatus();
  }
  std::vector<float> a = LoadAll(args.inputs[0]);
  const std::vector<float> b = LoadAll(args.inputs[1]);
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
  StoreRange(args.output, 0, a);
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::Mul&, const NodeArgs& args) {
  std::vector<float> a = LoadAll(args.inputs[0]);
  const std::vector<float> b = LoadAll(args.inputs[1]);
  for (size_t i = 0; i < a.size(); ++i) a[i] *= b[i];
  StoreRange(args.output, 0, a);
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::Silu&, const NodeArgs& args) {
  std::vector<float> x = LoadAll(args.inputs[0]);
  for (float& v : x) v = SiluOf(v);
  StoreRange(args.output, 0, x);
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::SiluMul&, const NodeArgs& args) {
  std::vector<float> g = LoadAll(args.inputs[0]);
  const std::vector<float> u = LoadAll(args.inputs[1]);
  for (size_t i = 0; i < g.size(); ++i) g[i] = SiluOf(g[i]) * u[i];
  StoreRange(args.output, 0, g);
  return absl::OkStatus();
}

// Element by element: every step from the stored values of its operands, rounded to the
// dtype as the plain op's output is stored (RoundTo is the identity for f32).
absl::Status CpuDispatch::Run(const ops::FusedElementwise& op, const NodeArgs& args) {
  using Kind = ops::FusedElementwise::Kind;
  const int n_in = static_cast<int>(args.inputs.size());
  const DType t = args.output.dtype;
  const int64_t count = args.output.shape.NumElements();
  float v[ops::FusedElementwise::kMaxInputs + ops::FusedElementwise::kMaxSteps];
  for (int64_t e = 0; e < count; ++e) {
    for (int i = 0; i < n_in; ++i) v[i] = LoadElement(args.inputs[i].data, args.inputs[i].dtype, e);
    for (int s = 0; s < op.num_steps; ++s) {
      const ops::FusedElementwise::Step& st = op.steps[s];
      const float a = v[st.a], b = v[st.b];
      float r = 0.0f;
      switch (st.kind) {
        case Kind::kAdd: r = a + b; break;
        case Kind::kMul: r = a * b; break;
        case Kind::kSilu: r = SiluOf(a); break;
        case Kind::kSiluMul: r = SiluOf(a) * b; break;
      }
      v[n_in + s] = RoundTo(t, r);
    }
    StoreElement(args.output.data, t, e, v[n_in + op.num_steps - 1]);
  }
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::Rope& op, const NodeArgs& args) {
  const TensorArg& x = args.inputs[0];
  const DType t = x.dtype;
  const int32_t* pos = Ints(args.inputs[1]);
  const int64_t rows = x.shape[0], cols = x.shape[1];
  // Prepared once per plan; a Run without preparation computes the table itself.
  std::vector<float> unprepared;
  SG_ASSIGN_OR_RETURN(const std::vector<float>* table, InvFreqOf(op, args, unprepared));
  const std::vector<float>& inv_freq = *table;
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<float> v = LoadRange(x, i * cols, cols);
    RotateHeads(op, inv_freq, t, pos[i], v.data(), cols);
    StoreRange(args.output, i * cols, v);
  }
  return absl::OkStatus();
}

namespace {
// The KV-cache slot of row i: i itself in a decode step, seq_slots[i / T] in a prefill
// step of T rows per sequence. -1 when the slot is outside [0, slots).
struct RowSlots {
  const int32_t* seq_slots = nullptr;  // null: row i is slot i
  int64_t rows_per_seq = 1;
  int64_t slots = 0;
  int64_t operator()(int64_t i) const {
    const int64_t s = seq_slots == nullptr ? i : seq_slots[i / rows_per_seq];
    return s >= 0 && s < slots ? s : -1;
  }
};
RowSlots RowSlotsOf(bool has_slots, const TensorArg* seq_slots, int64_t rows, int64_t slots) {
  RowSlots r;
  r.slots = slots;
  if (has_slots) {
    r.seq_slots = Ints(*seq_slots);
    r.rows_per_seq = rows / seq_slots->shape[0];
  }
  return r;
}
}  // namespace

absl::Status CpuDispatch::Run(const ops::KvWrite& op, const NodeArgs& args) {
  const TensorArg& kv = args.inputs[0];
  const int32_t* pos = Ints(args.inputs[1]);
  const TensorArg& cache = args.output;
  const int64_t kv_heads = cache.shape[1], seq = cache.shape[2], d = cache.shape[3];
  const int64_t elem = DTypeBytes(cache.dtype);
  const RowSlots slot_of = RowSlotsOf(op.has_slots, op.has_slots ? &args.inputs[2] : nullptr,
                                      kv.shape[0], cache.shape[0]);
  for (int64_t i = 0; i < kv.shape[0]; ++i) {
    if (pos[i] < 0) continue;
    const int64_t slot = slot_of(i);
    if (pos[i] >= seq || slot < 0) {
      error_flags_ |= kErrorPositionOutOfRange;
      continue;
    }
    for (int64_t h = 0; h < kv_heads; ++h) {
      const char* src = static_cast<const char*>(kv.data) + (i * kv_heads * d + h * d) * elem;
      char* dst =
          static_cast<char*>(cache.data) + (((slot * kv_heads + h) * seq + pos[i]) * d) * elem;
      std::memcpy(dst, src, d * elem);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::Attention& op, const NodeArgs& args) {
  const TensorArg& q = args.inputs[0];
  const TensorArg& kc = args.inputs[1];
  const TensorArg& vc = args.inputs[2];
  const int32_t* pos = Ints(args.inputs[3]);
  const int64_t rows = q.shape[0];
  const int64_t kv_heads = kc.shape[1], seq = kc.shape[2], d = kc.shape[3];
  const int64_t heads = q.shape[1] / d, group = heads / kv_heads;
  const RowSlots slot_of =
      RowSlotsOf(op.has_slots, op.has_slots ? &args.inputs[4] : nullptr, rows, kc.shape[0]);
  for (int64_t i = 0; i < rows; ++i) {
    if (pos[i] >= seq || (pos[i] >= 0 && slot_of(i) < 0)) error_flags_ |= kErrorPositionOutOfRange;
  }
  SG_ASSIGN_OR_RETURN(const float* qs, F32Input(q, x_f32_));
  SG_ASSIGN_OR_RETURN(float* out, F32Output(args.output, out_f32_));
  // Per thread: the scores of one (row, head) and a K and a V row converted to f32.
  SG_RETURN_IF_ERROR(PrepareScratch(seq + 2 * d));
  // Chunks of whole (row, head) pairs, each computed start to end by one thread. The work
  // of a pair follows its position, so a prefill step's later rows cost more; chunks are
  // sized by the longest row.
  int64_t longest = 1;
  for (int64_t i = 0; i < rows; ++i) longest = std::max<int64_t>(longest, pos[i] + 1);
  longest = std::min(longest, seq);
  pool_->ParallelFor(rows * heads, MinItemsPerChunk(longest * d), [&](int thread, int64_t p0, int64_t p1) {
    float* scores = scratch_[thread].data();
    float* k_buf = scores + seq;
    float* v_buf = k_buf + d;
    for (int64_t pair = p0; pair < p1; ++pair) {
      const int64_t i = pair / heads, h = pair % heads;
      float* o = out + i * heads * d + h * d;
      std::fill(o, o + d, 0.0f);
      const int64_t slot = slot_of(i);
      // Padding, or a position or slot out of range: zeros.
      if (pos[i] < 0 || pos[i] >= seq || slot < 0) continue;
      // Keys first .. pos[i]: all of them, or the last `window` with a sliding window.
      const int64_t first = op.window > 0 ? std::max<int64_t>(0, pos[i] - op.window + 1) : 0;
      const int64_t len = pos[i] + 1 - first;
      const float* qh = qs + i * heads * d + h * d;
      const int64_t base = (slot * kv_heads + h / group) * seq * d + first * d;
      float max_score = -std::numeric_limits<float>::infinity();
      for (int64_t t = 0; t < len; ++t) {
        float score = cpu::Dot(qh, F32Row(kc, base + t * d, d, k_buf), d) * op.scale;
        if (op.softcap > 0.0f) score = op.softcap * std::tanh(score / op.softcap);
        scores[t] = score;
        max_score = std::max(max_score, scores[t]);
      }
      float denom = 0.0f;
      for (int64_t t = 0; t < len; ++t) {
        scores[t] = std::exp(scores[t] - max_score);
        denom += scores[t];
      }
      for (int64_t t = 0; t < len; ++t) {
        cpu::Axpy(scores[t] / denom, F32Row(vc, base + t * d, d, v_buf), o, d);
      }
    }
  });
  FinishF32Output(args.output, out);
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::Softmax&, const NodeArgs& args) {
  const int64_t rows = args.output.shape[0], n = args.output.shape[1];
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<float> v = LoadRange(args.inputs[0], i * n, n);
    const float mx = *std::max_element(v.begin(), v.end());
    // The denominator in double: a vocabulary row summed one by one in f32 drifts by
    // ~1e-4, more than any kernel that reduces in a tree, and the reference is the spec.
    double sum = 0.0;
    for (float& e : v) {
      e = std::exp(e - mx);
      sum += e;
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (float& e : v) e *= inv;
    StoreRange(args.output, i * n, v);
  }
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::Argmax&, const NodeArgs& args) {
  const TensorArg& x = args.inputs[0];
  const int64_t rows = x.shape[0], n = x.shape[1];
  int32_t* out = args.output.as<int32_t>();
  for (int64_t i = 0; i < rows; ++i) {
    // Strictly greater wins, so the lowest index is kept among equal maxima; NaN never
    // wins, and a row of NaN or -inf gives 0. -inf is an id masked out (ops::Penalize's
    // min-p), not a fault.
    float best = -std::numeric_limits<float>::infinity();
    int32_t best_index = 0;
    bool finite = true;
    for (int64_t j = 0; j < n; ++j) {
      const float v = LoadElement(x.data, x.dtype, i * n + j);
      finite = finite && v < std::numeric_limits<float>::infinity();
      if (v > best) {
        best = v;
        best_index = static_cast<int32_t>(j);
      }
    }
    out[i] = best_index;
    // The id is still defined, but a NaN or +inf means the model broke: the step says so
    // rather than printing plausible ids.
    if (!finite) error_flags_ |= kErrorNonFiniteLogits;
  }
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::Sample& op, const NodeArgs& args) {
  const TensorArg& logits = args.inputs[0];
  const int32_t* seeds = Ints(args.inputs[1]);
  const int32_t* pos = Ints(args.inputs[2]);
  const int64_t rows = logits.shape[0], n = logits.shape[1];
  int32_t* out = args.output.as<int32_t>();
  // Below kGreedyTemperature the draw is the argmax, the limit softmax(z / T) tends to:
  // 1 / T would overflow float there (1e-40 is a denormal) and the probabilities would be
  // NaN. The same threshold is kernels/sampling.cu's and c_session.h's
  // STEPGRAPH_SESSION_MIN_TEMPERATURE.
  constexpr float kGreedyTemperature = 1e-5f;
  const bool greedy = op.temperature < kGreedyTemperature;
  const float temperature = greedy ? 1.0f : op.temperature;
  const int64_t top_k = greedy ? 1 : op.top_k;
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<float> z = LoadRange(logits, i * n, n);
    for (float& v : z) {
      v /= temperature;
      // -inf (read, or a very negative logit / T) is an id that cannot be drawn.
      if (v < std::numeric_limits<float>::infinity()) continue;
      // A NaN or +inf, read or made by the division (a finite logit / T past the float
      // range), means the model or the settings broke: the step says so.
      error_flags_ |= kErrorNonFiniteLogits;
      // NaN counts as -inf (as on the GPU), which also keeps the sort below well defined.
      if (std::isnan(v)) v = -std::numeric_limits<float>::infinity();
    }
    // Candidates by value, descending; equal values by index, ascending.
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return z[a] > z[b]; });
    int64_t keep = n;
    if (top_k > 0) keep = std::min<int64_t>(keep, top_k);
    const float mx = z[order[0]];
    // All -inf, an infinite maximum (where exp(z - mx) would be NaN), or one candidate:
    // the top token, as Argmax and the GPU take it.
    if (!std::isfinite(mx) || keep == 1) {
      out[i] = order[0];
      continue;
    }
    std::vector<float> p(keep);
    float total = 0.0f;
    for (int64_t r = 0; r < keep; ++r) {
      p[r] = std::exp(z[order[r]] - mx);
      total += p[r];
    }
    if (op.top_p < 1.0f) {
      // The smallest prefix whose mass reaches top_p.
      float cum = 0.0f;
      int64_t r = 0;
      while (r < keep) {
        cum += p[r++];
        if (cum >= op.top_p * total) break;
      }
      keep = r;
    }
    // Draw over the kept tokens in index order. Their mass is summed in that same order,
    // so the running sum below ends exactly at `mass`; as u < 1 gives u·mass < mass, the
    // draw always stops, and on a token of nonzero probability. A mass summed in another
    // order may exceed the running sum by a few ulps, and u near 1 would then run off the
    // end onto whichever token is last, whatever its probability.
    std::vector<int32_t> kept(order.begin(), order.begin() + keep);
    std::vector<float> kept_p(p.begin(), p.begin() + keep);
    std::vector<int64_t> by_index(keep);
    std::iota(by_index.begin(), by_index.end(), 0);
    std::sort(by_index.begin(), by_index.end(),
              [&](int64_t a, int64_t b) { return kept[a] < kept[b]; });
    float mass = 0.0f;
    for (int64_t r = 0; r < keep; ++r) mass += kept_p[by_index[r]];
    const float target = SampleUniform(seeds[i], pos[i]) * mass;
    float cum = 0.0f;
    int32_t choice = kept[0];  // unreachable: the loop always chooses
    for (int64_t r = 0; r < keep; ++r) {
      cum += kept_p[by_index[r]];
      if (cum > target) {
        choice = kept[by_index[r]];
        break;
      }
    }
    out[i] = choice;
  }
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::Penalize&, const NodeArgs& args) {
  const TensorArg& logits = args.inputs[0];
  const float* params = static_cast<const float*>(args.inputs[1].data);
  const int32_t* counts = Ints(args.inputs[2]);
  const int64_t rows = logits.shape[0], n = logits.shape[1];
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<float> l = LoadRange(logits, i * n, n);
    const float* p = params + i * ops::kPenaltyParams;
    const float rep = p[ops::kPenaltyRepetition], presence = p[ops::kPenaltyPresence];
    const float frequency = p[ops::kPenaltyFrequency], margin = p[ops::kPenaltyMinPMargin];
    const float nb = p[ops::kPenaltyBiasCount];
    const int biases = nb > 0.0f ? static_cast<int>(std::min<float>(nb, ops::kMaxLogitBias)) : 0;
    const bool min_p = margin > -std::numeric_limits<float>::infinity();
    if (rep != 1.0f || presence != 0.0f || frequency != 0.0f) {
      const int32_t* c = counts + i * n;
      for (int64_t v = 0; v < n; ++v) {
        if (c[v] == 0) continue;
        l[v] = l[v] > 0.0f ? l[v] / rep : l[v] * rep;
        const int32_t g = c[v] >> 1;
        if (g > 0) l[v] = l[v] - (presence + frequency * static_cast<float>(g));
      }
    }
    for (int j = 0; j < biases; ++j) {
      const float id = p[ops::kPenaltyBiasFirst + 2 * j];
      if (!(id >= 0.0f && id < static_cast<float>(n))) continue;  // NaN too
      const int64_t v = static_cast<int64_t>(id);
      l[v] = l[v] + p[ops::kPenaltyBiasFirst + 2 * j + 1];
    }
    if (min_p) {
      float mx = -std::numeric_limits<float>::infinity();
      for (float x : l) mx = x > mx ? x : mx;  // NaN never wins
      for (float& x : l) {
        if (x - mx < margin) x = -std::numeric_limits<float>::infinity();
      }
    }
    StoreRange(args.output, i * n, l);
  }
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::CountIds&, const NodeArgs& args) {
  const int32_t* ids = Ints(args.inputs[0]);
  const int32_t* pos = Ints(args.inputs[1]);
  int32_t* counts = args.output.as<int32_t>();
  const int64_t rows = args.inputs[0].shape[0], n = args.output.shape[1];
  for (int64_t i = 0; i < rows; ++i) {
    if (pos[i] < 0) continue;
    if (ids[i] < 0 || ids[i] >= n) {
      error_flags_ |= kErrorTokenOutOfRange;
      continue;
    }
    int32_t& c = counts[i * n + ids[i]];
    if (c <= std::numeric_limits<int32_t>::max() - 2) c += 2;  // saturates, never wraps
  }
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::Copy&, const NodeArgs& args) {
  if (args.inputs[0].data != args.output.data) {
    std::memmove(args.output.data, args.inputs[0].data, args.output.bytes());
  }
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::Advance&, const NodeArgs& args) {
  int32_t* pos = args.output.as<int32_t>();
  for (int64_t i = 0; i < args.output.shape[0]; ++i) {
    if (pos[i] < 0) continue;
    // The last position cannot advance: it stays, and the step says so, instead of
    // wrapping to a negative position that would read as padding.
    if (pos[i] == std::numeric_limits<int32_t>::max()) {
      error_flags_ |= kErrorPositionOutOfRange;
    } else {
      ++pos[i];
    }
  }
  return absl::OkStatus();
}

// ---- Fused ops: each computes what its plain ops compute, with the same roundings, so
// that a fused graph is bit-equal to the plain one on this reference.

absl::Status CpuDispatch::Run(const ops::FusedMatMul& op, const NodeArgs& args) {
  using Epilogue = ops::FusedMatMul::Epilogue;
  const TensorArg& x = args.inputs[0];
  const DType t = x.dtype;
  const int64_t m = x.shape[0], k = x.shape[1];
  const int first_w = op.norm ? 2 : 1;
  std::vector<float> xs, p;
  std::vector<int64_t> col_start(static_cast<size_t>(op.weights) + 1, 0);
  try {
    xs = LoadAll(x);
    for (int g = 0; g < op.weights; ++g) {
      col_start[g + 1] = col_start[g] + args.inputs[first_w + g].shape[0];
    }
    p.resize(static_cast<size_t>(m * col_start[op.weights]));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("CPU reference: no memory for a fused matmul");
  }
  const int64_t n = col_start[op.weights];
  if (op.norm) {
    // As ops::RmsNorm computes and stores it.
    const std::vector<float> nw = LoadAll(args.inputs[1]);
    for (int64_t i = 0; i < m; ++i) {
      float* v = xs.data() + i * k;
      float sum_sq = 0.0f;
      for (int64_t c = 0; c < k; ++c) sum_sq += v[c] * v[c];
      const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(k) + op.eps);
      for (int64_t c = 0; c < k; ++c) v[c] = RoundTo(t, RoundTo(t, v[c] * inv_rms) * nw[c]);
    }
  }
  SG_RETURN_IF_ERROR(PrepareScratch(k));
  // As ops::MatMul: whole output columns per chunk, each column of weight g's row r.
  pool_->ParallelFor(n, MinItemsPerChunk(m * k), [&](int thread, int64_t j0, int64_t j1) {
    int g = 0;
    for (int64_t j = j0; j < j1; ++j) {
      while (j >= col_start[g + 1]) ++g;
      const TensorArg& w = args.inputs[first_w + g];
      const int64_t r = j - col_start[g];
      if (IsQuantized(w.dtype)) {
        // The chunk's rows of this weight in one call.
        const int64_t rows = std::min(j1, col_start[g + 1]) - j;
        const auto* w_bytes = static_cast<const std::byte*>(w.data);
        DotQuantizedRows(w.dtype, w_bytes + r * DTypeRowBytes(w.dtype, k), rows, k, xs.data(),
                         k, m, p.data() + j, n);
        j += rows - 1;
      } else {
        const float* wr = F32Row(w, r * k, k, scratch_[thread].data());
        for (int64_t i = 0; i < m; ++i) p[i * n + j] = cpu::Dot(xs.data() + i * k, wr, k);
      }
    }
  });
  // The product as a MatMul stores it.
  for (float& v : p) v = RoundTo(t, v);
  switch (op.epilogue) {
    case Epilogue::kNone:
      StoreRange(args.output, 0, p);
      break;
    case Epilogue::kAdd: {
      const TensorArg& residual = args.inputs[first_w + op.weights];
      for (int64_t e = 0; e < m * n; ++e) p[e] = LoadElement(residual.data, t, e) + p[e];
      StoreRange(args.output, 0, p);
      break;
    }
    case Epilogue::kSiluMul: {
      const int64_t half = n / 2;
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < half; ++j) {
          const float v = SiluOf(p[i * n + j]) * p[i * n + half + j];
          StoreElement(args.output.data, t, i * half + j, v);
        }
      }
      break;
    }
    case Epilogue::kRopeKvWrite: {
      // As ops::RopeKvWrite reading p from its qkv input.
      const int first_extra = first_w + op.weights;
      std::vector<float> unprepared, row;
      absl::StatusOr<const std::vector<float>*> table;
      try {
        table = InvFreqOf(op.rope, args, unprepared);
        row.reserve(static_cast<size_t>(n));
      } catch (const std::bad_alloc&) {
        return absl::ResourceExhaustedError("CPU reference: no memory for a fused matmul");
      }
      if (!table.ok()) return table.status();
      const std::vector<float>& inv_freq = **table;
      RopeKvWriteRows(op.rope, inv_freq, p.data(), m, n, Ints(args.inputs[first_extra]),
                      args.inputs[first_extra + 1], args.inputs[first_extra + 2], args.output,
                      row, error_flags_);
      break;
    }
    case Epilogue::kArgmax: {
      int32_t* out = args.output.as<int32_t>();
      for (int64_t i = 0; i < m; ++i) {
        // As ops::Argmax: strictly greater wins, NaN never does.
        float best = -std::numeric_limits<float>::infinity();
        int32_t best_index = 0;
        for (int64_t j = 0; j < n; ++j) {
          if (p[i * n + j] > best) {
            best = p[i * n + j];
            best_index = static_cast<int32_t>(j);
          }
        }
        out[i] = best_index;
      }
      break;
    }
  }
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::RopeKvWrite& op, const NodeArgs& args) {
  const TensorArg& qkv = args.inputs[0];
  std::vector<float> values, unprepared, row, q_norm, k_norm;
  absl::StatusOr<const std::vector<float>*> table;
  try {
    values = LoadAll(qkv);
    if (op.head_norm) {
      q_norm = LoadAll(args.inputs[4]);
      k_norm = LoadAll(args.inputs[5]);
    }
    table = InvFreqOf(op.rope, args, unprepared);
    row.reserve(static_cast<size_t>(qkv.shape[1]));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("CPU reference: no memory for a RoPE + KV write");
  }
  if (!table.ok()) return table.status();
  const std::vector<float>& inv_freq = **table;
  RopeKvWriteRows(op.rope, inv_freq, values.data(), qkv.shape[0], qkv.shape[1],
                  Ints(args.inputs[1]), args.inputs[2], args.inputs[3], args.output, row,
                  error_flags_,
                  op.head_norm ? HeadNorms{q_norm.data(), k_norm.data(), op.eps} : HeadNorms{});
  return absl::OkStatus();
}

// ---- Mixture of experts.

absl::Status CpuDispatch::Run(const ops::MoeTopK& op, const NodeArgs& args) {
  const TensorArg& logits = args.inputs[0];
  const int64_t rows = logits.shape[0], experts = logits.shape[1];
  int32_t* out = args.output.as<int32_t>();
  std::vector<int32_t> order;
  std::vector<float> z;
  try {
    order.resize(static_cast<size_t>(experts));
    z.resize(static_cast<size_t>(experts));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("CPU reference: no memory for a top-k");
  }
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t e = 0; e < experts; ++e) {
      z[e] = LoadElement(logits.data, logits.dtype, i * experts + e);
    }
    std::iota(order.begin(), order.end(), 0);
    // Largest first, NaN above every number (torch.topk); equal values by index.
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      if (std::isnan(z[b])) return false;
      return std::isnan(z[a]) || z[a] > z[b];
    });
    std::copy_n(order.begin(), op.top_k, out + i * op.top_k);
  }
  return absl::OkStatus();
}

namespace {

// Row i's routing weights (MoeRouteWeights' definition) into w[0 .. top_k); false when
// an id is out of range (its weight 0).
bool RouteWeightsOfRow(const TensorArg& logits, int64_t i, const int32_t* ids, int64_t top_k,
                       bool renormalize, bool round_to_dtype, float* w) {
  const int64_t experts = logits.shape[1];
  const std::vector<float> z = LoadRange(logits, i * experts, experts);
  // transformers: softmax(router_logits, dtype=float) over every expert.
  float mx = -std::numeric_limits<float>::infinity();
  for (float v : z) mx = std::max(mx, v);
  float total = 0.0f;
  for (float v : z) total += std::exp(v - mx);
  bool ok = true;
  float chosen = 0.0f;
  for (int64_t j = 0; j < top_k; ++j) {
    const int32_t e = ids[j];
    w[j] = 0.0f;
    if (e < 0 || e >= experts) {
      ok = false;
      continue;
    }
    w[j] = std::exp(z[e] - mx) / total;
    chosen += w[j];
  }
  for (int64_t j = 0; j < top_k; ++j) {
    const float v = renormalize ? w[j] / chosen : w[j];
    w[j] = round_to_dtype ? RoundTo(logits.dtype, v) : v;
  }
  return ok;
}

}  // namespace

absl::Status CpuDispatch::Run(const ops::MoeRouteWeights& op, const NodeArgs& args) {
  const TensorArg& logits = args.inputs[0];
  const int64_t rows = logits.shape[0];
  const int64_t top_k = args.inputs[1].shape[1];
  const int32_t* ids = Ints(args.inputs[1]);
  for (int64_t i = 0; i < rows; ++i) {
    if (!RouteWeightsOfRow(logits, i, ids + i * top_k, top_k, op.renormalize,
                           op.round_to_dtype, args.output.as<float>() + i * top_k)) {
      error_flags_ |= kErrorExpertOutOfRange;
    }
  }
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::MoeMatMul& op, const NodeArgs& args) {
  const TensorArg& x = args.inputs[0];
  const TensorArg& ids_arg = args.inputs[op.silu_mul ? 3 : 2];
  SG_ASSIGN_OR_RETURN(const float* xs, F32Input(x, x_f32_));
  if (!op.silu_mul) {
    SG_ASSIGN_OR_RETURN(float* out, F32Output(args.output, out_f32_));
    SG_RETURN_IF_ERROR(MoeProducts(x, xs, args.inputs[1], ids_arg, out));
    FinishF32Output(args.output, out);
    return absl::OkStatus();
  }
  // silu_mul: both products as MoeMatMul stores them, then SiluMul's value.
  std::vector<float> gate, up;
  try {
    gate.resize(static_cast<size_t>(args.output.shape.NumElements()));
    up.resize(gate.size());
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("CPU reference: no memory for a MoE gate/up product");
  }
  SG_RETURN_IF_ERROR(MoeProducts(x, xs, args.inputs[1], ids_arg, gate.data()));
  SG_RETURN_IF_ERROR(MoeProducts(x, xs, args.inputs[2], ids_arg, up.data()));
  const DType t = args.output.dtype;
  for (size_t i = 0; i < gate.size(); ++i) {
    gate[i] = SiluOf(RoundTo(t, gate[i])) * RoundTo(t, up[i]);
  }
  StoreRange(args.output, 0, gate);
  return absl::OkStatus();
}

absl::Status CpuDispatch::MoeProducts(const TensorArg& x, const float* xs, const TensorArg& w,
                                      const TensorArg& ids_arg, float* out) {
  const int64_t m = x.shape[0], experts = w.shape[0], n = w.shape[1], k = w.shape[2];
  const int64_t top_k = ids_arg.shape[1];
  const bool per_slot = x.shape[1] != k;
  const int32_t* ids = Ints(ids_arg);
  for (int64_t s = 0; s < m * top_k; ++s) {
    if (ids[s] < 0 || ids[s] >= experts) error_flags_ |= kErrorExpertOutOfRange;
  }
  const bool quantized = IsQuantized(w.dtype);
  const int64_t w_row_bytes = DTypeRowBytes(w.dtype, k);
  SG_RETURN_IF_ERROR(PrepareScratch(quantized ? 0 : k));
  // One (row, chosen expert) pair per item: only the chosen experts' rows are read.
  const int64_t out_cols = top_k * n;
  pool_->ParallelFor(m * top_k, MinItemsPerChunk(n * k), [&](int thread, int64_t s0, int64_t s1) {
    const auto* w_bytes = static_cast<const std::byte*>(w.data);
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t i = s / top_k, j = s % top_k;
      float* y = out + i * out_cols + j * n;
      const int32_t e = ids[s];
      if (e < 0 || e >= experts) {
        std::fill(y, y + n, 0.0f);
        continue;
      }
      const float* xr = xs + (per_slot ? i * top_k * k + j * k : i * k);
      for (int64_t r = 0; r < n; ++r) {
        const int64_t row = e * n + r;
        if (quantized) {
          DotQuantizedRow(w.dtype, w_bytes + row * w_row_bytes, k, xr, k, 1, y + r, n);
        } else {
          y[r] = cpu::Dot(xr, F32Row(w, row * k, k, scratch_[thread].data()), k);
        }
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::MoeCombine& op, const NodeArgs& args) {
  const TensorArg& y = args.inputs[0];  // with `matmul`: x, the down experts' input
  const int32_t* ids = Ints(args.inputs[2]);
  const DType t = args.output.dtype;
  const int64_t m = y.shape[0], top_k = args.inputs[2].shape[1], n = args.output.shape[1];
  std::vector<int64_t> order;
  std::vector<float> routed;  // with `route`: the weights, as MoeRouteWeights stores them
  std::vector<float> products;  // with `matmul`: y, as MoeMatMul stores it
  int64_t y_elems = 0;           // top_k · n is within bounds: shape inference formed it
  if (!CheckedMul(m, top_k * n, &y_elems)) {
    return absl::ResourceExhaustedError("CPU reference: a MoE combine's products overflow");
  }
  try {
    order.resize(static_cast<size_t>(top_k));
    if (op.route) routed.resize(static_cast<size_t>(m * top_k));
    if (op.matmul) products.resize(static_cast<size_t>(y_elems));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("CPU reference: no memory for a MoE combine");
  }
  if (op.matmul) {
    SG_ASSIGN_OR_RETURN(const float* xs, F32Input(y, x_f32_));
    SG_RETURN_IF_ERROR(
        MoeProducts(y, xs, args.inputs[op.residual ? 4 : 3], args.inputs[2], products.data()));
    for (float& v : products) v = RoundTo(t, v);
  }
  auto y_at = [&](int64_t index) {
    return op.matmul ? products[static_cast<size_t>(index)] : LoadElement(y.data, y.dtype, index);
  };
  if (op.route) {
    for (int64_t i = 0; i < m; ++i) {
      if (!RouteWeightsOfRow(args.inputs[1], i, ids + i * top_k, top_k, op.renormalize,
                             op.round_to_dtype, routed.data() + i * top_k)) {
        error_flags_ |= kErrorExpertOutOfRange;
      }
    }
  }
  const void* weights = op.route ? routed.data() : args.inputs[1].data;
  const DType weights_dtype = op.route ? DType::kF32 : args.inputs[1].dtype;
  for (int64_t i = 0; i < m; ++i) {
    // transformers adds the experts' outputs in ascending expert id.
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return ids[i * top_k + a] < ids[i * top_k + b];
    });
    for (int64_t c = 0; c < n; ++c) {
      float sum = 0.0f;
      for (int64_t j : order) {
        const float w = LoadElement(weights, weights_dtype, i * top_k + j);
        const float term = w * y_at(i * top_k * n + j * n + c);
        sum = RoundTo(t, sum + RoundTo(t, term));
      }
      // The residual add as Add computes it: the f32 sum of the two, rounded once.
      if (op.residual) sum += LoadElement(args.inputs[3].data, t, i * n + c);
      StoreElement(args.output.data, t, i * n + c, sum);
    }
  }
  return absl::OkStatus();
}

namespace {

// A collective over `ranks` ranks: every rank's x, one pointer per rank, handed to `body`
// between the group's two meetings (dispatch/collectives.cc). A group of one hands over x.
template <typename Body>
absl::Status WithRanks(HostCollectives* group, int rank, int32_t ranks, const TensorArg& x,
                       absl::string_view what, Body body) {
  const int have = group == nullptr ? 1 : group->ranks();
  if (have != ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CPU reference: ", what, " '", x.name, "' is for ", ranks, " ranks, but the dispatcher's ",
        "group has ", have));
  }
  if (group == nullptr) {
    const void* only[] = {x.data};
    body(absl::Span<const void* const>(only));
    return absl::OkStatus();
  }
  SG_ASSIGN_OR_RETURN(absl::Span<const void* const> all, group->Gather(rank, x.data));
  body(all);
  return group->Release(rank);
}

}  // namespace

absl::Status CpuDispatch::Run(const ops::AllReduce& op, const NodeArgs& args) {
  const TensorArg& x = args.inputs[0];
  const TensorArg& out = args.output;
  const int64_t n = out.shape.NumElements();
  const TensorArg* residual = op.residual ? &args.inputs[1] : nullptr;
  return WithRanks(collectives_, rank_, op.ranks, x, "AllReduce", [&](auto all) {
    for (int64_t e = 0; e < n; ++e) {
      float sum = 0.0f;
      for (const void* data : all) sum += LoadElement(data, x.dtype, e);
      // The sum rounded to the dtype, then the residual added and rounded again (ops.h).
      if (residual != nullptr) {
        sum = RoundTo(x.dtype, sum) + LoadElement(residual->data, residual->dtype, e);
      }
      StoreElement(out.data, out.dtype, e, sum);
    }
  });
}

absl::Status CpuDispatch::Run(const ops::AllGather& op, const NodeArgs& args) {
  const TensorArg& x = args.inputs[0];
  const int64_t m = x.shape[0];
  const int64_t row = x.shape[1] * DTypeBytes(x.dtype);
  auto* out = static_cast<std::byte*>(args.output.data);
  return WithRanks(collectives_, rank_, op.ranks, x, "AllGather", [&](auto all) {
    for (size_t r = 0; r < all.size(); ++r) {
      const auto* from = static_cast<const std::byte*>(all[r]);
      for (int64_t i = 0; i < m; ++i) {
        std::memcpy(out + (i * static_cast<int64_t>(all.size()) + static_cast<int64_t>(r)) * row,
                    from + i * row, static_cast<size_t>(row));
      }
    }
  });
}

}  // namespace sg
