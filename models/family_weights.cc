// Fused matrices as row ranges, and (1 + w) norm weights.
#include "models/family_weights.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stepgraph/base/half.h"

namespace sg {

std::vector<FusedWeight> FusedWeights(const LlamaConfig& c) {
  std::vector<FusedWeight> out;
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim, i = c.intermediate_size;
  for (int64_t l = 0; l < c.num_hidden_layers && (c.fused_qkv || c.fused_gate_up); ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    if (c.fused_qkv) {
      out.push_back({p + "self_attn.qkv_proj.weight",
                     {{p + "self_attn.q_proj.weight", q},
                      {p + "self_attn.k_proj.weight", kv},
                      {p + "self_attn.v_proj.weight", kv}},
                     h});
    }
    if (c.fused_gate_up) {
      // transformers' Phi-3 MLP: gate, up = gate_up_proj(x).chunk(2): gate's rows first.
      out.push_back({p + "mlp.gate_up_proj.weight",
                     {{p + "mlp.gate_proj.weight", i}, {p + "mlp.up_proj.weight", i}},
                     h});
    }
  }
  return out;
}

absl::StatusOr<absl::Span<const std::byte>> FusedPart(const FusedWeight& fused, size_t part,
                                                      DType dtype,
                                                      absl::Span<const std::byte> data) {
  // The config's bounds keep these products far from overflow.
  const int64_t row_bytes = DTypeRowBytes(dtype, fused.cols);
  int64_t rows = 0, first = 0;
  for (size_t p = 0; p < fused.parts.size(); ++p) {
    if (p == part) first = rows;
    rows += fused.parts[p].rows;
  }
  if (row_bytes <= 0 || static_cast<int64_t>(data.size()) != rows * row_bytes ||
      part >= fused.parts.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", fused.stored, "' holds ", data.size(), " bytes, but the config needs [",
        rows, ", ", fused.cols, "] of ", DTypeName(dtype), " (", rows, " x ", row_bytes,
        " bytes) to split it into ", fused.parts.size(), " matrices"));
  }
  return data.subspan(static_cast<size_t>(first * row_bytes),
                      static_cast<size_t>(fused.parts[part].rows * row_bytes));
}

std::vector<StackedWeight> StackedWeights(const LlamaConfig& c) {
  std::vector<StackedWeight> out;
  const int64_t h = c.hidden_size, i = c.moe_intermediate_size;
  const bool mixtral = c.moe_prefix == "block_sparse_moe";
  struct Projection {
    const char* graph;
    const char* mixtral;
    int64_t rows, cols;
  };
  const Projection projections[] = {
      {"gate_proj", "w1", i, h}, {"up_proj", "w3", i, h}, {"down_proj", "w2", h, i}};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.MoeLayer(l)) continue;
    const std::string p = absl::StrCat("model.layers.", l, ".", c.moe_prefix, ".experts.");
    for (const Projection& proj : projections) {
      StackedWeight s{absl::StrCat(p, proj.graph, ".weight"), {}, proj.rows, proj.cols};
      for (int64_t e = 0; e < c.num_experts; ++e) {
        s.parts.push_back(absl::StrCat(p, e, ".", mixtral ? proj.mixtral : proj.graph, ".weight"));
      }
      out.push_back(std::move(s));
    }
  }
  return out;
}

bool IsNormWeight(absl::string_view name) { return absl::EndsWith(name, "norm.weight"); }

std::vector<std::byte> NormPlusOne(DType dtype, absl::Span<const std::byte> data,
                                   int64_t count) {
  std::vector<std::byte> out(data.begin(), data.end());
  for (int64_t i = 0; i < count; ++i) {
    StoreElement(out.data(), dtype, i, 1.0f + LoadElement(data.data(), dtype, i));
  }
  return out;
}

}  // namespace sg
