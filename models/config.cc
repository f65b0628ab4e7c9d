// config.json → LlamaConfig. Each key of the file is consumed by exactly one reader below
// or listed as known to be harmless for inference; whatever is left is refused, because an
// unknown key may change what the model computes (quantisation, sliding windows, another
// RoPE variant) and running it without that would give plausible but wrong text.
#include "models/config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <new>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/small_file.h"
#include "nlohmann/json.hpp"
#include "stepgraph/base/status.h"
#include "text/bounded_json.h"

namespace sg {
namespace {

using Json = nlohmann::json;

// config.json nests 3 deep (rope_scaling, task_specific_params); a file of 1 MiB holds at
// most half a million values.
constexpr JsonLimits kConfigJsonLimits = {.max_depth = 32, .max_values = int64_t{1} << 20};

// Keys written by the config writers (the common base config, generation defaults of old
// writers, token ids, training-only settings) that do not change the inference math.
constexpr absl::string_view kHarmlessKeys[] = {
    "_model_name_or_path",  // written by transformers 5
    "_name_or_path",
    "_attn_implementation_autoset",
    "_commit_hash",
    "add_cross_attention",
    "attention_dropout",  // training only
    "bad_words_ids",
    "begin_suppress_tokens",
    "bos_token_id",
    "chunk_size_feed_forward",
    "cross_attention_hidden_size",
    "decoder_start_token_id",
    "diversity_penalty",
    "do_sample",
    "early_stopping",
    "encoder_no_repeat_ngram_size",
    "eos_token_id",
    "exponential_decay_length_penalty",
    "finetuning_task",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "id2label",
    "initializer_range",  // training only
    "is_decoder",
    "is_encoder_decoder",
    "is_llama_config",  // a marker some converted checkpoints carry
    "label2id",
    "length_penalty",
    "max_length",
    "min_length",
    "no_repeat_ngram_size",
    "num_beam_groups",
    "num_beams",
    "num_return_sequences",
    "output_attentions",
    "output_hidden_states",
    "output_scores",
    "pad_token_id",
    "prefix",
    "problem_type",
    "remove_invalid_values",
    "repetition_penalty",
    "return_dict",
    "return_dict_in_generate",
    "sep_token_id",
    "suppress_tokens",
    "task_specific_params",
    "temperature",
    "tf_legacy_loss",
    "tie_encoder_decoder",
    "tokenizer_class",
    "top_k",
    "top_p",
    "torchscript",
    "transformers_version",
    "typical_p",
    "unk_token_id",  // written by transformers 5
    "use_bfloat16",
    "use_cache",
};

// A value quoted in a message: its first 80 characters, however large it is.
std::string Render(const Json& v) { return JsonPreview(v, 80); }

absl::string_view TypeName(const Json& v) {
  if (v.is_number_integer()) return "integer";
  if (v.is_number_float()) return "number";
  return v.type_name();
}

// Typed access to the keys of one JSON object, remembering which were read so that the
// rest can be reported as unknown.
class FieldReader {
 public:
  FieldReader(const Json& object, std::string prefix, absl::string_view source)
      : object_(object), prefix_(std::move(prefix)), source_(source) {}

  std::string Path(absl::string_view key) const { return absl::StrCat(prefix_, key); }

  absl::Status Error(absl::string_view key, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": field '", Path(key), "': ", what));
  }

  // Whether the object holds `key`, null included (where null and absent differ).
  bool Has(absl::string_view key) const { return object_.contains(std::string(key)); }

  // The value of `key`, or nullptr when it is absent or null (both mean "not given").
  const Json* Get(absl::string_view key) {
    seen_.insert(std::string(key));
    auto it = object_.find(std::string(key));
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  absl::StatusOr<const Json*> Required(absl::string_view key) {
    const Json* v = Get(key);
    if (v == nullptr) return Error(key, "missing required field");
    return v;
  }

  absl::StatusOr<std::optional<int64_t>> Int(absl::string_view key) {
    const Json* v = Get(key);
    if (v == nullptr) return std::optional<int64_t>();
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Error(key, absl::StrCat("integer ", Render(*v), " is too large"));
      }
      return std::optional<int64_t>(static_cast<int64_t>(u));
    }
    if (v->is_number_integer()) return std::optional<int64_t>(v->get<int64_t>());
    return Error(key, absl::StrCat("expected an integer, got ", TypeName(*v), " ", Render(*v)));
  }

  absl::StatusOr<int64_t> RequiredInt(absl::string_view key) {
    SG_ASSIGN_OR_RETURN(std::optional<int64_t> v, Int(key));
    if (!v.has_value()) return Error(key, "missing required field");
    return *v;
  }

  absl::StatusOr<std::optional<double>> Number(absl::string_view key) {
    const Json* v = Get(key);
    if (v == nullptr) return std::optional<double>();
    if (!v->is_number()) {
      return Error(key, absl::StrCat("expected a number, got ", TypeName(*v), " ", Render(*v)));
    }
    const double d = v->get<double>();
    if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max()) {
      return Error(key, absl::StrCat("value ", Render(*v), " does not fit a float"));
    }
    return std::optional<double>(d);
  }

  absl::StatusOr<double> RequiredNumber(absl::string_view key) {
    SG_ASSIGN_OR_RETURN(std::optional<double> v, Number(key));
    if (!v.has_value()) return Error(key, "missing required field");
    return *v;
  }

  absl::StatusOr<std::optional<bool>> Bool(absl::string_view key) {
    const Json* v = Get(key);
    if (v == nullptr) return std::optional<bool>();
    if (!v->is_boolean()) {
      return Error(key, absl::StrCat("expected true or false, got ", TypeName(*v), " ",
                                     Render(*v)));
    }
    return std::optional<bool>(v->get<bool>());
  }

  absl::StatusOr<std::optional<std::string>> String(absl::string_view key) {
    const Json* v = Get(key);
    if (v == nullptr) return std::optional<std::string>();
    if (!v->is_string()) {
      return Error(key, absl::StrCat("expected a string, got ", TypeName(*v), " ", Render(*v)));
    }
    return std::optional<std::string>(v->get<std::string>());
  }

  // InvalidArgument naming the first key that was neither read nor is in `harmless`,
  // unless its value is null.
  absl::Status CheckNoUnknown(absl::Span<const absl::string_view> harmless) const {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (seen_.contains(it.key())) continue;
      // null is how writers say "not set" (e.g. "quantization_config": null), which is
      // what stepgraph does anyway.
      if (it.value().is_null()) continue;
      bool ok = false;
      for (absl::string_view h : harmless) ok = ok || it.key() == h;
      if (!ok) {
        return Error(it.key(), absl::StrCat(
                                   "unknown field (value ", Render(it.value()),
                                   "); stepgraph refuses fields it does not understand so that "
                                   "no model is run differently from its definition"));
      }
    }
    return absl::OkStatus();
  }

 private:
  const Json& object_;
  std::string prefix_;
  absl::string_view source_;
  absl::flat_hash_set<std::string> seen_;
};

// What one RoPE object ("rope_scaling" or "rope_parameters") says.
struct RopeSettings {
  std::optional<double> theta;  // only "rope_parameters" carries it
  ops::RopeScaling scaling;
};

absl::StatusOr<RopeSettings> ParseRopeObject(const Json& object, absl::string_view field,
                                             bool may_hold_theta, absl::string_view source) {
  FieldReader r(object, absl::StrCat(field, "."), source);
  RopeSettings out;
  if (may_hold_theta) {
    SG_ASSIGN_OR_RETURN(out.theta, r.Number("rope_theta"));
  }
  // "rope_type" is the current key, "type" the older one; either may be present.
  SG_ASSIGN_OR_RETURN(std::optional<std::string> rope_type, r.String("rope_type"));
  SG_ASSIGN_OR_RETURN(std::optional<std::string> legacy_type, r.String("type"));
  if (rope_type && legacy_type && *rope_type != *legacy_type) {
    return r.Error("type", absl::StrCat("\"", *legacy_type, "\" contradicts rope_type \"",
                                        *rope_type, "\""));
  }
  if (!rope_type && !legacy_type) return r.Error("rope_type", "missing required field");
  const std::string type = rope_type ? *rope_type : *legacy_type;
  const absl::string_view type_key = rope_type ? "rope_type" : "type";

  // A rotary fraction below 1 rotates only part of each head, which Rope does not do.
  SG_ASSIGN_OR_RETURN(std::optional<double> partial, r.Number("partial_rotary_factor"));
  if (partial.has_value() && *partial != 1.0) {
    return r.Error("partial_rotary_factor",
                   absl::StrCat("unsupported value ", *partial, " (only 1.0 is supported)"));
  }

  if (type == "default") {
    // The default type ignores any scaling keys, exactly as the reference does; read them
    // so that they are not reported as unknown.
    for (absl::string_view k :
         {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      r.Get(k);
    }
  } else if (type == "llama3") {
    ops::RopeScaling& s = out.scaling;
    s.type = ops::RopeScaling::Type::kLlama3;
    SG_ASSIGN_OR_RETURN(const double factor, r.RequiredNumber("factor"));
    SG_ASSIGN_OR_RETURN(const double low, r.RequiredNumber("low_freq_factor"));
    SG_ASSIGN_OR_RETURN(const double high, r.RequiredNumber("high_freq_factor"));
    SG_ASSIGN_OR_RETURN(const int64_t original, r.RequiredInt("original_max_position_embeddings"));
    if (!(factor > 0.0)) return r.Error("factor", absl::StrCat("must be > 0, got ", factor));
    if (!(low > 0.0)) return r.Error("low_freq_factor", absl::StrCat("must be > 0, got ", low));
    if (!(high > low)) {
      return r.Error("high_freq_factor",
                     absl::StrCat("must be > low_freq_factor (", low, "), got ", high));
    }
    if (original <= 0 || original > std::numeric_limits<int32_t>::max()) {
      return r.Error("original_max_position_embeddings",
                     absl::StrCat("must be in [1, 2^31), got ", original));
    }
    s.factor = static_cast<float>(factor);
    s.low_freq_factor = static_cast<float>(low);
    s.high_freq_factor = static_cast<float>(high);
    s.original_max_position = static_cast<int32_t>(original);
  } else if (type == "linear") {
    SG_ASSIGN_OR_RETURN(const double factor, r.RequiredNumber("factor"));
    if (!(factor > 0.0)) return r.Error("factor", absl::StrCat("must be > 0, got ", factor));
    out.scaling.type = ops::RopeScaling::Type::kLinear;
    out.scaling.factor = static_cast<float>(factor);
  } else {
    return r.Error(type_key, absl::StrCat("unsupported value \"", type,
                                          "\" (stepgraph supports \"default\", \"linear\" "
                                          "and \"llama3\")"));
  }
  SG_RETURN_IF_ERROR(r.CheckNoUnknown({}));
  return out;
}

bool SameScaling(const ops::RopeScaling& a, const ops::RopeScaling& b) {
  return a.type == b.type && a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
         a.high_freq_factor == b.high_freq_factor &&
         a.original_max_position == b.original_max_position;
}

absl::StatusOr<DType> ParseTorchDType(FieldReader& r, absl::string_view key,
                                      const std::string& name) {
  if (name == "float32") return DType::kF32;
  if (name == "bfloat16") return DType::kBF16;
  if (name == "float16") return DType::kF16;
  return r.Error(key, absl::StrCat("unsupported value \"", name,
                                   "\" (expected \"float32\", \"bfloat16\" or \"float16\")"));
}

// The families stepgraph runs: config.json's model_type, its architectures entry, and what
// the family's config class defaults to where the file leaves a key out (save_pretrained
// leaves out values equal to the base config's, such as Gemma's tied embeddings).
struct Family {
  absl::string_view model_type;
  absl::string_view architecture;
  bool tied_by_default;
};
constexpr Family kFamilies[] = {
    {"llama", "LlamaForCausalLM", false},   {"mistral", "MistralForCausalLM", false},
    {"qwen2", "Qwen2ForCausalLM", false},   {"qwen3", "Qwen3ForCausalLM", false},
    {"phi3", "Phi3ForCausalLM", false},     {"gemma", "GemmaForCausalLM", true},
    {"gemma2", "Gemma2ForCausalLM", true}, {"gemma3_text", "Gemma3ForCausalLM", true},
    {"mixtral", "MixtralForCausalLM", false}, {"qwen3_moe", "Qwen3MoeForCausalLM", false},
};

std::string FamilyList(bool architectures) {
  std::string out;
  for (const Family& f : kFamilies) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", "\"",
                    architectures ? f.architecture : f.model_type, "\"");
  }
  return out;
}

// The family from "model_type" and "architectures" (either may be absent; Llama when both
// are); they must name the same one.
absl::StatusOr<const Family*> ReadFamily(FieldReader& r) {
  const Family* family = nullptr;
  SG_ASSIGN_OR_RETURN(std::optional<std::string> model_type, r.String("model_type"));
  if (model_type.has_value()) {
    for (const Family& f : kFamilies) {
      if (f.model_type == *model_type) family = &f;
    }
    if (family == nullptr && *model_type == "gemma3") {
      // Gemma 3 4B and larger: text and images, the language model's config nested.
      return r.Error("model_type",
                     "unsupported value \"gemma3\" (Gemma3ForConditionalGeneration, text and "
                     "images; stepgraph runs the text model of \"gemma3_text\" folders and "
                     "of GGUF files, which llama.cpp's converter writes without the images' "
                     "part)");
    }
    if (family == nullptr) {
      return r.Error("model_type", absl::StrCat("unsupported value \"", *model_type,
                                                "\" (stepgraph runs ", FamilyList(false), ")"));
    }
  }
  if (const Json* arch = r.Get("architectures")) {
    if (!arch->is_array() || arch->empty()) {
      return r.Error("architectures",
                     absl::StrCat("expected a non-empty list of strings, got ", Render(*arch)));
    }
    for (const Json& a : *arch) {
      const Family* named = nullptr;
      for (const Family& f : kFamilies) {
        if (a.is_string() && a.get<std::string>() == f.architecture) named = &f;
      }
      if (named == nullptr || (family != nullptr && named != family)) {
        return r.Error("architectures",
                       absl::StrCat("unsupported value ", Render(a), " (stepgraph runs ",
                                    family != nullptr
                                        ? absl::StrCat("\"", family->architecture,
                                                       "\" for model_type \"",
                                                       family->model_type, "\"")
                                        : FamilyList(true),
                                    ")"));
      }
      family = named;
    }
  }
  return family != nullptr ? family : &kFamilies[0];
}

// "layer_types": one "full_attention" or "sliding_attention" per layer.
absl::StatusOr<std::optional<std::vector<bool>>> ReadLayerTypes(FieldReader& r) {
  const Json* v = r.Get("layer_types");
  if (v == nullptr) return std::optional<std::vector<bool>>();
  if (!v->is_array()) {
    return r.Error("layer_types", absl::StrCat("expected a list, got ", Render(*v)));
  }
  std::vector<bool> sliding;
  for (const Json& e : *v) {
    if (e == "sliding_attention") {
      sliding.push_back(true);
    } else if (e == "full_attention") {
      sliding.push_back(false);
    } else {
      return r.Error("layer_types",
                     absl::StrCat("unsupported entry ", Render(e),
                                  " (stepgraph runs \"full_attention\" and "
                                  "\"sliding_attention\")"));
    }
  }
  return std::optional<std::vector<bool>>(std::move(sliding));
}

// The experts of Mixtral and Qwen3-MoE, with their config classes' defaults where a key
// is absent. transformers maps "num_experts" and "num_local_experts" onto one attribute,
// so either may be written (both must then agree).
absl::Status ReadExperts(absl::string_view type, FieldReader& r, LlamaConfig& c) {
  const bool mixtral = type == "mixtral";
  SG_ASSIGN_OR_RETURN(std::optional<int64_t> experts, r.Int("num_experts"));
  SG_ASSIGN_OR_RETURN(std::optional<int64_t> local, r.Int("num_local_experts"));
  if (experts && local && *experts != *local) {
    return r.Error("num_local_experts",
                   absl::StrCat(*local, " contradicts num_experts ", *experts));
  }
  c.num_experts = experts.value_or(local.value_or(mixtral ? 8 : 128));
  SG_ASSIGN_OR_RETURN(std::optional<int64_t> top_k, r.Int("num_experts_per_tok"));
  c.experts_per_token = top_k.value_or(mixtral ? 2 : 8);
  // Training only: the balance loss, the router's jitter, returning the router's logits.
  for (absl::string_view k : {"router_aux_loss_coef", "output_router_logits",
                              "router_jitter_noise"}) {
    r.Get(k);
  }
  if (c.num_experts <= 0) {
    return r.Error(experts ? "num_experts" : "num_local_experts",
                   absl::StrCat("must be > 0, got ", c.num_experts));
  }
  if (mixtral) {
    c.moe_prefix = "block_sparse_moe";
    c.moe_intermediate_size = c.intermediate_size;
    c.moe_renormalize = true;
    return absl::OkStatus();
  }
  c.moe_prefix = "mlp";
  c.moe_round_weights = true;
  SG_ASSIGN_OR_RETURN(std::optional<int64_t> inter, r.Int("moe_intermediate_size"));
  c.moe_intermediate_size = inter.value_or(768);
  SG_ASSIGN_OR_RETURN(std::optional<bool> norm, r.Bool("norm_topk_prob"));
  c.moe_renormalize = norm.value_or(false);
  // transformers: layer l is routed unless listed in mlp_only_layers, and only when
  // (l + 1) % decoder_sparse_step == 0.
  SG_ASSIGN_OR_RETURN(std::optional<int64_t> step, r.Int("decoder_sparse_step"));
  const int64_t sparse_step = step.value_or(1);
  if (sparse_step < 1) {
    return r.Error("decoder_sparse_step", absl::StrCat("must be >= 1, got ", sparse_step));
  }
  std::vector<bool> dense(static_cast<size_t>(std::clamp<int64_t>(c.num_hidden_layers, 0, 1024)),
                          false);
  if (const Json* only = r.Get("mlp_only_layers")) {
    if (!only->is_array()) {
      return r.Error("mlp_only_layers", absl::StrCat("expected a list, got ", Render(*only)));
    }
    for (const Json& e : *only) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 ||
          e.get<int64_t>() >= static_cast<int64_t>(dense.size())) {
        return r.Error("mlp_only_layers",
                       absl::StrCat("entry ", Render(e), " is not a layer index in [0, ",
                                    dense.size(), ")"));
      }
      dense[static_cast<size_t>(e.get<int64_t>())] = true;
    }
  }
  c.moe_layers.clear();
  bool all = true;
  for (size_t l = 0; l < dense.size(); ++l) {
    c.moe_layers.push_back(!dense[l] && (static_cast<int64_t>(l) + 1) % sparse_step == 0);
    all = all && c.moe_layers.back();
  }
  if (all) c.moe_layers.clear();  // every layer routed: the description's default
  return absl::OkStatus();
}

// What a family adds to the Llama fields: biases, norms, the activation, soft-capping and
// sliding windows, each from the keys its config class writes.
absl::Status ReadFamilyFields(const Family& family, FieldReader& r, LlamaConfig& c) {
  c.architecture = std::string(family.model_type);
  const absl::string_view type = family.model_type;
  const bool gemma3 = type == "gemma3_text";
  const bool gemma = type == "gemma" || type == "gemma2" || gemma3;
  c.qkv_bias = type == "qwen2";
  c.qk_norm = type == "qwen3" || type == "qwen3_moe" || gemma3;
  if (type == "mixtral" || type == "qwen3_moe") SG_RETURN_IF_ERROR(ReadExperts(type, r, c));
  c.fused_qkv = c.fused_gate_up = type == "phi3";
  c.norm_plus_one = c.embedding_scale = gemma;
  c.sandwich_norms = type == "gemma2" || gemma3;

  // The activation: "hidden_act", or Gemma's "hidden_activation", which wins over it.
  SG_ASSIGN_OR_RETURN(std::optional<std::string> act, r.String("hidden_act"));
  absl::string_view act_key = "hidden_act";
  if (gemma) {
    SG_ASSIGN_OR_RETURN(std::optional<std::string> gemma_act, r.String("hidden_activation"));
    if (gemma_act.has_value()) {
      act = gemma_act;
      act_key = "hidden_activation";
    }
  }
  const std::string act_name = act.value_or(gemma ? "gelu_pytorch_tanh" : "silu");
  if (act_name == "silu") {
    c.activation = MlpActivation::kSilu;
  } else if (act_name == "gelu_pytorch_tanh") {
    c.activation = MlpActivation::kGeluTanh;
  } else {
    return r.Error(act_key, absl::StrCat("unsupported value \"", act_name,
                                         "\" (stepgraph supports \"silu\" and "
                                         "\"gelu_pytorch_tanh\")"));
  }

  if (type == "phi3") {
    // Dropout (training only), and the context length only "longrope" scaling reads
    // (which ParseRopeObject refuses).
    for (absl::string_view k : {"resid_pdrop", "embd_pdrop", "original_max_position_embeddings"}) {
      r.Get(k);
    }
  }
  if (type == "gemma2" || gemma3) {
    r.Get("cache_implementation");  // how transformers caches, not math
  }
  if (gemma3) {
    // Embedding models' bidirectional attention is not a decoder's.
    SG_ASSIGN_OR_RETURN(std::optional<bool> bidirectional, r.Bool("use_bidirectional_attention"));
    if (bidirectional.value_or(false)) {
      return r.Error("use_bidirectional_attention",
                     "unsupported value true (stepgraph runs causal decoders)");
    }
  }
  if (type == "llama" || type == "gemma") return absl::OkStatus();  // no sliding window

  // Sliding windows: "sliding_window" (null: none) in the layers "layer_types" marks, or
  // where the family's config class puts it when the file has no layer_types.
  // (A flag and a size rather than an optional: GCC's -O3 flow analysis took the optional,
  // reset on some paths, for uninitialised.)
  SG_ASSIGN_OR_RETURN(const std::optional<int64_t> window_key, r.Int("sliding_window"));
  bool has_window = window_key.has_value();
  int64_t window = window_key.value_or(0);
  SG_ASSIGN_OR_RETURN(std::optional<std::vector<bool>> layer_types, ReadLayerTypes(r));
  if (type == "qwen3_moe") {
    // transformers: the window in every layer when use_sliding_window, else none
    // (max_window_layers, which old files carry, is not read by its attention).
    SG_ASSIGN_OR_RETURN(std::optional<bool> use, r.Bool("use_sliding_window"));
    r.Get("max_window_layers");
    if (!use.value_or(false)) has_window = false;
  }
  if (type == "qwen2" || type == "qwen3") {
    // transformers: no window unless use_sliding_window, and then from max_window_layers on.
    SG_ASSIGN_OR_RETURN(std::optional<bool> use, r.Bool("use_sliding_window"));
    SG_ASSIGN_OR_RETURN(std::optional<int64_t> max_window_layers, r.Int("max_window_layers"));
    if (!use.value_or(false)) has_window = false;
    if (has_window && !layer_types.has_value()) {
      const int64_t from = max_window_layers.value_or(c.num_hidden_layers);
      std::vector<bool> sliding;
      for (int64_t l = 0; l < c.num_hidden_layers && l < (int64_t{1} << 20); ++l) {
        sliding.push_back(l >= from);
      }
      layer_types = std::move(sliding);
    }
  }
  if (gemma3) {
    // Gemma 3's config class: a window of 4096 unless the file says (null: none), and
    // without layer_types every sliding_window_pattern-th layer global, the others local.
    // transformers 5 saves the pattern as "_sliding_window_pattern" beside layer_types.
    if (!r.Has("sliding_window")) {
      has_window = true;
      window = 4096;
    }
    std::optional<int64_t> pattern;
    for (absl::string_view key : {"sliding_window_pattern", "_sliding_window_pattern"}) {
      SG_ASSIGN_OR_RETURN(std::optional<int64_t> given, r.Int(key));
      if (!given.has_value()) continue;
      if (*given < 1) return r.Error(key, absl::StrCat("must be >= 1, got ", *given));
      if (pattern.has_value() && *pattern != *given) {
        return r.Error(key, absl::StrCat(*given, " contradicts sliding_window_pattern ",
                                         *pattern));
      }
      pattern = given;
    }
    if (!layer_types.has_value()) {
      std::vector<bool> sliding;
      for (int64_t l = 0; l < c.num_hidden_layers && l < (int64_t{1} << 20); ++l) {
        sliding.push_back((l + 1) % pattern.value_or(6) != 0);
      }
      layer_types = std::move(sliding);
    }
  }
  if (type == "gemma2" || gemma3) {
    // Gemma 3's config class defaults the scalar to 256; Gemma 2's file must say it.
    double scalar = 256.0;
    if (gemma3) {
      SG_ASSIGN_OR_RETURN(std::optional<double> given, r.Number("query_pre_attn_scalar"));
      scalar = given.value_or(256.0);
    } else {
      SG_ASSIGN_OR_RETURN(scalar, r.RequiredNumber("query_pre_attn_scalar"));
    }
    if (!(scalar > 0.0)) {
      return r.Error("query_pre_attn_scalar", absl::StrCat("must be > 0, got ", scalar));
    }
    c.attention_scale = static_cast<float>(std::pow(scalar, -0.5));
    SG_ASSIGN_OR_RETURN(std::optional<double> attn_cap, r.Number("attn_logit_softcapping"));
    SG_ASSIGN_OR_RETURN(std::optional<double> final_cap, r.Number("final_logit_softcapping"));
    c.attn_logit_softcap = static_cast<float>(attn_cap.value_or(0.0));
    c.final_logit_softcap = static_cast<float>(final_cap.value_or(0.0));
    if (c.attn_logit_softcap < 0.0f || c.final_logit_softcap < 0.0f) {
      return r.Error(c.attn_logit_softcap < 0.0f ? "attn_logit_softcapping"
                                                 : "final_logit_softcapping",
                     "must be >= 0 or null");
    }
    if (!layer_types.has_value()) {
      // transformers' Gemma 2 default: local (sliding) layers first, then alternating.
      std::vector<bool> sliding;
      for (int64_t l = 0; l < c.num_hidden_layers && l < (int64_t{1} << 20); ++l) {
        sliding.push_back(l % 2 == 0);
      }
      layer_types = std::move(sliding);
    }
  }
  if (has_window) {
    if (window <= 0) {
      return r.Error("sliding_window", absl::StrCat("must be > 0 or null, got ", window));
    }
    c.sliding_window = window;
    if (layer_types.has_value()) c.sliding_layers = *std::move(layer_types);
  } else if (layer_types.has_value() &&
             std::find(layer_types->begin(), layer_types->end(), true) != layer_types->end()) {
    return r.Error("layer_types", "marks sliding_attention layers, but sliding_window is null");
  }
  return absl::OkStatus();
}

// A RoPE object at `key` (rope_scaling, rope_parameters or one of its entries), or none
// where the key is absent or null.
absl::StatusOr<std::optional<RopeSettings>> ReadRopeObject(FieldReader& r,
                                                           absl::string_view key,
                                                           bool may_hold_theta,
                                                           absl::string_view source,
                                                           absl::string_view path) {
  const Json* v = r.Get(key);
  if (v == nullptr) return std::optional<RopeSettings>();
  if (!v->is_object()) {
    return r.Error(key, absl::StrCat("expected an object or null, got ", TypeName(*v), " ",
                                     Render(*v)));
  }
  SG_ASSIGN_OR_RETURN(RopeSettings out, ParseRopeObject(*v, path, may_hold_theta, source));
  return std::optional<RopeSettings>(std::move(out));
}

// One RoPE as a file's two forms give it: `parameters` (a rope_parameters object, at
// `path`) wins, and the legacy theta (`theta_key`) and scaling, where also present, must
// agree with it; `default_theta` where neither says.
absl::StatusOr<RopeSettings> MergeRope(FieldReader& r,
                                       const std::optional<RopeSettings>& parameters,
                                       absl::string_view path,
                                       const std::optional<double>& legacy_theta,
                                       absl::string_view theta_key,
                                       const std::optional<RopeSettings>& legacy_scaling,
                                       double default_theta) {
  const std::optional<double> given = parameters.has_value() ? parameters->theta : std::nullopt;
  if (given.has_value() && legacy_theta.has_value() && *given != *legacy_theta) {
    return r.Error(theta_key,
                   absl::StrCat(*legacy_theta, " contradicts ", path, ".rope_theta ", *given));
  }
  RopeSettings out;
  out.theta = given.value_or(legacy_theta.value_or(default_theta));
  if (parameters.has_value()) {
    if (legacy_scaling.has_value() && !SameScaling(legacy_scaling->scaling, parameters->scaling)) {
      return r.Error("rope_scaling", absl::StrCat("contradicts ", path));
    }
    out.scaling = parameters->scaling;
  } else if (legacy_scaling.has_value()) {
    out.scaling = legacy_scaling->scaling;
  }
  return out;
}

// Gemma 3's RoPE: its global layers rotate by rope_theta (1e6 by default) with any
// rope_scaling, its local (sliding) layers by rope_local_base_freq (1e4) without scaling;
// transformers 5 writes both as "rope_parameters" {"full_attention": {...},
// "sliding_attention": {...}}. Where both forms are present they must agree.
absl::Status ReadGemma3Rope(FieldReader& r, absl::string_view source, LlamaConfig& c) {
  SG_ASSIGN_OR_RETURN(std::optional<double> legacy_theta, r.Number("rope_theta"));
  SG_ASSIGN_OR_RETURN(std::optional<double> legacy_local, r.Number("rope_local_base_freq"));
  SG_ASSIGN_OR_RETURN(std::optional<RopeSettings> legacy_scaling,
                      ReadRopeObject(r, "rope_scaling", false, source, "rope_scaling"));
  std::optional<RopeSettings> full, local;
  if (const Json* v = r.Get("rope_parameters")) {
    if (!v->is_object()) {
      return r.Error("rope_parameters",
                     absl::StrCat("expected an object, got ", TypeName(*v), " ", Render(*v)));
    }
    FieldReader layers(*v, "rope_parameters.", source);
    SG_ASSIGN_OR_RETURN(full, ReadRopeObject(layers, "full_attention", true, source,
                                             "rope_parameters.full_attention"));
    SG_ASSIGN_OR_RETURN(local, ReadRopeObject(layers, "sliding_attention", true, source,
                                              "rope_parameters.sliding_attention"));
    SG_RETURN_IF_ERROR(layers.CheckNoUnknown({}));
  }
  SG_ASSIGN_OR_RETURN(const RopeSettings global,
                      MergeRope(r, full, "rope_parameters.full_attention", legacy_theta,
                                "rope_theta", legacy_scaling, 1e6));
  SG_ASSIGN_OR_RETURN(const RopeSettings sliding,
                      MergeRope(r, local, "rope_parameters.sliding_attention", legacy_local,
                                "rope_local_base_freq", std::nullopt, 1e4));
  if (sliding.scaling.type != ops::RopeScaling::Type::kNone) {
    return r.Error("rope_parameters.sliding_attention",
                   "scaled RoPE in the sliding layers is not supported (they rotate by "
                   "rope_type \"default\")");
  }
  // 0 would mean "as the global layers" to the description: a stated 0 is refused here.
  if (!(*sliding.theta > 0.0)) return r.Error("rope_local_base_freq", "must be > 0");
  c.rope_theta = static_cast<float>(*global.theta);
  c.rope_scaling = global.scaling;
  c.sliding_rope_theta = static_cast<float>(*sliding.theta);
  return absl::OkStatus();
}

// The end of ParseObject: no unknown key left, the metadata keys listed, the description
// valid.
absl::StatusOr<LlamaConfig> Finish(FieldReader& r, const Json& root, absl::string_view source,
                                   LlamaConfig& c) {
  SG_RETURN_IF_ERROR(r.CheckNoUnknown(kHarmlessKeys));
  for (const auto& [key, value] : root.items()) {
    if (std::find(std::begin(kHarmlessKeys), std::end(kHarmlessKeys), key) !=
        std::end(kHarmlessKeys)) {
      c.metadata_keys.push_back(key);
    }
  }
  absl::Status valid = c.Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", valid.message()));
  }
  return std::move(c);
}

absl::StatusOr<LlamaConfig> ParseObject(const Json& root, absl::string_view source) {
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected a JSON object at the top level, got ", root.type_name()));
  }
  FieldReader r(root, "", source);
  LlamaConfig c;

  SG_ASSIGN_OR_RETURN(const Family* family, ReadFamily(r));

  SG_ASSIGN_OR_RETURN(c.hidden_size, r.RequiredInt("hidden_size"));
  SG_ASSIGN_OR_RETURN(c.intermediate_size, r.RequiredInt("intermediate_size"));
  SG_ASSIGN_OR_RETURN(c.num_hidden_layers, r.RequiredInt("num_hidden_layers"));
  SG_ASSIGN_OR_RETURN(c.num_attention_heads, r.RequiredInt("num_attention_heads"));
  SG_ASSIGN_OR_RETURN(c.vocab_size, r.RequiredInt("vocab_size"));
  // The remaining fields take the reference implementation's defaults when absent, since
  // that is how the model would be run there.
  SG_ASSIGN_OR_RETURN(std::optional<int64_t> kv_heads, r.Int("num_key_value_heads"));
  c.num_key_value_heads = kv_heads.value_or(c.num_attention_heads);
  SG_ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, r.Int("head_dim"));
  if (head_dim.has_value()) {
    c.head_dim = *head_dim;
  } else if (c.num_attention_heads > 0) {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return r.Error("head_dim", absl::StrCat("absent, and hidden_size (", c.hidden_size,
                                              ") is not a multiple of num_attention_heads (",
                                              c.num_attention_heads, ")"));
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  SG_ASSIGN_OR_RETURN(std::optional<int64_t> max_pos, r.Int("max_position_embeddings"));
  c.max_position_embeddings = max_pos.value_or(2048);
  SG_ASSIGN_OR_RETURN(std::optional<double> eps, r.Number("rms_norm_eps"));
  c.rms_norm_eps = static_cast<float>(eps.value_or(1e-6));

  SG_ASSIGN_OR_RETURN(std::optional<bool> tie, r.Bool("tie_word_embeddings"));
  c.tie_word_embeddings = tie.value_or(family->tied_by_default);
  SG_ASSIGN_OR_RETURN(std::optional<bool> attention_bias, r.Bool("attention_bias"));
  c.attention_bias = attention_bias.value_or(false);
  SG_ASSIGN_OR_RETURN(std::optional<bool> mlp_bias, r.Bool("mlp_bias"));
  c.mlp_bias = mlp_bias.value_or(false);

  SG_RETURN_IF_ERROR(ReadFamilyFields(*family, r, c));
  // Phi-3's config class writes the rotary fraction at the top level.
  SG_ASSIGN_OR_RETURN(std::optional<double> partial, r.Number("partial_rotary_factor"));
  if (partial.has_value() && *partial != 1.0) {
    return r.Error("partial_rotary_factor",
                   absl::StrCat("unsupported value ", *partial, " (only 1.0 is supported)"));
  }
  SG_ASSIGN_OR_RETURN(std::optional<int64_t> tp, r.Int("pretraining_tp"));
  if (tp.has_value() && *tp != 1) {
    return r.Error("pretraining_tp", absl::StrCat("unsupported value ", *tp,
                                                  " (only 1 is supported: the sliced "
                                                  "projections round differently)"));
  }

  // Some converted checkpoints state the RoPE pairing; the reference ignores the key and
  // always pairs (i, i + d/2), so only that value can be run as its writer meant it.
  SG_ASSIGN_OR_RETURN(std::optional<bool> interleaved, r.Bool("rope_interleaved"));
  if (interleaved.value_or(false)) {
    return r.Error("rope_interleaved",
                   "unsupported value true (checkpoints in this format pair (i, i + d/2))");
  }

  // Older writers say "torch_dtype", newer ones "dtype".
  SG_ASSIGN_OR_RETURN(std::optional<std::string> torch_dtype, r.String("torch_dtype"));
  SG_ASSIGN_OR_RETURN(std::optional<std::string> dtype, r.String("dtype"));
  if (torch_dtype && dtype && *torch_dtype != *dtype) {
    return r.Error("dtype", absl::StrCat("\"", *dtype, "\" contradicts torch_dtype \"",
                                         *torch_dtype, "\""));
  }
  if (dtype) {
    SG_ASSIGN_OR_RETURN(c.dtype, ParseTorchDType(r, "dtype", *dtype));
  } else if (torch_dtype) {
    SG_ASSIGN_OR_RETURN(c.dtype, ParseTorchDType(r, "torch_dtype", *torch_dtype));
  } else {
    c.dtype = DType::kF32;
  }

  // RoPE: legacy "rope_theta" + "rope_scaling", or one "rope_parameters" object. When
  // both forms are present they must agree. Gemma 3 has one of each per kind of layer.
  if (family->model_type == "gemma3_text") {
    SG_RETURN_IF_ERROR(ReadGemma3Rope(r, source, c));
    return Finish(r, root, source, c);
  }
  SG_ASSIGN_OR_RETURN(std::optional<double> legacy_theta, r.Number("rope_theta"));
  SG_ASSIGN_OR_RETURN(std::optional<RopeSettings> legacy_scaling,
                      ReadRopeObject(r, "rope_scaling", false, source, "rope_scaling"));
  SG_ASSIGN_OR_RETURN(std::optional<RopeSettings> parameters,
                      ReadRopeObject(r, "rope_parameters", true, source, "rope_parameters"));
  SG_ASSIGN_OR_RETURN(const RopeSettings rope,
                      MergeRope(r, parameters, "rope_parameters", legacy_theta, "rope_theta",
                                legacy_scaling, 10000.0));
  c.rope_scaling = rope.scaling;
  c.rope_theta = static_cast<float>(*rope.theta);
  return Finish(r, root, source, c);
}

}  // namespace

absl::StatusOr<LlamaConfig> ParseLlamaConfig(absl::string_view json_text,
                                             absl::string_view source) {
  // nlohmann throws on malformed text and on some type errors; nothing may escape.
  try {
    Json root;
    SG_RETURN_IF_ERROR(ParseBoundedJson(json_text, kConfigJsonLimits, source, &root));
    return ParseObject(root, source);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(source, ": out of memory while parsing the config"));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
  }
}

absl::StatusOr<LlamaConfig> LoadLlamaConfig(const std::string& path) {
  SG_ASSIGN_OR_RETURN(const std::string text,
                      ReadSmallFile(path, kMaxConfigFileBytes, "config file"));
  return ParseLlamaConfig(text, path);
}

}  // namespace sg
