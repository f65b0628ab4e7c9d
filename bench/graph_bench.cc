// Host-side cost of getting a decode step ready: building the graph, validating it and
// planning its memory. Llama-3.2-1B's shape (16 layers, 276 nodes) and a generated
// 1,000-node DAG; each stage alone and all together. "per_node" counters are seconds per
// node (so "1.2u" reads 1.2 µs).
#include <benchmark/benchmark.h>

#include <string>
#include <utility>

#include "bench/bench_graphs.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/memory_plan.h"

namespace sg::bench {
namespace {

void SetPerNode(benchmark::State& state, int nodes) {
  state.counters["nodes"] = nodes;
  state.counters["per_node"] = benchmark::Counter(
      nodes, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// Reports a failure instead of timing a broken graph.
template <typename T>
bool Check(benchmark::State& state, const absl::StatusOr<T>& v) {
  if (v.ok()) return true;
  state.SkipWithError(std::string(v.status().message()).c_str());
  return false;
}

absl::StatusOr<Graph> Llama1B() {
  return BuildLlamaDecodeGraph(Llama32_1BConfig(), Llama1BOptions());
}

void BM_Llama1B_Build(benchmark::State& state) {
  int nodes = 0;
  for (auto _ : state) {
    absl::StatusOr<Graph> g = Llama1B();
    if (!Check(state, g)) return;
    nodes = g->num_nodes();
    benchmark::DoNotOptimize(g);
  }
  SetPerNode(state, nodes);
}
BENCHMARK(BM_Llama1B_Build)->Unit(benchmark::kMicrosecond);

void BM_Llama1B_Validate(benchmark::State& state) {
  const absl::StatusOr<Graph> g = Llama1B();
  if (!Check(state, g)) return;
  for (auto _ : state) {
    absl::Status s = g->Validate();
    benchmark::DoNotOptimize(s);
  }
  SetPerNode(state, g->num_nodes());
}
BENCHMARK(BM_Llama1B_Validate)->Unit(benchmark::kMicrosecond);

void BM_Llama1B_PlanMemory(benchmark::State& state) {
  const absl::StatusOr<Graph> g = Llama1B();
  if (!Check(state, g)) return;
  for (auto _ : state) {
    MemoryPlan plan = *PlanMemory(*g);
    benchmark::DoNotOptimize(plan);
  }
  SetPerNode(state, g->num_nodes());
}
BENCHMARK(BM_Llama1B_PlanMemory)->Unit(benchmark::kMicrosecond);

// ExecutionPlan::Create (validate + plan) takes the graph by value; the copy it consumes is
// made outside the timed region.
void BM_Llama1B_CreatePlan(benchmark::State& state) {
  const absl::StatusOr<Graph> g = Llama1B();
  if (!Check(state, g)) return;
  for (auto _ : state) {
    state.PauseTiming();
    Graph copy = *g;
    state.ResumeTiming();
    absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(std::move(copy));
    if (!Check(state, plan)) return;
    benchmark::DoNotOptimize(plan);
  }
  SetPerNode(state, g->num_nodes());
}
BENCHMARK(BM_Llama1B_CreatePlan)->Unit(benchmark::kMicrosecond);

void BM_Llama1B_BuildAndPlan(benchmark::State& state) {
  int nodes = 0;
  for (auto _ : state) {
    absl::StatusOr<Graph> g = Llama1B();
    if (!Check(state, g)) return;
    nodes = g->num_nodes();
    absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(g));
    if (!Check(state, plan)) return;
    benchmark::DoNotOptimize(plan);
  }
  SetPerNode(state, nodes);
}
BENCHMARK(BM_Llama1B_BuildAndPlan)->Unit(benchmark::kMicrosecond);

// The generated DAG, by node count (1,000 is the target size).
void BM_Generated_Build(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  for (auto _ : state) {
    absl::StatusOr<Graph> g = BuildGeneratedGraph(n);
    if (!Check(state, g)) return;
    benchmark::DoNotOptimize(g);
  }
  SetPerNode(state, n);
}
BENCHMARK(BM_Generated_Build)->Arg(1000)->Unit(benchmark::kMicrosecond);

void BM_Generated_Validate(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const absl::StatusOr<Graph> g = BuildGeneratedGraph(n);
  if (!Check(state, g)) return;
  for (auto _ : state) {
    absl::Status s = g->Validate();
    benchmark::DoNotOptimize(s);
  }
  SetPerNode(state, n);
}
BENCHMARK(BM_Generated_Validate)->Arg(1000)->Unit(benchmark::kMicrosecond);

void BM_Generated_PlanMemory(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const absl::StatusOr<Graph> g = BuildGeneratedGraph(n);
  if (!Check(state, g)) return;
  for (auto _ : state) {
    MemoryPlan plan = *PlanMemory(*g);
    benchmark::DoNotOptimize(plan);
  }
  state.counters["arena_bytes"] = static_cast<double>(PlanMemory(*g)->arena_bytes);
  SetPerNode(state, n);
}
BENCHMARK(BM_Generated_PlanMemory)->Arg(1000)->Arg(4000)->Arg(16000)->Unit(benchmark::kMicrosecond);

void BM_Generated_BuildValidatePlan(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  for (auto _ : state) {
    absl::StatusOr<Graph> g = BuildGeneratedGraph(n);
    if (!Check(state, g)) return;
    absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(g));
    if (!Check(state, plan)) return;
    benchmark::DoNotOptimize(plan);
  }
  SetPerNode(state, n);
}
BENCHMARK(BM_Generated_BuildValidatePlan)->Arg(1000)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace sg::bench

BENCHMARK_MAIN();
