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
  } else {
    return r.Error(type_key, absl::StrCat("unsupported value \"", type,
                                          "\" (stepgraph supports \"default\" and \"llama3\")"));
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

absl::StatusOr<LlamaConfig> ParseObject(const Json& root, absl::string_view source) {
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected a JSON object at the top level, got ", root.type_name()));
  }
  FieldReader r(root, "", source);
  LlamaConfig c;

  SG_ASSIGN_OR_RETURN(std::optional<std::string> model_type, r.String("model_type"));
  if (model_type.has_value() && *model_type != "llama") {
    return r.Error("model_type", absl::StrCat("unsupported value \"", *model_type,
                                              "\" (stepgraph runs \"llama\")"));
  }
  if (const Json* arch = r.Get("architectures")) {
    if (!arch->is_array() || arch->empty()) {
      return r.Error("architectures",
                     absl::StrCat("expected a non-empty list of strings, got ", Render(*arch)));
    }
    for (const Json& a : *arch) {
      if (!a.is_string() || a.get<std::string>() != "LlamaForCausalLM") {
        return r.Error("architectures", absl::StrCat("unsupported value ", Render(a),
                                                     " (stepgraph runs \"LlamaForCausalLM\")"));
      }
    }
  }

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
  c.tie_word_embeddings = tie.value_or(false);
  SG_ASSIGN_OR_RETURN(std::optional<bool> attention_bias, r.Bool("attention_bias"));
  c.attention_bias = attention_bias.value_or(false);
  SG_ASSIGN_OR_RETURN(std::optional<bool> mlp_bias, r.Bool("mlp_bias"));
  c.mlp_bias = mlp_bias.value_or(false);

  SG_ASSIGN_OR_RETURN(std::optional<std::string> act, r.String("hidden_act"));
  if (act.has_value() && *act != "silu") {
    return r.Error("hidden_act",
                   absl::StrCat("unsupported value \"", *act, "\" (stepgraph supports \"silu\")"));
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
  // both forms are present they must agree.
  SG_ASSIGN_OR_RETURN(std::optional<double> legacy_theta, r.Number("rope_theta"));
  std::optional<RopeSettings> legacy_scaling, parameters;
  if (const Json* v = r.Get("rope_scaling")) {
    if (!v->is_object()) {
      return r.Error("rope_scaling",
                     absl::StrCat("expected an object or null, got ", TypeName(*v), " ", Render(*v)));
    }
    SG_ASSIGN_OR_RETURN(legacy_scaling, ParseRopeObject(*v, "rope_scaling", false, source));
  }
  if (const Json* v = r.Get("rope_parameters")) {
    if (!v->is_object()) {
      return r.Error("rope_parameters",
                     absl::StrCat("expected an object, got ", TypeName(*v), " ", Render(*v)));
    }
    SG_ASSIGN_OR_RETURN(parameters, ParseRopeObject(*v, "rope_parameters", true, source));
  }
  double theta = 10000.0;
  if (parameters.has_value()) {
    if (parameters->theta.has_value()) theta = *parameters->theta;
    if (legacy_theta.has_value() && parameters->theta.has_value() &&
        *legacy_theta != *parameters->theta) {
      return r.Error("rope_theta", absl::StrCat(*legacy_theta,
                                                " contradicts rope_parameters.rope_theta ",
                                                *parameters->theta));
    }
    if (legacy_theta.has_value() && !parameters->theta.has_value()) theta = *legacy_theta;
    if (legacy_scaling.has_value() && !SameScaling(legacy_scaling->scaling, parameters->scaling)) {
      return r.Error("rope_scaling", "contradicts rope_parameters");
    }
    c.rope_scaling = parameters->scaling;
  } else {
    if (legacy_theta.has_value()) theta = *legacy_theta;
    if (legacy_scaling.has_value()) c.rope_scaling = legacy_scaling->scaling;
  }
  c.rope_theta = static_cast<float>(theta);

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
  return c;
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
