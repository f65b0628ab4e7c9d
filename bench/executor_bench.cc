// The executor's own cost per node: Execute over MockDispatch with tracing off, so what is
// timed is checking the bindings, resolving each node's tensors and the dispatch call, not
// any kernel. Llama-3.2-1B's decode step and a generated 1,000-node DAG. "per_node" is
// seconds per node ("20n" reads 20 ns).
#include <benchmark/benchmark.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_graphs.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/dispatch/mock_dispatch.h"
#include "stepgraph/graph/memory_plan.h"

namespace sg::bench {
namespace {

// A plan with bindings the mock accepts. MockDispatch never reads tensor data, so every
// bound tensor points at one small buffer while declaring its full size: Llama-1B's weights
// and KV caches would otherwise need gigabytes. The arena is real.
class MockStep {
 public:
  explicit MockStep(absl::StatusOr<Graph> graph) {
    if (!graph.ok()) {
      status_ = graph.status();
      return;
    }
    absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(graph));
    if (!plan.ok()) {
      status_ = plan.status();
      return;
    }
    plan_.emplace(*std::move(plan));
    bindings_.emplace(plan_->graph());
    arena_.resize(plan_->arena_bytes() + 1);
    bindings_->SetArena(arena_.data(), plan_->arena_bytes());
    for (int32_t i = 0; i < plan_->graph().num_tensors(); ++i) {
      const Tensor& t = plan_->graph().tensors()[i];
      if (t.kind == TensorKind::kIntermediate) continue;
      status_ = bindings_->Bind(plan_->graph().id(i), placeholder_, t.bytes());
      if (!status_.ok()) return;
    }
    status_ = CheckBindings(*plan_, *bindings_);
  }

  const absl::Status& status() const { return status_; }
  const ExecutionPlan& plan() const { return *plan_; }
  const Bindings& bindings() const { return *bindings_; }

 private:
  absl::Status status_;
  std::optional<ExecutionPlan> plan_;
  std::optional<Bindings> bindings_;
  std::vector<std::byte> arena_;
  alignas(256) std::byte placeholder_[256] = {};
};

void RunExecute(benchmark::State& state, const MockStep& step) {
  if (!step.status().ok()) {
    state.SkipWithError(std::string(step.status().message()).c_str());
    return;
  }
  MockDispatch mock(/*record_trace=*/false);
  for (auto _ : state) {
    absl::StatusOr<ExecStats> stats = Execute(step.plan(), step.bindings(), mock);
    if (!stats.ok()) {
      state.SkipWithError(std::string(stats.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(stats);
  }
  const int nodes = step.plan().graph().num_nodes();
  if (mock.launches() != static_cast<int64_t>(state.iterations()) * nodes) {
    state.SkipWithError("launch count is not one per node");
    return;
  }
  state.counters["nodes"] = nodes;
  state.counters["per_node"] = benchmark::Counter(
      nodes, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void RunCheckBindings(benchmark::State& state, const MockStep& step) {
  if (!step.status().ok()) {
    state.SkipWithError(std::string(step.status().message()).c_str());
    return;
  }
  for (auto _ : state) {
    absl::Status s = CheckBindings(step.plan(), step.bindings());
    benchmark::DoNotOptimize(s);
  }
  const int nodes = step.plan().graph().num_nodes();
  state.counters["tensors"] = step.plan().graph().num_tensors();
  state.counters["per_node"] = benchmark::Counter(
      nodes, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

const MockStep& Llama1BStep() {
  static const MockStep* step =
      new MockStep(BuildLlamaDecodeGraph(Llama32_1BConfig(), Llama1BOptions()));
  return *step;
}
const MockStep& Generated1000Step() {
  static const MockStep* step = new MockStep(BuildGeneratedGraph(1000));
  return *step;
}

void BM_Execute_Llama1B(benchmark::State& state) { RunExecute(state, Llama1BStep()); }
BENCHMARK(BM_Execute_Llama1B);

void BM_Execute_Generated1000(benchmark::State& state) {
  RunExecute(state, Generated1000Step());
}
BENCHMARK(BM_Execute_Generated1000);

// The part of Execute that runs once per step rather than once per node.
void BM_CheckBindings_Llama1B(benchmark::State& state) {
  RunCheckBindings(state, Llama1BStep());
}
BENCHMARK(BM_CheckBindings_Llama1B);

void BM_CheckBindings_Generated1000(benchmark::State& state) {
  RunCheckBindings(state, Generated1000Step());
}
BENCHMARK(BM_CheckBindings_Generated1000);

}  // namespace
}  // namespace sg::bench

BENCHMARK_MAIN();
