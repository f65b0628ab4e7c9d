// The Llama step as a graph: embedding, per layer (RMSNorm, q/k/v projections, RoPE, KV
// cache write, attention, o projection, residual, RMSNorm, SwiGLU MLP, residual), final
// norm, lm head and the token choice. Decode and prefill steps are the same function:
// a prefill step has several rows (tokens) per sequence and the ops address KV slots by
// sequence.
#include "stepgraph/models/llama.h"

#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/base/status.h"

namespace sg {

namespace {

// Upper bounds of the config's sizes: each about 4 to 16 times what the largest published
// Llama-family models use, so that every real model passes while a config asking for
// terabytes (or a graph of a billion layers) is refused before anything is sized from it.
struct FieldBound {
  const char* field;
  int64_t max;
  const char* real;  // the most that published models have, for the message
};
constexpr FieldBound kHiddenSizeBound{"hidden_size", int64_t{1} << 16, "16384"};
constexpr FieldBound kIntermediateBound{"intermediate_size", int64_t{1} << 18, "53248"};
constexpr FieldBound kLayersBound{"num_hidden_layers", 1024, "126"};
constexpr FieldBound kHeadsBound{"num_attention_heads", 1024, "128"};
constexpr FieldBound kKvHeadsBound{"num_key_value_heads", 1024, "128"};
constexpr FieldBound kHeadDimBound{"head_dim", 1024, "256"};
constexpr FieldBound kVocabBound{"vocab_size", int64_t{1} << 24, "about 256000"};
constexpr FieldBound kMaxPositionBound{"max_position_embeddings", int64_t{1} << 26,
                                       "about 10 million"};
constexpr FieldBound kExpertsBound{"num_experts", 4096, "384"};
constexpr FieldBound kMoeIntermediateBound{"moe_intermediate_size", int64_t{1} << 18,
                                          "about 16384"};

absl::Status CheckField(const FieldBound& b, int64_t v) {
  if (v <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama config: ", b.field, " must be > 0, got ", v));
  }
  if (v > b.max) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama config: ", b.field, " = ", v, " is larger than ", b.max,
        ", the most stepgraph accepts (the largest real models have ", b.real,
        "; a larger value would only size memory that no device has)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LlamaConfig::Validate() const {
  SG_RETURN_IF_ERROR(CheckField(kHiddenSizeBound, hidden_size));
  SG_RETURN_IF_ERROR(CheckField(kIntermediateBound, intermediate_size));
  SG_RETURN_IF_ERROR(CheckField(kLayersBound, num_hidden_layers));
  SG_RETURN_IF_ERROR(CheckField(kHeadsBound, num_attention_heads));
  SG_RETURN_IF_ERROR(CheckField(kKvHeadsBound, num_key_value_heads));
  SG_RETURN_IF_ERROR(CheckField(kHeadDimBound, head_dim));
  SG_RETURN_IF_ERROR(CheckField(kVocabBound, vocab_size));
  SG_RETURN_IF_ERROR(CheckField(kMaxPositionBound, max_position_embeddings));
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
  if (sliding_window < 0 || sliding_window > kMaxPositionBound.max) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama config: sliding_window must be in [0, ", kMaxPositionBound.max, "], got ",
        sliding_window));
  }
  if (!sliding_layers.empty() &&
      static_cast<int64_t>(sliding_layers.size()) != num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama config: the per-layer attention types (layer_types) list ",
        sliding_layers.size(), " layers, but num_hidden_layers is ", num_hidden_layers));
  }
  for (const auto& [name, v] : {std::pair<const char*, float>{"attention scale", attention_scale},
                                {"attn_logit_softcapping", attn_logit_softcap},
                                {"final_logit_softcapping", final_logit_softcap}}) {
    if (!(v >= 0.0f) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("llama config: ", name, " must be finite and >= 0, got ", v));
    }
  }
  if (num_experts != 0) {
    SG_RETURN_IF_ERROR(CheckField(kExpertsBound, num_experts));
    SG_RETURN_IF_ERROR(CheckField(kMoeIntermediateBound, moe_intermediate_size));
    if (experts_per_token < 1 || experts_per_token > num_experts) {
      return absl::InvalidArgumentError(absl::StrCat(
          "llama config: num_experts_per_tok must be in [1, num_experts = ", num_experts,
          "], got ", experts_per_token));
    }
    if (mlp_bias) {
      return absl::InvalidArgumentError("llama config: mlp_bias with experts is not supported");
    }
    if (!moe_layers.empty() && static_cast<int64_t>(moe_layers.size()) != num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "llama config: the per-layer MoE list has ", moe_layers.size(),
          " layers, but num_hidden_layers is ", num_hidden_layers));
    }
    if (moe_prefix != "mlp" && moe_prefix != "block_sparse_moe") {
      return absl::InvalidArgumentError(absl::StrCat(
          "llama config: the experts' weight prefix must be \"mlp\" or \"block_sparse_moe\", "
          "got \"", moe_prefix, "\""));
    }
  }
  if (!(sliding_rope_theta >= 0.0f) || !std::isfinite(sliding_rope_theta)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama config: sliding_rope_theta must be finite and >= 0, got ", sliding_rope_theta));
  }
  if (!(rms_norm_eps > 0.0f) || !(rope_theta > 0.0f) || !std::isfinite(rms_norm_eps) ||
      !std::isfinite(rope_theta)) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama config: rms_norm_eps and rope_theta must be finite and > 0, got ",
                     rms_norm_eps, " and ", rope_theta));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> LlamaConfig::WeightBytes() const {
  // The bounds of Validate keep these far from overflow; every product is checked anyway,
  // since a caller may ask before validating.
  bool ok = true;
  auto mul = [&ok](int64_t a, int64_t b) {
    int64_t r = 0;
    ok = ok && CheckedMul(a, b, &r);
    return r;
  };
  auto add = [&ok](int64_t a, int64_t b) {
    int64_t r = 0;
    ok = ok && CheckedAdd(a, b, &r);
    return r;
  };
  const int64_t h = hidden_size, i = intermediate_size;
  const int64_t q = mul(num_attention_heads, head_dim), kv = mul(num_key_value_heads, head_dim);
  // Two norms, q and o (h x q each), k and v (h x kv each); the MLPs below.
  int64_t per_layer = add(add(mul(2, h), mul(2, mul(h, q))), mul(2, mul(h, kv)));
  if (attention_bias) per_layer = add(per_layer, add(add(q, mul(2, kv)), h));
  if (qkv_bias && !attention_bias) per_layer = add(per_layer, add(q, mul(2, kv)));
  if (qk_norm) per_layer = add(per_layer, mul(2, head_dim));
  if (sandwich_norms) per_layer = add(per_layer, mul(2, h));
  if (mlp_bias) per_layer = add(per_layer, add(mul(2, i), h));
  // Gate, up and down (h x i each) of a dense layer; the router (E x h) and E experts'
  // three (h x moe_i) of a routed one.
  const int64_t dense_mlp = mul(3, mul(h, i));
  const int64_t moe_mlp =
      add(mul(num_experts, h), mul(num_experts, mul(3, mul(h, moe_intermediate_size))));
  int64_t moe_count = 0;
  for (int64_t l = 0; l < num_hidden_layers && l < kLayersBound.max; ++l) moe_count += MoeLayer(l);
  const int64_t mlps = add(mul(num_hidden_layers - moe_count, dense_mlp), mul(moe_count, moe_mlp));
  const int64_t embed = mul(vocab_size, h);
  int64_t elems = add(add(add(mul(num_hidden_layers, per_layer), mlps), embed), h);
  if (!tie_word_embeddings) elems = add(elems, embed);
  const int64_t bytes = mul(elems, DTypeBytes(dtype));
  if (!ok || hidden_size < 0 || intermediate_size < 0 || num_hidden_layers < 0 ||
      vocab_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama config: the weights' size overflows 64 bits (hidden_size ", hidden_size,
        ", intermediate_size ", intermediate_size, ", num_hidden_layers ", num_hidden_layers,
        ", vocab_size ", vocab_size, ")"));
  }
  return bytes;
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

LlamaConfig Llama31_8BConfig() {
  LlamaConfig c = Llama32_1BConfig();
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.tie_word_embeddings = false;
  return c;
}

LlamaConfig Llama31_70BConfig() {
  LlamaConfig c = Llama31_8BConfig();
  c.hidden_size = 8192;
  c.intermediate_size = 28672;
  c.num_hidden_layers = 80;
  c.num_attention_heads = 64;
  return c;
}

absl::StatusOr<ShardPlan> LlamaShardPlan(const LlamaConfig& c, int ranks) {
  SG_RETURN_IF_ERROR(c.Validate());
  if (ranks < 1 || ranks > ops::kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel: ranks must be in [1, ",
                                                   ops::kMaxRanks, "], got ", ranks));
  }
  ShardPlan plan;
  if (ranks == 1) return plan;
  bool dense_layers = false;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) dense_layers = dense_layers || !c.MoeLayer(l);
  std::vector<std::pair<const char*, int64_t>> shares = {
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads}};
  if (dense_layers) shares.push_back({"intermediate_size", c.intermediate_size});
  if (c.num_experts > 0) shares.push_back({"moe_intermediate_size", c.moe_intermediate_size});
  for (const auto& [field, v] : shares) {
    if (v % ranks != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor parallel over ", ranks, " ranks: ", field, " (", v, ") does not divide by ",
          ranks, "; each rank holds an equal share of whole heads and of the MLP"));
    }
  }
  using K = ShardSpec::Kind;
  auto set = [&](const std::string& name, K kind, int dim) { plan.tensors[name] = {kind, dim}; };
  const bool qkv_bias = c.attention_bias || c.qkv_bias;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    for (const char* w : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}) {
      set(p + w + ".weight", K::kSplit, 0);
      if (qkv_bias) set(p + w + ".bias", K::kSplit, 0);
    }
    set(p + "self_attn.o_proj.weight", K::kSplit, 1);
    if (c.attention_bias) set(p + "self_attn.o_proj.bias", K::kFirstRank, 0);
    for (const char* w : {"mlp.gate_proj", "mlp.up_proj"}) {
      set(p + w + ".weight", K::kSplit, 0);
      if (c.mlp_bias) set(p + w + ".bias", K::kSplit, 0);
    }
    set(p + "mlp.down_proj.weight", K::kSplit, 1);
    if (c.mlp_bias) set(p + "mlp.down_proj.bias", K::kFirstRank, 0);
    if (c.MoeLayer(l)) {
      // Every expert split as the dense MLP is (its intermediate rows for gate and up, its
      // columns for down); the router stays whole, so every rank routes alike, and the
      // AllReduce follows the routed sum (MoeCombine).
      const std::string e = p + c.moe_prefix + ".experts.";
      set(e + "gate_proj.weight", K::kSplit, 1);
      set(e + "up_proj.weight", K::kSplit, 1);
      set(e + "down_proj.weight", K::kSplit, 2);
    }
    set(KCacheName(l), K::kSplit, 1);
    set(VCacheName(l), K::kSplit, 1);
  }
  if (!c.tie_word_embeddings && c.vocab_size % ranks == 0) {
    set("lm_head.weight", K::kSplit, 0);
  }
  return plan;
}

std::string KCacheName(int64_t layer) { return absl::StrCat("model.layers.", layer, ".k_cache"); }
std::string VCacheName(int64_t layer) { return absl::StrCat("model.layers.", layer, ".v_cache"); }

absl::StatusOr<Graph> BuildLlamaDecodeGraph(const LlamaConfig& c,
                                            const LlamaGraphOptions& options) {
  SG_RETURN_IF_ERROR(c.Validate());
  const int64_t seqs = options.batch;
  const int64_t per_seq = options.rows_per_seq;
  const int64_t slots = options.slots > 0 ? options.slots : seqs;
  const int64_t seq = options.max_seq > 0 ? options.max_seq : c.max_position_embeddings;
  int64_t m = 0;
  if (seqs <= 0 || per_seq <= 0 || !CheckedMul(seqs, per_seq, &m) || m > INT32_MAX ||
      slots < seqs || seq <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama graph: need batch > 0, rows_per_seq > 0 (batch * rows_per_seq rows in i32), "
        "slots >= batch and max_seq > 0; got batch=", seqs, " rows_per_seq=", per_seq,
        " slots=", slots, " max_seq=", seq));
  }
  if (options.closed_loop && (per_seq != 1 || !options.logits)) {
    return absl::InvalidArgumentError(
        "llama graph: a closed loop feeds each row's chosen id back as its next token, so it "
        "needs rows_per_seq = 1 and logits");
  }
  if (options.penalties && (per_seq != 1 || options.seq_slots || !options.logits)) {
    return absl::InvalidArgumentError(
        "llama graph: penalties read row i's parameters and counts from slot i, so they need "
        "the decode step's layout (rows_per_seq = 1, no seq_slots) and logits");
  }
  const bool by_slot = per_seq > 1 || options.seq_slots;
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
  const TensorId seq_slots = by_slot ? b.Input(kSeqSlotsInput, DType::kI32, {seqs}) : TensorId{};
  const std::string embed_name = "model.embed_tokens.weight";
  const TensorId embed = weight(embed_name, {c.vocab_size, h});
  TensorId x = IsQuantized(weight_dtype(embed_name))
                   ? b.Embedding(embed, ids, t, "model.embed_tokens")
                   : b.Embedding(embed, ids, "model.embed_tokens");
  if (c.embedding_scale) {
    // transformers: hidden_size ** 0.5 (a double) as a tensor of the activations' dtype.
    x = b.Scale(x, static_cast<float>(std::sqrt(static_cast<double>(h))), "model.embed_scale");
  }

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

  auto norm = [&](TensorId in, const std::string& name) {
    return b.RmsNorm(in, b.Weight(name + ".weight", t, {h}), c.rms_norm_eps, name);
  };
  const bool qkv_bias = c.attention_bias || c.qkv_bias;
  ops::Attention attention;
  attention.scale = c.attention_scale;  // 0: the builder's 1/sqrt(d)
  attention.softcap = c.attn_logit_softcap;

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    const TensorId n1 = norm(x, p + "input_layernorm");
    // A step without logits needs only the last layer's keys and values.
    const bool kv_only = !options.logits && l + 1 == c.num_hidden_layers;
    TensorId q = kv_only ? TensorId{} : linear(n1, p + "self_attn.q_proj", q_cols, h, qkv_bias);
    TensorId k = linear(n1, p + "self_attn.k_proj", kv_cols, h, qkv_bias);
    const TensorId v = linear(n1, p + "self_attn.v_proj", kv_cols, h, qkv_bias);
    if (c.qk_norm) {
      auto head_norm = [&](TensorId in, const std::string& name) {
        return b.HeadRmsNorm(in, b.Weight(name + ".weight", t, {d}), c.rms_norm_eps, name);
      };
      if (!kv_only) q = head_norm(q, p + "self_attn.q_norm");
      k = head_norm(k, p + "self_attn.k_norm");
    }
    // Gemma 3's local layers rotate by a base of their own, without scaling.
    ops::Rope layer_rope = rope;
    if (c.sliding_rope_theta > 0.0f && c.SlidingLayer(l)) {
      layer_rope.theta = c.sliding_rope_theta;
      layer_rope.scaling = ops::RopeScaling{};
    }
    if (!kv_only) q = b.Rope(q, pos, layer_rope, p + "self_attn.q_rope");
    k = b.Rope(k, pos, layer_rope, p + "self_attn.k_rope");
    TensorId kc = b.State(KCacheName(l), t, {slots, c.num_key_value_heads, seq, d});
    TensorId vc = b.State(VCacheName(l), t, {slots, c.num_key_value_heads, seq, d});
    if (by_slot) {
      kc = b.KvWrite(k, pos, seq_slots, kc, p + "self_attn.k_write");
      vc = b.KvWrite(v, pos, seq_slots, vc, p + "self_attn.v_write");
    } else {
      kc = b.KvWrite(k, pos, kc, p + "self_attn.k_write");
      vc = b.KvWrite(v, pos, vc, p + "self_attn.v_write");
    }
    // Nothing after the last KV write reaches the cache: a step without logits ends here.
    if (kv_only) break;
    attention.window = c.SlidingLayer(l) ? static_cast<int32_t>(c.sliding_window) : 0;
    const TensorId attn = b.Attention(attention, q, kc, vc, pos,
                                      by_slot ? seq_slots : TensorId{}, p + "self_attn.attention");
    TensorId o = linear(attn, p + "self_attn.o_proj", h, q_cols, c.attention_bias);
    if (c.sandwich_norms) o = norm(o, p + "post_attention_layernorm");
    x = b.Add(x, o, p + "attn_residual");
    const TensorId n2 = norm(x, c.sandwich_norms ? p + "pre_feedforward_layernorm"
                                                 : p + "post_attention_layernorm");
    auto activate = [&](TensorId gate, TensorId up, const std::string& name) {
      return c.activation == MlpActivation::kGeluTanh ? b.GeluTanhMul(gate, up, name)
                                                      : b.SiluMul(gate, up, name);
    };
    TensorId down;
    if (c.MoeLayer(l)) {
      // The router chooses; only the chosen experts' matrices are read (docs/ops.md).
      const std::string e = p + c.moe_prefix + ".";
      const int64_t experts = c.num_experts, inter = c.moe_intermediate_size;
      const TensorId logits = linear(n2, e + "gate", experts, h, false);
      const TensorId ids =
          b.MoeTopK(logits, static_cast<int32_t>(c.experts_per_token), e + "top_k");
      const TensorId route = b.MoeRouteWeights(
          logits, ids, {c.moe_renormalize, c.moe_round_weights}, e + "route_weights");
      auto experts_matmul = [&](TensorId in, const std::string& name, int64_t n, int64_t k) {
        return b.MoeMatMul(in, weight(e + "experts." + name + ".weight", {experts, n, k}), ids,
                           e + "experts." + name);
      };
      const TensorId act = activate(experts_matmul(n2, "gate_proj", inter, h),
                                    experts_matmul(n2, "up_proj", inter, h), e + "experts.act");
      down = b.MoeCombine(experts_matmul(act, "down_proj", h, inter), route, ids, e + "combine");
    } else {
      const TensorId gate = linear(n2, p + "mlp.gate_proj", c.intermediate_size, h, c.mlp_bias);
      const TensorId up = linear(n2, p + "mlp.up_proj", c.intermediate_size, h, c.mlp_bias);
      down = linear(activate(gate, up, p + "mlp.act"), p + "mlp.down_proj", h,
                    c.intermediate_size, c.mlp_bias);
    }
    if (c.sandwich_norms) down = norm(down, p + "post_feedforward_layernorm");
    x = b.Add(x, down, p + "mlp_residual");
  }
  if (!options.logits) return std::move(b).Build();
  x = norm(x, "model.norm");
  const TensorId head =
      c.tie_word_embeddings ? embed : weight("lm_head.weight", {c.vocab_size, h});
  TensorId logits = b.MatMul(x, head, "lm_head");
  if (c.final_logit_softcap > 0.0f) {
    logits = b.Softcap(logits, c.final_logit_softcap, "logit_softcap");
  }
  TensorId chosen_from = logits;
  TensorId counts;
  if (options.penalties) {
    const TensorId params =
        b.Input(kPenaltyParamsInput, DType::kF32, {slots, ops::kPenaltyParams});
    counts = b.Input(kTokenCountsInput, DType::kI32, {slots, c.vocab_size});
    chosen_from = b.Penalize(logits, params, counts, "penalize");
  }
  TensorId next;
  if (options.sampling.has_value()) {
    const TensorId seeds = b.Input(kSeedsInput, DType::kI32, {m});
    next = b.Sample(chosen_from, seeds, pos, *options.sampling, "sample");
  } else {
    next = b.Argmax(chosen_from, "argmax");
  }
  if (options.penalties) b.CountIds(next, pos, counts, "count_ids");
  b.Output(kLogitsOutput, logits);
  if (options.penalties) b.Output(kPenalizedLogitsOutput, chosen_from);
  b.Output(kNextIdsOutput, next);
  if (options.closed_loop) {
    b.Copy(next, ids, "feed_next_ids");
    b.Advance(pos, "advance_pos");
  }
  return std::move(b).Build();
}

double PrefillFlops(const LlamaConfig& c, int64_t tokens) {
  const double h = static_cast<double>(c.hidden_size);
  const double q = static_cast<double>(c.num_attention_heads * c.head_dim);
  const double kv = static_cast<double>(c.num_key_value_heads * c.head_dim);
  const double inter = static_cast<double>(c.intermediate_size);
  const double n = static_cast<double>(tokens);
  const double keys = n * (n + 1) / 2;
  double flops = 0.0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    // A routed layer computes its router and the chosen experts only.
    const double mlp = c.MoeLayer(l)
                           ? h * static_cast<double>(c.num_experts) +
                                 3 * h * static_cast<double>(c.moe_intermediate_size) *
                                     static_cast<double>(c.experts_per_token)
                           : 3 * h * inter;
    flops += 2 * (h * q + 2 * h * kv + q * h + mlp) * n + 4 * q * keys;
  }
  return flops;
}

}  // namespace sg
