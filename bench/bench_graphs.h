// Graphs the host-side benchmarks share: a generated DAG of elementwise ops and matmuls of
// any size, and the options of the Llama-3.2-1B decode step they time.
#ifndef STEPGRAPH_BENCH_BENCH_GRAPHS_H_
#define STEPGRAPH_BENCH_BENCH_GRAPHS_H_

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/graph/builder.h"

namespace sg::bench {

inline LlamaGraphOptions Llama1BOptions() { return {.batch = 1, .max_seq = 4096}; }

// `num_nodes` nodes shaped like a residual network of width 256 with 1024-wide inner
// layers: a quarter are matmuls that switch width, the rest Add, Mul, SiluMul or Silu over
// recent tensors of the same width, with the occasional skip connection far back, so that
// lifetimes range from one node to most of the graph. Deterministic for a given seed.
inline absl::StatusOr<Graph> BuildGeneratedGraph(int num_nodes, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  constexpr int64_t kRows = 4;
  constexpr int64_t kWidths[2] = {256, 1024};
  GraphBuilder b;
  std::vector<TensorId> by_width[2];
  by_width[0].push_back(b.Input("x", DType::kBF16, {kRows, kWidths[0]}));
  int current = 0;  // width class of the newest tensor
  TensorId last = by_width[0].back();
  // A recent tensor of width class `w` (one of the last 8), or now and then any earlier one.
  auto earlier = [&](int w) {
    const std::vector<TensorId>& v = by_width[w];
    const int n = static_cast<int>(v.size());
    if (uniform(0, 15) == 0) return v[uniform(0, n - 1)];
    return v[uniform(std::max(0, n - 8), n - 1)];
  };
  for (int i = 0; i < num_nodes; ++i) {
    const std::string name = absl::StrCat("n", i);
    const int choice = uniform(0, 7);
    if (choice < 2 || by_width[1 - current].empty()) {
      const int to = 1 - current;
      const TensorId w = b.Weight(absl::StrCat("w", i), DType::kBF16,
                                  {kWidths[to], kWidths[current]});
      last = b.MatMul(last, w, name);
      current = to;
    } else if (choice == 2) {
      last = b.Silu(last, name);
    } else if (choice == 3) {
      last = b.Mul(last, earlier(current), name);
    } else if (choice == 4) {
      last = b.SiluMul(last, earlier(current), name);
    } else {
      last = b.Add(last, earlier(current), name);
    }
    by_width[current].push_back(last);
  }
  b.Output("out", last);
  return std::move(b).Build();
}

}  // namespace sg::bench

#endif  // STEPGRAPH_BENCH_BENCH_GRAPHS_H_
