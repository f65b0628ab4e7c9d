// config.json parsing: the legacy and the rope_parameters forms, defaults, and every
// refusal (unsupported values, unknown fields, wrong types, missing fields), each of which
// must name the field and the value so that a user can act on it.
#include "models/config.h"

#include <algorithm>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace sg {
namespace {

using Json = nlohmann::json;

// Llama-3.2-1B's config.json as older writers save it (legacy RoPE fields).
Json LegacyLlama32Config() {
  return Json::parse(R"({
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": false,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": false,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
      "factor": 32.0,
      "high_freq_factor": 4.0,
      "low_freq_factor": 1.0,
      "original_max_position_embeddings": 8192,
      "rope_type": "llama3"
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": true,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0",
    "use_cache": true,
    "vocab_size": 128256
  })");
}

// The same model as newer writers save it: "dtype" and one "rope_parameters" object.
Json RopeParametersConfig() {
  Json j = LegacyLlama32Config();
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j.erase("torch_dtype");
  j["dtype"] = "bfloat16";
  j["pad_token_id"] = nullptr;
  j["rope_parameters"] = Json::parse(R"({
    "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192, "rope_theta": 500000.0, "rope_type": "llama3"
  })");
  return j;
}

// A small config with only the fields every writer includes.
Json MinimalConfig() {
  return Json::parse(R"({
    "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
    "num_attention_heads": 4, "vocab_size": 256
  })");
}

absl::StatusOr<LlamaConfig> Parse(const Json& j) { return ParseLlamaConfig(j.dump(), "cfg.json"); }

// The status is InvalidArgument and its message holds the source and every fragment.
void ExpectInvalid(const absl::StatusOr<LlamaConfig>& r,
                   std::initializer_list<std::string> fragments) {
  ASSERT_FALSE(r.ok()) << "parsed although it should not";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  const std::string msg(r.status().message());
  EXPECT_NE(msg.find("cfg.json"), std::string::npos) << msg;
  for (const std::string& f : fragments) {
    EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  }
}

void ExpectLlama32(const LlamaConfig& c) {
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 8192);
  EXPECT_EQ(c.num_hidden_layers, 16);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 500000.0f);
  EXPECT_EQ(c.rope_scaling.type, ops::RopeScaling::Type::kLlama3);
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 32.0f);
  EXPECT_FLOAT_EQ(c.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_FLOAT_EQ(c.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(c.rope_scaling.original_max_position, 8192);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_EQ(c.dtype, DType::kBF16);
}

TEST(ConfigTest, ParsesLegacyLlama3Config) {
  absl::StatusOr<LlamaConfig> c = Parse(LegacyLlama32Config());
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectLlama32(*c);
}

TEST(ConfigTest, ParsesRopeParametersForm) {
  absl::StatusOr<LlamaConfig> c = Parse(RopeParametersConfig());
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectLlama32(*c);
}

TEST(ConfigTest, BothRopeFormsMustAgree) {
  Json j = RopeParametersConfig();
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = LegacyLlama32Config()["rope_scaling"];
  ASSERT_TRUE(Parse(j).ok()) << Parse(j).status();

  Json theta = j;
  theta["rope_theta"] = 10000.0;
  ExpectInvalid(Parse(theta), {"rope_theta", "10000", "contradicts"});

  Json scaling = j;
  scaling["rope_scaling"]["factor"] = 8.0;
  ExpectInvalid(Parse(scaling), {"rope_scaling", "contradicts"});
}

TEST(ConfigTest, DefaultRopeTypeMeansNoScaling) {
  Json j = MinimalConfig();
  j["rope_parameters"] = {{"rope_theta", 10000.0}, {"rope_type", "default"}};
  absl::StatusOr<LlamaConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, ops::RopeScaling::Type::kNone);
  EXPECT_FLOAT_EQ(c->rope_theta, 10000.0f);

  Json legacy = MinimalConfig();
  legacy["rope_theta"] = 250000;  // an integer is a valid number
  legacy["rope_scaling"] = {{"type", "default"}};
  c = Parse(legacy);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, ops::RopeScaling::Type::kNone);
  EXPECT_FLOAT_EQ(c->rope_theta, 250000.0f);
}

TEST(ConfigTest, LegacyTypeKeyIsAccepted) {
  Json j = LegacyLlama32Config();
  j["rope_scaling"].erase("rope_type");
  j["rope_scaling"]["type"] = "llama3";
  absl::StatusOr<LlamaConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, ops::RopeScaling::Type::kLlama3);

  j["rope_scaling"]["rope_type"] = "linear";
  ExpectInvalid(Parse(j), {"rope_scaling.type", "contradicts", "linear"});
}

TEST(ConfigTest, DefaultsFollowTheReference) {
  absl::StatusOr<LlamaConfig> c = Parse(MinimalConfig());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 4);  // = num_attention_heads
  EXPECT_EQ(c->head_dim, 16);            // = hidden_size / num_attention_heads
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(c->rope_theta, 10000.0f);
  EXPECT_EQ(c->rope_scaling.type, ops::RopeScaling::Type::kNone);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->dtype, DType::kF32);

  // null means "not given" for optional fields.
  Json j = MinimalConfig();
  j["head_dim"] = nullptr;
  j["num_key_value_heads"] = nullptr;
  j["rope_scaling"] = nullptr;
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->num_key_value_heads, 4);

  // An explicit head_dim wins over hidden_size / heads.
  j["head_dim"] = 32;
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 32);
}

TEST(ConfigTest, DTypes) {
  for (auto [name, dtype] : {std::pair<const char*, DType>{"float32", DType::kF32},
                             {"bfloat16", DType::kBF16},
                             {"float16", DType::kF16}}) {
    Json a = MinimalConfig();
    a["torch_dtype"] = name;
    absl::StatusOr<LlamaConfig> c = Parse(a);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->dtype, dtype) << name;
    Json b = MinimalConfig();
    b["dtype"] = name;
    c = Parse(b);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->dtype, dtype) << name;
  }
  for (const char* bad : {"float64", "int8", "float8_e4m3fn"}) {
    Json j = MinimalConfig();
    j["torch_dtype"] = bad;
    ExpectInvalid(Parse(j), {"torch_dtype", bad, "unsupported"});
  }
  Json both = MinimalConfig();
  both["torch_dtype"] = "float32";
  both["dtype"] = "bfloat16";
  ExpectInvalid(Parse(both), {"dtype", "bfloat16", "float32", "contradicts"});
}

TEST(ConfigTest, UnsupportedRopeTypes) {
  for (const char* type : {"dynamic", "yarn", "longrope"}) {
    Json legacy = LegacyLlama32Config();
    legacy["rope_scaling"] = {{"rope_type", type}, {"factor", 2.0}};
    ExpectInvalid(Parse(legacy), {"rope_scaling.rope_type", type, "unsupported"});

    Json params = RopeParametersConfig();
    params["rope_parameters"] = {{"rope_type", type}, {"factor", 2.0}, {"rope_theta", 1e4}};
    ExpectInvalid(Parse(params), {"rope_parameters.rope_type", type, "unsupported"});
  }
  Json partial = RopeParametersConfig();
  partial["rope_parameters"]["partial_rotary_factor"] = 0.5;
  ExpectInvalid(Parse(partial), {"rope_parameters.partial_rotary_factor", "0.5"});
}

TEST(ConfigTest, Llama3ScalingNeedsAllItsFields) {
  for (const char* field :
       {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    Json j = LegacyLlama32Config();
    j["rope_scaling"].erase(field);
    ExpectInvalid(Parse(j), {std::string("rope_scaling.") + field, "missing"});
  }
  Json no_type = LegacyLlama32Config();
  no_type["rope_scaling"].erase("rope_type");
  ExpectInvalid(Parse(no_type), {"rope_scaling.rope_type", "missing"});

  Json inverted = LegacyLlama32Config();
  inverted["rope_scaling"]["high_freq_factor"] = 0.5;
  ExpectInvalid(Parse(inverted), {"rope_scaling.high_freq_factor", "0.5"});

  Json unknown = LegacyLlama32Config();
  unknown["rope_scaling"]["attention_factor"] = 1.0;
  ExpectInvalid(Parse(unknown), {"rope_scaling.attention_factor", "unknown field"});
}

TEST(ConfigTest, UnsupportedValues) {
  struct Case {
    const char* field;
    Json value;
    const char* shown;
  };
  for (const Case& c : {Case{"hidden_act", "gelu", "gelu"},
                        Case{"pretraining_tp", 2, "2"},
                        Case{"model_type", "mixtral", "mixtral"},
                        Case{"architectures", Json::array({"MixtralForCausalLM"}),
                             "MixtralForCausalLM"},
                        // Another family than model_type's ("llama").
                        Case{"architectures", Json::array({"MistralForCausalLM"}),
                             "MistralForCausalLM"},
                        Case{"architectures", Json::array(), "[]"}}) {
    Json j = LegacyLlama32Config();
    j[c.field] = c.value;
    ExpectInvalid(Parse(j), {c.field, c.shown});
  }
}

TEST(ConfigTest, LinearRopeScaling) {
  Json j = RopeParametersConfig();
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 1e4}};
  absl::StatusOr<LlamaConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, ops::RopeScaling::Type::kLinear);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 4.0f);
  j["rope_parameters"].erase("factor");
  ExpectInvalid(Parse(j), {"rope_parameters.factor", "missing"});
  j["rope_parameters"]["factor"] = -1.0;
  ExpectInvalid(Parse(j), {"rope_parameters.factor", "-1"});
}

// A family's config.json as save_pretrained writes it (MinimalConfig plus the type).
Json FamilyConfig(const char* model_type, const char* architecture) {
  Json j = MinimalConfig();
  j["model_type"] = model_type;
  j["architectures"] = Json::array({architecture});
  return j;
}

TEST(ConfigTest, FamiliesSetTheirFields) {
  absl::StatusOr<LlamaConfig> c = Parse(FamilyConfig("qwen2", "Qwen2ForCausalLM"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->architecture, "qwen2");

  // Qwen: a window only with use_sliding_window, from max_window_layers on.
  Json qwen3 = FamilyConfig("qwen3", "Qwen3ForCausalLM");
  qwen3["sliding_window"] = 64;
  qwen3["use_sliding_window"] = false;
  qwen3["max_window_layers"] = 1;
  c = Parse(qwen3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->sliding_window, 0);
  qwen3["use_sliding_window"] = true;
  c = Parse(qwen3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 64);
  EXPECT_FALSE(c->SlidingLayer(0));
  EXPECT_TRUE(c->SlidingLayer(1));

  Json mistral = FamilyConfig("mistral", "MistralForCausalLM");
  mistral["sliding_window"] = 4096;
  c = Parse(mistral);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->SlidingLayer(0) && c->SlidingLayer(1));
  mistral["sliding_window"] = nullptr;
  c = Parse(mistral);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->SlidingLayer(0));

  Json phi3 = FamilyConfig("phi3", "Phi3ForCausalLM");
  phi3["resid_pdrop"] = 0.0;
  phi3["original_max_position_embeddings"] = 4096;
  c = Parse(phi3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->fused_qkv && c->fused_gate_up);
  phi3["partial_rotary_factor"] = 0.75;
  ExpectInvalid(Parse(phi3), {"partial_rotary_factor", "0.75"});

  // Gemma: tied unless said otherwise, GELU-tanh from hidden_activation over hidden_act.
  Json gemma = FamilyConfig("gemma", "GemmaForCausalLM");
  gemma["hidden_act"] = "gelu";
  gemma["hidden_activation"] = "gelu_pytorch_tanh";
  c = Parse(gemma);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->tie_word_embeddings && c->norm_plus_one && c->embedding_scale);
  EXPECT_EQ(c->activation, MlpActivation::kGeluTanh);
  gemma["hidden_activation"] = "gelu";
  ExpectInvalid(Parse(gemma), {"hidden_activation", "gelu", "unsupported"});

  Json gemma2 = FamilyConfig("gemma2", "Gemma2ForCausalLM");
  gemma2["query_pre_attn_scalar"] = 256;
  gemma2["attn_logit_softcapping"] = 50.0;
  gemma2["final_logit_softcapping"] = 30.0;
  gemma2["sliding_window"] = 4096;
  gemma2["cache_implementation"] = "hybrid";
  c = Parse(gemma2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->sandwich_norms);
  EXPECT_FLOAT_EQ(c->attention_scale, 1.0f / 16.0f);
  EXPECT_FLOAT_EQ(c->attn_logit_softcap, 50.0f);
  EXPECT_FLOAT_EQ(c->final_logit_softcap, 30.0f);
  EXPECT_TRUE(c->SlidingLayer(0));  // local first, then alternating
  EXPECT_FALSE(c->SlidingLayer(1));
  gemma2["layer_types"] = {"full_attention", "sliding_attention"};
  c = Parse(gemma2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->SlidingLayer(0));
  EXPECT_TRUE(c->SlidingLayer(1));
}

// Gemma 3 (model_type gemma3_text): Gemma 2's layer with (1 + w) q/k head norms, its
// config class's defaults (a window of 4096, every sixth layer global, RoPE bases 1e6
// global and 1e4 local, query_pre_attn_scalar 256), and its RoPE per kind of layer in
// either form: legacy rope_theta / rope_local_base_freq / rope_scaling (global only), or
// transformers 5's rope_parameters {full_attention, sliding_attention}.
TEST(ConfigTest, Gemma3ReadsItsLayersAndItsRopePerKindOfLayer) {
  Json gemma3 = FamilyConfig("gemma3_text", "Gemma3ForCausalLM");
  gemma3["num_hidden_layers"] = 7;
  absl::StatusOr<LlamaConfig> c = Parse(gemma3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qk_norm && c->sandwich_norms && c->norm_plus_one && c->embedding_scale &&
              c->tie_word_embeddings);
  EXPECT_EQ(c->activation, MlpActivation::kGeluTanh);
  EXPECT_EQ(c->sliding_window, 4096);
  for (int64_t l = 0; l < 7; ++l) EXPECT_EQ(c->SlidingLayer(l), l != 5) << "layer " << l;
  EXPECT_FLOAT_EQ(c->rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(c->sliding_rope_theta, 1e4f);
  EXPECT_FLOAT_EQ(c->attention_scale, 1.0f / 16.0f);
  EXPECT_EQ(c->attn_logit_softcap, 0.0f);
  EXPECT_EQ(c->final_logit_softcap, 0.0f);

  Json legacy = gemma3;
  legacy["rope_theta"] = 500000.0;
  legacy["rope_local_base_freq"] = 20000.0;
  legacy["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  legacy["sliding_window_pattern"] = 2;
  legacy["sliding_window"] = 512;
  legacy["query_pre_attn_scalar"] = 64;
  c = Parse(legacy);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
  EXPECT_EQ(c->rope_scaling.type, ops::RopeScaling::Type::kLinear);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 8.0f);
  EXPECT_FLOAT_EQ(c->sliding_rope_theta, 20000.0f);
  EXPECT_EQ(c->sliding_window, 512);
  for (int64_t l = 0; l < 7; ++l) EXPECT_EQ(c->SlidingLayer(l), l % 2 == 0) << "layer " << l;
  EXPECT_FLOAT_EQ(c->attention_scale, 0.125f);

  Json v5 = gemma3;
  v5["rope_parameters"] = Json::parse(R"({
    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})");
  v5["_sliding_window_pattern"] = 6;  // as transformers 5 saves it beside layer_types
  v5["sliding_window"] = nullptr;
  v5["layer_types"] = {"full_attention", "full_attention", "full_attention", "full_attention",
                       "full_attention", "full_attention", "full_attention"};
  c = Parse(v5);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 0);  // null: no window anywhere
  EXPECT_EQ(c->rope_scaling.type, ops::RopeScaling::Type::kLinear);
  EXPECT_FLOAT_EQ(c->rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(c->sliding_rope_theta, 1e4f);

  Json bad = v5;
  bad["rope_parameters"]["sliding_attention"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  ExpectInvalid(Parse(bad), {"rope_parameters.sliding_attention", "not supported"});
  bad = v5;
  bad["rope_theta"] = 10000.0;
  ExpectInvalid(Parse(bad), {"rope_theta", "contradicts", "full_attention"});
  bad = v5;
  bad["rope_parameters"]["chunked_attention"] = {{"rope_type", "default"}};
  ExpectInvalid(Parse(bad), {"rope_parameters.chunked_attention", "unknown field"});
  bad = v5;
  bad["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
  ExpectInvalid(Parse(bad), {"rope_scaling", "contradicts"});
  bad = gemma3;
  bad["use_bidirectional_attention"] = true;
  ExpectInvalid(Parse(bad), {"use_bidirectional_attention", "unsupported"});
  bad = gemma3;
  bad["sliding_window_pattern"] = 0;
  ExpectInvalid(Parse(bad), {"sliding_window_pattern", "must be >= 1"});
  bad["sliding_window_pattern"] = 2;
  bad["_sliding_window_pattern"] = 6;
  ExpectInvalid(Parse(bad), {"_sliding_window_pattern", "contradicts"});
  bad = gemma3;
  bad["final_logit_softcapping"] = -1.0;
  ExpectInvalid(Parse(bad), {"final_logit_softcapping", "must be >= 0"});
  // The multimodal Gemma 3 is refused with where its text model runs.
  ExpectInvalid(Parse(FamilyConfig("gemma3", "Gemma3ForConditionalGeneration")),
                {"model_type", "\"gemma3\"", "gemma3_text", "GGUF"});
}

// The config.json of Gemma 3 1B as transformers 4.50 saved it (legacy RoPE keys, the
// pattern, two eos ids, a null soft-cap and rope_scaling).
TEST(ConfigTest, Gemma3OneBillionsConfigParses) {
  absl::StatusOr<LlamaConfig> c = Parse(Json::parse(R"({
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "attn_logit_softcapping": null, "bos_token_id": 2,
    "cache_implementation": "hybrid", "eos_token_id": [1, 106],
    "final_logit_softcapping": null, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
    "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768,
    "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26,
    "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": null,
    "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "use_cache": true,
    "vocab_size": 262144})"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->dtype, DType::kBF16);
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_EQ(c->sliding_window, 512);
  int64_t global = 0;
  for (int64_t l = 0; l < 26; ++l) global += c->SlidingLayer(l) ? 0 : 1;
  EXPECT_EQ(global, 4);  // layers 5, 11, 17 and 23
  EXPECT_FALSE(c->SlidingLayer(5));
  EXPECT_FLOAT_EQ(c->rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(c->sliding_rope_theta, 1e4f);
  EXPECT_EQ(c->rope_scaling.type, ops::RopeScaling::Type::kNone);
  EXPECT_FLOAT_EQ(c->attention_scale, 1.0f / 16.0f);
  EXPECT_EQ(c->final_logit_softcap, 0.0f);
  EXPECT_TRUE(c->tie_word_embeddings);
}

TEST(ConfigTest, FamilyFieldsAreChecked) {
  Json gemma2 = FamilyConfig("gemma2", "Gemma2ForCausalLM");
  ExpectInvalid(Parse(gemma2), {"query_pre_attn_scalar", "missing"});
  gemma2["query_pre_attn_scalar"] = 256;
  gemma2["sliding_window"] = 16;
  gemma2["layer_types"] = {"full_attention", "chunked_attention"};
  ExpectInvalid(Parse(gemma2), {"layer_types", "chunked_attention", "unsupported"});
  gemma2["layer_types"] = {"full_attention"};
  ExpectInvalid(Parse(gemma2), {"layer_types", "1 layers", "num_hidden_layers is 2"});
  gemma2["layer_types"] = {"full_attention", "sliding_attention"};
  gemma2["sliding_window"] = nullptr;
  ExpectInvalid(Parse(gemma2), {"layer_types", "sliding_window is null"});
  gemma2["sliding_window"] = 0;
  ExpectInvalid(Parse(gemma2), {"sliding_window", "must be > 0"});
  // A key of another family is unknown to this one.
  Json qwen2 = FamilyConfig("qwen2", "Qwen2ForCausalLM");
  qwen2["attn_logit_softcapping"] = 50.0;
  ExpectInvalid(Parse(qwen2), {"attn_logit_softcapping", "unknown field"});
  Json model_type_only = MinimalConfig();
  model_type_only["model_type"] = "gemma";
  absl::StatusOr<LlamaConfig> c = Parse(model_type_only);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->norm_plus_one);
}

TEST(ConfigTest, ExpertFieldsAreReadAndChecked) {
  // Qwen3-MoE's defaults (its config class), and its per-layer choice of routed MLPs.
  Json qwen = FamilyConfig("qwen3_moe", "Qwen3MoeForCausalLM");
  absl::StatusOr<LlamaConfig> c = Parse(qwen);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_experts, 128);
  EXPECT_EQ(c->experts_per_token, 8);
  EXPECT_EQ(c->moe_intermediate_size, 768);
  EXPECT_FALSE(c->moe_renormalize);  // norm_topk_prob defaults to false
  EXPECT_TRUE(c->qk_norm && c->moe_round_weights && c->MoeLayer(0) && c->MoeLayer(1));
  qwen["num_experts"] = 16;
  qwen["num_experts_per_tok"] = 4;
  qwen["moe_intermediate_size"] = 32;
  qwen["norm_topk_prob"] = true;
  qwen["decoder_sparse_step"] = 2;  // layer l routed when (l + 1) % 2 == 0
  c = Parse(qwen);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_experts, 16);
  EXPECT_TRUE(c->moe_renormalize);
  EXPECT_FALSE(c->MoeLayer(0));
  EXPECT_TRUE(c->MoeLayer(1));
  qwen["decoder_sparse_step"] = 1;
  qwen["mlp_only_layers"] = {1};
  c = Parse(qwen);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->MoeLayer(0));
  EXPECT_FALSE(c->MoeLayer(1));
  qwen["mlp_only_layers"] = {2};
  ExpectInvalid(Parse(qwen), {"mlp_only_layers", "not a layer index"});
  qwen["mlp_only_layers"] = Json::array();
  qwen["decoder_sparse_step"] = 0;
  ExpectInvalid(Parse(qwen), {"decoder_sparse_step", "must be >= 1"});
  qwen["decoder_sparse_step"] = 1;
  qwen["num_local_experts"] = 8;  // what transformers 5 writes; both must agree
  ExpectInvalid(Parse(qwen), {"num_local_experts", "contradicts num_experts"});
  qwen.erase("num_local_experts");
  qwen["num_experts_per_tok"] = 17;
  ExpectInvalid(Parse(qwen), {"num_experts_per_tok", "[1, num_experts = 16]"});
  qwen["num_experts_per_tok"] = 4;
  qwen["num_experts"] = 1 << 20;
  ExpectInvalid(Parse(qwen), {"num_experts", "larger than"});
  // Mixtral: its experts are intermediate_size wide; a Qwen3-MoE key is unknown to it.
  Json mixtral = FamilyConfig("mixtral", "MixtralForCausalLM");
  mixtral["num_local_experts"] = 8;
  mixtral["router_jitter_noise"] = 0.1;  // training only
  c = Parse(mixtral);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_experts, 8);
  EXPECT_EQ(c->experts_per_token, 2);
  EXPECT_EQ(c->moe_intermediate_size, c->intermediate_size);
  EXPECT_EQ(c->moe_prefix, "block_sparse_moe");
  EXPECT_TRUE(c->moe_renormalize && !c->moe_round_weights);
  mixtral["norm_topk_prob"] = false;
  ExpectInvalid(Parse(mixtral), {"norm_topk_prob", "unknown field"});
  // And an expert key is unknown to a dense family.
  Json qwen3 = FamilyConfig("qwen3", "Qwen3ForCausalLM");
  qwen3["num_experts"] = 8;
  ExpectInvalid(Parse(qwen3), {"num_experts", "unknown field"});
}

TEST(ConfigTest, UnknownFieldIsNamed) {
  for (const char* field : {"quantization_config", "sliding_window", "use_sliding_window"}) {
    Json j = LegacyLlama32Config();
    j[field] = 4096;
    ExpectInvalid(Parse(j), {field, "unknown field"});
  }
  // Fields known to be harmless are ignored, whatever their value, and so is any field
  // that is null ("not set").
  Json j = LegacyLlama32Config();
  j["quantization_config"] = nullptr;
  j["_name_or_path"] = "meta-llama/Llama-3.2-1B";
  j["output_attentions"] = false;
  j["pad_token_id"] = 0;
  j["id2label"] = {{"0", "LABEL_0"}};
  EXPECT_TRUE(Parse(j).ok()) << Parse(j).status();
}

TEST(ConfigTest, ConvertedCheckpointMarkers) {
  // Keys that converted checkpoints of small Llama-family models carry.
  Json j = LegacyLlama32Config();
  j["is_llama_config"] = true;
  j["rope_interleaved"] = false;
  EXPECT_TRUE(Parse(j).ok()) << Parse(j).status();
  j["rope_interleaved"] = true;
  ExpectInvalid(Parse(j), {"rope_interleaved", "true"});
}

TEST(ConfigTest, FoldersSavedByTransformers5Load) {
  // Metadata keys transformers 5 writes (the real SmolLM2 folder has both); neither
  // changes the computation.
  Json j = LegacyLlama32Config();
  j["_model_name_or_path"] = "HuggingFaceTB/SmolLM2-135M-Instruct";
  j["unk_token_id"] = 0;
  j["pad_token_id"] = nullptr;
  absl::StatusOr<LlamaConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  // Listed for --verbose.
  EXPECT_NE(std::find(c->metadata_keys.begin(), c->metadata_keys.end(), "_model_name_or_path"),
            c->metadata_keys.end());
  EXPECT_NE(std::find(c->metadata_keys.begin(), c->metadata_keys.end(), "unk_token_id"),
            c->metadata_keys.end());
}

TEST(ConfigTest, WrongTypes) {
  struct Case {
    const char* field;
    Json value;
    const char* expected;
  };
  for (const Case& c : {Case{"hidden_size", "2048", "integer"},
                        Case{"num_hidden_layers", 16.5, "integer"},
                        Case{"rms_norm_eps", "1e-5", "number"},
                        Case{"rope_theta", true, "number"},
                        Case{"tie_word_embeddings", "true", "true or false"},
                        Case{"attention_bias", 0, "true or false"},
                        Case{"hidden_act", 1, "string"},
                        Case{"torch_dtype", Json::array({"bfloat16"}), "string"},
                        Case{"rope_scaling", 8, "object"},
                        Case{"architectures", "LlamaForCausalLM", "list"}}) {
    Json j = LegacyLlama32Config();
    j[c.field] = c.value;
    ExpectInvalid(Parse(j), {c.field, c.expected});
  }
  Json nested = LegacyLlama32Config();
  nested["rope_scaling"]["factor"] = "32";
  ExpectInvalid(Parse(nested), {"rope_scaling.factor", "number"});
}

TEST(ConfigTest, MissingRequiredField) {
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "vocab_size"}) {
    Json j = LegacyLlama32Config();
    j.erase(field);
    ExpectInvalid(Parse(j), {field, "missing"});
    Json null = LegacyLlama32Config();
    null[field] = nullptr;
    ExpectInvalid(Parse(null), {field, "missing"});
  }
}

TEST(ConfigTest, InconsistentValuesAreRefused) {
  Json gqa = MinimalConfig();
  gqa["num_key_value_heads"] = 3;
  ExpectInvalid(Parse(gqa), {"num_attention_heads", "num_key_value_heads"});

  Json negative = MinimalConfig();
  negative["num_hidden_layers"] = -2;
  ExpectInvalid(Parse(negative), {"num_hidden_layers", "-2"});

  Json odd = MinimalConfig();
  odd["head_dim"] = 15;
  ExpectInvalid(Parse(odd), {"head_dim", "15"});

  Json indivisible = MinimalConfig();
  indivisible["hidden_size"] = 66;
  ExpectInvalid(Parse(indivisible), {"head_dim", "66"});

  Json huge = MinimalConfig();
  huge["rope_theta"] = 1e300;
  ExpectInvalid(Parse(huge), {"rope_theta", "float"});
}

TEST(ConfigTest, MalformedJson) {
  ExpectInvalid(ParseLlamaConfig("{\"hidden_size\": 64,", "cfg.json"), {"invalid JSON"});
  ExpectInvalid(ParseLlamaConfig("", "cfg.json"), {"invalid JSON"});
  ExpectInvalid(ParseLlamaConfig("[1, 2]", "cfg.json"), {"object"});
  ExpectInvalid(ParseLlamaConfig("{\"hidden_size\": 64} trailing", "cfg.json"), {"invalid JSON"});
}

TEST(ConfigTest, LoadsFromFile) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "sg_config_test_XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::filesystem::path dir = tmpl;
  const std::string path = (dir / "config.json").string();
  std::ofstream(path) << LegacyLlama32Config().dump(2);
  absl::StatusOr<LlamaConfig> c = LoadLlamaConfig(path);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectLlama32(*c);

  absl::StatusOr<LlamaConfig> missing = LoadLlamaConfig((dir / "absent.json").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_NE(missing.status().message().find("absent.json"), std::string::npos);
  std::filesystem::remove_all(dir);
}

// Every size field is bounded by what a real model can have: a config asking for more is
// refused naming the field, the value and the bound, before anything is sized from it.
TEST(ConfigTest, SizesBeyondAnyRealModelAreRefused) {
  const struct {
    const char* field;
    int64_t value;
    const char* bound;
  } cases[] = {
      {"hidden_size", int64_t{1} << 17, "65536"},
      {"intermediate_size", 4000000000000, "262144"},
      {"num_hidden_layers", 1000000000, "1024"},
      {"num_attention_heads", 4096, "1024"},
      {"vocab_size", int64_t{1} << 31, "16777216"},
      {"max_position_embeddings", int64_t{1} << 40, "67108864"},
      {"head_dim", 4096, "1024"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.field);
    Json j = MinimalConfig();
    j[c.field] = c.value;
    if (std::string(c.field) == "num_attention_heads") j["head_dim"] = 16;
    ExpectInvalid(Parse(j), {std::string(c.field) + " = " + std::to_string(c.value),
                             std::string("larger than ") + c.bound, "real models have"});
  }
  // The largest real shapes pass, and their weights' size is exact.
  Json big = MinimalConfig();
  big["hidden_size"] = 16384;
  big["intermediate_size"] = 53248;
  big["num_hidden_layers"] = 126;
  big["num_attention_heads"] = 128;
  big["num_key_value_heads"] = 8;
  big["vocab_size"] = 128256;
  absl::StatusOr<LlamaConfig> c = Parse(big);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<int64_t> bytes = c->WeightBytes();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const int64_t h = 16384, q = 128 * 128, kv = 8 * 128, i = 53248;
  EXPECT_EQ(*bytes, 4 * (126 * (2 * h + 2 * h * q + 2 * h * kv + 3 * h * i) + 2 * 128256 * h + h));
}

// WeightBytes checks its products even on a config that was never validated.
TEST(ConfigTest, WeightBytesRefusesOverflow) {
  LlamaConfig c = TinyLlamaConfig();
  c.hidden_size = int64_t{1} << 40;
  c.intermediate_size = int64_t{1} << 40;
  absl::StatusOr<int64_t> bytes = c.WeightBytes();
  ASSERT_FALSE(bytes.ok()) << *bytes;
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bytes.status().message().find("overflows"), std::string::npos) << bytes.status();
}

// config.json is read only if it is a regular file of at most a megabyte, and a failure
// names the cause: a directory, a FIFO (which once blocked forever), a file too large.
TEST(ConfigTest, LoadRefusesWhatIsNotASmallRegularFile) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "sg_config_test_XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::filesystem::path dir = tmpl;
  auto expect = [](const std::string& path, absl::StatusCode code, const std::string& says) {
    absl::StatusOr<LlamaConfig> c = LoadLlamaConfig(path);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), code) << c.status();
    EXPECT_NE(c.status().message().find(says), std::string::npos) << c.status();
    EXPECT_NE(c.status().message().find(path), std::string::npos) << c.status();
  };
  std::filesystem::create_directories(dir / "is_dir");
  expect((dir / "is_dir").string(), absl::StatusCode::kInvalidArgument,
         "is a directory, not a regular file");
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  expect((dir / "fifo").string(), absl::StatusCode::kInvalidArgument,
         "is a FIFO, not a regular file");
  {
    std::ofstream big(dir / "big.json");
    big << "{\"pad\": \"" << std::string(size_t{1} << 20, 'x') << "\"}";
  }
  expect((dir / "big.json").string(), absl::StatusCode::kInvalidArgument,
         "more than the 1048576");
  expect((dir / "absent.json").string(), absl::StatusCode::kNotFound,
         "No such file or directory");
  expect("/dev/zero", absl::StatusCode::kInvalidArgument, "a character device");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sg
