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
//                      the kRopeKvWrite epilogue (head_dim a multiple of 4)
//   gate_up_silu_mul   MatMul(gate), MatMul(up), SiluMul -> FusedMatMul with kSiluMul
//   residual_add       MatMul then Add(residual, ·) -> FusedMatMul with kAdd
//   norm_into_matmul   RmsNorm read only by matmuls -> each matmul normalises its input
//   lm_head_argmax     MatMul then Argmax -> FusedMatMul with kArgmax, when the logits are
//                      not a graph output (or are listed in PassOptions::unread_outputs)
//   elementwise_chain  Add, Mul, Silu and SiluMul nodes whose results only the next of
//                      them reads -> one FusedElementwise (on CUDA, one kernel compiled
//                      for the plan through NVRTC)
// Only matmuls without bias are fused, whose weights are f32/bf16/f16 of x's dtype or,
// with PassOptions::fuse_quantized, Weights in GGUF block formats (any mix of them).
#ifndef STEPGRAPH_GRAPH_PASSES_H_
#define STEPGRAPH_GRAPH_PASSES_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stepgraph/graph/graph.h"

namespace sg {

struct PassOptions {
  // False runs no pass at all.
  bool enabled = true;
  // Names of passes not to run (see PassNames()).
  absl::flat_hash_set<std::string> disabled;
  // Graph outputs the caller never reads: a pass may drop them (e.g. the logits, so that
  // the lm head and the argmax become one node).
  absl::flat_hash_set<std::string> unread_outputs;
  // Also fuse matmuls whose weights are in GGUF block formats (every format the loader
  // reads, mixed freely within a grouped matmul). The CPU reference and the mock run such
  // fused ops, bit for bit as the plain graph; the CUDA fused kernels take float weights
  // only, so this is off unless the caller runs on the CPU reference.
  bool fuse_quantized = false;
};

// The passes sessions and the program run unless told otherwise: every pass but
// norm_into_matmul. On an H100 (Llama-3.2-1B shape, bf16, batch 1, replayed, 2026-11-23)
// every pass took 1.26 ms per step, every pass but norm_into_matmul 1.18 ms, none 1.25
// ms: the folded norm's row scale, recomputed by every block of the matmul, costs more
// than the RmsNorm launches it saves. PassOptions{} itself runs every pass.
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
