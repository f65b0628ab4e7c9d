// GGUF file -> LlamaConfig and graph-named weights. Each `llama.*` key is consumed by
// exactly one reader below or refused, as config.cc does for config.json; the tensors
// are then matched one for one against the weights the config implies, before any graph
// is built, so a file that lies about its shape is refused here with the tensor's name.
#include "models/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "stepgraph/base/half.h"
#include "models/family_weights.h"
#include "stepgraph/graph/rope.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace {

// The architectures stepgraph reads (general.architecture), the model_type each is.
// llama.cpp's converter writes Mistral models as "llama" (without their sliding window),
// and Mixtral as "llama" with expert keys and tensors.
constexpr absl::string_view kArchitectures[] = {"llama",  "qwen2",  "qwen3",  "phi3",
                                                "gemma",  "gemma2", "gemma3", "qwen3moe"};
// Bounds on sizes a real Llama can have; they keep every product below far from
// overflow before the tensors themselves are compared.
constexpr int64_t kMaxWidth = int64_t{1} << 20;    // hidden, intermediate, head dims
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxVocab = std::numeric_limits<int32_t>::max();

// `llama.*` keys (without the prefix) that describe the file but not the computation.
constexpr absl::string_view kHarmlessLlamaKeys[] = {
    "rope.scaling.finetuned",
    "rope.scaling.original_context_length",  // read only for Llama 3 scaling
};

// Typed reads of `llama.*` keys that remember which keys were read, so the rest can be
// refused as unknown.
class LlamaKeys {
 public:
  LlamaKeys(const GgufFile& f, absl::string_view arch) : f_(f), arch_(arch) {}

  std::string Key(absl::string_view k) const { return absl::StrCat(arch_, ".", k); }

  absl::Status Error(absl::string_view k, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(f_.source(), ": key '", Key(k), "': ", what));
  }

  const GgufValue* Find(absl::string_view k) {
    const std::string key = Key(k);
    seen_.insert(key);
    return f_.Find(key);
  }

  // An integer in [lo, hi]; `fallback` when absent, or an error when there is none.
  absl::StatusOr<int64_t> Int(absl::string_view k, int64_t lo, int64_t hi,
                              std::optional<int64_t> fallback = std::nullopt) {
    const GgufValue* v = Find(k);
    if (v == nullptr) {
      if (fallback.has_value()) return *fallback;
      return Error(k, "missing required key");
    }
    if (v->is_array()) {
      return Error(k, absl::StrCat("per-layer values (", v->ToString(),
                                   ") are not supported: every layer must have the same shape"));
    }
    absl::StatusOr<int64_t> i = v->Int();
    if (!i.ok()) return Error(k, absl::StrCat("expected an integer, got ", v->ToString()));
    if (*i < lo || *i > hi) {
      return Error(k, absl::StrCat("value ", *i, " is outside [", lo, ", ", hi, "]"));
    }
    return *i;
  }

  // A finite float; `fallback` when absent.
  absl::StatusOr<double> Float(absl::string_view k, std::optional<double> fallback) {
    const GgufValue* v = Find(k);
    if (v == nullptr) {
      if (fallback.has_value()) return *fallback;
      return Error(k, "missing required key");
    }
    absl::StatusOr<double> d = v->Float();
    if (!d.ok()) return Error(k, absl::StrCat("expected a float, got ", v->ToString()));
    if (!std::isfinite(*d) || std::fabs(*d) > std::numeric_limits<float>::max()) {
      return Error(k, absl::StrCat("value ", *d, " is not a finite float"));
    }
    return *d;
  }

  absl::Status CheckNoUnknown() const {
    const std::string prefix = absl::StrCat(arch_, ".");
    for (const GgufValue& v : f_.metadata()) {
      if (!absl::StartsWith(v.key(), prefix) || seen_.contains(v.key())) continue;
      bool harmless = false;
      for (absl::string_view h : kHarmlessLlamaKeys) harmless = harmless || v.key() == Key(h);
      if (harmless) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          f_.source(), ": key '", v.key(), "' (value ", v.ToString(),
          ") is unknown; stepgraph refuses keys it does not understand so that no model is "
          "run differently from its definition"));
    }
    return absl::OkStatus();
  }

 private:
  const GgufFile& f_;
  absl::string_view arch_;
  absl::flat_hash_set<std::string> seen_;
};

// Llama 3 RoPE scaling is stored by the converter as per-frequency divisors in a
// "rope_freqs.weight" tensor rather than as keys. Accept it when the divisors are those of
// Llama 3 scaling with the usual band (low 1, high 4) and the factor they show; anything
// else changes the rotation in a way stepgraph cannot express.
absl::Status ReadRopeFreqs(const GgufFile& f, const GgufTensor& t, LlamaKeys& keys,
                           LlamaConfig& c) {
  const std::string who = absl::StrCat(f.source(), ": tensor 'rope_freqs.weight'");
  const int64_t half = c.head_dim / 2;
  if (t.dtype != DType::kF32 || t.shape != Shape({half})) {
    return absl::InvalidArgumentError(absl::StrCat(who, " is ", DTypeName(t.dtype), " ",
                                                   t.shape.ToString(), "; expected f32 [", half,
                                                   "]"));
  }
  std::vector<float> stored(static_cast<size_t>(half));
  std::memcpy(stored.data(), t.data.data(), t.data.size());
  float factor = 0.0f;
  for (float r : stored) {
    if (!(r >= 1.0f) || !std::isfinite(r)) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, " holds ", r, "; RoPE frequency divisors must be >= 1"));
    }
    factor = std::max(factor, r);
  }
  SG_ASSIGN_OR_RETURN(const int64_t original,
                      keys.Int("rope.scaling.original_context_length", 1,
                               std::numeric_limits<int32_t>::max(), 8192));
  ops::Rope plain;
  plain.head_dim = static_cast<int32_t>(c.head_dim);
  plain.theta = c.rope_theta;
  ops::Rope scaled = plain;
  scaled.scaling = {ops::RopeScaling::Type::kLlama3, factor, 1.0f, 4.0f,
                    static_cast<int32_t>(original)};
  const std::vector<float> base = RopeInvFreq(plain);
  const std::vector<float> want = RopeInvFreq(scaled);
  for (int64_t j = 0; j < half; ++j) {
    const float implied = base[j] / want[j];
    if (std::fabs(implied - stored[j]) > 1e-4f * implied) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": per-frequency RoPE divisors that are not Llama 3 scaling (factor ", factor,
          ", low 1, high 4, original context ", original, ") are not supported: divisor ", j,
          " is ", stored[j], ", Llama 3 scaling gives ", implied));
    }
  }
  c.rope_scaling = scaled.scaling;
  return absl::OkStatus();
}

// What the families beside Llama add, from their keys: Gemma's embedding scale, (1 + w)
// norms (stored with the 1 added) and GELU-tanh; Gemma 2's soft-caps, sandwich norms and
// alternating windows (its query_pre_attn_scalar is not stored: llama.cpp's rule, the
// head size except for the 46-layer 27B model); Gemma 3's as llama.cpp reads them (q/k
// norms come with their tensors); Phi-3's fused gate/up and window.
absl::Status ReadFamilyKeys(LlamaKeys& k, LlamaConfig& c) {
  const absl::string_view a = c.architecture;
  if (a == "gemma" || a == "gemma2" || a == "gemma3") {
    c.embedding_scale = c.norm_plus_one = true;
    c.activation = MlpActivation::kGeluTanh;
  }
  if (a == "gemma3") {
    // llama.cpp: a window only where attention.sliding_window is set and positive, then
    // every sliding_window_pattern-th layer (6 unless stored) global and the others local,
    // rotating by rope.freq_base_swa (10,000 unless stored); the 62-layer 27B model scales
    // its scores by hidden / heads, the others by the head size; a final soft-cap if
    // stored (Gemma 3 has no attention soft-cap).
    c.sandwich_norms = true;
    SG_ASSIGN_OR_RETURN(c.sliding_window,
                        k.Int("attention.sliding_window", 0, std::numeric_limits<int32_t>::max(),
                              0));
    SG_ASSIGN_OR_RETURN(const int64_t pattern,
                        k.Int("attention.sliding_window_pattern", 1, kMaxLayers, 6));
    SG_ASSIGN_OR_RETURN(const double local_theta, k.Float("rope.freq_base_swa", 10000.0));
    if (!(local_theta > 0.0)) return k.Error("rope.freq_base_swa", "must be > 0");
    SG_ASSIGN_OR_RETURN(const double final_cap, k.Float("final_logit_softcapping", 0.0));
    if (final_cap < 0.0) return k.Error("final_logit_softcapping", "must be >= 0");
    c.final_logit_softcap = static_cast<float>(final_cap);
    c.sliding_layers.clear();
    if (c.sliding_window > 0) {
      c.sliding_rope_theta = static_cast<float>(local_theta);
      for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        c.sliding_layers.push_back(l % pattern < pattern - 1);
      }
    }
    const int64_t scaled_by = c.num_hidden_layers == 62 ? c.hidden_size / c.num_attention_heads
                                                        : c.head_dim;
    c.attention_scale = 1.0f / std::sqrt(static_cast<float>(scaled_by));
  }
  if (a == "phi3") c.fused_gate_up = true;
  if (a == "gemma2" || a == "phi3") {
    SG_ASSIGN_OR_RETURN(c.sliding_window,
                        k.Int("attention.sliding_window", 0, std::numeric_limits<int32_t>::max(),
                              a == "gemma2" ? 4096 : 0));
  }
  if (a == "gemma2") {
    c.sandwich_norms = true;
    SG_ASSIGN_OR_RETURN(const double attn_cap, k.Float("attn_logit_softcapping", 0.0));
    SG_ASSIGN_OR_RETURN(const double final_cap, k.Float("final_logit_softcapping", 0.0));
    if (attn_cap < 0.0 || final_cap < 0.0) {
      return k.Error(attn_cap < 0.0 ? "attn_logit_softcapping" : "final_logit_softcapping",
                     "must be >= 0");
    }
    c.attn_logit_softcap = static_cast<float>(attn_cap);
    c.final_logit_softcap = static_cast<float>(final_cap);
    const int64_t scaled_by = c.num_hidden_layers == 46 ? c.hidden_size / c.num_attention_heads
                                                        : c.head_dim;
    c.attention_scale = 1.0f / std::sqrt(static_cast<float>(scaled_by));
    c.sliding_layers.clear();
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) c.sliding_layers.push_back(l % 2 == 0);
  }
  return absl::OkStatus();
}

// Experts (Mixtral as "llama", "qwen3moe"): llama.cpp routes both by a softmax over all
// experts, the top expert_used_count, renormalised (its build_moe_ffn with norm_w), which
// is Mixtral's rule and Qwen3-MoE's with norm_topk_prob (what Qwen3-MoE models set). Other
// expert keys (shared experts, weight scales, other gating functions) stay unknown and are
// refused.
absl::Status ReadExpertKeys(LlamaKeys& k, LlamaConfig& c) {
  SG_ASSIGN_OR_RETURN(const int64_t experts, k.Int("expert_count", 0, 4096, 0));
  SG_ASSIGN_OR_RETURN(const int64_t used, k.Int("expert_used_count", 0, 4096, 0));
  if (experts == 0 && used == 0) {
    if (c.architecture == "qwen3moe") return k.Error("expert_count", "missing required key");
    return absl::OkStatus();
  }
  if (c.architecture != "llama" && c.architecture != "qwen3moe") {
    return k.Error("expert_count", absl::StrCat(experts, ": '", c.architecture,
                                                "' models with experts are not supported"));
  }
  if (used < 1 || used > experts) {
    return k.Error("expert_used_count",
                   absl::StrCat(used, " must be in [1, expert_count = ", experts, "]"));
  }
  c.num_experts = experts;
  c.experts_per_token = used;
  c.moe_renormalize = true;
  if (c.architecture == "llama") {
    c.moe_prefix = "block_sparse_moe";
    c.moe_intermediate_size = c.intermediate_size;
  } else {
    c.moe_prefix = "mlp";
    c.moe_round_weights = true;
    SG_ASSIGN_OR_RETURN(c.moe_intermediate_size,
                        k.Int("expert_feed_forward_length", 1, kMaxWidth));
  }
  return absl::OkStatus();
}

// The dtype a file is computed in: activations, KV cache and every float weight. F16 or
// BF16 when every matrix is stored so (llama.cpp's converter with --outtype f16 or bf16),
// F32 otherwise: quantized files (transformers dequantizes them to float32 and computes in
// it; so does stepgraph, with the blocks read as stored), F32 files and files mixing F16
// with BF16 matrices. See docs/gguf.md.
DType ComputeDType(const GgufFile& f) {
  std::optional<DType> half;
  for (const GgufTensor& t : f.tensors()) {
    if (t.shape.rank() < 2) continue;  // norms, biases, rope_freqs
    // llama.cpp's converter keeps a mixture of experts' router in F32 whatever the file's
    // type (its F32 values are the model's bf16/f16 ones, exactly): it takes the other
    // matrices' dtype, rounded at load, as transformers computes it.
    if (t.dtype == DType::kF32 && absl::EndsWith(t.name, ".ffn_gate_inp.weight")) continue;
    if ((t.dtype != DType::kF16 && t.dtype != DType::kBF16) ||
        (half.has_value() && *half != t.dtype)) {
      return DType::kF32;
    }
    half = t.dtype;
  }
  return half.value_or(DType::kF32);
}

absl::StatusOr<LlamaConfig> ReadConfig(const GgufFile& f) {
  absl::StatusOr<absl::string_view> arch = f.GetString("general.architecture");
  if (!arch.ok()) return arch.status();
  if (std::find(std::begin(kArchitectures), std::end(kArchitectures), *arch) ==
      std::end(kArchitectures)) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.source(), ": architecture '", arch->substr(0, 64),
        "' is not supported (stepgraph runs 'llama', 'qwen2', 'qwen3', 'phi3', 'gemma', "
        "'gemma2', 'gemma3' and 'qwen3moe' GGUF models)"));
  }
  if (const GgufValue* split = f.Find("split.count")) {
    absl::StatusOr<int64_t> n = split->Int();
    if (!n.ok() || *n != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          f.source(), ": split GGUF files (split.count ", split->ToString(),
          ") are not supported; merge the parts into one file"));
    }
  }

  LlamaKeys k(f, *arch);
  LlamaConfig c;
  c.architecture = std::string(*arch);
  SG_ASSIGN_OR_RETURN(c.hidden_size, k.Int("embedding_length", 1, kMaxWidth));
  SG_ASSIGN_OR_RETURN(c.intermediate_size, k.Int("feed_forward_length", 1, kMaxWidth));
  SG_ASSIGN_OR_RETURN(c.num_hidden_layers, k.Int("block_count", 1, kMaxLayers));
  SG_ASSIGN_OR_RETURN(c.num_attention_heads, k.Int("attention.head_count", 1, kMaxHeads));
  SG_ASSIGN_OR_RETURN(c.num_key_value_heads,
                      k.Int("attention.head_count_kv", 1, kMaxHeads, c.num_attention_heads));
  SG_ASSIGN_OR_RETURN(c.max_position_embeddings,
                      k.Int("context_length", 1, std::numeric_limits<int32_t>::max()));

  // head_dim: hidden / heads unless the key and value lengths say otherwise; the two
  // must agree (attention here uses one head size) and RoPE must rotate all of it.
  if (f.Find(k.Key("attention.key_length")) == nullptr &&
      c.hidden_size % c.num_attention_heads != 0) {
    return k.Error("attention.key_length",
                   absl::StrCat("absent, and embedding_length ", c.hidden_size,
                                " is not a multiple of the ", c.num_attention_heads, " heads"));
  }
  SG_ASSIGN_OR_RETURN(const int64_t key_length,
                      k.Int("attention.key_length", 1, kMaxWidth,
                            c.hidden_size / c.num_attention_heads));
  SG_ASSIGN_OR_RETURN(const int64_t value_length,
                      k.Int("attention.value_length", 1, kMaxWidth, key_length));
  if (value_length != key_length) {
    return k.Error("attention.value_length",
                   absl::StrCat(value_length, " differs from attention.key_length ", key_length,
                                " (stepgraph needs one head size)"));
  }
  c.head_dim = key_length;
  SG_ASSIGN_OR_RETURN(const int64_t rope_dims,
                      k.Int("rope.dimension_count", 1, kMaxWidth, c.head_dim));
  if (rope_dims != c.head_dim) {
    return k.Error("rope.dimension_count",
                   absl::StrCat(rope_dims, " differs from the head size ", c.head_dim,
                                " (partial rotary embeddings are not supported)"));
  }

  SG_ASSIGN_OR_RETURN(const double eps,
                      k.Float("attention.layer_norm_rms_epsilon", std::nullopt));
  if (!(eps > 0.0)) return k.Error("attention.layer_norm_rms_epsilon", "must be > 0");
  c.rms_norm_eps = static_cast<float>(eps);
  SG_ASSIGN_OR_RETURN(const double theta, k.Float("rope.freq_base", 10000.0));
  if (!(theta > 0.0)) return k.Error("rope.freq_base", "must be > 0");
  c.rope_theta = static_cast<float>(theta);

  // RoPE scaling given by keys: only "none" (or a linear factor of 1) rotates as stepgraph
  // does; Llama 3 scaling comes as the rope_freqs tensor (ReadRopeFreqs).
  bool linear = false;
  if (const GgufValue* v = k.Find("rope.scaling.type")) {
    absl::StatusOr<absl::string_view> type = v->String();
    if (!type.ok()) return k.Error("rope.scaling.type", "expected a string");
    if (*type != "none" && *type != "linear") {
      return k.Error("rope.scaling.type",
                     absl::StrCat("RoPE scaling '", type->substr(0, 32),
                                  "' is not supported (stepgraph runs 'none' and 'linear')"));
    }
    linear = *type == "linear";
  }
  // Linear scaling: the converter writes rope.scaling.factor (older files
  // rope.scale_linear); a factor of 1 (or 0, "unset") is no scaling.
  for (absl::string_view key : {"rope.scaling.factor", "rope.scale_linear"}) {
    SG_ASSIGN_OR_RETURN(const double factor, k.Float(key, 1.0));
    if (factor == 1.0 || factor == 0.0) continue;
    if (!(factor > 0.0) || (!linear && key == "rope.scaling.factor")) {
      return k.Error(key, absl::StrCat("RoPE scaling factor ", factor,
                                       " is not supported without linear scaling"));
    }
    c.rope_scaling = {ops::RopeScaling::Type::kLinear, static_cast<float>(factor)};
  }
  SG_RETURN_IF_ERROR(ReadFamilyKeys(k, c));
  SG_RETURN_IF_ERROR(ReadExpertKeys(k, c));
  if (const GgufValue* v = k.Find("tensor_data_layout")) {
    // Meta's original checkpoints already pair (2i, 2i+1), which is what the converter's
    // permutation produces for the others: both run with interleaved RoPE.
    absl::StatusOr<absl::string_view> layout = v->String();
    if (!layout.ok() || *layout != "Meta AI original pth") {
      return k.Error("tensor_data_layout",
                     absl::StrCat("unsupported value ", v->ToString(),
                                  " (stepgraph knows \"Meta AI original pth\")"));
    }
  }

  // Vocabulary: llama.vocab_size, else the tokenizer's token list.
  const GgufValue* tokens = f.Find("tokenizer.ggml.tokens");
  if (tokens != nullptr && (!tokens->is_array() ||
                            tokens->element_type() != GgufValueType::kString)) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.source(), ": key 'tokenizer.ggml.tokens' must be an array of strings, got ",
        tokens->ToString()));
  }
  std::optional<int64_t> token_count;
  if (tokens != nullptr) token_count = tokens->size();
  SG_ASSIGN_OR_RETURN(c.vocab_size, k.Int("vocab_size", 1, kMaxVocab, token_count));
  if (token_count.has_value() && *token_count > c.vocab_size) {
    return k.Error("vocab_size",
                   absl::StrCat(c.vocab_size, " is less than the ", *token_count,
                                " tokens of tokenizer.ggml.tokens"));
  }

  // Keys written under the architecture but belonging to other variants.
  SG_RETURN_IF_ERROR(k.CheckNoUnknown());

  if (const GgufTensor* freqs = f.FindTensor("rope_freqs.weight")) {
    SG_RETURN_IF_ERROR(ReadRopeFreqs(f, *freqs, k, c));
  }
  c.tie_word_embeddings = f.FindTensor("output.weight") == nullptr;
  // q/k/v biases with an o bias (Llama's attention_bias) or without (Qwen2).
  const bool qkv_bias = f.FindTensor("blk.0.attn_q.bias") != nullptr ||
                        f.FindTensor("blk.0.attn_qkv.bias") != nullptr;
  c.attention_bias = qkv_bias && f.FindTensor("blk.0.attn_output.bias") != nullptr;
  c.qkv_bias = qkv_bias && !c.attention_bias;
  c.mlp_bias = f.FindTensor("blk.0.ffn_gate.bias") != nullptr;
  c.qk_norm = f.FindTensor("blk.0.attn_q_norm.weight") != nullptr;
  c.fused_qkv = f.FindTensor("blk.0.attn_qkv.weight") != nullptr;
  c.dtype = ComputeDType(f);
  // Only the llama converter permutes Q and K for interleaved pairs; the others keep
  // transformers' rotate_half layout (llama.cpp's NEOX RoPE).
  c.rope_interleaved = c.architecture == "llama";
  absl::Status valid = c.Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(f.source(), ": ", valid.message()));
  }
  return c;
}

// The graph name, dtype rule and shape of one weight the config implies (or of a stored
// fused matrix the graph reads as its parts).
struct ExpectedWeight {
  std::string name;
  Shape shape;
  bool matrix;  // read by MatMul or Embedding: quantized types allowed
  const FusedWeight* fused = nullptr;  // the parts it is split into
};

std::vector<ExpectedWeight> ExpectedWeights(const LlamaConfig& c,
                                            const std::vector<FusedWeight>& fused) {
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim, i = c.intermediate_size;
  std::vector<ExpectedWeight> out;
  out.push_back({"model.embed_tokens.weight", Shape({c.vocab_size, h}), true});
  auto linear = [&](const std::string& prefix, int64_t rows, int64_t cols, bool bias) {
    out.push_back({prefix + ".weight", Shape({rows, cols}), true});
    if (bias) out.push_back({prefix + ".bias", Shape({rows}), false});
  };
  auto stored_fused = [&](const std::string& name) {
    for (const FusedWeight& f : fused) {
      if (f.stored != name) continue;
      int64_t rows = 0;
      for (const FusedWeight::Part& part : f.parts) rows += part.rows;
      out.push_back({name, Shape({rows, f.cols}), true, &f});
    }
  };
  auto norm = [&](const std::string& name, int64_t n) {
    out.push_back({name + ".weight", Shape({n}), false});
  };
  const bool qkv_bias = c.attention_bias || c.qkv_bias;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    norm(p + "input_layernorm", h);
    if (c.fused_qkv) {
      stored_fused(p + "self_attn.qkv_proj.weight");
    } else {
      linear(p + "self_attn.q_proj", q, h, qkv_bias);
      linear(p + "self_attn.k_proj", kv, h, qkv_bias);
      linear(p + "self_attn.v_proj", kv, h, qkv_bias);
    }
    if (c.qk_norm) {
      norm(p + "self_attn.q_norm", c.head_dim);
      norm(p + "self_attn.k_norm", c.head_dim);
    }
    linear(p + "self_attn.o_proj", h, q, c.attention_bias);
    norm(p + "post_attention_layernorm", h);
    if (c.sandwich_norms) {
      norm(p + "pre_feedforward_layernorm", h);
      norm(p + "post_feedforward_layernorm", h);
    }
    if (c.MoeLayer(l)) {
      // The router and the experts stacked [E, rows, cols], read in place.
      const std::string e = p + c.moe_prefix + ".";
      const int64_t experts = c.num_experts, moe_i = c.moe_intermediate_size;
      out.push_back({e + "gate.weight", Shape({experts, h}), true});
      out.push_back({e + "experts.gate_proj.weight", Shape({experts, moe_i, h}), true});
      out.push_back({e + "experts.up_proj.weight", Shape({experts, moe_i, h}), true});
      out.push_back({e + "experts.down_proj.weight", Shape({experts, h, moe_i}), true});
      continue;
    }
    if (c.fused_gate_up) {
      stored_fused(p + "mlp.gate_up_proj.weight");
    } else {
      linear(p + "mlp.gate_proj", i, h, c.mlp_bias);
      linear(p + "mlp.up_proj", i, h, c.mlp_bias);
    }
    linear(p + "mlp.down_proj", h, i, c.mlp_bias);
  }
  out.push_back({"model.norm.weight", Shape({h}), false});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", Shape({c.vocab_size, h}), true});
  return out;
}

// A float tensor stored in another dtype than the file is computed in, rounded to that
// dtype (round to nearest even, as transformers' .to(dtype) rounds). llama.cpp's
// converter keeps every 1-D tensor (norms, biases) in F32 whatever the matrices' type, and
// quantized files may hold an F16 matrix whose rows are not whole blocks: converting these
// few tensors once at load lets every op and every dispatcher see one float dtype, where a
// mixed-dtype RmsNorm would need its own kernels and rounding rules (docs/gguf.md compares
// the two). A value the target cannot hold (past F16's 65504) is refused, not turned into
// an infinity.
absl::StatusOr<std::vector<std::byte>> ConvertFloatTensor(const GgufTensor& t, DType to,
                                                          const std::string& source) {
  const int64_t n = t.shape.NumElements();
  int64_t bytes = 0;
  if (!CheckedMul(n, DTypeBytes(to), &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": tensor '", t.name,
                                                   "' is too large to convert"));
  }
  std::vector<std::byte> out(static_cast<size_t>(bytes));
  for (int64_t i = 0; i < n; ++i) {
    const float v = LoadElement(t.data.data(), t.dtype, i);
    StoreElement(out.data(), to, i, v);
    if (std::isfinite(v) && !std::isfinite(LoadElement(out.data(), to, i))) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": tensor '", t.name, "' holds ", v, " at element ", i, ", which ",
          DTypeName(to), " (the dtype the file's ", DTypeName(to),
          " matrices are computed in) cannot hold"));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<LlamaConfig> LlamaConfigFromGguf(const GgufFile& file) {
  try {
    return ReadConfig(file);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(file.source(), ": out of memory"));
  }
}

absl::StatusOr<std::string> HfNameFromGguf(absl::string_view name) {
  return HfNameFromGguf(name, LlamaConfig{});
}

absl::StatusOr<std::string> HfNameFromGguf(absl::string_view name, const LlamaConfig& c) {
  auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name.substr(0, 80), "' ", why));
  };
  if (name == "token_embd.weight") return std::string("model.embed_tokens.weight");
  if (name == "output_norm.weight") return std::string("model.norm.weight");
  if (name == "output.weight") return std::string("lm_head.weight");
  absl::string_view rest = name;
  if (!absl::ConsumePrefix(&rest, "blk.")) return refuse("is not a tensor of a llama model");
  const size_t dot = rest.find('.');
  const absl::string_view number = rest.substr(0, dot);
  uint32_t layer = 0;
  if (dot == absl::string_view::npos || number.empty() || number.size() > 9 ||
      (number.size() > 1 && number[0] == '0') ||
      number.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(number, &layer)) {
    return refuse("has no plain block number after 'blk.'");
  }
  rest.remove_prefix(dot + 1);
  absl::string_view suffix;
  if (absl::ConsumeSuffix(&rest, ".weight")) {
    suffix = "weight";
  } else if (absl::ConsumeSuffix(&rest, ".bias")) {
    suffix = "bias";
  } else {
    return refuse("ends in neither .weight nor .bias");
  }
  // The names llama.cpp's converter gives each family's tensors (Gemma 2's "ffn_norm" is
  // its pre-MLP norm; Phi-3's "ffn_up" holds gate and up).
  static constexpr std::pair<absl::string_view, absl::string_view> kParts[] = {
      {"attn_q", "self_attn.q_proj"},      {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"},      {"attn_output", "self_attn.o_proj"},
      {"ffn_gate", "mlp.gate_proj"},       {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"},       {"attn_norm", "input_layernorm"},
      {"ffn_norm", "post_attention_layernorm"},
  };
  static constexpr std::pair<absl::string_view, absl::string_view> kFamilyParts[] = {
      {"attn_q_norm", "self_attn.q_norm"},
      {"attn_k_norm", "self_attn.k_norm"},
      {"attn_qkv", "self_attn.qkv_proj"},
      {"post_attention_norm", "post_attention_layernorm"},
      {"post_ffw_norm", "post_feedforward_layernorm"},
  };
  if (c.num_experts > 0 && suffix == "weight") {
    // The router and the stacked experts of a routed layer.
    static constexpr std::pair<absl::string_view, absl::string_view> kExpertParts[] = {
        {"ffn_gate_inp", "gate"},
        {"ffn_gate_exps", "experts.gate_proj"},
        {"ffn_up_exps", "experts.up_proj"},
        {"ffn_down_exps", "experts.down_proj"},
    };
    for (const auto& [gguf, hf] : kExpertParts) {
      if (rest != gguf) continue;
      return absl::StrCat("model.layers.", layer, ".", c.moe_prefix, ".", hf, ".weight");
    }
  }
  absl::string_view hf_part;
  if (c.sandwich_norms && rest == "ffn_norm") hf_part = "pre_feedforward_layernorm";
  if (c.fused_gate_up && rest == "ffn_up") hf_part = "mlp.gate_up_proj";
  for (const auto& [gguf, hf] : kFamilyParts) {
    if (rest == gguf) hf_part = hf;
  }
  if (!hf_part.empty()) {
    if (suffix == "bias" && absl::EndsWith(rest, "norm")) {
      return refuse("is not a tensor of a llama model");
    }
    return absl::StrCat("model.layers.", layer, ".", hf_part, ".", suffix);
  }
  for (const auto& [gguf, hf] : kParts) {
    if (rest != gguf) continue;
    if (suffix == "bias" && absl::EndsWith(gguf, "_norm")) break;  // RmsNorm has no bias
    return absl::StrCat("model.layers.", layer, ".", hf, ".", suffix);
  }
  return refuse("is not a tensor of a llama model");
}

// ---- GgufModel ----

absl::StatusOr<GgufModel> GgufModel::Open(const std::string& path, const GgufLimits& limits) {
  SG_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(path, limits));
  return FromFile(std::move(file));
}

absl::StatusOr<GgufModel> GgufModel::FromFile(GgufFile file) {
  try {
    GgufModel m;
    SG_ASSIGN_OR_RETURN(m.config_, LlamaConfigFromGguf(file));
    const std::string& source = file.source();
    // Every stored tensor by graph name; rope_freqs was read into the config.
    absl::flat_hash_map<std::string, const GgufTensor*> stored;
    bool quantized = false;
    for (const GgufTensor& t : file.tensors()) {
      quantized = quantized || IsQuantized(t.dtype);
      if (t.name == "rope_freqs.weight") continue;
      absl::StatusOr<std::string> hf = HfNameFromGguf(t.name, m.config_);
      if (!hf.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": ", hf.status().message()));
      }
      stored.emplace(*std::move(hf), &t);  // distinct GGUF names map to distinct names
    }
    if (quantized) {
      if (const GgufValue* v = file.Find("general.quantization_version")) {
        absl::StatusOr<int64_t> version = v->Int();
        if (!version.ok() || *version != 2) {
          return absl::InvalidArgumentError(absl::StrCat(
              source, ": general.quantization_version ", v->ToString(),
              " is not supported: stepgraph reads the block layouts of version 2"));
        }
      }
    }

    const std::vector<FusedWeight> fused = FusedWeights(m.config_);
    const std::vector<ExpectedWeight> expected = ExpectedWeights(m.config_, fused);
    int64_t total = 0;
    for (const ExpectedWeight& e : expected) {
      auto it = stored.find(e.name);
      if (it == stored.end()) {
        return absl::NotFoundError(absl::StrCat(source, ": the config needs tensor '", e.name,
                                                "' ", e.shape.ToString(),
                                                ", which the file does not store"));
      }
      const GgufTensor& t = *it->second;
      if (t.shape != e.shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ": tensor '", t.name, "' (", e.name, ") has shape ", t.shape.ToString(),
            " but the config needs ", e.shape.ToString()));
      }
      if (!e.matrix && !IsFloat(t.dtype)) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": tensor '", t.name, "' is ", GgufTensorTypeName(t.type),
                         "; norms and biases must be F32, F16 or BF16"));
      }
      GgufWeight w{e.name, t.name, t.dtype, t.dtype, t.shape, t.data};
      if (IsFloat(t.dtype) && t.dtype != m.config_.dtype) {
        SG_ASSIGN_OR_RETURN(std::vector<std::byte> converted,
                            ConvertFloatTensor(t, m.config_.dtype, source));
        m.converted_.push_back(std::move(converted));  // its bytes stay put when moved
        w.dtype = m.config_.dtype;
        w.data = m.converted_.back();
      }
      SG_RETURN_IF_ERROR(CheckedAdd(total, static_cast<int64_t>(w.data.size()), &total)
                             ? absl::OkStatus()
                             : absl::InvalidArgumentError(
                                   absl::StrCat(source, ": weight bytes overflow")));
      stored.erase(it);
      if (e.fused == nullptr) {
        m.index_.emplace(e.name, m.weights_.size());
        m.weights_.push_back(std::move(w));
        continue;
      }
      // A fused matrix: the graph's weights are its row ranges, views of its bytes.
      for (size_t p = 0; p < e.fused->parts.size(); ++p) {
        absl::StatusOr<absl::Span<const std::byte>> part =
            FusedPart(*e.fused, p, w.dtype, w.data);
        if (!part.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(source, ": ", part.status().message()));
        }
        const FusedWeight::Part& fp = e.fused->parts[p];
        m.index_.emplace(fp.name, m.weights_.size());
        m.weights_.push_back({fp.name, w.gguf_name, w.dtype, w.stored_dtype,
                              Shape({fp.rows, e.fused->cols}), *part});
      }
    }
    if (!stored.empty()) {
      const GgufTensor& extra = *stored.begin()->second;
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": tensor '", extra.name, "' (", stored.begin()->first,
          ") is not used by the model the metadata describes (", stored.size(),
          " such tensors)"));
    }
    m.weight_bytes_ = total;
    m.file_ = std::move(file);  // views stay valid: they point into the mapping
    return m;
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(file.source(), ": out of memory"));
  }
}

const GgufWeight* GgufModel::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &weights_[it->second];
}

absl::flat_hash_map<std::string, DType> GgufModel::WeightDTypes() const {
  absl::flat_hash_map<std::string, DType> out;
  for (const GgufWeight& w : weights_) out.emplace(w.name, w.dtype);
  return out;
}

absl::Status BindGgufWeights(const GgufModel& model, const Graph& graph, Bindings& bindings) {
  const std::string& source = model.file().source();
  int64_t used = 0;
  for (int32_t i = 0; i < graph.num_tensors(); ++i) {
    const Tensor& t = graph.tensors()[i];
    if (t.kind != TensorKind::kWeight) continue;
    const GgufWeight* w = model.Find(t.name);
    if (w == nullptr) {
      return absl::NotFoundError(absl::StrCat("tensor '", t.name, "' (", DTypeName(t.dtype), " ",
                                              t.shape.ToString(), ") is needed by the graph but ",
                                              source, " does not store it"));
    }
    if (w->dtype != t.dtype || w->shape != t.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "' ('", w->gguf_name, "' in ", source, ") is ", DTypeName(w->dtype),
          " ", w->shape.ToString(), " but the graph needs ", DTypeName(t.dtype), " ",
          t.shape.ToString()));
    }
    const int64_t align = IsQuantized(t.dtype) ? 2 : DTypeBytes(t.dtype);
    if (reinterpret_cast<uintptr_t>(w->data.data()) % static_cast<uintptr_t>(align) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", w->gguf_name, "' in ", source,
                                                     " is not aligned to ", align,
                                                     " bytes and cannot be read in place"));
    }
    ++used;
    SG_RETURN_IF_ERROR(bindings.Bind(graph.id(i), const_cast<std::byte*>(w->data.data()),
                                     static_cast<int64_t>(w->data.size())));
  }
  if (used != static_cast<int64_t>(model.weights().size())) {
    for (const GgufWeight& w : model.weights()) {
      if (!graph.FindTensor(w.name).ok()) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", w.gguf_name, "' (", w.name,
                                                       ") in ", source,
                                                       " is not used by the graph"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace sg
