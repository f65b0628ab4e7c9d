// Parity of a DecodeSession with transformers on the HF fixtures (tests/fixtures/<name>/,
// see hf_parity_cpu_test.cc): the session loads the folder as a user would, feeds the
// prompt, and its greedy ids and logits must be the reference's. Shared by the CPU session
// test and the CUDA parity test, so the CUDA checks are exercised without a GPU too.
#ifndef STEPGRAPH_TESTS_MODELS_SESSION_PARITY_H_
#define STEPGRAPH_TESTS_MODELS_SESSION_PARITY_H_

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "stepgraph/runtime/session.h"
#include "tests/models/parity_expected.h"
#include "tests/testing/util.h"

namespace sg::testing {

// Greedy decoding of fixture `dir` (a folder, or a GGUF file beside an expected.json) on
// `backend` (replayed or eager) against expected.json: every generated id for f32 (the
// first 16 for bf16), and the logits at the last prompt position and after the last
// generated id, within kParityBf16Tolerance for bf16 and `f32_tolerance` for f32.
inline void CheckSessionParity(const std::string& dir, Backend backend, bool eager,
                               double f32_tolerance = kParityF32Tolerance) {
  const ParityExpected want = ReadParityExpected(ExpectedJsonOf(dir));
  ASSERT_GE(want.prompt.size(), 5u);
  ASSERT_GE(want.generated.size(), 32u);
  const bool bf16 = want.dtype == "bfloat16";
  const size_t checked = bf16 ? kParityBf16Tokens : want.generated.size();
  const double tolerance = bf16 ? kParityBf16Tolerance : f32_tolerance;
  const int64_t p = static_cast<int64_t>(want.prompt.size());
  const int64_t g = static_cast<int64_t>(want.generated.size());

  SessionOptions options;
  options.model_path = dir;
  options.backend = backend;
  options.eager = eager;
  options.max_slots = 1;
  // The last step feeds the last generated id at position p + g - 1.
  options.max_seq = p + g;
  absl::StatusOr<std::unique_ptr<DecodeSession>> session = DecodeSession::Create(options);
  ASSERT_TRUE(session.ok()) << session.status();
  DecodeSession& s = **session;
  ASSERT_EQ(s.backend(), backend);
  ASSERT_EQ(s.eager(), eager || backend == Backend::kCpu);
  ASSERT_EQ(s.config().dtype, bf16 ? DType::kBF16 : DType::kF32);

  ASSERT_TRUE(s.Prefill(0, want.prompt).ok());
  absl::StatusOr<std::vector<int32_t>> first = s.Generate(0, 1);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::vector<float>> logits = s.Logits(0);
  ASSERT_TRUE(logits.ok()) << logits.status();
  const double prompt_err = NormalizedError(*logits, want.prompt_last_logits);
  std::printf("[ %s ] logits at the last prompt position: normalised error %.3g\n", dir.c_str(),
              prompt_err);
  EXPECT_LE(prompt_err, tolerance) << "logits at the last prompt position";

  absl::StatusOr<std::vector<int32_t>> rest = s.Generate(0, g);
  ASSERT_TRUE(rest.ok()) << rest.status();
  std::vector<int32_t> got = *first;
  got.insert(got.end(), rest->begin(), rest->end());
  ASSERT_EQ(got.size(), static_cast<size_t>(g + 1));
  size_t matched = 0;
  while (matched < want.generated.size() && got[matched] == want.generated[matched]) ++matched;
  std::printf("[ %s ] %zu of %zu greedy tokens equal the reference's (%zu required)\n",
              dir.c_str(), matched, want.generated.size(), checked);
  for (size_t k = 0; k < checked; ++k) {
    ASSERT_EQ(got[k], want.generated[k]) << "token " << k;
  }
  // Only meaningful when every fed id was the reference's.
  if (matched == want.generated.size()) {
    absl::StatusOr<std::vector<float>> final_logits = s.Logits(0);
    ASSERT_TRUE(final_logits.ok()) << final_logits.status();
    const double err = NormalizedError(*final_logits, want.final_logits);
    std::printf("[ %s ] logits after the last generated token: normalised error %.3g\n",
                dir.c_str(), err);
    EXPECT_LE(err, tolerance) << "logits after the last generated token";
  } else {
    EXPECT_TRUE(bf16) << "an f32 fixture diverged; the final logits were not compared";
  }
}

}  // namespace sg::testing

#endif  // STEPGRAPH_TESTS_MODELS_SESSION_PARITY_H_
