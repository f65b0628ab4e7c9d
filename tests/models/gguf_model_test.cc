// Llama models from GGUF: the committed fixtures (tests/fixtures/gguf_*, made by
// make_gguf_fixtures.py) load with the config, graph names, dtypes and shapes their
// writer used; the f32 one decodes token for token as transformers does, which shows the
// Q/K permutation and interleaved RoPE agree; and files whose metadata or tensors say
// something stepgraph would run differently are refused, naming the key or tensor.
#include "models/gguf_model.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "stepgraph/models/llama.h"
#include "nlohmann/json.hpp"
#include "stepgraph/dispatch/cpu_dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/graph/memory_plan.h"
#include "tests/models/gguf_writer.h"
#include "tests/models/parity_expected.h"
#include "tests/testing/util.h"

#ifndef SG_FIXTURES_DIR
#error "SG_FIXTURES_DIR must name tests/fixtures"
#endif

namespace sg {
namespace {

namespace v = testing::gguf_value;
using testing::GgufTestFile;
using testing::GgufTestTensor;

std::string FixturePath(const std::string& name) {
  return absl::StrCat(SG_FIXTURES_DIR, "/gguf_", name, "/model.gguf");
}

nlohmann::json FixtureJson(const std::string& name) {
  std::ifstream in(absl::StrCat(SG_FIXTURES_DIR, "/gguf_", name, "/expected.json"));
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str(), nullptr, false);
}

// ---- the fixtures ----

struct FixtureCase {
  const char* name;
  DType matrices;  // q_proj's dtype
  bool wide;       // the K-quant shape (hidden 256)
};

class GgufFixtureTest : public ::testing::TestWithParam<FixtureCase> {};

TEST_P(GgufFixtureTest, LoadsWithTheWritersConfigNamesDTypesAndShapes) {
  const FixtureCase& fc = GetParam();
  absl::StatusOr<GgufModel> m = GgufModel::Open(FixturePath(fc.name));
  ASSERT_TRUE(m.ok()) << m.status();
  const nlohmann::json want = FixtureJson(fc.name);
  ASSERT_TRUE(want.is_object());
  const LlamaConfig& c = m->config();
  const int64_t h = fc.wide ? 256 : 64, d = fc.wide ? 32 : 16, inter = fc.wide ? 128 : 160;
  EXPECT_EQ(c.hidden_size, h);
  EXPECT_EQ(c.intermediate_size, inter);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, d);
  EXPECT_EQ(c.vocab_size, 256);
  EXPECT_EQ(c.max_position_embeddings, 256);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.rope_scaling.type, ops::RopeScaling::Type::kNone);
  EXPECT_TRUE(c.rope_interleaved);
  EXPECT_EQ(c.dtype, DType::kF32);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_EQ(c.tie_word_embeddings, want.value("tied_embeddings", false));

  // Every weight under its graph name, with the graph's shape; norms F32.
  const int64_t expected_count = 2 + 2 * 9 + (c.tie_word_embeddings ? 0 : 1);
  ASSERT_EQ(static_cast<int64_t>(m->weights().size()), expected_count);
  int64_t bytes = 0;
  for (const GgufWeight& w : m->weights()) {
    bytes += static_cast<int64_t>(w.data.size());
    EXPECT_EQ(static_cast<int64_t>(w.data.size()), TensorBytes(w.dtype, w.shape)) << w.name;
    if (w.shape.rank() == 1) {
      EXPECT_EQ(w.dtype, DType::kF32) << w.name;
    }
    EXPECT_EQ(m->file().FindTensor(w.gguf_name)->data.data(), w.data.data());
  }
  EXPECT_EQ(m->weight_bytes(), bytes);
  auto shape_of = [&](const std::string& name) {
    const GgufWeight* w = m->Find(name);
    EXPECT_NE(w, nullptr) << name;
    return w == nullptr ? Shape() : w->shape;
  };
  EXPECT_EQ(shape_of("model.embed_tokens.weight"), Shape({256, h}));
  EXPECT_EQ(shape_of("model.layers.1.self_attn.q_proj.weight"), Shape({4 * d, h}));
  EXPECT_EQ(shape_of("model.layers.1.self_attn.k_proj.weight"), Shape({2 * d, h}));
  EXPECT_EQ(shape_of("model.layers.0.self_attn.v_proj.weight"), Shape({2 * d, h}));
  EXPECT_EQ(shape_of("model.layers.0.self_attn.o_proj.weight"), Shape({h, 4 * d}));
  EXPECT_EQ(shape_of("model.layers.0.mlp.gate_proj.weight"), Shape({inter, h}));
  EXPECT_EQ(shape_of("model.layers.0.mlp.up_proj.weight"), Shape({inter, h}));
  EXPECT_EQ(shape_of("model.layers.1.mlp.down_proj.weight"), Shape({h, inter}));
  EXPECT_EQ(shape_of("model.layers.1.input_layernorm.weight"), Shape({h}));
  EXPECT_EQ(shape_of("model.layers.1.post_attention_layernorm.weight"), Shape({h}));
  EXPECT_EQ(shape_of("model.norm.weight"), Shape({h}));
  EXPECT_EQ(m->Find("lm_head.weight") != nullptr, !c.tie_word_embeddings);
  EXPECT_EQ(m->Find("model.layers.2.self_attn.q_proj.weight"), nullptr);

  const GgufWeight* q = m->Find("model.layers.0.self_attn.q_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dtype, fc.matrices);
  EXPECT_EQ(q->gguf_name, "blk.0.attn_q.weight");
  const auto dtypes = m->WeightDTypes();
  EXPECT_EQ(dtypes.size(), m->weights().size());
  EXPECT_EQ(dtypes.at("model.norm.weight"), DType::kF32);
  if (fc.wide) {
    // The Q4_K_M-like mix: K-quants where rows are whole super-blocks, 32-element types
    // where they are not.
    EXPECT_EQ(dtypes.at("model.embed_tokens.weight"), DType::kQ4_K);
    EXPECT_EQ(dtypes.at("model.layers.0.self_attn.v_proj.weight"), DType::kQ5_K);
    EXPECT_EQ(dtypes.at("model.layers.0.self_attn.o_proj.weight"), DType::kQ8_0);
    EXPECT_EQ(dtypes.at("model.layers.0.mlp.down_proj.weight"), DType::kQ5_0);
    EXPECT_EQ(dtypes.at("model.layers.0.mlp.gate_proj.weight"), DType::kQ4_K);
    EXPECT_EQ(dtypes.at("lm_head.weight"), DType::kQ6_K);
  } else {
    for (const GgufWeight& w : m->weights()) {
      if (w.shape.rank() == 2) {
        EXPECT_EQ(w.dtype, fc.matrices) << w.name;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, GgufFixtureTest,
    ::testing::Values(FixtureCase{"f32", DType::kF32, false},
                      FixtureCase{"f16", DType::kF16, false},
                      FixtureCase{"q8_0", DType::kQ8_0, false},
                      FixtureCase{"q4_0", DType::kQ4_0, false},
                      FixtureCase{"q4_1", DType::kQ4_1, false},
                      FixtureCase{"q5_0", DType::kQ5_0, false},
                      FixtureCase{"q5_1", DType::kQ5_1, false},
                      FixtureCase{"q4_k_m", DType::kQ4_K, true}),
    [](const ::testing::TestParamInfo<FixtureCase>& info) { return std::string(info.param.name); });

TEST(GgufFixturesTest, FixturesCoverTheirFeatures) {
  absl::StatusOr<GgufModel> f32 = GgufModel::Open(FixturePath("f32"));
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_TRUE(f32->config().tie_word_embeddings);
  absl::StatusOr<GgufModel> f16 = GgufModel::Open(FixturePath("f16"));
  ASSERT_TRUE(f16.ok()) << f16.status();
  EXPECT_FALSE(f16->config().tie_word_embeddings);
  absl::StatusOr<GgufModel> q41 = GgufModel::Open(FixturePath("q4_1"));
  ASSERT_TRUE(q41.ok()) << q41.status();
  EXPECT_TRUE(q41->config().tie_word_embeddings);  // a quantized table read by the lm head
  EXPECT_EQ(*q41->file().GetInt("general.quantization_version"), 2);
  EXPECT_EQ(q41->file().GetStringArray("tokenizer.ggml.tokens")->size(), 256u);
}

// Greedy decoding of `prompt` plus `new_tokens` on the CPU reference, one token per step;
// the logits at the last prompt position go to `prompt_logits`.
void Decode(const GgufModel& m, const LlamaConfig& config, const std::vector<int32_t>& prompt,
            size_t new_tokens, std::vector<int32_t>* got, std::vector<float>* prompt_logits) {
  const int64_t steps = static_cast<int64_t>(prompt.size() + new_tokens);
  LlamaGraphOptions options;
  options.max_seq = steps;
  absl::StatusOr<Graph> graph = BuildLlamaDecodeGraph(config, options);
  ASSERT_TRUE(graph.ok()) << graph.status();
  absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(graph));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const Graph& g = plan->graph();
  Bindings bindings(g);
  ASSERT_TRUE(BindGgufWeights(m, g, bindings).ok()) << BindGgufWeights(m, g, bindings);
  std::vector<std::byte> arena(static_cast<size_t>(plan->arena_bytes()));
  bindings.SetArena(arena.data(), static_cast<int64_t>(arena.size()));
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
  got->clear();
  for (int64_t step = 0; step + 1 < steps; ++step) {
    const int64_t n = static_cast<int64_t>(prompt.size());
    ids = step < n ? prompt[step] : (*got)[step - n];
    pos = static_cast<int32_t>(step);
    std::memset(arena.data(), 0xFF, arena.size());  // every intermediate must be written
    absl::StatusOr<ExecStats> stats = Execute(*plan, bindings, dispatch);
    ASSERT_TRUE(stats.ok()) << "step " << step << ": " << stats.status();
    ASSERT_EQ(dispatch.TakeErrorFlags(), 0u);
    if (step == n - 1) {
      const TensorArg a = ResolveTensor(*plan, bindings, logits_index);
      prompt_logits->resize(a.shape.NumElements());
      std::memcpy(prompt_logits->data(), a.data, prompt_logits->size() * sizeof(float));
    }
    if (step >= n - 1) {
      got->push_back(*static_cast<const int32_t*>(ResolveTensor(*plan, bindings, next_index).data));
    }
  }
}

// The f32 fixture run on the CPU reference with interleaved RoPE and the weights as
// stored: transformers un-permutes Q and K and pairs (i, i + d/2); the two must agree.
TEST(GgufParityTest, F32FixtureDecodesAsTransformers) {
  absl::StatusOr<GgufModel> m = GgufModel::Open(FixturePath("f32"));
  ASSERT_TRUE(m.ok()) << m.status();
  const testing::ParityExpected want = testing::ReadParityExpected(
      absl::StrCat(SG_FIXTURES_DIR, "/gguf_f32/expected.json"));
  ASSERT_GE(want.generated.size(), 32u);
  std::vector<int32_t> got;
  std::vector<float> logits;
  Decode(*m, m->config(), want.prompt, want.generated.size(), &got, &logits);
  ASSERT_EQ(got.size(), want.generated.size());
  const double err = testing::NormalizedError(logits, want.prompt_last_logits);
  std::printf("[ gguf_f32 ] logits at the last prompt position: normalised error %.3g\n", err);
  EXPECT_LE(err, testing::kParityF32Tolerance);
  for (size_t k = 0; k < got.size(); ++k) ASSERT_EQ(got[k], want.generated[k]) << "token " << k;

  // The same stored weights with the default pairing are wrong: the setting matters.
  LlamaConfig plain = m->config();
  plain.rope_interleaved = false;
  Decode(*m, plain, want.prompt, want.generated.size(), &got, &logits);
  EXPECT_GT(testing::NormalizedError(logits, want.prompt_last_logits), 1e-2);
  EXPECT_NE(got, want.generated);
}

// ---- refusals, on small files the test writes ----

// A valid one-layer llama: hidden 64, 2 heads of 32, 1 KV head, intermediate 32, vocab 32.
struct TinyLlama {
  GgufTestFile file;
  TinyLlama() {
    file.Add("general.architecture", v::String("llama"));
    file.Add("llama.context_length", v::U32(128));
    file.Add("llama.embedding_length", v::U32(64));
    file.Add("llama.block_count", v::U32(1));
    file.Add("llama.feed_forward_length", v::U32(32));
    file.Add("llama.attention.head_count", v::U32(2));
    file.Add("llama.attention.head_count_kv", v::U32(1));
    file.Add("llama.attention.layer_norm_rms_epsilon", v::F32(1e-6f));
    file.Add("llama.rope.freq_base", v::F32(500000.0f));
    file.Add("llama.rope.dimension_count", v::U32(32));
    file.Add("general.quantization_version", v::U32(2));
    std::vector<std::string> tokens;
    for (int i = 0; i < 32; ++i) tokens.push_back(absl::StrCat("t", i));
    file.Add("tokenizer.ggml.tokens", v::Strings(tokens));
    using testing::kGgufF32;
    using testing::kGgufQ8_0;
    file.tensors = {
        {"token_embd.weight", {64, 32}, kGgufQ8_0},
        {"blk.0.attn_norm.weight", {64}, kGgufF32},
        {"blk.0.attn_q.weight", {64, 64}, kGgufQ8_0},
        {"blk.0.attn_k.weight", {64, 32}, kGgufQ8_0},
        {"blk.0.attn_v.weight", {64, 32}, kGgufQ8_0},
        {"blk.0.attn_output.weight", {64, 64}, kGgufQ8_0},
        {"blk.0.ffn_norm.weight", {64}, kGgufF32},
        {"blk.0.ffn_gate.weight", {64, 32}, kGgufQ8_0},
        {"blk.0.ffn_up.weight", {64, 32}, kGgufQ8_0},
        {"blk.0.ffn_down.weight", {32, 64}, kGgufQ8_0},
        {"output_norm.weight", {64}, kGgufF32},
    };
  }
  void Set(const std::string& key, const std::string& value) {
    for (auto& [k, val] : file.metadata) {
      if (k == key) {
        val = value;
        return;
      }
    }
    file.Add(key, value);
  }
  void Remove(const std::string& key) {
    std::erase_if(file.metadata, [&](const auto& kv) { return kv.first == key; });
  }
  GgufTestTensor& Tensor(const std::string& name) {
    for (GgufTestTensor& t : file.tensors) {
      if (t.name == name) return t;
    }
    file.tensors.push_back({name, {1}, testing::kGgufF32});
    return file.tensors.back();
  }
};

class GgufModelRefusalTest : public ::testing::Test {
 protected:
  absl::StatusOr<GgufModel> Load(const TinyLlama& t) {
    bytes_ = t.file.Build();
    absl::StatusOr<GgufFile> f = GgufFile::Parse(
        absl::Span<const std::byte>(reinterpret_cast<const std::byte*>(bytes_.data()),
                                    bytes_.size()),
        "tiny.gguf");
    if (!f.ok()) return f.status();
    return GgufModel::FromFile(*std::move(f));
  }
  void ExpectRefused(const TinyLlama& t, const std::string& needle) {
    absl::StatusOr<GgufModel> m = Load(t);
    ASSERT_FALSE(m.ok()) << "accepted; expected an error containing: " << needle;
    EXPECT_NE(m.status().message().find(needle), absl::string_view::npos)
        << m.status().message() << "\nexpected to contain: " << needle;
    EXPECT_NE(m.status().message().find("tiny.gguf"), absl::string_view::npos)
        << m.status().message();
  }
  std::string bytes_;
};

TEST_F(GgufModelRefusalTest, TheTinyModelLoads) {
  TinyLlama t;
  absl::StatusOr<GgufModel> m = Load(t);
  ASSERT_TRUE(m.ok()) << m.status();
  const LlamaConfig& c = m->config();
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.vocab_size, 32);  // from the token list
  EXPECT_FLOAT_EQ(c.rope_theta, 500000.0f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_EQ(c.max_position_embeddings, 128);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(m->Find("model.embed_tokens.weight")->dtype, DType::kQ8_0);
  EXPECT_EQ(m->Find("model.embed_tokens.weight")->shape, Shape({32, 64}));

  // Optional keys take their defaults; biases are found by their tensors.
  t.Remove("llama.attention.head_count_kv");
  t.Remove("llama.rope.freq_base");
  t.Remove("llama.rope.dimension_count");
  t.Tensor("blk.0.attn_k.weight").dims = {64, 64};
  t.Tensor("blk.0.attn_v.weight").dims = {64, 64};
  for (const char* p : {"attn_q", "attn_k", "attn_v"}) {
    t.Tensor(absl::StrCat("blk.0.", p, ".bias")).dims = {64};
  }
  t.Tensor("blk.0.attn_output.bias").dims = {64};
  t.Tensor("output.weight") = {"output.weight", {64, 32}, testing::kGgufQ8_0};
  m = Load(t);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config().num_key_value_heads, 2);
  EXPECT_FLOAT_EQ(m->config().rope_theta, 10000.0f);
  EXPECT_TRUE(m->config().attention_bias);
  EXPECT_FALSE(m->config().tie_word_embeddings);
  EXPECT_EQ(m->Find("model.layers.0.self_attn.o_proj.bias")->shape, Shape({64}));
}

TEST_F(GgufModelRefusalTest, ArchitecturesAndKeysThatChangeTheComputation) {
  TinyLlama t;
  t.Set("general.architecture", v::String("gpt2"));
  ExpectRefused(t, "architecture 'gpt2' is not supported");
  t = TinyLlama();
  t.Remove("general.architecture");
  ExpectRefused(t, "key 'general.architecture' is missing");
  t = TinyLlama();
  t.Remove("llama.block_count");
  ExpectRefused(t, "key 'llama.block_count': missing required key");
  t = TinyLlama();
  t.Set("llama.embedding_length", v::String("64"));
  ExpectRefused(t, "key 'llama.embedding_length': expected an integer");
  t = TinyLlama();
  t.Set("llama.block_count", v::U64(uint64_t{1} << 40));
  ExpectRefused(t, "key 'llama.block_count': value 1099511627776 is outside [1, 4096]");
  t = TinyLlama();
  t.Set("llama.context_length", v::U32(0));
  ExpectRefused(t, "key 'llama.context_length': value 0 is outside");
  t = TinyLlama();
  t.Set("llama.attention.head_count_kv", v::Numbers<uint32_t>(4, {1}));
  ExpectRefused(t, "per-layer values");
  t = TinyLlama();
  t.Set("llama.rope.dimension_count", v::U32(16));
  ExpectRefused(t, "partial rotary embeddings are not supported");
  t = TinyLlama();
  t.Set("llama.attention.key_length", v::U32(32));
  t.Set("llama.attention.value_length", v::U32(16));
  ExpectRefused(t, "attention.value_length");
  t = TinyLlama();
  t.Set("llama.rope.scaling.type", v::String("yarn"));
  ExpectRefused(t, "RoPE scaling 'yarn' is not supported");
  t = TinyLlama();
  t.Set("llama.rope.scaling.type", v::String("linear"));
  t.Set("llama.rope.scaling.factor", v::F32(4.0f));
  ExpectRefused(t, "RoPE scaling factor 4 is not supported");
  t = TinyLlama();
  t.Set("llama.expert_count", v::U32(8));
  ExpectRefused(t, "mixtures of experts are not supported");
  t = TinyLlama();
  t.Set("llama.attention.sliding_window", v::U32(4096));
  ExpectRefused(t, "key 'llama.attention.sliding_window' (value 4096) is unknown");
  t = TinyLlama();
  t.Set("llama.attention.layer_norm_rms_epsilon", v::F32(-1.0f));
  ExpectRefused(t, "must be > 0");
  t = TinyLlama();
  t.Set("llama.rope.freq_base", v::F64(1e300));
  ExpectRefused(t, "is not a finite float");
  t = TinyLlama();
  t.Set("llama.vocab_size", v::U32(16));
  ExpectRefused(t, "16 is less than the 32 tokens");
  t = TinyLlama();
  t.Set("split.count", v::U16(3));
  ExpectRefused(t, "split GGUF files");
  t = TinyLlama();
  t.Set("general.quantization_version", v::U32(1));
  ExpectRefused(t, "general.quantization_version 1 is not supported");
  t = TinyLlama();
  t.Set("llama.attention.head_count", v::U32(3));
  ExpectRefused(t, "embedding_length 64 is not a multiple of the 3 heads");
}

TEST_F(GgufModelRefusalTest, TensorsThatDoNotMatchTheConfig) {
  TinyLlama t;
  t.file.tensors.erase(t.file.tensors.begin() + 3);  // blk.0.attn_k.weight
  ExpectRefused(t, "needs tensor 'model.layers.0.self_attn.k_proj.weight' [32,64]");
  t = TinyLlama();
  t.Tensor("blk.0.attn_q.weight").dims = {64, 32};
  ExpectRefused(t, "tensor 'blk.0.attn_q.weight' (model.layers.0.self_attn.q_proj.weight) has "
                   "shape [32,64] but the config needs [64,64]");
  t = TinyLlama();
  t.Tensor("blk.1.attn_q.weight") = {"blk.1.attn_q.weight", {64, 64}, testing::kGgufQ8_0};
  ExpectRefused(t, "tensor 'blk.1.attn_q.weight' (model.layers.1.self_attn.q_proj.weight) is "
                   "not used");
  t = TinyLlama();
  t.Tensor("blk.0.attn_norm.weight").type = testing::kGgufQ8_0;
  t.Tensor("blk.0.attn_norm.weight").dims = {64};
  ExpectRefused(t, "tensor 'blk.0.attn_norm.weight' is Q8_0; norms and biases must be");
  t = TinyLlama();
  t.Tensor("blk.0.attn_rot_embd") = {"blk.0.attn_rot_embd", {4}, testing::kGgufF32};
  ExpectRefused(t, "tensor 'blk.0.attn_rot_embd' ends in neither .weight nor .bias");
  t = TinyLlama();
  t.Tensor("pos_embd.weight") = {"pos_embd.weight", {64, 8}, testing::kGgufF32};
  ExpectRefused(t, "tensor 'pos_embd.weight' is not a tensor of a llama model");
  t = TinyLlama();
  t.Tensor("token_embd.weight").dims = {64, 40};
  ExpectRefused(t, "has shape [40,64] but the config needs [32,64]");
}

// Llama 3 RoPE scaling comes as per-frequency divisors in rope_freqs.weight; they are
// accepted when they are Llama 3's (computed here in double, the converter's way) and
// refused otherwise.
TEST_F(GgufModelRefusalTest, RopeFreqsOfLlama3ScalingAreUnderstood) {
  const int half = 16;
  const double theta = 500000.0, factor = 32.0, low = 1.0, high = 4.0, original = 8192.0;
  std::vector<float> divisors;
  for (int j = 0; j < half; ++j) {
    const double freq = 1.0 / std::pow(theta, 2.0 * j / (2.0 * half));
    const double wavelen = 2.0 * M_PI / freq;
    if (wavelen < original / high) {
      divisors.push_back(1.0f);
    } else if (wavelen > original / low) {
      divisors.push_back(static_cast<float>(factor));
    } else {
      const double smooth = (original / wavelen - low) / (high - low);
      divisors.push_back(static_cast<float>(1.0 / ((1.0 - smooth) / factor + smooth)));
    }
  }
  ASSERT_GT(divisors.front(), 0.0f);
  TinyLlama t;
  t.Tensor("rope_freqs.weight") = {"rope_freqs.weight", {half}, testing::kGgufF32};
  std::string bytes = t.file.Build();
  // Write the divisors over the tensor's random bytes.
  uint64_t data = 0;
  t.file.Build(&data);
  uint64_t offset = 0;
  for (const GgufTestTensor& x : t.file.tensors) {
    if (x.name == "rope_freqs.weight") break;
    offset = (offset + testing::GgufTestTensorBytes(x.type, x.dims) + 31) / 32 * 32;
  }
  auto load = [&](const std::vector<float>& values) {
    std::memcpy(bytes.data() + data + offset, values.data(), values.size() * sizeof(float));
    absl::StatusOr<GgufFile> f = GgufFile::Parse(
        absl::Span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()),
                                    bytes.size()),
        "tiny.gguf");
    EXPECT_TRUE(f.ok()) << f.status();
    return GgufModel::FromFile(*std::move(f));
  };
  absl::StatusOr<GgufModel> m = load(divisors);
  ASSERT_TRUE(m.ok()) << m.status();
  const ops::RopeScaling& s = m->config().rope_scaling;
  EXPECT_EQ(s.type, ops::RopeScaling::Type::kLlama3);
  EXPECT_FLOAT_EQ(s.factor, 32.0f);
  EXPECT_FLOAT_EQ(s.low_freq_factor, 1.0f);
  EXPECT_FLOAT_EQ(s.high_freq_factor, 4.0f);
  EXPECT_EQ(s.original_max_position, 8192);
  EXPECT_EQ(m->Find("rope_freqs.weight"), nullptr);  // consumed by the config

  std::vector<float> other = divisors;
  other[half / 2] *= 1.5f;
  absl::StatusOr<GgufModel> bad = load(other);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("are not Llama 3 scaling"), absl::string_view::npos)
      << bad.status();
  std::vector<float> below(divisors.size(), 0.5f);
  EXPECT_FALSE(load(below).ok());
}

TEST(GgufNamesTest, GgufNamesMapToTheGraphsNames) {
  const std::pair<const char*, const char*> cases[] = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
      {"blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"},
      {"blk.12.attn_k.weight", "model.layers.12.self_attn.k_proj.weight"},
      {"blk.3.attn_v.bias", "model.layers.3.self_attn.v_proj.bias"},
      {"blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"},
      {"blk.3.ffn_gate.weight", "model.layers.3.mlp.gate_proj.weight"},
      {"blk.3.ffn_up.weight", "model.layers.3.mlp.up_proj.weight"},
      {"blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight"},
      {"blk.3.attn_norm.weight", "model.layers.3.input_layernorm.weight"},
      {"blk.3.ffn_norm.weight", "model.layers.3.post_attention_layernorm.weight"},
  };
  for (const auto& [gguf, hf] : cases) {
    absl::StatusOr<std::string> got = HfNameFromGguf(gguf);
    ASSERT_TRUE(got.ok()) << gguf << ": " << got.status();
    EXPECT_EQ(*got, hf);
  }
  for (const char* bad : {"blk.01.attn_q.weight", "blk.-1.attn_q.weight", "blk..attn_q.weight",
                          "blk.1", "blk.1.attn_q", "blk.1.attn_norm.bias", "blk.1.ffn_gate_exps.weight",
                          "blk.99999999999.attn_q.weight", "token_embd", "rope_freqs.weight"}) {
    EXPECT_FALSE(HfNameFromGguf(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace sg
