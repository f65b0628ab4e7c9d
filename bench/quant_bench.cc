// The quantized matmul (kernels/quant_matmul.cuh) at Llama-3.2-1B's decode shapes, M = 1,
// for every GGUF block format, beside the bf16 small-M kernel at the same shapes, and the
// fused matmul (kernels/fused_matmul.cuh, one weight, no epilogue, split-K as the
// dispatcher picks it) over the same weights: how close each format's kernel comes to
// streaming its weight at the copy rate, plain and fused. Those cases take bf16
// activations; QuantMatMulF32 (M = 1, 4, 8, 16), FusedF32 (M = 1) and the tensor-core
// path (kernels/block_mma.cuh: MmaF32 fused, MmaPlainF32 for the lm head; M = 1 to 32;
// MmaPrefillF32 at M = 16, 64 and 512 in both block shapes) take f32 ones, as a GGUF file
// with block-format weights computes. Big/<kernel>/<format>/... take one row at
// Qwen3-8B's shapes, every one-row kernel side by side (fused, plain, one-row, tensor
// cores) beside the bf16 small-M kernel. MoeDecode/<format>/... time a mixture of experts'
// decode matmul (kernels/moe.cuh: one row, 8 of 128 experts, Qwen3-30B-A3B's shapes)
// against the chosen experts' bytes, on the block per pair and the one-row kernel, and the
// down experts with their combine as two launches and as one;
// Dequantize/<format> the block GEMM's dequantization into f16 at the copy rate's terms;
// MoePrefill/<format>/... its prefill matmul (256 rows, walking by expert, and for block
// formats on the tensor cores; Q4_K also at 32 and 64 rows) in TFLOP/s, routed uniformly
// and skewed. Block-format weights are repacked into the device layout
// (kernels/quant_layout.h) as the step runner uploads them.
//
// How it measures (as kernel_bench): each case captures a CUDA graph of up to kMaxBatch
// launches, each on its own copy of the weight, enough copies together to exceed three
// L2s where memory allows (else L2 is flushed by a memset between replays, outside the
// timed region), and times replays with CUDA events; the time per iteration is one
// launch, and tables report medians. GB/s counts the weight's bytes plus x and y once;
// `of_copy` is that over a 1 GiB device-to-device cudaMemcpyAsync measured in the same
// run, counted as bytes read plus bytes written.
//
//   quant_bench --benchmark_filter='QuantMatMul|Fused'
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/timing.h"
#include "dispatch/cuda/cuda_handles.h"
#include "dispatch/cuda/cuda_status.h"
#include "kernels/block_mma.cuh"
#include "kernels/dequant.cuh"
#include "kernels/fused_matmul.cuh"
#include "kernels/gemv.cuh"
#include "kernels/moe.cuh"
#include "kernels/quant_layout.h"
#include "kernels/quant_matmul.cuh"
#include "stepgraph/base/half.h"
#include "stepgraph/base/quant.h"
#include "stepgraph/base/status.h"
#include "stepgraph/graph/types.h"

namespace sg {
namespace {

constexpr int kIterations = 30;
constexpr int kMaxBatch = 64;
constexpr int64_t kAlign = 256;
constexpr int64_t kCopyBytes = int64_t{1} << 30;
// Distinct random rows quantized on the host; the weight repeats them (the values do not
// change the traffic, and quantizing 128256 rows per format would dominate the run).
constexpr int64_t kDistinctRows = 64;

int64_t RoundUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

struct Row {
  std::string name;
  double us = 0, gbps = 0, of_copy = 0;
};

struct Context {
  UniqueStream stream;
  DeviceMemory flush;
  int64_t flush_bytes = 0;
  int64_t l2_bytes = 0;
  double copy_gbps = 0;
  std::vector<Row> rows;
};
Context* g = nullptr;

absl::StatusOr<double> TimeOnce(cudaStream_t stream, const std::function<absl::Status()>& f) {
  SG_ASSIGN_OR_RETURN(UniqueEvent start, CreateEvent("quant_bench start"));
  SG_ASSIGN_OR_RETURN(UniqueEvent stop, CreateEvent("quant_bench stop"));
  SG_RETURN_IF_ERROR(ToStatus(cudaEventRecord(start.get(), stream), "cudaEventRecord"));
  SG_RETURN_IF_ERROR(f());
  SG_RETURN_IF_ERROR(ToStatus(cudaEventRecord(stop.get(), stream), "cudaEventRecord"));
  SG_RETURN_IF_ERROR(ToStatus(cudaEventSynchronize(stop.get()), "cudaEventSynchronize"));
  float ms = 0;
  SG_RETURN_IF_ERROR(
      ToStatus(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime"));
  return static_cast<double>(ms) * 1e-3;
}

absl::Status MeasureCopy() {
  SG_ASSIGN_OR_RETURN(DeviceMemory src, AllocateDevice(kCopyBytes, "copy source"));
  SG_ASSIGN_OR_RETURN(DeviceMemory dst, AllocateDevice(kCopyBytes, "copy destination"));
  cudaStream_t stream = g->stream.get();
  SG_RETURN_IF_ERROR(ToStatus(cudaMemsetAsync(src.get(), 0x5a, kCopyBytes, stream), "cudaMemset"));
  auto copy = [&] {
    return ToStatus(cudaMemcpyAsync(dst.get(), src.get(), kCopyBytes, cudaMemcpyDeviceToDevice,
                                    stream),
                    "cudaMemcpyAsync");
  };
  std::vector<double> seconds;
  for (int i = 0; i < 11; ++i) {
    SG_ASSIGN_OR_RETURN(double s, TimeOnce(stream, copy));
    if (i > 0) seconds.push_back(s);  // the first is a warm-up
  }
  g->copy_gbps = 2.0 * static_cast<double>(kCopyBytes) / Median(seconds) * 1e-9;
  return absl::OkStatus();
}

// Host bytes of an [n, k] weight in `w_dtype` (bf16 for the reference case): random
// values, quantized row by row, kDistinctRows of them repeated.
std::vector<uint8_t> WeightBytes(DType w_dtype, int64_t n, int64_t k) {
  const int64_t row_bytes = DTypeRowBytes(w_dtype, k);
  std::vector<uint8_t> distinct(static_cast<size_t>(kDistinctRows * row_bytes));
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(k));
  for (int64_t r = 0; r < kDistinctRows; ++r) {
    for (float& v : values) v = u(rng);
    uint8_t* dst = distinct.data() + r * row_bytes;
    if (IsQuantized(w_dtype)) {
      QuantizeRow(w_dtype, values.data(), dst, k);
    } else {
      for (int64_t c = 0; c < k; ++c) StoreElement(dst, w_dtype, c, values[c]);
    }
  }
  std::vector<uint8_t> out(static_cast<size_t>(n * row_bytes));
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(out.data() + r * row_bytes, distinct.data() + (r % kDistinctRows) * row_bytes,
                static_cast<size_t>(row_bytes));
  }
  if (!IsQuantized(w_dtype)) return out;
  std::vector<uint8_t> device(out.size());
  kernels::RepackBlocksForDevice(w_dtype, n * (k / DTypeBlockElems(w_dtype)), out.data(),
                                 device.data());
  return device;
}

int SmCount() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 1;
  }
  return sms;
}

// Which kernel a case runs.
enum class Kernel {
  kPlain,      // the block-format kernel (bf16 weights: the small-M kernel)
  kFused,      // the fused matmul on CUDA cores, split-K as the dispatcher picks it
  kFusedMma,   // the fused matmul on tensor cores: products (split-K), then the epilogue
  kPlainMma,   // the tensor-core kernel writing y itself (a MatMul's path, no split-K)
  kRow,        // the one-row kernel (persistent warps; a MatMul's path for an lm head)
  kRowInt8,    // the one-row kernel, x as int8 per 32 values (QuantRowX::kInt8)
  kRowInt16,   // the one-row kernel, x as int16 per 32 values (QuantRowX::kInt16)
  kRowInt16x2, // the one-row kernel, x as two int16 parts (QuantRowX::kInt16x2)
};

// One case: y[m, n] = x[m, k] · w[n, k]ᵀ with w in `w_dtype` (bf16: the small-M kernel),
// x and y in `act` (bf16, or f32 as a GGUF file computes), through `kernel`.
// Runs launch(0) once eagerly, captures launch(0 .. batch) into one graph and replays it
// for the state's iterations (after an L2 flush when `flush`): the median seconds of one
// launch.
absl::StatusOr<double> TimeLaunches(benchmark::State& state, int batch, bool flush,
                                    const std::function<absl::Status(int)>& launch) {
  cudaStream_t stream = g->stream.get();
  SG_RETURN_IF_ERROR(launch(0));
  SG_RETURN_IF_ERROR(ToStatus(cudaStreamSynchronize(stream), "eager run"));

  SG_RETURN_IF_ERROR(ToStatus(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                              "cudaStreamBeginCapture"));
  absl::Status captured = absl::OkStatus();
  for (int s = 0; s < batch && captured.ok(); ++s) captured = launch(s);
  cudaGraph_t raw_graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &raw_graph);
  UniqueGraph graph(raw_graph);
  SG_RETURN_IF_ERROR(captured);
  SG_RETURN_IF_ERROR(ToStatus(end, "cudaStreamEndCapture"));
  cudaGraphExec_t raw_exec = nullptr;
  SG_RETURN_IF_ERROR(ToStatus(cudaGraphInstantiate(&raw_exec, graph.get(), 0), "cudaGraphInstantiate"));
  UniqueGraphExec exec(raw_exec);
  SG_RETURN_IF_ERROR(ToStatus(cudaGraphLaunch(exec.get(), stream), "warm-up"));
  SG_RETURN_IF_ERROR(ToStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));

  std::vector<double> per_launch;
  for (auto _ : state) {
    if (flush) {
      SG_RETURN_IF_ERROR(ToStatus(cudaMemsetAsync(g->flush.get(), static_cast<int>(per_launch.size() & 0x7f) + 1,
                                                  static_cast<size_t>(g->flush_bytes), stream),
                                  "cudaMemsetAsync(L2 flush)"));
    }
    SG_ASSIGN_OR_RETURN(double seconds, TimeOnce(stream, [&] {
                          return ToStatus(cudaGraphLaunch(exec.get(), stream), "cudaGraphLaunch");
                        }));
    state.SetIterationTime(seconds / batch);
    per_launch.push_back(seconds / batch);
  }
  return Median(per_launch);
}

// Records a case's row and counters: `bytes` moved by one launch taking `t` seconds.
void Report(benchmark::State& state, const std::string& name, double t, int64_t bytes,
            int batch) {
  const double gbps = t > 0 ? static_cast<double>(bytes) / t * 1e-9 : 0;
  state.counters["us"] = t * 1e6;
  state.counters["GB/s"] = gbps;
  state.counters["of_copy"] = gbps / g->copy_gbps;
  state.counters["launches_per_graph"] = batch;
  g->rows.push_back({name, t * 1e6, gbps, gbps / g->copy_gbps});
}

// Dequantize/<format>: kernels::LaunchDequantize of an [n, k] weight into f16, as the
// block GEMM dequantizes a prompt step's chunk, with n rows enough that weight and output
// exceed L2 several times over (no flush needed): GB/s counts the blocks read and the f16
// values written, against the copy's read + write.
absl::Status RunDequantCase(benchmark::State& state, const std::string& name, DType w_dtype,
                            int64_t n, int64_t k) {
  const int64_t w_bytes = n * DTypeRowBytes(w_dtype, k);
  const int64_t out_bytes = n * k * 2;
  SG_ASSIGN_OR_RETURN(DeviceMemory w, AllocateDevice(RoundUp(w_bytes, kAlign), "weight"));
  SG_ASSIGN_OR_RETURN(DeviceMemory out, AllocateDevice(out_bytes, "f16 output"));
  const std::vector<uint8_t> bytes = WeightBytes(w_dtype, n, k);
  SG_RETURN_IF_ERROR(ToStatus(cudaMemcpy(w.get(), bytes.data(), bytes.size(),
                                         cudaMemcpyHostToDevice),
                              "cudaMemcpy(weight)"));
  SG_ASSIGN_OR_RETURN(double t, TimeLaunches(state, 1, false, [&](int) {
                        return ToStatus(kernels::LaunchDequantize(w.get(), w_dtype, n, 0, n, k,
                                                                  out.get(), DType::kF16,
                                                                  g->stream.get()),
                                        "LaunchDequantize");
                      }));
  Report(state, name, t, w_bytes + out_bytes, 1);
  return absl::OkStatus();
}

absl::Status RunCase(benchmark::State& state, const std::string& name, DType w_dtype, int64_t n,
                     int64_t k, Kernel kernel, int64_t m, DType act,
                     kernels::BlockMmaShape shape, kernels::FusedUnitWalk walk) {
  const bool fused = kernel == Kernel::kFused || kernel == Kernel::kFusedMma;
  const DType kT = act;
  const int64_t elem = DTypeBytes(act);
  const int64_t w_bytes = n * DTypeRowBytes(w_dtype, k);
  const int64_t set_bytes =
      RoundUp(w_bytes, kAlign) + RoundUp(m * k * elem, kAlign) + RoundUp(m * n * elem, kAlign);
  size_t free_bytes = 0, total_bytes = 0;
  SG_RETURN_IF_ERROR(ToStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  const int64_t target = 3 * g->l2_bytes;
  const int64_t fit = std::max<int64_t>(1, static_cast<int64_t>(free_bytes / 2) / set_bytes);
  const int batch = static_cast<int>(
      std::clamp<int64_t>(std::min((target + set_bytes - 1) / set_bytes, fit), 1, kMaxBatch));
  const bool flush = batch * set_bytes < target;

  SG_ASSIGN_OR_RETURN(DeviceMemory pool, AllocateDevice(batch * set_bytes, "benchmark sets"));
  auto* base = static_cast<uint8_t*>(pool.get());
  const std::vector<uint8_t> w = WeightBytes(w_dtype, n, k);
  std::vector<uint8_t> x(static_cast<size_t>(m * k * elem));
  for (int64_t i = 0; i < m * k; ++i) {
    StoreElement(x.data(), act, i, 0.001f * static_cast<float>(i % 997) - 0.5f);
  }
  const int64_t x_off = RoundUp(w_bytes, kAlign), y_off = x_off + RoundUp(m * k * elem, kAlign);
  SG_RETURN_IF_ERROR(ToStatus(cudaMemcpy(base, w.data(), w.size(), cudaMemcpyHostToDevice),
                              "cudaMemcpy(weight)"));
  SG_RETURN_IF_ERROR(ToStatus(cudaMemcpy(base + x_off, x.data(), x.size(),
                                         cudaMemcpyHostToDevice),
                              "cudaMemcpy(x)"));
  for (int s = 1; s < batch; ++s) {
    SG_RETURN_IF_ERROR(ToStatus(cudaMemcpy(base + s * set_bytes, base, set_bytes,
                                           cudaMemcpyDeviceToDevice),
                                "cudaMemcpy(set)"));
  }
  SG_RETURN_IF_ERROR(ToStatus(cudaDeviceSynchronize(), "sync after upload"));

  // The fused launch's arguments and its split-K workspace, shared by the sets (each
  // launch leaves its tickets zeroed for the next).
  kernels::FusedMatmulArgs fused_args;
  fused_args.m = m;
  fused_args.k = k;
  fused_args.n[0] = n;
  fused_args.w_dtype[0] = w_dtype;
  fused_args.dtype = kT;
  fused_args.weights_constant = true;
  fused_args.walk = walk;
  fused_args.splits = kernels::FusedSplitsFor(fused_args, SmCount());
  DeviceMemory workspace;
  if (kernel == Kernel::kFusedMma) {
    fused_args.splits = 1;
    fused_args.mma_terms = kernels::BlockMmaTerms(kT, 3);
    kernels::BlockMmaWorkspace ws;
    if (!kernels::BlockMmaWorkspaceFor(m, k, &n, 1, w_dtype, fused_args.mma_terms, SmCount(),
                                       true, &ws)) {
      return absl::InvalidArgumentError("products workspace overflows");
    }
    SG_ASSIGN_OR_RETURN(workspace, AllocateDevice(ws.bytes, "products workspace"));
    fused_args.product_splits = ws.splits;
    fused_args.products = static_cast<float*>(workspace.get());
    fused_args.mma_scratch = static_cast<uint8_t*>(workspace.get()) + ws.partial_bytes;
  }
  kernels::BlockMmaWorkspace plain_ws;
  if (kernel == Kernel::kPlainMma) {
    // Split as a MatMul node splits (the lm head's columns make blocks enough: one split,
    // y written directly).
    if (!kernels::BlockMmaWorkspaceFor(m, k, &n, 1, w_dtype, kernels::BlockMmaTerms(kT, 3),
                                       SmCount(), false, &plain_ws, shape)) {
      return absl::InvalidArgumentError("MMA workspace overflows");
    }
    SG_ASSIGN_OR_RETURN(workspace, AllocateDevice(plain_ws.bytes, "MMA workspace"));
  }
  if (fused && fused_args.splits > 1) {
    const int64_t partial_bytes = RoundUp(fused_args.splits * m * n * 4, kAlign);
    const int64_t counter_bytes = RoundUp(kernels::FusedColumnBlocks(fused_args) * 4, kAlign);
    SG_ASSIGN_OR_RETURN(workspace,
                        AllocateDevice(partial_bytes + counter_bytes, "split-K workspace"));
    SG_RETURN_IF_ERROR(ToStatus(cudaMemset(workspace.get(), 0, partial_bytes + counter_bytes),
                                "cudaMemset(split-K workspace)"));
    fused_args.partials = static_cast<float*>(workspace.get());
    fused_args.counters =
        reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(workspace.get()) + partial_bytes);
  }
  SG_RETURN_IF_ERROR(ToStatus(cudaDeviceSynchronize(), "sync after workspace"));

  cudaStream_t stream = g->stream.get();
  auto launch = [&](int s) {
    uint8_t* set = base + s * set_bytes;
    if (fused) {
      kernels::FusedMatmulArgs a = fused_args;
      a.x = set + x_off;
      a.w[0] = set;
      a.y = set + y_off;
      return ToStatus(kernels::LaunchFusedMatmul(a, stream), "fused launch");
    }
    if (kernel == Kernel::kPlainMma) {
      kernels::BlockMmaArgs a;
      a.x = set + x_off;
      a.m = m;
      a.k = k;
      a.dtype = kT;
      a.w[0] = set;
      a.n[0] = n;
      a.w_dtype = w_dtype;
      a.terms = kernels::BlockMmaTerms(kT, 3);
      a.y = set + y_off;
      a.ld = n;
      a.splits = plain_ws.splits;
      a.partials = static_cast<float*>(workspace.get());
      a.scratch = static_cast<uint8_t*>(workspace.get()) + plain_ws.partial_bytes;
      a.shape = plain_ws.shape;  // as the dispatcher launches it (kAuto resolved there)
      return ToStatus(kernels::LaunchBlockMma(a, stream), "block MMA launch");
    }
    if (kernel == Kernel::kRow || kernel == Kernel::kRowInt8 || kernel == Kernel::kRowInt16 ||
        kernel == Kernel::kRowInt16x2) {
      const kernels::QuantRowX row_x =
          kernel == Kernel::kRowInt8      ? kernels::QuantRowX::kInt8
          : kernel == Kernel::kRowInt16   ? kernels::QuantRowX::kInt16
          : kernel == Kernel::kRowInt16x2 ? kernels::QuantRowX::kInt16x2
                                          : kernels::QuantRowX::kF32;
      return ToStatus(kernels::LaunchQuantRowMatmul(set + x_off, set, w_dtype, nullptr,
                                                    set + y_off, n, k, kT, true, SmCount(),
                                                    row_x, stream),
                      "row launch");
    }
    const cudaError_t e =
        IsQuantized(w_dtype)
            ? kernels::LaunchQuantMatmul(set + x_off, set, w_dtype, nullptr, set + y_off, m, n, k,
                                         kT, stream)
            : kernels::LaunchGemv(set + x_off, set, nullptr, set + y_off, m, n, k, kT, stream);
    return ToStatus(e, "launch");
  };
  SG_ASSIGN_OR_RETURN(const double t, TimeLaunches(state, batch, flush, launch));
  Report(state, name, t, w_bytes + (m * k + m * n) * elem, batch);
  return absl::OkStatus();
}

// A mixture of experts' decode matmul (kernels/moe.cuh) at Qwen3-30B-A3B's shapes: one row,
// kMoeTopK of kMoeExperts experts [n, k] in `w_dtype` (x in f32 for block formats, in the
// weights' dtype otherwise), gated (gate and up experts with SiluMul: `w_up`) or per slot
// (the down experts, each chosen expert its own x). The graph's launches choose disjoint
// experts, so that together they read every expert (beyond L2); GB/s counts the chosen
// experts' bytes (twice when gated) and x and y once.
constexpr int64_t kMoeExperts = 128, kMoeTopK = 8;

// The device side of a MoE case in one allocation: the experts [kMoeExperts, n, k] in
// `w_dtype` (and with `gated` the same weights again as the up experts), `ids`, x of
// `x_elems` values of `act` (fixed, varied values) and room for y's `y_elems`.
struct MoeBuffers {
  DeviceMemory pool;
  const uint8_t* w = nullptr;
  const uint8_t* w_up = nullptr;  // null unless gated
  const int32_t* ids = nullptr;
  const uint8_t* x = nullptr;
  uint8_t* y = nullptr;
};

absl::StatusOr<MoeBuffers> UploadMoeCase(DType w_dtype, DType act, int64_t n, int64_t k,
                                         bool gated, const std::vector<int32_t>& ids,
                                         int64_t x_elems, int64_t y_elems) {
  const int64_t elem = DTypeBytes(act);
  const int64_t w_stride = RoundUp(kMoeExperts * n * DTypeRowBytes(w_dtype, k), kAlign);
  const int64_t ids_off = w_stride * (gated ? 2 : 1);
  const int64_t x_off = ids_off + RoundUp(static_cast<int64_t>(ids.size()) * 4, kAlign);
  const int64_t y_off = x_off + RoundUp(x_elems * elem, kAlign);
  MoeBuffers b;
  SG_ASSIGN_OR_RETURN(b.pool, AllocateDevice(y_off + RoundUp(y_elems * elem, kAlign), "MoE case"));
  auto* base = static_cast<uint8_t*>(b.pool.get());
  const std::vector<uint8_t> w = WeightBytes(w_dtype, kMoeExperts * n, k);
  for (int copy = 0; copy < (gated ? 2 : 1); ++copy) {
    SG_RETURN_IF_ERROR(ToStatus(cudaMemcpy(base + copy * w_stride, w.data(), w.size(),
                                           cudaMemcpyHostToDevice),
                                "cudaMemcpy(experts)"));
  }
  std::vector<uint8_t> x(static_cast<size_t>(x_elems * elem));
  for (int64_t i = 0; i < x_elems; ++i) {
    StoreElement(x.data(), act, i, 0.001f * static_cast<float>(i % 997) - 0.5f);
  }
  SG_RETURN_IF_ERROR(ToStatus(cudaMemcpy(base + ids_off, ids.data(), ids.size() * 4,
                                         cudaMemcpyHostToDevice),
                              "cudaMemcpy(ids)"));
  SG_RETURN_IF_ERROR(ToStatus(cudaMemcpy(base + x_off, x.data(), x.size(),
                                         cudaMemcpyHostToDevice),
                              "cudaMemcpy(x)"));
  b.w = base;
  b.w_up = gated ? base + w_stride : nullptr;
  b.ids = reinterpret_cast<const int32_t*>(base + ids_off);
  b.x = base + x_off;
  b.y = base + y_off;
  return b;
}

// The ids of `batch` launches of kMoeTopK experts each: launch s chooses experts 8s ..
// 8s+7, shuffled, so that together the launches read every expert.
std::vector<int32_t> DisjointExpertIds(int batch) {
  std::vector<int32_t> ids(static_cast<size_t>(batch * kMoeTopK));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::mt19937 rng(5);
  for (int s = 0; s < batch; ++s) {
    std::shuffle(ids.begin() + s * kMoeTopK, ids.begin() + (s + 1) * kMoeTopK, rng);
  }
  return ids;
}

// `row`: the one-row kernel (LaunchQuantRowMoe) with x taken so, as the dispatcher runs a
// block-format decode step; none: LaunchMoeMatMul's block per pair.
absl::Status RunMoeCase(benchmark::State& state, const std::string& name, DType w_dtype,
                        int64_t n, int64_t k, bool gated,
                        std::optional<kernels::QuantRowX> row) {
  const DType act = IsQuantized(w_dtype) ? DType::kF32 : w_dtype;
  const int64_t elem = DTypeBytes(act);
  const int64_t row_bytes = DTypeRowBytes(w_dtype, k);
  const int64_t x_elems = gated ? k : kMoeTopK * k, y_elems = kMoeTopK * n;
  const int batch = static_cast<int>(kMoeExperts / kMoeTopK);
  const std::vector<int32_t> ids = DisjointExpertIds(batch);
  SG_ASSIGN_OR_RETURN(const MoeBuffers b,
                      UploadMoeCase(w_dtype, act, n, k, gated, ids, x_elems, y_elems));
  cudaStream_t stream = g->stream.get();
  auto launch = [&](int s) {
    const int32_t* launch_ids = b.ids + s * kMoeTopK;
    if (row.has_value()) {
      return ToStatus(kernels::LaunchQuantRowMoe(b.x, b.w, b.w_up, w_dtype, launch_ids, b.y, 1,
                                                 kMoeExperts, n, k, kMoeTopK, !gated, act,
                                                 nullptr, SmCount(), *row, stream),
                      "LaunchQuantRowMoe");
    }
    return ToStatus(kernels::LaunchMoeMatMul(b.x, b.w, w_dtype, launch_ids, b.y, 1, kMoeExperts,
                                             n, k, kMoeTopK, !gated, act, nullptr, stream,
                                             b.w_up, 2),
                    "LaunchMoeMatMul");
  };
  SG_ASSIGN_OR_RETURN(const double t, TimeLaunches(state, batch, false, launch));
  Report(state, name, t,
         (gated ? 2 : 1) * kMoeTopK * n * row_bytes + (x_elems + y_elems) * elem, batch);
  return absl::OkStatus();
}

// A mixture of experts' down experts and their weighted sum at decode (Qwen3-30B-A3B's
// shapes: one row, kMoeTopK of kMoeExperts experts [2048, 768], the routing weights from
// 128 router logits, the residual added), as two launches (`fused` false: the one-row
// kernel's MoeMatMul per slot, then LaunchMoeCombine with the route, as the default passes
// leave them) or one (LaunchQuantRowMoeCombine: MoeCombine's matmul, the
// moe_down_into_combine pass). x as two int16 parts (the default at one row). GB/s counts
// the chosen experts' bytes, x, the logits and the output.
absl::Status RunMoeCombineCase(benchmark::State& state, const std::string& name,
                               DType w_dtype, bool fused) {
  constexpr int64_t n = 2048, k = 768;
  const DType act = DType::kF32;
  const int batch = static_cast<int>(kMoeExperts / kMoeTopK);
  const std::vector<int32_t> ids = DisjointExpertIds(batch);
  SG_ASSIGN_OR_RETURN(const MoeBuffers b, UploadMoeCase(w_dtype, act, n, k, false, ids,
                                                        kMoeTopK * k, kMoeTopK * n));
  // The router's logits (varied values) and the output, which is also the residual.
  std::vector<float> logits(kMoeExperts);
  for (int64_t e = 0; e < kMoeExperts; ++e) logits[e] = 0.01f * static_cast<float>(e % 37);
  SG_ASSIGN_OR_RETURN(DeviceMemory route, AllocateDevice(RoundUp(kMoeExperts * 4, kAlign) +
                                                             n * 4, "logits and output"));
  auto* logits_d = static_cast<float*>(route.get());
  auto* out = reinterpret_cast<float*>(static_cast<uint8_t*>(route.get()) +
                                       RoundUp(kMoeExperts * 4, kAlign));
  SG_RETURN_IF_ERROR(ToStatus(cudaMemcpy(logits_d, logits.data(), logits.size() * 4,
                                         cudaMemcpyHostToDevice),
                              "cudaMemcpy(logits)"));
  SG_RETURN_IF_ERROR(ToStatus(cudaMemset(out, 0, n * 4), "cudaMemset(output)"));
  cudaStream_t stream = g->stream.get();
  const kernels::QuantRowX x_mode = kernels::QuantRowX::kInt16x2;
  auto launch = [&](int s) {
    const int32_t* launch_ids = b.ids + s * kMoeTopK;
    if (fused) {
      kernels::QuantRowMoeCombine a;
      a.x = b.x;
      a.w = b.w;
      a.w_dtype = w_dtype;
      a.ids = launch_ids;
      a.weights = logits_d;
      a.weights_dtype = DType::kF32;
      a.route_experts = kMoeExperts;
      a.residual = out;
      a.out = out;
      a.rows = 1;
      a.experts = kMoeExperts;
      a.n = n;
      a.k = k;
      a.top_k = kMoeTopK;
      a.dtype = act;
      return ToStatus(kernels::LaunchQuantRowMoeCombine(a, SmCount(), x_mode, stream),
                      "LaunchQuantRowMoeCombine");
    }
    SG_RETURN_IF_ERROR(ToStatus(
        kernels::LaunchQuantRowMoe(b.x, b.w, nullptr, w_dtype, launch_ids, b.y, 1, kMoeExperts,
                                   n, k, kMoeTopK, true, act, nullptr, SmCount(), x_mode, stream),
        "LaunchQuantRowMoe"));
    const kernels::MoeCombineRoute r{kMoeExperts, true, false, nullptr};
    return ToStatus(kernels::LaunchMoeCombine(b.y, act, logits_d, DType::kF32, launch_ids, out, 1,
                                              n, kMoeTopK, stream, out, &r),
                    "LaunchMoeCombine");
  };
  SG_ASSIGN_OR_RETURN(const double t, TimeLaunches(state, batch, false, launch));
  Report(state, name, t,
         kMoeTopK * n * DTypeRowBytes(w_dtype, k) + (kMoeTopK * k + kMoeExperts + n) * 4, batch);
  return absl::OkStatus();
}

// A mixture of experts' prefill matmul (kernels/moe.cuh, walking by expert) at Qwen3-30B-
// A3B's shapes: `rows` rows (a prefill chunk), each choosing kMoeTopK distinct experts of
// kMoeExperts at random, uniformly or `skewed` (expert e drawn with weight 1 / (e + 1), so
// that a few experts take most pairs, as an untrained router's do), gated or per slot as
// RunMoeCase. TFLOP/s: 2 · rows · top_k · n · k (twice when gated) over the time (the
// counter `tflops`). mma_terms > 0: the tensor-core path (kernels/block_mma.cuh's
// LaunchMoeBlockMma, x in that many parts: BlockMmaArgs::terms) instead of the by-expert
// kernel.
absl::Status RunMoePrefillCase(benchmark::State& state, const std::string& name,
                               DType w_dtype, int64_t rows, int64_t n, int64_t k, bool gated,
                               bool skewed, int mma_terms = 0) {
  const DType act = IsQuantized(w_dtype) ? DType::kF32 : w_dtype;
  const int64_t elem = DTypeBytes(act);
  const int64_t w_bytes = kMoeExperts * n * DTypeRowBytes(w_dtype, k);
  const int64_t pairs = rows * kMoeTopK;
  const int64_t x_elems = gated ? rows * k : pairs * k, y_elems = pairs * n;
  std::vector<int32_t> ids(static_cast<size_t>(pairs));
  std::vector<double> weight(kMoeExperts);
  for (int64_t e = 0; e < kMoeExperts; ++e) {
    weight[e] = skewed ? 1.0 / static_cast<double>(e + 1) : 1.0;
  }
  std::mt19937 rng(7);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> left = weight;  // drawn without replacement
    for (int64_t j = 0; j < kMoeTopK; ++j) {
      std::discrete_distribution<int32_t> pick(left.begin(), left.end());
      const int32_t e = pick(rng);
      ids[r * kMoeTopK + j] = e;
      left[e] = 0.0;
    }
  }
  SG_ASSIGN_OR_RETURN(const MoeBuffers b,
                      UploadMoeCase(w_dtype, act, n, k, gated, ids, x_elems, y_elems));
  cudaStream_t stream = g->stream.get();
  DeviceMemory workspace;
  if (mma_terms > 0) {
    const int64_t bytes =
        kernels::MoeBlockMmaWorkspaceBytes(rows, kMoeExperts, k, kMoeTopK, mma_terms);
    if (bytes < 0) return absl::InvalidArgumentError("the MoE MMA workspace overflows");
    SG_ASSIGN_OR_RETURN(workspace, AllocateDevice(bytes, "the MoE MMA workspace"));
  }
  auto launch = [&](int) {
    if (mma_terms > 0) {
      kernels::MoeBlockMmaArgs a;
      a.x = b.x;
      a.dtype = act;
      a.w = b.w;
      a.w_up = b.w_up;
      a.w_dtype = w_dtype;
      a.ids = b.ids;
      a.rows = rows;
      a.experts = kMoeExperts;
      a.n = n;
      a.k = k;
      a.top_k = kMoeTopK;
      a.per_slot = !gated;
      a.y = b.y;
      a.terms = mma_terms;
      a.workspace = workspace.get();
      return ToStatus(kernels::LaunchMoeBlockMma(a, stream), "LaunchMoeBlockMma");
    }
    return ToStatus(kernels::LaunchMoeMatMul(b.x, b.w, w_dtype, b.ids, b.y, rows, kMoeExperts,
                                             n, k, kMoeTopK, !gated, act, nullptr, stream,
                                             b.w_up, 2),
                    "LaunchMoeMatMul");
  };
  SG_ASSIGN_OR_RETURN(const double t, TimeLaunches(state, 1, false, launch));
  Report(state, name, t, (gated ? 2 : 1) * w_bytes + (x_elems + y_elems) * elem, 1);
  state.counters["tflops"] =
      t > 0 ? 2.0 * static_cast<double>(pairs * n * k * (gated ? 2 : 1)) / t * 1e-12 : 0.0;
  return absl::OkStatus();
}

absl::Status Setup() {
  SG_ASSIGN_OR_RETURN(g->stream, CreateStream("quant_bench"));
  int device = 0, l2 = 0;
  SG_RETURN_IF_ERROR(ToStatus(cudaGetDevice(&device), "cudaGetDevice"));
  SG_RETURN_IF_ERROR(ToStatus(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device),
                              "cudaDeviceGetAttribute(L2)"));
  g->l2_bytes = l2;
  g->flush_bytes = std::max<int64_t>(2 * g->l2_bytes, 64 << 20);
  SG_ASSIGN_OR_RETURN(g->flush, AllocateDevice(g->flush_bytes, "the L2 flush buffer"));
  return MeasureCopy();
}

}  // namespace
}  // namespace sg

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (!sg::CudaDeviceAvailable()) {
    std::fprintf(stderr, "quant_bench: no CUDA device is available; nothing to measure.\n");
    return 0;
  }
  sg::Context context;
  sg::g = &context;
  if (absl::Status s = sg::Setup(); !s.ok()) {
    std::fprintf(stderr, "quant_bench: setup failed: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("L2 %lld MiB; D2D copy %.1f GB/s (read + write)\n",
              static_cast<long long>(context.l2_bytes >> 20), context.copy_gbps);

  struct Shape {
    const char* what;
    int64_t n, k;
  };
  constexpr sg::DType kFormats[] = {sg::DType::kBF16, sg::DType::kQ8_0, sg::DType::kQ4_0,
                                    sg::DType::kQ4_1, sg::DType::kQ5_0, sg::DType::kQ5_1,
                                    sg::DType::kQ4_K, sg::DType::kQ5_K, sg::DType::kQ6_K};
  using sg::Kernel;
  auto add = [](const std::string& name, sg::DType t, Shape s, Kernel kernel, int64_t m,
                sg::DType act,
                sg::kernels::BlockMmaShape shape = sg::kernels::BlockMmaShape::kAuto,
                sg::kernels::FusedUnitWalk walk = sg::kernels::FusedArgsDefaultWalk()) {
    benchmark::RegisterBenchmark(
        name.c_str(),
        [=](benchmark::State& state) {
          if (absl::Status st =
                  sg::RunCase(state, name, t, s.n, s.k, kernel, m, act, shape, walk);
              !st.ok()) {
            state.SkipWithError(st.ToString().c_str());
          }
        })
        ->UseManualTime()
        ->Iterations(sg::kIterations)
        ->Unit(benchmark::kMicrosecond);
  };
  for (const Shape& s : {Shape{"q/o", 2048, 2048}, Shape{"k/v", 512, 2048},
                         Shape{"gate/up", 8192, 2048}, Shape{"down", 2048, 8192},
                         Shape{"lm head", 128256, 2048}}) {
    for (sg::DType t : kFormats) {
      for (bool fused : {false, true}) {
        add(absl::StrCat(fused ? "Fused/" : sg::IsQuantized(t) ? "QuantMatMul/" : "Gemv/",
                         sg::DTypeName(t), "/M=1 N=", s.n, " K=", s.k, " (", s.what, ")"),
            t, s, fused ? Kernel::kFused : Kernel::kPlain, 1, sg::DType::kBF16);
      }
    }
  }
  // Block formats with f32 activations, as a GGUF file computes: the plain kernel at the
  // batch sizes of decode, the fused one at M = 1 and beside it the fused tensor-core path
  // (MmaF32; x in three bf16 parts) at the batch sizes, and for the lm head the tensor-core
  // kernel writing y (MmaPlainF32).
  for (const Shape& s : {Shape{"q/o", 2048, 2048}, Shape{"gate/up", 8192, 2048},
                         Shape{"down", 2048, 8192}, Shape{"lm head", 128256, 2048}}) {
    for (sg::DType t : kFormats) {
      if (!sg::IsQuantized(t)) continue;
      for (const int64_t m : {1, 2, 4, 8, 16, 32}) {
        auto label = [&](const char* kind) {
          return absl::StrCat(kind, sg::DTypeName(t), "/M=", m, " N=", s.n, " K=", s.k, " (",
                              s.what, ")");
        };
        if (m != 2 && m != 32) {
          add(label("QuantMatMulF32/"), t, s, Kernel::kPlain, m, sg::DType::kF32);
        }
        const bool lm_head = s.n > 100000;
        add(label(lm_head ? "MmaPlainF32/" : "MmaF32/"), t, s,
            lm_head ? Kernel::kPlainMma : Kernel::kFusedMma, m, sg::DType::kF32);
      }
      add(absl::StrCat("FusedF32/", sg::DTypeName(t), "/M=1 N=", s.n, " K=", s.k, " (", s.what,
                       ")"),
          t, s, Kernel::kFused, 1, sg::DType::kF32);
      add(absl::StrCat("RowF32/", sg::DTypeName(t), "/M=1 N=", s.n, " K=", s.k, " (", s.what,
                       ")"),
          t, s, Kernel::kRow, 1, sg::DType::kF32);
      // The one-row kernel with x as integers (QuantRowX): RowInt8/..., RowInt16/...,
      // RowInt16x2/...
      for (const auto& [kind, kernel] : {std::pair{"RowInt8/", Kernel::kRowInt8},
                                         std::pair{"RowInt16/", Kernel::kRowInt16},
                                         std::pair{"RowInt16x2/", Kernel::kRowInt16x2}}) {
        add(absl::StrCat(kind, sg::DTypeName(t), "/M=1 N=", s.n, " K=", s.k, " (", s.what, ")"),
            t, s, kernel, 1, sg::DType::kF32);
      }
      // The 32-value formats in each way of walking their units (FusedUnitWalk).
      if (sg::DTypeBlockElems(t) == 32) {
        using sg::kernels::FusedUnitWalk;
        for (const auto& [walk, walk_name] :
             {std::pair{FusedUnitWalk::kSerial, "serial"},
              std::pair{FusedUnitWalk::kWide, "wide"}}) {
          add(absl::StrCat("FusedWalkF32/", sg::DTypeName(t), "/M=1 N=", s.n, " K=", s.k, " (",
                           s.what, ")/", walk_name),
              t, s, Kernel::kFused, 1, sg::DType::kF32, sg::kernels::BlockMmaShape::kAuto, walk);
        }
      }
    }
  }
  // One row at Qwen3-8B's shapes (hidden 4096, intermediate 12288, 8 KV heads of 128,
  // vocabulary 151,936), where the weights dwarf every fixed cost: Big/<kernel>/<format>/...
  // with the bf16 small-M kernel beside them (Big/Gemv/BF16), the floor a half file reads.
  for (const Shape& s : {Shape{"8B q/o", 4096, 4096}, Shape{"8B k/v", 1024, 4096},
                         Shape{"8B gate/up", 12288, 4096}, Shape{"8B down", 4096, 12288},
                         Shape{"8B lm head", 151936, 4096}}) {
    for (sg::DType t : {sg::DType::kBF16, sg::DType::kQ8_0, sg::DType::kQ4_0, sg::DType::kQ4_K,
                        sg::DType::kQ5_K, sg::DType::kQ6_K}) {
      auto label = [&](const char* kind) {
        return absl::StrCat("Big/", kind, "/", sg::DTypeName(t), "/N=", s.n, " K=", s.k, " (",
                            s.what, ")");
      };
      if (!sg::IsQuantized(t)) {
        add(label("Gemv"), t, s, Kernel::kPlain, 1, sg::DType::kBF16);
        continue;
      }
      add(label("Fused"), t, s, Kernel::kFused, 1, sg::DType::kF32);
      add(label("Plain"), t, s, Kernel::kPlain, 1, sg::DType::kF32);
      if (sg::kernels::QuantRowMatmulTakes(s.n, s.k, t)) {
        add(label("Row"), t, s, Kernel::kRow, 1, sg::DType::kF32);
        add(label("RowInt8"), t, s, Kernel::kRowInt8, 1, sg::DType::kF32);
        add(label("RowInt16"), t, s, Kernel::kRowInt16, 1, sg::DType::kF32);
        add(label("RowInt16x2"), t, s, Kernel::kRowInt16x2, 1, sg::DType::kF32);
      }
      // The tensor-core kernel at one row (x in three bf16 parts).
      add(label("Mma"), t, s, s.n > 100000 ? Kernel::kPlainMma : Kernel::kFusedMma, 1,
          sg::DType::kF32);
    }
  }
  // A mixture of experts' decode matmuls at Qwen3-30B-A3B's shapes (hidden 2048, 128
  // experts of 768, 8 chosen): MoeDecode/<format>/<gate+up|down>/<kernel>, the block per
  // pair (pair) and, for block formats, the one-row kernel with f32 products (row) and x as
  // two int16 parts (row-int16x2).
  using RowX = std::optional<sg::kernels::QuantRowX>;
  for (sg::DType t : {sg::DType::kBF16, sg::DType::kQ8_0, sg::DType::kQ4_0, sg::DType::kQ4_K,
                      sg::DType::kQ6_K}) {
    for (const bool gated : {true, false}) {
      for (const RowX row : {RowX{}, RowX{sg::kernels::QuantRowX::kF32},
                             RowX{sg::kernels::QuantRowX::kInt16x2}}) {
        if (row.has_value() && !sg::IsQuantized(t)) continue;
        const std::string name = absl::StrCat(
            "MoeDecode/", sg::DTypeName(t), "/",
            gated ? "gate+up N=768 K=2048" : "down N=2048 K=768", "/",
            !row.has_value()                              ? "pair"
            : *row == sg::kernels::QuantRowX::kF32 ? "row"
                                                          : "row-int16x2");
        benchmark::RegisterBenchmark(name.c_str(),
                                     [=](benchmark::State& state) {
                                       if (absl::Status st = sg::RunMoeCase(
                                               state, name, t, gated ? 768 : 2048,
                                               gated ? 2048 : 768, gated, row);
                                           !st.ok()) {
                                         state.SkipWithError(st.ToString().c_str());
                                       }
                                     })
            ->UseManualTime()
            ->Iterations(sg::kIterations)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  // The down experts and their combine, two launches against one:
  // MoeDecode/<format>/down+combine N=2048 K=768/<pair+combine|fused>.
  for (sg::DType t : {sg::DType::kQ4_K, sg::DType::kQ6_K}) {
    for (const bool fused : {false, true}) {
      const std::string name = absl::StrCat("MoeDecode/", sg::DTypeName(t),
                                            "/down+combine N=2048 K=768/",
                                            fused ? "fused" : "pair+combine");
      benchmark::RegisterBenchmark(name.c_str(),
                                   [=](benchmark::State& state) {
                                     if (absl::Status st = sg::RunMoeCombineCase(state, name, t,
                                                                                 fused);
                                         !st.ok()) {
                                       state.SkipWithError(st.ToString().c_str());
                                     }
                                   })
          ->UseManualTime()
          ->Iterations(sg::kIterations)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  // The experts' prefill matmul (by expert) for a chunk of `rows` rows, routed uniformly or
  // skewed, and for block formats the tensor-core path with x in three bf16 parts, two
  // scaled f16 parts, one (auto's from 16 pairs) and int8 (/mma_3, /mma_f16x2, /mma_f16,
  // /mma_int8; CudaOptions::moe_block_mma):
  // MoePrefill/<format>/<gate+up|down>/rows:<rows>/<uniform|skewed>[/mma_<x>].
  const auto moe_prefill = [](sg::DType t, int64_t rows, bool gated, bool skewed, int terms) {
    const std::string name = absl::StrCat(
        "MoePrefill/", sg::DTypeName(t), "/", gated ? "gate+up N=768 K=2048" : "down N=2048 K=768",
        "/rows:", rows, "/", skewed ? "skewed" : "uniform",
        terms == 3                             ? "/mma_3"
        : terms == sg::kernels::kBlockMmaF16x2 ? "/mma_f16x2"
        : terms == sg::kernels::kBlockMmaF16x1 ? "/mma_f16"
        : terms == sg::kernels::kBlockMmaInt8  ? "/mma_int8"
                                               : "");
    benchmark::RegisterBenchmark(name.c_str(),
                                 [=](benchmark::State& state) {
                                   if (absl::Status st = sg::RunMoePrefillCase(
                                           state, name, t, rows, gated ? 768 : 2048,
                                           gated ? 2048 : 768, gated, skewed, terms);
                                       !st.ok()) {
                                     state.SkipWithError(st.ToString().c_str());
                                   }
                                 })
        ->UseManualTime()
        ->Iterations(sg::kIterations)
        ->Unit(benchmark::kMicrosecond);
  };
  for (sg::DType t : {sg::DType::kBF16, sg::DType::kQ4_0, sg::DType::kQ4_K, sg::DType::kQ6_K}) {
    for (const bool gated : {true, false}) {
      for (const bool skewed : {false, true}) {
        for (const int terms : {0, 3, sg::kernels::kBlockMmaF16x2, sg::kernels::kBlockMmaF16x1,
                                sg::kernels::kBlockMmaInt8}) {
          if (terms > 0 && !sg::IsQuantized(t)) continue;
          moe_prefill(t, 256, gated, skewed, terms);
        }
      }
    }
  }
  // Few rows a prompt chunk (2 and 4 pairs per expert: where CudaOptions::
  // moe_by_expert_pairs starts the walk by expert), Q4_K, uniform, by expert on the CUDA
  // cores and on the tensor cores (three bf16 parts; one scaled f16 part, as auto takes it
  // from 16 pairs; int8).
  for (const int64_t rows : {32, 64}) {
    for (const bool gated : {true, false}) {
      for (const int terms : {0, 3, sg::kernels::kBlockMmaF16x1, sg::kernels::kBlockMmaInt8}) {
        moe_prefill(sg::DType::kQ4_K, rows, gated, false, terms);
      }
    }
  }
  // The tensor-core kernel at batch and prefill sizes (a MatMul's path, split as the node
  // splits), in every block shape: MmaPrefillF32/<format>/M=<m> ...
  // /<decode|prefill|staged>. TFLOP/s: 2·m·n·k over the time (printed after the table).
  for (const Shape& s : {Shape{"q/o", 2048, 2048}, Shape{"gate/up", 8192, 2048},
                         Shape{"down", 2048, 8192}}) {
    for (sg::DType t : {sg::DType::kQ4_0, sg::DType::kQ8_0, sg::DType::kQ4_K, sg::DType::kQ6_K}) {
      for (const int64_t m : {16, 64, 512}) {
        using sg::kernels::BlockMmaShape;
        for (const auto shape :
             {BlockMmaShape::kDecode, BlockMmaShape::kPrefill, BlockMmaShape::kStaged}) {
          const char* shape_name = shape == BlockMmaShape::kPrefill  ? "prefill"
                                   : shape == BlockMmaShape::kStaged ? "staged"
                                                                     : "decode";
          add(absl::StrCat("MmaPrefillF32/", sg::DTypeName(t), "/M=", m, " N=", s.n, " K=", s.k,
                           " (", s.what, ")/", shape_name),
              t, s, Kernel::kPlainMma, m, sg::DType::kF32, shape);
        }
      }
    }
  }
  // The block GEMM's dequantization into f16 (a prompt step's per-weight pass): 32,768
  // rows of 2,048 (128 MiB of f16, the Llama-3.2-1B gate/up shape four times over).
  for (sg::DType t : kFormats) {
    if (!sg::IsQuantized(t)) continue;
    const std::string name = absl::StrCat("Dequantize/", sg::DTypeName(t), "/N=32768 K=2048");
    benchmark::RegisterBenchmark(name.c_str(),
                                 [=](benchmark::State& state) {
                                   if (absl::Status st =
                                           sg::RunDequantCase(state, name, t, 32768, 2048);
                                       !st.ok()) {
                                     state.SkipWithError(st.ToString().c_str());
                                   }
                                 })
        ->UseManualTime()
        ->Iterations(sg::kIterations)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  std::printf("\n%-56s %10s %9s %8s\n", "case", "us", "GB/s", "of copy");
  for (const sg::Row& r : context.rows) {
    std::printf("%-56s %10.2f %9.1f %8.3f\n", r.name.c_str(), r.us, r.gbps, r.of_copy);
  }
  benchmark::Shutdown();
  return 0;
}
