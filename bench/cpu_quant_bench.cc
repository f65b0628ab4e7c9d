// The CPU reference's quantized dot products (DotQuantizedRows) on one thread, for every
// block format and every vector path the processor has (base/quant_isa.h): a [576, 1536]
// weight (SmolLM2-135M's down projection; 1536 is a multiple of the K formats' 256) against
// 1 vector (decode) and 16 vectors (a prompt chunk's rows in groups). Reported: time per
// call, GMACps (multiply-adds per second) and weight_GBps (the weight's bytes per second).
//
//   cpu_quant_bench --benchmark_filter='Q4_1' --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "base/quant_isa.h"
#include "stepgraph/base/quant.h"
#include "stepgraph/graph/types.h"

namespace sg {
namespace {

constexpr int64_t kRows = 576, kCols = 1536;

void BM_Dot(benchmark::State& state, DType t, QuantIsa isa, int64_t m) {
  if (!QuantIsaSupported(isa)) {
    state.SkipWithError("this processor lacks the path");
    return;
  }
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(kRows * kCols), x(m * kCols), out(m * kRows);
  for (float& v : values) v = normal(rng);
  for (float& v : x) v = normal(rng);
  const int64_t row_bytes = DTypeRowBytes(t, kCols);
  std::vector<uint8_t> w(kRows * row_bytes);
  for (int64_t r = 0; r < kRows; ++r) {
    QuantizeRow(t, values.data() + r * kCols, w.data() + r * row_bytes, kCols);
  }
  for (auto _ : state) {
    DotQuantizedRowsWith(isa, t, w.data(), kRows, kCols, x.data(), kCols, m, out.data(), kRows);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  const double calls = static_cast<double>(state.iterations());
  state.counters["GMACps"] = benchmark::Counter(calls * kRows * kCols * m * 1e-9,
                                                benchmark::Counter::kIsRate);
  state.counters["weight_GBps"] = benchmark::Counter(
      calls * static_cast<double>(w.size()) * 1e-9, benchmark::Counter::kIsRate);
}

const int kRegistered = [] {
  const std::pair<DType, const char*> formats[] = {
      {DType::kQ8_0, "Q8_0"}, {DType::kQ4_0, "Q4_0"}, {DType::kQ4_1, "Q4_1"},
      {DType::kQ5_0, "Q5_0"}, {DType::kQ5_1, "Q5_1"}, {DType::kQ4_K, "Q4_K"},
      {DType::kQ5_K, "Q5_K"}, {DType::kQ6_K, "Q6_K"}};
  const std::pair<QuantIsa, const char*> paths[] = {
      {QuantIsa::kBaseline, "scalar"}, {QuantIsa::kAvx2, "avx2"}, {QuantIsa::kAvx512, "avx512"}};
  for (const auto& [t, fname] : formats) {
    for (const auto& [isa, pname] : paths) {
      for (const int64_t m : {int64_t{1}, int64_t{16}}) {
        benchmark::RegisterBenchmark(
            (std::string("Dot/") + fname + "/" + pname + "/m" + std::to_string(m)).c_str(),
            [t, isa, m](benchmark::State& s) { BM_Dot(s, t, isa, m); })
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  return 0;
}();

}  // namespace
}  // namespace sg

BENCHMARK_MAIN();
