// Graph passes: rewrites of a built Graph into an equivalent Graph, run between Build and
// Plan. Each pass has a name, runs by default and can be switched off (to debug a fusion,
// or to measure a step before and after). The fused ops they make are ordinary ops
// (ops::FusedMatMul, ops::RopeKvWrite, ops::FusedElementwise) whose definition is the
// plain ops they replace, so a fused graph computes what the plain graph computes.
//
// The passes, in the order they run:
//   qkv_rope_kv_write  q, k, v projections of one x -> one grouped FusedMatMul (three
//                      weight pointers in one launch; weights are not concatenated in
//                      memory), and Rope(q), Rope(k), KvWrite(k), KvWrite(v) -> RopeKvWrite
//   rope_kv_write_epilogue  that FusedMatMul and its RopeKvWrite -> one FusedMatMul with
//                      the kRopeKvWrite epilogue
//   gate_up_silu_mul   MatMul(gate), MatMul(up), SiluMul -> FusedMatMul with kSiluMul
//   moe_gate_up_silu_mul  the gate and up MoeMatMuls of one x and ids, then SiluMul ->
//                      one MoeMatMul with silu_mul
//   residual_add       MatMul then Add(residual, ·) -> FusedMatMul with kAdd
//   moe_combine_add    MoeCombine then Add(residual, ·) -> MoeCombine with the residual
//   moe_route_into_combine  MoeRouteWeights read only by MoeCombines of its ids -> each
//                      MoeCombine with `route` (the weights from the router's logits)
//   moe_down_into_combine  the down projection's MoeMatMul read only by its MoeCombine ->
//                      MoeCombine with `matmul` (the products summed where they are made),
//                      where the step has fewer (row, expert) pairs than experts (decode)
//   all_reduce_add     AllReduce then Add(residual, ·) -> AllReduce with the residual
//                      (tensor parallel: the sum of o's and down's partial sums)
//   norm_into_matmul   RmsNorm read only by matmuls -> each matmul normalises its input
//   lm_head_argmax     MatMul then Argmax -> FusedMatMul with kArgmax, when the logits are
//                      not a graph output (or are listed in PassOptions::unread_outputs)
//   elementwise_chain  Add, Mul, Silu and SiluMul nodes whose results only the next of
//                      them reads -> one FusedElementwise (on CUDA, one kernel compiled
//                      for the plan through NVRTC)
// Only matmuls without bias are fused (FusedMatMul takes none). A pass makes a node only
// where PassOptions::backend says it runs it (stepgraph/graph/op_support.h): the CUDA
// dispatcher, for one, answers no for quantized weights in a FusedMatMul and for the
// rope_kv_write epilogue with head_dim not a multiple of 4, and those nodes stay plain.
#ifndef STEPGRAPH_GRAPH_PASSES_H_
#define STEPGRAPH_GRAPH_PASSES_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/op_support.h"

namespace sg {

struct PassOptions {
  // False runs no pass at all.
  bool enabled = true;
  // Names of passes not to run (see PassNames()).
  absl::flat_hash_set<std::string> disabled;
  // Graph outputs the caller never reads: a pass may drop them (e.g. the logits, so that
  // the lm head and the argmax become one node).
  absl::flat_hash_set<std::string> unread_outputs;
  // The backend the graph is prepared for, asked before each node a pass makes (not owned;
  // must outlive RunPasses). Null: the CPU reference's answer, which runs every op.
  const OpSupport* backend = nullptr;
};

// The passes sessions and the program run unless told otherwise: every pass but
// norm_into_matmul and moe_down_into_combine. On an H100 (Llama-3.2-1B shape, bf16, batch
// 1, replayed, 2026-11-23) every pass took 1.26 ms per step, every pass but
// norm_into_matmul 1.18 ms, none 1.25 ms: the folded norm's row scale, recomputed by every
// block of the matmul, costs more than the RmsNorm launches it saves. On an H200
// (2026-12-02, a 12-layer Qwen3-30B-A3B-shaped Q4_K file, replayed) the step with
// moe_down_into_combine took 0.834 ms at position 100 and 0.865 at 1,000, without it 0.802
// and 0.837: the fused node's block stages all top_k slices of x where each pair's block
// staged one, and its 17 µs (eager) are more than the down experts' 8 and the combine's 5.
// PassOptions{} itself runs every pass.
PassOptions DefaultPassOptions();

// Every pass, in the order RunPasses runs them.
std::vector<std::string> PassNames();

// Runs the enabled passes in order; each result is validated. InvalidArgument for an
// unknown name in options.disabled.
absl::StatusOr<Graph> RunPasses(Graph graph, const PassOptions& options = {});

// One pass by name (NotFound for an unknown name).
absl::StatusOr<Graph> RunPass(absl::string_view name, Graph graph,
                              const PassOptions& options = {});

// Parses a command-line pass list: "default" (DefaultPassOptions), "all", "none", or a
// comma-separated list of pass names to run, or of pass names each prefixed with '-' to
// switch off from all ("-lm_head_argmax,-residual_add").
absl::StatusOr<PassOptions> ParsePassList(absl::string_view spec);

}  // namespace sg

#endif  // STEPGRAPH_GRAPH_PASSES_H_
