// The Llama decode step as a graph: embedding, per layer (RMSNorm, q/k/v projections,
// RoPE, KV cache write, attention, o projection, residual, RMSNorm, SwiGLU MLP, residual),
// final norm, lm head and the token choice.
#include "models/llama.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "stepgraph/builder.h"
#include "stepgraph/status.h"

namespace sg {

absl::Status LlamaConfig::Validate() const {
  auto positive = [](absl::string_view field, int64_t v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("llama config: ", field, " must be > 0, got ", v));
  };
  SG_RETURN_IF_ERROR(positive("hidden_size", hidden_size));
  SG_RETURN_IF_ERROR(positive("intermediate_size", intermediate_size));
  SG_RETURN_IF_ERROR(positive("num_hidden_layers", num_hidden_layers));
  SG_RETURN_IF_ERROR(positive("num_attention_heads", num_attention_heads));
  SG_RETURN_IF_ERROR(positive("num_key_value_heads", num_key_value_heads));
  SG_RETURN_IF_ERROR(positive("head_dim", head_dim));
  SG_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  SG_RETURN_IF_ERROR(positive("max_position_embeddings", max_position_embeddings));
  if (num_attention_heads % num_key_value_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama config: num_attention_heads (", num_attention_heads,
        ") must be a multiple of num_key_value_heads (", num_key_value_heads, ")"));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama config: head_dim must be even for RoPE, got ", head_dim));
  }
  if (!IsFloat(dtype)) {
    return absl::InvalidArgumentError("llama config: torch_dtype must be a float type");
  }
  if (!(rms_norm_eps > 0.0f) || !(rope_theta > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama config: rms_norm_eps and rope_theta must be > 0, got ",
                     rms_norm_eps, " and ", rope_theta));
  }
  if (vocab_size > INT32_MAX) {
    return absl::InvalidArgumentError("llama config: vocab_size does not fit token ids (i32)");
  }
  return absl::OkStatus();
}

int64_t LlamaConfig::WeightBytes() const {
  const int64_t h = hidden_size, q = num_attention_heads * head_dim,
                kv = num_key_value_heads * head_dim, i = intermediate_size;
  int64_t per_layer = 2 * h + h * q + 2 * h * kv + q * h + 3 * h * i;
  if (attention_bias) per_layer += q + 2 * kv + h;
  if (mlp_bias) per_layer += 2 * i + h;
  int64_t elems = num_hidden_layers * per_layer + vocab_size * h + h;
  if (!tie_word_embeddings) elems += vocab_size * h;
  return elems * DTypeBytes(dtype);
}

LlamaConfig TinyLlamaConfig() {
  LlamaConfig c;
  c.hidden_size = 256;
  c.intermediate_size = 688;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.vocab_size = 1024;
  c.max_position_embeddings = 512;
  c.tie_word_embeddings = false;
  c.dtype = DType::kF32;
  return c;
}

LlamaConfig Llama32_1BConfig() {
  LlamaConfig c;
  c.hidden_size = 2048;
  c.intermediate_size = 8192;
  c.num_hidden_layers = 16;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 64;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 500000.0f;
  c.rope_scaling = {ops::RopeScaling::Type::kLlama3, 32.0f, 1.0f, 4.0f, 8192};
  c.vocab_size = 128256;
  c.max_position_embeddings = 131072;
  c.tie_word_embeddings = true;
  c.dtype = DType::kBF16;
  return c;
}

std::string KCacheName(int64_t layer) { return absl::StrCat("model.layers.", layer, ".k_cache"); }
std::string VCacheName(int64_t layer) { return absl::StrCat("model.layers.", layer, ".v_cache"); }

absl::StatusOr<Graph> BuildLlamaDecodeGraph(const LlamaConfig& c,
                                            const LlamaGraphOptions& options) {
  SG_RETURN_IF_ERROR(c.Validate());
  const int64_t m = options.batch;
  const int64_t slots = options.slots > 0 ? options.slots : m;
  const int64_t seq = options.max_seq > 0 ? options.max_seq : c.max_position_embeddings;
  if (m <= 0 || slots < m || seq <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama graph: need batch > 0, slots >= batch and max_seq > 0; got batch=", m,
        " slots=", slots, " max_seq=", seq));
  }
  const DType t = c.dtype;
  const int64_t h = c.hidden_size, d = c.head_dim;
  const int64_t q_cols = c.num_attention_heads * d, kv_cols = c.num_key_value_heads * d;

  GraphBuilder b;
  // A weight in `t` unless c.weight_dtypes names another storage dtype for it.
  auto weight_dtype = [&](const std::string& name) {
    auto it = c.weight_dtypes.find(name);
    return it == c.weight_dtypes.end() ? t : it->second;
  };
  auto weight = [&](const std::string& name, Shape shape) {
    return b.Weight(name, weight_dtype(name), shape);
  };
  const TensorId ids = b.Input(kIdsInput, DType::kI32, {m});
  const TensorId pos = b.Input(kPosInput, DType::kI32, {m});
  const std::string embed_name = "model.embed_tokens.weight";
  const TensorId embed = weight(embed_name, {c.vocab_size, h});
  TensorId x = IsQuantized(weight_dtype(embed_name))
                   ? b.Embedding(embed, ids, t, "model.embed_tokens")
                   : b.Embedding(embed, ids, "model.embed_tokens");

  ops::Rope rope;
  rope.head_dim = static_cast<int32_t>(d);
  rope.theta = c.rope_theta;
  rope.scaling = c.rope_scaling;
  rope.interleaved = c.rope_interleaved;

  // y = x·Wᵀ (+ bias) with the HF names "<prefix>.weight" and "<prefix>.bias".
  auto linear = [&](TensorId in, const std::string& prefix, int64_t out, int64_t k,
                    bool bias) {
    const TensorId w = weight(prefix + ".weight", {out, k});
    if (!bias) return b.MatMul(in, w, prefix);
    return b.MatMul(in, w, b.Weight(prefix + ".bias", t, {out}), prefix);
  };

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    const TensorId n1 = b.RmsNorm(x, b.Weight(p + "input_layernorm.weight", t, {h}),
                                  c.rms_norm_eps, p + "input_layernorm");
    TensorId q = linear(n1, p + "self_attn.q_proj", q_cols, h, c.attention_bias);
    TensorId k = linear(n1, p + "self_attn.k_proj", kv_cols, h, c.attention_bias);
    const TensorId v = linear(n1, p + "self_attn.v_proj", kv_cols, h, c.attention_bias);
    q = b.Rope(q, pos, rope, p + "self_attn.q_rope");
    k = b.Rope(k, pos, rope, p + "self_attn.k_rope");
    TensorId kc = b.State(KCacheName(l), t, {slots, c.num_key_value_heads, seq, d});
    TensorId vc = b.State(VCacheName(l), t, {slots, c.num_key_value_heads, seq, d});
    kc = b.KvWrite(k, pos, kc, p + "self_attn.k_write");
    vc = b.KvWrite(v, pos, vc, p + "self_attn.v_write");
    const TensorId attn = b.Attention(q, kc, vc, pos, p + "self_attn.attention");
    const TensorId o = linear(attn, p + "self_attn.o_proj", h, q_cols, c.attention_bias);
    x = b.Add(x, o, p + "attn_residual");
    const TensorId n2 = b.RmsNorm(x, b.Weight(p + "post_attention_layernorm.weight", t, {h}),
                                  c.rms_norm_eps, p + "post_attention_layernorm");
    const TensorId gate = linear(n2, p + "mlp.gate_proj", c.intermediate_size, h, c.mlp_bias);
    const TensorId up = linear(n2, p + "mlp.up_proj", c.intermediate_size, h, c.mlp_bias);
    const TensorId act = b.SiluMul(gate, up, p + "mlp.act");
    const TensorId down = linear(act, p + "mlp.down_proj", h, c.intermediate_size, c.mlp_bias);
    x = b.Add(x, down, p + "mlp_residual");
  }
  x = b.RmsNorm(x, b.Weight("model.norm.weight", t, {h}), c.rms_norm_eps, "model.norm");
  const TensorId head =
      c.tie_word_embeddings ? embed : weight("lm_head.weight", {c.vocab_size, h});
  const TensorId logits = b.MatMul(x, head, "lm_head");
  TensorId next;
  if (options.sampling.has_value()) {
    const TensorId seeds = b.Input(kSeedsInput, DType::kI32, {m});
    next = b.Sample(logits, seeds, pos, *options.sampling, "sample");
  } else {
    next = b.Argmax(logits, "argmax");
  }
  b.Output(kLogitsOutput, logits);
  b.Output(kNextIdsOutput, next);
  if (options.closed_loop) {
    b.Copy(next, ids, "feed_next_ids");
    b.Advance(pos, "advance_pos");
  }
  return std::move(b).Build();
}

}  // namespace sg
