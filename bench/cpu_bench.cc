// The CPU reference's decode step on SmolLM2-135M's shape (hidden 576, intermediate 1536,
// 30 layers, 9 heads, 3 KV heads, head_dim 64, vocab 49152, tied embeddings), with
// deterministic random weights, in f32 and with Q4_1 matrices (the embedding, also the lm
// head, in Q8_0, as in the Q4_1 GGUF file of that model). One iteration is one closed-loop
// step at batch 1 from context position 100 on, by CpuDispatch with 1 or 2 threads.
//
// Reported: real time per step ("ms per token"), and weight_GBps, the bytes of weights the
// step reads divided by its time, beside copy_GBps, a 256 MiB memcpy timed in the same run
// (counted as bytes read plus written), the ceiling a step that only streams its weights
// could approach. bench/cpu_torch_peer.py runs this program and PyTorch on the same shape.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "stepgraph/models/llama.h"
#include "models/random_weights.h"
#include "stepgraph/dispatch/cpu_dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/graph/memory_plan.h"

namespace sg {
namespace {

constexpr int64_t kMaxSeq = 512;
constexpr int32_t kStartPos = 100;

LlamaConfig SmolLM2Config(bool quantized) {
  LlamaConfig c;
  c.hidden_size = 576;
  c.intermediate_size = 1536;
  c.num_hidden_layers = 30;
  c.num_attention_heads = 9;
  c.num_key_value_heads = 3;
  c.head_dim = 64;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 100000.0f;
  c.vocab_size = 49152;
  c.max_position_embeddings = 8192;
  c.tie_word_embeddings = true;
  c.dtype = DType::kF32;
  if (quantized) {
    const Graph g = BuildLlamaDecodeGraph(c, {.max_seq = kMaxSeq}).value();
    for (const Tensor& t : g.tensors()) {
      if (t.kind != TensorKind::kWeight || t.shape.rank() != 2) continue;
      c.weight_dtypes[t.name] =
          t.name == "model.embed_tokens.weight" ? DType::kQ8_0 : DType::kQ4_1;
    }
  }
  return c;
}

// One model's plan, weights, caches and step inputs, built once per process.
struct Step {
  std::optional<ExecutionPlan> plan;
  std::optional<RandomWeights> weights;
  std::optional<Bindings> bindings;
  std::vector<std::byte> arena;
  std::vector<std::vector<std::byte>> states;
  int32_t ids = 1, pos = kStartPos;
  int64_t weight_bytes = 0;
};

absl::Status Build(bool quantized, Step& s) {
  absl::StatusOr<Graph> g = BuildLlamaDecodeGraph(
      SmolLM2Config(quantized), {.max_seq = kMaxSeq, .closed_loop = true});
  if (!g.ok()) return g.status();
  absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(g));
  if (!plan.ok()) return plan.status();
  s.plan.emplace(*std::move(plan));
  const Graph& graph = s.plan->graph();
  absl::StatusOr<RandomWeights> w = RandomWeights::Create(graph, 1);
  if (!w.ok()) return w.status();
  s.weights.emplace(*std::move(w));
  s.bindings.emplace(graph);
  if (absl::Status st = s.weights->Bind(graph, *s.bindings); !st.ok()) return st;
  for (const BufferLayout::Entry& e : s.weights->layout().entries) s.weight_bytes += e.bytes;
  s.arena.resize(static_cast<size_t>(s.plan->arena_bytes()));
  s.bindings->SetArena(s.arena.data(), static_cast<int64_t>(s.arena.size()));
  for (int32_t i = 0; i < graph.num_tensors(); ++i) {
    const Tensor& t = graph.tensors()[i];
    if (t.kind != TensorKind::kState) continue;
    s.states.emplace_back(static_cast<size_t>(t.bytes()), std::byte{0});
    if (absl::Status st = s.bindings->Bind(graph.id(i), s.states.back().data(), t.bytes());
        !st.ok()) {
      return st;
    }
  }
  if (absl::Status st = s.bindings->Bind(kIdsInput, &s.ids, sizeof(s.ids)); !st.ok()) return st;
  if (absl::Status st = s.bindings->Bind(kPosInput, &s.pos, sizeof(s.pos)); !st.ok()) return st;
  return CheckBindings(*s.plan, *s.bindings);
}

Step* GetStep(bool quantized, absl::Status* status) {
  static std::map<bool, std::unique_ptr<Step>> steps;
  auto& s = steps[quantized];
  if (s == nullptr) {
    s = std::make_unique<Step>();
    *status = Build(quantized, *s);
  }
  return s.get();
}

double CopyBytesPerSecond() {
  static double rate = [] {
    constexpr size_t kBytes = size_t{256} << 20;
    std::vector<char> a(kBytes, 1), b(kBytes, 2);
    double best = 1e30;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      std::memcpy(b.data(), a.data(), kBytes);
      benchmark::DoNotOptimize(b.data());
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      std::swap(a, b);
    }
    return 2.0 * kBytes / best;
  }();
  return rate;
}

// Args: {quantized (0 f32, 1 Q4_1), threads}.
void BM_CpuDecodeStep(benchmark::State& state) {
  absl::Status status;
  Step* s = GetStep(state.range(0) != 0, &status);
  if (!status.ok()) {
    state.SkipWithError(std::string(status.message()).c_str());
    return;
  }
  CpuDispatch cpu(CpuDispatch::Options{.threads = static_cast<int>(state.range(1))});
  absl::StatusOr<PreparedPlan> prepared = cpu.Prepare(*s->plan);
  if (!prepared.ok()) {
    state.SkipWithError(std::string(prepared.status().message()).c_str());
    return;
  }
  s->pos = kStartPos;
  for (auto _ : state) {
    absl::StatusOr<ExecStats> st = Execute(*prepared, *s->bindings, cpu);
    if (!st.ok()) {
      state.SkipWithError(std::string(st.status().message()).c_str());
      return;
    }
    if (s->pos >= kMaxSeq - 1) s->pos = kStartPos;  // stale cache rows only cost time
  }
  const double copy = CopyBytesPerSecond();
  // Weight bytes per step, as a rate over the real time: GB/s.
  state.counters["weight_GBps"] = benchmark::Counter(
      static_cast<double>(s->weight_bytes) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["copy_GBps"] = copy * 1e-9;
  state.counters["threads"] = static_cast<double>(cpu.threads());
  state.SetLabel(state.range(0) != 0 ? "smollm2-shape q4_1" : "smollm2-shape f32");
}

BENCHMARK(BM_CpuDecodeStep)
    ->ArgNames({"q4_1", "threads"})
    ->ArgsProduct({{0, 1}, {1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace sg

BENCHMARK_MAIN();
