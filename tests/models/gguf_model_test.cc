// Llama models from GGUF: the committed fixtures (tests/fixtures/gguf_*, made by
// make_gguf_fixtures.py the way llama.cpp's converter writes files: F32 norms and biases
// beside F32, F16, BF16 or quantized matrices) load with the config, graph names, dtypes
// and shapes their writer used; every one decodes token for token as transformers does
// on the CPU reference, plain and fused (the f32 one also shows the Q/K permutation and
// interleaved RoPE agree); F16 and BF16 files are computed in their dtype with their F32
// tensors rounded at load; and files whose metadata or tensors say something stepgraph
// would run differently are refused, naming the key or tensor.
#include "models/gguf_model.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "stepgraph/models/llama.h"
#include "nlohmann/json.hpp"
#include "stepgraph/dispatch/cpu_dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/graph/passes.h"
#include "stepgraph/base/half.h"
#include "tests/models/gguf_writer.h"
#include "tests/models/parity_expected.h"
#include "tests/testing/util.h"

#ifndef SG_FIXTURES_DIR
#error "SG_FIXTURES_DIR must name tests/fixtures"
#endif

namespace sg {
namespace {

namespace v = testing::gguf_value;

// f16 rounds every intermediate as transformers' float16 run does, in another order: a
// few f16 ulps of the logits, relative to their norm.
constexpr double kParityF16Tolerance = 5e-3;
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
  DType matrices;  // q_proj's dtype, as stored
  bool wide;       // the K-quant shape (hidden 256)
  bool biases = false;
};

// The dtype the file is computed in: its matrices' for F16 and BF16 files, else F32.
DType ComputeDTypeOf(const FixtureCase& fc) {
  return fc.matrices == DType::kF16 || fc.matrices == DType::kBF16 ? fc.matrices : DType::kF32;
}

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
  const DType compute = ComputeDTypeOf(fc);
  EXPECT_EQ(c.dtype, compute);
  EXPECT_EQ(c.attention_bias, fc.biases);
  EXPECT_EQ(c.mlp_bias, fc.biases);
  EXPECT_EQ(c.tie_word_embeddings, want.value("tied_embeddings", false));

  // Every weight under its graph name, with the graph's shape. The file stores every 1-D
  // tensor in F32, as the converter does; the graph reads it in the compute dtype, rounded
  // at load when that is not F32, and every other weight in place.
  const int64_t biases = fc.biases ? 7 : 0;
  const int64_t expected_count = 2 + 2 * (9 + biases) + (c.tie_word_embeddings ? 0 : 1);
  ASSERT_EQ(static_cast<int64_t>(m->weights().size()), expected_count);
  int64_t bytes = 0;
  for (const GgufWeight& w : m->weights()) {
    bytes += static_cast<int64_t>(w.data.size());
    EXPECT_EQ(static_cast<int64_t>(w.data.size()), TensorBytes(w.dtype, w.shape)) << w.name;
    const GgufTensor& stored = *m->file().FindTensor(w.gguf_name);
    EXPECT_EQ(w.stored_dtype, stored.dtype) << w.name;
    if (w.shape.rank() == 1) {
      EXPECT_EQ(w.stored_dtype, DType::kF32) << w.name;
      EXPECT_EQ(w.dtype, compute) << w.name;
    }
    if (w.dtype == stored.dtype) {
      EXPECT_EQ(stored.data.data(), w.data.data()) << w.name;
      continue;
    }
    // Rounded once to the compute dtype, as transformers' .to(dtype) rounds.
    EXPECT_EQ(w.dtype, compute) << w.name;
    for (int64_t i = 0; i < w.shape.NumElements(); ++i) {
      ASSERT_EQ(LoadElement(w.data.data(), w.dtype, i),
                RoundTo(compute, LoadElement(stored.data.data(), stored.dtype, i)))
          << w.name << " element " << i;
    }
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
  EXPECT_EQ(dtypes.at("model.norm.weight"), compute);
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
                      FixtureCase{"bf16", DType::kBF16, false, /*biases=*/true},
                      FixtureCase{"q8_0", DType::kQ8_0, false},
                      FixtureCase{"q8_0_bias", DType::kQ8_0, false, /*biases=*/true},
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
  absl::StatusOr<GgufModel> bf16 = GgufModel::Open(FixturePath("bf16"));
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_TRUE(bf16->config().tie_word_embeddings);  // a BF16 table read by the lm head
  EXPECT_TRUE(bf16->config().attention_bias);       // F32 biases rounded to BF16
  EXPECT_EQ(*bf16->file().GetInt("general.file_type"), 32);  // MOSTLY_BF16
  EXPECT_EQ(*f16->file().GetInt("general.file_type"), 1);    // MOSTLY_F16
  absl::StatusOr<GgufModel> q41 = GgufModel::Open(FixturePath("q4_1"));
  ASSERT_TRUE(q41.ok()) << q41.status();
  EXPECT_TRUE(q41->config().tie_word_embeddings);  // a quantized table read by the lm head
  EXPECT_EQ(*q41->file().GetInt("general.quantization_version"), 2);
  EXPECT_EQ(q41->file().GetStringArray("tokenizer.ggml.tokens")->size(), 256u);
}

// Greedy decoding of `prompt` plus `new_tokens` on the CPU reference, one token per step,
// through `passes` (none when null).
struct Decoded {
  std::vector<int32_t> ids;
  std::vector<float> prompt_logits;  // at the last prompt position
  std::vector<float> final_logits;   // after the last generated id
};

void Decode(const GgufModel& m, const LlamaConfig& config, const std::vector<int32_t>& prompt,
            size_t new_tokens, const PassOptions* passes, Decoded* out) {
  const int64_t steps = static_cast<int64_t>(prompt.size() + new_tokens);
  LlamaGraphOptions options;
  options.max_seq = steps;
  LlamaConfig c = config;
  c.weight_dtypes = m.WeightDTypes();  // as ModelFiles sets them: each weight as stored
  absl::StatusOr<Graph> graph = BuildLlamaDecodeGraph(c, options);
  ASSERT_TRUE(graph.ok()) << graph.status();
  if (passes != nullptr) {
    graph = RunPasses(*std::move(graph), *passes);
    ASSERT_TRUE(graph.ok()) << graph.status();
  }
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
  auto logits = [&] {
    const TensorArg a = ResolveTensor(*plan, bindings, logits_index);
    std::vector<float> v(static_cast<size_t>(a.shape.NumElements()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = LoadElement(a.data, a.dtype, i);
    return v;
  };
  CpuDispatch dispatch;
  ASSERT_TRUE(dispatch.Prepare(*plan).ok());
  out->ids.clear();
  const int64_t n = static_cast<int64_t>(prompt.size());
  for (int64_t step = 0; step < steps; ++step) {
    ids = step < n ? prompt[step] : out->ids[step - n];
    pos = static_cast<int32_t>(step);
    std::memset(arena.data(), 0xFF, arena.size());  // every intermediate must be written
    absl::StatusOr<ExecStats> stats = Execute(*plan, bindings, dispatch);
    ASSERT_TRUE(stats.ok()) << "step " << step << ": " << stats.status();
    ASSERT_EQ(dispatch.TakeErrorFlags(), 0u);
    if (step == n - 1) out->prompt_logits = logits();
    if (step == steps - 1) {
      out->final_logits = logits();
      break;  // this step's choice is past the recorded tokens
    }
    if (step >= n - 1) {
      out->ids.push_back(
          *static_cast<const int32_t*>(ResolveTensor(*plan, bindings, next_index).data));
    }
  }
}

// Every fixture on the CPU reference against transformers' run of the same file
// (dequantized; in float32, or in the file's own dtype for F16 and BF16 files): its
// greedy ids (all of them, or the first checked_tokens the fixture guarantees clear
// margins for) and its logits. Then the fused step (every pass, block formats included)
// must give the plain step's ids and logits to the bit.
class GgufParityTest : public ::testing::TestWithParam<const char*> {};

TEST_P(GgufParityTest, DecodesAsTransformersPlainAndFused) {
  const std::string name = GetParam();
  absl::StatusOr<GgufModel> m = GgufModel::Open(FixturePath(name));
  ASSERT_TRUE(m.ok()) << m.status();
  const testing::ParityExpected want = testing::ReadParityExpected(
      absl::StrCat(SG_FIXTURES_DIR, "/gguf_", name, "/expected.json"));
  const nlohmann::json json = FixtureJson(name);
  ASSERT_GE(want.generated.size(), 32u);
  const DType t = m->config().dtype;
  ASSERT_EQ(want.dtype, t == DType::kF16    ? "float16"
                        : t == DType::kBF16 ? "bfloat16"
                                            : "float32");
  const size_t checked = json.value("checked_tokens", want.generated.size());
  ASSERT_GE(checked, 16u);
  const double tolerance = t == DType::kBF16  ? testing::kParityBf16Tolerance
                           : t == DType::kF16 ? kParityF16Tolerance
                                              : testing::kParityF32Tolerance;

  Decoded plain;
  Decode(*m, m->config(), want.prompt, want.generated.size(), nullptr, &plain);
  ASSERT_EQ(plain.ids.size(), want.generated.size());
  const double err = testing::NormalizedError(plain.prompt_logits, want.prompt_last_logits);
  size_t matched = 0;
  while (matched < plain.ids.size() && plain.ids[matched] == want.generated[matched]) ++matched;
  std::printf("[ gguf_%s ] %s: logits at the last prompt position: normalised error %.3g; "
              "%zu of %zu greedy ids equal transformers' (%zu required)\n",
              name.c_str(), std::string(DTypeName(t)).c_str(), err, matched,
              want.generated.size(), checked);
  EXPECT_LE(err, tolerance);
  for (size_t k = 0; k < checked; ++k) {
    ASSERT_EQ(plain.ids[k], want.generated[k]) << "token " << k;
  }
  if (matched == want.generated.size()) {
    EXPECT_LE(testing::NormalizedError(plain.final_logits, want.final_logits), tolerance);
  }

  PassOptions every_pass;
  Decoded fused;
  Decode(*m, m->config(), want.prompt, want.generated.size(), &every_pass, &fused);
  EXPECT_EQ(fused.ids, plain.ids);
  EXPECT_EQ(fused.prompt_logits, plain.prompt_logits);
  EXPECT_EQ(fused.final_logits, plain.final_logits);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufParityTest,
                         ::testing::Values("f32", "f16", "bf16", "q8_0", "q8_0_bias", "q4_0",
                                           "q4_1", "q5_0", "q5_1", "q4_k_m"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// The f32 fixture with the stored weights and the default pairing is wrong: the
// interleaved RoPE setting matters.
TEST(GgufParityTest, InterleavedRopeMatters) {
  absl::StatusOr<GgufModel> m = GgufModel::Open(FixturePath("f32"));
  ASSERT_TRUE(m.ok()) << m.status();
  const testing::ParityExpected want = testing::ReadParityExpected(
      absl::StrCat(SG_FIXTURES_DIR, "/gguf_f32/expected.json"));
  LlamaConfig plain = m->config();
  plain.rope_interleaved = false;
  Decoded got;
  Decode(*m, plain, want.prompt, want.generated.size(), nullptr, &got);
  EXPECT_GT(testing::NormalizedError(got.prompt_logits, want.prompt_last_logits), 1e-2);
  EXPECT_NE(got.ids, want.generated);
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
  // The file `t` describes, built into bytes_ and parsed (its views point into bytes_).
  absl::StatusOr<GgufFile> Parse(const TinyLlama& t) {
    bytes_ = t.file.Build();
    return GgufFile::Parse(
        absl::Span<const std::byte>(reinterpret_cast<const std::byte*>(bytes_.data()),
                                    bytes_.size()),
        "tiny.gguf");
  }
  absl::StatusOr<GgufModel> Load(const TinyLlama& t) {
    absl::StatusOr<GgufFile> f = Parse(t);
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
  // A factor without the linear type (linear scaling itself is read: the family fixtures'
  // family_qwen2_linear_rope/model.gguf).
  t = TinyLlama();
  t.Set("llama.rope.scaling.factor", v::F32(4.0f));
  ExpectRefused(t, "RoPE scaling factor 4 is not supported");
  t = TinyLlama();
  t.Set("llama.expert_count", v::U32(8));
  ExpectRefused(t, "key 'llama.expert_used_count': 0 must be in [1, expert_count = 8]");
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

// Mixtral as llama.cpp writes it: "llama" with expert keys, the router ffn_gate_inp and
// the stacked experts ffn_{gate,up,down}_exps [E, rows, cols], here in Q8_0, read in place.
TEST_F(GgufModelRefusalTest, ExpertsLoadStackedAndTheirKeysAreChecked) {
  auto mixtral = [] {
    TinyLlama t;
    t.Set("llama.expert_count", v::U32(4));
    t.Set("llama.expert_used_count", v::U32(2));
    std::erase_if(t.file.tensors, [](const GgufTestTensor& x) {
      return absl::StartsWith(x.name, "blk.0.ffn_") && x.name != "blk.0.ffn_norm.weight";
    });
    t.file.tensors.push_back({"blk.0.ffn_gate_inp.weight", {64, 4}, testing::kGgufF32});
    t.file.tensors.push_back({"blk.0.ffn_gate_exps.weight", {64, 32, 4}, testing::kGgufQ8_0});
    t.file.tensors.push_back({"blk.0.ffn_up_exps.weight", {64, 32, 4}, testing::kGgufQ8_0});
    t.file.tensors.push_back({"blk.0.ffn_down_exps.weight", {32, 64, 4}, testing::kGgufQ8_0});
    return t;
  };
  TinyLlama t = mixtral();
  absl::StatusOr<GgufModel> m = Load(t);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config().num_experts, 4);
  EXPECT_EQ(m->config().experts_per_token, 2);
  EXPECT_EQ(m->config().moe_intermediate_size, 32);
  EXPECT_TRUE(m->config().moe_renormalize);
  const GgufWeight* down = m->Find("model.layers.0.block_sparse_moe.experts.down_proj.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->dtype, DType::kQ8_0);
  EXPECT_EQ(down->shape, Shape({4, 64, 32}));
  // In place: the weight's bytes are the file's.
  const std::byte* begin = reinterpret_cast<const std::byte*>(bytes_.data());
  EXPECT_TRUE(down->data.data() >= begin && down->data.data() < begin + bytes_.size());

  t = mixtral();
  t.Set("llama.expert_used_count", v::U32(5));
  ExpectRefused(t, "key 'llama.expert_used_count': 5 must be in [1, expert_count = 4]");
  t = mixtral();
  t.Set("llama.expert_weights_scale", v::F32(2.5f));
  ExpectRefused(t, "key 'llama.expert_weights_scale' (value 2.5) is unknown");
  t = mixtral();
  t.Tensor("blk.0.ffn_up_exps.weight").dims = {64, 32, 3};
  ExpectRefused(t, "tensor 'blk.0.ffn_up_exps.weight' "
                   "(model.layers.0.block_sparse_moe.experts.up_proj.weight) has shape "
                   "[3,32,64] but the config needs [4,32,64]");
  t = mixtral();
  std::erase_if(t.file.tensors,
                [](const GgufTestTensor& x) { return x.name == "blk.0.ffn_gate_inp.weight"; });
  ExpectRefused(t, "needs tensor 'model.layers.0.block_sparse_moe.gate.weight' [4,64]");
  // Without the expert keys the stacked tensors belong to no model.
  t = mixtral();
  t.Remove("llama.expert_count");
  t.Remove("llama.expert_used_count");
  ExpectRefused(t, "tensor 'blk.0.ffn_gate_inp.weight' is not a tensor of a llama model");
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

// The dtype a file is computed in, and its float tensors of other dtypes rounded to it at
// load: F16 or BF16 when every matrix is, else F32 (quantized files with an F16 matrix
// whose rows are not whole blocks, files mixing F16 and BF16 matrices).
class GgufComputeDTypeTest : public GgufModelRefusalTest {
 protected:
  // `t` with every matrix of `type` (`fallback` for the down projection, when given) and
  // the F32 norms holding `norm_value` + 0.01·i (the file's other bytes are random).
  absl::StatusOr<GgufModel> LoadWith(TinyLlama t, uint32_t type, float norm_value,
                                     std::optional<uint32_t> fallback = std::nullopt) {
    for (GgufTestTensor& tensor : t.file.tensors) {
      if (tensor.dims.size() == 2) tensor.type = type;
    }
    if (fallback.has_value()) t.Tensor("blk.0.ffn_down.weight").type = *fallback;
    absl::StatusOr<GgufFile> f = Parse(t);
    if (!f.ok()) return f.status();
    for (const GgufTensor& tensor : f->tensors()) {
      if (tensor.shape.rank() != 1) continue;
      auto* values = reinterpret_cast<float*>(bytes_.data() +
                                              (tensor.data.data() -
                                               reinterpret_cast<const std::byte*>(bytes_.data())));
      for (int64_t i = 0; i < tensor.shape[0]; ++i) values[i] = norm_value + 0.01f * i;
    }
    return GgufModel::FromFile(*std::move(f));
  }
  bool InFile(const GgufWeight& w) const {
    const auto* p = reinterpret_cast<const char*>(w.data.data());
    return p >= bytes_.data() && p < bytes_.data() + bytes_.size();
  }
};

TEST_F(GgufComputeDTypeTest, HalfFilesComputeInTheirDTypeWithNormsRoundedAtLoad) {
  for (const auto& [type, dtype] : {std::pair{testing::kGgufF16, DType::kF16},
                                    std::pair{testing::kGgufBF16, DType::kBF16}}) {
    SCOPED_TRACE(DTypeName(dtype));
    absl::StatusOr<GgufModel> m = LoadWith(TinyLlama(), type, 0.3f);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->config().dtype, dtype);
    for (const GgufWeight& w : m->weights()) {
      EXPECT_EQ(w.dtype, dtype) << w.name;
      EXPECT_EQ(InFile(w), w.stored_dtype == dtype) << w.name;  // converted ones are copies
    }
    const GgufWeight* norm = m->Find("model.layers.0.input_layernorm.weight");
    ASSERT_NE(norm, nullptr);
    EXPECT_EQ(norm->stored_dtype, DType::kF32);
    for (int64_t i = 0; i < 64; ++i) {
      // 0.3 + 0.01·i is exact in neither dtype: round to nearest even, once.
      ASSERT_EQ(LoadElement(norm->data.data(), dtype, i), RoundTo(dtype, 0.3f + 0.01f * i));
    }
    // The graph the session builds binds every weight as the config says.
    LlamaConfig c = m->config();
    c.weight_dtypes = m->WeightDTypes();
    absl::StatusOr<Graph> g = BuildLlamaDecodeGraph(c, {.max_seq = 8});
    ASSERT_TRUE(g.ok()) << g.status();
    Bindings bindings(*g);
    EXPECT_TRUE(BindGgufWeights(*m, *g, bindings).ok()) << BindGgufWeights(*m, *g, bindings);
  }
}

TEST_F(GgufComputeDTypeTest, ValuesTheComputeDTypeCannotHoldAreRefused) {
  // 70000 is past F16's largest finite value (65504), not BF16's.
  absl::StatusOr<GgufModel> f16 = LoadWith(TinyLlama(), testing::kGgufF16, 70000.0f);
  ASSERT_FALSE(f16.ok());
  EXPECT_NE(f16.status().message().find("tiny.gguf: tensor 'blk.0.attn_norm.weight' holds 70000 "
                                        "at element 0, which f16"),
            absl::string_view::npos)
      << f16.status().message();
  EXPECT_TRUE(LoadWith(TinyLlama(), testing::kGgufBF16, 70000.0f).ok());
}

TEST_F(GgufComputeDTypeTest, QuantizedAndMixedFilesComputeInF32) {
  // Q8_0 matrices with one F16 matrix (llama-quantize's fallback for rows that are not
  // whole blocks): F32, the F16 matrix widened exactly.
  absl::StatusOr<GgufModel> q = LoadWith(TinyLlama(), testing::kGgufQ8_0, 0.5f,
                                         testing::kGgufF16);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->config().dtype, DType::kF32);
  const GgufWeight* down = q->Find("model.layers.0.mlp.down_proj.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->stored_dtype, DType::kF16);
  EXPECT_EQ(down->dtype, DType::kF32);
  const GgufTensor& stored = *q->file().FindTensor("blk.0.ffn_down.weight");
  for (int64_t i = 0; i < down->shape.NumElements(); ++i) {
    const float want = LoadElement(stored.data.data(), DType::kF16, i);
    const float got = LoadElement(down->data.data(), DType::kF32, i);
    ASSERT_TRUE(got == want || (std::isnan(got) && std::isnan(want))) << i;
  }
  EXPECT_EQ(q->Find("model.layers.0.self_attn.q_proj.weight")->dtype, DType::kQ8_0);
  EXPECT_TRUE(InFile(*q->Find("model.layers.0.self_attn.q_proj.weight")));
  EXPECT_TRUE(InFile(*q->Find("model.norm.weight")));  // F32 norms are read in place

  // F16 and BF16 matrices in one file: no 16-bit dtype holds both exactly.
  absl::StatusOr<GgufModel> mixed = LoadWith(TinyLlama(), testing::kGgufF16, 0.5f,
                                             testing::kGgufBF16);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ(mixed->config().dtype, DType::kF32);
  for (const GgufWeight& w : mixed->weights()) EXPECT_EQ(w.dtype, DType::kF32) << w.name;
}

// A BF16 mixture of experts as llama.cpp's converter writes it keeps its router
// (ffn_gate_inp) in F32: the file still computes in BF16, the router rounded at load (its
// values were the model's bf16 ones), not the whole model widened to F32 at twice the
// memory.
TEST_F(GgufComputeDTypeTest, AnF32RouterKeepsAHalfFileInItsDType) {
  TinyLlama t;
  t.Set("llama.expert_count", v::U32(4));
  t.Set("llama.expert_used_count", v::U32(2));
  std::erase_if(t.file.tensors, [](const GgufTestTensor& x) {
    return absl::StartsWith(x.name, "blk.0.ffn_") && x.name != "blk.0.ffn_norm.weight";
  });
  for (GgufTestTensor& tensor : t.file.tensors) {
    if (tensor.dims.size() == 2) tensor.type = testing::kGgufBF16;
  }
  t.file.tensors.push_back({"blk.0.ffn_gate_inp.weight", {64, 4}, testing::kGgufF32});
  t.file.tensors.push_back({"blk.0.ffn_gate_exps.weight", {64, 32, 4}, testing::kGgufBF16});
  t.file.tensors.push_back({"blk.0.ffn_up_exps.weight", {64, 32, 4}, testing::kGgufBF16});
  t.file.tensors.push_back({"blk.0.ffn_down_exps.weight", {32, 64, 4}, testing::kGgufBF16});
  absl::StatusOr<GgufFile> f = Parse(t);
  ASSERT_TRUE(f.ok()) << f.status();
  // The F32 tensors' random bytes become finite values: norms and the router, which holds
  // bf16 values except its last, which bf16 rounds.
  for (const GgufTensor& tensor : f->tensors()) {
    if (tensor.dtype != DType::kF32) continue;
    auto* values = reinterpret_cast<float*>(
        bytes_.data() + (tensor.data.data() - reinterpret_cast<const std::byte*>(bytes_.data())));
    const int64_t n = tensor.shape.NumElements();
    for (int64_t i = 0; i < n; ++i) values[i] = RoundTo(DType::kBF16, 0.25f + 0.01f * i);
    values[n - 1] = 0.3f;
  }
  absl::StatusOr<GgufModel> m = GgufModel::FromFile(*std::move(f));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config().dtype, DType::kBF16);
  for (const GgufWeight& w : m->weights()) EXPECT_EQ(w.dtype, DType::kBF16) << w.name;
  const GgufWeight* router = m->Find("model.layers.0.block_sparse_moe.gate.weight");
  ASSERT_NE(router, nullptr);
  EXPECT_EQ(router->stored_dtype, DType::kF32);
  EXPECT_EQ(LoadElement(router->data.data(), DType::kBF16, 0), RoundTo(DType::kBF16, 0.25f));
  EXPECT_EQ(LoadElement(router->data.data(), DType::kBF16, 4 * 64 - 1),
            RoundTo(DType::kBF16, 0.3f));
  // The experts are read in place.
  EXPECT_TRUE(InFile(*m->Find("model.layers.0.block_sparse_moe.experts.down_proj.weight")));
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
