// A Llama decode step with quantized weights (LlamaConfig::weight_dtypes, random blocks
// from RandomWeights) on the CPU reference, held against the same step in f32 whose
// weights are those blocks dequantized: the quantized path must compute exactly the
// model its blocks describe (up to f32 rounding order). Random quantized weights are also
// checked to be deterministic whatever the number of threads.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "stepgraph/models/llama.h"
#include "models/random_weights.h"
#include "stepgraph/dispatch/cpu_dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/base/quant.h"
#include "tests/testing/util.h"

namespace sg {
namespace {

LlamaConfig SmallConfig(bool tied) {
  LlamaConfig c;
  c.hidden_size = 256;
  c.intermediate_size = 512;  // multiples of 256, so that every format fits every matrix
  c.num_hidden_layers = 2;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.rms_norm_eps = 1e-5f;
  c.vocab_size = 512;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied;
  return c;
}

// Every matrix of the model (the rank-2 weights) in `t`.
LlamaConfig Quantized(LlamaConfig c, DType t) {
  const Graph g = BuildLlamaDecodeGraph(c, {.max_seq = 16}).value();
  for (const Tensor& w : g.tensors()) {
    if (w.kind == TensorKind::kWeight && w.shape.rank() == 2) c.weight_dtypes[w.name] = t;
  }
  return c;
}

// Runs `steps` decode steps of batch 1 from token 3 (greedy, fed back) and returns the
// logits of every step. `fill` writes the weights into their bound buffers.
std::vector<std::vector<float>> RunSteps(const LlamaConfig& config, int steps,
                                         const std::function<void(const Graph&, Bindings&)>& bind) {
  std::vector<std::vector<float>> logits;
  absl::StatusOr<ExecutionPlan> plan =
      ExecutionPlan::Create(BuildLlamaDecodeGraph(config, {.max_seq = 16}).value());
  EXPECT_TRUE(plan.ok()) << plan.status();
  const Graph& g = plan->graph();
  Bindings b(g);
  bind(g, b);
  std::vector<std::byte> arena(static_cast<size_t>(plan->arena_bytes()));
  b.SetArena(arena.data(), static_cast<int64_t>(arena.size()));
  std::vector<std::vector<std::byte>> states;
  for (int32_t i = 0; i < g.num_tensors(); ++i) {
    const Tensor& t = g.tensors()[i];
    if (t.kind != TensorKind::kState) continue;
    states.emplace_back(static_cast<size_t>(t.bytes()), std::byte{0});
    EXPECT_TRUE(b.Bind(g.id(i), states.back().data(), t.bytes()).ok());
  }
  int32_t ids = 3, pos = 0;
  EXPECT_TRUE(b.Bind(kIdsInput, &ids, sizeof(ids)).ok());
  EXPECT_TRUE(b.Bind(kPosInput, &pos, sizeof(pos)).ok());
  EXPECT_TRUE(CheckBindings(*plan, b).ok());
  CpuDispatch cpu(CpuDispatch::Options{.threads = 2});
  for (int step = 0; step < steps; ++step) {
    pos = step;
    std::memset(arena.data(), 0xFF, arena.size());
    absl::StatusOr<ExecStats> st = Execute(*plan, b, cpu);
    EXPECT_TRUE(st.ok()) << st.status();
    const TensorArg l = ResolveTensor(*plan, b, g.FindOutput(kLogitsOutput)->index);
    logits.emplace_back(l.as<const float>(), l.as<const float>() + l.shape.NumElements());
    ids = *ResolveTensor(*plan, b, g.FindOutput(kNextIdsOutput)->index).as<const int32_t>();
  }
  return logits;
}

class QuantModelTest : public ::testing::TestWithParam<DType> {};

TEST_P(QuantModelTest, StepEqualsTheF32ModelOfTheDequantizedWeights) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const LlamaConfig f32 = SmallConfig(tied);
    const LlamaConfig quant = Quantized(f32, GetParam());
    const Graph qg = BuildLlamaDecodeGraph(quant, {.max_seq = 16}).value();
    absl::StatusOr<RandomWeights> qw = RandomWeights::Create(qg, 21, 1);
    ASSERT_TRUE(qw.ok()) << qw.status();

    // The same weights in f32: the quantized ones dequantized, the norms copied.
    const Graph fg = BuildLlamaDecodeGraph(f32, {.max_seq = 16}).value();
    const BufferLayout f_layout = LayoutBuffers(fg, TensorKind::kWeight);
    std::vector<std::byte> f_bytes(static_cast<size_t>(f_layout.total_bytes));
    for (const BufferLayout::Entry& e : f_layout.entries) {
      const BufferLayout::Entry* q = qw->layout().Find(e.name);
      ASSERT_NE(q, nullptr) << e.name;
      const Tensor& qt = qg.tensors()[q->tensor];
      const std::byte* src = qw->bytes().data() + q->offset;
      auto* dst = reinterpret_cast<float*>(f_bytes.data() + e.offset);
      if (IsQuantized(qt.dtype)) {
        const int64_t cols = qt.shape.cols(), row_bytes = DTypeRowBytes(qt.dtype, cols);
        for (int64_t r = 0; r < qt.shape.rows(); ++r) {
          ASSERT_TRUE(DequantizeRow(qt.dtype, src + r * row_bytes, dst + r * cols, cols));
        }
      } else {
        std::memcpy(dst, src, static_cast<size_t>(e.bytes));
      }
    }

    const auto want = RunSteps(f32, 3, [&](const Graph& g, Bindings& b) {
      ASSERT_TRUE(BindLayout(g, TensorKind::kWeight, f_layout, f_bytes.data(), b).ok());
    });
    const auto got = RunSteps(quant, 3, [&](const Graph& g, Bindings& b) {
      ASSERT_TRUE(qw->Bind(g, b).ok());
    });
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < got.size(); ++s) {
      EXPECT_LE(testing::NormalizedError(got[s], want[s]), 1e-5) << "step " << s;
    }
  }
}

TEST_P(QuantModelTest, RandomQuantizedWeightsAreDeterministic) {
  const LlamaConfig quant = Quantized(SmallConfig(false), GetParam());
  const Graph g = BuildLlamaDecodeGraph(quant, {.max_seq = 16}).value();
  absl::StatusOr<RandomWeights> one = RandomWeights::Create(g, 5, 1);
  absl::StatusOr<RandomWeights> three = RandomWeights::Create(g, 5, 3);
  absl::StatusOr<RandomWeights> other = RandomWeights::Create(g, 6, 3);
  ASSERT_TRUE(one.ok() && three.ok() && other.ok());
  // Tensor by tensor: the alignment gaps between them are never written.
  for (const BufferLayout::Entry& e : one->layout().entries) {
    const std::byte* a = one->bytes().data() + e.offset;
    EXPECT_EQ(std::memcmp(a, three->bytes().data() + e.offset, e.bytes), 0) << e.name;
    EXPECT_NE(std::memcmp(a, other->bytes().data() + e.offset, e.bytes), 0) << e.name;
  }
  // A block of the q projection is the quantized draw of its values.
  const BufferLayout::Entry* e = one->layout().Find("model.layers.1.self_attn.q_proj.weight");
  ASSERT_NE(e, nullptr);
  const Tensor& t = g.tensors()[e->tensor];
  ASSERT_EQ(t.dtype, GetParam());
  const int64_t n = DTypeBlockElems(t.dtype), first = 3 * n;
  std::vector<float> values(n);
  for (int64_t j = 0; j < n; ++j) values[j] = RandomWeightValue(5, t.name, first + j, t);
  std::vector<uint8_t> block(DTypeBlockBytes(t.dtype));
  ASSERT_TRUE(QuantizeRow(t.dtype, values.data(), block.data(), n));
  EXPECT_EQ(std::memcmp(block.data(), one->bytes().data() + e->offset + 3 * block.size(),
                        block.size()),
            0);
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantModelTest,
                         ::testing::Values(DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                                           DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

}  // namespace
}  // namespace sg
