// The op-conformance harness: a case builds a small graph; the harness (conformance.cc,
// CUDA builds) runs it on the CPU reference and on CudaDispatch from the same random
// inputs (never zeros; Weights uploaded in the layout the dispatcher reads,
// KernelDispatch::RepackWeight), with the arena poisoned on both sides, and compares every
// graph output and every State or Input a node writes (WrittenInputs) by normalised error
// (i32 exactly), plus the raised error flags.
#ifndef STEPGRAPH_TESTS_TESTING_CONFORMANCE_H_
#define STEPGRAPH_TESTS_TESTING_CONFORMANCE_H_

#include <cctype>
#include <cstdint>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "stepgraph/graph/builder.h"
#include "stepgraph/dispatch/cuda_options.h"
#include "tests/testing/util.h"

namespace sg::testing {

struct OpCase {
  std::string name;
  // Declares tensors, adds the node(s) and marks what to compare with Output().
  std::function<void(GraphBuilder&)> build;
  // Or makes the whole graph (e.g. a Llama step); used when set.
  std::function<absl::StatusOr<Graph>()> graph;
  // Bound on ‖gpu − cpu‖ / ‖cpu‖ for float tensors.
  double tolerance = 1e-5;
  // i32 inputs get values in [int_lo, int_hi) unless listed in int_values.
  int32_t int_lo = 0;
  int32_t int_hi = 16;
  std::vector<std::pair<std::string, std::vector<int32_t>>> int_values;
  // Float inputs, weights and states are uniform in [-float_range, float_range), but for
  // the leading elements of those named in float_values (parameters that must be valid).
  float float_range = 1.0f;
  std::vector<std::pair<std::string, std::vector<float>>> float_values;
  // i32 outputs must match exactly unless this is false (e.g. argmax of bf16 logits,
  // where a near tie may legitimately flip).
  bool exact_ids = true;
  uint64_t seed = 1;
  // Adjusts the CUDA dispatcher's options after the environment's (e.g. to force a path).
  std::function<void(CudaOptions&)> cuda_options;
};

// gtest prints a parameter with this; without it test listings show the struct's bytes.
inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

// A case's name as gtest takes it for a parameterised test (letters, digits and '_'):
// INSTANTIATE_TEST_SUITE_P(Prefix, Suite, ::testing::ValuesIn(cases), OpCaseTestName{}).
struct OpCaseTestName {
  template <typename ParamInfo>
  std::string operator()(const ParamInfo& info) const {
    std::string n = info.param.name;
    for (char& ch : n) {
      if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    }
    return n;
  }
};

// The CUDA dispatcher's options that the tests' environment asks for (STEPGRAPH_MATMUL
// picks the matmul path, so that ctest can run the conformance cases on each path;
// STEPGRAPH_PDL=0 switches programmatic launch off; STEPGRAPH_COMPILED_NORM=1 runs RmsNorm
// through the kernel compiled for the plan). Test code maps the environment as the
// program does; the library reads none.
CudaOptions CudaOptionsFromTestEnvironment();

// True when a CUDA device is present (GPU tests GTEST_SKIP otherwise).
bool HasCudaDevice();

// Runs the case and records gtest failures naming the case and tensor.
void RunConformance(const OpCase& c);

// The case's graph: `graph()` when set, else what `build` adds to a fresh builder.
absl::StatusOr<Graph> BuildCase(const OpCase& c);

// Random values for every bound tensor of the case's graph `g`, by tensor index: i32
// tensors from [int_lo, int_hi) or as int_values lists them, float ones uniform in
// [-float_range, float_range).
std::map<int32_t, HostTensor> CaseInputs(const OpCase& c, const Graph& g);

// The shared table: every op of SG_OP_LIST at decode shapes in each float dtype, and whole
// Llama steps (tests/testing/conformance_cases.cc). Every op must have a case of its own
// (op_coverage_test checks it, in builds without CUDA too).
std::vector<OpCase> ConformanceCases();

}  // namespace sg::testing

#endif  // STEPGRAPH_TESTS_TESTING_CONFORMANCE_H_
