// `stepgraph graph`: the decode step's graph summary (nodes, launches, arena, weight and KV
// cache bytes) and, with --dot, the graph as Graphviz DOT. Needs no weights.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stepgraph/base/status.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/graph/passes.h"
#include "stepgraph/graph/shard.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/runtime/step_runner.h"
#include "tools/commands.h"
#include "tools/console.h"
#include "tools/model_setup.h"

namespace sg::cli {

int GraphCommand(const Options& o) {
  absl::StatusOr<LlamaConfig> config = ModelConfig(o);
  if (!config.ok()) return ModelFailure(o, config.status());
  LlamaGraphOptions g;
  g.batch = o.batch;
  g.max_seq = o.max_seq > 0 ? o.max_seq : std::min<int64_t>(config->max_position_embeddings, 4096);
  g.closed_loop = true;
  // The graph of the backend `run` would use: the GPU's unless --cpu or a build without
  // CUDA (its fusions are the ones its kernels take; no device is needed to ask).
  RunnerOptions runner;
  runner.device = o.cpu || !BuiltWithCuda() ? DeviceKind::kCpu : DeviceKind::kCuda;
  absl::StatusOr<std::unique_ptr<OpSupport>> support = OpSupportFor(runner);
  if (!support.ok()) return ModelFailure(o, support.status());
  PassOptions passes = o.passes;
  passes.backend = support->get();
  absl::StatusOr<Graph> graph = BuildLlamaDecodeGraph(*config, g);
  // One rank's graph of a model sharded over --tp ranks (docs/parallel.md).
  const int ranks = static_cast<int>(std::max<int64_t>(o.tensor_parallel, 1));
  if (graph.ok() && ranks > 1) {
    absl::StatusOr<ShardPlan> plan = LlamaShardPlan(*config, ranks);
    if (!plan.ok()) return UsageFailure(plan.status().message(), kGraph);
    graph = ShardGraph(*graph, *plan, ranks);
  }
  if (graph.ok()) graph = RunPasses(*std::move(graph), passes);
  if (!graph.ok()) return ModelFailure(o, graph.status());
  absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*graph);
  if (!plan.ok()) return ModelFailure(o, plan.status());

  std::map<std::string, int> ops;
  for (const Node& node : graph->nodes()) ++ops[std::string(OpName(node.op))];
  std::vector<std::string> op_counts;
  for (const auto& [op, count] : ops) op_counts.push_back(absl::StrCat(op, " x", count));
  int64_t kv_bytes = 0, rank_weight_bytes = 0;
  for (const Tensor& t : graph->tensors()) {
    if ((t.kind == TensorKind::kState && !CheckedAdd(kv_bytes, t.bytes(), &kv_bytes)) ||
        (t.kind == TensorKind::kWeight &&
         !CheckedAdd(rank_weight_bytes, t.bytes(), &rank_weight_bytes))) {
      return ModelFailure(o, absl::InvalidArgumentError("the model's size overflows 64 bits"));
    }
  }
  const LlamaConfig& c = *config;
  absl::StatusOr<int64_t> weight_bytes = c.WeightBytes();
  if (!weight_bytes.ok()) return ModelFailure(o, weight_bytes.status());
  if (ranks > 1) weight_bytes = rank_weight_bytes;
  std::printf("model: %s: hidden %lld, %lld layers, %lld heads (%lld KV), head_dim %lld, "
              "vocab %lld, %s\n",
              ModelName(o).c_str(), static_cast<long long>(c.hidden_size),
              static_cast<long long>(c.num_hidden_layers),
              static_cast<long long>(c.num_attention_heads),
              static_cast<long long>(c.num_key_value_heads), static_cast<long long>(c.head_dim),
              static_cast<long long>(c.vocab_size), std::string(DTypeName(c.dtype)).c_str());
  std::printf("graph: batch %lld, %d nodes, %d tensors; %d launches per eager step, 1 graph "
              "launch per replayed step (as the %s backend fuses it)\n",
              static_cast<long long>(o.batch), graph->num_nodes(), graph->num_tensors(),
              graph->num_nodes(), std::string(DeviceKindName(runner.device)).c_str());
  if (ranks > 1) {
    std::printf("tensor parallel: the graph of each of %d ranks; weights and KV cache below "
                "are a rank's\n",
                ranks);
  }
  std::printf("ops: %s\n", absl::StrJoin(op_counts, ", ").c_str());
  const MemoryPlan& m = plan->memory();
  std::printf("arena: %s for %s of intermediates (%.1fx reuse)\n", Bytes(m.arena_bytes).c_str(),
              Bytes(m.intermediate_bytes).c_str(),
              m.arena_bytes > 0 ? static_cast<double>(m.intermediate_bytes) / m.arena_bytes : 0.0);
  // What one step reads of them: an untied embedding's rows, a mixture's reachable experts.
  const int64_t step_bytes = StepWeightBytes(*graph);
  const bool part = step_bytes < rank_weight_bytes / 100 * 99;
  std::printf("weights: %s%s%s; KV cache: %s (%lld positions x %lld sequence(s))\n",
              Bytes(*weight_bytes).c_str(), part ? ", a step reads " : "",
              part ? Bytes(step_bytes).c_str() : "", Bytes(kv_bytes).c_str(),
              static_cast<long long>(g.max_seq), static_cast<long long>(o.batch));
  if (!o.dot.empty()) {
    std::ofstream out(o.dot);
    out << graph->ToDot();
    out.close();
    if (!out) {
      return Failure(absl::UnavailableError(absl::StrCat("cannot write ", o.dot)),
                     "--dot FILE needs a file that can be written");
    }
    std::printf("dot: wrote %s\n", o.dot.c_str());
  }
  return kExitOk;
}

}  // namespace sg::cli
