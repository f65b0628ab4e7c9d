// What a transformers fixture (tests/fixtures/<name>/expected.json, made by
// make_fixtures.py) expects, and how closely: shared by the graph-level CPU parity test and
// the session parity checks.
#ifndef STEPGRAPH_TESTS_MODELS_PARITY_EXPECTED_H_
#define STEPGRAPH_TESTS_MODELS_PARITY_EXPECTED_H_

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace sg::testing {

struct ParityExpected {
  std::string dtype;
  std::vector<int32_t> prompt;
  std::vector<int32_t> generated;
  std::vector<float> prompt_last_logits;
  std::vector<float> final_logits;
};

inline ParityExpected ReadParityExpected(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  EXPECT_TRUE(j.is_object()) << path << " is not a JSON object";
  ParityExpected e;
  if (!j.is_object()) return e;
  e.dtype = j.value("dtype", "");
  e.prompt = j.value("prompt_ids", std::vector<int32_t>{});
  e.generated = j.value("generated_ids", std::vector<int32_t>{});
  e.prompt_last_logits = j.value("prompt_last_logits", std::vector<float>{});
  e.final_logits = j.value("final_logits", std::vector<float>{});
  return e;
}

// The expected.json of a fixture: in the folder, or beside a GGUF file in it.
inline std::string ExpectedJsonOf(const std::string& model_path) {
  const std::string gguf = ".gguf";
  const bool file = model_path.size() > gguf.size() &&
                    model_path.compare(model_path.size() - gguf.size(), gguf.size(), gguf) == 0;
  return (file ? model_path.substr(0, model_path.rfind('/')) : model_path) + "/expected.json";
}

// bf16 rounds every intermediate, and not in the same order as the reference's kernels,
// so only the first tokens are required to agree (the fixtures are chosen with clear
// top-2 margins over these).
inline constexpr size_t kParityBf16Tokens = 16;
inline constexpr double kParityF32Tolerance = 1e-4;
// A few bf16 ulps of the logits, relative to their norm.
inline constexpr double kParityBf16Tolerance = 2e-2;

}  // namespace sg::testing

#endif  // STEPGRAPH_TESTS_MODELS_PARITY_EXPECTED_H_
