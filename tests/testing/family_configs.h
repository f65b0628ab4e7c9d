// Tiny configs of every dense family stepgraph runs beside Llama (TinyLlamaConfig with
// each family's fields set as its config.json would set them), for the tests that compare
// whole steps: fused == plain on the CPU reference, CUDA == CPU in the conformance table.
#ifndef STEPGRAPH_TESTS_TESTING_FAMILY_CONFIGS_H_
#define STEPGRAPH_TESTS_TESTING_FAMILY_CONFIGS_H_

#include <string>
#include <utility>
#include <vector>

#include "stepgraph/models/llama.h"

namespace sg::testing {

// (name, config) per family, in `dtype`, with windows short enough (4) that steps at
// positions past them slide.
inline std::vector<std::pair<std::string, LlamaConfig>> FamilyTinyConfigs(DType dtype) {
  std::vector<std::pair<std::string, LlamaConfig>> out;
  LlamaConfig base = TinyLlamaConfig();
  base.dtype = dtype;
  base.num_hidden_layers = 2;
  auto add = [&](const char* name, auto set) {
    LlamaConfig c = base;
    c.architecture = name;
    set(c);
    out.emplace_back(name, std::move(c));
  };
  add("qwen2", [](LlamaConfig& c) { c.qkv_bias = true; });
  add("qwen3", [](LlamaConfig& c) { c.qk_norm = true; });
  add("mistral", [](LlamaConfig& c) { c.sliding_window = 4; });
  add("phi3", [](LlamaConfig& c) {
    c.sliding_window = 4;
    c.rope_scaling = {ops::RopeScaling::Type::kLinear, 2.0f};
  });
  add("gemma", [](LlamaConfig& c) {
    c.norm_plus_one = c.embedding_scale = c.tie_word_embeddings = true;
    c.activation = MlpActivation::kGeluTanh;
  });
  add("gemma2", [](LlamaConfig& c) {
    c.norm_plus_one = c.embedding_scale = c.tie_word_embeddings = c.sandwich_norms = true;
    c.activation = MlpActivation::kGeluTanh;
    c.attention_scale = 0.125f;
    c.attn_logit_softcap = 2.0f;
    c.final_logit_softcap = 3.0f;
    c.sliding_window = 4;
    c.sliding_layers = {true, false};
  });
  // Gemma 3: Gemma 2's layer with q/k head norms and no attention soft-cap; the local
  // layer rotates by a base of its own without the global layer's scaling.
  add("gemma3", [](LlamaConfig& c) {
    c.norm_plus_one = c.embedding_scale = c.tie_word_embeddings = c.sandwich_norms = true;
    c.qk_norm = true;
    c.activation = MlpActivation::kGeluTanh;
    c.attention_scale = 0.125f;
    c.final_logit_softcap = 3.0f;
    c.sliding_window = 4;
    c.sliding_layers = {true, false};
    c.rope_theta = 1e6f;
    c.rope_scaling = {ops::RopeScaling::Type::kLinear, 8.0f};
    c.sliding_rope_theta = 1e4f;
  });
  return out;
}

// Tiny mixture-of-experts configs (Mixtral's routing, and Qwen3-MoE's with a dense first
// layer and weights not renormalised). Apart from the dense families: their routing makes
// bf16 steps too fragile for a comparison by tolerance (a near tie flips an expert), so
// the CUDA comparisons take them in f32 only.
inline std::vector<std::pair<std::string, LlamaConfig>> MoeTinyConfigs(DType dtype) {
  std::vector<std::pair<std::string, LlamaConfig>> out;
  LlamaConfig base = TinyLlamaConfig();
  base.dtype = dtype;
  base.num_hidden_layers = 2;
  base.num_experts = 8;
  base.experts_per_token = 2;
  base.moe_intermediate_size = 96;
  LlamaConfig mixtral = base;
  mixtral.architecture = "mixtral";
  mixtral.moe_prefix = "block_sparse_moe";
  out.emplace_back("mixtral", mixtral);
  LlamaConfig qwen3_moe = base;
  qwen3_moe.architecture = "qwen3_moe";
  qwen3_moe.qk_norm = true;
  qwen3_moe.experts_per_token = 3;
  qwen3_moe.moe_renormalize = false;
  qwen3_moe.moe_round_weights = true;
  qwen3_moe.moe_layers = {false, true};
  out.emplace_back("qwen3_moe", qwen3_moe);
  return out;
}

}  // namespace sg::testing

#endif  // STEPGRAPH_TESTS_TESTING_FAMILY_CONFIGS_H_
