// Conformance of the CUDA ops on weights in GGUF block formats against the CPU reference
// (tests/testing/conformance.h: the same random inputs on both sides, weights quantized
// from random values with QuantizeRow, arenas poisoned): MatMul for every format ×
// activation dtype × M in {1, 2, 5, 8} (and M = 11, two row groups) at a decode shape and
// at odd ones (K not a multiple of 256 for the 32-element formats, N odd), with and
// without bias; Embedding rows, which must equal the reference bit for bit, bad ids
// included. Skipped without a device.
#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/conformance.h"

namespace sg::testing {
namespace {

constexpr DType kFloatTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
constexpr DType kQuantTypes[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                                 DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

// Both sides multiply the same dequantized values in f32; only the order of the additions
// differs (and, below f32, the output's rounding).
double Tol(DType t) { return t == DType::kF32 ? 1e-5 : 1e-2; }

std::vector<OpCase> MatmulCases() {
  std::vector<OpCase> cases;
  struct Mm {
    int64_t k, n;
    bool bias;
  };
  for (DType q : kQuantTypes) {
    const int64_t block = DTypeBlockElems(q);
    // A Llama-3.2-1B k/v projection; then K of 3 blocks (96 for the 32-element formats:
    // not a multiple of 256) with N odd; then one block with a bias.
    const Mm shapes[] = {{2048, 512, false}, {3 * block, 33, false}, {block, 7, true}};
    for (DType t : kFloatTypes) {
      for (const Mm& s : shapes) {
        for (int64_t m : {1, 2, 5, 8, 11}) {
          if (m == 11 && s.k == 2048) continue;  // row groups: the small shapes suffice
          cases.push_back(
              {.name = absl::StrCat("MatMul/", DTypeName(q), "/", DTypeName(t), "/", m, "x", s.k,
                                    "x", s.n, s.bias ? "+bias" : ""),
               .build = [=](GraphBuilder& b) {
                 auto x = b.Input("x", t, {m, s.k});
                 auto w = b.Weight("w", q, {s.n, s.k});
                 b.Output("out", s.bias ? b.MatMul(x, w, b.Weight("bias", t, {s.n}))
                                        : b.MatMul(x, w));
               },
               .tolerance = Tol(t),
               // The block-format kernel itself, row groups included; the block GEMM that
               // takes over from CudaOptions::block_gemm_min_rows rows has its own cases
               // (cuda_block_gemm_test).
               .cuda_options = [](CudaOptions& o) { o.block_gemm_min_rows = 0; }});
        }
      }
    }
  }
  return cases;
}

std::vector<OpCase> EmbeddingCases() {
  std::vector<OpCase> cases;
  for (DType q : kQuantTypes) {
    const int64_t hidden = 3 * DTypeBlockElems(q);
    for (DType t : kFloatTypes) {
      for (int64_t m : {1, 8}) {
        cases.push_back({.name = absl::StrCat("Embedding/", DTypeName(q), "/", DTypeName(t),
                                              "/V300xH", hidden, "/M", m),
                         .build = [=](GraphBuilder& b) {
                           b.Output("out", b.Embedding(b.Weight("table", q, {300, hidden}),
                                                       b.Input("ids", DType::kI32, {m}), t));
                         },
                         .tolerance = 0.0,
                         .int_hi = 300});
      }
      cases.push_back({.name = absl::StrCat("Embedding/", DTypeName(q), "/", DTypeName(t),
                                            "/bad_ids"),
                       .build = [=](GraphBuilder& b) {
                         b.Output("out", b.Embedding(b.Weight("table", q, {64, hidden}),
                                                     b.Input("ids", DType::kI32, {4}), t));
                       },
                       .tolerance = 0.0,
                       .int_values = {{"ids", {-1, 5, 64, 63}}}});
    }
  }
  return cases;
}

std::string CaseName(const ::testing::TestParamInfo<OpCase>& info) {
  std::string n = info.param.name;
  for (char& ch : n) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return n;
}

class QuantConformanceTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(QuantConformanceTest, CpuAndCudaAgree) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  RunConformance(GetParam());
}

INSTANTIATE_TEST_SUITE_P(QuantMatMul, QuantConformanceTest, ::testing::ValuesIn(MatmulCases()),
                         CaseName);
INSTANTIATE_TEST_SUITE_P(QuantEmbedding, QuantConformanceTest,
                         ::testing::ValuesIn(EmbeddingCases()), CaseName);

// The cases exist whether or not a device does: a build that lost them would pass
// silently on a GPU machine.
TEST(QuantConformanceCasesTest, EveryFormatAndDTypeIsCovered) {
  EXPECT_EQ(MatmulCases().size(), 8u * 3u * (5u + 5u + 4u));
  EXPECT_EQ(EmbeddingCases().size(), 8u * 3u * 3u);
}

}  // namespace
}  // namespace sg::testing
