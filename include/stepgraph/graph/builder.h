// GraphBuilder: the C++ API models are written in. One call per node; each call infers
// the output's shape and dtype. Errors are sticky: the first one is kept (naming the node
// and tensors), later calls return invalid ids, and Build() returns it.
//
//   GraphBuilder b;
//   TensorId ids = b.Input("ids", DType::kI32, {1});
//   TensorId table = b.Weight("embed", DType::kBF16, {32000, 2048});
//   TensorId h = b.Embedding(table, ids, "embed_tokens");
//   ...
//   b.Output("logits", logits);
//   absl::StatusOr<Graph> graph = std::move(b).Build();
#ifndef STEPGRAPH_GRAPH_BUILDER_H_
#define STEPGRAPH_GRAPH_BUILDER_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/ops.h"
#include "stepgraph/graph/types.h"

namespace sg {

class GraphBuilder {
 public:
  GraphBuilder();
  GraphBuilder(const GraphBuilder&) = delete;
  GraphBuilder& operator=(const GraphBuilder&) = delete;

  // Tensors bound by the caller. Names are unique across all tensors of the graph.
  TensorId Input(absl::string_view name, DType dtype, Shape shape);
  TensorId Weight(absl::string_view name, DType dtype, Shape shape);
  TensorId State(absl::string_view name, DType dtype, Shape shape);

  // One method per op (see ops.h for semantics). `name` names the node and its output
  // tensor; empty picks "<op>_<n>".
  TensorId Embedding(TensorId table, TensorId ids, absl::string_view name = {});
  // A quantized table, dequantized to `dequant_dtype` (f32, bf16 or f16).
  TensorId Embedding(TensorId table, TensorId ids, DType dequant_dtype,
                     absl::string_view name = {});
  TensorId MatMul(TensorId x, TensorId w, absl::string_view name = {});
  TensorId MatMul(TensorId x, TensorId w, TensorId bias, absl::string_view name = {});
  TensorId RmsNorm(TensorId x, TensorId w, float eps, absl::string_view name = {});
  TensorId Add(TensorId a, TensorId b, absl::string_view name = {});
  TensorId Mul(TensorId a, TensorId b, absl::string_view name = {});
  TensorId Silu(TensorId x, absl::string_view name = {});
  TensorId SiluMul(TensorId gate, TensorId up, absl::string_view name = {});
  TensorId Rope(TensorId x, TensorId pos, const ops::Rope& params, absl::string_view name = {});
  // Writes kv into `cache` (a State) in place and returns `cache`.
  TensorId KvWrite(TensorId kv, TensorId pos, TensorId cache, absl::string_view name = {});
  // Scale 1/sqrt(head_dim).
  TensorId Attention(TensorId q, TensorId k_cache, TensorId v_cache, TensorId pos,
                     absl::string_view name = {});
  TensorId Attention(TensorId q, TensorId k_cache, TensorId v_cache, TensorId pos,
                     float scale, absl::string_view name = {});
  // The prefill forms: rows are B = seq_slots.size sequences of M / B rows, each sequence
  // in the KV cache slot seq_slots names (ops::KvWrite, ops::Attention).
  TensorId KvWrite(TensorId kv, TensorId pos, TensorId seq_slots, TensorId cache,
                   absl::string_view name = {});
  TensorId Attention(TensorId q, TensorId k_cache, TensorId v_cache, TensorId pos,
                     TensorId seq_slots, absl::string_view name = {});
  // Any form: `params` as given (scale 0 takes 1/sqrt(head_dim), has_slots is set from
  // whether `seq_slots` is a valid id).
  TensorId Attention(const ops::Attention& params, TensorId q, TensorId k_cache,
                     TensorId v_cache, TensorId pos, TensorId seq_slots,
                     absl::string_view name = {});
  TensorId Softmax(TensorId x, absl::string_view name = {});
  TensorId Argmax(TensorId x, absl::string_view name = {});
  TensorId Sample(TensorId logits, TensorId seeds, TensorId pos, const ops::Sample& params,
                  absl::string_view name = {});
  // Copies src into dst (an Input or State) in place and returns dst.
  // Per-sequence penalties, bias and min-p (ops::Penalize), and the count of the chosen ids
  // that feeds them (ops::CountIds, in place on `counts`).
  TensorId Penalize(TensorId logits, TensorId params, TensorId counts,
                    absl::string_view name = {});
  TensorId CountIds(TensorId ids, TensorId pos, TensorId counts, absl::string_view name = {});
  TensorId Copy(TensorId src, TensorId dst, absl::string_view name = {});
  // Advances positions (an Input or State) in place and returns them.
  TensorId Advance(TensorId pos, absl::string_view name = {});

  // Fused ops (made by the passes; see ops.h). `inputs` in the order ops::FusedMatMul
  // lists them.
  TensorId FusedMatMul(const ops::FusedMatMul& op, absl::Span<const TensorId> inputs,
                       absl::string_view name = {});
  // Returns the rotated q; writes k_cache and v_cache in place.
  TensorId RopeKvWrite(TensorId qkv, TensorId pos, TensorId k_cache, TensorId v_cache,
                       const ops::Rope& rope, absl::string_view name = {});
  // The same with every q and k head RmsNorm'd first (ops::RopeKvWrite's head_norm).
  TensorId RopeKvWrite(TensorId qkv, TensorId pos, TensorId k_cache, TensorId v_cache,
                       TensorId q_norm, TensorId k_norm, float eps, const ops::Rope& rope,
                       absl::string_view name = {});
  // The chain's last value over `inputs` (values 0 .. inputs.size()-1).
  TensorId FusedElementwise(const ops::FusedElementwise& op, absl::Span<const TensorId> inputs,
                            absl::string_view name = {});

  // Pieces of other model families (ops.h).
  TensorId HeadRmsNorm(TensorId x, TensorId w, float eps, absl::string_view name = {});
  TensorId GeluTanhMul(TensorId gate, TensorId up, absl::string_view name = {});
  TensorId Scale(TensorId x, float factor, absl::string_view name = {});
  TensorId Softcap(TensorId x, float cap, absl::string_view name = {});

  // Mixture of experts (ops.h): the routing, the chosen experts' matmul and their sum.
  TensorId MoeTopK(TensorId logits, int32_t top_k, absl::string_view name = {});
  TensorId MoeRouteWeights(TensorId logits, TensorId ids, const ops::MoeRouteWeights& params,
                           absl::string_view name = {});
  TensorId MoeMatMul(TensorId x, TensorId w, TensorId ids, absl::string_view name = {});
  // ops::MoeMatMul with silu_mul: SiluMul of the gate and up experts' products.
  TensorId MoeGateUpSiluMul(TensorId x, TensorId w_gate, TensorId w_up, TensorId ids,
                            absl::string_view name = {});
  TensorId MoeCombine(TensorId y, TensorId weights, TensorId ids, absl::string_view name = {});
  // ops::MoeCombine with residual: residual + the combined experts' outputs.
  TensorId MoeCombineAdd(TensorId y, TensorId weights, TensorId ids, TensorId residual,
                         absl::string_view name = {});
  // ops::MoeCombine with route: the weights MoeRouteWeights(logits, ids, route) computed
  // in the combine (and with a valid `residual`, added to it as MoeCombineAdd).
  TensorId MoeCombineRouted(TensorId y, TensorId logits, TensorId ids,
                            const ops::MoeRouteWeights& route, TensorId residual = {},
                            absl::string_view name = {});
  // ops::MoeCombine with matmul (and `op`'s route params): the combine of MoeMatMul(x, w,
  // ids) computed in the node (x [M, k·K]), its weights given or with op.route the
  // router's logits, and with a valid `residual` added to it. op.matmul and op.residual
  // are set here.
  TensorId MoeDownCombine(TensorId x, TensorId w, TensorId weights, TensorId ids,
                          ops::MoeCombine op, TensorId residual = {},
                          absl::string_view name = {});
  // Collectives over a group of `ranks` ranks (tensor parallel; docs/parallel.md).
  // With a valid `residual`: Add(residual, AllReduce(x)) in one node (ops.h).
  TensorId AllReduce(TensorId x, int32_t ranks, absl::string_view name = {},
                     TensorId residual = {});
  TensorId AllGather(TensorId x, int32_t ranks, absl::string_view name = {});

  // Marks `t` as a result the caller reads after a step. Output names are unique.
  void Output(absl::string_view name, TensorId t);

  // The first error so far, or OK.
  const absl::Status& status() const { return status_; }
  // The graph, or the first error. The builder is spent afterwards: later calls fail.
  absl::StatusOr<Graph> Build() &&;

 private:
  float DefaultAttentionScale(TensorId k_cache) const;
  TensorId Declare(absl::string_view name, TensorKind kind, DType dtype, Shape shape);
  TensorId AddNode(Op op, absl::string_view name, absl::Span<const TensorId> inputs);
  // Records `status` unless an error is already recorded; returns an invalid id.
  TensorId Fail(absl::Status status);
  bool CheckUsable(absl::string_view what);

  uint32_t owner_;
  bool built_ = false;
  absl::Status status_;
  std::vector<Tensor> tensors_;
  std::vector<Node> nodes_;
  std::vector<GraphOutput> outputs_;
  absl::flat_hash_set<std::string> tensor_names_;
  absl::flat_hash_set<std::string> output_names_;
  std::vector<int32_t> writer_of_;  // per tensor: the node writing it, or -1
  int auto_name_counter_ = 0;
};

}  // namespace sg

#endif  // STEPGRAPH_GRAPH_BUILDER_H_
