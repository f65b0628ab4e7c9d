// Numeric tests of CpuDispatch, the executable definition of every op that the other
// dispatchers are later held against. Each op runs as a one-node graph through the real
// builder, planner and executor, on random inputs (never zero) and random shapes (odd
// sizes included), with its output poisoned first, and is compared with a float64
// reference written here from the op semantics (ops.h, DESIGN.md), not from the
// implementation. Float ops run in f32, bf16 and f16; the reference reads the stored,
// already-rounded inputs, so only the op's own rounding is measured.
#include "stepgraph/dispatch/cpu_dispatch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/base/error_flags.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/base/half.h"
#include "stepgraph/base/philox.h"
#include "stepgraph/base/quant.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/graph/rope.h"
#include "tests/testing/util.h"

namespace sg {

// Parameterised test names and failures print "bf16", not a byte dump.
void PrintTo(DType t, std::ostream* os) { *os << DTypeName(t); }

namespace {

using sg::testing::HostBindings;
using sg::testing::HostTensor;
using sg::testing::NormalizedError;

#define SG_ASSERT_OK(expr)             \
  do {                                 \
    const absl::Status sg_s_ = (expr); \
    ASSERT_TRUE(sg_s_.ok()) << sg_s_;  \
  } while (0)

// ---------------------------------------------------------------------------------------
// Helpers

// Normalised-error bound per storage dtype: f32 is limited by f32 accumulation, the 16-bit
// types by rounding the output (and, where HF rounds intermediates, a few more roundings).
double Tolerance(DType t) {
  switch (t) {
    case DType::kF32:
      return 1e-5;
    case DType::kF16:
      return 3e-3;
    default:
      return 1e-2;
  }
}

int64_t RandInt(std::mt19937_64& rng, int64_t lo, int64_t hi) {  // inclusive
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// Magnitudes uniform in [lo, hi] with random signs: never zero, and never so small that
// a dropped or misplaced term hides in the rounding noise.
std::vector<float> RandomValues(std::mt19937_64& rng, int64_t n, float lo = 0.1f, float hi = 1.0f) {
  std::uniform_real_distribution<float> mag(lo, hi);
  std::bernoulli_distribution neg(0.5);
  std::vector<float> v(n);
  for (float& e : v) e = neg(rng) ? -mag(rng) : mag(rng);
  return v;
}

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// A planned one-graph test bench: host buffers for every bound tensor and the arena.
class Bench {
 public:
  static std::unique_ptr<Bench> Make(GraphBuilder& b, uint64_t seed = 1) {
    absl::StatusOr<Graph> graph = std::move(b).Build();
    if (!graph.ok()) {
      ADD_FAILURE() << "Build: " << graph.status();
      return nullptr;
    }
    absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(graph));
    if (!plan.ok()) {
      ADD_FAILURE() << "Plan: " << plan.status();
      return nullptr;
    }
    return std::unique_ptr<Bench>(new Bench(*std::move(plan), seed));
  }

  const ExecutionPlan& plan() const { return plan_; }
  HostBindings& host() { return *host_; }
  HostTensor& Bound(absl::string_view name) { return host_->tensor(name); }

  // Stores `v` (rounded to the tensor's dtype) and returns what was stored.
  std::vector<double> Set(absl::string_view name, const std::vector<float>& v) {
    HostTensor& t = Bound(name);
    EXPECT_EQ(t.size(), static_cast<int64_t>(v.size())) << name;
    t.FillFrom(v);
    return ToDouble(t.ToFloat());
  }
  void SetInts(absl::string_view name, const std::vector<int32_t>& v) {
    HostTensor& t = Bound(name);
    ASSERT_EQ(t.size(), static_cast<int64_t>(v.size())) << name;
    std::memcpy(t.data(), v.data(), v.size() * sizeof(int32_t));
  }

  // Any tensor (bound or intermediate) as the executor resolves it.
  TensorArg Arg(absl::string_view name) const {
    const absl::StatusOr<TensorId> id = plan_.graph().FindTensor(name);
    EXPECT_TRUE(id.ok()) << id.status();
    return ResolveTensor(plan_, host_->bindings(), id->index);
  }
  // Every byte 0xFF: NaN for the float types, -1 for i32.
  void Poison(absl::string_view name) {
    const TensorArg a = Arg(name);
    std::memset(a.data, 0xFF, a.bytes());
  }
  void PoisonArena() {
    const Bindings::Buffer& arena = host_->bindings().arena();
    if (arena.bytes > 0) std::memset(arena.data, 0xFF, arena.bytes);
  }
  std::vector<float> Floats(absl::string_view name) const {
    const TensorArg a = Arg(name);
    std::vector<float> out(a.shape.NumElements());
    for (size_t i = 0; i < out.size(); ++i) out[i] = LoadElement(a.data, a.dtype, i);
    return out;
  }
  std::vector<int32_t> Ints(absl::string_view name) const {
    const TensorArg a = Arg(name);
    EXPECT_EQ(a.dtype, DType::kI32) << name;
    return std::vector<int32_t>(a.as<int32_t>(), a.as<int32_t>() + a.shape.NumElements());
  }
  std::vector<uint8_t> Bytes(absl::string_view name) const {
    const TensorArg a = Arg(name);
    const auto* p = static_cast<const uint8_t*>(a.data);
    return std::vector<uint8_t>(p, p + a.bytes());
  }

  // One step: exactly one launch per node.
  absl::Status Run(CpuDispatch& cpu) {
    absl::StatusOr<PreparedPlan> prepared = cpu.Prepare(plan_);
    if (!prepared.ok()) return prepared.status();
    absl::StatusOr<ExecStats> stats = Execute(*prepared, host_->bindings(), cpu);
    if (!stats.ok()) return stats.status();
    if (stats->launches != plan_.graph().num_nodes()) {
      return absl::InternalError(
          absl::StrCat(stats->launches, " launches for ", plan_.graph().num_nodes(), " nodes"));
    }
    return absl::OkStatus();
  }

 private:
  Bench(ExecutionPlan plan, uint64_t seed)
      : plan_(std::move(plan)), host_(std::make_unique<HostBindings>(plan_, seed)) {}

  ExecutionPlan plan_;
  std::unique_ptr<HostBindings> host_;
};

class CpuFloatOpTest : public ::testing::TestWithParam<DType> {
 protected:
  DType dtype() const { return GetParam(); }
  double tol() const { return Tolerance(GetParam()); }
};

std::string DTypeParamName(const ::testing::TestParamInfo<DType>& info) {
  return std::string(DTypeName(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllFloatTypes, CpuFloatOpTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16), DTypeParamName);

// ---------------------------------------------------------------------------------------
// Embedding

TEST_P(CpuFloatOpTest, EmbeddingGathersRows) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t vocab = RandInt(rng, 3, 61), hidden = RandInt(rng, 1, 37) | 1,
                  rows = RandInt(rng, 1, 9);
    GraphBuilder b;
    const TensorId table = b.Weight("table", dtype(), {vocab, hidden});
    const TensorId ids = b.Input("ids", DType::kI32, {rows});
    b.Output("y", b.Embedding(table, ids, "y"));
    auto bench = Bench::Make(b);
    ASSERT_NE(bench, nullptr);
    const std::vector<double> t = bench->Set("table", RandomValues(rng, vocab * hidden));
    std::vector<int32_t> id(rows);
    for (int32_t& v : id) v = static_cast<int32_t>(RandInt(rng, 0, vocab - 1));
    id[0] = static_cast<int32_t>(vocab - 1);  // the last row is in range
    bench->SetInts("ids", id);
    bench->Poison("y");
    CpuDispatch cpu;
    SG_ASSERT_OK(bench->Run(cpu));
    EXPECT_EQ(cpu.TakeErrorFlags(), 0u) << "valid ids raised an error flag";
    const std::vector<float> y = bench->Floats("y");
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t c = 0; c < hidden; ++c) {
        // A gather is exact in every dtype.
        ASSERT_EQ(y[i * hidden + c], t[id[i] * hidden + c]) << "row " << i << " col " << c;
      }
    }
  }
}

TEST_P(CpuFloatOpTest, EmbeddingOutOfRangeIdGivesZeroRowAndFlag) {
  std::mt19937_64 rng(12);
  const int64_t vocab = 13, hidden = 7, rows = 5, guard = 2;
  const int32_t kNone = 0;  // stands for "no bad id in this run"
  for (const int32_t bad : {kNone, -1, -2, 13, 14, 1013, std::numeric_limits<int32_t>::min(),
                            std::numeric_limits<int32_t>::max()}) {
    SCOPED_TRACE(absl::StrCat("bad id ", bad));
    GraphBuilder b;
    const TensorId table = b.Weight("table", dtype(), {vocab, hidden});
    const TensorId ids = b.Input("ids", DType::kI32, {rows});
    b.Output("y", b.Embedding(table, ids, "y"));
    auto bench = Bench::Make(b);
    ASSERT_NE(bench, nullptr);
    // The table sits between guard rows of random values, so that a read just outside it
    // (id -1 or V) returns garbage rather than the zeros of a fresh allocation.
    HostTensor padded(dtype(), {vocab + 2 * guard, hidden});
    const std::vector<double> all = ToDouble([&] {
      padded.FillFrom(RandomValues(rng, padded.size()));
      return padded.ToFloat();
    }());
    const int64_t row_bytes = hidden * DTypeBytes(dtype());
    SG_ASSERT_OK(bench->host().bindings().Bind(
        "table", static_cast<char*>(padded.data()) + guard * row_bytes, vocab * row_bytes));
    std::vector<int32_t> id(rows);
    for (int32_t& v : id) v = static_cast<int32_t>(RandInt(rng, 0, vocab - 1));
    const int64_t bad_row = RandInt(rng, 0, rows - 1);
    if (bad != kNone) id[bad_row] = bad;
    bench->SetInts("ids", id);
    bench->Poison("y");
    CpuDispatch cpu;
    SG_ASSERT_OK(bench->Run(cpu));
    EXPECT_EQ(cpu.TakeErrorFlags(),
              bad == kNone ? 0u : static_cast<uint32_t>(kErrorTokenOutOfRange));
    EXPECT_EQ(cpu.TakeErrorFlags(), 0u) << "TakeErrorFlags must clear the flags";
    const std::vector<float> y = bench->Floats("y");
    for (int64_t i = 0; i < rows; ++i) {
      const bool valid = id[i] >= 0 && id[i] < vocab;
      for (int64_t c = 0; c < hidden; ++c) {
        const double want = valid ? all[(id[i] + guard) * hidden + c] : 0.0;
        ASSERT_EQ(y[i * hidden + c], want) << "row " << i << " (id " << id[i] << ") col " << c;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// MatMul

TEST_P(CpuFloatOpTest, MatMulMatchesReference) {
  std::mt19937_64 rng(21);
  for (const int64_t m : {1, 3, 8}) {
    for (const bool bias : {false, true}) {
      const int64_t k = RandInt(rng, 1, 70) * 2 + 1, n = RandInt(rng, 1, 40) * 2 + 1;
      SCOPED_TRACE(absl::StrCat("M=", m, " K=", k, " N=", n, " bias=", bias));
      GraphBuilder b;
      const TensorId x = b.Input("x", dtype(), {m, k});
      const TensorId w = b.Weight("w", dtype(), {n, k});
      TensorId y;
      if (bias) {
        y = b.MatMul(x, w, b.Weight("bias", dtype(), {n}), "y");
      } else {
        y = b.MatMul(x, w, "y");
      }
      b.Output("y", y);
      auto bench = Bench::Make(b);
      ASSERT_NE(bench, nullptr);
      const std::vector<double> xs = bench->Set("x", RandomValues(rng, m * k));
      const std::vector<double> ws = bench->Set("w", RandomValues(rng, n * k));
      std::vector<double> bs(n, 0.0);
      if (bias) bs = bench->Set("bias", RandomValues(rng, n, 0.5f, 2.0f));
      bench->Poison("y");
      CpuDispatch cpu;
      SG_ASSERT_OK(bench->Run(cpu));
      std::vector<double> want(m * n);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double acc = bs[j];
          for (int64_t c = 0; c < k; ++c) acc += xs[i * k + c] * ws[j * k + c];  // x·wᵀ
          want[i * n + j] = acc;
        }
      }
      EXPECT_LE(NormalizedError(bench->Floats("y"), want), tol());
    }
  }
}

// ---------------------------------------------------------------------------------------
// RmsNorm

TEST_P(CpuFloatOpTest, RmsNormMatchesReferenceAndHfRounding) {
  std::mt19937_64 rng(31);
  int64_t order_matters = 0;  // elements where HF's two roundings differ from one
  for (const float eps : {1e-6f, 1e-5f, 0.25f}) {
    const int64_t m = RandInt(rng, 1, 5), h = RandInt(rng, 20, 300) | 1;
    SCOPED_TRACE(absl::StrCat("M=", m, " H=", h, " eps=", eps));
    GraphBuilder b;
    const TensorId x = b.Input("x", dtype(), {m, h});
    const TensorId w = b.Weight("w", dtype(), {h});
    b.Output("y", b.RmsNorm(x, w, eps, "y"));
    auto bench = Bench::Make(b);
    ASSERT_NE(bench, nullptr);
    const std::vector<double> xs = bench->Set("x", RandomValues(rng, m * h, 0.05f, 2.0f));
    const std::vector<double> ws = bench->Set("w", RandomValues(rng, h, 0.3f, 1.7f));
    bench->Poison("y");
    CpuDispatch cpu;
    SG_ASSERT_OK(bench->Run(cpu));
    const std::vector<float> got = bench->Floats("y");
    std::vector<double> want(m * h);
    for (int64_t i = 0; i < m; ++i) {
      double sum_sq = 0;
      for (int64_t c = 0; c < h; ++c) sum_sq += xs[i * h + c] * xs[i * h + c];
      const double inv_rms = 1.0 / std::sqrt(sum_sq / static_cast<double>(h) + eps);
      for (int64_t c = 0; c < h; ++c) {
        const double normed = xs[i * h + c] * inv_rms;
        want[i * h + c] = normed * ws[c];
        if (dtype() == DType::kF32) continue;
        // HF: weight * (x * rsqrt(var + eps)).to(dtype): the normalised value is rounded to
        // the storage dtype before the weight multiplies it, and the product is rounded
        // again. f32 math may put `normed` on either side of a rounding boundary when it
        // lies within f32 noise of one, so both neighbours are accepted there.
        const float lo = RoundTo(dtype(), static_cast<float>(normed * (1 - 1e-5)));
        const float hi = RoundTo(dtype(), static_cast<float>(normed * (1 + 1e-5)));
        // The 16-bit products are exact in f32, so the second rounding is unambiguous.
        const float out_lo = RoundTo(dtype(), lo * static_cast<float>(ws[c]));
        const float out_hi = RoundTo(dtype(), hi * static_cast<float>(ws[c]));
        const float g = got[i * h + c];
        ASSERT_TRUE(g == out_lo || g == out_hi)
            << "row " << i << " col " << c << ": got " << g << ", HF rounding gives " << out_lo
            << (out_lo != out_hi ? absl::StrCat(" or ", out_hi) : "");
        if (lo == hi && out_lo != RoundTo(dtype(), static_cast<float>(normed * ws[c]))) {
          ++order_matters;
        }
      }
    }
    EXPECT_LE(NormalizedError(got, want), tol());
  }
  // The check above could not tell HF's order from a single rounding if the two never
  // differed on these inputs.
  if (dtype() != DType::kF32) {
    EXPECT_GT(order_matters, 0);
  }
}

// ---------------------------------------------------------------------------------------
// Elementwise ops

struct ElementwiseCase {
  std::string name;
  int arity;
  double (*ref)(double a, double b);
  float lo, hi;
};

double Silu(double x) { return x / (1.0 + std::exp(-x)); }

TEST_P(CpuFloatOpTest, ElementwiseOpsMatchReference) {
  const ElementwiseCase cases[] = {
      {"Add", 2, [](double a, double b) { return a + b; }, 0.1f, 4.0f},
      {"Mul", 2, [](double a, double b) { return a * b; }, 0.1f, 4.0f},
      {"Silu", 1, [](double a, double) { return Silu(a); }, 0.1f, 6.0f},
      {"SiluMul", 2, [](double a, double b) { return Silu(a) * b; }, 0.1f, 6.0f},
  };
  std::mt19937_64 rng(41);
  for (const ElementwiseCase& ec : cases) {
    for (int trial = 0; trial < 3; ++trial) {
      Shape shape;
      switch (trial) {
        case 0:
          shape = Shape{RandInt(rng, 1, 200) | 1};
          break;
        case 1:
          shape = Shape{RandInt(rng, 1, 9), RandInt(rng, 1, 99) | 1};
          break;
        default:
          shape = Shape{RandInt(rng, 1, 4), RandInt(rng, 1, 5), RandInt(rng, 1, 21) | 1};
      }
      SCOPED_TRACE(absl::StrCat(ec.name, " ", shape.ToString()));
      GraphBuilder b;
      const TensorId a = b.Input("a", dtype(), shape);
      TensorId y;
      if (ec.arity == 1) {
        y = b.Silu(a, "y");
      } else {
        const TensorId bb = b.Input("b", dtype(), shape);
        if (ec.name == "Add") y = b.Add(a, bb, "y");
        if (ec.name == "Mul") y = b.Mul(a, bb, "y");
        if (ec.name == "SiluMul") y = b.SiluMul(a, bb, "y");
      }
      b.Output("y", y);
      auto bench = Bench::Make(b);
      ASSERT_NE(bench, nullptr);
      const int64_t n = shape.NumElements();
      const std::vector<double> as = bench->Set("a", RandomValues(rng, n, ec.lo, ec.hi));
      std::vector<double> bs(n, 0.0);
      if (ec.arity == 2) bs = bench->Set("b", RandomValues(rng, n, ec.lo, ec.hi));
      bench->Poison("y");
      CpuDispatch cpu;
      SG_ASSERT_OK(bench->Run(cpu));
      std::vector<double> want(n);
      for (int64_t i = 0; i < n; ++i) want[i] = ec.ref(as[i], bs[i]);
      EXPECT_LE(NormalizedError(bench->Floats("y"), want), tol());
    }
  }
}

TEST(CpuDispatchTest, AddI32IsExact) {
  std::mt19937_64 rng(42);
  const int64_t rows = 5, cols = 13;
  GraphBuilder b;
  const TensorId a = b.Input("a", DType::kI32, {rows, cols});
  const TensorId c = b.Input("b", DType::kI32, {rows, cols});
  b.Output("y", b.Add(a, c, "y"));
  auto bench = Bench::Make(b);
  ASSERT_NE(bench, nullptr);
  // Magnitudes far beyond 2^24, where a detour through f32 would lose the low bits.
  std::vector<int32_t> av(rows * cols), bv(rows * cols);
  for (size_t i = 0; i < av.size(); ++i) {
    do {
      av[i] = static_cast<int32_t>(RandInt(rng, -(1 << 30), 1 << 30));
      bv[i] = static_cast<int32_t>(RandInt(rng, -(1 << 30), 1 << 30));
    } while (av[i] == 0 || bv[i] == 0);
  }
  bench->SetInts("a", av);
  bench->SetInts("b", bv);
  bench->Poison("y");
  CpuDispatch cpu;
  SG_ASSERT_OK(bench->Run(cpu));
  const std::vector<int32_t> y = bench->Ints("y");
  for (size_t i = 0; i < y.size(); ++i) {
    ASSERT_EQ(y[i], static_cast<int64_t>(av[i]) + bv[i]) << "element " << i;
  }
}

// ---------------------------------------------------------------------------------------
// Rope

// float64 RoPE on the stored x. The angle is the f32 product pos·inv_freq of the shared
// f32 table (RopeInvFreq, checked against float64 below), as HF computes it; its f32
// rounding is part of the op (at pos 4000 it moves the angle by ~1e-4 rad, far above the
// f32 tolerance), so the reference takes the same angle and does everything after it in
// float64. cos and sin are rounded to the storage dtype first, as HF casts them.
std::vector<double> RopeReference(const ops::Rope& op, DType t, const std::vector<double>& x,
                                  const std::vector<int32_t>& pos, int64_t cols) {
  const std::vector<float> inv_freq = RopeInvFreq(op);
  const int d = op.head_dim, half = d / 2;
  std::vector<double> out = x;
  for (size_t i = 0; i < pos.size(); ++i) {
    if (pos[i] < 0) continue;
    for (int64_t head = 0; head < cols / d; ++head) {
      const int64_t base = static_cast<int64_t>(i) * cols + head * d;
      for (int j = 0; j < half; ++j) {
        const float angle = static_cast<float>(pos[i]) * inv_freq[j];
        const double c = RoundTo(t, static_cast<float>(std::cos(static_cast<double>(angle))));
        const double s = RoundTo(t, static_cast<float>(std::sin(static_cast<double>(angle))));
        const int64_t a = base + (op.interleaved ? 2 * j : j);
        const int64_t b = base + (op.interleaved ? 2 * j + 1 : j + half);
        out[a] = x[a] * c - x[b] * s;
        out[b] = x[b] * c + x[a] * s;
      }
    }
  }
  return out;
}

TEST_P(CpuFloatOpTest, RopeMatchesReference) {
  std::mt19937_64 rng(51);
  ops::Rope llama3;
  llama3.theta = 500000.0f;
  llama3.scaling = {ops::RopeScaling::Type::kLlama3, 32.0f, 1.0f, 4.0f, 8192};
  struct Case {
    int head_dim;
    int heads;
    bool interleaved;
    bool scaled;
  };
  const Case cases[] = {{2, 3, false, false}, {6, 1, false, false}, {32, 2, false, false},
                        {64, 2, true, false}, {10, 3, true, false}, {64, 2, false, true},
                        {64, 1, true, true}};
  for (const Case& k : cases) {
    ops::Rope op = k.scaled ? llama3 : ops::Rope{};
    op.head_dim = k.head_dim;
    op.interleaved = k.interleaved;
    if (!k.scaled) op.theta = 10000.0f;
    const int64_t cols = int64_t{k.head_dim} * k.heads;
    // Position 0, 1, a large one, a random one, and a padding row.
    const std::vector<int32_t> pos = {0,  1, 4000, static_cast<int32_t>(RandInt(rng, 2, 3000)),
                                      -1, 7};
    const int64_t rows = static_cast<int64_t>(pos.size());
    SCOPED_TRACE(absl::StrCat("d=", k.head_dim, " heads=", k.heads, " interleaved=", k.interleaved,
                              " llama3=", k.scaled));
    GraphBuilder b;
    const TensorId x = b.Input("x", dtype(), {rows, cols});
    const TensorId p = b.Input("pos", DType::kI32, {rows});
    b.Output("y", b.Rope(x, p, op, "y"));
    auto bench = Bench::Make(b);
    ASSERT_NE(bench, nullptr);
    const std::vector<double> xs = bench->Set("x", RandomValues(rng, rows * cols, 0.1f, 2.0f));
    bench->SetInts("pos", pos);
    bench->Poison("y");
    CpuDispatch cpu;
    SG_ASSERT_OK(bench->Run(cpu));
    EXPECT_EQ(cpu.TakeErrorFlags(), 0u);
    const std::vector<float> got = bench->Floats("y");
    const std::vector<double> want = RopeReference(op, dtype(), xs, pos, cols);
    EXPECT_LE(NormalizedError(got, want), tol());
    // Position 0 is the identity (cos 1, sin 0) and a padding row passes through; both
    // exactly, in every dtype.
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(got[0 * cols + c], xs[0 * cols + c]) << "pos 0, col " << c;
      ASSERT_EQ(got[4 * cols + c], xs[4 * cols + c]) << "padding row, col " << c;
    }
    // Each row's own error, so that one wrong row cannot hide among good ones.
    for (int64_t i = 0; i < rows; ++i) {
      const std::vector<float> g(got.begin() + i * cols, got.begin() + (i + 1) * cols);
      const std::vector<double> w(want.begin() + i * cols, want.begin() + (i + 1) * cols);
      EXPECT_LE(NormalizedError(g, w), tol()) << "row " << i << " pos " << pos[i];
    }
  }
}

TEST_P(CpuFloatOpTest, RopePairingMatters) {
  // The library's Rope against each pairing written out by hand, pair by pair (not through
  // RopeReference, which shares the library's choice of pairs): by default element j of a
  // head turns with j + d/2 (HF's rotate_half), with `interleaved` 2j with 2j + 1. Each
  // result must match its own pairing and be far from the other, so that a library that
  // pairs the wrong elements fails here.
  constexpr int kD = 8;
  const std::pair<int, int> rotate_half[kD / 2] = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
  const std::pair<int, int> interleaved[kD / 2] = {{0, 1}, {2, 3}, {4, 5}, {6, 7}};
  const int64_t heads = 2, cols = kD * heads;
  const std::vector<int32_t> pos = {3, 9, 1};
  const int64_t rows = static_cast<int64_t>(pos.size());
  std::mt19937_64 rng(52);
  const std::vector<float> input = RandomValues(rng, rows * cols, 0.1f, 2.0f);

  // Pair j of a head turns by pos · 10000^(-2j/d), in float64.
  auto expected = [&](const std::pair<int, int> (&pairs)[kD / 2], const std::vector<double>& x) {
    std::vector<double> out = x;
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = i * cols + h * kD;
        for (int j = 0; j < kD / 2; ++j) {
          const double angle = pos[i] * std::pow(10000.0, -2.0 * j / kD);
          const int64_t a = base + pairs[j].first, b = base + pairs[j].second;
          out[a] = x[a] * std::cos(angle) - x[b] * std::sin(angle);
          out[b] = x[b] * std::cos(angle) + x[a] * std::sin(angle);
        }
      }
    }
    return out;
  };
  auto run = [&](bool interleave, std::vector<double>* x) -> std::vector<float> {
    GraphBuilder b;
    const TensorId xt = b.Input("x", dtype(), {rows, cols});
    const TensorId p = b.Input("pos", DType::kI32, {rows});
    b.Output("y", b.Rope(xt, p, ops::Rope{.head_dim = kD, .theta = 10000.0f,
                                          .interleaved = interleave}, "y"));
    auto bench = Bench::Make(b);
    if (bench == nullptr) return {};
    *x = bench->Set("x", input);
    bench->SetInts("pos", pos);
    bench->Poison("y");
    CpuDispatch cpu;
    if (const absl::Status st = bench->Run(cpu); !st.ok()) {
      ADD_FAILURE() << st;
      return {};
    }
    return bench->Floats("y");
  };

  std::vector<double> x;
  const std::vector<float> half_got = run(false, &x);
  ASSERT_EQ(half_got.size(), x.size());
  EXPECT_LE(NormalizedError(half_got, expected(rotate_half, x)), tol());
  EXPECT_GT(NormalizedError(half_got, expected(interleaved, x)), 0.05);

  const std::vector<float> inter_got = run(true, &x);
  ASSERT_EQ(inter_got.size(), x.size());
  EXPECT_LE(NormalizedError(inter_got, expected(interleaved, x)), tol());
  EXPECT_GT(NormalizedError(inter_got, expected(rotate_half, x)), 0.05);
}

// float64 transcription of transformers' _compute_default_rope_parameters and
// _compute_llama3_parameters.
std::vector<double> InvFreqF64(double theta, int dim, bool llama3, double factor,
                               double low_freq_factor, double high_freq_factor,
                               double old_context_len) {
  std::vector<double> inv(dim / 2);
  for (int j = 0; j < dim / 2; ++j) inv[j] = 1.0 / std::pow(theta, (2.0 * j) / dim);
  if (!llama3) return inv;
  const double low_freq_wavelen = old_context_len / low_freq_factor;
  const double high_freq_wavelen = old_context_len / high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2 * M_PI / f;
    double llama = wavelen > low_freq_wavelen ? f / factor : f;
    const double smooth =
        (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
    const double smoothed = (1 - smooth) * llama / factor + smooth * llama;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    f = medium ? smoothed : llama;
  }
  return inv;
}

TEST(CpuDispatchTest, RopeInvFreqDefault) {
  for (const float theta : {10000.0f, 500000.0f, 1000000.0f}) {
    for (const int d : {2, 64, 96, 128}) {
      ops::Rope op;
      op.head_dim = d;
      op.theta = theta;
      const std::vector<float> got = RopeInvFreq(op);
      const std::vector<double> want = InvFreqF64(theta, d, false, 0, 0, 0, 0);
      ASSERT_EQ(got.size(), want.size());
      for (size_t j = 0; j < want.size(); ++j) {
        EXPECT_NEAR(got[j] / want[j], 1.0, 2e-6) << "theta " << theta << " d " << d << " j " << j;
      }
    }
  }
}

TEST(CpuDispatchTest, RopeInvFreqLlama3) {
  ops::Rope op;
  op.head_dim = 64;
  op.theta = 500000.0f;
  op.scaling = {ops::RopeScaling::Type::kLlama3, 32.0f, 1.0f, 4.0f, 8192};
  const std::vector<float> got = RopeInvFreq(op);
  const std::vector<double> want = InvFreqF64(500000.0, 64, true, 32, 1, 4, 8192);
  const std::vector<double> plain = InvFreqF64(500000.0, 64, false, 0, 0, 0, 0);
  ASSERT_EQ(got.size(), want.size());
  int low = 0, medium = 0, high = 0;
  for (size_t j = 0; j < want.size(); ++j) {
    // f32 pow, division and the smoothing blend: a few f32 roundings (measured: 2e-7).
    EXPECT_NEAR(got[j] / want[j], 1.0, 1e-6) << "j " << j;
    const double ratio = want[j] / plain[j];
    if (ratio == 1.0) {
      ++high;
    } else if (std::abs(ratio - 1.0 / 32) < 1e-12) {
      ++low;
    } else {
      ++medium;
    }
  }
  // All three bands occur, so each branch of the scaling was exercised.
  EXPECT_GT(low, 0);
  EXPECT_GT(medium, 0);
  EXPECT_GT(high, 0);
}

// ---------------------------------------------------------------------------------------
// KvWrite

TEST_P(CpuFloatOpTest, KvWriteWritesOnlyItsRows) {
  std::mt19937_64 rng(61);
  for (int trial = 0; trial < 3; ++trial) {
    const int64_t kvh = RandInt(rng, 1, 3), d = RandInt(rng, 1, 9) | 1, seq = RandInt(rng, 4, 19);
    // Rows: a random position, position 0, the last position, padding, out of range.
    std::vector<int32_t> pos = {static_cast<int32_t>(RandInt(rng, 1, seq - 2)), 0,
                                static_cast<int32_t>(seq - 1), -1, static_cast<int32_t>(seq)};
    if (trial == 1) pos.resize(3);  // only valid rows: no flag
    const int64_t rows = static_cast<int64_t>(pos.size());
    const int64_t slots = rows + RandInt(rng, 0, 2);  // spare slots must stay untouched
    SCOPED_TRACE(absl::StrCat("rows=", rows, " slots=", slots, " kvh=", kvh, " S=", seq, " d=", d));
    GraphBuilder b;
    const TensorId kv = b.Input("kv", dtype(), {rows, kvh * d});
    const TensorId p = b.Input("pos", DType::kI32, {rows});
    const TensorId cache = b.State("cache", dtype(), {slots, kvh, seq, d});
    b.KvWrite(kv, p, cache, "write");
    auto bench = Bench::Make(b);
    ASSERT_NE(bench, nullptr);
    const std::vector<double> kvs = bench->Set("kv", RandomValues(rng, rows * kvh * d));
    bench->SetInts("pos", pos);
    bench->Set("cache", RandomValues(rng, slots * kvh * seq * d, 2.0f, 3.0f));
    const std::vector<uint8_t> before = bench->Bytes("cache");
    const std::vector<uint8_t> kv_bytes = bench->Bytes("kv");
    CpuDispatch cpu;
    SG_ASSERT_OK(bench->Run(cpu));
    EXPECT_EQ(cpu.TakeErrorFlags(),
              trial == 1 ? 0u : static_cast<uint32_t>(kErrorPositionOutOfRange));
    const std::vector<uint8_t> after = bench->Bytes("cache");
    const int64_t elem = DTypeBytes(dtype());
    // What the cache must hold: the old bytes, with row i's head h at (slot i, h, pos[i]).
    std::vector<uint8_t> want = before;
    for (int64_t i = 0; i < rows; ++i) {
      if (pos[i] < 0 || pos[i] >= seq) continue;
      for (int64_t h = 0; h < kvh; ++h) {
        std::memcpy(want.data() + (((i * kvh + h) * seq + pos[i]) * d) * elem,
                    kv_bytes.data() + (i * kvh + h) * d * elem, d * elem);
      }
    }
    ASSERT_EQ(after.size(), want.size());
    for (size_t e = 0; e < want.size() / elem; ++e) {
      ASSERT_EQ(std::memcmp(after.data() + e * elem, want.data() + e * elem, elem), 0)
          << "cache element " << e << " (slot " << e / (kvh * seq * d) << ", head "
          << e / (seq * d) % kvh << ", position " << e / d % seq << ")";
    }
    EXPECT_NE(after, before) << "nothing was written";
  }
}

// ---------------------------------------------------------------------------------------
// Attention

struct AttentionShape {
  int64_t heads, kv_heads, d, seq;
};

// float64 softmax(q·kᵀ·scale)·v over positions 0..pos[i] of slot i; zeros for padding rows
// and positions outside the cache.
std::vector<double> AttentionReference(const std::vector<double>& q, const std::vector<double>& k,
                                       const std::vector<double>& v,
                                       const std::vector<int32_t>& pos, const AttentionShape& s,
                                       double scale) {
  const int64_t rows = static_cast<int64_t>(pos.size());
  std::vector<double> out(rows * s.heads * s.d, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    if (pos[i] < 0 || pos[i] >= s.seq) continue;
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t kvh = h / (s.heads / s.kv_heads);
      const int64_t cache_base = (i * s.kv_heads + kvh) * s.seq * s.d;
      const int64_t q_base = (i * s.heads + h) * s.d;
      std::vector<double> w(pos[i] + 1);
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t t = 0; t <= pos[i]; ++t) {
        double dot = 0;
        for (int64_t c = 0; c < s.d; ++c) dot += q[q_base + c] * k[cache_base + t * s.d + c];
        w[t] = dot * scale;
        mx = std::max(mx, w[t]);
      }
      double sum = 0;
      for (double& e : w) sum += (e = std::exp(e - mx));
      for (int64_t t = 0; t <= pos[i]; ++t) {
        for (int64_t c = 0; c < s.d; ++c) {
          out[q_base + c] += w[t] / sum * v[cache_base + t * s.d + c];
        }
      }
    }
  }
  return out;
}

TEST_P(CpuFloatOpTest, AttentionMatchesReference) {
  std::mt19937_64 rng(71);
  const AttentionShape shapes[] = {
      {4, 4, 8, 16},  // MHA
      {8, 2, 16, 9},  // GQA, groups of 4
      {6, 3, 5, 7},   // odd head_dim and S
      {2, 1, 32, 33},
  };
  for (const AttentionShape& s : shapes) {
    for (const bool explicit_scale : {false, true}) {
      // Row kinds: first position, last position, two random, padding, out of range.
      std::vector<int32_t> pos = {0,
                                  static_cast<int32_t>(s.seq - 1),
                                  static_cast<int32_t>(RandInt(rng, 1, s.seq - 2)),
                                  static_cast<int32_t>(RandInt(rng, 0, s.seq - 1)),
                                  -1,
                                  static_cast<int32_t>(s.seq + RandInt(rng, 0, 5))};
      const int64_t rows = static_cast<int64_t>(pos.size());
      const int64_t slots = rows + 1;
      const double scale = explicit_scale ? 0.37 : 1.0 / std::sqrt(static_cast<double>(s.d));
      SCOPED_TRACE(absl::StrCat("h=", s.heads, " kvh=", s.kv_heads, " d=", s.d, " S=", s.seq,
                                " scale=", scale));
      GraphBuilder b;
      const TensorId q = b.Input("q", dtype(), {rows, s.heads * s.d});
      const TensorId kc = b.State("k", dtype(), {slots, s.kv_heads, s.seq, s.d});
      const TensorId vc = b.State("v", dtype(), {slots, s.kv_heads, s.seq, s.d});
      const TensorId p = b.Input("pos", DType::kI32, {rows});
      b.Output("y", explicit_scale ? b.Attention(q, kc, vc, p, 0.37f, "y")
                                   : b.Attention(q, kc, vc, p, "y"));
      auto bench = Bench::Make(b);
      ASSERT_NE(bench, nullptr);
      const int64_t cache_n = slots * s.kv_heads * s.seq * s.d;
      // Scores of a few units so that the softmax is neither flat nor one-hot.
      const std::vector<double> qs =
          bench->Set("q", RandomValues(rng, rows * s.heads * s.d, 0.2f, 2.0f));
      const std::vector<double> ks = bench->Set("k", RandomValues(rng, cache_n, 0.2f, 2.0f));
      const std::vector<double> vs = bench->Set("v", RandomValues(rng, cache_n));
      bench->SetInts("pos", pos);
      bench->Poison("y");
      CpuDispatch cpu;
      SG_ASSERT_OK(bench->Run(cpu));
      EXPECT_EQ(cpu.TakeErrorFlags(), static_cast<uint32_t>(kErrorPositionOutOfRange));
      const std::vector<float> got = bench->Floats("y");
      const std::vector<double> want = AttentionReference(qs, ks, vs, pos, s, scale);
      const int64_t cols = s.heads * s.d;
      for (int64_t i = 0; i < rows; ++i) {
        const std::vector<float> g(got.begin() + i * cols, got.begin() + (i + 1) * cols);
        if (pos[i] < 0 || pos[i] >= s.seq) {
          for (int64_t c = 0; c < cols; ++c) {
            ASSERT_EQ(g[c], 0.0f) << "row " << i << " (pos " << pos[i] << ") col " << c;
          }
          continue;
        }
        const std::vector<double> w(want.begin() + i * cols, want.begin() + (i + 1) * cols);
        EXPECT_LE(NormalizedError(g, w), tol()) << "row " << i << " pos " << pos[i];
      }
    }
  }
}

// A prefill step: B sequences of T rows, sequence b in slot seq_slots[b]. Each row must
// get the decode definition applied to its sequence's slot: the reference is run on a
// cache whose slot i is a copy of row i's slot.
TEST_P(CpuFloatOpTest, PrefillAttentionReadsEachSequencesSlot) {
  std::mt19937_64 rng(73);
  const AttentionShape s{8, 2, 16, 24};
  constexpr int64_t kSeqs = 3, kRows = 6, kSlots = 5;
  const std::vector<int32_t> seq_slots = {4, 0, 2};
  // Sequence 0 continues a cached prefix at 10; sequence 1 starts at 0 and pads its last
  // two rows; sequence 2 ends at the cache's last position.
  const std::vector<int32_t> pos = {10, 11, 12, 13, 14, 15, 0, 1, 2, 3, -1, -1,
                                    18, 19, 20, 21, 22, 23};
  const int64_t m = kSeqs * kRows, cols = s.heads * s.d;
  GraphBuilder b;
  const TensorId q = b.Input("q", dtype(), {m, cols});
  const TensorId kc = b.State("k", dtype(), {kSlots, s.kv_heads, s.seq, s.d});
  const TensorId vc = b.State("v", dtype(), {kSlots, s.kv_heads, s.seq, s.d});
  b.Output("y", b.Attention(q, kc, vc, b.Input("pos", DType::kI32, {m}),
                            b.Input("seq_slots", DType::kI32, {kSeqs}), "y"));
  auto bench = Bench::Make(b);
  ASSERT_NE(bench, nullptr);
  const int64_t per_slot = s.kv_heads * s.seq * s.d;
  const std::vector<double> qs = bench->Set("q", RandomValues(rng, m * cols, 0.2f, 2.0f));
  const std::vector<double> ks = bench->Set("k", RandomValues(rng, kSlots * per_slot, 0.2f, 2.0f));
  const std::vector<double> vs = bench->Set("v", RandomValues(rng, kSlots * per_slot));
  bench->SetInts("pos", pos);
  bench->SetInts("seq_slots", seq_slots);
  bench->Poison("y");
  CpuDispatch cpu;
  SG_ASSERT_OK(bench->Run(cpu));
  EXPECT_EQ(cpu.TakeErrorFlags(), 0u);
  std::vector<double> k_by_row(m * per_slot), v_by_row(m * per_slot);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t slot = seq_slots[i / kRows];
    std::copy_n(ks.begin() + slot * per_slot, per_slot, k_by_row.begin() + i * per_slot);
    std::copy_n(vs.begin() + slot * per_slot, per_slot, v_by_row.begin() + i * per_slot);
  }
  const std::vector<double> want =
      AttentionReference(qs, k_by_row, v_by_row, pos, s, 1 / std::sqrt(16.0));
  const std::vector<float> got = bench->Floats("y");
  for (int64_t i = 0; i < m; ++i) {
    const std::vector<float> g(got.begin() + i * cols, got.begin() + (i + 1) * cols);
    const std::vector<double> w(want.begin() + i * cols, want.begin() + (i + 1) * cols);
    if (pos[i] < 0) {
      for (float e : g) ASSERT_EQ(e, 0.0f) << "padding row " << i;
      continue;
    }
    EXPECT_LE(NormalizedError(g, w), tol()) << "row " << i << " pos " << pos[i];
  }

  // A slot out of range gives zeros and the flag; padding rows of that sequence do not.
  bench->SetInts("seq_slots", {4, 7, 2});
  bench->Poison("y");
  SG_ASSERT_OK(bench->Run(cpu));
  EXPECT_EQ(cpu.TakeErrorFlags(), static_cast<uint32_t>(kErrorPositionOutOfRange));
  const std::vector<float> bad = bench->Floats("y");
  for (int64_t c = kRows * cols; c < 2 * kRows * cols; ++c) ASSERT_EQ(bad[c], 0.0f) << c;
  EXPECT_EQ(std::vector<float>(bad.begin(), bad.begin() + kRows * cols),
            std::vector<float>(got.begin(), got.begin() + kRows * cols));
}

TEST_P(CpuFloatOpTest, PrefillKvWriteWritesEachRowToItsSequencesSlot) {
  std::mt19937_64 rng(79);
  constexpr int64_t kSeqs = 2, kRows = 4, kSlots = 3, kvh = 2, d = 6, seq = 10;
  const std::vector<int32_t> seq_slots = {2, 1};
  const std::vector<int32_t> pos = {3, 4, 5, -1, 0, 1, 2, 9};
  GraphBuilder b;
  const TensorId cache = b.State("cache", dtype(), {kSlots, kvh, seq, d});
  b.KvWrite(b.Input("kv", dtype(), {kSeqs * kRows, kvh * d}),
            b.Input("pos", DType::kI32, {kSeqs * kRows}),
            b.Input("seq_slots", DType::kI32, {kSeqs}), cache, "write");
  auto bench = Bench::Make(b);
  ASSERT_NE(bench, nullptr);
  bench->Set("kv", RandomValues(rng, kSeqs * kRows * kvh * d));
  bench->SetInts("pos", pos);
  bench->SetInts("seq_slots", seq_slots);
  bench->Set("cache", RandomValues(rng, kSlots * kvh * seq * d, 2.0f, 3.0f));
  const std::vector<uint8_t> before = bench->Bytes("cache");
  const std::vector<uint8_t> kv_bytes = bench->Bytes("kv");
  CpuDispatch cpu;
  SG_ASSERT_OK(bench->Run(cpu));
  EXPECT_EQ(cpu.TakeErrorFlags(), 0u);
  const int64_t elem = DTypeBytes(dtype());
  std::vector<uint8_t> want = before;
  for (int64_t i = 0; i < kSeqs * kRows; ++i) {
    if (pos[i] < 0) continue;
    const int64_t slot = seq_slots[i / kRows];
    for (int64_t h = 0; h < kvh; ++h) {
      std::memcpy(want.data() + (((slot * kvh + h) * seq + pos[i]) * d) * elem,
                  kv_bytes.data() + (i * kvh + h) * d * elem, d * elem);
    }
  }
  EXPECT_EQ(bench->Bytes("cache"), want);
  EXPECT_NE(want, before);
  // Slot 0 is no sequence's: untouched.
  EXPECT_EQ(std::memcmp(bench->Bytes("cache").data(), before.data(), kvh * seq * d * elem), 0);
}

TEST(CpuDispatchTest, SeqSlotsMustDivideTheRows) {
  GraphBuilder b;
  const TensorId cache = b.State("cache", DType::kF32, {4, 1, 8, 4});
  b.KvWrite(b.Input("kv", DType::kF32, {6, 4}), b.Input("pos", DType::kI32, {6}),
            b.Input("seq_slots", DType::kI32, {4}), cache, "write");
  const absl::Status st = std::move(b).Build().status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("seq_slots"), absl::string_view::npos) << st;
  EXPECT_NE(st.message().find("divides the 6 rows"), absl::string_view::npos) << st;
}

TEST_P(CpuFloatOpTest, AttentionGqaGroupsHeads) {
  // h = 8, kvh = 2: heads 0..3 read kv head 0, heads 4..7 kv head 1. Changing kv head 1's
  // cache must change heads 4..7 and leave heads 0..3 bit for bit.
  std::mt19937_64 rng(72);
  const AttentionShape s{8, 2, 16, 12};
  const int64_t rows = 2, slots = 2;
  GraphBuilder b;
  const TensorId q = b.Input("q", dtype(), {rows, s.heads * s.d});
  const TensorId kc = b.State("k", dtype(), {slots, s.kv_heads, s.seq, s.d});
  const TensorId vc = b.State("v", dtype(), {slots, s.kv_heads, s.seq, s.d});
  const TensorId p = b.Input("pos", DType::kI32, {rows});
  b.Output("y", b.Attention(q, kc, vc, p, "y"));
  auto bench = Bench::Make(b);
  ASSERT_NE(bench, nullptr);
  const int64_t cache_n = slots * s.kv_heads * s.seq * s.d;
  const std::vector<int32_t> pos = {5, 11};
  const std::vector<double> qs = bench->Set("q", RandomValues(rng, rows * s.heads * s.d));
  std::vector<double> ks = bench->Set("k", RandomValues(rng, cache_n));
  std::vector<double> vs = bench->Set("v", RandomValues(rng, cache_n));
  bench->SetInts("pos", pos);
  bench->Poison("y");
  CpuDispatch cpu;
  SG_ASSERT_OK(bench->Run(cpu));
  const std::vector<float> first = bench->Floats("y");
  EXPECT_LE(NormalizedError(first, AttentionReference(qs, ks, vs, pos, s, 1 / std::sqrt(16.0))),
            tol());

  // New keys and values for kv head 1 of every slot, at every position.
  std::vector<float> k2(ks.begin(), ks.end()), v2(vs.begin(), vs.end());
  const std::vector<float> fresh = RandomValues(rng, 2 * cache_n);
  for (int64_t slot = 0; slot < slots; ++slot) {
    for (int64_t e = 0; e < s.seq * s.d; ++e) {
      const int64_t at = (slot * s.kv_heads + 1) * s.seq * s.d + e;
      k2[at] = fresh[at];
      v2[at] = fresh[cache_n + at];
    }
  }
  ks = bench->Set("k", k2);
  vs = bench->Set("v", v2);
  bench->Poison("y");
  SG_ASSERT_OK(bench->Run(cpu));
  const std::vector<float> second = bench->Floats("y");
  EXPECT_LE(NormalizedError(second, AttentionReference(qs, ks, vs, pos, s, 1 / std::sqrt(16.0))),
            tol());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const auto at = first.begin() + (i * s.heads + h) * s.d;
      const std::vector<float> a(at, at + s.d);
      const std::vector<float> c(second.begin() + (at - first.begin()),
                                 second.begin() + (at - first.begin()) + s.d);
      if (h < 4) {
        EXPECT_EQ(a, c) << "row " << i << " head " << h << " changed with kv head 1";
      } else {
        EXPECT_NE(a, c) << "row " << i << " head " << h << " ignored kv head 1";
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Softmax

TEST_P(CpuFloatOpTest, SoftmaxMatchesReference) {
  std::mt19937_64 rng(81);
  for (int trial = 0; trial < 3; ++trial) {
    const int64_t rows = RandInt(rng, 2, 6), n = RandInt(rng, 1, 150) | 1;
    SCOPED_TRACE(absl::StrCat("M=", rows, " N=", n));
    GraphBuilder b;
    const TensorId x = b.Input("x", dtype(), {rows, n});
    b.Output("y", b.Softmax(x, "y"));
    auto bench = Bench::Make(b);
    ASSERT_NE(bench, nullptr);
    std::vector<float> values = RandomValues(rng, rows * n, 0.1f, 5.0f);
    // Large magnitudes, which need the max subtracted: row 0 mixes ±80 (and beyond, where
    // exp overflows f32), row 1 lies wholly in [-120, -80] (where every exp underflows).
    for (int64_t c = 0; c < n; ++c) {
      values[c] = values[c] > 0 ? 80.0f + 8 * std::abs(values[c]) : -80.0f;
      values[n + c] = -80.0f - 8 * std::abs(values[n + c]);
    }
    const std::vector<double> xs = bench->Set("x", values);
    bench->Poison("y");
    CpuDispatch cpu;
    SG_ASSERT_OK(bench->Run(cpu));
    const std::vector<float> got = bench->Floats("y");
    std::vector<double> want(rows * n);
    for (int64_t i = 0; i < rows; ++i) {
      const double mx = *std::max_element(xs.begin() + i * n, xs.begin() + (i + 1) * n);
      double sum = 0;
      for (int64_t c = 0; c < n; ++c) sum += want[i * n + c] = std::exp(xs[i * n + c] - mx);
      for (int64_t c = 0; c < n; ++c) want[i * n + c] /= sum;
      double got_sum = 0;
      for (int64_t c = 0; c < n; ++c) {
        ASSERT_TRUE(std::isfinite(got[i * n + c])) << "row " << i << " col " << c;
        got_sum += got[i * n + c];
      }
      EXPECT_NEAR(got_sum, 1.0, tol()) << "row " << i;
      const std::vector<float> g(got.begin() + i * n, got.begin() + (i + 1) * n);
      const std::vector<double> w(want.begin() + i * n, want.begin() + (i + 1) * n);
      EXPECT_LE(NormalizedError(g, w), tol()) << "row " << i;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Argmax

TEST_P(CpuFloatOpTest, ArgmaxExactWithLowestIndexOnTies) {
  std::mt19937_64 rng(91);
  for (int trial = 0; trial < 3; ++trial) {
    const int64_t rows = 8, n = RandInt(rng, 3, 300) | 1;
    GraphBuilder b;
    const TensorId x = b.Input("x", dtype(), {rows, n});
    b.Output("y", b.Argmax(x, "y"));
    auto bench = Bench::Make(b);
    ASSERT_NE(bench, nullptr);
    std::vector<float> values = RandomValues(rng, rows * n, 0.1f, 8.0f);
    // Rows 0..3: the maximum planted at two or three indices (exact ties in any dtype);
    // row 4: every value equal; row 5: all negative.
    for (int64_t i = 0; i < 4; ++i) {
      const int copies = 2 + static_cast<int>(i % 2);
      for (int r = 0; r < copies; ++r) values[i * n + RandInt(rng, 0, n - 1)] = 9.5f;
    }
    for (int64_t c = 0; c < n; ++c) values[4 * n + c] = -0.75f;
    for (int64_t c = 0; c < n; ++c) values[5 * n + c] = -std::abs(values[5 * n + c]);
    const std::vector<double> xs = bench->Set("x", values);
    bench->Poison("y");
    CpuDispatch cpu;
    SG_ASSERT_OK(bench->Run(cpu));
    const std::vector<int32_t> got = bench->Ints("y");
    for (int64_t i = 0; i < rows; ++i) {
      int64_t best = 0;
      for (int64_t c = 1; c < n; ++c) {
        if (xs[i * n + c] > xs[i * n + best]) best = c;
      }
      EXPECT_EQ(got[i], best) << "row " << i;
    }
  }
}

// A NaN or +inf anywhere in the logits raises kErrorNonFiniteLogits in Argmax and Sample
// (the ids stay defined); finite logits raise nothing, and neither do -inf ones (ids masked
// out), which are never chosen.
TEST_P(CpuFloatOpTest, NonFiniteLogitsRaiseTheFlag) {
  std::mt19937_64 rng(93);
  const int64_t rows = 3, n = 101;
  for (const bool sample : {false, true}) {
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity()}) {
      SCOPED_TRACE(absl::StrCat(sample ? "Sample" : "Argmax", " with ", bad));
      GraphBuilder b;
      const TensorId x = b.Input("x", dtype(), {rows, n});
      if (sample) {
        b.Output("y", b.Sample(x, b.Input("seeds", DType::kI32, {rows}),
                               b.Input("pos", DType::kI32, {rows}),
                               ops::Sample{.temperature = 0.8f, .top_k = 5}, "y"));
      } else {
        b.Output("y", b.Argmax(x, "y"));
      }
      auto bench = Bench::Make(b);
      ASSERT_NE(bench, nullptr);
      std::vector<float> values = RandomValues(rng, rows * n, 0.1f, 8.0f);
      if (sample) {
        bench->SetInts("seeds", {1, 2, 3});
        bench->SetInts("pos", {0, 4, 9});
      }
      bench->Set("x", values);
      CpuDispatch cpu;
      SG_ASSERT_OK(bench->Run(cpu));
      EXPECT_EQ(cpu.TakeErrorFlags(), 0u) << "finite logits raised a flag";
      values[1 * n + RandInt(rng, 0, n - 1)] = bad;
      bench->Set("x", values);
      bench->Poison("y");
      SG_ASSERT_OK(bench->Run(cpu));
      EXPECT_EQ(cpu.TakeErrorFlags(), static_cast<uint32_t>(kErrorNonFiniteLogits));
      for (const int32_t id : bench->Ints("y")) {
        EXPECT_TRUE(id >= 0 && id < n) << id;
      }
    }
    // Every id of row 1 but three masked: one of the three is chosen, and nothing is raised.
    std::vector<float> masked = RandomValues(rng, rows * n, 0.1f, 8.0f);
    for (int64_t j = 0; j < n; ++j) {
      if (j != 5 && j != 50 && j != 99) masked[1 * n + j] = -std::numeric_limits<float>::infinity();
    }
    GraphBuilder b;
    const TensorId x = b.Input("x", dtype(), {rows, n});
    b.Output("y", sample ? b.Sample(x, b.Input("seeds", DType::kI32, {rows}),
                                    b.Input("pos", DType::kI32, {rows}),
                                    ops::Sample{.temperature = 50.0f}, "y")
                         : b.Argmax(x, "y"));
    auto bench = Bench::Make(b);
    ASSERT_NE(bench, nullptr);
    if (sample) {
      bench->SetInts("seeds", {1, 2, 3});
      bench->SetInts("pos", {0, 4, 9});
    }
    bench->Set("x", masked);
    CpuDispatch cpu;
    for (int trial = 0; trial < 8; ++trial) {
      if (sample) bench->SetInts("seeds", {trial, 100 + trial, 7});
      bench->Poison("y");
      SG_ASSERT_OK(bench->Run(cpu));
      EXPECT_EQ(cpu.TakeErrorFlags(), 0u) << "-inf logits raised a flag";
      const int32_t id = bench->Ints("y")[1];
      EXPECT_TRUE(id == 5 || id == 50 || id == 99) << id;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Sample

// A one-node Sample graph over `rows` x `vocab` logits.
std::unique_ptr<Bench> SampleBench(DType t, int64_t rows, int64_t vocab,
                                   const ops::Sample& params) {
  GraphBuilder b;
  const TensorId logits = b.Input("logits", t, {rows, vocab});
  const TensorId seeds = b.Input("seeds", DType::kI32, {rows});
  const TensorId pos = b.Input("pos", DType::kI32, {rows});
  b.Output("y", b.Sample(logits, seeds, pos, params, "y"));
  return Bench::Make(b);
}

std::vector<int32_t> DistinctSeeds(int64_t rows, int32_t salt) {
  std::vector<int32_t> s(rows);
  for (int64_t i = 0; i < rows; ++i) s[i] = static_cast<int32_t>(i * 7919 + salt);
  return s;
}

// Token indices sorted by value, descending (ties by index).
std::vector<int64_t> Descending(const double* z, int64_t n) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return z[a] > z[b]; });
  return order;
}

// The tokens Sample may choose for one row, computed in float64: the top_k largest (all
// tokens equal to the k-th largest included), then the smallest prefix by probability
// whose mass reaches top_p (again with ties at its end). A prefix whose mass misses top_p
// by less than f32 noise may or may not be extended by f32 math, so the set is taken at
// top_p·(1 + 1e-5). Also returns the probability mass, under the unrestricted softmax,
// of the tokens outside the set.
std::vector<bool> AllowedTokens(const double* logits, int64_t n, const ops::Sample& op,
                                double* excluded_mass) {
  std::vector<double> z(logits, logits + n);
  for (double& v : z) v /= op.temperature;
  const std::vector<int64_t> order = Descending(z.data(), n);
  const double mx = z[order[0]];
  std::vector<double> p(n);
  double all = 0;
  for (int64_t c = 0; c < n; ++c) all += p[c] = std::exp(z[c] - mx);
  int64_t keep = n;
  if (op.top_k > 0 && op.top_k < n) {
    keep = op.top_k;
    while (keep < n && z[order[keep]] == z[order[keep - 1]]) ++keep;
  }
  if (op.top_p < 1.0f) {
    double total = 0;
    for (int64_t r = 0; r < keep; ++r) total += p[order[r]];
    double cum = 0;
    int64_t r = 0;
    while (r < keep) {
      cum += p[order[r++]];
      if (cum >= op.top_p * (1 + 1e-5) * total) break;
    }
    while (r < keep && z[order[r]] == z[order[r - 1]]) ++r;
    keep = r;
  }
  std::vector<bool> allowed(n, false);
  double kept_mass = 0;
  for (int64_t r = 0; r < keep; ++r) {
    allowed[order[r]] = true;
    kept_mass += p[order[r]];
  }
  *excluded_mass = 1.0 - kept_mass / all;
  return allowed;
}

TEST_P(CpuFloatOpTest, SampleStaysInTopKAndTopPSets) {
  struct Case {
    int64_t vocab;
    ops::Sample op;
  };
  const Case cases[] = {
      {50, {1.0f, 5, 1.0f}},   // top_k only
      {37, {0.7f, 0, 0.6f}},   // top_p only
      {64, {1.3f, 12, 0.8f}},  // both
      {33, {1.0f, 1, 1.0f}},   // top_k = 1 is greedy
  };
  std::mt19937_64 rng(101);
  for (const Case& k : cases) {
    const int64_t rows = 1500;
    SCOPED_TRACE(absl::StrCat("V=", k.vocab, " T=", k.op.temperature, " top_k=", k.op.top_k,
                              " top_p=", k.op.top_p));
    auto bench = SampleBench(dtype(), rows, k.vocab, k.op);
    ASSERT_NE(bench, nullptr);
    const std::vector<double> logits =
        bench->Set("logits", RandomValues(rng, rows * k.vocab, 0.1f, 3.0f));
    bench->SetInts("seeds", DistinctSeeds(rows, 5));
    std::vector<int32_t> pos(rows);
    for (int32_t& p : pos) p = static_cast<int32_t>(RandInt(rng, 0, 5000));
    bench->SetInts("pos", pos);
    bench->Poison("y");
    CpuDispatch cpu;
    SG_ASSERT_OK(bench->Run(cpu));
    const std::vector<int32_t> got = bench->Ints("y");
    double excluded = 0;
    std::vector<int64_t> hits(k.vocab, 0);
    for (int64_t i = 0; i < rows; ++i) {
      double ex = 0;
      const std::vector<bool> allowed = AllowedTokens(&logits[i * k.vocab], k.vocab, k.op, &ex);
      excluded += ex;
      ASSERT_GE(got[i], 0) << "row " << i;
      ASSERT_LT(got[i], k.vocab) << "row " << i;
      ASSERT_TRUE(allowed[got[i]])
          << "row " << i << " drew token " << got[i] << ", outside the top_k / top_p set";
      if (k.op.top_k == 1) {
        // Greedy: the lowest index among the maxima, like Argmax.
        const std::vector<int64_t> order = Descending(&logits[i * k.vocab], k.vocab);
        ASSERT_EQ(got[i], order[0]) << "row " << i;
      }
      ++hits[got[i]];
    }
    // The sets must cut real mass, or a sampler ignoring top_k / top_p would pass too.
    EXPECT_GT(excluded / rows, 0.15);
    // And the draws must spread, or a sampler returning the argmax would pass.
    if (k.op.top_k != 1) {
      EXPECT_GT(std::count_if(hits.begin(), hits.end(), [](int64_t h) { return h > 0; }),
                k.vocab / 2);
    }
  }
}

// A temperature below ops::Sample's greedy threshold (1e-5; 1e-40 is a float denormal
// whose reciprocal overflows) draws the argmax on every seed, lowest index on ties, as the
// limit of softmax(z / T) does, and raises nothing. A finite logit whose z = logit / T
// overflows raises kErrorNonFiniteLogits: the draw would otherwise be made from NaNs.
TEST_P(CpuFloatOpTest, SampleBelowTheGreedyTemperatureIsArgmax) {
  std::mt19937_64 rng(94);
  const int64_t rows = 16, n = 257;
  for (const float t : {1e-40f, 1e-30f, 9e-6f}) {
    for (const ops::Sample& params : {ops::Sample{.temperature = t},
                                      ops::Sample{.temperature = t, .top_k = 7, .top_p = 0.5f}}) {
      SCOPED_TRACE(absl::StrCat("temperature ", t, " top_k ", params.top_k));
      GraphBuilder b;
      const TensorId x = b.Input("x", dtype(), {rows, n});
      b.Output("y", b.Sample(x, b.Input("seeds", DType::kI32, {rows}),
                             b.Input("pos", DType::kI32, {rows}), params, "y"));
      auto bench = Bench::Make(b);
      ASSERT_NE(bench, nullptr);
      std::vector<float> values = RandomValues(rng, rows * n, 0.1f, 8.0f);
      values[3 * n + 200] = values[3 * n + 100] = 9.0f;  // a tie: the lower index wins
      const std::vector<double> xs = bench->Set("x", values);
      bench->SetInts("seeds", DistinctSeeds(rows, 5));
      bench->SetInts("pos", std::vector<int32_t>(rows, 3));
      bench->Poison("y");
      CpuDispatch cpu;
      SG_ASSERT_OK(bench->Run(cpu));
      EXPECT_EQ(cpu.TakeErrorFlags(), 0u);
      const std::vector<int32_t> got = bench->Ints("y");
      for (int64_t i = 0; i < rows; ++i) {
        int32_t best = 0;
        for (int32_t c = 1; c < n; ++c) {
          if (xs[i * n + c] > xs[i * n + best]) best = c;
        }
        EXPECT_EQ(got[i], best) << "row " << i;
      }
    }
  }
  if (dtype() == DType::kF16) return;  // its largest logit / 0.5 stays finite
  GraphBuilder b;
  const TensorId x = b.Input("x", dtype(), {1, n});
  b.Output("y", b.Sample(x, b.Input("seeds", DType::kI32, {1}), b.Input("pos", DType::kI32, {1}),
                         ops::Sample{.temperature = 0.5f}, "y"));
  auto bench = Bench::Make(b);
  ASSERT_NE(bench, nullptr);
  std::vector<float> values = RandomValues(rng, n, 0.1f, 8.0f);
  values[17] = 3e38f;
  bench->Set("x", values);
  bench->SetInts("seeds", {1});
  bench->SetInts("pos", {0});
  bench->Poison("y");
  CpuDispatch cpu;
  SG_ASSERT_OK(bench->Run(cpu));
  EXPECT_EQ(cpu.TakeErrorFlags(), static_cast<uint32_t>(kErrorNonFiniteLogits));
  EXPECT_EQ(bench->Ints("y")[0], 17);
}

TEST_P(CpuFloatOpTest, SampleIsReproducible) {
  const int64_t rows = 400, vocab = 29;
  const ops::Sample op{0.9f, 0, 0.95f};
  std::mt19937_64 rng(111);
  auto bench = SampleBench(dtype(), rows, vocab, op);
  ASSERT_NE(bench, nullptr);
  // The same logits in every row, so that only the random stream tells rows apart.
  const std::vector<float> row = RandomValues(rng, vocab, 0.1f, 2.0f);
  std::vector<float> logits;
  for (int64_t i = 0; i < rows; ++i) logits.insert(logits.end(), row.begin(), row.end());
  bench->Set("logits", logits);
  const std::vector<int32_t> seeds = DistinctSeeds(rows, 3);
  std::vector<int32_t> pos(rows);
  for (int32_t& p : pos) p = static_cast<int32_t>(RandInt(rng, 0, 100));

  auto draw = [&](CpuDispatch& cpu, const std::vector<int32_t>& s, const std::vector<int32_t>& p) {
    bench->SetInts("seeds", s);
    bench->SetInts("pos", p);
    bench->Poison("y");
    const absl::Status st = bench->Run(cpu);
    EXPECT_TRUE(st.ok()) << st;
    return bench->Ints("y");
  };
  CpuDispatch cpu_a, cpu_b;
  const std::vector<int32_t> first = draw(cpu_a, seeds, pos);
  EXPECT_EQ(draw(cpu_a, seeds, pos), first) << "second run on the same dispatcher";
  EXPECT_EQ(draw(cpu_b, seeds, pos), first) << "another dispatcher instance";

  // Different seeds (or positions) across rows with equal logits must not all agree.
  const auto distinct = [](const std::vector<int32_t>& ids) {
    return std::any_of(ids.begin(), ids.end(), [&](int32_t id) { return id != ids[0]; });
  };
  EXPECT_TRUE(distinct(first)) << "every seed drew token " << first[0];
  const std::vector<int32_t> one_seed(rows, 12345);
  std::vector<int32_t> positions(rows);
  std::iota(positions.begin(), positions.end(), 0);
  const std::vector<int32_t> by_pos = draw(cpu_a, one_seed, positions);
  EXPECT_TRUE(distinct(by_pos)) << "every position drew token " << by_pos[0];
  // Same seed and position in every row: the same token in every row.
  const std::vector<int32_t> fixed = draw(cpu_a, one_seed, std::vector<int32_t>(rows, 9));
  EXPECT_FALSE(distinct(fixed));
  // Another set of seeds gives another sequence of ids.
  EXPECT_NE(draw(cpu_a, DistinctSeeds(rows, 99991), pos), first);
}

TEST_P(CpuFloatOpTest, SampleNeverDrawsAZeroProbabilityToken) {
  // The draw compares u·total with a running sum of the kept probabilities. u is at most
  // 1 - 2^-24, so u·total < total; but if total and the running sum are added up in
  // different orders, f32 rounding can leave the running sum a few ulps short of u·total,
  // and a sampler that then falls back to "the last kept token" returns a token whose
  // probability is zero. These seeds draw exactly u = 1 - 2^-24 at position 0 (found by
  // search), and the last token of every row has probability 0 (exp(-200) underflows).
  const std::vector<int32_t> top_u_seeds = {20387340, 53489433, 60179280,
                                            73106831, 78890930, 92673600};
  for (int32_t seed : top_u_seeds) ASSERT_EQ(SampleUniform(seed, 0), 1.0f - 0x1p-24f) << seed;
  std::mt19937_64 rng(141);
  for (const int64_t vocab : {8, 61}) {
    const int64_t rows = 600;
    auto bench = SampleBench(dtype(), rows, vocab, ops::Sample{});
    ASSERT_NE(bench, nullptr);
    std::vector<float> logits = RandomValues(rng, rows * vocab, 0.1f, 6.0f);
    for (int64_t i = 0; i < rows; ++i) logits[i * vocab + vocab - 1] = -200.0f;
    bench->Set("logits", logits);
    std::vector<int32_t> seeds(rows);
    for (int64_t i = 0; i < rows; ++i) seeds[i] = top_u_seeds[i % top_u_seeds.size()];
    bench->SetInts("seeds", seeds);
    bench->SetInts("pos", std::vector<int32_t>(rows, 0));
    bench->Poison("y");
    CpuDispatch cpu;
    SG_ASSERT_OK(bench->Run(cpu));
    const std::vector<int32_t> got = bench->Ints("y");
    for (int64_t i = 0; i < rows; ++i) {
      ASSERT_GE(got[i], 0);
      ASSERT_LT(got[i], vocab - 1)
          << "row " << i << " (V=" << vocab << ") drew the token of probability 0";
    }
  }
}

TEST_P(CpuFloatOpTest, SampleFrequenciesMatchSoftmax) {
  // 8 logits, 20,000 rows with distinct seeds: each row is an independent draw, so the
  // count of token c is Binomial(N, p_c) with p = softmax(logits / T) (renormalised over
  // the top_k when set). Every frequency must be within 5 standard errors and the
  // chi-square statistic (7 degrees of freedom) below 40, which a correct sampler
  // exceeds with probability ~1e-6.
  const int64_t rows = 20000, vocab = 8;
  const std::vector<float> logit_values = {1.2f, -0.4f, 0.3f, 2.0f, -1.1f, 0.9f, 0.25f, -2.5f};
  struct Case {
    float temperature;
    int32_t top_k;
  };
  double top_freq[3] = {0, 0, 0};
  int case_index = 0;
  for (const Case k : {Case{0.5f, 0}, Case{1.0f, 0}, Case{2.0f, 0}, Case{1.0f, 3}}) {
    SCOPED_TRACE(absl::StrCat("T=", k.temperature, " top_k=", k.top_k));
    auto run = SampleBench(dtype(), rows, vocab, ops::Sample{k.temperature, k.top_k, 1.0f});
    ASSERT_NE(run, nullptr);
    std::vector<float> logits;
    for (int64_t i = 0; i < rows; ++i) {
      logits.insert(logits.end(), logit_values.begin(), logit_values.end());
    }
    const std::vector<double> stored = run->Set("logits", logits);
    run->SetInts("seeds", DistinctSeeds(rows, 1000 * case_index + 17));
    std::vector<int32_t> pos(rows);
    for (int64_t i = 0; i < rows; ++i) pos[i] = static_cast<int32_t>(i % 97);
    run->SetInts("pos", pos);
    run->Poison("y");
    CpuDispatch cpu;
    SG_ASSERT_OK(run->Run(cpu));
    std::vector<int64_t> count(vocab, 0);
    for (int32_t id : run->Ints("y")) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, vocab);
      ++count[id];
    }
    // Expected probabilities in float64 from the stored logits.
    std::vector<double> p(vocab, 0.0);
    const std::vector<int64_t> order = Descending(stored.data(), vocab);
    const int64_t keep = k.top_k > 0 ? k.top_k : vocab;
    double sum = 0;
    for (int64_t r = 0; r < keep; ++r) {
      sum += p[order[r]] = std::exp((stored[order[r]] - stored[order[0]]) / k.temperature);
    }
    double chi2 = 0;
    for (int64_t c = 0; c < vocab; ++c) {
      p[c] /= sum;
      const double freq = static_cast<double>(count[c]) / rows;
      if (p[c] == 0) {
        EXPECT_EQ(count[c], 0) << "token " << c << " is outside the top_k";
        continue;
      }
      const double se = std::sqrt(p[c] * (1 - p[c]) / rows);
      EXPECT_NEAR(freq, p[c], 5 * se) << "token " << c;
      chi2 += (count[c] - rows * p[c]) * (count[c] - rows * p[c]) / (rows * p[c]);
    }
    EXPECT_LT(chi2, 40.0);
    if (k.top_k == 0) top_freq[case_index] = static_cast<double>(count[order[0]]) / rows;
    ++case_index;
  }
  // Lower temperature sharpens the distribution, higher flattens it.
  EXPECT_GT(top_freq[0], top_freq[1] + 0.1);
  EXPECT_GT(top_freq[1], top_freq[2] + 0.1);
}

// ---------------------------------------------------------------------------------------
// Copy, Advance

TEST(CpuDispatchTest, CopyCopiesBytesIntoDestination) {
  std::mt19937_64 rng(121);
  for (const DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    for (const bool to_state : {false, true}) {
      const Shape shape{RandInt(rng, 1, 5), RandInt(rng, 1, 33) | 1};
      SCOPED_TRACE(absl::StrCat(DTypeName(t), " into ", to_state ? "State" : "Input"));
      GraphBuilder b;
      const TensorId src = b.Input("src", t, shape);
      const TensorId dst = to_state ? b.State("dst", t, shape) : b.Input("dst", t, shape);
      b.Copy(src, dst, "copy");
      auto bench = Bench::Make(b);
      ASSERT_NE(bench, nullptr);
      // Random bytes: the copy must move bit patterns, whatever they mean.
      for (const char* name : {"src", "dst"}) {
        HostTensor& h = bench->Bound(name);
        auto* bytes = static_cast<uint8_t*>(h.data());
        for (int64_t i = 0; i < h.bytes(); ++i) bytes[i] = static_cast<uint8_t>(rng() | 1);
      }
      const std::vector<uint8_t> src_bytes = bench->Bytes("src");
      ASSERT_NE(bench->Bytes("dst"), src_bytes);
      CpuDispatch cpu;
      SG_ASSERT_OK(bench->Run(cpu));
      EXPECT_EQ(bench->Bytes("dst"), src_bytes);
      EXPECT_EQ(bench->Bytes("src"), src_bytes) << "the source changed";
    }
  }
}

TEST(CpuDispatchTest, AdvanceIncrementsNonNegativePositions) {
  const std::vector<int32_t> pos = {0, 5, -1, 4094, -7, 1, std::numeric_limits<int32_t>::min(), 31};
  for (const bool state : {false, true}) {
    GraphBuilder b;
    const Shape shape{static_cast<int64_t>(pos.size())};
    const TensorId p =
        state ? b.State("pos", DType::kI32, shape) : b.Input("pos", DType::kI32, shape);
    b.Advance(p, "advance");
    auto bench = Bench::Make(b);
    ASSERT_NE(bench, nullptr);
    bench->SetInts("pos", pos);
    CpuDispatch cpu;
    SG_ASSERT_OK(bench->Run(cpu));
    const std::vector<int32_t> got = bench->Ints("pos");
    for (size_t i = 0; i < pos.size(); ++i) {
      EXPECT_EQ(got[i], pos[i] >= 0 ? pos[i] + 1 : pos[i]) << "row " << i;
    }
  }
}

// The last i32 position cannot advance: it stays (never wrapping to a negative position,
// which would read as padding) and raises kErrorPositionOutOfRange; the other rows advance.
TEST(CpuDispatchTest, AdvanceAtInt32MaxRaisesTheFlagInsteadOfWrapping) {
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  const std::vector<int32_t> pos = {kMax - 1, kMax, -1, 17, kMax};
  GraphBuilder b;
  b.Advance(b.Input("pos", DType::kI32, {static_cast<int64_t>(pos.size())}), "advance");
  auto bench = Bench::Make(b);
  ASSERT_NE(bench, nullptr);
  bench->SetInts("pos", pos);
  CpuDispatch cpu;
  SG_ASSERT_OK(bench->Run(cpu));
  EXPECT_EQ(bench->Ints("pos"), (std::vector<int32_t>{kMax, kMax, -1, 18, kMax}));
  EXPECT_EQ(cpu.TakeErrorFlags(), static_cast<uint32_t>(kErrorPositionOutOfRange));
  // One step below the edge raises nothing.
  bench->SetInts("pos", {kMax - 2, 0, -1, 3, 4});
  SG_ASSERT_OK(bench->Run(cpu));
  EXPECT_EQ(cpu.TakeErrorFlags(), 0u);
}

// ---------------------------------------------------------------------------------------
// Penalize, CountIds

// The controls as their sources define them, in double from the sequences' ids: transformers'
// RepetitionPenaltyLogitsProcessor over prompt and generated ids, OpenAI's presence and
// frequency penalties over the generated ids, the biases, then min-p on softmax(l / T).
struct PenaltyRef {
  double rep = 1, presence = 0, frequency = 0, min_p = 0, temperature = 1;
  std::vector<std::pair<int32_t, float>> bias;
  std::vector<int32_t> prompt, generated;
};

std::vector<double> ReferencePenalties(std::vector<double> l, const PenaltyRef& r) {
  const int64_t n = static_cast<int64_t>(l.size());
  std::vector<int> in_seq(n, 0), gen(n, 0);
  for (int32_t id : r.prompt) in_seq[id] = 1;
  for (int32_t id : r.generated) {
    in_seq[id] = 1;
    ++gen[id];
  }
  for (int64_t v = 0; v < n; ++v) {
    if (in_seq[v]) l[v] = l[v] < 0 ? l[v] * r.rep : l[v] / r.rep;
    l[v] -= r.presence * (gen[v] > 0 ? 1 : 0) + r.frequency * gen[v];
  }
  for (const auto& [id, b] : r.bias) l[id] += b;
  if (r.min_p > 0) {
    const double mx = *std::max_element(l.begin(), l.end());
    for (double& x : l) {
      if (std::exp((x - mx) / r.temperature) < r.min_p) x = -INFINITY;
    }
  }
  return l;
}

TEST_P(CpuFloatOpTest, PenalizeMatchesAnIndependentReference) {
  std::mt19937_64 rng(331);
  constexpr int64_t kRows = 4, kSlots = 6, kVocab = 777;
  GraphBuilder b;
  b.Output("out", b.Penalize(b.Input("logits", dtype(), {kRows, kVocab}),
                             b.State("params", DType::kF32, {kSlots, ops::kPenaltyParams}),
                             b.State("counts", DType::kI32, {kSlots, kVocab}), "out"));
  auto bench = Bench::Make(b);
  ASSERT_NE(bench, nullptr);
  std::vector<PenaltyRef> refs(kRows);
  refs[0] = {};  // neutral: the logits as they are
  refs[1] = {.rep = 1.3, .presence = 0.4, .frequency = 0.25};
  refs[2] = {.bias = {{5, 3.5f}, {kVocab - 1, -2.25f}, {5, 0.5f}}};
  refs[3] = {.rep = 0.85, .presence = -0.3, .frequency = 0.6, .min_p = 0.1, .temperature = 0.7,
             .bias = {{17, 2.0f}, {0, -100.0f}}};
  std::uniform_int_distribution<int32_t> id(0, kVocab - 1);
  std::vector<float> params(kSlots * ops::kPenaltyParams, 0.0f);
  std::vector<int32_t> counts(kSlots * kVocab, 0);
  for (int64_t i = 0; i < kRows; ++i) {
    PenaltyRef& r = refs[i];
    for (int k = 0; k < 40; ++k) r.prompt.push_back(id(rng));
    for (int k = 0; k < 60; ++k) r.generated.push_back(id(rng) % 50);  // repeats
    float* p = params.data() + i * ops::kPenaltyParams;
    p[ops::kPenaltyRepetition] = static_cast<float>(r.rep);
    p[ops::kPenaltyPresence] = static_cast<float>(r.presence);
    p[ops::kPenaltyFrequency] = static_cast<float>(r.frequency);
    p[ops::kPenaltyMinPMargin] = r.min_p > 0 ? static_cast<float>(r.temperature * std::log(r.min_p))
                                             : -INFINITY;
    p[ops::kPenaltyBiasCount] = static_cast<float>(r.bias.size());
    for (size_t j = 0; j < r.bias.size(); ++j) {
      p[ops::kPenaltyBiasFirst + 2 * j] = static_cast<float>(r.bias[j].first);
      p[ops::kPenaltyBiasFirst + 2 * j + 1] = r.bias[j].second;
    }
    for (int32_t v : r.prompt) counts[i * kVocab + v] |= 1;
    for (int32_t v : r.generated) counts[i * kVocab + v] += 2;
  }
  bench->SetInts("counts", counts);
  HostTensor& pt = bench->Bound("params");
  std::memcpy(pt.data(), params.data(), params.size() * sizeof(float));
  std::vector<float> logits(kRows * kVocab);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& x : logits) x = normal(rng);
  const std::vector<double> stored = bench->Set("logits", logits);
  bench->Poison("out");
  CpuDispatch cpu;
  SG_ASSERT_OK(bench->Run(cpu));
  const std::vector<float> got = bench->Floats("out");
  for (int64_t i = 0; i < kRows; ++i) {
    SCOPED_TRACE(absl::StrCat("row ", i));
    const std::vector<double> want = ReferencePenalties(
        std::vector<double>(stored.begin() + i * kVocab, stored.begin() + (i + 1) * kVocab),
        refs[i]);
    int64_t kept = 0, changed = 0;
    for (int64_t v = 0; v < kVocab; ++v) {
      const double g = got[i * kVocab + v];
      changed += g != stored[i * kVocab + v];
      if (std::isinf(want[v])) {
        EXPECT_TRUE(std::isinf(g) && g < 0) << "id " << v << " should be cut by min-p, got " << g;
        continue;
      }
      ++kept;
      EXPECT_NEAR(g, want[v], 1e-5 * (1 + std::abs(want[v]))) << "id " << v;
    }
    if (i == 0) {
      EXPECT_EQ(changed, 0);
    } else {
      EXPECT_GT(changed, 0);
    }
    if (i == 3) {
      EXPECT_GT(kept, 1);
      EXPECT_LT(kept, kVocab / 2) << "min-p cut too little to test anything";
    }
  }
  EXPECT_EQ(bench->Ints("counts"), counts) << "Penalize must not write the counts";
}

TEST(CpuDispatchTest, CountIdsCountsChosenIdsOfLiveRowsOnly) {
  GraphBuilder b;
  b.CountIds(b.Input("ids", DType::kI32, {4}), b.Input("pos", DType::kI32, {4}),
             b.State("counts", DType::kI32, {5, 100}), "count");
  auto bench = Bench::Make(b);
  ASSERT_NE(bench, nullptr);
  std::mt19937_64 rng(17);
  std::vector<int32_t> counts(500);
  for (int32_t& c : counts) c = static_cast<int32_t>(rng() % 7);
  counts[1 * 100 + 42] = std::numeric_limits<int32_t>::max() - 1;  // saturates
  bench->SetInts("counts", counts);
  bench->SetInts("ids", {3, 42, 9, 100});
  bench->SetInts("pos", {0, 7, -1, 2});
  CpuDispatch cpu;
  SG_ASSERT_OK(bench->Run(cpu));
  std::vector<int32_t> want = counts;
  want[0 * 100 + 3] += 2;  // row 1 saturated, row 2 padding, row 3 out of range
  EXPECT_EQ(bench->Ints("counts"), want);
  EXPECT_EQ(cpu.TakeErrorFlags(), static_cast<uint32_t>(kErrorTokenOutOfRange));
}

// ---------------------------------------------------------------------------------------
// Half conversions

float Bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(HalfTest, BF16KnownValues) {
  EXPECT_EQ(FloatToBF16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBF16(-2.0f), 0xc000);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa, 1.
  EXPECT_EQ(FloatToBF16(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up.
  EXPECT_EQ(FloatToBF16(1.0f + 3 * 0x1p-8f), 0x3f82);
  // Just above halfway rounds up, just below rounds down.
  EXPECT_EQ(FloatToBF16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  EXPECT_EQ(FloatToBF16(1.0f + 0x1p-8f - 0x1p-20f), 0x3f80);
  EXPECT_EQ(FloatToBF16(-(1.0f + 0x1p-8f + 0x1p-20f)), 0xbf81);
  // Overflow to infinity: the largest float rounds past the largest bf16.
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBF16(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBF16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBF16(-0.0f), 0x8000);
  // f32 subnormals keep their top bits, as bf16 has the same exponent range.
  EXPECT_EQ(FloatToBF16(Bits(0x00010000u)), 0x0001);
  // NaN stays NaN (a NaN whose payload lives only in the low bits must not become inf).
  for (const uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
    const uint16_t h = FloatToBF16(Bits(nan));
    EXPECT_TRUE(std::isnan(BF16ToFloat(h))) << std::hex << nan << " -> " << h;
    EXPECT_EQ(h & 0x8000, (nan >> 16) & 0x8000) << "sign of " << std::hex << nan;
  }
  EXPECT_EQ(BF16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(BF16ToFloat(0x0001), Bits(0x00010000u));
}

TEST(HalfTest, HalfKnownValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);  // the largest half
  // 1 + 2^-11 is a tie between 1 (even) and 1 + 2^-10: down; 1 + 3·2^-11: up to even.
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
  // Overflow: 65519 still rounds to 65504; 65520 is the tie with 65536 and goes to inf.
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-65520.0f), 0xfc00);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
  // Subnormal halves: 2^-24 is the smallest, 2^-25 ties to 0, a bit more rounds up.
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);
  EXPECT_EQ(FloatToHalf(-0x1p-24f), 0x8001);
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);
  EXPECT_EQ(FloatToHalf(0x1p-25f + 0x1p-40f), 0x0001);
  EXPECT_EQ(FloatToHalf(1.5f * 0x1p-24f), 0x0002);     // tie 1 | 2: even
  EXPECT_EQ(FloatToHalf(2.5f * 0x1p-24f), 0x0002);     // tie 2 | 3: even
  EXPECT_EQ(FloatToHalf(3.5f * 0x1p-24f), 0x0004);     // tie 3 | 4: even
  EXPECT_EQ(FloatToHalf(1023 * 0x1p-24f), 0x03ff);     // the largest subnormal
  EXPECT_EQ(FloatToHalf(1023.5f * 0x1p-24f), 0x0400);  // tie with the smallest normal
  EXPECT_EQ(FloatToHalf(0x1p-14f), 0x0400);
  EXPECT_EQ(FloatToHalf(1e-30f), 0x0000);
  EXPECT_EQ(FloatToHalf(-1e-30f), 0x8000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(HalfToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x03ff), 1023 * 0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x8200), -0x1p-15f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0x3555), 0x1.554p-2f);
  for (const uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7f802000u}) {
    const uint16_t h = FloatToHalf(Bits(nan));
    EXPECT_TRUE(std::isnan(HalfToFloat(h))) << std::hex << nan << " -> " << h;
    EXPECT_EQ(h & 0x8000, (nan >> 16) & 0x8000) << "sign of " << std::hex << nan;
  }
}

TEST(HalfTest, EveryPatternRoundTrips) {
  for (uint32_t p = 0; p <= 0xffff; ++p) {
    const auto h = static_cast<uint16_t>(p);
    const float b = BF16ToFloat(h);
    if (std::isnan(b)) {
      ASSERT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(b)))) << std::hex << p;
    } else {
      ASSERT_EQ(FloatToBF16(b), h) << "bf16 " << std::hex << p;
    }
    const float f = HalfToFloat(h);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << std::hex << p;
    } else {
      ASSERT_EQ(FloatToHalf(f), h) << "f16 " << std::hex << p;
    }
  }
}

// For random floats over the whole range, the result is the nearest representable value,
// ties to the even pattern, judged in float64 from the neighbours of the result.
TEST(HalfTest, RoundsToNearestEven) {
  std::mt19937_64 rng(131);
  struct Format {
    const char* name;
    uint16_t (*to)(float);
    float (*from)(uint16_t);
    double overflow;  // smallest magnitude that rounds to infinity
  };
  const Format formats[] = {
      {"bf16", FloatToBF16, BF16ToFloat, std::ldexp(1.0, 128) - std::ldexp(1.0, 119)},
      {"f16", FloatToHalf, HalfToFloat, 65520.0},
  };
  for (const Format& fmt : formats) {
    for (int n = 0; n < 300000; ++n) {
      // Random exponents weighted towards the 16-bit range, and every third value an exact
      // midpoint between two neighbouring 16-bit values (random floats almost never are).
      uint32_t bits = static_cast<uint32_t>(rng());
      if (n % 3 == 1) bits = (bits & 0x807fffffu) | ((100u + (bits >> 23) % 60u) << 23);
      float f = Bits(bits);
      if (n % 3 == 2) {
        const auto lo = static_cast<uint16_t>(bits & 0x7ffe);  // finite, not the largest
        f = static_cast<float>(
            (static_cast<double>(fmt.from(lo)) + fmt.from(static_cast<uint16_t>(lo + 1))) / 2);
        if ((bits >> 31) != 0) f = -f;
      }
      if (std::isnan(f) || std::isinf(f)) continue;
      const uint16_t h = fmt.to(f);
      const double x = f, got = fmt.from(h);
      if (std::abs(x) >= fmt.overflow) {
        ASSERT_TRUE(std::isinf(got) && (got > 0) == (x > 0)) << fmt.name << " " << x;
        continue;
      }
      ASSERT_TRUE(std::isfinite(got)) << fmt.name << " " << x << " -> " << std::hex << h;
      // Neighbouring patterns of the same sign (magnitude one step down and up).
      const uint16_t mag = h & 0x7fff, sign = h & 0x8000;
      const double err = std::abs(got - x);
      for (const int step : {-1, 1}) {
        if (mag == 0 && step < 0) continue;
        const double other = fmt.from(static_cast<uint16_t>(sign | (mag + step)));
        if (!std::isfinite(other)) continue;
        const double other_err = std::abs(other - x);
        ASSERT_LE(err, other_err) << fmt.name << " " << x << " -> " << got << ", but " << other
                                  << " is nearer";
        if (err == other_err) {
          ASSERT_EQ(mag & 1, 0) << fmt.name << " tie " << x << " went to an odd pattern";
        }
      }
      // Zero results must not hide a closer value of the other sign's smallest pattern.
      if (mag == 0) {
        ASSERT_LE(err, std::abs(fmt.from(1) - std::abs(x))) << fmt.name << " " << x;
      }
      ASSERT_EQ(std::signbit(got), std::signbit(x)) << fmt.name << " " << x;
    }
  }
}

// ---------------------------------------------------------------------------------------
// A whole tiny Llama step

// One decode graph of the tiny Llama with its host buffers; greedy, open loop (the test
// feeds ids and positions each step).
class LlamaRunner {
 public:
  static std::unique_ptr<LlamaRunner> Make(const LlamaConfig& config, int64_t batch) {
    LlamaGraphOptions options;
    options.batch = batch;
    options.max_seq = 32;
    absl::StatusOr<Graph> graph = BuildLlamaDecodeGraph(config, options);
    if (!graph.ok()) {
      ADD_FAILURE() << graph.status();
      return nullptr;
    }
    absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(graph));
    if (!plan.ok()) {
      ADD_FAILURE() << plan.status();
      return nullptr;
    }
    return std::unique_ptr<LlamaRunner>(new LlamaRunner(*std::move(plan), batch));
  }

  // Takes every weight, by name, from `other`, so that two graphs run the same model.
  void CopyWeightsFrom(LlamaRunner& other) {
    for (const Tensor& t : plan_.graph().tensors()) {
      if (t.kind != TensorKind::kWeight) continue;
      std::memcpy(host_.tensor(t.name).data(), other.host_.tensor(t.name).data(), t.bytes());
    }
  }

  // One step; returns the logits [batch, vocab] and fills `next` with the chosen ids.
  absl::StatusOr<std::vector<float>> Step(const std::vector<int32_t>& ids,
                                          const std::vector<int32_t>& pos,
                                          std::vector<int32_t>* next) {
    std::memcpy(host_.tensor(kIdsInput).data(), ids.data(), batch_ * sizeof(int32_t));
    std::memcpy(host_.tensor(kPosInput).data(), pos.data(), batch_ * sizeof(int32_t));
    const Bindings::Buffer& arena = host_.bindings().arena();
    std::memset(arena.data, 0xFF, arena.bytes);  // poison every intermediate
    absl::StatusOr<PreparedPlan> prepared = cpu_.Prepare(plan_);
    if (!prepared.ok()) return prepared.status();
    absl::StatusOr<ExecStats> stats = Execute(*prepared, host_.bindings(), cpu_);
    if (!stats.ok()) return stats.status();
    if (const uint32_t flags = cpu_.TakeErrorFlags(); flags != 0) {
      return absl::InternalError(absl::StrCat("error flags ", flags));
    }
    const std::vector<float> chosen = host_.Read(plan_, kNextIdsOutput);
    next->assign(chosen.begin(), chosen.end());
    return host_.Read(plan_, kLogitsOutput);
  }

 private:
  LlamaRunner(ExecutionPlan plan, int64_t batch)
      : plan_(std::move(plan)), host_(plan_, /*seed=*/7), batch_(batch) {}

  ExecutionPlan plan_;
  HostBindings host_;  // weights uniform in ±0.1 (norms around 1), caches zero
  CpuDispatch cpu_;
  int64_t batch_;
};

struct DecodeTrace {
  std::vector<std::vector<int32_t>> fed;     // per step, per row
  std::vector<std::vector<float>> logits;    // per step, [batch, vocab]
  std::vector<std::vector<int32_t>> chosen;  // per step, per row
};

// Feeds each row its prompt, then its own greedy choices, at positions 0, 1, ...
absl::StatusOr<DecodeTrace> GreedyDecode(LlamaRunner& runner,
                                         const std::vector<std::vector<int32_t>>& prompts,
                                         int steps) {
  const size_t batch = prompts.size();
  DecodeTrace trace;
  std::vector<int32_t> next(batch, 0);
  for (int step = 0; step < steps; ++step) {
    std::vector<int32_t> ids(batch);
    for (size_t r = 0; r < batch; ++r) {
      ids[r] = step < static_cast<int>(prompts[r].size()) ? prompts[r][step] : next[r];
    }
    absl::StatusOr<std::vector<float>> logits =
        runner.Step(ids, std::vector<int32_t>(batch, step), &next);
    if (!logits.ok()) return logits.status();
    trace.fed.push_back(ids);
    trace.logits.push_back(*std::move(logits));
    trace.chosen.push_back(next);
  }
  return trace;
}

TEST(CpuDispatchTest, TinyLlamaDecodesDeterministicallyWithIndependentRows) {
  const LlamaConfig config = TinyLlamaConfig();
  const int64_t vocab = config.vocab_size;
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 300, 42, 999}, {7, 1000, 3}};
  const int steps = 10;

  auto first = LlamaRunner::Make(config, 2);
  auto second = LlamaRunner::Make(config, 2);
  auto single = LlamaRunner::Make(config, 1);
  ASSERT_TRUE(first && second && single);
  second->CopyWeightsFrom(*first);
  single->CopyWeightsFrom(*first);

  absl::StatusOr<DecodeTrace> a = GreedyDecode(*first, prompts, steps);
  SG_ASSERT_OK(a.status());
  absl::StatusOr<DecodeTrace> b = GreedyDecode(*second, prompts, steps);
  SG_ASSERT_OK(b.status());

  for (int step = 0; step < steps; ++step) {
    for (float v : a->logits[step]) ASSERT_TRUE(std::isfinite(v)) << "step " << step;
    for (int32_t id : a->chosen[step]) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, vocab);
    }
  }
  // Determinism: the same prompts on a fresh graph and dispatcher give the same run.
  EXPECT_EQ(a->chosen, b->chosen);
  EXPECT_EQ(a->logits, b->logits);
  // The logits depend on the tokens, or the checks here would hold for a constant model.
  const std::vector<float>& l0 = a->logits[0];
  EXPECT_NE(std::vector<float>(l0.begin(), l0.begin() + vocab),
            std::vector<float>(l0.begin() + vocab, l0.end()))
      << "rows fed different tokens gave the same logits";

  // Row independence: a batch-1 graph fed row 0's tokens reproduces row 0's logits, bit
  // for bit, although row 1 of the batch-2 graph saw other tokens.
  std::vector<int32_t> next;
  for (int step = 0; step < steps; ++step) {
    absl::StatusOr<std::vector<float>> logits = single->Step({a->fed[step][0]}, {step}, &next);
    SG_ASSERT_OK(logits.status());
    const std::vector<float> row0(a->logits[step].begin(), a->logits[step].begin() + vocab);
    ASSERT_EQ(*logits, row0) << "step " << step;
    ASSERT_EQ(next[0], a->chosen[step][0]) << "step " << step;
  }
}

// ---------------------------------------------------------------------------------------
// Mixture of experts

// A routed MLP as a MoE layer builds it (MoeTopK, MoeRouteWeights, the gate and up
// MoeMatMuls sharing x, SiluMul, the per-expert down MoeMatMul, MoeCombine) against a
// float64 evaluation of transformers' Mixtral / Qwen3-MoE block.
TEST_P(CpuFloatOpTest, MoeMlpMatchesReference) {
  std::mt19937_64 rng(77);
  const int64_t m = 4, h = 24, inter = 16, experts = 6, top_k = 2;
  for (const bool renormalize : {true, false}) {
    SCOPED_TRACE(absl::StrCat("renormalize=", renormalize));
    GraphBuilder b;
    const TensorId x = b.Input("x", dtype(), {m, h});
    const TensorId logits = b.Input("logits", dtype(), {m, experts});
    const TensorId ids = b.MoeTopK(logits, top_k, "ids");
    const TensorId weights = b.MoeRouteWeights(logits, ids, {renormalize}, "weights");
    const TensorId gate = b.MoeMatMul(x, b.Weight("gate", dtype(), {experts, inter, h}), ids, "g");
    const TensorId up = b.MoeMatMul(x, b.Weight("up", dtype(), {experts, inter, h}), ids, "u");
    const TensorId act = b.SiluMul(gate, up, "act");
    const TensorId down =
        b.MoeMatMul(act, b.Weight("down", dtype(), {experts, h, inter}), ids, "d");
    b.Output("y", b.MoeCombine(down, weights, ids, "y"));
    b.Output("ids", ids);
    auto bench = Bench::Make(b);
    ASSERT_NE(bench, nullptr);
    const std::vector<double> xs = bench->Set("x", RandomValues(rng, m * h));
    const std::vector<double> gs = bench->Set("gate", RandomValues(rng, experts * inter * h));
    const std::vector<double> us = bench->Set("up", RandomValues(rng, experts * inter * h));
    const std::vector<double> ds = bench->Set("down", RandomValues(rng, experts * h * inter));
    // Distinct logits that every dtype stores exactly, so the choice is not a near tie.
    std::vector<float> lv;
    for (int64_t i = 0; i < m; ++i) {
      std::vector<int> perm(experts);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int p : perm) lv.push_back(0.5f * static_cast<float>(p) - 1.0f);
    }
    const std::vector<double> ls = bench->Set("logits", lv);
    bench->PoisonArena();
    CpuDispatch cpu;
    SG_ASSERT_OK(bench->Run(cpu));
    EXPECT_EQ(cpu.TakeErrorFlags(), 0u);
    std::vector<double> want(m * h, 0.0);
    const std::vector<int32_t> got_ids = bench->Ints("ids");
    for (int64_t i = 0; i < m; ++i) {
      std::vector<int> order(experts);
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(),
                [&](int a, int c) { return ls[i * experts + a] > ls[i * experts + c]; });
      double total = 0.0, chosen = 0.0;
      for (int64_t e = 0; e < experts; ++e) total += std::exp(ls[i * experts + e]);
      for (int64_t j = 0; j < top_k; ++j) chosen += std::exp(ls[i * experts + order[j]]) / total;
      for (int64_t j = 0; j < top_k; ++j) {
        const int e = order[j];
        EXPECT_EQ(got_ids[i * top_k + j], e) << "row " << i << " slot " << j;
        double w = std::exp(ls[i * experts + e]) / total;
        if (renormalize) w /= chosen;
        std::vector<double> a(inter);
        for (int64_t r = 0; r < inter; ++r) {
          double g = 0.0, u = 0.0;
          for (int64_t c = 0; c < h; ++c) {
            g += xs[i * h + c] * gs[(e * inter + r) * h + c];
            u += xs[i * h + c] * us[(e * inter + r) * h + c];
          }
          a[r] = g / (1.0 + std::exp(-g)) * u;
        }
        for (int64_t c = 0; c < h; ++c) {
          double y = 0.0;
          for (int64_t r = 0; r < inter; ++r) y += a[r] * ds[(e * h + c) * inter + r];
          want[i * h + c] += w * y;
        }
      }
    }
    EXPECT_LE(NormalizedError(bench->Floats("y"), want), 3 * tol());
  }
}

TEST(CpuDispatchTest, MoeTopKPutsNaNFirstAndTiesByIndex) {
  GraphBuilder b;
  b.Output("ids", b.MoeTopK(b.Input("logits", DType::kF32, {2, 6}), 4, "ids"));
  auto bench = Bench::Make(b);
  ASSERT_NE(bench, nullptr);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  bench->Set("logits", {1.0f, 3.0f, 3.0f, nan, 2.0f, -inf,  //
                        nan, nan, nan, nan, nan, nan});
  bench->PoisonArena();
  CpuDispatch cpu;
  SG_ASSERT_OK(bench->Run(cpu));
  // NaN above every number; equal values (and NaNs) by index.
  EXPECT_EQ(bench->Ints("ids"), (std::vector<int32_t>{3, 1, 2, 4, 0, 1, 2, 3}));
}

// Stacked quantized experts [E, N, K]: each chosen expert's rows dequantized as GGUF
// does, dotted with its input; an id out of range gives zeros and the flag.
TEST(CpuDispatchTest, MoeMatMulReadsQuantizedExpertsAndFlagsBadIds) {
  const int64_t experts = 3, n = 8, k = 256, m = 2, top_k = 2;
  for (const DType q : {DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    SCOPED_TRACE(DTypeName(q));
    GraphBuilder b;
    b.Output("y", b.MoeMatMul(b.Input("x", DType::kF32, {m, k}),
                              b.Weight("w", q, {experts, n, k}),
                              b.Input("ids", DType::kI32, {m, top_k}), "y"));
    auto bench = Bench::Make(b);
    ASSERT_NE(bench, nullptr);
    std::mt19937_64 rng(5);
    const std::vector<double> xs = bench->Set("x", RandomValues(rng, m * k));
    bench->SetInts("ids", {2, 0, 1, experts});
    bench->PoisonArena();
    CpuDispatch cpu;
    SG_ASSERT_OK(bench->Run(cpu));
    EXPECT_EQ(cpu.TakeErrorFlags(), static_cast<uint32_t>(kErrorExpertOutOfRange));
    const auto* blocks = static_cast<const std::byte*>(bench->Bound("w").data());
    const int64_t row_bytes = DTypeRowBytes(q, k);
    const int32_t chosen[] = {2, 0, 1, -1};
    std::vector<double> want(m * top_k * n, 0.0);
    std::vector<float> row(k);
    for (int64_t s = 0; s < m * top_k; ++s) {
      if (chosen[s] < 0) continue;
      const int64_t i = s / top_k;
      for (int64_t r = 0; r < n; ++r) {
        ASSERT_TRUE(DequantizeRow(q, blocks + (chosen[s] * n + r) * row_bytes, row.data(), k));
        double acc = 0.0;
        for (int64_t c = 0; c < k; ++c) acc += xs[i * k + c] * row[c];
        want[s * n + r] = acc;
      }
    }
    const std::vector<float> got = bench->Floats("y");
    EXPECT_LE(NormalizedError(got, want), 1e-5);
    for (int64_t r = 0; r < n; ++r) EXPECT_EQ(got[3 * n + r], 0.0f);
  }
}

}  // namespace
}  // namespace sg
