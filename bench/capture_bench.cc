// Capture and replay benchmarks, each eager against replayed in the same run:
//  (a) a chain of 1,000 small kernels (Add on 256 floats): host launches against one
//      graph launch, reported per node;
//  (b) a decode step of a small Llama-shaped model (the built-in tiny shape, 4 layers,
//      random weights) for M = 1 and the buckets 2..32: ms per step;
//  (c) the cost of making an executable for a Llama-3.2-1B-shaped step: capture, then
//      instantiate and upload.
// Times are CUDA events around a batch of steps on the step's stream (UseManualTime);
// tables of medians are printed at the end.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/empty_chain.h"
#include "runtime/timing.h"
#include "dispatch/cuda/cuda_handles.h"
#include "dispatch/cuda/cuda_status.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/capture/cuda_graph.h"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace {

// Device buffers for a plan's inputs, weights and states: small random values, ids 0..,
// positions `pos`, and the arena.
struct DeviceBuffers {
  std::vector<DeviceMemory> owned;
  std::unique_ptr<Bindings> bindings;

  static absl::StatusOr<std::unique_ptr<DeviceBuffers>> Make(const ExecutionPlan& plan,
                                                             int32_t pos, bool fill) {
    auto d = std::make_unique<DeviceBuffers>();
    d->bindings = std::make_unique<Bindings>(plan.graph());
    for (const Tensor& t : plan.graph().tensors()) {
      if (t.kind == TensorKind::kIntermediate) continue;
      SG_ASSIGN_OR_RETURN(DeviceMemory m, AllocateDevice(t.bytes(), t.name.c_str()));
      if (t.dtype == DType::kI32) {
        std::vector<int32_t> v(t.shape.NumElements());
        for (size_t i = 0; i < v.size(); ++i) v[i] = t.name == kPosInput ? pos : int32_t(i + 1);
        SG_RETURN_IF_ERROR(ToStatus(
            cudaMemcpy(m.get(), v.data(), t.bytes(), cudaMemcpyHostToDevice), "upload"));
      } else if (fill) {
        // Small values as bytes: 0x3C3C... is 0.0115 in f32, 0.0115 in bf16, 1.06 in f16.
        SG_RETURN_IF_ERROR(ToStatus(cudaMemset(m.get(), 0x3C, t.bytes()), "fill"));
      }
      SG_RETURN_IF_ERROR(d->bindings->Bind(t.name, m.get(), t.bytes()));
      d->owned.push_back(std::move(m));
    }
    SG_ASSIGN_OR_RETURN(DeviceMemory arena, AllocateDevice(plan.arena_bytes(), "arena"));
    d->bindings->SetArena(arena.get(), plan.arena_bytes());
    d->owned.push_back(std::move(arena));
    // The uploads ran on the legacy stream, which the capture stream does not wait for.
    SG_RETURN_IF_ERROR(ToStatus(cudaDeviceSynchronize(), "sync after upload"));
    return d;
  }
};

struct Row {
  std::string what;
  double eager = 0;
  double replay = 0;
  std::string unit;
};
std::map<std::string, Row> g_rows;

// Times `steps` runs of `run` (each enqueues one step on `stream`) by events on the
// stream; returns µs per step.
absl::StatusOr<double> TimeSteps(const std::function<absl::Status()>& run, cudaStream_t stream,
                                 int steps) {
  SG_ASSIGN_OR_RETURN(UniqueEvent start, CreateEvent("start"));
  SG_ASSIGN_OR_RETURN(UniqueEvent stop, CreateEvent("stop"));
  SG_RETURN_IF_ERROR(ToStatus(cudaEventRecord(start.get(), stream), "record"));
  for (int i = 0; i < steps; ++i) SG_RETURN_IF_ERROR(run());
  SG_RETURN_IF_ERROR(ToStatus(cudaEventRecord(stop.get(), stream), "record"));
  SG_RETURN_IF_ERROR(ToStatus(cudaEventSynchronize(stop.get()), "sync"));
  float ms = 0;
  SG_RETURN_IF_ERROR(ToStatus(cudaEventElapsedTime(&ms, start.get(), stop.get()), "elapsed"));
  return 1000.0 * ms / steps;
}

// Runs `plan` eagerly and replayed, `steps` per timed batch, and records µs per launch
// (divided by `per` for per-node figures).
void EagerAgainstReplay(benchmark::State& state, const ExecutionPlan& plan, int32_t pos,
                        int steps, double per, const std::string& key, const std::string& unit,
                        double scale) {
  auto fail = [&](const absl::Status& s) { state.SkipWithError(std::string(s.message()).c_str()); };
  if (!CudaDeviceAvailable()) return state.SkipWithError("no GPU");
  auto dispatch = CudaDispatch::Create();
  if (!dispatch.ok()) return fail(dispatch.status());
  auto buffers = DeviceBuffers::Make(plan, pos, true);
  if (!buffers.ok()) return fail(buffers.status());
  auto prepared = (*dispatch)->Prepare(plan);
  if (!prepared.ok()) return fail(prepared.status());
  auto replay = CapturedStep::Create(*prepared, *(*buffers)->bindings, **dispatch);
  if (!replay.ok()) return fail(replay.status());
  const cudaStream_t stream = (*dispatch)->stream();
  const std::function<absl::Status()> run_eager = [&] {
    return Execute(*prepared, *(*buffers)->bindings, **dispatch).status();
  };
  const std::function<absl::Status()> run_replay = [&] { return (*replay)->Replay(); };
  // Warm up both (first launches load modules and page in).
  for (const auto* run : {&run_eager, &run_replay}) {
    if (auto t = TimeSteps(*run, stream, 3); !t.ok()) return fail(t.status());
  }
  std::vector<double> e, r;
  for (auto _ : state) {
    auto te = TimeSteps(run_eager, stream, steps);
    auto tr = TimeSteps(run_replay, stream, steps);
    if (!te.ok() || !tr.ok()) return fail(!te.ok() ? te.status() : tr.status());
    e.push_back(*te / per);
    r.push_back(*tr / per);
    state.SetIterationTime(*tr * steps * 1e-6);
  }
  Row row{key, Median(e) * scale, Median(r) * scale, unit};
  state.counters["eager_" + unit] = row.eager;
  state.counters["replay_" + unit] = row.replay;
  state.counters["speedup"] = row.eager / row.replay;
  g_rows[key] = row;
}

// (a) 1,000 Add launches on 256 floats, each reading the previous one's result.
void BM_KernelChain(benchmark::State& state) {
  const int64_t n = state.range(0);
  GraphBuilder b;
  TensorId x = b.Input("x", DType::kF32, {1, 256});
  TensorId y = x;
  for (int64_t i = 0; i < n; ++i) y = b.Add(y, x);
  b.Output("y", y);
  auto graph = std::move(b).Build();
  if (!graph.ok()) return state.SkipWithError(std::string(graph.status().message()).c_str());
  auto plan = ExecutionPlan::Create(*std::move(graph));
  if (!plan.ok()) return state.SkipWithError(std::string(plan.status().message()).c_str());
  EagerAgainstReplay(state, *plan, 0, 10, static_cast<double>(n),
                     absl::StrFormat("(a) chain of %d Add kernels", n), "us_per_node", 1.0);
}
BENCHMARK(BM_KernelChain)->Arg(1000)->UseManualTime()->Iterations(15)->Unit(benchmark::kMillisecond);

// The floor for (a): 1,000 empty kernels, host launches against one graph launch, plain and
// with programmatic dependent launch (as stepgraph's kernels are launched on sm_90+).
void BM_EmptyChain(benchmark::State& state) {
  if (!CudaDeviceAvailable()) return state.SkipWithError("no GPU");
  const int n = static_cast<int>(state.range(0));
  const bool programmatic = state.range(1) != 0;
  auto fail = [&](const absl::Status& s) { state.SkipWithError(std::string(s.message()).c_str()); };
  absl::Status s = [&]() -> absl::Status {
    SG_ASSIGN_OR_RETURN(UniqueStream stream, CreateStream("empty chain"));
    cudaStream_t st = stream.get();
    SG_RETURN_IF_ERROR(ToStatus(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal),
                                "cudaStreamBeginCapture"));
    const cudaError_t launched = bench::LaunchEmptyKernels(st, n, programmatic);
    cudaGraph_t raw = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(st, &raw);
    UniqueGraph graph(raw);
    SG_RETURN_IF_ERROR(ToStatus(launched, "empty kernel launch"));
    SG_RETURN_IF_ERROR(ToStatus(ended, "cudaStreamEndCapture"));
    cudaGraphExec_t exec_raw = nullptr;
    SG_RETURN_IF_ERROR(
        ToStatus(cudaGraphInstantiate(&exec_raw, graph.get(), 0), "cudaGraphInstantiate"));
    UniqueGraphExec exec(exec_raw);
    SG_ASSIGN_OR_RETURN(UniqueEvent start, CreateEvent("start"));
    SG_ASSIGN_OR_RETURN(UniqueEvent stop, CreateEvent("stop"));
    auto time = [&](bool replay) -> absl::StatusOr<double> {
      SG_RETURN_IF_ERROR(ToStatus(cudaEventRecord(start.get(), st), "record"));
      for (int i = 0; i < 10; ++i) {
        SG_RETURN_IF_ERROR(ToStatus(replay ? cudaGraphLaunch(exec.get(), st)
                                           : bench::LaunchEmptyKernels(st, n, programmatic),
                                    "launch"));
      }
      SG_RETURN_IF_ERROR(ToStatus(cudaEventRecord(stop.get(), st), "record"));
      SG_RETURN_IF_ERROR(ToStatus(cudaEventSynchronize(stop.get()), "sync"));
      float ms = 0;
      SG_RETURN_IF_ERROR(ToStatus(cudaEventElapsedTime(&ms, start.get(), stop.get()), "elapsed"));
      return 1000.0 * ms / (10.0 * n);
    };
    for (bool replay : {false, true}) SG_RETURN_IF_ERROR(time(replay).status());  // warm-up
    std::vector<double> e, r;
    for (auto _ : state) {
      SG_ASSIGN_OR_RETURN(double te, time(false));
      SG_ASSIGN_OR_RETURN(double tr, time(true));
      e.push_back(te);
      r.push_back(tr);
      state.SetIterationTime(tr * n * 10 * 1e-6);
    }
    const std::string key = absl::StrFormat("(a) chain of %d empty kernels%s", n,
                                            programmatic ? ", PDL" : "");
    Row row{key, Median(e), Median(r), "us_per_node"};
    state.counters["eager_us_per_node"] = row.eager;
    state.counters["replay_us_per_node"] = row.replay;
    g_rows[key] = row;
    return absl::OkStatus();
  }();
  if (!s.ok()) fail(s);
}
BENCHMARK(BM_EmptyChain)->Args({1000, 0})->Args({1000, 1})->UseManualTime()->Iterations(15)
    ->Unit(benchmark::kMillisecond);

// (b) A decode step of the tiny Llama shape, 4 layers, at position 100.
void BM_TinyLlamaStep(benchmark::State& state) {
  const int64_t batch = state.range(0);
  auto graph = BuildLlamaDecodeGraph(TinyLlamaConfig(), {.batch = batch, .max_seq = 512});
  if (!graph.ok()) return state.SkipWithError(std::string(graph.status().message()).c_str());
  auto plan = ExecutionPlan::Create(*std::move(graph));
  if (!plan.ok()) return state.SkipWithError(std::string(plan.status().message()).c_str());
  EagerAgainstReplay(state, *plan, 100, 20, 1.0,
                     absl::StrFormat("(b) tiny Llama step, M=%d, pos 100", batch), "ms_per_step",
                     1e-3);
}
BENCHMARK(BM_TinyLlamaStep)->RangeMultiplier(2)->Range(1, 32)->UseManualTime()->Iterations(15)
    ->Unit(benchmark::kMillisecond);

// (c) Making the executable of a Llama-3.2-1B-shaped step (weights are not filled:
// nothing is replayed, only recorded).
void BM_CaptureAndInstantiate(benchmark::State& state) {
  if (!CudaDeviceAvailable()) return state.SkipWithError("no GPU");
  auto fail = [&](const absl::Status& s) { state.SkipWithError(std::string(s.message()).c_str()); };
  auto graph = BuildLlamaDecodeGraph(Llama32_1BConfig(), {.batch = 1, .max_seq = 2048});
  if (!graph.ok()) return fail(graph.status());
  auto plan = ExecutionPlan::Create(*std::move(graph));
  if (!plan.ok()) return fail(plan.status());
  auto dispatch = CudaDispatch::Create();
  if (!dispatch.ok()) return fail(dispatch.status());
  auto prepared = (*dispatch)->Prepare(*plan);
  if (!prepared.ok()) return fail(prepared.status());
  auto buffers = DeviceBuffers::Make(*plan, 100, false);
  if (!buffers.ok()) return fail(buffers.status());
  std::vector<double> capture, instantiate;
  int64_t nodes = 0;
  for (auto _ : state) {
    auto step = CapturedStep::Create(*prepared, *(*buffers)->bindings, **dispatch);
    if (!step.ok()) return fail(step.status());
    nodes = (*step)->num_graph_nodes();
    capture.push_back((*step)->stats().capture_us);
    instantiate.push_back((*step)->stats().instantiate_us);
    state.SetIterationTime(1e-6 * (capture.back() + instantiate.back()));
  }
  state.counters["graph_nodes"] = static_cast<double>(nodes);
  state.counters["capture_us"] = Median(capture);
  state.counters["instantiate_us"] = Median(instantiate);
  g_rows["(c) 1B step: capture"] = {"(c) 1B step: capture", 0, Median(capture), "us"};
  g_rows["(c) 1B step: instantiate+upload"] = {"(c) 1B step: instantiate+upload", 0,
                                              Median(instantiate), "us"};
}
BENCHMARK(BM_CaptureAndInstantiate)->UseManualTime()->Iterations(7)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace sg

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::printf("\n%-42s %12s %12s %8s  %s\n", "case", "eager", "replayed", "ratio", "unit");
  for (const auto& [key, r] : sg::g_rows) {
    std::printf("%-42s %12.3f %12.3f %8s  %s\n", r.what.c_str(), r.eager, r.replay,
                r.eager > 0 ? absl::StrFormat("%.2fx", r.eager / r.replay).c_str() : "-",
                r.unit.c_str());
  }
  return 0;
}
