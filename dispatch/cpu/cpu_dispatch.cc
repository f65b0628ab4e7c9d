// The CPU reference. Each Run reads its inputs as f32 rows, computes in f32 and stores in
// the output's dtype. Shapes were checked by inference when the graph was built, so Run
// only re-checks what inference cannot know (values: ids, positions).
#include "stepgraph/cpu_dispatch.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "stepgraph/half.h"
#include "stepgraph/philox.h"
#include "stepgraph/plan.h"
#include "stepgraph/rope.h"

namespace sg {
namespace {


// v rounded to what `t` can hold, as f32: models a store and reload.
float RoundTo(DType t, float v) {
  switch (t) {
    case DType::kBF16:
      return BF16ToFloat(FloatToBF16(v));
    case DType::kF16:
      return HalfToFloat(FloatToHalf(v));
    default:
      return v;
  }
}

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

}  // namespace

namespace {
// A Rope node's frequency table, computed once per plan.
struct CpuRopeNode final : PreparedNode {
  std::vector<float> inv_freq;
};
}  // namespace

absl::StatusOr<PreparedPlan> CpuDispatch::Prepare(const ExecutionPlan& plan) {
  const Graph& graph = plan.graph();
  std::vector<std::unique_ptr<PreparedNode>> nodes(static_cast<size_t>(graph.num_nodes()));
  for (int32_t i = 0; i < graph.num_nodes(); ++i) {
    if (const auto* rope = std::get_if<ops::Rope>(&graph.nodes()[i].op)) {
      auto node = std::make_unique<CpuRopeNode>();
      node->inv_freq = RopeInvFreq(*rope);
      nodes[i] = std::move(node);
    }
  }
  return PreparedPlan(plan, *this, std::move(nodes));
}

absl::Status CpuDispatch::Run(const ops::Embedding&, const NodeArgs& args) {
  const TensorArg& table = args.inputs[0];
  if (IsQuantized(table.dtype)) {
    return absl::UnimplementedError(absl::StrCat("Embedding: no CPU path for ",
                                                 DTypeName(table.dtype), " tables yet"));
  }
  const int64_t vocab = table.shape[0], hidden = table.shape[1];
  const int32_t* ids = Ints(args.inputs[1]);
  for (int64_t i = 0; i < args.output.shape[0]; ++i) {
    std::vector<float> row(hidden, 0.0f);
    if (ids[i] >= 0 && ids[i] < vocab) {
      row = LoadRange(table, ids[i] * hidden, hidden);
    } else {
      error_flags_ |= kErrorTokenOutOfRange;
    }
    StoreRange(args.output, i * hidden, row);
  }
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::MatMul& op, const NodeArgs& args) {
  const TensorArg& x = args.inputs[0];
  const TensorArg& w = args.inputs[1];
  if (IsQuantized(w.dtype)) {
    return absl::UnimplementedError(absl::StrCat("MatMul: no CPU path for ",
                                                 DTypeName(w.dtype), " weights yet"));
  }
  const int64_t m = x.shape[0], k = x.shape[1], n = w.shape[0];
  const std::vector<float> xs = LoadAll(x);
  const std::vector<float> bias =
      op.has_bias ? LoadAll(args.inputs[2]) : std::vector<float>(n, 0.0f);
  std::vector<float> out(m * n);
  for (int64_t j = 0; j < n; ++j) {
    const std::vector<float> wj = LoadRange(w, j * k, k);
    for (int64_t i = 0; i < m; ++i) {
      float acc = 0.0f;
      for (int64_t c = 0; c < k; ++c) acc += xs[i * k + c] * wj[c];
      out[i * n + j] = acc + bias[j];
    }
  }
  StoreRange(args.output, 0, out);
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::RmsNorm& op, const NodeArgs& args) {
  const TensorArg& x = args.inputs[0];
  const DType t = x.dtype;
  const int64_t rows = x.shape[0], h = x.shape[1];
  const std::vector<float> w = LoadAll(args.inputs[1]);
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<float> v = LoadRange(x, i * h, h);
    float sum_sq = 0.0f;
    for (float e : v) sum_sq += e * e;
    const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(h) + op.eps);
    // HF: weight * (x * rsqrt(var + eps)).to(input_dtype), the product in input_dtype.
    for (int64_t c = 0; c < h; ++c) v[c] = RoundTo(t, v[c] * inv_rms) * w[c];
    StoreRange(args.output, i * h, v);
  }
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

absl::Status CpuDispatch::Run(const ops::Rope& op, const NodeArgs& args) {
  const TensorArg& x = args.inputs[0];
  const DType t = x.dtype;
  const int32_t* pos = Ints(args.inputs[1]);
  const int64_t rows = x.shape[0], cols = x.shape[1];
  const int d = op.head_dim, half = d / 2;
  // Prepared once per plan; a Run without preparation computes the table itself.
  std::vector<float> unprepared;
  if (args.prepared == nullptr) unprepared = RopeInvFreq(op);
  const std::vector<float>& inv_freq =
      args.prepared != nullptr ? static_cast<const CpuRopeNode*>(args.prepared)->inv_freq
                               : unprepared;
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<float> v = LoadRange(x, i * cols, cols);
    if (pos[i] >= 0) {  // padding rows (pos < 0) pass through unchanged
      for (int64_t head = 0; head < cols / d; ++head) {
        float* hv = v.data() + head * d;
        for (int j = 0; j < half; ++j) {
          // HF: cos/sin of the f32 angle, cast to the model dtype, then q*cos +
          // rotate_half(q)*sin with each product and the sum in the model dtype.
          const float angle = static_cast<float>(pos[i]) * inv_freq[j];
          const float c = RoundTo(t, std::cos(angle)), s = RoundTo(t, std::sin(angle));
          const int a = op.interleaved ? 2 * j : j;
          const int b = op.interleaved ? 2 * j + 1 : j + half;
          const float x1 = hv[a], x2 = hv[b];
          hv[a] = RoundTo(t, x1 * c) - RoundTo(t, x2 * s);
          hv[b] = RoundTo(t, x2 * c) + RoundTo(t, x1 * s);
        }
      }
    }
    StoreRange(args.output, i * cols, v);
  }
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::KvWrite&, const NodeArgs& args) {
  const TensorArg& kv = args.inputs[0];
  const int32_t* pos = Ints(args.inputs[1]);
  const TensorArg& cache = args.output;
  const int64_t kv_heads = cache.shape[1], seq = cache.shape[2], d = cache.shape[3];
  const int64_t elem = DTypeBytes(cache.dtype);
  for (int64_t i = 0; i < kv.shape[0]; ++i) {
    if (pos[i] < 0) continue;
    if (pos[i] >= seq) {
      error_flags_ |= kErrorPositionOutOfRange;
      continue;
    }
    for (int64_t h = 0; h < kv_heads; ++h) {
      const char* src = static_cast<const char*>(kv.data) + (i * kv_heads * d + h * d) * elem;
      char* dst = static_cast<char*>(cache.data) + (((i * kv_heads + h) * seq + pos[i]) * d) * elem;
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
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<float> out(heads * d, 0.0f);
    if (pos[i] >= seq) error_flags_ |= kErrorPositionOutOfRange;
    if (pos[i] >= 0 && pos[i] < seq) {
      const int64_t len = pos[i] + 1;
      for (int64_t h = 0; h < heads; ++h) {
        const std::vector<float> qh = LoadRange(q, i * heads * d + h * d, d);
        const int64_t base = (i * kv_heads + h / group) * seq * d;
        std::vector<float> scores(len);
        float max_score = -std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t < len; ++t) {
          const std::vector<float> k = LoadRange(kc, base + t * d, d);
          float dot = 0.0f;
          for (int64_t c = 0; c < d; ++c) dot += qh[c] * k[c];
          scores[t] = dot * op.scale;
          max_score = std::max(max_score, scores[t]);
        }
        float denom = 0.0f;
        for (float& s : scores) {
          s = std::exp(s - max_score);
          denom += s;
        }
        for (int64_t t = 0; t < len; ++t) {
          const std::vector<float> v = LoadRange(vc, base + t * d, d);
          const float p = scores[t] / denom;
          for (int64_t c = 0; c < d; ++c) out[h * d + c] += p * v[c];
        }
      }
    }
    StoreRange(args.output, i * heads * d, out);
  }
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
    // wins, and a row of NaN or -inf gives 0.
    float best = -std::numeric_limits<float>::infinity();
    int32_t best_index = 0;
    for (int64_t j = 0; j < n; ++j) {
      const float v = LoadElement(x.data, x.dtype, i * n + j);
      if (v > best) {
        best = v;
        best_index = static_cast<int32_t>(j);
      }
    }
    out[i] = best_index;
  }
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::Sample& op, const NodeArgs& args) {
  const TensorArg& logits = args.inputs[0];
  const int32_t* seeds = Ints(args.inputs[1]);
  const int32_t* pos = Ints(args.inputs[2]);
  const int64_t rows = logits.shape[0], n = logits.shape[1];
  int32_t* out = args.output.as<int32_t>();
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<float> z = LoadRange(logits, i * n, n);
    for (float& v : z) v /= op.temperature;
    // Candidates by value, descending; equal values by index, ascending.
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return z[a] > z[b]; });
    int64_t keep = n;
    if (op.top_k > 0) keep = std::min<int64_t>(keep, op.top_k);
    const float mx = z[order[0]];
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

absl::Status CpuDispatch::Run(const ops::Copy&, const NodeArgs& args) {
  if (args.inputs[0].data != args.output.data) {
    std::memmove(args.output.data, args.inputs[0].data, args.output.bytes());
  }
  return absl::OkStatus();
}

absl::Status CpuDispatch::Run(const ops::Advance&, const NodeArgs& args) {
  int32_t* pos = args.output.as<int32_t>();
  for (int64_t i = 0; i < args.output.shape[0]; ++i) {
    if (pos[i] >= 0) ++pos[i];
  }
  return absl::OkStatus();
}

}  // namespace sg
