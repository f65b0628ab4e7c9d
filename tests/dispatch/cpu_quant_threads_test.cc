// CpuDispatch with GGUF block-format weights (MatMul and Embedding, held against a float64
// reference built from DequantizeRow, itself bit-exact with GGUF's reference in
// quant_test) and with several threads (MatMul and Attention must give the same bits with
// any number of threads, since each output element is computed whole by one thread).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "stepgraph/graph/builder.h"
#include "stepgraph/dispatch/cpu_dispatch.h"
#include "stepgraph/base/error_flags.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/base/half.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/base/quant.h"
#include "tests/testing/util.h"

namespace sg {

// Defined in cpu_dispatch_test.cc, linked into the same program.
void PrintTo(DType t, std::ostream* os);

namespace {

using testing::HostBindings;
using testing::NormalizedError;

constexpr DType kBlockTypes[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                                 DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

// A built plan with random host bindings (weights from HostBindings: quantized ones as
// valid random blocks), its output poisoned before each run.
struct Case {
  ExecutionPlan plan;
  std::unique_ptr<HostBindings> host;

  static Case Make(GraphBuilder& b, uint64_t seed) {
    absl::StatusOr<Graph> g = std::move(b).Build();
    EXPECT_TRUE(g.ok()) << g.status();
    absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(g));
    EXPECT_TRUE(plan.ok()) << plan.status();
    Case c{*std::move(plan), nullptr};
    c.host = std::make_unique<HostBindings>(c.plan, seed, 1.0f);
    return c;
  }

  std::vector<float> Run(CpuDispatch& cpu, uint32_t* flags = nullptr) {
    const TensorArg out = ResolveTensor(plan, host->bindings(), plan.graph().outputs()[0].tensor.index);
    std::memset(out.data, 0xFF, out.bytes());
    EXPECT_TRUE(cpu.Prepare(plan).ok());
    absl::StatusOr<ExecStats> stats = Execute(plan, host->bindings(), cpu);
    EXPECT_TRUE(stats.ok()) << stats.status();
    if (flags != nullptr) *flags = cpu.TakeErrorFlags();
    return host->Read(plan, plan.graph().outputs()[0].name);
  }
};

std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * 4);
  return out;
}

class CpuQuantTest : public ::testing::TestWithParam<DType> {};

TEST_P(CpuQuantTest, MatMulWithQuantizedWeights) {
  const DType wt = GetParam();
  for (DType xt : {DType::kF32, DType::kBF16}) {
    for (bool bias : {false, true}) {
      SCOPED_TRACE(std::string(DTypeName(xt)) + (bias ? " with bias" : ""));
      const int64_t m = 3, k = 512, n = 37;
      GraphBuilder b;
      const TensorId x = b.Input("x", xt, {m, k});
      const TensorId w = b.Weight("w", wt, {n, k});
      b.Output("y", bias ? b.MatMul(x, w, b.Weight("bias", xt, {n})) : b.MatMul(x, w));
      Case c = Case::Make(b, 5);
      c.host->tensor("x").FillUniform(77, -1.0f, 1.0f);
      const std::vector<float> xs = c.host->tensor("x").ToFloat();
      const std::vector<float> ws = c.host->tensor("w").ToFloat();  // dequantized
      const std::vector<float> bs = bias ? c.host->tensor("bias").ToFloat() : std::vector<float>(n, 0.0f);
      std::vector<double> want(m * n);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0;
          for (int64_t q = 0; q < k; ++q) acc += static_cast<double>(xs[i * k + q]) * ws[j * k + q];
          want[i * n + j] = acc + bs[j];
        }
      }
      CpuDispatch cpu;
      const std::vector<float> got = c.Run(cpu);
      EXPECT_LE(NormalizedError(got, want), xt == DType::kF32 ? 1e-6 : 8e-3);
    }
  }
}

TEST_P(CpuQuantTest, EmbeddingDequantizesRows) {
  const DType t = GetParam();
  const int64_t vocab = 40, hidden = 512;
  for (DType out_t : {DType::kF32, DType::kF16}) {
    GraphBuilder b;
    const TensorId table = b.Weight("table", t, {vocab, hidden});
    b.Output("y", b.Embedding(table, b.Input("ids", DType::kI32, {4}), out_t, "y"));
    Case c = Case::Make(b, 9);
    const std::vector<int32_t> ids = {7, 39, -1, 0};
    std::memcpy(c.host->tensor("ids").data(), ids.data(), 16);
    CpuDispatch cpu;
    uint32_t flags = 0;
    const std::vector<float> got = c.Run(cpu, &flags);
    EXPECT_EQ(flags, kErrorTokenOutOfRange);
    const std::vector<float> rows = c.host->tensor("table").ToFloat();
    for (int64_t r = 0; r < 4; ++r) {
      for (int64_t col = 0; col < hidden; ++col) {
        float want = ids[r] < 0 ? 0.0f : rows[ids[r] * hidden + col];
        if (out_t == DType::kF16) want = HalfToFloat(FloatToHalf(want));
        ASSERT_EQ(got[r * hidden + col], want) << "row " << r << " col " << col;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllFormats, CpuQuantTest, ::testing::ValuesIn(kBlockTypes),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST(CpuThreadsTest, ThreadCountIsHonoured) {
  EXPECT_EQ(CpuDispatch(CpuDispatch::Options{.threads = 1}).threads(), 1);
  EXPECT_EQ(CpuDispatch(CpuDispatch::Options{.threads = 3}).threads(), 3);
  EXPECT_GE(CpuDispatch().threads(), 1);
}

TEST(CpuThreadsTest, MatMulIsTheSameWithAnyThreadCount) {
  for (DType wt : {DType::kF32, DType::kBF16, DType::kQ4_K}) {
    SCOPED_TRACE(DTypeName(wt));
    const DType xt = IsQuantized(wt) ? DType::kF32 : wt;
    GraphBuilder b;
    b.Output("y", b.MatMul(b.Input("x", xt, {5, 768}), b.Weight("w", wt, {301, 768})));
    Case c = Case::Make(b, 3);
    c.host->tensor("x").FillUniform(4, -1.0f, 1.0f);
    CpuDispatch one(CpuDispatch::Options{.threads = 1});
    const std::vector<uint32_t> want = Bits(c.Run(one));
    for (int threads : {2, 3, 7}) {
      CpuDispatch many(CpuDispatch::Options{.threads = threads});
      EXPECT_EQ(Bits(c.Run(many)), want) << threads << " threads";
    }
  }
}

TEST(CpuThreadsTest, AttentionIsTheSameWithAnyThreadCount) {
  for (DType t : {DType::kF32, DType::kF16}) {
    SCOPED_TRACE(DTypeName(t));
    const int64_t m = 3, heads = 6, kv_heads = 2, seq = 96, d = 32;
    GraphBuilder b;
    const TensorId q = b.Input("q", t, {m, heads * d});
    const TensorId kc = b.State("k_cache", t, {m, kv_heads, seq, d});
    const TensorId vc = b.State("v_cache", t, {m, kv_heads, seq, d});
    b.Output("y", b.Attention(q, kc, vc, b.Input("pos", DType::kI32, {m})));
    Case c = Case::Make(b, 8);
    c.host->tensor("q").FillUniform(1, -1.0f, 1.0f);
    c.host->tensor("k_cache").FillUniform(2, -1.0f, 1.0f);
    c.host->tensor("v_cache").FillUniform(3, -1.0f, 1.0f);
    const std::vector<int32_t> pos = {95, 0, 40};
    std::memcpy(c.host->tensor("pos").data(), pos.data(), 12);
    CpuDispatch one(CpuDispatch::Options{.threads = 1});
    const std::vector<float> single = c.Run(one);
    for (float v : single) ASSERT_TRUE(std::isfinite(v));
    for (int threads : {2, 4, 5}) {
      CpuDispatch many(CpuDispatch::Options{.threads = threads});
      EXPECT_EQ(Bits(c.Run(many)), Bits(single)) << threads << " threads";
    }
  }
}

}  // namespace
}  // namespace sg
