// Prefill benchmarks: prompts written into the KV cache by prefill steps (many tokens per
// step, in chunks), as DecodeSession::Prefill runs them.
//
//   Ttft/len:<n>          GPU, Llama-3.2-1B's shape (bf16, random weights), one prompt of
//                         n tokens (128, 512, 2048): Prefill, then the first decode step,
//                         host clock to the first id (what a chat user waits for). Counters:
//                         prefill_ms, prefill tokens/s, TFLOP/s of the prefill (model FLOPs:
//                         every layer's projections plus attention over the causal
//                         triangle) and of_matmul, that rate over the bf16 matmul rate of
//                         a 4096³ MatMul node measured in the same run.
//   CpuShortPrompts       the CPU reference, the tiny model: 1,024 prompts of 8-16 tokens
//                         in one Prefill call (packed several to a step), then one step.
//
// Each case reports manual iteration times; the tables print medians.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "runtime/timing.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/runtime/measure.h"
#include "stepgraph/runtime/session.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/base/half.h"
#include "stepgraph/base/status.h"
#include "stepgraph/runtime/step_runner.h"

namespace sg {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<int32_t> RandomPrompt(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int32_t& v : p) v = id(rng);
  return p;
}

struct GpuContext {
  std::unique_ptr<DecodeSession> session;
  double matmul_tflops = 0;
};
GpuContext* gpu = nullptr;

void Ttft(benchmark::State& state) {
  if (gpu == nullptr) {
    state.SkipWithError("no CUDA device");
    return;
  }
  DecodeSession& s = *gpu->session;
  const int64_t len = state.range(0);
  const std::vector<int32_t> prompt = RandomPrompt(len, s.config().vocab_size, 1);
  std::vector<double> prefill;
  for (auto _ : state) {
    if (!s.runner().Sync().ok()) return state.SkipWithError("sync failed");
    const Clock::time_point t0 = Clock::now();
    absl::Status st = s.Prefill(0, prompt);
    if (st.ok()) st = s.Tokens(0).status();  // waits for the prefill steps
    const double p = Seconds(t0);
    if (st.ok()) st = s.Generate(0, 1).status();
    if (!st.ok()) return state.SkipWithError(std::string(st.message()).c_str());
    state.SetIterationTime(Seconds(t0));
    prefill.push_back(p);
  }
  const double p = Median(prefill);
  const double tflops = PrefillFlops(s.config(), len - 1) / p * 1e-12;
  state.counters["prefill_ms"] = p * 1e3;
  state.counters["prefill_tok_s"] = static_cast<double>(len - 1) / p;
  state.counters["TFLOP_s"] = tflops;
  state.counters["of_matmul"] = tflops / gpu->matmul_tflops;
}
BENCHMARK(Ttft)->Arg(128)->Arg(512)->Arg(2048)->UseManualTime()->Iterations(10)->Unit(
    benchmark::kMillisecond);

void CpuShortPrompts(benchmark::State& state) {
  constexpr int64_t kPrompts = 1024;
  SessionOptions o;
  o.config = TinyLlamaConfig();
  o.backend = Backend::kCpu;
  o.max_slots = kPrompts;
  o.max_seq = 64;
  o.buckets = {kPrompts};
  absl::StatusOr<std::unique_ptr<DecodeSession>> s = DecodeSession::Create(o);
  if (!s.ok()) return state.SkipWithError(std::string(s.status().message()).c_str());
  std::vector<std::vector<int32_t>> prompts;
  std::vector<PrefillRequest> requests;
  int64_t tokens = 0;
  for (int64_t i = 0; i < kPrompts; ++i) {
    prompts.push_back(RandomPrompt(8 + i % 9, o.config.vocab_size, static_cast<uint32_t>(i)));
    tokens += static_cast<int64_t>(prompts.back().size());
  }
  for (int64_t i = 0; i < kPrompts; ++i) requests.push_back({i, prompts[i], 0});
  for (auto _ : state) {
    const Clock::time_point t0 = Clock::now();
    absl::Status st = (*s)->Prefill(requests);
    if (st.ok()) st = (*s)->Generate(1).status();
    if (!st.ok()) return state.SkipWithError(std::string(st.message()).c_str());
    state.SetIterationTime(Seconds(t0));
  }
  state.counters["prompt_tokens"] = static_cast<double>(tokens);
  state.counters["tok_s"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(CpuShortPrompts)->UseManualTime()->Iterations(3)->Unit(benchmark::kSecond);

}  // namespace
}  // namespace sg

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  sg::GpuContext context;
  if (sg::CudaDeviceFound()) {
    absl::StatusOr<double> rate = sg::MeasureMatmulTflops({.device = sg::DeviceKind::kCuda});
    if (!rate.ok()) {
      std::fprintf(stderr, "prefill_bench: matmul rate: %s\n", rate.status().ToString().c_str());
      return 1;
    }
    sg::SessionOptions o;
    o.config = sg::Llama32_1BConfig();
    o.backend = sg::Backend::kCuda;
    o.max_seq = 2048 + 8;
    o.buckets = {1};
    absl::StatusOr<std::unique_ptr<sg::DecodeSession>> s = sg::DecodeSession::Create(o);
    if (!s.ok()) {
      std::fprintf(stderr, "prefill_bench: session: %s\n", s.status().ToString().c_str());
      return 1;
    }
    context.session = *std::move(s);
    context.matmul_tflops = *rate;
    sg::gpu = &context;
    std::printf("bf16 matmul rate (4096^3, same run): %.1f TFLOP/s; %s\n", *rate,
                context.session->Describe().c_str());
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
