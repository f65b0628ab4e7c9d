// Quantized models of a given shape for tests and benchmarks (random blocks, as
// LlamaConfig::weight_dtypes makes them): which matrices a config has, and the formats the
// GPU checks and decode_bench's quantized rows use. Header-only, so that benchmarks, which
// do not link the test library, share it.
#ifndef STEPGRAPH_TESTS_TESTING_QUANTIZED_CONFIG_H_
#define STEPGRAPH_TESTS_TESTING_QUANTIZED_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/base/status.h"

namespace sg::testing {

// `c` with every matrix (each rank-2 Weight of its decode graph, the embedding table
// included) stored in the dtype `pick` gives for its name.
template <typename Pick>
absl::StatusOr<LlamaConfig> WithMatrixDTypes(LlamaConfig c, Pick pick) {
  SG_ASSIGN_OR_RETURN(const Graph graph, BuildLlamaDecodeGraph(c, {.max_seq = 16}));
  for (const Tensor& w : graph.tensors()) {
    if (w.kind == TensorKind::kWeight && w.shape.rank() == 2) {
      c.weight_dtypes[w.name] = pick(w.name);
    }
  }
  return c;
}

// The mix of a Q4_K_M file: Q4_K for most matrices, Q6_K for the value and down
// projections and the output head, Q8_0 for the embedding table.
inline DType Q4KMixDType(const std::string& name) {
  if (absl::StrContains(name, "embed_tokens")) return DType::kQ8_0;
  if (absl::StrContains(name, "v_proj") || absl::StrContains(name, "down_proj") ||
      absl::StrContains(name, "lm_head")) {
    return DType::kQ6_K;
  }
  return DType::kQ4_K;
}

// The quantized models of the 1B-shape GPU checks and benchmarks: every matrix in Q8_0,
// every matrix in Q4_0, or the Q4_K_M mix.
enum class MatrixFormat { kQ8_0, kQ4_0, kQ4KMix };

inline const char* MatrixFormatName(MatrixFormat f) {
  return f == MatrixFormat::kQ8_0 ? "q8_0" : f == MatrixFormat::kQ4_0 ? "q4_0" : "q4_k_m";
}

inline DType MatrixDType(MatrixFormat f, const std::string& name) {
  return f == MatrixFormat::kQ8_0   ? DType::kQ8_0
         : f == MatrixFormat::kQ4_0 ? DType::kQ4_0
                                    : Q4KMixDType(name);
}

}  // namespace sg::testing

#endif  // STEPGRAPH_TESTS_TESTING_QUANTIZED_CONFIG_H_
