// `stepgraph bench`: decode speed at given context positions (eager and replayed on a GPU,
// medians of CUDA-event times per step) against the floor of reading once every weight a
// step reads (StepWeightBytes: an untied embedding's rows and a mixture's reachable experts
// only) at the copy bandwidth measured in the same run, and the time to first token. A GPU
// benchmark: without a GPU it runs only when --cpu asks for the CPU reference.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/timing.h"
#include "stepgraph/base/status.h"
#include "stepgraph/runtime/measure.h"
#include "stepgraph/runtime/session.h"
#include "stepgraph/runtime/step_runner.h"
#include "stepgraph/runtime/tensor_parallel.h"
#include "runtime/sharded_weights.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/graph/passes.h"
#include "models/model_files.h"
#include "tools/commands.h"
#include "tools/console.h"
#include "tools/model_setup.h"

namespace sg::cli {
namespace {

// The device's ceilings the step is compared with, each measured where the benchmark has
// always measured it: the device-to-device copy bandwidth (bytes/s, read + write) before
// the decode steps, the bf16 matmul rate (TFLOP/s) before the time to first token. The
// program's one use of the step runner's measurement helpers.
absl::StatusOr<double> MeasureCopyBandwidth(DecodeSession& s) {
  return CopyBandwidth(s.runner(), int64_t{1} << 29, 10);
}

absl::StatusOr<double> MeasureMatmulRate(const Options& o) {
  return MeasureMatmulTflops({.device = DeviceKind::kCuda, .cuda = o.cuda});
}

// A prompt of `n` ids, the same on every run.
std::vector<int32_t> BenchPrompt(int64_t n, int64_t vocab, int64_t sequence) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  uint64_t x = 0x2545F4914F6CDD1Dull + static_cast<uint64_t>(sequence);
  for (int32_t& id : p) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab));
  }
  return p;
}

void PrintProfile(const std::vector<std::vector<NodeTime>>& runs, double replayed_ms,
                  const std::string& what = "one eager step") {
  if (runs.empty()) return;
  const size_t nodes = runs[0].size();
  std::map<std::string, std::pair<int, double>> by_op;
  std::vector<std::pair<double, size_t>> by_node;
  double total = 0;
  for (size_t i = 0; i < nodes; ++i) {
    std::vector<double> t;
    for (const auto& r : runs) t.push_back(r[i].ms);
    const double ms = Median(t);
    total += ms;
    auto& op = by_op[runs[0][i].op];
    ++op.first;
    op.second += ms;
    by_node.push_back({ms, i});
  }
  std::printf("profile: %s, device time per node (median of %zu): %.3f ms in all",
              what.c_str(), runs.size(), total);
  if (replayed_ms > 0) std::printf(" (the replayed step takes %.3f ms)", replayed_ms);
  // The op column as wide as its longest name (MoeRouteWeights), so the numbers line up.
  int width = 12;
  for (const auto& [op, v] : by_op) width = std::max(width, static_cast<int>(op.size()));
  std::printf("\n  %-*s %6s %10s %7s\n", width, "op", "nodes", "ms", "share");
  std::vector<std::pair<double, std::string>> ops;
  for (const auto& [op, v] : by_op) ops.push_back({v.second, op});
  std::sort(ops.rbegin(), ops.rend());
  for (const auto& [ms, op] : ops) {
    std::printf("  %-*s %6d %10.4f %6.1f%%\n", width, op.c_str(), by_op[op].first, ms,
                total > 0 ? 100 * ms / total : 0.0);
  }
  std::sort(by_node.rbegin(), by_node.rend());
  std::printf("  slowest nodes:\n");
  for (size_t k = 0; k < std::min<size_t>(10, by_node.size()); ++k) {
    const NodeTime& n = runs[0][by_node[k].second];
    std::printf("    %8.4f ms  %-*s %s\n", by_node[k].first, width, n.op.c_str(),
                n.name.c_str());
  }
}

// The median ms per step of `steps` timed steps. On the CPU reference, where a step of a
// large model takes seconds, one step per call with progress; on a GPU in one call.
absl::StatusOr<double> MedianStepMs(DecodeSession& s, int64_t steps, const std::string& what) {
  if (s.backend() != Backend::kCpu) {
    SG_ASSIGN_OR_RETURN(std::vector<double> t, s.TimedSteps(steps));
    return Median(t);
  }
  std::vector<double> t;
  Progress progress(what, steps, "steps");
  for (int64_t i = 0; i < steps; ++i) {
    SG_ASSIGN_OR_RETURN(std::vector<double> one, s.TimedSteps(1));
    t.push_back(one[0]);
    progress.Update(i + 1);
  }
  return Median(t);
}

// Time to first token for a prompt of each length on slot 0 (every other slot released):
// prefill steps, then the first decode step, host clock to the id (median of 5 after a
// warm-up), with prefill tokens/s and, given the matmul rate, TFLOP/s.
absl::Status MeasureTtft(const Options& o, DecodeSession& s, double matmul_tflops) {
  for (int64_t b = 1; b < s.max_slots(); ++b) SG_RETURN_IF_ERROR(s.Release(b));
  for (const int64_t len : o.ttft_lengths) {
    if (len + 1 > s.max_seq()) {
      std::printf("time to first token, %lld-token prompt: skipped (max_seq %lld)\n",
                  static_cast<long long>(len), static_cast<long long>(s.max_seq()));
      continue;
    }
    const std::vector<int32_t> prompt = BenchPrompt(len, s.config().vocab_size, 0);
    std::vector<double> prefill_ms, ttft_ms;
    constexpr int kRuns = 6;
    Progress progress(absl::StrCat("time to first token of ", len, " tokens:"), kRuns, "runs");
    for (int r = 0; r < kRuns; ++r) {
      SG_RETURN_IF_ERROR(s.runner().Sync());
      const Clock::time_point t0 = Clock::now();
      SG_RETURN_IF_ERROR(s.Prefill(0, prompt));
      SG_RETURN_IF_ERROR(s.Tokens(0).status());  // waits for the prefill steps
      const double p = MsSince(t0);
      SG_RETURN_IF_ERROR(s.Generate(0, 1).status());
      const double t = MsSince(t0);
      progress.Update(r + 1);
      if (r == 0) continue;  // warm-up
      prefill_ms.push_back(p);
      ttft_ms.push_back(t);
    }
    progress.Done();
    if (o.profile && s.prefill_chunk() > 0 &&
        len == *std::max_element(o.ttft_lengths.begin(), o.ttft_lengths.end())) {
      // The same prompt once more, its prefill steps eager with every node timed: where a
      // prompt's time goes, node by node, summed over its steps.
      SG_RETURN_IF_ERROR(s.runner().Sync());
      absl::StatusOr<std::vector<NodeTime>> nodes = s.ProfilePrefill(0, prompt);
      SG_RETURN_IF_ERROR(nodes.status());
      if (!nodes->empty()) {
        PrintProfile({*std::move(nodes)}, 0.0,
                     absl::StrCat("the eager prefill of the ", len,
                                  "-token prompt, each node summed over its steps"));
      }
    }
    const double p = Median(prefill_ms), t = Median(ttft_ms);
    std::string rate;
    if (matmul_tflops > 0) {
      const double tflops = PrefillFlops(s.config(), len - 1) / (p * 1e-3) * 1e-12;
      rate = absl::StrFormat(", %.1f TFLOP/s = %.3f of the bf16 matmul rate %.1f TFLOP/s",
                             tflops, tflops / matmul_tflops, matmul_tflops);
    }
    std::printf("time to first token, %lld-token prompt: %.3f ms (prefill %.3f ms, %.0f "
                "tokens/s, chunk %lld%s)\n",
                static_cast<long long>(len), t, p, 1e3 * static_cast<double>(len - 1) / p,
                static_cast<long long>(s.prefill_chunk()), rate.c_str());
  }
  std::fflush(stdout);
  return absl::OkStatus();
}

// ms per replay of `step` on every rank: `n` replays after 3 warm-ups, host clock to the
// last rank's end.
absl::StatusOr<double> ReplayMs(TensorParallelRunner& tp, int step, int64_t n) {
  for (int i = 0; i < 3; ++i) SG_RETURN_IF_ERROR(tp.Run(step));
  SG_RETURN_IF_ERROR(tp.Sync());
  const Clock::time_point t0 = Clock::now();
  for (int64_t i = 0; i < n; ++i) SG_RETURN_IF_ERROR(tp.Run(step));
  SG_RETURN_IF_ERROR(tp.Sync());
  return MsSince(t0) / static_cast<double>(n);
}

// The time of one all-reduce of each size in `columns` (a [1, columns] activation of
// dtype), as the sharded step makes them: `count` in a chain, in one captured graph per
// rank and size, replayed.
absl::StatusOr<std::vector<double>> AllReduceUs(const TensorParallelOptions& options, DType dtype,
                                                const std::vector<int64_t>& columns, int count) {
  SG_ASSIGN_OR_RETURN(std::unique_ptr<TensorParallelRunner> tp,
                      TensorParallelRunner::Create(options));
  const int64_t largest = *std::max_element(columns.begin(), columns.end()) * DTypeBytes(dtype);
  std::vector<void*> in;
  for (int r = 0; r < tp->ranks(); ++r) {
    SG_ASSIGN_OR_RETURN(void* p, tp->rank(r).AllocateZeroed(largest, "all-reduce input"));
    in.push_back(p);
  }
  std::vector<int> steps;
  for (const int64_t n : columns) {
    GraphBuilder b;
    TensorId x = b.Input("x", dtype, {1, n});
    for (int i = 0; i < count; ++i) x = b.AllReduce(x, tp->ranks(), absl::StrCat("all_reduce_", i));
    b.Output("out", x);
    SG_ASSIGN_OR_RETURN(const Graph g, std::move(b).Build());
    SG_ASSIGN_OR_RETURN(const int step, tp->AddStep(g, [&](int r, const Graph&, Bindings& bind) {
      return bind.Bind("x", in[static_cast<size_t>(r)], n * DTypeBytes(dtype));
    }));
    steps.push_back(step);
  }
  SG_RETURN_IF_ERROR(tp->Finalize());
  std::vector<double> us;
  for (const int step : steps) {
    SG_ASSIGN_OR_RETURN(const double ms, ReplayMs(*tp, step, 50));
    us.push_back(1e3 * ms / count);
  }
  return us;
}

// `bench --tensor-parallel N`: the model sharded over N ranks (stepgraph/graph/shard.h),
// each rank's step captured and replayed together, the closed loop advancing positions on
// the devices; ms per token at each position against the floor of a rank's weight bytes,
// and the all-reduces' share measured apart.
int TensorParallelBench(const Options& o) {
  const std::string hint = HelpHint(kBench);
  absl::StatusOr<LlamaConfig> config = ModelConfig(o);
  if (!config.ok()) return ModelFailure(o, config.status());
  const LlamaConfig& c = *config;
  const int ranks = static_cast<int>(o.tensor_parallel);
  const int64_t max_pos = *std::max_element(o.positions.begin(), o.positions.end());
  const int64_t max_seq = o.max_seq > 0 ? o.max_seq : max_pos + 2 * o.steps + 16;
  // A model whose heads do not divide by the ranks asks for what cannot be: a usage error.
  absl::StatusOr<ShardPlan> plan = LlamaShardPlan(c, ranks);
  if (!plan.ok()) return UsageFailure(plan.status().message(), kBench);
  absl::StatusOr<Graph> whole = BuildLlamaDecodeGraph(
      c, {.batch = o.batch, .max_seq = max_seq, .closed_loop = true});
  if (!whole.ok()) return Failure(whole.status(), hint);
  absl::StatusOr<Graph> sharded = ShardGraph(*whole, *plan, ranks);
  if (!sharded.ok()) return Failure(sharded.status(), hint);
  TensorParallelOptions tpo;
  tpo.ranks = ranks;
  tpo.runner.device = o.cpu ? DeviceKind::kCpu : DeviceKind::kCuda;
  tpo.runner.eager = o.eager;
  tpo.runner.cuda = o.cuda;
  tpo.runner.cpu_threads = static_cast<int>(o.threads);
  absl::StatusOr<std::unique_ptr<TensorParallelRunner>> made = TensorParallelRunner::Create(tpo);
  if (!made.ok()) return Failure(made.status(), hint);
  TensorParallelRunner& tp = **made;
  PassOptions passes = o.passes;
  passes.backend = &tp.rank(0).op_support();
  passes.unread_outputs.insert(kLogitsOutput);
  absl::StatusOr<Graph> g = RunPasses(*std::move(sharded), passes);
  if (!g.ok()) return Failure(g.status(), hint);

  std::fprintf(stderr, "stepgraph: uploading %s weights to %d ranks\n",
               o.model.empty() ? "random" : "the model's", ranks);
  std::optional<ModelFiles> files;
  WeightSource source;
  if (!o.model.empty()) {
    absl::StatusOr<ModelFiles> opened = ModelFiles::Open(o.model);
    if (!opened.ok()) return ModelFailure(o, opened.status());
    files = *std::move(opened);
    source = [&files](const std::string& name) { return files->WeightData(name); };
  }
  absl::StatusOr<ShardedBuffers> buffers =
      ShardedBuffers::Upload(tp, *whole, *g, *plan, source, o.weight_seed);
  if (!buffers.ok()) return Failure(buffers.status(), hint);
  files.reset();
  const int64_t rows = o.batch;
  std::vector<int32_t*> io;
  for (int r = 0; r < ranks; ++r) {
    absl::StatusOr<void*> p = tp.rank(r).Allocate(2 * rows * 4, "ids and positions");
    if (!p.ok()) return Failure(p.status(), hint);
    io.push_back(static_cast<int32_t*>(*p));
  }
  absl::StatusOr<int> step = tp.AddStep(*g, [&](int r, const Graph& rg, Bindings& b) {
    SG_RETURN_IF_ERROR(buffers->Bind(r, rg, b));
    SG_RETURN_IF_ERROR(b.Bind(kIdsInput, io[static_cast<size_t>(r)], rows * 4));
    return b.Bind(kPosInput, io[static_cast<size_t>(r)] + rows, rows * 4);
  });
  if (!step.ok()) return Failure(step.status(), hint);
  if (absl::Status s = tp.Finalize(); !s.ok()) return Failure(s, hint);

  const bool gpu = tpo.runner.device == DeviceKind::kCuda;
  double copy_bw = 0;
  if (gpu) {
    absl::StatusOr<double> bw = CopyBandwidth(tp.rank(0), int64_t{1} << 29, 10);
    if (!bw.ok()) return Failure(bw.status(), hint);
    copy_bw = *bw;
  }
  const int64_t rank_bytes = buffers->weight_bytes_per_rank();
  const double floor_ms = gpu ? 1e3 * static_cast<double>(rank_bytes) / copy_bw : 0;
  std::printf("tensor parallel: %d ranks on %s; %d AllReduce, %d AllGather nodes a step\n",
              ranks, tp.rank(0).Describe().c_str(),
              static_cast<int>(std::count_if(g->nodes().begin(), g->nodes().end(), [](const Node& n) {
                return std::holds_alternative<ops::AllReduce>(n.op);
              })),
              static_cast<int>(std::count_if(g->nodes().begin(), g->nodes().end(), [](const Node& n) {
                return std::holds_alternative<ops::AllGather>(n.op);
              })));
  if (gpu) {
    std::printf("device-to-device copy (rank 0): %.1f GB/s (read + write); weights per rank %s: "
                "floor %.4f ms/step\n",
                copy_bw * 1e-9, Bytes(rank_bytes).c_str(), floor_ms);
  }
  double step_ms = 0;
  for (const int64_t pos : o.positions) {
    std::vector<int32_t> host(static_cast<size_t>(2 * rows), 1);
    for (int64_t i = 0; i < rows; ++i) host[static_cast<size_t>(rows + i)] = static_cast<int32_t>(pos);
    for (int r = 0; r < ranks; ++r) {
      if (absl::Status s = tp.rank(r).Copy(io[static_cast<size_t>(r)], host.data(), 2 * rows * 4);
          !s.ok()) {
        return Failure(s, hint);
      }
    }
    if (absl::Status s = tp.Sync(); !s.ok()) return Failure(s, hint);
    absl::StatusOr<double> ms = ReplayMs(tp, *step, o.steps);
    if (!ms.ok()) return Failure(ms.status(), hint);
    if (step_ms == 0) step_ms = *ms;
    std::printf("position %lld: %.4f ms/step (%.1f tokens/s)%s\n", static_cast<long long>(pos),
                *ms, 1e3 * static_cast<double>(rows) / *ms,
                gpu ? absl::StrFormat("; floor/step %.3f", floor_ms / *ms).c_str() : "");
  }
  if (o.profile) {
    // Rank 0's step node by node (eager, device time per node) while every other rank
    // replays the same step: the collectives meet as in the replayed step.
    std::vector<std::vector<NodeTime>> runs;
    for (int run = 0; run < 5; ++run) {
      std::vector<double> ms;
      absl::Status s = tp.ForEachRank([&](int r) -> absl::Status {
        if (r != 0) return tp.rank(r).Run(*step);
        SG_ASSIGN_OR_RETURN(ms, ProfileNodes(tp.rank(0), *step));
        return absl::OkStatus();
      });
      if (s.ok()) s = tp.Sync();
      if (!s.ok()) return Failure(s, hint);
      std::vector<NodeTime> times;
      for (size_t i = 0; i < ms.size() && i < g->nodes().size(); ++i) {
        const Node& n = g->nodes()[i];
        times.push_back({static_cast<int32_t>(i), n.name, std::string(OpName(n.op)), ms[i]});
      }
      runs.push_back(std::move(times));
    }
    PrintProfile(runs, step_ms);
  }
  if (ranks > 1 && tp.replays()) {
    // Both paths at the step's size and around it: NCCL, and the one-shot kernel where the
    // group has its buffers (CudaOptions::one_shot_all_reduce_bytes picks per size).
    const int count = static_cast<int>(2 * c.num_hidden_layers);
    const int64_t h = rows * c.hidden_size;
    const std::vector<int64_t> sizes = {2048, 4096, 8192, 32768, 131072, h};
    TensorParallelOptions nccl = tpo, one_shot = tpo;
    nccl.runner.cuda.one_shot_all_reduce_bytes = 0;
    one_shot.runner.cuda.one_shot_all_reduce_bytes = int64_t{1} << 30;
    absl::StatusOr<std::vector<double>> by_nccl = AllReduceUs(nccl, c.dtype, sizes, count);
    if (!by_nccl.ok()) return Failure(by_nccl.status(), hint);
    absl::StatusOr<std::vector<double>> by_one_shot = AllReduceUs(one_shot, c.dtype, sizes, count);
    if (!by_one_shot.ok()) return Failure(by_one_shot.status(), hint);
    std::printf("all-reduce, replayed (%d in a chain), us: %10s %10s %10s\n", count, "bytes",
                "NCCL", "one-shot");
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::printf("  %s%35lld %10.2f %10.2f\n", i + 1 == sizes.size() ? "the step's:" : "           ",
                  static_cast<long long>(sizes[i] * DTypeBytes(c.dtype)), (*by_nccl)[i],
                  (*by_one_shot)[i]);
    }
    const int64_t step_bytes = h * DTypeBytes(c.dtype);
    const bool used_one_shot = step_bytes <= o.cuda.one_shot_all_reduce_bytes;
    const double us = used_one_shot ? by_one_shot->back() : by_nccl->back();
    std::printf("the step's %d all-reduces (%s, %s): %.3f ms, %.1f%% of the step at position "
                "%lld\n",
                count, Bytes(step_bytes).c_str(), used_one_shot ? "one-shot" : "NCCL",
                us * count * 1e-3, 100 * us * count * 1e-3 / step_ms,
                static_cast<long long>(o.positions.front()));
  }
  return kExitOk;
}

}  // namespace

int BenchCommand(const Options& o) {
  if (o.tensor_parallel > 0) return TensorParallelBench(o);
  // A GPU benchmark that would run for minutes on the CPU reference says so first.
  if (!o.cpu && !CudaDeviceFound()) {
    std::fprintf(stderr,
                 "stepgraph: error: bench measures the decode step on a GPU, and %s; on the "
                 "CPU reference it is slow (minutes for a 1B model)\n",
                 BuiltWithCuda() ? "no CUDA device was found" : "this build has no CUDA");
    std::fprintf(stderr, "hint: add --cpu to measure the CPU reference anyway\n");
    return kExitUsage;
  }
  absl::StatusOr<LlamaConfig> config = ModelConfig(o);
  if (!config.ok()) return ModelFailure(o, config.status());
  const int64_t max_pos = *std::max_element(o.positions.begin(), o.positions.end());
  // Warm-up, eager, replayed and profiled steps all advance the position; the time to
  // first token needs its longest prompt and one step.
  int64_t need = max_pos + 1 + 4 + 2 * o.steps + 8;
  if (o.max_seq == 0) {
    for (int64_t len : o.ttft_lengths) {
      if (len + 1 <= config->max_position_embeddings) need = std::max(need, len + 1);
    }
  }
  const int64_t max_seq = o.max_seq > 0 ? o.max_seq : need;
  if (max_seq < need || need > config->max_position_embeddings) {
    return UsageFailure(absl::StrCat("positions up to ", max_pos, " with --steps ", o.steps,
                                     " need a KV cache of ", need, " positions; the ",
                                     max_seq < need ? "--max-seq given" : "model", " allows ",
                                     max_seq < need ? max_seq : config->max_position_embeddings),
                        kBench);
  }
  absl::StatusOr<std::unique_ptr<DecodeSession>> made =
      MakeSession(o, o.batch, max_seq, std::nullopt, o.eager);
  if (!made.ok()) return ModelFailure(o, made.status());
  std::unique_ptr<DecodeSession> session = *std::move(made);
  const bool gpu = session->backend() == Backend::kCuda;
  const std::string hint = HelpHint(kBench);

  // The weight bytes a step of the measured batch reads: all of them, less the embedding
  // rows and the experts it cannot reach (StepWeightBytes).
  int64_t step_bytes = session->weight_bytes();
  for (const int64_t bucket : session->buckets()) {
    if (bucket < o.batch) continue;
    if (const ExecutionPlan* plan = session->plan(bucket); plan != nullptr) {
      step_bytes = StepWeightBytes(plan->graph());
    }
    break;
  }
  double copy_bw = 0;
  if (gpu) {
    absl::StatusOr<double> bw = MeasureCopyBandwidth(*session);
    if (!bw.ok()) return Failure(bw.status(), hint);
    copy_bw = *bw;
    const bool part = step_bytes < session->weight_bytes() / 100 * 99;
    std::printf("device-to-device copy: %.1f GB/s (read + write); weights %s%s%s: floor %.4f "
                "ms/step\n",
                copy_bw * 1e-9, Bytes(session->weight_bytes()).c_str(),
                part ? ", read by a step " : "", part ? Bytes(step_bytes).c_str() : "",
                1e3 * static_cast<double>(step_bytes) / copy_bw);
  }
  const double floor_ms = gpu ? 1e3 * static_cast<double>(step_bytes) / copy_bw : 0;

  // Median ms per step of `o.steps` steps at context position `pos` (every slot prefilled
  // with a prompt of pos + 1 ids).
  auto measure = [&](DecodeSession& s, int64_t pos) -> absl::StatusOr<double> {
    std::fprintf(stderr, "stepgraph: position %lld: prefilling %lld x %lld tokens\n",
                 static_cast<long long>(pos), static_cast<long long>(o.batch),
                 static_cast<long long>(pos + 1));
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t b = 0; b < o.batch; ++b) {
      prompts.push_back(BenchPrompt(pos + 1, s.config().vocab_size, b));
    }
    // One slot at a time, as the measurement has always been taken.
    for (int64_t b = 0; b < o.batch; ++b) {
      const PrefillRequest r{b, prompts[b], 0};
      SG_RETURN_IF_ERROR(PrefillShowingProgress(s, absl::MakeConstSpan(&r, 1)));
    }
    SG_RETURN_IF_ERROR(s.Generate(4).status());
    return MedianStepMs(s, o.steps, absl::StrCat("position ", pos, ": timed"));
  };

  std::vector<double> first(o.positions.size(), 0.0), eager(o.positions.size(), 0.0);
  for (size_t i = 0; i < o.positions.size(); ++i) {
    absl::StatusOr<double> ms = measure(*session, o.positions[i]);
    if (!ms.ok()) return Failure(ms.status(), hint);
    first[i] = *ms;
    if (o.profile && i == 0) {
      std::vector<std::vector<NodeTime>> runs;
      for (int r = 0; r < 5 && session->position(0) + 1 < session->max_seq(); ++r) {
        absl::StatusOr<std::vector<NodeTime>> p = session->ProfileStep();
        if (!p.ok()) return Failure(p.status(), hint);
        runs.push_back(*std::move(p));
      }
      PrintProfile(runs, session->eager() ? 0.0 : first[0]);
    }
  }
  double matmul_tflops = 0;
  if (gpu) {
    absl::StatusOr<double> rate = MeasureMatmulRate(o);
    if (!rate.ok()) return Failure(rate.status(), hint);
    matmul_tflops = *rate;
  }
  if (absl::Status st = MeasureTtft(o, *session, matmul_tflops); !st.ok()) {
    return Failure(st, hint);
  }
  const bool replayed = !session->eager();
  if (gpu && replayed) {
    // The same steps launched node by node, from a second session made eager (the first is
    // released first, so that both never hold the weights at once).
    session.reset();
    absl::StatusOr<std::unique_ptr<DecodeSession>> e =
        MakeSession(o, o.batch, max_seq, std::nullopt, /*eager=*/true);
    if (!e.ok()) return ModelFailure(o, e.status());
    for (size_t i = 0; i < o.positions.size(); ++i) {
      absl::StatusOr<double> ms = measure(**e, o.positions[i]);
      if (!ms.ok()) return Failure(ms.status(), hint);
      eager[i] = *ms;
    }
  }
  const double tokens = static_cast<double>(o.batch);
  for (size_t i = 0; i < o.positions.size(); ++i) {
    const long long pos = static_cast<long long>(o.positions[i]);
    if (!gpu) {
      std::printf("position %lld: %.3f ms/token on the CPU reference (%.1f tokens/s)\n", pos,
                  first[i], 1e3 * tokens / first[i]);
    } else if (replayed) {
      std::printf("position %lld: replayed %.4f ms/step (%.1f tokens/s), eager %.4f ms/step "
                  "(%.2fx); floor/replayed %.3f\n",
                  pos, first[i], 1e3 * tokens / first[i], eager[i], eager[i] / first[i],
                  floor_ms / first[i]);
    } else {
      std::printf("position %lld: eager %.4f ms/step (%.1f tokens/s); floor/eager %.3f\n", pos,
                  first[i], 1e3 * tokens / first[i], floor_ms / first[i]);
    }
  }
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace sg::cli
