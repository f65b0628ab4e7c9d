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
// Weights in GGUF block formats (GPU; random blocks; made on first use, so filter them out
// to skip the quantizing):
//   QuantPrefill/<fmt>/<act>/len:<n>
//                         Llama-3.2-1B's shape with every matrix in <fmt> (q4_0, q8_0,
//                         q4_k, q6_k, or q4_k_m: a Q4_K_M file's mix), a prompt of n
//                         tokens (512, 1100, 2048) prefilled in steps of 512 rows
//                         (llama.cpp's default micro-batch; the session's default is 2,048:
//                         the _chunk rows), host clock around Prefill and its wait.
//                         <act>: bf16 activations, or f32 as GGUF files with quantized
//                         matrices compute, with the block GEMM in f32, TF32 or bf16
//                         (CudaOptions::block_gemm_precision); _mma: the tensor-core
//                         kernel instead of the block GEMM (x in 3 bf16 parts, 2 with
//                         bf16x2 precision, 1 with bf16; _decode_shape: its blocks never in the staged
//                         shape); _att_f32: the prompt's attention in f32 (the session's
//                         auto takes f16 for f32 activations under an inexact precision);
//                         _chunk<n>: steps of up to n rows instead of 512.
//                         Counters as Ttft's:
//                         prefill tokens/s, TFLOP/s and of_matmul (over the bf16 rate).
//   BlockMatMul/<fmt>/<path>/m:<m>
//                         the matmuls of 3 Llama-3.2-1B layers alone (q, k, v, o, gate,
//                         up, down; each layer its own weights, together beyond L2) at m
//                         rows (4, 8, 16, 64, 512), one replayed step, CUDA events, median
//                         of 20: <path> kernel (the block-format kernel, row groups of 8),
//                         mma_f32[_bf16x2|_bf16] (the tensor-core kernel, x in 3, 2 or 1
//                         bf16 parts;
//                         _decode, _prefill, _staged: its block shape forced),
//                         gemm_<x>_<precision> (the block GEMM: dequantized chunks through
//                         cuBLASLt; gemm_f32_f16 is auto's path from 32 rows), and fmt
//                         bf16 for the same matmuls on bf16 weights.
//                         us per layer, TFLOP/s and of_matmul: where the block GEMM
//                         overtakes the kernel is CudaOptions::block_gemm_min_rows.
//
// Each case reports manual iteration times; the tables print medians.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/timing.h"
#include "stepgraph/base/quant.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/runtime/measure.h"
#include "stepgraph/runtime/session.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/base/half.h"
#include "stepgraph/base/status.h"
#include "stepgraph/runtime/step_runner.h"
#include "tests/testing/quantized_config.h"

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

// Times the prefill of a random prompt of state.range(0) tokens on `s` (host clock around
// Prefill and the wait for its steps) and, with `first_token`, the first decode step after
// it in the iteration time; sets the prefill counters (over the bf16 matmul rate).
void TimePrefill(benchmark::State& state, DecodeSession& s, bool first_token) {
  const int64_t len = state.range(0);
  const std::vector<int32_t> prompt = RandomPrompt(len, s.config().vocab_size, 1);
  std::vector<double> prefill;
  for (auto _ : state) {
    if (!s.runner().Sync().ok()) return state.SkipWithError("sync failed");
    const Clock::time_point t0 = Clock::now();
    absl::Status st = s.Prefill(0, prompt);
    if (st.ok()) st = s.Tokens(0).status();  // waits for the prefill steps
    const double p = Seconds(t0);
    if (st.ok() && first_token) st = s.Generate(0, 1).status();
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

void Ttft(benchmark::State& state) {
  if (gpu == nullptr) return state.SkipWithError("no CUDA device");
  TimePrefill(state, *gpu->session, true);
}
BENCHMARK(Ttft)->Arg(128)->Arg(512)->Arg(2048)->UseManualTime()->Iterations(10)->Unit(
    benchmark::kMillisecond);

// ---- weights in GGUF block formats ----

// A quantized model's prefill setup: its matrices' format and how activations compute.
struct QuantSetup {
  const char* format;  // q4_0, q8_0, q4_k, q6_k, q4_k_m
  DType activations;
  BlockGemmPrecision precision;
  bool gemm = true;  // the block GEMM from 32 rows; false: the tensor-core kernel at every size
  // The tensor-core kernel's block shape (kDecode: without the staged shape).
  BlockMmaShapeOption shape = BlockMmaShapeOption::kAuto;
  // The prompt's attention (the session resolves auto: f16 under an inexact precision).
  PrefillAttentionPrecision attention = PrefillAttentionPrecision::kAuto;
  int64_t chunk = 512;  // rows of the longest prefill step (SessionOptions::prefill_chunk)
};

std::string SetupName(const QuantSetup& q) {
  return absl::StrCat(q.activations == DType::kBF16
                          ? "bf16"
                          : absl::StrCat("f32_", BlockGemmPrecisionName(q.precision)),
                      q.gemm ? "" : "_mma",
                      q.shape == BlockMmaShapeOption::kDecode ? "_decode_shape" : "",
                      q.attention == PrefillAttentionPrecision::kAuto
                          ? ""
                          : absl::StrCat("_att_", PrefillAttentionPrecisionName(q.attention)),
                      q.chunk == 512 ? "" : absl::StrCat("_chunk", q.chunk));
}

DType FormatDType(const std::string& format, const std::string& name) {
  if (format == "q4_0") return DType::kQ4_0;
  if (format == "q8_0") return DType::kQ8_0;
  if (format == "q4_k") return DType::kQ4_K;
  if (format == "q6_k") return DType::kQ6_K;
  return testing::Q4KMixDType(name);
}

// The session of the last QuantPrefill setup (one at a time: each holds a 1B model).
struct QuantSession {
  std::string key;
  std::unique_ptr<DecodeSession> session;
};
QuantSession* quant = nullptr;

absl::StatusOr<DecodeSession*> QuantSessionFor(const QuantSetup& q) {
  const std::string key = absl::StrCat(q.format, "/", SetupName(q));
  if (quant->key == key) return quant->session.get();
  quant->session.reset();
  quant->key.clear();
  LlamaConfig base = Llama32_1BConfig();
  base.dtype = q.activations;
  const std::string format = q.format;
  SG_ASSIGN_OR_RETURN(LlamaConfig config,
                      testing::WithMatrixDTypes(base, [&](const std::string& name) {
                        return FormatDType(format, name);
                      }));
  SessionOptions o;
  o.config = std::move(config);
  o.backend = Backend::kCuda;
  o.max_seq = 2048 + 8;
  o.buckets = {1};
  o.prefill_chunk = q.chunk;
  o.cuda.block_gemm_precision = q.precision;
  o.cuda.block_gemm_min_rows = q.gemm ? 32 : 0;
  o.cuda.block_mma_shape = q.shape;
  o.cuda.prefill_attention = q.attention;
  SG_ASSIGN_OR_RETURN(quant->session, DecodeSession::Create(o));
  quant->key = key;
  return quant->session.get();
}

void QuantPrefill(benchmark::State& state, QuantSetup q) {
  if (gpu == nullptr) return state.SkipWithError("no CUDA device");
  absl::StatusOr<DecodeSession*> made = QuantSessionFor(q);
  if (!made.ok()) return state.SkipWithError(std::string(made.status().message()).c_str());
  TimePrefill(state, **made, false);
  state.counters["weight_gb"] = static_cast<double>((*made)->weight_bytes()) * 1e-9;
}

// The matmuls of kLayers Llama-3.2-1B layers: name, N, K.
constexpr int kLayers = 3;
struct Projection {
  const char* name;
  int64_t n, k;
};
constexpr Projection kProjections[] = {{"q", 2048, 2048},    {"k", 512, 2048},
                                       {"v", 512, 2048},     {"o", 2048, 2048},
                                       {"gate", 8192, 2048}, {"up", 8192, 2048},
                                       {"down", 2048, 8192}};

// Distinct random rows per matrix; the rest repeat them (the values do not change the
// traffic, and quantizing every row would dominate the run).
constexpr int64_t kDistinctRows = 64;

// A matrix [n, k] in `t` whose rows repeat kDistinctRows random ones, in runner memory,
// laid out as the runner's dispatcher reads a Weight of that dtype (block formats are
// repacked on the way, as a loaded model's are).
absl::StatusOr<void*> RandomMatrix(StepRunner& runner, DType t, int64_t n, int64_t k,
                                   uint32_t seed) {
  const int64_t row_bytes = TensorBytes(t, Shape{1, k});
  std::vector<uint8_t> rows(static_cast<size_t>(kDistinctRows * row_bytes));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t r = 0; r < kDistinctRows; ++r) {
    for (float& v : row) v = value(rng) * 0.05f;
    uint8_t* out = rows.data() + r * row_bytes;
    if (IsQuantized(t)) {
      QuantizeRow(t, row.data(), out, k);
    } else {
      for (int64_t c = 0; c < k; ++c) StoreElement(out, t, c, row[static_cast<size_t>(c)]);
    }
  }
  std::vector<uint8_t> all(static_cast<size_t>(n * row_bytes));
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(all.data() + r * row_bytes, rows.data() + (r % kDistinctRows) * row_bytes,
                static_cast<size_t>(row_bytes));
  }
  SG_ASSIGN_OR_RETURN(void* w, runner.Allocate(n * row_bytes, "BlockMatMul weight"));
  Tensor weight;
  weight.name = "BlockMatMul weight";
  weight.kind = TensorKind::kWeight;
  weight.dtype = t;
  weight.shape = Shape{n, k};
  SG_RETURN_IF_ERROR(runner.CopyWeight(w, all.data(), weight));
  SG_RETURN_IF_ERROR(runner.Sync());  // `all` goes out of scope
  return w;
}

struct MatmulPathSetup {
  const char* name;  // kernel, mma, gemm_<x>_<precision>, or the bf16 weights' own path
  DType activations;
  int64_t min_rows;  // CudaOptions::block_gemm_min_rows
  BlockGemmPrecision precision;
  int64_t mma_rows = 0;  // CudaOptions::block_mma_min_rows
  BlockMmaShapeOption shape = BlockMmaShapeOption::kAuto;  // CudaOptions::block_mma_shape
};

// Median µs of one step holding every matmul of kLayers layers at m rows.
absl::StatusOr<double> TimeLayerMatmuls(DType w_dtype, const MatmulPathSetup& p, int64_t m) {
  RunnerOptions ro{.device = DeviceKind::kCuda};
  ro.cuda.block_gemm_min_rows = p.min_rows;
  ro.cuda.block_gemm_precision = p.precision;
  ro.cuda.block_mma_min_rows = p.mma_rows;
  ro.cuda.block_mma_shape = p.shape;
  SG_ASSIGN_OR_RETURN(std::unique_ptr<StepRunner> runner, StepRunner::Create(ro));
  GraphBuilder b;
  const TensorId x = b.Input("x", p.activations, {m, 2048});
  const TensorId x_down = b.Input("x_down", p.activations, {m, 8192});
  std::vector<std::pair<std::string, void*>> weights;
  uint32_t seed = 1;
  for (int l = 0; l < kLayers; ++l) {
    for (const Projection& pr : kProjections) {
      // The weight and the product need names of their own: a graph's names are unique.
      const std::string name = absl::StrCat("l", l, "_", pr.name);
      const TensorId w = b.Weight(name, w_dtype, {pr.n, pr.k});
      b.Output(name + "_y", b.MatMul(pr.k == 2048 ? x : x_down, w, name + "_matmul"));
      SG_ASSIGN_OR_RETURN(void* mem, RandomMatrix(*runner, w_dtype, pr.n, pr.k, seed++));
      weights.emplace_back(name, mem);
    }
  }
  SG_ASSIGN_OR_RETURN(Graph graph, std::move(b).Build());
  const int64_t x_bytes = m * 2048 * DTypeBytes(p.activations);
  SG_ASSIGN_OR_RETURN(void* xmem, RandomMatrix(*runner, p.activations, m, 2048, 99));
  SG_ASSIGN_OR_RETURN(void* xdown, RandomMatrix(*runner, p.activations, m, 8192, 98));
  SG_ASSIGN_OR_RETURN(
      const int step, runner->AddStep(std::move(graph), [&](const Graph& g, Bindings& bind) {
        SG_RETURN_IF_ERROR(bind.Bind("x", xmem, x_bytes));
        SG_RETURN_IF_ERROR(bind.Bind("x_down", xdown, 4 * x_bytes));
        for (const auto& [name, mem] : weights) {
          SG_ASSIGN_OR_RETURN(TensorId id, g.FindTensor(name));
          SG_RETURN_IF_ERROR(bind.Bind(name, mem, g.tensor(id).bytes()));
        }
        return absl::OkStatus();
      }));
  SG_RETURN_IF_ERROR(runner->Finalize());
  constexpr int kRuns = 20;
  for (int i = 0; i < 3; ++i) SG_RETURN_IF_ERROR(runner->Run(step));
  SG_RETURN_IF_ERROR(StartMarks(*runner, kRuns + 1));
  SG_RETURN_IF_ERROR(Mark(*runner, 0));
  for (int i = 0; i < kRuns; ++i) {
    SG_RETURN_IF_ERROR(runner->Run(step));
    SG_RETURN_IF_ERROR(Mark(*runner, i + 1));
  }
  SG_ASSIGN_OR_RETURN(std::vector<double> ms, MarkIntervalsMs(*runner));
  return Median(std::move(ms)) * 1e3;
}

void BlockMatMul(benchmark::State& state, DType w_dtype, MatmulPathSetup p) {
  if (gpu == nullptr) return state.SkipWithError("no CUDA device");
  const int64_t m = state.range(0);
  double us = 0;
  for (auto _ : state) {
    absl::StatusOr<double> t = TimeLayerMatmuls(w_dtype, p, m);
    if (!t.ok()) return state.SkipWithError(std::string(t.status().message()).c_str());
    us = *t;
    state.SetIterationTime(us * 1e-6);
  }
  double flops = 0;
  for (const Projection& pr : kProjections) {
    flops += 2.0 * static_cast<double>(m) * static_cast<double>(pr.n) * static_cast<double>(pr.k);
  }
  flops *= kLayers;
  const double tflops = flops / (us * 1e-6) * 1e-12;
  state.counters["us_per_layer"] = us / kLayers;
  state.counters["TFLOP_s"] = tflops;
  state.counters["of_matmul"] = tflops / gpu->matmul_tflops;
}

void RegisterQuantCases() {
  for (const char* format : {"q4_0", "q8_0", "q4_k", "q6_k", "q4_k_m"}) {
    for (const QuantSetup& q : {QuantSetup{format, DType::kBF16, BlockGemmPrecision::kF32},
                                QuantSetup{format, DType::kF32, BlockGemmPrecision::kF32},
                                QuantSetup{format, DType::kF32, BlockGemmPrecision::kTf32},
                                QuantSetup{format, DType::kF32, BlockGemmPrecision::kBf16},
                                QuantSetup{format, DType::kF32, BlockGemmPrecision::kF16},
                                // The default (f16 from 16 rows, the GEMM from 32, the
                                // attention in f16), and with the attention in f32.
                                QuantSetup{format, DType::kF32, BlockGemmPrecision::kAuto},
                                QuantSetup{format, DType::kF32, BlockGemmPrecision::kAuto, true,
                                           BlockMmaShapeOption::kAuto,
                                           PrefillAttentionPrecision::kF32},
                                // Longer prefill steps: each step dequantizes every matrix
                                // once, so fewer steps a prompt dequantize less.
                                QuantSetup{format, DType::kF32, BlockGemmPrecision::kAuto, true,
                                           BlockMmaShapeOption::kAuto,
                                           PrefillAttentionPrecision::kAuto, 1024},
                                QuantSetup{format, DType::kF32, BlockGemmPrecision::kAuto, true,
                                           BlockMmaShapeOption::kAuto,
                                           PrefillAttentionPrecision::kAuto, 2048},
                                QuantSetup{format, DType::kF32, BlockGemmPrecision::kF32, false},
                                QuantSetup{format, DType::kF32, BlockGemmPrecision::kF32, false,
                                           BlockMmaShapeOption::kDecode},
                                QuantSetup{format, DType::kF32, BlockGemmPrecision::kBf16, false},
                                QuantSetup{format, DType::kF32, BlockGemmPrecision::kBf16x2,
                                           false},
                                QuantSetup{format, DType::kF32, BlockGemmPrecision::kF16x2,
                                           false},
                                QuantSetup{format, DType::kF32, BlockGemmPrecision::kInt8,
                                           false},
                                QuantSetup{format, DType::kF32, BlockGemmPrecision::kAuto,
                                           false},
                                QuantSetup{format, DType::kBF16, BlockGemmPrecision::kF32,
                                           false}}) {
      benchmark::RegisterBenchmark(
          absl::StrCat("QuantPrefill/", format, "/", SetupName(q)).c_str(), QuantPrefill, q)
          ->ArgName("len")
          ->Arg(512)
          ->Arg(1100)  // a rest the 2,048-row step would pad by 949 rows (prefill_max_pad_rows)
          ->Arg(2048)
          ->UseManualTime()
          ->Iterations(5)
          ->Unit(benchmark::kMillisecond);
    }
  }
  const MatmulPathSetup paths[] = {
      {"kernel_bf16", DType::kBF16, 0, BlockGemmPrecision::kF32},
      {"gemm_bf16", DType::kBF16, 1, BlockGemmPrecision::kF32},
      {"kernel_f32", DType::kF32, 0, BlockGemmPrecision::kF32},
      {"mma_f32", DType::kF32, 0, BlockGemmPrecision::kF32, 1},
      {"mma_f32_decode", DType::kF32, 0, BlockGemmPrecision::kF32, 1, BlockMmaShapeOption::kDecode},
      {"mma_f32_prefill", DType::kF32, 0, BlockGemmPrecision::kF32, 1,
       BlockMmaShapeOption::kPrefill},
      {"mma_f32_staged", DType::kF32, 0, BlockGemmPrecision::kF32, 1, BlockMmaShapeOption::kStaged},
      {"mma_f32_bf16", DType::kF32, 0, BlockGemmPrecision::kBf16, 1},
      {"mma_f32_bf16x2", DType::kF32, 0, BlockGemmPrecision::kBf16x2, 1},
      {"mma_f32_f16x2", DType::kF32, 0, BlockGemmPrecision::kF16x2, 1},
      {"mma_f32_int8", DType::kF32, 0, BlockGemmPrecision::kInt8, 1},
      {"gemm_f32_f32", DType::kF32, 1, BlockGemmPrecision::kF32},
      {"gemm_f32_tf32", DType::kF32, 1, BlockGemmPrecision::kTf32},
      {"gemm_f32_bf16", DType::kF32, 1, BlockGemmPrecision::kBf16},
      {"gemm_f32_f16", DType::kF32, 1, BlockGemmPrecision::kF16},
  };
  for (DType q : {DType::kQ4_0, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    for (const MatmulPathSetup& p : paths) {
      benchmark::RegisterBenchmark(
          absl::StrCat("BlockMatMul/", DTypeName(q), "/", p.name).c_str(), BlockMatMul, q, p)
          ->ArgName("m")->Arg(4)->Arg(8)->Arg(16)->Arg(64)->Arg(512)
          ->UseManualTime()
          ->Iterations(1)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  benchmark::RegisterBenchmark("BlockMatMul/bf16/cublaslt_or_gemv", BlockMatMul, DType::kBF16,
                               MatmulPathSetup{"bf16", DType::kBF16, 0, BlockGemmPrecision::kF32})
      ->ArgName("m")->Arg(4)->Arg(8)->Arg(16)->Arg(64)->Arg(512)
      ->UseManualTime()
      ->Iterations(1)
      ->Unit(benchmark::kMicrosecond);
}

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
  sg::RegisterQuantCases();
  sg::GpuContext context;
  sg::QuantSession quant;
  sg::quant = &quant;
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
