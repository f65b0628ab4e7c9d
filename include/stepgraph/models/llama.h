// Decode-step graphs of Llama and the dense families that differ from it in a few places
// (Mistral, Qwen2, Qwen3, Phi-3, Gemma, Gemma 2), written with the builder API, with weight
// names exactly as Hugging Face stores them. One description (LlamaConfig, with its family
// fields) and one builder: a family is data, not a copy of the builder (docs/models.md).
#ifndef STEPGRAPH_MODELS_LLAMA_H_
#define STEPGRAPH_MODELS_LLAMA_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "stepgraph/base/dtype.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/ops.h"
#include "stepgraph/graph/shard.h"
#include "stepgraph/graph/types.h"

namespace sg {

// The activation of the gated MLP: act(gate) · up.
enum class MlpActivation : uint8_t {
  kSilu,      // SwiGLU (Llama, Mistral, Qwen, Phi-3)
  kGeluTanh,  // GeGLU with PyTorch's gelu(approximate="tanh") (Gemma)
};

// The model description: the fields of a Hugging Face config.json (or a GGUF file's
// metadata) that shape the graph. The Llama fields come first; the family fields after
// them say what a layer has beyond Llama's, and their defaults are Llama's.
struct LlamaConfig {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // hidden_size / num_attention_heads unless given
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  ops::RopeScaling rope_scaling;
  // RoPE pairs (2i, 2i+1) instead of (i, i + d/2): GGUF files store Q and K permuted so.
  bool rope_interleaved = false;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q, k, v and o biases
  bool mlp_bias = false;
  DType dtype = DType::kF32;

  // ---- The family: what each layer has beyond Llama's (docs/models.md).
  // config.json's model_type or GGUF's general.architecture, for messages.
  std::string architecture = "llama";
  // q, k and v biases without an o bias (Qwen2).
  bool qkv_bias = false;
  // An RmsNorm of every q and k head over head_dim before RoPE, weights
  // "self_attn.q_norm.weight" and "self_attn.k_norm.weight" [head_dim] (Qwen3).
  bool qk_norm = false;
  // Gemma 2's four norms a layer: the attention's and the MLP's outputs are normed
  // ("post_attention_layernorm", "post_feedforward_layernorm") before their residual adds,
  // and the MLP's input by "pre_feedforward_layernorm".
  bool sandwich_norms = false;
  // Norms scale by (1 + w) (Gemma). The graph's norms scale by w: the loaders add the 1 to
  // every norm weight once, at load (docs/models.md says where that is exact).
  bool norm_plus_one = false;
  // Embeddings multiplied by √hidden_size rounded to dtype (Gemma).
  bool embedding_scale = false;
  MlpActivation activation = MlpActivation::kSilu;
  // The attention's score scale; 0 means 1/√head_dim (Gemma 2: query_pre_attn_scalar^-½).
  float attention_scale = 0.0f;
  // Soft-capping (0: none) of the attention scores and of the final logits (Gemma 2).
  float attn_logit_softcap = 0.0f;
  float final_logit_softcap = 0.0f;
  // Sliding-window attention over the last `sliding_window` positions (0: none), in every
  // layer, or in the layers `sliding_layers` marks (one entry per layer) when it is not
  // empty (Gemma 2 alternates; Qwen2 slides above max_window_layers).
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;
  // The RoPE base of the sliding-window layers, which then rotate without rope_scaling
  // (Gemma 3's local layers: 10,000 where the global ones take rope_theta, 1,000,000);
  // 0: every layer rotates by rope_theta and rope_scaling.
  float sliding_rope_theta = 0.0f;
  // Stored fused (Phi-3): "self_attn.qkv_proj.weight" [q + 2·kv, h] and
  // "mlp.gate_up_proj.weight" [2·intermediate, h]. The graph reads q/k/v_proj and
  // gate/up_proj; the loaders hand out the stored rows of each as views, without copies.
  bool fused_qkv = false;
  bool fused_gate_up = false;

  // ---- Mixture of experts (Mixtral, Qwen3-MoE). With num_experts > 0 the MLP of every
  // layer that `moe_layers` marks (all when it is empty) is routed: a router
  // "<moe_prefix>.gate.weight" [E, h] chooses experts_per_token of the E experts per token
  // (ops::MoeTopK), their weights are the softmax of the router's logits over the chosen
  // (`moe_renormalize`) or over all experts, and each expert is a gated MLP of
  // moe_intermediate_size whose matrices the graph reads stacked:
  // "<moe_prefix>.experts.{gate,up}_proj.weight" [E, i, h] and
  // "<moe_prefix>.experts.down_proj.weight" [E, h, i] (the loaders stack the per-expert
  // matrices of a folder; GGUF stores them so). Other layers keep the dense MLP.
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  int64_t moe_intermediate_size = 0;
  bool moe_renormalize = true;
  // The routing weights rounded to dtype before use (Qwen3-MoE), or kept in f32 (Mixtral).
  bool moe_round_weights = false;
  std::vector<bool> moe_layers;
  // Where a layer's router and experts live: "mlp" (Qwen3-MoE), "block_sparse_moe"
  // (Mixtral).
  std::string moe_prefix = "mlp";

  // Whether layer `layer` attends through the sliding window.
  bool SlidingLayer(int64_t layer) const {
    if (sliding_window <= 0) return false;
    return sliding_layers.empty() ||
           (layer >= 0 && layer < static_cast<int64_t>(sliding_layers.size()) &&
            sliding_layers[static_cast<size_t>(layer)]);
  }

  // Whether layer `layer`'s MLP is routed over experts.
  bool MoeLayer(int64_t layer) const {
    if (num_experts <= 0) return false;
    return moe_layers.empty() ||
           (layer >= 0 && layer < static_cast<int64_t>(moe_layers.size()) &&
            moe_layers[static_cast<size_t>(layer)]);
  }

  // Storage dtypes of single weights that differ from `dtype`, by name: GGUF block formats
  // for matrices that MatMul and Embedding read (a quantized model). Activations, the KV
  // cache and every other weight stay in `dtype`.
  absl::flat_hash_map<std::string, DType> weight_dtypes;
  // Whether any weight is stored in a block format (weight_dtypes).
  bool HasBlockWeights() const {
    for (const auto& [name, t] : weight_dtypes) {
      if (IsQuantized(t)) return true;
    }
    return false;
  }
  // Keys of config.json accepted as metadata (token ids, writer names, training-only
  // settings: nothing the computation reads), in file order, for the program's --verbose.
  std::vector<std::string> metadata_keys;

  // InvalidArgument naming the field when a value is out of range or inconsistent. Every
  // size is bounded by what a real model can have (the message says the bound and why),
  // so that nothing is sized from a config asking for terabytes.
  absl::Status Validate() const;
  // Bytes of all weights, each stored in `dtype` (weight_dtypes are not counted);
  // InvalidArgument when a product overflows.
  absl::StatusOr<int64_t> WeightBytes() const;
};

// A small Llama with the shape of the real thing, for the default model, tests and
// benchmarks.
LlamaConfig TinyLlamaConfig();
// Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 heads, 8 KV heads, intermediate 8192,
// vocab 128256, tied embeddings, llama3 RoPE scaling), bf16.
LlamaConfig Llama32_1BConfig();

// Llama-3.1-8B's shape (hidden 4096, 32 layers, 32 heads, 8 KV heads, intermediate 14336,
// vocab 128256, separate lm head, llama3 RoPE scaling) and Llama-3.1-70B's (hidden 8192,
// 80 layers, 64 heads, 8 KV heads, intermediate 28672), bf16.
LlamaConfig Llama31_8BConfig();
LlamaConfig Llama31_70BConfig();

// One step of the model: a decode step (one row per sequence) or a prefill step (T rows
// per sequence, one per token). Both are this one graph with different options.
struct LlamaGraphOptions {
  int64_t batch = 1;     // sequences B in the step
  int64_t slots = 0;     // KV cache slots; 0 means `batch`
  int64_t max_seq = 0;   // KV cache length S; 0 means max_position_embeddings
  // Rows per sequence T; the step has M = batch · T rows, each a token with its own
  // position. T > 1 is a prefill step: the sequences' KV cache slots come from a
  // "seq_slots" input [batch] (as they do whenever `seq_slots` is set), and attention is
  // causal among each sequence's rows and covers what its cache held.
  int64_t rows_per_seq = 1;
  // Rows address KV slots through "seq_slots" even at T = 1 (without it row i is slot i).
  bool seq_slots = false;
  // false: the step only fills the KV cache (a prefill chunk; the prompt's last token goes
  // through a decode step, which yields the first new id): no lm head and no token
  // choice, and the last layer stops after its KV write. The graph then has no outputs.
  bool logits = true;
  // Greedy (Argmax) when empty; otherwise Sample with these parameters and a "seeds" input.
  std::optional<ops::Sample> sampling;
  // Per-sequence penalties (ops::Penalize) between the logits and the choice, from the
  // inputs "penalty_params" [slots, ops::kPenaltyParams] f32 and "token_counts" [slots,
  // vocab] i32, and the chosen ids counted into "token_counts" (ops::CountIds). The logits
  // output stays the model's; "penalized_logits" [M, vocab] f32 is what was chosen from.
  bool penalties = false;
  // Closed decode loop: the step ends by copying the chosen ids into "ids" and advancing
  // "pos", so consecutive steps need no host writes. Decode steps only (T = 1, logits).
  bool closed_loop = false;
};

// Tensor names of the graph's step inputs and outputs.
inline constexpr char kIdsInput[] = "ids";
inline constexpr char kPosInput[] = "pos";
inline constexpr char kSeedsInput[] = "seeds";
inline constexpr char kSeqSlotsInput[] = "seq_slots";
inline constexpr char kLogitsOutput[] = "logits";
inline constexpr char kNextIdsOutput[] = "next_ids";
inline constexpr char kPenaltyParamsInput[] = "penalty_params";
inline constexpr char kTokenCountsInput[] = "token_counts";
inline constexpr char kPenalizedLogitsOutput[] = "penalized_logits";

// Name of layer `layer`'s key or value cache State.
std::string KCacheName(int64_t layer);
std::string VCacheName(int64_t layer);

// A step: ids[M], pos[M] (seeds[M] when sampling, seq_slots[B] for prefill) in; logits
// [M, vocab] and next_ids [M] out unless `logits` is false. Row r is token r % T of
// sequence r / T.
absl::StatusOr<Graph> BuildLlamaDecodeGraph(const LlamaConfig& config,
                                            const LlamaGraphOptions& options);

// How the model's weights and KV cache split over `ranks` ranks (tensor parallel;
// stepgraph/graph/shard.h, docs/parallel.md): q, k, v, gate and up by rows (whole heads per
// rank, KV heads too), o and down by columns (an AllReduce after each), the k and v caches
// by KV heads, o's and down's biases on the first rank, and a separate lm head by rows of
// its vocabulary when the vocabulary divides (its logits gathered before the token choice).
// The embedding, the norms and a tied lm head are held whole by every rank. Routed layers
// split every expert as the dense MLP splits (gate and up experts by their rows, down by
// its columns) and keep the router whole, so that every rank chooses the same experts; the
// AllReduce follows the routed sum. InvalidArgument saying why when the heads, KV heads,
// intermediate size (of a model with dense layers) or the experts' intermediate size do not
// divide by `ranks`.
absl::StatusOr<ShardPlan> LlamaShardPlan(const LlamaConfig& config, int ranks);

// FLOPs of prefilling `tokens` tokens into an empty cache, counted as the model defines
// them (every layer whole; the lm head is not part of prefill): 2 per multiply-add of the
// projections per token, and QKᵀ plus PV over the causal triangle.
double PrefillFlops(const LlamaConfig& config, int64_t tokens);

}  // namespace sg

#endif  // STEPGRAPH_MODELS_LLAMA_H_
