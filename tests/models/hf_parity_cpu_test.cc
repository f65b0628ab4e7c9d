// End-to-end parity with the reference implementation on the CPU dispatcher: each fixture
// folder (tests/fixtures/<name>/, made by make_fixtures.py) is loaded exactly as a user's
// model would be (config.json + safetensors, weights bound straight from the mapping), the
// prompt is run through the decode graph one token per step, and greedy decoding must
// reproduce the reference's tokens and logits.
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/config.h"
#include "models/model_files.h"
#include "stepgraph/models/llama.h"
#include "models/safetensors.h"
#include "stepgraph/dispatch/cpu_dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/base/half.h"
#include "stepgraph/graph/memory_plan.h"
#include "tests/models/parity_expected.h"
#include "tests/testing/util.h"

#ifndef SG_FIXTURES_DIR
#error "SG_FIXTURES_DIR must name tests/fixtures"
#endif

namespace sg {
namespace {

using testing::kParityBf16Tokens;
using testing::kParityBf16Tolerance;
using testing::kParityF32Tolerance;

std::vector<float> ToFloats(const TensorArg& a) {
  std::vector<float> out(a.shape.NumElements());
  for (size_t i = 0; i < out.size(); ++i) out[i] = LoadElement(a.data, a.dtype, i);
  return out;
}

class HfParityCpuTest : public ::testing::TestWithParam<const char*> {};

// A folder, or a GGUF file beside the folder's expected.json (the family fixtures' files
// written by llama.cpp's converter, make_family_gguf_fixtures.py).
TEST_P(HfParityCpuTest, GreedyDecodeMatchesReference) {
  const std::string dir = std::string(SG_FIXTURES_DIR) + "/" + GetParam();
  const testing::ParityExpected want = testing::ReadParityExpected(testing::ExpectedJsonOf(dir));
  ASSERT_GE(want.prompt.size(), 5u);
  ASSERT_GE(want.generated.size(), 32u);

  absl::StatusOr<ModelFiles> weights = ModelFiles::Open(dir);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const LlamaConfig& config = weights->config();
  const bool bf16 = want.dtype == "bfloat16";
  ASSERT_EQ(config.dtype, bf16 ? DType::kBF16 : DType::kF32) << "expected.json says " << want.dtype;
  ASSERT_EQ(want.prompt_last_logits.size(), static_cast<size_t>(config.vocab_size));
  ASSERT_EQ(want.final_logits.size(), static_cast<size_t>(config.vocab_size));

  const int64_t steps = static_cast<int64_t>(want.prompt.size() + want.generated.size());
  LlamaGraphOptions options;
  options.batch = 1;
  options.max_seq = steps;
  absl::StatusOr<Graph> graph = BuildLlamaDecodeGraph(config, options);
  ASSERT_TRUE(graph.ok()) << graph.status();
  absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(graph));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const Graph& g = plan->graph();

  Bindings bindings(g);
  ASSERT_TRUE(weights->CheckAgainstGraph(g).ok()) << weights->CheckAgainstGraph(g);
  ASSERT_TRUE(weights->BindInPlace(g, bindings).ok()) << weights->BindInPlace(g, bindings);
  std::vector<std::byte> arena(static_cast<size_t>(plan->arena_bytes()));
  bindings.SetArena(arena.data(), static_cast<int64_t>(arena.size()));
  // Every State is a KV cache; a fresh sequence starts from zeros.
  std::vector<std::vector<std::byte>> states;
  for (int32_t i = 0; i < g.num_tensors(); ++i) {
    const Tensor& t = g.tensors()[i];
    if (t.kind != TensorKind::kState) continue;
    states.emplace_back(static_cast<size_t>(t.bytes()), std::byte{0});
    ASSERT_TRUE(bindings.Bind(g.id(i), states.back().data(), t.bytes()).ok());
  }
  int32_t ids = 0, pos = 0;
  ASSERT_TRUE(bindings.Bind(kIdsInput, &ids, sizeof(ids)).ok());
  ASSERT_TRUE(bindings.Bind(kPosInput, &pos, sizeof(pos)).ok());
  ASSERT_TRUE(CheckBindings(*plan, bindings).ok()) << CheckBindings(*plan, bindings);

  const int32_t logits_index = g.FindOutput(kLogitsOutput)->index;
  const int32_t next_index = g.FindOutput(kNextIdsOutput)->index;
  CpuDispatch dispatch;
  ASSERT_TRUE(dispatch.Prepare(*plan).ok());

  // Prompt one token per step, then feed back our own choices.
  const size_t checked = bf16 ? kParityBf16Tokens : want.generated.size();
  const double tolerance = bf16 ? kParityBf16Tolerance : kParityF32Tolerance;
  std::vector<int32_t> got;
  size_t matched = 0;
  for (int64_t step = 0; step < steps; ++step) {
    const size_t prompt_len = want.prompt.size();
    ids = step < static_cast<int64_t>(prompt_len) ? want.prompt[step] : got[step - prompt_len];
    pos = static_cast<int32_t>(step);
    std::memset(arena.data(), 0xFF, arena.size());  // every intermediate must be written
    absl::StatusOr<ExecStats> stats = Execute(*plan, bindings, dispatch);
    ASSERT_TRUE(stats.ok()) << "step " << step << ": " << stats.status();
    ASSERT_EQ(stats->launches, g.num_nodes());
    ASSERT_EQ(dispatch.TakeErrorFlags(), 0u) << "step " << step;

    const TensorArg logits_arg = ResolveTensor(*plan, bindings, logits_index);
    const std::vector<float> logits = ToFloats(logits_arg);
    if (step == static_cast<int64_t>(prompt_len) - 1) {
      const double err = testing::NormalizedError(logits, want.prompt_last_logits);
      std::printf("[ %s ] logits at the last prompt position: normalised error %.3g\n", GetParam(),
                  err);
      EXPECT_LE(err, tolerance) << "logits at the last prompt position";
    }
    if (step == steps - 1) {
      // Only meaningful if every token so far was the reference's.
      if (matched == want.generated.size()) {
        const double err = testing::NormalizedError(logits, want.final_logits);
        std::printf("[ %s ] logits at the last generated token: normalised error %.3g\n",
                    GetParam(), err);
        EXPECT_LE(err, tolerance) << "logits at the last generated token";
      } else {
        EXPECT_TRUE(bf16) << "an f32 fixture diverged; the final logits were not compared";
      }
      break;  // this step's choice is past the recorded tokens
    }
    if (step >= static_cast<int64_t>(prompt_len) - 1) {
      const int32_t next = *static_cast<const int32_t*>(
          ResolveTensor(*plan, bindings, next_index).data);
      const size_t k = got.size();
      got.push_back(next);
      if (matched == k && next == want.generated[k]) ++matched;
    }
  }
  std::printf("[ %s ] %zu of %zu greedy tokens equal the reference's (%zu required)\n",
              GetParam(), matched, want.generated.size(), checked);
  ASSERT_EQ(got.size(), want.generated.size());
  EXPECT_GE(matched, checked);
  for (size_t k = 0; k < checked; ++k) {
    ASSERT_EQ(got[k], want.generated[k]) << "token " << k << " of " << GetParam();
  }
}

// Each fixture exercises what its name says; a regenerated fixture that lost its point
// would otherwise pass silently.
TEST(HfParityFixturesTest, FixturesCoverTheirFeatures) {
  auto open = [](const char* name) {
    absl::StatusOr<ModelWeights> w = ModelWeights::Open(std::string(SG_FIXTURES_DIR) + "/" + name);
    EXPECT_TRUE(w.ok()) << w.status();
    return w;
  };
  auto gqa = open("f32_gqa");
  ASSERT_TRUE(gqa.ok());
  EXPECT_LT(gqa->config().num_key_value_heads, gqa->config().num_attention_heads);
  auto tied = open("f32_mha_tied");
  ASSERT_TRUE(tied.ok());
  EXPECT_TRUE(tied->config().tie_word_embeddings);
  EXPECT_EQ(tied->config().num_key_value_heads, tied->config().num_attention_heads);
  auto llama3 = open("f32_llama3_rope");
  ASSERT_TRUE(llama3.ok());
  EXPECT_EQ(llama3->config().rope_scaling.type, ops::RopeScaling::Type::kLlama3);
  EXPECT_FLOAT_EQ(llama3->config().rope_theta, 500000.0f);
  auto half = open("bf16_gqa");
  ASSERT_TRUE(half.ok());
  EXPECT_EQ(half->config().dtype, DType::kBF16);
  auto sharded = open("f32_sharded");
  ASSERT_TRUE(sharded.ok());
  EXPECT_GE(sharded->files().size(), 2u);
  EXPECT_EQ(sharded->config().num_key_value_heads, 1);
}

// The other families (make_family_fixtures.py): each changes the Llama layer where its
// name says.
TEST(HfParityFixturesTest, FamilyFixturesCoverTheirFeatures) {
  auto config = [](const char* name) {
    absl::StatusOr<ModelWeights> w =
        ModelWeights::Open(std::string(SG_FIXTURES_DIR) + "/family_" + name);
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? w->config() : LlamaConfig{};
  };
  const LlamaConfig qwen2 = config("qwen2");
  EXPECT_TRUE(qwen2.qkv_bias);
  EXPECT_FALSE(qwen2.attention_bias);  // no o bias
  EXPECT_EQ(qwen2.sliding_window, 0);
  EXPECT_TRUE(config("qwen3").qk_norm);
  const LlamaConfig mistral = config("mistral");
  EXPECT_EQ(mistral.sliding_window, 8);  // shorter than the 46 positions decoded
  EXPECT_TRUE(mistral.SlidingLayer(0) && mistral.SlidingLayer(1));
  const LlamaConfig phi3 = config("phi3");
  EXPECT_TRUE(phi3.fused_qkv && phi3.fused_gate_up);
  EXPECT_EQ(phi3.sliding_window, 12);
  const LlamaConfig gemma = config("gemma");
  EXPECT_TRUE(gemma.norm_plus_one && gemma.embedding_scale && gemma.tie_word_embeddings);
  EXPECT_EQ(gemma.activation, MlpActivation::kGeluTanh);
  const LlamaConfig gemma2 = config("gemma2");
  EXPECT_TRUE(gemma2.sandwich_norms && gemma2.norm_plus_one && gemma2.embedding_scale);
  EXPECT_EQ(gemma2.activation, MlpActivation::kGeluTanh);
  EXPECT_TRUE(gemma2.SlidingLayer(0));  // local, then global
  EXPECT_FALSE(gemma2.SlidingLayer(1));
  EXPECT_EQ(gemma2.sliding_window, 8);
  EXPECT_FLOAT_EQ(gemma2.attention_scale, 0.25f);  // query_pre_attn_scalar 16
  EXPECT_FLOAT_EQ(gemma2.attn_logit_softcap, 2.0f);
  EXPECT_FLOAT_EQ(gemma2.final_logit_softcap, 3.0f);
  const LlamaConfig gemma3 = config("gemma3");
  EXPECT_TRUE(gemma3.sandwich_norms && gemma3.norm_plus_one && gemma3.embedding_scale &&
              gemma3.qk_norm && gemma3.tie_word_embeddings);
  for (int64_t l = 0; l < 6; ++l) EXPECT_EQ(gemma3.SlidingLayer(l), l < 5) << "layer " << l;
  EXPECT_EQ(gemma3.sliding_window, 8);
  EXPECT_FLOAT_EQ(gemma3.rope_theta, 1e6f);  // global layers
  EXPECT_FLOAT_EQ(gemma3.sliding_rope_theta, 1e4f);  // local layers
  EXPECT_FLOAT_EQ(gemma3.attention_scale, 1.0f / std::sqrt(8.0f));
  EXPECT_EQ(gemma3.attn_logit_softcap, 0.0f);
  EXPECT_FLOAT_EQ(gemma3.final_logit_softcap, 3.0f);
  // llama.cpp's converter stores the window, the local base and the final soft-cap; the
  // pattern (every sixth layer global) and the score scale (the head size) are llama.cpp's
  // rules, which the fixture's config follows.
  absl::StatusOr<ModelFiles> gguf =
      ModelFiles::Open(std::string(SG_FIXTURES_DIR) + "/family_gemma3/model.gguf");
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  const LlamaConfig& gemma3_gguf = gguf->config();
  EXPECT_EQ(gemma3_gguf.architecture, "gemma3");
  EXPECT_TRUE(gemma3_gguf.qk_norm && gemma3_gguf.sandwich_norms && gemma3_gguf.norm_plus_one);
  EXPECT_EQ(gemma3_gguf.sliding_layers, gemma3.sliding_layers);
  EXPECT_EQ(gemma3_gguf.sliding_window, gemma3.sliding_window);
  EXPECT_FLOAT_EQ(gemma3_gguf.rope_theta, gemma3.rope_theta);
  EXPECT_FLOAT_EQ(gemma3_gguf.sliding_rope_theta, gemma3.sliding_rope_theta);
  EXPECT_FLOAT_EQ(gemma3_gguf.attention_scale, gemma3.attention_scale);
  EXPECT_FLOAT_EQ(gemma3_gguf.final_logit_softcap, gemma3.final_logit_softcap);
  const LlamaConfig linear = config("qwen2_linear_rope");
  EXPECT_EQ(linear.rope_scaling.type, ops::RopeScaling::Type::kLinear);
  EXPECT_FLOAT_EQ(linear.rope_scaling.factor, 4.0f);
  const LlamaConfig mixtral = config("mixtral");
  EXPECT_EQ(mixtral.num_experts, 4);
  EXPECT_EQ(mixtral.experts_per_token, 2);
  EXPECT_TRUE(mixtral.moe_renormalize && mixtral.MoeLayer(0) && mixtral.MoeLayer(1));
  EXPECT_EQ(mixtral.moe_prefix, "block_sparse_moe");
  const LlamaConfig qwen3_moe = config("qwen3_moe");
  EXPECT_EQ(qwen3_moe.num_experts, 8);
  EXPECT_TRUE(qwen3_moe.qk_norm && qwen3_moe.moe_renormalize && qwen3_moe.moe_round_weights);
  EXPECT_EQ(qwen3_moe.moe_intermediate_size, 16);
  const LlamaConfig mixed = config("qwen3_moe_mixed");
  EXPECT_FALSE(mixed.moe_renormalize);
  EXPECT_EQ(mixed.experts_per_token, 3);
  EXPECT_FALSE(mixed.MoeLayer(0));  // mlp_only_layers [0]: a dense MLP
  EXPECT_TRUE(mixed.MoeLayer(1));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfParityCpuTest,
                         ::testing::Values("f32_gqa", "f32_mha_tied", "f32_llama3_rope",
                                           "bf16_gqa", "f32_sharded", "family_qwen2",
                                           "family_qwen3", "family_mistral", "family_phi3",
                                           "family_gemma", "family_gemma2", "family_gemma3",
                                           "family_qwen2_linear_rope",
                                           "family_qwen2/model.gguf", "family_qwen3/model.gguf",
                                           "family_phi3/model.gguf", "family_gemma/model.gguf",
                                           "family_gemma3/model.gguf",
                                           "family_qwen2_linear_rope/model.gguf",
                                           "family_mixtral", "family_qwen3_moe",
                                           "family_qwen3_moe_mixed", "family_mixtral/model.gguf",
                                           "family_qwen3_moe/model.gguf", "family_mixtral_q8_0/model.gguf"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace sg
