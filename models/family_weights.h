// What a model family stores differently from the weights its graph reads, shared by the
// safetensors and GGUF loaders: fused matrices whose row ranges are the graph's q/k/v and
// gate/up projections (Phi-3), handed out as views of the stored bytes, and Gemma's
// (1 + w) norm weights, which the graph's norms read with the 1 already added.
#ifndef STEPGRAPH_MODELS_FAMILY_WEIGHTS_H_
#define STEPGRAPH_MODELS_FAMILY_WEIGHTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "stepgraph/models/llama.h"

namespace sg {

// One stored matrix [Σ rows, cols] and the graph weights that are its consecutive row
// ranges, first part first.
struct FusedWeight {
  std::string stored;  // e.g. "model.layers.0.self_attn.qkv_proj.weight"
  struct Part {
    std::string name;  // e.g. "model.layers.0.self_attn.q_proj.weight"
    int64_t rows = 0;
  };
  std::vector<Part> parts;
  int64_t cols = 0;
};

// The fused matrices the config says the model stores (empty for most families).
std::vector<FusedWeight> FusedWeights(const LlamaConfig& c);

// The bytes of part `part` of `fused` inside `data`, the stored matrix of `dtype` (row
// ranges of whole rows, so block formats split too). InvalidArgument naming the tensor
// when `data` is not [Σ rows, cols] of that dtype.
absl::StatusOr<absl::Span<const std::byte>> FusedPart(const FusedWeight& fused, size_t part,
                                                      DType dtype,
                                                      absl::Span<const std::byte> data);

// A graph weight [E, rows, cols] that a folder stores as E matrices [rows, cols], one per
// expert: the experts of Mixtral and Qwen3-MoE, which GGUF stores stacked.
struct StackedWeight {
  std::string name;                // e.g. "model.layers.0.mlp.experts.gate_proj.weight"
  std::vector<std::string> parts;  // e.g. "model.layers.0.mlp.experts.3.gate_proj.weight"
  int64_t rows = 0;
  int64_t cols = 0;
};

// The stacked expert weights of the routed layers (empty for a dense model). The stored
// names are transformers': Mixtral's experts.{e}.w1 (gate), w3 (up) and w2 (down),
// Qwen3-MoE's experts.{e}.gate_proj, up_proj and down_proj.
std::vector<StackedWeight> StackedWeights(const LlamaConfig& c);

// Whether `name` is a norm weight the (1 + w) rule applies to (every RmsNorm weight of the
// graph: "...layernorm.weight", "...norm.weight").
bool IsNormWeight(absl::string_view name);

// `data` (`count` elements of float `dtype`) with 1 added to each, in f32, rounded back to
// `dtype`: exactly transformers' (1 + w.float()) in f32 (docs/models.md for half dtypes).
std::vector<std::byte> NormPlusOne(DType dtype, absl::Span<const std::byte> data,
                                   int64_t count);

}  // namespace sg

#endif  // STEPGRAPH_MODELS_FAMILY_WEIGHTS_H_
