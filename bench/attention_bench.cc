// Benchmarks of decode attention, prefill attention (chunks of 256 and 2,048 rows; bf16
// and f32, each also on the row-by-row kernel; the prefill launcher's tensor-core and
// CUDA-core kernels for bf16 and f16),
// Argmax and Sample at Llama-3.2-1B shapes (32 heads, 8 kv
// heads, head dim 64, vocab 128256, bf16), M = 1 and 8, run through CudaDispatch exactly
// as a step runs them, plus sweeps that call the launchers directly: attention at fixed
// chunk counts (to tune ChooseAttentionChunks) and argmax at one block per row.
//
// How it measures. A case captures a CUDA graph of several launches of its node, each on
// its own buffers, together larger than two L2s where memory allows, so that the K/V
// bytes come from DRAM; it times replays with CUDA events (UseManualTime; one iteration is
// one launch) and the table reports the median. Bytes are what a launch must move: for
// attention the K and V rows 0..pos actually read plus q and the output; for Argmax and
// Sample the logits once. The ceiling is a 1 GiB device-to-device cudaMemcpyAsync in the
// same run, counted as bytes read plus written; `of_copy` is GB/s over it.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/timing.h"
#include "dispatch/cuda/cuda_handles.h"
#include "dispatch/cuda/cuda_status.h"
#include "kernels/attention.cuh"
#include "kernels/sampling.cuh"
#include "stepgraph/graph/builder.h"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/base/half.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace {

constexpr int64_t kHeads = 32;
constexpr int64_t kKvHeads = 8;
constexpr int64_t kHeadDim = 64;
constexpr int64_t kVocab = 128256;
constexpr int kIterations = 30;   // timed replays per case
constexpr int kMaxLaunches = 512;  // launches per replayed graph, at most
constexpr int64_t kCopyBytes = int64_t{1} << 30;

struct Result {
  std::string kernel, shape;
  double us = 0, gbps = 0, of_copy = 0;
};

struct Context {
  UniqueStream stream;
  std::unique_ptr<CudaDispatch> dispatch;
  int sm_count = 0;
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

// Random bf16 (or f16, f32) values uniform in [-range, range) (never zeros), or i32 values
// `fill`.
absl::StatusOr<DeviceMemory> Upload(DType dtype, int64_t count, uint64_t seed, float range,
                                    int32_t fill = 0) {
  std::vector<uint16_t> half;
  std::vector<int32_t> ints;
  std::vector<float> floats;  // f32: the same values, unrounded
  const void* src = nullptr;
  if (dtype == DType::kI32) {
    ints.assign(count, fill);
    src = ints.data();
  } else {
    half.resize(count);
    if (dtype == DType::kF32) floats.resize(count);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < count; ++i) {
      s ^= s >> 12;
      s ^= s << 25;
      s ^= s >> 27;
      const float u = (static_cast<float>((s * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f * 2 - 1) * range;
      const float value = u == 0.0f ? 0.5f * range : u;
      half[i] = dtype == DType::kF16 ? FloatToHalf(value) : FloatToBF16(value);
      if (dtype == DType::kF32) floats[i] = u == 0.0f ? 0.5f * range : u;
    }
    src = dtype == DType::kF32 ? static_cast<const void*>(floats.data()) : half.data();
  }
  const int64_t bytes = count * DTypeBytes(dtype);
  SG_ASSIGN_OR_RETURN(DeviceMemory m, AllocateDevice(bytes, "attention_bench buffer"));
  SG_RETURN_IF_ERROR(ToStatus(cudaMemcpy(m.get(), src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy"));
  // On the legacy stream, which the benchmark's stream does not wait for.
  SG_RETURN_IF_ERROR(ToStatus(cudaDeviceSynchronize(), "sync after upload"));
  return m;
}

// Copies that together exceed two L2s (at least 2, at most kMaxLaunches) of `bytes` each.
int Copies(int64_t bytes) {
  const int64_t want = (2 * g->l2_bytes + bytes - 1) / std::max<int64_t>(bytes, 1);
  return static_cast<int>(std::clamp<int64_t>(want, 2, kMaxLaunches));
}

// Captures `launch(i)` for i < n into one graph, replays it kIterations times and records
// the median time per launch.
absl::Status TimeCaptured(benchmark::State& state, int n, const std::function<absl::Status(int)>& launch,
                          const std::string& kernel, const std::string& shape, double bytes) {
  cudaStream_t stream = g->stream.get();
  SG_RETURN_IF_ERROR(ToStatus(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                              "cudaStreamBeginCapture"));
  absl::Status captured = absl::OkStatus();
  for (int i = 0; i < n && captured.ok(); ++i) captured = launch(i);
  cudaGraph_t raw = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &raw);
  UniqueGraph graph(raw);
  SG_RETURN_IF_ERROR(captured);
  SG_RETURN_IF_ERROR(ToStatus(ended, "cudaStreamEndCapture"));
  cudaGraphExec_t exec_raw = nullptr;
  SG_RETURN_IF_ERROR(ToStatus(cudaGraphInstantiate(&exec_raw, graph.get(), 0), "cudaGraphInstantiate"));
  UniqueGraphExec exec(exec_raw);
  SG_ASSIGN_OR_RETURN(UniqueEvent start, CreateEvent("attention_bench start"));
  SG_ASSIGN_OR_RETURN(UniqueEvent stop, CreateEvent("attention_bench stop"));
  SG_RETURN_IF_ERROR(ToStatus(cudaGraphLaunch(exec.get(), stream), "warm-up cudaGraphLaunch"));
  std::vector<double> per_launch;
  for (auto _ : state) {
    SG_RETURN_IF_ERROR(ToStatus(cudaEventRecord(start.get(), stream), "cudaEventRecord"));
    SG_RETURN_IF_ERROR(ToStatus(cudaGraphLaunch(exec.get(), stream), "cudaGraphLaunch"));
    SG_RETURN_IF_ERROR(ToStatus(cudaEventRecord(stop.get(), stream), "cudaEventRecord"));
    SG_RETURN_IF_ERROR(ToStatus(cudaEventSynchronize(stop.get()), "cudaEventSynchronize"));
    float ms = 0;
    SG_RETURN_IF_ERROR(ToStatus(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime"));
    const double seconds = ms * 1e-3 / n;
    state.SetIterationTime(seconds);
    per_launch.push_back(seconds);
  }
  const double t = Median(per_launch);
  Result r{kernel, shape, t * 1e6, bytes / t * 1e-9, 0};
  r.of_copy = g->copy_gbps > 0 ? r.gbps / g->copy_gbps : 0;
  state.counters["GB/s"] = r.gbps;
  state.counters["of_copy"] = r.of_copy;
  Record(r);
  return absl::OkStatus();
}

void Fail(benchmark::State& state, const absl::Status& s) {
  state.SkipWithError(std::string(s.message()).c_str());
}

void BM_DeviceCopy(benchmark::State& state) {
  absl::Status s = [&]() -> absl::Status {
    SG_ASSIGN_OR_RETURN(DeviceMemory src, AllocateDevice(kCopyBytes, "copy source"));
    SG_ASSIGN_OR_RETURN(DeviceMemory dst, AllocateDevice(kCopyBytes, "copy destination"));
    SG_RETURN_IF_ERROR(ToStatus(cudaMemset(src.get(), 1, kCopyBytes), "cudaMemset"));
    SG_RETURN_IF_ERROR(ToStatus(cudaDeviceSynchronize(), "sync after cudaMemset"));
    SG_ASSIGN_OR_RETURN(UniqueEvent start, CreateEvent("copy start"));
    SG_ASSIGN_OR_RETURN(UniqueEvent stop, CreateEvent("copy stop"));
    cudaStream_t stream = g->stream.get();
    std::vector<double> times;
    for (int warm = 0; warm < 2; ++warm) {
      SG_RETURN_IF_ERROR(ToStatus(cudaMemcpyAsync(dst.get(), src.get(), kCopyBytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync"));
    }
    for (auto _ : state) {
      SG_RETURN_IF_ERROR(ToStatus(cudaEventRecord(start.get(), stream), "cudaEventRecord"));
      SG_RETURN_IF_ERROR(ToStatus(cudaMemcpyAsync(dst.get(), src.get(), kCopyBytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync"));
      SG_RETURN_IF_ERROR(ToStatus(cudaEventRecord(stop.get(), stream), "cudaEventRecord"));
      SG_RETURN_IF_ERROR(ToStatus(cudaEventSynchronize(stop.get()), "cudaEventSynchronize"));
      float ms = 0;
      SG_RETURN_IF_ERROR(ToStatus(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime"));
      state.SetIterationTime(ms * 1e-3);
      times.push_back(ms * 1e-3);
    }
    const double t = Median(times);
    g->copy_gbps = 2.0 * kCopyBytes / t * 1e-9;
    state.counters["GB/s"] = g->copy_gbps;
    Record({"D2DCopy", "1GiB", t * 1e6, g->copy_gbps, 1.0});
    return absl::OkStatus();
  }();
  if (!s.ok()) Fail(state, s);
}

// Copy i's q, k_cache and v_cache: random values of `dt` (seeds 3i + 1 .. 3i + 3)
// uploaded, bound, and kept in `memory` for the bindings' lifetime.
absl::Status BindRandomQkv(Bindings& bind, DType dt, int64_t q_elems, int64_t cache_elems,
                           int i, std::vector<DeviceMemory>& memory) {
  const int64_t e = DTypeBytes(dt);
  SG_ASSIGN_OR_RETURN(DeviceMemory qb, Upload(dt, q_elems, 3 * i + 1, 1.0f));
  SG_ASSIGN_OR_RETURN(DeviceMemory kb, Upload(dt, cache_elems, 3 * i + 2, 1.0f));
  SG_ASSIGN_OR_RETURN(DeviceMemory vb, Upload(dt, cache_elems, 3 * i + 3, 1.0f));
  SG_RETURN_IF_ERROR(bind.Bind("q", qb.get(), q_elems * e));
  SG_RETURN_IF_ERROR(bind.Bind("k_cache", kb.get(), cache_elems * e));
  SG_RETURN_IF_ERROR(bind.Bind("v_cache", vb.get(), cache_elems * e));
  memory.push_back(std::move(qb));
  memory.push_back(std::move(kb));
  memory.push_back(std::move(vb));
  return absl::OkStatus();
}

// A decode attention shape: the model's heads and the cache's dtype.
struct DecodeShape {
  const char* name;
  DType dtype;
  int64_t heads, kv_heads, head_dim;
};
// Llama-3.2-1B in bf16, and Qwen3-30B-A3B's attention as a GGUF file computes it (f32).
constexpr DecodeShape kLlama1B{"", DType::kBF16, kHeads, kKvHeads, kHeadDim};
constexpr DecodeShape kQwen3Moe{"qwen3moe_f32/", DType::kF32, 32, 4, 128};

// Attention through CudaDispatch: q [m, heads·d], caches [m, kv_heads, S, d], every row at
// position pos (S - 1 when pos < 0).
void BM_Attention(benchmark::State& state, const DecodeShape& shape, int64_t m, int64_t seq,
                  int64_t pos) {
  if (pos < 0) pos = seq - 1;
  absl::Status s = [&]() -> absl::Status {
    const DType dt = shape.dtype;
    const int64_t elem = DTypeBytes(dt);
    const int64_t q_elems = m * shape.heads * shape.head_dim;
    GraphBuilder b;
    const TensorId q = b.Input("q", dt, {m, shape.heads * shape.head_dim});
    const TensorId k = b.State("k_cache", dt, {m, shape.kv_heads, seq, shape.head_dim});
    const TensorId v = b.State("v_cache", dt, {m, shape.kv_heads, seq, shape.head_dim});
    const TensorId pos_t = b.Input("pos", DType::kI32, {m});
    b.Output("out", b.Attention(q, k, v, pos_t));
    SG_ASSIGN_OR_RETURN(Graph graph, std::move(b).Build());
    SG_ASSIGN_OR_RETURN(ExecutionPlan plan, ExecutionPlan::Create(std::move(graph)));
    SG_ASSIGN_OR_RETURN(const PreparedPlan prepared, g->dispatch->Prepare(plan));
    const int64_t cache_elems = m * shape.kv_heads * seq * shape.head_dim;
    const int n = Copies(2 * cache_elems * elem);
    SG_ASSIGN_OR_RETURN(DeviceMemory pos_buf, Upload(DType::kI32, m, 0, 0, static_cast<int32_t>(pos)));
    std::vector<DeviceMemory> memory;
    std::vector<Bindings> binds;
    SG_ASSIGN_OR_RETURN(DeviceMemory arena, AllocateDevice(std::max<int64_t>(plan.arena_bytes(), 256) * n, "arena"));
    for (int i = 0; i < n; ++i) {
      Bindings bind(plan.graph());
      SG_RETURN_IF_ERROR(BindRandomQkv(bind, dt, q_elems, cache_elems, i, memory));
      SG_RETURN_IF_ERROR(bind.Bind("pos", pos_buf.get(), m * 4));
      bind.SetArena(static_cast<char*>(arena.get()) + i * std::max<int64_t>(plan.arena_bytes(), 256),
                    plan.arena_bytes());
      binds.push_back(std::move(bind));
    }
    // The keys 0..pos read, q read and the output written.
    const double bytes =
        (2.0 * m * shape.kv_heads * (pos + 1) * shape.head_dim + 2.0 * q_elems) * elem;
    return TimeCaptured(
        state, n,
        [&](int i) -> absl::Status { return Execute(prepared, binds[i], *g->dispatch).status(); },
        "Attention", absl::StrCat(shape.name, "M", m, "/S", seq, pos == seq - 1 ? "" : absl::StrCat("/pos", pos)),
        bytes);
  }();
  if (!s.ok()) Fail(state, s);
}

// Positions begin .. begin + t - 1 on the device: one prefill chunk of a sequence.
absl::StatusOr<DeviceMemory> UploadPositions(int64_t t, int64_t begin) {
  std::vector<int32_t> positions(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) positions[i] = static_cast<int32_t>(begin + i);
  SG_ASSIGN_OR_RETURN(DeviceMemory pos_buf, AllocateDevice(t * 4, "pos"));
  SG_RETURN_IF_ERROR(ToStatus(
      cudaMemcpy(pos_buf.get(), positions.data(), t * 4, cudaMemcpyHostToDevice),
      "cudaMemcpy(pos)"));
  return pos_buf;
}

// The TFLOP/s counter of the prefill attention timed as (kernel, name): 4·heads·d flops
// per (row, key) over the causal keys of t rows from position begin.
void ReportPrefillRate(benchmark::State& state, absl::string_view kernel,
                       const std::string& name, int64_t t, int64_t begin) {
  double keys = 0;
  for (int64_t i = 0; i < t; ++i) keys += static_cast<double>(begin + i + 1);
  double us = 0;
  for (const Result& r : g->results) {
    if (r.kernel == kernel && r.shape == name) us = r.us;
  }
  state.counters["TFLOP/s"] = 4.0 * kHeads * kHeadDim * keys / (us * 1e-6) * 1e-12;
}

// Prefill attention through CudaDispatch: one sequence of t rows (a chunk) at positions
// begin..begin + t - 1 of slot 0, caches [1, 8, S, 64] with S = begin + t. Reports the
// rate: 4·heads·d flops per (row, key) over the causal keys.
void BM_PrefillAttention(benchmark::State& state, DType dt, int64_t t, int64_t begin,
                         bool row_kernel) {
  absl::Status s = [&]() -> absl::Status {
    const int64_t seq = begin + t;
    GraphBuilder b;
    const TensorId q = b.Input("q", dt, {t, kHeads * kHeadDim});
    const TensorId k = b.State("k_cache", dt, {1, kKvHeads, seq, kHeadDim});
    const TensorId v = b.State("v_cache", dt, {1, kKvHeads, seq, kHeadDim});
    // A window past every position changes nothing but keeps the node off the tiled
    // kernels: the row-by-row kernel's time for the same work.
    b.Output("out", b.Attention({.window = row_kernel ? static_cast<int32_t>(seq + 1) : 0}, q, k,
                                v, b.Input("pos", DType::kI32, {t}),
                                b.Input("seq_slots", DType::kI32, {1})));
    SG_ASSIGN_OR_RETURN(Graph graph, std::move(b).Build());
    SG_ASSIGN_OR_RETURN(ExecutionPlan plan, ExecutionPlan::Create(std::move(graph)));
    SG_ASSIGN_OR_RETURN(const PreparedPlan prepared, g->dispatch->Prepare(plan));
    SG_ASSIGN_OR_RETURN(DeviceMemory pos_buf, UploadPositions(t, begin));
    SG_ASSIGN_OR_RETURN(DeviceMemory slot_buf, Upload(DType::kI32, 1, 0, 0, 0));
    const int64_t cache_elems = kKvHeads * seq * kHeadDim;
    const int64_t q_elems = t * kHeads * kHeadDim;
    const int64_t e = DTypeBytes(dt);
    const int n = Copies(2 * cache_elems * e + 2 * q_elems * e);
    const int64_t arena_bytes = std::max<int64_t>(plan.arena_bytes(), 256);
    SG_ASSIGN_OR_RETURN(DeviceMemory arena, AllocateDevice(arena_bytes * n, "arena"));
    std::vector<DeviceMemory> memory;
    std::vector<Bindings> binds;
    for (int i = 0; i < n; ++i) {
      Bindings bind(plan.graph());
      SG_RETURN_IF_ERROR(BindRandomQkv(bind, dt, q_elems, cache_elems, i, memory));
      SG_RETURN_IF_ERROR(bind.Bind("pos", pos_buf.get(), t * 4));
      SG_RETURN_IF_ERROR(bind.Bind("seq_slots", slot_buf.get(), 4));
      bind.SetArena(static_cast<char*>(arena.get()) + i * arena_bytes, plan.arena_bytes());
      binds.push_back(std::move(bind));
    }
    const double bytes = 2.0 * cache_elems * e + 2.0 * q_elems * e;
    const std::string name =
        absl::StrCat(DTypeName(dt), row_kernel ? "_rows" : "", "/T", t, "/from", begin);
    SG_RETURN_IF_ERROR(TimeCaptured(
        state, n,
        [&](int i) -> absl::Status { return Execute(prepared, binds[i], *g->dispatch).status(); },
        "PrefillAttention", name, bytes));
    ReportPrefillRate(state, "PrefillAttention", name, t, begin);
    return absl::OkStatus();
  }();
  if (!s.ok()) Fail(state, s);
}

// The prefill launcher itself for bf16 (or f16) rows: the tensor-core kernel against the
// CUDA-core one that f32 takes (AttentionArgs::prefill_cuda_cores); for f32 rows the
// tensor-core kernel in f16 (AttentionArgs::prefill_f32_f16) against it; one sequence of t rows
// at positions begin..begin + t - 1, caches [1, 8, S, 64], S = begin + t.
void BM_PrefillKernels(benchmark::State& state, DType dt, int64_t t, int64_t begin,
                       bool cuda_cores) {
  absl::Status s = [&]() -> absl::Status {
    const int64_t seq = begin + t;
    const kernels::AttentionShape shape{static_cast<int>(t), static_cast<int>(kHeads),
                                        static_cast<int>(kKvHeads), static_cast<int>(seq),
                                        static_cast<int>(kHeadDim)};
    const int64_t e = DTypeBytes(dt);
    const int64_t cache_elems = kKvHeads * seq * kHeadDim;
    const int64_t q_elems = t * kHeads * kHeadDim;
    const int n = Copies(2 * cache_elems * e + 2 * q_elems * e);
    SG_ASSIGN_OR_RETURN(DeviceMemory pos_buf, UploadPositions(t, begin));
    SG_ASSIGN_OR_RETURN(DeviceMemory slot_buf, Upload(DType::kI32, 1, 0, 0, 0));
    SG_ASSIGN_OR_RETURN(DeviceMemory flags, Upload(DType::kI32, 1, 0, 0, 0));
    std::vector<DeviceMemory> q, k, v, out;
    for (int i = 0; i < n; ++i) {
      SG_ASSIGN_OR_RETURN(DeviceMemory qb, Upload(dt, q_elems, 3 * i + 1, 1.0f));
      SG_ASSIGN_OR_RETURN(DeviceMemory kb, Upload(dt, cache_elems, 3 * i + 2, 1.0f));
      SG_ASSIGN_OR_RETURN(DeviceMemory vb, Upload(dt, cache_elems, 3 * i + 3, 1.0f));
      SG_ASSIGN_OR_RETURN(DeviceMemory ob, AllocateDevice(q_elems * e, "out"));
      q.push_back(std::move(qb));
      k.push_back(std::move(kb));
      v.push_back(std::move(vb));
      out.push_back(std::move(ob));
    }
    const char* path = cuda_cores ? "_cuda_cores" : dt == DType::kF32 ? "_f16_mma" : "_mma";
    const std::string name = absl::StrCat(DTypeName(dt), path, "/T", t, "/from", begin);
    SG_RETURN_IF_ERROR(TimeCaptured(
        state, n,
        [&](int i) -> absl::Status {
          kernels::AttentionArgs a;
          a.q = q[i].get();
          a.k_cache = k[i].get();
          a.v_cache = v[i].get();
          a.pos = static_cast<const int32_t*>(pos_buf.get());
          a.out = out[i].get();
          a.scale = 0.125f;
          a.error_flags = static_cast<uint32_t*>(flags.get());
          a.seq_slots = static_cast<const int32_t*>(slot_buf.get());
          a.rows_per_seq = static_cast<int>(t);
          a.slots = 1;
          a.prefill_cuda_cores = cuda_cores;
          a.prefill_f32_f16 = !cuda_cores;  // f32 rows: the tensor-core kernel in f16
          return ToStatus(kernels::LaunchPrefillAttention(a, shape, dt, g->stream.get()),
                          "LaunchPrefillAttention");
        },
        "PrefillKernels", name, 2.0 * cache_elems * e + 2.0 * q_elems * e));
    ReportPrefillRate(state, "PrefillKernels", name, t, begin);
    return absl::OkStatus();
  }();
  if (!s.ok()) Fail(state, s);
}

// The attention launcher at a fixed chunk count (M = 1, S = 4096, position pos), for
// tuning: the grid's chunks against the keys each walks at the longest context, and what
// the chunks that find no keys cost at a short one.
void BM_AttentionChunks(benchmark::State& state, const DecodeShape& shape, int64_t pos,
                        int chunks,
                        kernels::AttentionClusters clusters = kernels::AttentionClusters::kAuto) {
  absl::Status s = [&]() -> absl::Status {
    const int64_t m = 1, seq = 4096;
    const kernels::AttentionShape ashape{static_cast<int>(m), static_cast<int>(shape.heads),
                                         static_cast<int>(shape.kv_heads),
                                         static_cast<int>(seq), static_cast<int>(shape.head_dim)};
    const int64_t elem = DTypeBytes(shape.dtype);
    const int64_t q_elems = m * shape.heads * shape.head_dim;
    const int64_t cache_elems = m * shape.kv_heads * seq * shape.head_dim;
    const int n = Copies(2 * cache_elems * elem);
    SG_ASSIGN_OR_RETURN(DeviceMemory pos_buf,
                        Upload(DType::kI32, m, 0, 0, static_cast<int32_t>(pos)));
    const int64_t ws_bytes = kernels::AttentionWorkspaceBytes(ashape, chunks);
    SG_ASSIGN_OR_RETURN(DeviceMemory ws, AllocateDevice(ws_bytes, "workspace"));
    SG_RETURN_IF_ERROR(ToStatus(cudaMemset(ws.get(), 0, ws_bytes), "cudaMemset"));
    SG_RETURN_IF_ERROR(ToStatus(cudaDeviceSynchronize(), "sync after cudaMemset"));
    SG_ASSIGN_OR_RETURN(DeviceMemory out, AllocateDevice(q_elems * elem, "out"));
    std::vector<DeviceMemory> q, k, v;
    for (int i = 0; i < n; ++i) {
      SG_ASSIGN_OR_RETURN(DeviceMemory qb, Upload(shape.dtype, q_elems, 3 * i + 1, 1.0f));
      SG_ASSIGN_OR_RETURN(DeviceMemory kb, Upload(shape.dtype, cache_elems, 3 * i + 2, 1.0f));
      SG_ASSIGN_OR_RETURN(DeviceMemory vb, Upload(shape.dtype, cache_elems, 3 * i + 3, 1.0f));
      q.push_back(std::move(qb));
      k.push_back(std::move(kb));
      v.push_back(std::move(vb));
    }
    SG_ASSIGN_OR_RETURN(DeviceMemory flags, AllocateDevice(4, "flags"));
    // The keys 0..pos read, q read and the output written.
    const double bytes =
        (2.0 * m * shape.kv_heads * (pos + 1) * shape.head_dim + 2.0 * q_elems) * elem;
    return TimeCaptured(
        state, n,
        [&](int i) -> absl::Status {
          kernels::AttentionArgs a;
          a.q = q[i].get();
          a.k_cache = k[i].get();
          a.v_cache = v[i].get();
          a.pos = static_cast<const int32_t*>(pos_buf.get());
          a.out = out.get();
          a.scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
          a.workspace = ws.get();
          a.error_flags = static_cast<uint32_t*>(flags.get());
          a.clusters = clusters;
          return ToStatus(
              kernels::LaunchAttention(a, ashape, chunks, shape.dtype, g->stream.get()),
              "LaunchAttention");
        },
        "Attention",
        absl::StrCat(shape.name, "M1/S4096", pos == seq - 1 ? "" : absl::StrCat("/pos", pos),
                     "/chunks", chunks,
                     clusters == kernels::AttentionClusters::kAlways  ? "/clusters"
                     : clusters == kernels::AttentionClusters::kNever ? "/no_clusters"
                                                                      : ""),
        bytes);
  }();
  if (!s.ok()) Fail(state, s);
}

// Argmax or Sample over [m, 128256] bf16 logits through CudaDispatch.
void BM_Choose(benchmark::State& state, int64_t m, bool argmax, ops::Sample op, std::string label) {
  absl::Status s = [&]() -> absl::Status {
    GraphBuilder b;
    const TensorId x = b.Input("logits", DType::kBF16, {m, kVocab});
    if (argmax) {
      b.Output("ids", b.Argmax(x));
    } else {
      b.Output("ids", b.Sample(x, b.Input("seeds", DType::kI32, {m}), b.Input("pos", DType::kI32, {m}), op));
    }
    SG_ASSIGN_OR_RETURN(Graph graph, std::move(b).Build());
    SG_ASSIGN_OR_RETURN(ExecutionPlan plan, ExecutionPlan::Create(std::move(graph)));
    SG_ASSIGN_OR_RETURN(const PreparedPlan prepared, g->dispatch->Prepare(plan));
    const int n = Copies(m * kVocab * 2);
    SG_ASSIGN_OR_RETURN(DeviceMemory seeds, Upload(DType::kI32, m, 0, 0, 1234));
    SG_ASSIGN_OR_RETURN(DeviceMemory pos, Upload(DType::kI32, m, 0, 0, 77));
    const int64_t arena_bytes = std::max<int64_t>(plan.arena_bytes(), 256);
    SG_ASSIGN_OR_RETURN(DeviceMemory arena, AllocateDevice(arena_bytes * n, "arena"));
    std::vector<DeviceMemory> memory;
    std::vector<Bindings> binds;
    for (int i = 0; i < n; ++i) {
      Bindings bind(plan.graph());
      SG_ASSIGN_OR_RETURN(DeviceMemory xb, Upload(DType::kBF16, m * kVocab, 7 * i + 5, 8.0f));
      SG_RETURN_IF_ERROR(bind.Bind("logits", xb.get(), m * kVocab * 2));
      if (!argmax) {
        SG_RETURN_IF_ERROR(bind.Bind("seeds", seeds.get(), m * 4));
        SG_RETURN_IF_ERROR(bind.Bind("pos", pos.get(), m * 4));
      }
      bind.SetArena(static_cast<char*>(arena.get()) + i * arena_bytes, plan.arena_bytes());
      memory.push_back(std::move(xb));
      binds.push_back(std::move(bind));
    }
    return TimeCaptured(
        state, n,
        [&](int i) -> absl::Status { return Execute(prepared, binds[i], *g->dispatch).status(); },
        argmax ? "Argmax" : "Sample", absl::StrCat("M", m, "/V128256", label), m * kVocab * 2.0);
  }();
  if (!s.ok()) Fail(state, s);
}

// The argmax launcher at a fixed number of blocks per row (1: one block per row).
void BM_ArgmaxBlocks(benchmark::State& state, int64_t m, int blocks) {
  absl::Status s = [&]() -> absl::Status {
    const int n = Copies(m * kVocab * 2);
    std::vector<DeviceMemory> xs;
    for (int i = 0; i < n; ++i) {
      SG_ASSIGN_OR_RETURN(DeviceMemory xb, Upload(DType::kBF16, m * kVocab, 7 * i + 5, 8.0f));
      xs.push_back(std::move(xb));
    }
    SG_ASSIGN_OR_RETURN(DeviceMemory ws, AllocateDevice(kernels::ArgmaxWorkspaceBytes(m), "workspace"));
    SG_RETURN_IF_ERROR(ToStatus(cudaMemset(ws.get(), 0, kernels::ArgmaxWorkspaceBytes(m)), "cudaMemset"));
    SG_RETURN_IF_ERROR(ToStatus(cudaDeviceSynchronize(), "sync after cudaMemset"));
    SG_ASSIGN_OR_RETURN(DeviceMemory ids, AllocateDevice(m * 4, "ids"));
    return TimeCaptured(
        state, n,
        [&](int i) -> absl::Status {
          return ToStatus(kernels::LaunchArgmax(xs[i].get(), DType::kBF16, m, kVocab, blocks, ws.get(),
                                                static_cast<int32_t*>(ids.get()), g->stream.get()),
                          "LaunchArgmax");
        },
        "Argmax", absl::StrCat("M", m, "/V128256/blocks", blocks), m * kVocab * 2.0);
  }();
  if (!s.ok()) Fail(state, s);
}

void PrintTable() {
  std::printf("\n%-10s %-28s %10s %10s %8s\n", "kernel", "shape", "us", "GB/s", "of_copy");
  for (const Result& r : g->results) {
    std::printf("%-10s %-28s %10.2f %10.1f %8.3f\n", r.kernel.c_str(), r.shape.c_str(), r.us,
                r.gbps, r.of_copy);
  }
}

}  // namespace
}  // namespace sg

int main(int argc, char** argv) {
  using sg::g;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "attention_bench: no CUDA device is available; nothing to measure\n");
    return 1;
  }
  sg::Context context;
  g = &context;
  absl::StatusOr<sg::UniqueStream> stream = sg::CreateStream("attention_bench");
  if (!stream.ok()) {
    std::fprintf(stderr, "attention_bench: %s\n", std::string(stream.status().message()).c_str());
    return 1;
  }
  context.stream = *std::move(stream);
  absl::StatusOr<std::unique_ptr<sg::CudaDispatch>> dispatch = sg::CudaDispatch::Create({.stream = context.stream.get()});
  if (!dispatch.ok()) {
    std::fprintf(stderr, "attention_bench: %s\n", std::string(dispatch.status().message()).c_str());
    return 1;
  }
  context.dispatch = *std::move(dispatch);
  context.sm_count = context.dispatch->device_info().sm_count;
  context.l2_bytes = context.dispatch->device_info().l2_bytes;

  auto reg = [](const std::string& name, auto fn) {
    benchmark::RegisterBenchmark(name.c_str(), fn)
        ->UseManualTime()
        ->Iterations(sg::kIterations)
        ->Unit(benchmark::kMicrosecond);
  };
  reg("D2DCopy/1GiB", sg::BM_DeviceCopy);
  for (int64_t m : {1, 8}) {
    for (int64_t seq : {512, 1024, 4096, 8192}) {
      reg(absl::StrCat("Attention/M", m, "/S", seq),
          [m, seq](benchmark::State& s) { sg::BM_Attention(s, sg::kLlama1B, m, seq, -1); });
    }
  }
  // Short contexts in a cache of 2,048 positions (a few chunks take part, each a few keys),
  // and the Qwen3-MoE shape (4 KV heads: few blocks a chunk; f32 rows of 128).
  for (int64_t pos : {100, 1000}) {
    reg(absl::StrCat("Attention/M1/S2048/pos", pos),
        [pos](benchmark::State& s) { sg::BM_Attention(s, sg::kLlama1B, 1, 2048, pos); });
  }
  for (int64_t pos : {100, 1000, 2047}) {
    reg(absl::StrCat("Attention/", sg::kQwen3Moe.name, "M1/S2048/pos", pos),
        [pos](benchmark::State& s) { sg::BM_Attention(s, sg::kQwen3Moe, 1, 2048, pos); });
  }
  // Position 100 in caches of 241 (what `stepgraph bench --positions 100` sizes), 2,048
  // and 4,096 positions: the same keys read, grids of more chunks that find none (the
  // MoE step took 0.792 ms in the first cache and 0.820 in the last).
  for (const sg::DecodeShape* shape : {&sg::kLlama1B, &sg::kQwen3Moe}) {
    for (int64_t seq : {241, 4096}) {
      reg(absl::StrCat("Attention/", shape->name, "M1/S", seq, "/pos100"),
          [shape, seq](benchmark::State& s) { sg::BM_Attention(s, *shape, 1, seq, 100); });
    }
  }
  // bf16 and f32 (GGUF files with quantized matrices) on the tiled kernel.
  // _rows: the same work on the row-by-row kernel (what f32 ran on before its own).
  for (sg::DType dt : {sg::DType::kBF16, sg::DType::kF32}) {
    for (bool rows : {false, true}) {
      for (const auto& [t, begin] :
           {std::pair<int64_t, int64_t>{256, 0}, {256, 1792}, {2048, 0}}) {
        reg(absl::StrCat("PrefillAttention/", sg::DTypeName(dt), rows ? "_rows" : "", "/T", t,
                         "/from", begin),
            [dt, t, begin, rows](benchmark::State& s) {
              sg::BM_PrefillAttention(s, dt, t, begin, rows);
            });
      }
    }
  }
  for (sg::DType dt : {sg::DType::kBF16, sg::DType::kF16, sg::DType::kF32}) {
    for (bool cuda_cores : {false, true}) {
      for (const auto& [t, begin] :
           {std::pair<int64_t, int64_t>{256, 0}, {256, 1792}, {2048, 0}}) {
        reg(absl::StrCat("PrefillKernels/", sg::DTypeName(dt),
                         cuda_cores                ? "_cuda_cores"
                         : dt == sg::DType::kF32   ? "_f16_mma"
                                                   : "_mma",
                         "/T", t, "/from", begin),
            [dt, t, begin, cuda_cores](benchmark::State& s) {
              sg::BM_PrefillKernels(s, dt, t, begin, cuda_cores);
            });
      }
    }
  }
  for (int chunks : {8, 16, 32, 48, 64, 96, 128, 192, 256}) {
    reg(absl::StrCat("Attention/M1/S4096/chunks", chunks), [chunks](benchmark::State& s) {
      sg::BM_AttentionChunks(s, sg::kLlama1B, 4095, chunks);
    });
  }
  // The grid in a 4,096-position cache: at position 100 (7 chunks of 16 keys take part,
  // the rest find none) and at the last one, the 1B shape and Qwen3-MoE's (whose default
  // on 132 SMs is 72 chunks in f32, 136 in bf16, the 1B's 66).
  for (int chunks : {8, 16, 32, 66}) {
    reg(absl::StrCat("Attention/M1/S4096/pos100/chunks", chunks), [chunks](benchmark::State& s) {
      sg::BM_AttentionChunks(s, sg::kLlama1B, 100, chunks);
    });
  }
  // The chunks' merge within thread block clusters and through the workspace alone
  // (kernels::AttentionClusters kAlways, kNever), on a grid of 72 chunks (clusters of 8) in
  // a 4,096-position cache, at positions whose chunks fit one cluster (100), take two (200:
  // 13 of 16 keys) or many. (H200, 2026-12-02, us with / without: the 1B 4.98 / 6.47, 7.96 /
  // 6.79, 12.6 / 8.59, 16.5 / 14.8; Qwen3-MoE f32 7.39 / 10.7, 11.7 / 11.3, 13.2 / 14.7,
  // 22.7 / 24.9: kAuto takes clusters for the latter's 4 blocks a chunk only.)
  for (const sg::DecodeShape* shape : {&sg::kLlama1B, &sg::kQwen3Moe}) {
    for (int64_t pos : {100, 200, 1000, 4095}) {
      for (const auto clusters : {sg::kernels::AttentionClusters::kAlways,
                                  sg::kernels::AttentionClusters::kNever}) {
        reg(absl::StrCat("Attention/", shape->name, "M1/S4096",
                         pos == 4095 ? "" : absl::StrCat("/pos", pos), "/chunks72",
                         clusters == sg::kernels::AttentionClusters::kAlways ? "/clusters"
                                                                             : "/no_clusters"),
            [shape, pos, clusters](benchmark::State& s) {
              sg::BM_AttentionChunks(s, *shape, pos, 72, clusters);
            });
      }
    }
  }
  for (int64_t pos : {100, 4095}) {
    for (int chunks : {8, 16, 32, 64, 132}) {
      reg(absl::StrCat("Attention/", sg::kQwen3Moe.name, "M1/S4096",
                       pos == 4095 ? "" : "/pos100", "/chunks", chunks),
          [pos, chunks](benchmark::State& s) {
            sg::BM_AttentionChunks(s, sg::kQwen3Moe, pos, chunks);
          });
    }
  }
  for (int64_t m : {1, 8}) {
    reg(absl::StrCat("Argmax/M", m, "/V128256"), [m](benchmark::State& s) {
      sg::BM_Choose(s, m, true, {}, "");
    });
    for (int blocks : {1, 8, 32, 64}) {
      reg(absl::StrCat("Argmax/M", m, "/V128256/blocks", blocks),
          [m, blocks](benchmark::State& s) { sg::BM_ArgmaxBlocks(s, m, blocks); });
    }
    const struct {
      const char* label;
      sg::ops::Sample op;
    } samples[] = {{"/T1", {}},
                   {"/T0.7/k50", {.temperature = 0.7f, .top_k = 50}},
                   {"/p0.9", {.top_p = 0.9f}},
                   {"/T0.7/k50/p0.9", {.temperature = 0.7f, .top_k = 50, .top_p = 0.9f}}};
    for (const auto& c : samples) {
      reg(absl::StrCat("Sample/M", m, "/V128256", c.label), [m, c](benchmark::State& s) {
        sg::BM_Choose(s, m, false, c.op, c.label);
      });
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  sg::PrintTable();
  return 0;
}
