// Decode-step benchmark: Llama-3.2-1B's shape (bf16, deterministic random weights) decoded
// by a CUDA DecodeSession, as a user's decode loop runs it.
//
// What it measures. Each case times kSteps consecutive closed-loop steps with CUDA events
// between them (DecodeSession::TimedSteps: no host wait between steps) and reports them as
// manual iteration times, so the median and spread are per step:
//   Decode/<eager|replayed>/pos:<p>   batch 1 at context position p (100, 1000)
//   Bucket/replayed/batch:<b>         b sequences (buckets 1, 2, 4, 8, 16) at position 100
//   Decode/all_passes/pos:<p>         batch 1, replayed, with every graph pass
//   Decode/no_rope_epilogue/pos:<p>   batch 1, replayed, default passes but
//                                     rope_kv_write_epilogue (a RopeKvWrite node per layer)
//   Decode/min_blocks_<5|6>/pos:<p>   batch 1, replayed, default passes, the float
//                                     FusedMatMuls on the kernel compiled to hold 5 or 6
//                                     blocks an SM (CudaOptions::fused_float_min_blocks)
//   Decode/compiled_norm/pos:<p>      batch 1, replayed, default passes, RmsNorm through
//                                     the kernel compiled for the plan (NVRTC)
//   GenerateLoop/<per_step|device_loop>/batch:<b>
//                                     Generate(64) on the host clock at position 100, one
//                                     graph launch per step or one launch of the device
//                                     loop (SessionOptions::device_loop_steps = 64)
//   Quant/<q8_0|q4_0|q4_k_m>[_f32]/pos:100
//                                     batch 1, replayed, the same shape with block-format
//                                     weights (random blocks): every matrix in Q8_0 or
//                                     Q4_0, or a Q4_K_M file's mix; the floor is their
//                                     own weight bytes; activations bf16, or f32 (_f32) as
//                                     a GGUF file computes. Made on first use (quantizing
//                                     the 1.2B weights takes a while), so filter them out
//                                     to skip it; each one made gets a per-kernel table.
//   QuantBatch/q4_k_m/<path>/batch:<b> b sequences (4, 8, 16) at position 100 on the
//                                     Q4_K_M mix with f32 activations, as a GGUF file
//                                     computes: <path> kernel (the CUDA-core block-format
//                                     kernels, row groups of 8, plain graph), mma[_bf16]
//                                     (the tensor-core kernels, x in three bf16 parts or
//                                     one, CudaOptions::block_mma_min_rows; the fused
//                                     graph, or the plain one for mma_plain) or
//                                     gemm_<f32|tf32|bf16> (the block GEMM in that
//                                     precision, CudaOptions::block_gemm_*); the floor is
//                                     the weights' own bytes.
// The floor is the time to read every weight once at the bandwidth of a 1 GiB
// device-to-device cudaMemcpyAsync measured in the same run, counted as bytes read plus
// bytes written: floor = weight bytes / copy bandwidth; `floor_ratio` = floor / median
// (1.0 would be a step that only streams its weights at copy speed).
//
// After the cases: the batch-1 step's launches (stepgraph nodes per layer, CUDA graph
// nodes), the published batch-1 anchors for this model beside the replayed step, then a
// per-kernel table: one eager step at position 100 run with every launch queued
// behind a gate and an event after each node (DecodeSession::ProfileStep), median of
// kProfileRuns, each node beside the fewest bytes it must move and its own floor at the
// copy bandwidth, so that what stands between the replayed step and the floor can be read
// kernel by kernel.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "runtime/timing.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/runtime/measure.h"
#include "stepgraph/runtime/session.h"
#include "stepgraph/graph/passes.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/base/status.h"
#include "tests/testing/quantized_config.h"

namespace sg {
namespace {

constexpr int kSteps = 64;          // timed steps per case
constexpr int kWarmSteps = 4;       // untimed steps before each case
constexpr int kProfileRuns = 15;    // profiled eager steps, medians reported
constexpr int64_t kMaxSlots = 16;
constexpr int64_t kMaxSeq = 1280;   // position 1000 + warm-up + timed steps
constexpr int64_t kCopyBytes = int64_t{1} << 30;
constexpr int64_t kBucketPosition = 100;

struct Context {
  // The same model twice: steps replayed as CUDA graphs, and launched node by node.
  std::unique_ptr<DecodeSession> session;
  std::unique_ptr<DecodeSession> eager;
  // The replayed step without the graph passes (the plain graph), for before/after.
  std::unique_ptr<DecodeSession> unfused;
  // Batch 1 with every graph pass (norm_into_matmul too).
  std::unique_ptr<DecodeSession> all_passes;
  // Batch 1 with the default passes but the RoPE epilogue of the q/k/v matmul.
  std::unique_ptr<DecodeSession> no_rope_epilogue;
  // Batch 1 with the default passes and RmsNorm compiled for the plan.
  std::unique_ptr<DecodeSession> compiled_norm;
  // Batch 1 with the fused kernel held to 5 or 6 blocks an SM.
  std::unique_ptr<DecodeSession> min_blocks_5, min_blocks_6;
  // Buckets 1 and 4, Generate on the device loop (SessionOptions::device_loop_steps),
  // made on first use.
  std::unique_ptr<DecodeSession> device_loop;
  // The quantized models (BM_Quant) by name (format, activation dtype), made on first use.
  std::map<std::string, std::unique_ptr<DecodeSession>> quant;
  std::map<std::string, double> quant_ms;  // their replayed step (median ms)
  // The Q4_K_M batch sessions (BM_QuantBatch) by path, made on first use.
  std::map<std::string, std::unique_ptr<DecodeSession>> quant_batch;
  double copy_bytes_per_s = 0;  // read + write
  double floor_ms = 0;
  double replayed_ms_at_100 = 0;
};
Context* g = nullptr;

std::vector<int32_t> Prompt(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  uint64_t x = 0x9E3779B97F4A7C15ull ^ seed;
  for (int32_t& id : p) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab));
  }
  return p;
}

// Slots [0, rows) live with `position` tokens of context each; every other slot released.
absl::Status PrepareSlots(DecodeSession& s, int64_t rows, int64_t position) {
  for (int64_t i = 0; i < s.max_slots(); ++i) {
    if (i >= rows) {
      SG_RETURN_IF_ERROR(s.Release(i));
      continue;
    }
    // position + 1 prompt ids leave the next fed id at `position` once the warm-up is done.
    SG_RETURN_IF_ERROR(
        s.Prefill(i, Prompt(position + 1 - kWarmSteps, s.config().vocab_size, i)));
  }
  return s.Generate(kWarmSteps).status();
}

absl::Status TimeSteps(benchmark::State& state, int64_t rows, int64_t position, bool eager,
                       DecodeSession* other = nullptr) {
  DecodeSession& s = other != nullptr ? *other : eager ? *g->eager : *g->session;
  SG_RETURN_IF_ERROR(PrepareSlots(s, rows, position));
  absl::StatusOr<std::vector<double>> ms = s.TimedSteps(kSteps);
  SG_RETURN_IF_ERROR(ms.status());
  size_t i = 0;
  for (auto _ : state) state.SetIterationTime((*ms)[i++ % ms->size()] * 1e-3);
  const double median = Median(*ms);
  state.counters["median_ms"] = median;
  state.counters["tokens_per_s"] = 1e3 * static_cast<double>(rows) / median;
  state.counters["floor_ms"] = g->floor_ms;
  state.counters["floor_ratio"] = g->floor_ms / median;
  state.counters["nodes"] = s.plan(rows)->graph().num_nodes();
  if (!eager && other == nullptr && rows == 1 && position == kBucketPosition) {
    g->replayed_ms_at_100 = median;
  }
  return absl::OkStatus();
}

void BM_Decode(benchmark::State& state, int64_t position, bool eager) {
  if (absl::Status s = TimeSteps(state, 1, position, eager); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
  }
}

std::string QuantName(testing::MatrixFormat format, bool f32) {
  return absl::StrCat(testing::MatrixFormatName(format), f32 ? "_f32" : "");
}

// Times `rows` sequences on the quantized session `s`, made from `config` with `options`
// on first use, and reports the floor of its own weight bytes.
void TimeQuantSession(benchmark::State& state, std::unique_ptr<DecodeSession>& s,
                      absl::StatusOr<LlamaConfig> config, SessionOptions options, int64_t rows) {
  absl::Status status;
  if (s == nullptr) {
    status = config.status();
    if (status.ok()) {
      options.config = *std::move(config);
      options.backend = Backend::kCuda;
      options.max_seq = kMaxSeq;
      absl::StatusOr<std::unique_ptr<DecodeSession>> made = DecodeSession::Create(options);
      status = made.status();
      if (status.ok()) s = *std::move(made);
    }
  }
  if (status.ok()) status = TimeSteps(state, rows, kBucketPosition, false, s.get());
  if (!status.ok()) {
    state.SkipWithError(status.ToString().c_str());
    return;
  }
  // The floor of these weights' own bytes.
  const double floor_ms = 1e3 * static_cast<double>(s->weight_bytes()) / g->copy_bytes_per_s;
  state.counters["floor_ms"] = floor_ms;
  state.counters["floor_ratio"] = floor_ms / state.counters["median_ms"];
  state.counters["weight_gb"] = static_cast<double>(s->weight_bytes()) * 1e-9;
}

// f32: the activations (and the KV cache) in f32, as a GGUF file with quantized matrices
// computes; otherwise bf16.
// row_kernel false: the lm head and the o projections on the kernels they took before the
// one-row kernel (CudaOptions::block_row_min_cols and block_row_fused_max_k 0).
// gemv: CudaOptions::block_gemv_precision (auto, the default: int16x2 but for Q8_0;
// int16x2, int16, int8: x as integers in the one-row kernel, which then takes every
// one-row matmul but q/k/v and a long K's; f32: the f32 kernels throughout).
void BM_Quant(benchmark::State& state, testing::MatrixFormat format, bool f32,
              BlockUnitWalkOption walk, bool row_kernel, BlockGemvPrecision gemv) {
  SessionOptions o;
  o.max_slots = 1;
  o.buckets = {1};
  o.cuda.block_unit_walk = walk;
  o.cuda.block_gemv_precision = gemv;
  if (!row_kernel) {
    o.cuda.block_row_min_cols = 0;
    o.cuda.block_row_fused_max_k = 0;
  }
  LlamaConfig base = Llama32_1BConfig();
  if (f32) base.dtype = DType::kF32;
  const std::string name = QuantName(format, f32);
  TimeQuantSession(state,
                   g->quant[absl::StrCat(name, "/", static_cast<int>(walk),
                                         row_kernel ? "" : "/no_row", "/",
                                         BlockGemvPrecisionName(gemv))],
                   testing::WithMatrixDTypes(base,
                                             [format](const std::string& name) {
                                               return testing::MatrixDType(format, name);
                                             }),
                   o, 1);
  if (walk == BlockUnitWalkOption::kAuto && row_kernel && gemv == BlockGemvPrecision::kAuto) {
    g->quant_ms[name] = state.counters["median_ms"];
  }
}

// How a QuantBatch session runs its block-format matmuls.
struct BatchPath {
  const char* name;
  int64_t min_rows;  // CudaOptions::block_gemm_min_rows (0: the kernels below)
  BlockGemmPrecision precision;
  int64_t mma_rows = 0;  // CudaOptions::block_mma_min_rows (0: the CUDA-core kernels)
  bool fused = false;    // the passes at these batches (else the plain graph)
};

void BM_QuantBatch(benchmark::State& state, BatchPath path, int64_t rows) {
  LlamaConfig base = Llama32_1BConfig();
  base.dtype = DType::kF32;  // as a GGUF file with quantized matrices computes
  SessionOptions o;
  o.max_slots = 16;
  o.buckets = {4, 8, 16};
  o.cuda.block_gemm_min_rows = path.min_rows;
  o.cuda.block_gemm_precision = path.precision;
  o.cuda.block_mma_min_rows = path.mma_rows;
  o.passes_max_rows_block_formats = path.fused ? 64 : 0;
  TimeQuantSession(state, g->quant_batch[path.name],
                   testing::WithMatrixDTypes(base, testing::Q4KMixDType), o, rows);
}

// Batch 1 through another session: the plain graph, or every pass.
void BM_DecodeOther(benchmark::State& state, int64_t position, DecodeSession* other) {
  if (absl::Status s = TimeSteps(state, 1, position, false, other); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
  }
}

// Generate(kSteps) timed on the host clock (its one wait included), `rows` sequences at
// kBucketPosition: one graph launch per step (the default session) or launches of the
// device loop of kSteps steps. Reports ms per step and tokens/s.
void BM_GenerateLoop(benchmark::State& state, int64_t rows, bool loop) {
  if (loop && g->device_loop == nullptr) {
    SessionOptions o;
    o.config = Llama32_1BConfig();
    o.backend = Backend::kCuda;
    o.max_slots = 4;
    o.max_seq = kMaxSeq;
    o.buckets = {1, 4};
    o.device_loop_steps = kSteps;
    absl::StatusOr<std::unique_ptr<DecodeSession>> made = DecodeSession::Create(o);
    if (!made.ok()) return state.SkipWithError(made.status().ToString().c_str());
    g->device_loop = *std::move(made);
  }
  DecodeSession& s = loop ? *g->device_loop : *g->session;
  std::vector<double> ms;
  for (auto _ : state) {
    if (absl::Status st = PrepareSlots(s, rows, kBucketPosition); !st.ok()) {
      return state.SkipWithError(st.ToString().c_str());
    }
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<std::vector<std::vector<int32_t>>> ids = s.Generate(kSteps);
    const double elapsed =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!ids.ok()) return state.SkipWithError(ids.status().ToString().c_str());
    ms.push_back(elapsed / kSteps);
    state.SetIterationTime(elapsed * 1e-3);
  }
  const double median = Median(ms);
  state.counters["ms_per_step"] = median;
  state.counters["tokens_per_s"] = 1e3 * static_cast<double>(rows) / median;
}

void BM_Bucket(benchmark::State& state, int64_t rows) {
  if (absl::Status s = TimeSteps(state, rows, kBucketPosition, false); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
  }
}

// The fewest bytes a node must move in a batch-1 step at `position`: its inputs read
// once and its output written once, except where it touches only part of a tensor (the
// embedding rows it gathers, the cache row it writes, the cache prefix it attends over).
int64_t NodeBytes(const Graph& graph, const Node& node, int64_t position) {
  auto bytes = [&](TensorId id) { return graph.tensor(id).bytes(); };
  const std::string op(OpName(node.op));
  const Tensor& out = graph.tensor(node.output);
  if (op == "Embedding") return 2 * out.bytes() + bytes(node.inputs[1]);
  if (op == "KvWrite") return 2 * bytes(node.inputs[0]) + bytes(node.inputs[1]);
  // Reads q, k, v once, writes q and the k and v rows (the caches are not read).
  if (op == "RopeKvWrite") return 2 * bytes(node.inputs[0]) + bytes(node.inputs[1]);
  // The q/k/v matmul with RoPE and the cache writes: x, weights and pos read, q written,
  // and one k and one v row per step row written into the caches (its last two inputs).
  if (const auto* f = std::get_if<ops::FusedMatMul>(&node.op);
      f != nullptr && f->epilogue == ops::FusedMatMul::Epilogue::kRopeKvWrite) {
    int64_t total = out.bytes();
    for (size_t i = 0; i + 2 < node.inputs.size(); ++i) total += bytes(node.inputs[i]);
    const Tensor& cache = graph.tensor(node.inputs[node.inputs.size() - 1]);
    const int64_t rows = out.shape[0];
    return total + 2 * rows * cache.shape[1] * cache.shape[3] * DTypeBytes(cache.dtype);
  }
  if (op == "Attention") {
    const Tensor& cache = graph.tensor(node.inputs[1]);  // [slots, kvh, S, d]
    const int64_t rows = cache.shape[1] * (position + 1) * cache.shape[3];
    return bytes(node.inputs[0]) + out.bytes() + 2 * rows * DTypeBytes(cache.dtype);
  }
  int64_t total = out.bytes();
  for (TensorId in : node.inputs) total += bytes(in);
  return total;
}

// `replayed_ms`: the same session's replayed batch-1 step at kBucketPosition (0: unknown).
absl::Status PrintKernelTable(DecodeSession& s, const std::string& label, double replayed_ms) {
  SG_RETURN_IF_ERROR(PrepareSlots(s, 1, kBucketPosition));
  std::vector<std::vector<NodeTime>> runs;
  for (int r = 0; r < kProfileRuns; ++r) {
    SG_ASSIGN_OR_RETURN(std::vector<NodeTime> run, s.ProfileStep());
    runs.push_back(std::move(run));
  }
  const Graph& graph = s.plan(1)->graph();
  struct Row {
    double us = 0, floor_us = 0;
    int64_t bytes = 0;
    int nodes = 0;
  };
  std::map<std::string, Row> by_op;
  std::vector<std::pair<double, int32_t>> slowest;
  Row total;
  for (int32_t i = 0; i < graph.num_nodes(); ++i) {
    std::vector<double> t;
    for (const auto& run : runs) t.push_back(run[i].ms * 1e3);
    const double us = Median(t);
    // Position advances by one per profiled step; the middle one stands for all.
    const int64_t b = NodeBytes(graph, graph.nodes()[i], kBucketPosition + kProfileRuns / 2);
    const double floor_us = 1e6 * static_cast<double>(b) / g->copy_bytes_per_s;
    Row& r = by_op[runs[0][i].op];
    r.us += us;
    r.floor_us += floor_us;
    r.bytes += b;
    ++r.nodes;
    total.us += us;
    total.floor_us += floor_us;
    total.bytes += b;
    ++total.nodes;
    slowest.push_back({us - floor_us, i});
  }
  std::printf("\nPer-kernel breakdown (%s): one eager step, batch 1, position %lld, device time "
              "per node (median of %d); floor = fewest bytes / copy bandwidth (%.0f GB/s)\n",
              label.c_str(), static_cast<long long>(kBucketPosition), kProfileRuns,
              g->copy_bytes_per_s * 1e-9);
  std::printf("%-12s %6s %12s %11s %11s %11s %8s\n", "op", "nodes", "MB", "us", "floor us",
              "excess us", "of floor");
  std::vector<std::pair<double, std::string>> order;
  for (const auto& [op, r] : by_op) order.push_back({r.us, op});
  std::sort(order.rbegin(), order.rend());
  auto row = [](const std::string& name, const Row& r) {
    std::printf("%-12s %6d %12.2f %11.1f %11.1f %11.1f %8.3f\n", name.c_str(), r.nodes,
                static_cast<double>(r.bytes) * 1e-6, r.us, r.floor_us, r.us - r.floor_us,
                r.us > 0 ? r.floor_us / r.us : 0.0);
  };
  for (const auto& [us, op] : order) row(op, by_op[op]);
  row("all nodes", total);
  std::printf("replayed step at position %lld: %.1f us; weights-only floor %.1f us; sum of "
              "node times %.1f us (the difference to the replayed step is what the graph "
              "hides or adds between kernels)\n",
              static_cast<long long>(kBucketPosition), replayed_ms * 1e3,
              1e6 * static_cast<double>(s.weight_bytes()) / g->copy_bytes_per_s, total.us);
  if (replayed_ms > 0) {
    std::printf("per node, the eager stream with its events costs %.2f us more than the "
                "replayed graph: launch and event overhead the graph removes, spread over "
                "every row above\n",
                (total.us - replayed_ms * 1e3) / total.nodes);
  }
  std::sort(slowest.rbegin(), slowest.rend());
  std::printf("largest excess over the floor, by node:\n");
  for (size_t k = 0; k < std::min<size_t>(12, slowest.size()); ++k) {
    const NodeTime& n = runs[0][slowest[k].second];
    std::printf("  %9.1f us over  %-10s %s\n", slowest[k].first, n.op.c_str(), n.name.c_str());
  }
  std::fflush(stdout);
  return absl::OkStatus();
}

// Launches of the batch-1 step: stepgraph nodes in all and per layer (named
// "model.layers.<l>."; the median over layers), the rest (embedding, final norm, lm head,
// the closed loop's nodes), and the CUDA graph nodes its capture made.
void PrintLaunches(DecodeSession& s, const std::string& label) {
  const ExecutionPlan* plan = s.plan(1);
  if (plan == nullptr) return;
  const Graph& graph = plan->graph();
  const int64_t layers = s.config().num_hidden_layers;
  std::vector<int> per_layer(static_cast<size_t>(std::max<int64_t>(layers, 0)), 0);
  int outside = 0;
  constexpr absl::string_view kPrefix = "model.layers.";
  for (const Node& node : graph.nodes()) {
    absl::string_view name = node.name;
    int64_t layer = -1;
    if (absl::ConsumePrefix(&name, kPrefix)) {
      const size_t dot = name.find('.');
      if (!absl::SimpleAtoi(name.substr(0, dot), &layer)) layer = -1;
    }
    if (layer >= 0 && layer < layers) {
      ++per_layer[static_cast<size_t>(layer)];
    } else {
      ++outside;
    }
  }
  std::vector<int> sorted = per_layer;
  std::sort(sorted.begin(), sorted.end());
  int64_t graph_nodes = 0;
  StepRunner& runner = s.runner();
  for (int step = 0; step < runner.num_steps(); ++step) {
    if (&runner.plan(step) == plan) graph_nodes = runner.graph_nodes(step);
  }
  std::printf("\nLaunches (%s, batch-1 step): %d stepgraph nodes, %d per layer (median of %lld "
              "layers), %d outside the layers; %lld CUDA graph nodes in the captured step "
              "(%.1f per layer if every node outside the layers is one)\n",
              label.c_str(), graph.num_nodes(), sorted.empty() ? 0 : sorted[sorted.size() / 2],
              static_cast<long long>(layers), outside, static_cast<long long>(graph_nodes),
              layers > 0 ? static_cast<double>(graph_nodes - outside) / layers : 0.0);
}

// The published batch-1 times of this model's bf16 step (Llama-3.2-1B) beside the replayed
// step measured here (position 100), as ratios (> 1: stepgraph faster). The anchors are
// per GPU: read the row of the GPU this run used (the session's description names it).
void PrintAnchors(double replayed_ms) {
  if (replayed_ms <= 0) return;
  struct Anchor {
    const char* what;
    double h100_ms, h200_ms;
  };
  const Anchor anchors[] = {
      {"CUDA graph of ~100 kernels with PDL (megakernels-vs-cuda-graphs)", 0.980, 0.795},
      {"Hazy megakernel (\"No Bubbles\")", 0.973, 0.760},
      {"issue goal", 0.95, 0.75},
  };
  std::printf("\nPublished batch-1 anchors against this run's replayed step (%.3f ms at "
              "position %lld); ratio > 1: stepgraph faster\n%-66s %9s %7s %9s %7s\n",
              replayed_ms, static_cast<long long>(kBucketPosition), "", "H100 ms", "ratio",
              "H200 ms", "ratio");
  for (const Anchor& a : anchors) {
    std::printf("%-66s %9.3f %7.3f %9.3f %7.3f\n", a.what, a.h100_ms, a.h100_ms / replayed_ms,
                a.h200_ms, a.h200_ms / replayed_ms);
  }
  std::fflush(stdout);
}

absl::Status Setup() {
  SessionOptions o;
  o.config = Llama32_1BConfig();
  o.backend = Backend::kCuda;
  o.max_slots = kMaxSlots;
  o.max_seq = kMaxSeq;
  o.buckets = {1, 2, 4, 8, 16};
  const auto t0 = std::chrono::steady_clock::now();
  SG_ASSIGN_OR_RETURN(g->session, DecodeSession::Create(o));
  const double setup_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  o.eager = true;
  SG_ASSIGN_OR_RETURN(g->eager, DecodeSession::Create(o));
  o.eager = false;
  o.passes.enabled = false;
  SG_ASSIGN_OR_RETURN(g->unfused, DecodeSession::Create(o));
  o.buckets = {1};
  o.passes = PassOptions{};
  SG_ASSIGN_OR_RETURN(g->all_passes, DecodeSession::Create(o));
  o.passes = DefaultPassOptions();
  o.passes.disabled.insert("rope_kv_write_epilogue");
  SG_ASSIGN_OR_RETURN(g->no_rope_epilogue, DecodeSession::Create(o));
  o.passes = DefaultPassOptions();
  o.cuda.compiled_norm = true;
  SG_ASSIGN_OR_RETURN(g->compiled_norm, DecodeSession::Create(o));
  o.cuda.compiled_norm = false;
  o.cuda.fused_float_min_blocks = 5;
  SG_ASSIGN_OR_RETURN(g->min_blocks_5, DecodeSession::Create(o));
  o.cuda.fused_float_min_blocks = 6;
  SG_ASSIGN_OR_RETURN(g->min_blocks_6, DecodeSession::Create(o));
  o.cuda.fused_float_min_blocks = 0;
  const ExecutionPlan* fused_plan = g->session->plan(1);
  const ExecutionPlan* plain_plan = g->unfused->plan(1);
  if (fused_plan == nullptr || plain_plan == nullptr) return absl::InternalError("no bucket 1");
  std::printf("batch-1 step: %d nodes with the graph passes, %d without\n",
              fused_plan->graph().num_nodes(), plain_plan->graph().num_nodes());
  SG_ASSIGN_OR_RETURN(g->copy_bytes_per_s, CopyBandwidth(g->session->runner(), kCopyBytes, 10));
  g->floor_ms = 1e3 * static_cast<double>(g->session->weight_bytes()) / g->copy_bytes_per_s;
  std::printf("%s\nLlama-3.2-1B shape, random bf16 weights: %.3f GB of weights, KV cache %.1f MB; "
              "session made in %.1f s\n"
              "device-to-device copy %.1f GB/s (read + write); floor %.4f ms per step\n",
              g->session->Describe().c_str(), g->session->weight_bytes() * 1e-9,
              g->session->kv_cache_bytes() * 1e-6, setup_s, g->copy_bytes_per_s * 1e-9,
              g->floor_ms);
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace
}  // namespace sg

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (!sg::CudaDeviceFound()) {
    std::fprintf(stderr, "decode_bench: no CUDA device is available; nothing to measure.\n");
    return 0;
  }
  sg::Context context;
  sg::g = &context;
  if (absl::Status s = sg::Setup(); !s.ok()) {
    std::fprintf(stderr, "decode_bench: setup failed: %s\n", s.ToString().c_str());
    return 1;
  }
  for (const int64_t position : {int64_t{100}, int64_t{1000}}) {
    for (const bool eager : {true, false}) {
      benchmark::RegisterBenchmark(
          absl::StrCat("Decode/", eager ? "eager" : "replayed", "/pos:", position).c_str(),
          sg::BM_Decode, position, eager)
          ->UseManualTime()
          ->Iterations(sg::kSteps)
          ->Unit(benchmark::kMicrosecond);
    }
    for (const auto& [name, other] :
         {std::pair<const char*, sg::DecodeSession*>{"replayed_unfused", context.unfused.get()},
          {"all_passes", context.all_passes.get()},
          {"no_rope_epilogue", context.no_rope_epilogue.get()},
          {"compiled_norm", context.compiled_norm.get()},
          {"min_blocks_5", context.min_blocks_5.get()},
          {"min_blocks_6", context.min_blocks_6.get()}}) {
      benchmark::RegisterBenchmark(absl::StrCat("Decode/", name, "/pos:", position).c_str(),
                                   sg::BM_DecodeOther, position, other)
          ->UseManualTime()
          ->Iterations(sg::kSteps)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (const int64_t rows : {int64_t{1}, int64_t{4}}) {
    for (const bool loop : {false, true}) {
      benchmark::RegisterBenchmark(
          absl::StrCat("GenerateLoop/", loop ? "device_loop" : "per_step", "/batch:", rows)
              .c_str(),
          sg::BM_GenerateLoop, rows, loop)
          ->UseManualTime()
          ->Iterations(9)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (const int64_t rows : {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{8}, int64_t{16}}) {
    benchmark::RegisterBenchmark(absl::StrCat("Bucket/replayed/batch:", rows).c_str(),
                                 sg::BM_Bucket, rows)
        ->UseManualTime()
        ->Iterations(sg::kSteps)
        ->Unit(benchmark::kMicrosecond);
  }
  for (const auto& [format, f32] :
       {std::pair{sg::testing::MatrixFormat::kQ8_0, false},
        std::pair{sg::testing::MatrixFormat::kQ4_0, false},
        std::pair{sg::testing::MatrixFormat::kQ4KMix, false},
        std::pair{sg::testing::MatrixFormat::kQ4_0, true},
        std::pair{sg::testing::MatrixFormat::kQ4KMix, true}}) {
    benchmark::RegisterBenchmark(
        absl::StrCat("Quant/", sg::QuantName(format, f32), "/pos:100").c_str(), sg::BM_Quant,
        format, f32, sg::BlockUnitWalkOption::kAuto, true, sg::BlockGemvPrecision::kAuto)
        ->UseManualTime()
        ->Iterations(sg::kSteps)
        ->Unit(benchmark::kMicrosecond);
  }
  // The step without the one-row kernel.
  for (const auto format : {sg::testing::MatrixFormat::kQ4_0, sg::testing::MatrixFormat::kQ4KMix}) {
    benchmark::RegisterBenchmark(
        absl::StrCat("QuantNoRow/", sg::QuantName(format, true), "/pos:100").c_str(),
        sg::BM_Quant, format, true, sg::BlockUnitWalkOption::kAuto, false,
        sg::BlockGemvPrecision::kF32)
        ->UseManualTime()
        ->Iterations(sg::kSteps)
        ->Unit(benchmark::kMicrosecond);
  }
  // x as integers in the one-row kernel (CudaOptions::block_gemv_precision).
  for (const sg::BlockGemvPrecision gemv :
       {sg::BlockGemvPrecision::kF32, sg::BlockGemvPrecision::kInt16x2,
        sg::BlockGemvPrecision::kInt16, sg::BlockGemvPrecision::kInt8}) {
    for (const auto format : {sg::testing::MatrixFormat::kQ8_0, sg::testing::MatrixFormat::kQ4_0,
                              sg::testing::MatrixFormat::kQ4KMix}) {
      benchmark::RegisterBenchmark(
          absl::StrCat("QuantGemv/", sg::QuantName(format, true), "/",
                       sg::BlockGemvPrecisionName(gemv), "/pos:100")
              .c_str(),
          sg::BM_Quant, format, true, sg::BlockUnitWalkOption::kAuto, true, gemv)
          ->UseManualTime()
          ->Iterations(sg::kSteps)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  // The 32-value formats' walks of the CUDA-core block kernel (CudaOptions::block_unit_walk).
  for (const auto& [walk, walk_name] :
       {std::pair{sg::BlockUnitWalkOption::kSerial, "serial"},
        std::pair{sg::BlockUnitWalkOption::kWide, "wide"},
        std::pair{sg::BlockUnitWalkOption::kByWidth, "by_width"}}) {
    for (const auto format : {sg::testing::MatrixFormat::kQ4_0, sg::testing::MatrixFormat::kQ8_0}) {
      benchmark::RegisterBenchmark(
          absl::StrCat("QuantWalk/", sg::QuantName(format, true), "/", walk_name, "/pos:100")
              .c_str(),
          sg::BM_Quant, format, true, walk, true, sg::BlockGemvPrecision::kF32)
          ->UseManualTime()
          ->Iterations(sg::kSteps)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (const sg::BatchPath& path :
       {sg::BatchPath{"kernel", 0, sg::BlockGemmPrecision::kF32},
        sg::BatchPath{"mma", 0, sg::BlockGemmPrecision::kF32, 1, true},
        sg::BatchPath{"mma_plain", 0, sg::BlockGemmPrecision::kF32, 1, false},
        sg::BatchPath{"mma_bf16", 0, sg::BlockGemmPrecision::kBf16, 1, true},
        sg::BatchPath{"mma_f16x2", 0, sg::BlockGemmPrecision::kF16x2, 1, true},
        sg::BatchPath{"mma_f16", 0, sg::BlockGemmPrecision::kF16, 1, true},
        sg::BatchPath{"mma_int8", 0, sg::BlockGemmPrecision::kInt8, 1, true},
        sg::BatchPath{"gemm_f32", 1, sg::BlockGemmPrecision::kF32},
        sg::BatchPath{"gemm_tf32", 1, sg::BlockGemmPrecision::kTf32},
        sg::BatchPath{"gemm_bf16", 1, sg::BlockGemmPrecision::kBf16}}) {
    for (const int64_t rows : {int64_t{4}, int64_t{8}, int64_t{16}}) {
      benchmark::RegisterBenchmark(
          absl::StrCat("QuantBatch/q4_k_m/", path.name, "/batch:", rows).c_str(),
          sg::BM_QuantBatch, path, rows)
          ->UseManualTime()
          ->Iterations(sg::kSteps)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  sg::PrintLaunches(*context.session, "bf16");
  sg::PrintAnchors(context.replayed_ms_at_100);
  if (absl::Status s = sg::PrintKernelTable(*context.session, "bf16", context.replayed_ms_at_100);
      !s.ok()) {
    std::fprintf(stderr, "decode_bench: per-kernel breakdown failed: %s\n", s.ToString().c_str());
  }
  // Each quantized session the run made (the Quant cases), as its own table.
  for (const auto& [name, session] : context.quant) {
    if (session == nullptr) continue;
    sg::PrintLaunches(*session, name);
    if (absl::Status s = sg::PrintKernelTable(*session, name, context.quant_ms[name]); !s.ok()) {
      std::fprintf(stderr, "decode_bench: per-kernel breakdown of %s failed: %s\n", name.c_str(),
                   s.ToString().c_str());
    }
  }
  benchmark::Shutdown();
  // Free the session's device memory before the CUDA runtime tears down.
  context.session.reset();
  context.eager.reset();
  context.unfused.reset();
  context.all_passes.reset();
  context.no_rope_epilogue.reset();
  context.compiled_norm.reset();
  context.min_blocks_5.reset();
  context.min_blocks_6.reset();
  context.device_loop.reset();
  context.quant.clear();
  context.quant_batch.clear();
  return 0;
}
