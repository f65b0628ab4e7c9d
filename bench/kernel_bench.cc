// Kernel benchmarks: every kernel of the CUDA dispatcher (both matmul paths, cuBLASLt and
// the small-M kernel, and the kernels compiled for the plan through NVRTC) at Llama-3.2-1B
// decode shapes, bf16, M = 1 and 8, run through CudaDispatch::Run exactly as a step runs
// them.
//
// How it measures. Each case captures a CUDA graph of up to kMaxBatch launches of its node,
// each on its own set of buffers, and times replays with CUDA events (UseManualTime; the
// time per iteration is one launch). Sets are made large enough together to exceed three
// L2s where possible; where they cannot (small tensors), L2 is flushed by a memset between
// replays, outside the timed region, so every number is a DRAM number. Bytes are the
// fewest a launch must move (each input read once, each output written once). The ceiling
// is a 1 GiB device-to-device cudaMemcpyAsync measured in the same run, counted as bytes
// read plus bytes written; `of_copy` is a kernel's GB/s over it. A table of medians is
// printed at the end.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/timing.h"
#include "dispatch/cuda/cuda_handles.h"
#include "dispatch/cuda/cuda_status.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/base/half.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace {

// Llama-3.2-1B.
constexpr int64_t kHidden = 2048;
constexpr int64_t kHeads = 32;
constexpr int64_t kKvHeads = 8;
constexpr int64_t kHeadDim = 64;
constexpr int64_t kIntermediate = 8192;
constexpr int64_t kVocab = 128256;
constexpr int64_t kCacheSeq = 4096;  // sizes the KV cache KvWrite writes into

constexpr int kIterations = 30;  // timed replays per case; tables report the median
constexpr int kMaxBatch = 64;    // launches per replayed graph
constexpr int64_t kAlign = 256;
constexpr int64_t kCopyBytes = int64_t{1} << 30;

int64_t RoundUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

struct Result {
  std::string kernel;
  std::string shape;
  double us = 0;
  double gbps = 0;
  double of_copy = 0;
};

struct Context {
  UniqueStream stream;
  std::unique_ptr<CudaDispatch> dispatch;  // default matmul policy
  std::unique_ptr<CudaDispatch> cublaslt;  // as with STEPGRAPH_MATMUL=cublaslt
  std::unique_ptr<CudaDispatch> gemv;      // as with STEPGRAPH_MATMUL=gemv
  std::unique_ptr<CudaDispatch> compiled;  // RmsNorm compiled for the plan (NVRTC)
  DeviceMemory flush;
  int64_t flush_bytes = 0;
  int64_t l2_bytes = 0;
  double copy_gbps = 0;
  std::vector<Result> results;
};
Context* g = nullptr;

void Record(const Result& r) {
  for (Result& old : g->results) {
    if (old.kernel == r.kernel && old.shape == r.shape) {
      old = r;
      return;
    }
  }
  g->results.push_back(r);
}

// Non-zero random contents: floats uniform in [-range, range), ints in [0, int_hi).
std::vector<char> RandomBytes(DType dtype, int64_t count, uint64_t seed, float range,
                              int32_t int_hi) {
  std::vector<char> out(static_cast<size_t>(count * DTypeBytes(dtype)));
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&state] {  // xorshift64*
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return (state * 0x2545F4914F6CDD1Dull) >> 32;
  };
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t r = static_cast<uint32_t>(next());
    const float u = (static_cast<float>(r) / 4294967296.0f * 2.0f - 1.0f) * range;
    if (dtype == DType::kI32) {
      const int32_t v = int_hi > 0 ? static_cast<int32_t>(r % static_cast<uint32_t>(int_hi)) : 0;
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      StoreElement(out.data(), dtype, i, u);
    }
  }
  return out;
}

// Times `launches` launches per replay of `exec`, `kIterations` times, into `per_launch`
// seconds (one entry per replay). The flush, when asked for, is outside the events.
absl::Status TimeReplays(cudaGraphExec_t exec, int launches, bool flush,
                         benchmark::State& state, std::vector<double>& per_launch) {
  cudaStream_t stream = g->stream.get();
  SG_ASSIGN_OR_RETURN(UniqueEvent start, CreateEvent("kernel_bench start"));
  SG_ASSIGN_OR_RETURN(UniqueEvent stop, CreateEvent("kernel_bench stop"));
  for (auto _ : state) {
    if (flush) {
      SG_RETURN_IF_ERROR(ToStatus(cudaMemsetAsync(g->flush.get(), static_cast<int>(
                                                      per_launch.size() & 0x7f) + 1,
                                                  static_cast<size_t>(g->flush_bytes), stream),
                                  "cudaMemsetAsync(L2 flush)"));
    }
    SG_RETURN_IF_ERROR(ToStatus(cudaEventRecord(start.get(), stream), "cudaEventRecord"));
    SG_RETURN_IF_ERROR(ToStatus(cudaGraphLaunch(exec, stream), "cudaGraphLaunch"));
    SG_RETURN_IF_ERROR(ToStatus(cudaEventRecord(stop.get(), stream), "cudaEventRecord"));
    SG_RETURN_IF_ERROR(ToStatus(cudaEventSynchronize(stop.get()), "cudaEventSynchronize"));
    float ms = 0;
    SG_RETURN_IF_ERROR(
        ToStatus(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime"));
    const double seconds = static_cast<double>(ms) * 1e-3 / launches;
    state.SetIterationTime(seconds);
    per_launch.push_back(seconds);
  }
  return absl::OkStatus();
}

void Report(benchmark::State& state, const std::string& kernel, const std::string& shape,
            int64_t bytes, double flops, const std::vector<double>& per_launch) {
  const double t = Median(per_launch);
  const double gbps = t > 0 ? static_cast<double>(bytes) / t * 1e-9 : 0;
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["us"] = t * 1e6;
  state.counters["GB/s"] = gbps;
  state.counters["of_copy"] = g->copy_gbps > 0 ? gbps / g->copy_gbps : 0;
  if (flops > 0) state.counters["TFLOP/s"] = t > 0 ? flops / t * 1e-12 : 0;
  Record({kernel, shape, t * 1e6, gbps, g->copy_gbps > 0 ? gbps / g->copy_gbps : 0});
}

// ---- the ceiling: a 1 GiB device-to-device copy ----------------------------------------

absl::Status TimeCopy(int iterations, std::vector<double>& seconds,
                      benchmark::State* state) {
  cudaStream_t stream = g->stream.get();
  SG_ASSIGN_OR_RETURN(DeviceMemory src, AllocateDevice(kCopyBytes, "copy source"));
  SG_ASSIGN_OR_RETURN(DeviceMemory dst, AllocateDevice(kCopyBytes, "copy destination"));
  SG_RETURN_IF_ERROR(ToStatus(cudaMemsetAsync(src.get(), 0x5a, kCopyBytes, stream), "cudaMemset"));
  SG_ASSIGN_OR_RETURN(UniqueEvent start, CreateEvent("copy start"));
  SG_ASSIGN_OR_RETURN(UniqueEvent stop, CreateEvent("copy stop"));
  auto once = [&]() -> absl::StatusOr<double> {
    SG_RETURN_IF_ERROR(ToStatus(cudaEventRecord(start.get(), stream), "cudaEventRecord"));
    SG_RETURN_IF_ERROR(ToStatus(cudaMemcpyAsync(dst.get(), src.get(), kCopyBytes,
                                                cudaMemcpyDeviceToDevice, stream),
                                "cudaMemcpyAsync"));
    SG_RETURN_IF_ERROR(ToStatus(cudaEventRecord(stop.get(), stream), "cudaEventRecord"));
    SG_RETURN_IF_ERROR(ToStatus(cudaEventSynchronize(stop.get()), "cudaEventSynchronize"));
    float ms = 0;
    SG_RETURN_IF_ERROR(
        ToStatus(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime"));
    return static_cast<double>(ms) * 1e-3;
  };
  SG_RETURN_IF_ERROR(once().status());  // warm-up
  if (state != nullptr) {
    for (auto _ : *state) {
      SG_ASSIGN_OR_RETURN(double s, once());
      state->SetIterationTime(s);
      seconds.push_back(s);
    }
  } else {
    for (int i = 0; i < iterations; ++i) {
      SG_ASSIGN_OR_RETURN(double s, once());
      seconds.push_back(s);
    }
  }
  return absl::OkStatus();
}

void BM_DeviceCopy(benchmark::State& state) {
  std::vector<double> seconds;
  if (absl::Status s = TimeCopy(0, seconds, &state); !s.ok()) {
    state.SkipWithError(std::string(s.message()).c_str());
    return;
  }
  Report(state, "D2D copy (ceiling)", "1 GiB", 2 * kCopyBytes, 0, seconds);
}

// ---- one node, many buffer sets ---------------------------------------------------------

struct TensorSpec {
  bool shared = false;  // one buffer for all sets (a large table or cache)
  float range = 1.0f;
  int32_t int_hi = 0;
};

struct Case {
  std::string kernel;
  std::string shape;
  std::function<void(GraphBuilder&)> build;  // declares tensors and adds one node
  std::map<std::string, TensorSpec> specs;   // by tensor name; defaults otherwise
  CudaDispatch* dispatch = nullptr;
  int64_t bytes = 0;  // fewest bytes one launch moves
  double flops = 0;
};

absl::Status RunCase(benchmark::State& state, const Case& c) {
  GraphBuilder builder;
  c.build(builder);
  SG_ASSIGN_OR_RETURN(Graph graph, std::move(builder).Build());
  SG_ASSIGN_OR_RETURN(ExecutionPlan plan, ExecutionPlan::Create(std::move(graph)));
  SG_ASSIGN_OR_RETURN(const PreparedPlan prepared, c.dispatch->Prepare(plan));
  const Graph& gr = plan.graph();
  if (gr.num_nodes() != 1) return absl::InternalError("a case must have exactly one node");
  const Node& node = gr.nodes()[0];

  // The node's tensors, each once (an in-place output is also its last input).
  std::vector<int32_t> tensors;
  for (TensorId id : node.inputs) tensors.push_back(id.index);
  if (std::find(tensors.begin(), tensors.end(), node.output.index) == tensors.end()) {
    tensors.push_back(node.output.index);
  }
  auto spec_of = [&](int32_t t) {
    auto it = c.specs.find(gr.tensors()[t].name);
    return it == c.specs.end() ? TensorSpec{} : it->second;
  };
  std::map<int32_t, int64_t> offset;  // shared: from the pool's start; else within a set
  int64_t shared_bytes = 0, set_bytes = 0;
  for (int32_t t : tensors) {
    const int64_t bytes = RoundUp(gr.tensors()[t].bytes(), kAlign);
    int64_t& end = spec_of(t).shared ? shared_bytes : set_bytes;
    offset[t] = end;
    end += bytes;
  }
  const int64_t target = 3 * g->l2_bytes;
  const int batch =
      set_bytes == 0
          ? kMaxBatch
          : static_cast<int>(std::clamp<int64_t>((target + set_bytes - 1) / set_bytes, 1, kMaxBatch));
  const bool flush = batch * set_bytes < target;

  SG_ASSIGN_OR_RETURN(DeviceMemory pool,
                      AllocateDevice(shared_bytes + batch * set_bytes, "benchmark buffers"));
  char* base = static_cast<char*>(pool.get());
  auto address = [&](int32_t t, int set) {
    return spec_of(t).shared ? base + offset[t]
                             : base + shared_bytes + set * set_bytes + offset[t];
  };
  for (int32_t t : tensors) {
    const Tensor& tensor = gr.tensors()[t];
    const TensorSpec spec = spec_of(t);
    const std::vector<char> host = RandomBytes(tensor.dtype, tensor.shape.NumElements(),
                                               static_cast<uint64_t>(t) + 1, spec.range,
                                               spec.int_hi);
    SG_RETURN_IF_ERROR(ToStatus(cudaMemcpy(address(t, 0), host.data(), host.size(),
                                           cudaMemcpyHostToDevice),
                                "cudaMemcpy(benchmark input)"));
  }
  for (int s = 1; s < batch && set_bytes > 0; ++s) {
    SG_RETURN_IF_ERROR(ToStatus(cudaMemcpy(base + shared_bytes + s * set_bytes,
                                           base + shared_bytes, set_bytes,
                                           cudaMemcpyDeviceToDevice),
                                "cudaMemcpy(benchmark set)"));
  }
  // The copies ran on the legacy stream, which the benchmark's stream does not wait for.
  SG_RETURN_IF_ERROR(ToStatus(cudaDeviceSynchronize(), "sync after upload"));

  auto arg = [&](int32_t t, int set) {
    const Tensor& tensor = gr.tensors()[t];
    TensorArg a;
    a.data = address(t, set);
    a.dtype = tensor.dtype;
    a.shape = tensor.shape;
    a.kind = tensor.kind;
    a.tensor = t;
    a.name = tensor.name;
    return a;
  };
  std::vector<std::vector<TensorArg>> inputs(batch);
  std::vector<NodeArgs> args(batch);
  for (int s = 0; s < batch; ++s) {
    for (TensorId id : node.inputs) inputs[s].push_back(arg(id.index, s));
    args[s].node_index = 0;
    args[s].prepared = prepared.node(0);
    args[s].node_name = node.name;
    args[s].inputs = absl::MakeConstSpan(inputs[s]);
    args[s].output = arg(node.output.index, s);
  }
  auto run = [&](int s) {
    return std::visit([&](const auto& op) { return c.dispatch->Run(op, args[s]); }, node.op);
  };

  // Eagerly once, to surface errors with their message rather than as a capture failure.
  SG_RETURN_IF_ERROR(run(0));
  SG_ASSIGN_OR_RETURN(uint32_t flags, c.dispatch->TakeErrorFlags());
  if (flags != 0) return absl::InternalError(absl::StrCat("kernel raised error flags ", flags));

  cudaStream_t stream = g->stream.get();
  SG_RETURN_IF_ERROR(ToStatus(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                              "cudaStreamBeginCapture"));
  absl::Status captured = absl::OkStatus();
  for (int s = 0; s < batch && captured.ok(); ++s) captured = run(s);
  cudaGraph_t raw_graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &raw_graph);
  UniqueGraph cuda_graph(raw_graph);
  SG_RETURN_IF_ERROR(captured);
  SG_RETURN_IF_ERROR(ToStatus(end, "cudaStreamEndCapture"));
  cudaGraphExec_t raw_exec = nullptr;
  SG_RETURN_IF_ERROR(
      ToStatus(cudaGraphInstantiate(&raw_exec, cuda_graph.get(), 0), "cudaGraphInstantiate"));
  UniqueGraphExec exec(raw_exec);
  SG_RETURN_IF_ERROR(ToStatus(cudaGraphLaunch(exec.get(), stream), "cudaGraphLaunch (warm-up)"));
  SG_RETURN_IF_ERROR(ToStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));

  std::vector<double> per_launch;
  SG_RETURN_IF_ERROR(TimeReplays(exec.get(), batch, flush, state, per_launch));
  SG_RETURN_IF_ERROR(ToStatus(cudaGetLastError(), "after the timed replays"));
  Report(state, c.kernel, c.shape, c.bytes, c.flops, per_launch);
  state.counters["launches_per_graph"] = batch;
  return absl::OkStatus();
}

// ---- the cases -------------------------------------------------------------------------

constexpr DType kT = DType::kBF16;
constexpr int64_t kE = 2;  // bytes per bf16

// The kernels other than the matmuls at M rows.
void AddMemoryBoundCases(std::vector<Case>& cases, int64_t m) {
  // The built-in RmsNorm, and the one compiled for the plan through NVRTC.
  for (const auto& [kernel, dispatch] :
       {std::pair<const char*, CudaDispatch*>{"RmsNorm", g->dispatch.get()},
        {"RmsNorm (compiled)", g->compiled.get()}}) {
    cases.push_back({.kernel = kernel,
                     .shape = absl::StrCat("[", m, ",", kHidden, "]"),
                     .build = [=](GraphBuilder& b) {
                       b.Output("y", b.RmsNorm(b.Input("x", kT, {m, kHidden}),
                                               b.Weight("w", kT, {kHidden}), 1e-5f));
                     },
                     .dispatch = dispatch,
                     .bytes = (2 * m * kHidden + kHidden) * kE});
  }
  // A chain the elementwise_chain pass makes: silu(g)·u + r in one compiled kernel,
  // against SiluMul and Add above (two launches, the product written and read back).
  cases.push_back({.kernel = "FusedElementwise",
                   .shape = absl::StrCat("silu_mul+add [", m, ",", kIntermediate, "]"),
                   .build = [=](GraphBuilder& b) {
                     ops::FusedElementwise op;
                     op.num_steps = 2;
                     op.steps[0] = {ops::FusedElementwise::Kind::kSiluMul, 0, 1};
                     op.steps[1] = {ops::FusedElementwise::Kind::kAdd, 3, 2};
                     b.Output("y", b.FusedElementwise(
                                       op, {b.Input("g", kT, {m, kIntermediate}),
                                            b.Input("u", kT, {m, kIntermediate}),
                                            b.Input("r", kT, {m, kIntermediate})}));
                   },
                   .specs = {{"g", {.range = 6.0f}}, {"u", {.range = 6.0f}}},
                   .dispatch = g->dispatch.get(),
                   .bytes = 4 * m * kIntermediate * kE});
  cases.push_back({.kernel = "Add",
                   .shape = absl::StrCat("[", m, ",", kIntermediate, "]"),
                   .build = [=](GraphBuilder& b) {
                     b.Output("y", b.Add(b.Input("a", kT, {m, kIntermediate}),
                                         b.Input("b", kT, {m, kIntermediate})));
                   },
                   .dispatch = g->dispatch.get(),
                   .bytes = 3 * m * kIntermediate * kE});
  cases.push_back({.kernel = "SiluMul",
                   .shape = absl::StrCat("[", m, ",", kIntermediate, "]"),
                   .build = [=](GraphBuilder& b) {
                     b.Output("y", b.SiluMul(b.Input("g", kT, {m, kIntermediate}),
                                             b.Input("u", kT, {m, kIntermediate})));
                   },
                   .specs = {{"g", {.range = 6.0f}}, {"u", {.range = 6.0f}}},
                   .dispatch = g->dispatch.get(),
                   .bytes = 3 * m * kIntermediate * kE});
  cases.push_back(
      {.kernel = "Rope (q, llama3)",
       .shape = absl::StrCat("[", m, ",", kHeads * kHeadDim, "]"),
       .build = [=](GraphBuilder& b) {
         ops::Rope rope{.head_dim = kHeadDim, .theta = 500000.0f};
         rope.scaling = {ops::RopeScaling::Type::kLlama3, 32.0f, 1.0f, 4.0f, 8192};
         b.Output("y", b.Rope(b.Input("x", kT, {m, kHeads * kHeadDim}),
                              b.Input("pos", DType::kI32, {m}), rope));
       },
       .specs = {{"pos", {.int_hi = 8192}}},
       .dispatch = g->dispatch.get(),
       .bytes = 2 * m * kHeads * kHeadDim * kE + m * 4});
  cases.push_back(
      {.kernel = "KvWrite",
       .shape = absl::StrCat("[", m, ",", kKvHeads * kHeadDim, "] -> [", m, ",", kKvHeads,
                             ",", kCacheSeq, ",", kHeadDim, "]"),
       .build = [=](GraphBuilder& b) {
         b.KvWrite(b.Input("kv", kT, {m, kKvHeads * kHeadDim}), b.Input("pos", DType::kI32, {m}),
                   b.State("cache", kT, {m, kKvHeads, kCacheSeq, kHeadDim}));
       },
       .specs = {{"pos", {.int_hi = kCacheSeq}}, {"cache", {.shared = true}}},
       .dispatch = g->dispatch.get(),
       .bytes = 2 * m * kKvHeads * kHeadDim * kE + m * 4});
  cases.push_back({.kernel = "Embedding",
                   .shape = absl::StrCat("ids[", m, "] of [", kVocab, ",", kHidden, "]"),
                   .build = [=](GraphBuilder& b) {
                     b.Output("y", b.Embedding(b.Weight("table", kT, {kVocab, kHidden}),
                                               b.Input("ids", DType::kI32, {m})));
                   },
                   .specs = {{"ids", {.int_hi = static_cast<int32_t>(kVocab)}},
                             {"table", {.shared = true}}},
                   .dispatch = g->dispatch.get(),
                   .bytes = 2 * m * kHidden * kE + m * 4});
  cases.push_back({.kernel = "Softmax",
                   .shape = absl::StrCat("[", m, ",", kVocab, "]"),
                   .build = [=](GraphBuilder& b) {
                     b.Output("y", b.Softmax(b.Input("x", kT, {m, kVocab})));
                   },
                   .specs = {{"x", {.range = 8.0f}}},
                   .dispatch = g->dispatch.get(),
                   .bytes = 2 * m * kVocab * kE});
}

// The fused ops of the graph passes (stepgraph/graph/passes.h) at M rows, as the Llama-3.2-1B
// step uses them; bytes are the weights, x, the norm weight and the outputs once.
void AddFusedCases(std::vector<Case>& cases, int64_t m) {
  using Epilogue = ops::FusedMatMul::Epilogue;
  const std::string ms = absl::StrCat("M=", m);
  const int64_t h = kHidden, kv = kKvHeads * kHeadDim, q = kHeads * kHeadDim;
  // With and without the folded RmsNorm (the default passes leave it out).
  for (const bool norm : {true, false}) {
    cases.push_back({.kernel = norm ? "Fused/norm+qkv" : "Fused/qkv",
                     .shape = absl::StrCat(ms, " N=", q, "+", kv, "+", kv, " K=", h),
                     .build = [=](GraphBuilder& b) {
                       std::vector<TensorId> in = {b.Input("x", kT, {m, h})};
                       if (norm) in.push_back(b.Weight("nw", kT, {h}));
                       for (const auto& [name, n] : {std::pair<const char*, int64_t>{"wq", q},
                                                     {"wk", kv}, {"wv", kv}}) {
                         in.push_back(b.Weight(name, kT, {n, h}));
                       }
                       b.Output("y", b.FusedMatMul({.norm = norm, .eps = 1e-5f, .weights = 3},
                                                   in));
                     },
                     .dispatch = g->dispatch.get(),
                     .bytes = (m * h + (norm ? h : 0) + (q + 2 * kv) * h + m * (q + 2 * kv)) * kE,
                     .flops = 2.0 * static_cast<double>(m * (q + 2 * kv) * h)});
  }
  // The q/k/v matmul with RoPE and the KV-cache write in its epilogue (the default
  // passes' node): against Fused/qkv plus RopeKvWrite.
  cases.push_back({.kernel = "Fused/qkv+rope_kv_write",
                   .shape = absl::StrCat(ms, " N=", q, "+", kv, "+", kv, " K=", h),
                   .build = [=](GraphBuilder& b) {
                     ops::Rope rope{.head_dim = kHeadDim, .theta = 500000.0f};
                     rope.scaling = {ops::RopeScaling::Type::kLlama3, 32.0f, 1.0f, 4.0f, 8192};
                     b.Output("y", b.FusedMatMul(
                                       {.weights = 3, .epilogue = Epilogue::kRopeKvWrite,
                                        .rope = rope},
                                       {b.Input("x", kT, {m, h}), b.Weight("wq", kT, {q, h}),
                                        b.Weight("wk", kT, {kv, h}), b.Weight("wv", kT, {kv, h}),
                                        b.Input("pos", DType::kI32, {m}),
                                        b.State("kc", kT, {m, kKvHeads, kCacheSeq, kHeadDim}),
                                        b.State("vc", kT, {m, kKvHeads, kCacheSeq, kHeadDim})}));
                   },
                   .specs = {{"pos", {.int_hi = kCacheSeq}},
                             {"kc", {.shared = true}},
                             {"vc", {.shared = true}}},
                   .dispatch = g->dispatch.get(),
                   .bytes = (m * h + (q + 2 * kv) * h + m * (q + 2 * kv)) * kE + m * 4,
                   .flops = 2.0 * static_cast<double>(m * (q + 2 * kv) * h)});
  cases.push_back({.kernel = "Fused/k (split-K)",
                   .shape = absl::StrCat(ms, " N=", kv, " K=", h),
                   .build = [=](GraphBuilder& b) {
                     b.Output("y", b.FusedMatMul({}, {b.Input("x", kT, {m, h}),
                                                      b.Weight("w", kT, {kv, h})}));
                   },
                   .dispatch = g->dispatch.get(),
                   .bytes = (m * h + kv * h + m * kv) * kE,
                   .flops = 2.0 * static_cast<double>(m * kv * h)});
  struct Residual {
    const char* what;
    int64_t n, k;
  };
  for (const Residual& r : {Residual{"o", h, q}, Residual{"down", h, kIntermediate}}) {
    const int64_t n = r.n, k = r.k;
    cases.push_back({.kernel = absl::StrCat("Fused/", r.what, "+residual"),
                     .shape = absl::StrCat(ms, " N=", n, " K=", k),
                     .build = [=](GraphBuilder& b) {
                       b.Output("y", b.FusedMatMul({.epilogue = Epilogue::kAdd},
                                                   {b.Input("x", kT, {m, k}),
                                                    b.Weight("w", kT, {n, k}),
                                                    b.Input("residual", kT, {m, n})}));
                     },
                     .dispatch = g->dispatch.get(),
                     .bytes = (m * k + n * k + 2 * m * n) * kE,
                     .flops = 2.0 * static_cast<double>(m * n * k)});
  }
  for (const bool norm : {true, false}) {
    cases.push_back({.kernel = norm ? "Fused/norm+gate/up+silu" : "Fused/gate/up+silu",
                     .shape = absl::StrCat(ms, " N=2x", kIntermediate, " K=", h),
                     .build = [=](GraphBuilder& b) {
                       std::vector<TensorId> in = {b.Input("x", kT, {m, h})};
                       if (norm) in.push_back(b.Weight("nw", kT, {h}));
                       in.push_back(b.Weight("wg", kT, {kIntermediate, h}));
                       in.push_back(b.Weight("wu", kT, {kIntermediate, h}));
                       b.Output("y", b.FusedMatMul({.norm = norm, .eps = 1e-5f, .weights = 2,
                                                    .epilogue = Epilogue::kSiluMul},
                                                   in));
                     },
                     .dispatch = g->dispatch.get(),
                     .bytes = (m * h + (norm ? h : 0) + 2 * kIntermediate * h + m * kIntermediate) * kE,
                     .flops = 4.0 * static_cast<double>(m * kIntermediate * h)});
  }
  cases.push_back({.kernel = "Fused/norm+lmhead+argmax",
                   .shape = absl::StrCat(ms, " N=", kVocab, " K=", h),
                   .build = [=](GraphBuilder& b) {
                     b.Output("y", b.FusedMatMul({.norm = true, .eps = 1e-5f,
                                                  .epilogue = Epilogue::kArgmax},
                                                 {b.Input("x", kT, {m, h}),
                                                  b.Weight("nw", kT, {h}),
                                                  b.Weight("w", kT, {kVocab, h})}));
                   },
                   .dispatch = g->dispatch.get(),
                   .bytes = (m * h + h + kVocab * h) * kE + m * 4,
                   .flops = 2.0 * static_cast<double>(m * kVocab * h)});
  cases.push_back(
      {.kernel = "RopeKvWrite",
       .shape = absl::StrCat("[", m, ",", q + 2 * kv, "] -> q, 2 x [", m, ",", kKvHeads, ",",
                             kCacheSeq, ",", kHeadDim, "]"),
       .build = [=](GraphBuilder& b) {
         ops::Rope rope{.head_dim = kHeadDim, .theta = 500000.0f};
         rope.scaling = {ops::RopeScaling::Type::kLlama3, 32.0f, 1.0f, 4.0f, 8192};
         b.Output("y", b.RopeKvWrite(b.Input("qkv", kT, {m, q + 2 * kv}),
                                     b.Input("pos", DType::kI32, {m}),
                                     b.State("kc", kT, {m, kKvHeads, kCacheSeq, kHeadDim}),
                                     b.State("vc", kT, {m, kKvHeads, kCacheSeq, kHeadDim}),
                                     rope));
       },
       .specs = {{"pos", {.int_hi = kCacheSeq}}, {"kc", {.shared = true}}, {"vc", {.shared = true}}},
       .dispatch = g->dispatch.get(),
       .bytes = 2 * m * (q + 2 * kv) * kE + m * 4});
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  // Every kernel at M = 1 and 8; the matmuls also at 2 and 4, where the small-M kernel and
  // cuBLASLt trade places (the dispatcher's automatic choice follows these numbers).
  for (int64_t m : {1, 2, 4, 8}) {
    const std::string ms = absl::StrCat("M=", m);
    if (m == 1 || m == 8) AddMemoryBoundCases(cases, m);
    AddFusedCases(cases, m);

    struct Projection {
      const char* what;
      int64_t n, k;
    };
    for (const Projection& p : {Projection{"q/o", kHidden, kHidden},
                                Projection{"k/v", kKvHeads * kHeadDim, kHidden},
                                Projection{"gate/up", kIntermediate, kHidden},
                                Projection{"down", kHidden, kIntermediate},
                                Projection{"lm head", kVocab, kHidden}}) {
      for (const auto& [path, dispatch] :
           {std::pair<const char*, CudaDispatch*>{"cublaslt", g->cublaslt.get()},
            std::pair<const char*, CudaDispatch*>{"gemv", g->gemv.get()}}) {
        const int64_t n = p.n, k = p.k;
        cases.push_back({.kernel = absl::StrCat("MatMul/", path),
                         .shape = absl::StrCat(ms, " N=", n, " K=", k, " (", p.what, ")"),
                         .build = [=](GraphBuilder& b) {
                           b.Output("y", b.MatMul(b.Input("x", kT, {m, k}),
                                                  b.Weight("w", kT, {n, k})));
                         },
                         .dispatch = dispatch,
                         .bytes = (m * k + n * k + m * n) * kE,
                         .flops = 2.0 * static_cast<double>(m * n * k)});
      }
    }
  }
  return cases;
}

void PrintTable() {
  std::printf("\n%-20s %-44s %10s %9s %8s\n", "kernel", "shape", "us", "GB/s", "of copy");
  for (const Result& r : g->results) {
    std::printf("%-20s %-44s %10.2f %9.1f %8.3f\n", r.kernel.c_str(), r.shape.c_str(), r.us,
                r.gbps, r.of_copy);
  }
  std::fflush(stdout);
}

absl::StatusOr<std::unique_ptr<CudaDispatch>> DispatchWithMatmulPolicy(
    MatmulPolicy policy, bool compiled_norm = false) {
  CudaDispatch::Options options;
  options.stream = g->stream.get();
  options.cuda.matmul = policy;
  options.cuda.compiled_norm = compiled_norm;
  return CudaDispatch::Create(options);
}

absl::Status Setup() {
  SG_ASSIGN_OR_RETURN(g->stream, CreateStream("kernel_bench"));
  SG_ASSIGN_OR_RETURN(g->dispatch, DispatchWithMatmulPolicy(MatmulPolicy::kAuto));
  SG_ASSIGN_OR_RETURN(g->cublaslt, DispatchWithMatmulPolicy(MatmulPolicy::kCublasLt));
  SG_ASSIGN_OR_RETURN(g->gemv, DispatchWithMatmulPolicy(MatmulPolicy::kGemv));
  SG_ASSIGN_OR_RETURN(g->compiled, DispatchWithMatmulPolicy(MatmulPolicy::kAuto, true));
  g->l2_bytes = g->dispatch->device_info().l2_bytes;
  g->flush_bytes = std::max<int64_t>(2 * g->l2_bytes, 64 << 20);
  SG_ASSIGN_OR_RETURN(g->flush, AllocateDevice(g->flush_bytes, "the L2 flush buffer"));
  std::vector<double> seconds;
  SG_RETURN_IF_ERROR(TimeCopy(10, seconds, nullptr));
  g->copy_gbps = 2.0 * static_cast<double>(kCopyBytes) / Median(seconds) * 1e-9;
  return absl::OkStatus();
}

}  // namespace
}  // namespace sg

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (!sg::CudaDeviceAvailable()) {
    std::fprintf(stderr, "kernel_bench: no CUDA device is available; nothing to measure.\n");
    return 0;
  }
  sg::Context context;
  sg::g = &context;
  if (absl::Status s = sg::Setup(); !s.ok()) {
    std::fprintf(stderr, "kernel_bench: setup failed: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("device: %d SMs, L2 %lld MiB, compute capability %d; D2D copy %.1f GB/s\n",
              context.dispatch->device_info().sm_count,
              static_cast<long long>(context.l2_bytes >> 20),
              context.dispatch->device_info().compute_capability, context.copy_gbps);

  benchmark::RegisterBenchmark("D2DCopy/1GiB", sg::BM_DeviceCopy)
      ->UseManualTime()
      ->Iterations(sg::kIterations)
      ->Unit(benchmark::kMicrosecond);
  for (const sg::Case& c : sg::Cases()) {
    benchmark::RegisterBenchmark(absl::StrCat(c.kernel, "/", c.shape).c_str(),
                                 [c](benchmark::State& state) {
                                   if (absl::Status s = sg::RunCase(state, c); !s.ok()) {
                                     state.SkipWithError(s.ToString().c_str());
                                   }
                                 })
        ->UseManualTime()
        ->Iterations(sg::kIterations)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  sg::PrintTable();
  benchmark::Shutdown();
  return 0;
}
