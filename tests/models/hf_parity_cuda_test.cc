// End-to-end parity with transformers on the GPU: every fixture folder (tests/fixtures,
// made by make_fixtures.py) is decoded by a CUDA DecodeSession, its steps captured and
// replayed (and, as a second case, run eagerly). f32 fixtures must reproduce all of the
// reference's greedy tokens and its logits within 1e-4 (normalised error); bf16 ones the
// first 16 tokens. Skipped without a GPU; the same checks run on the CPU session in
// session_test.
//
// The GGUF fixtures (tests/fixtures/gguf_*, written as llama.cpp's converter writes files:
// F32, F16 and BF16 matrices with F32 norms and biases, every block format and a
// Q4_K_M-like mix) the same way, against a CPU reference session of the same file (whose
// fused step takes the block formats too) and transformers' ids: the greedy ids must be
// the CPU reference's (all of them for files computed in f32, the fixture's
// checked_tokens for F16 and BF16 files), and the logits after the prompt within a
// tolerance fitting the dtype.
//
// The quantized GGUF fixtures again with every block-format MatMul on the block GEMM
// (CudaOptions::block_gemm_*: weights dequantized in chunks and multiplied by cuBLASLt),
// in f32 exactly as above and, with looser logits, in TF32 and bf16.
#include <cctype>
#include <cstdio>
#include <fstream>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "stepgraph/runtime/session.h"
#include "stepgraph/runtime/step_runner.h"
#include "tests/models/parity_expected.h"
#include "tests/models/session_parity.h"
#include "tests/testing/util.h"

#ifndef SG_FIXTURES_DIR
#error "SG_FIXTURES_DIR must name tests/fixtures"
#endif

namespace sg {
namespace {

struct Case {
  const char* fixture;
  bool eager;
  // The logits' bound for an f32 model (bf16's is kParityBf16Tolerance).
  double f32_tolerance = testing::kParityF32Tolerance;
};

// A file whose block-format experts the GPU's default multiplies in f16 (one scaled f16
// part from kBlockGemmAutoF16Rows pairs, a prompt step's; H200: 1.9e-4, all 40 ids equal):
// f16's 11-bit operands, not f32's.
constexpr double kF16BlocksTolerance = 1e-3;

// Names the case in test listings instead of a dump of its bytes.
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.fixture << (c.eager ? " eager" : " replayed");
}

class HfParityCudaTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!CudaDeviceFound()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(HfParityCudaTest, GreedyDecodeMatchesReference) {
  testing::CheckSessionParity(std::string(SG_FIXTURES_DIR) + "/" + GetParam().fixture,
                              Backend::kCuda, GetParam().eager, GetParam().f32_tolerance);
}

// Each fixture replayed and eager; then those of `f16_blocks` at kF16BlocksTolerance.
std::vector<Case> Cases(std::initializer_list<const char*> fixtures,
                        std::initializer_list<const char*> f16_blocks = {}) {
  std::vector<Case> cases;
  for (const char* f : fixtures) {
    cases.push_back({f, false});
    cases.push_back({f, true});
  }
  for (const char* f : f16_blocks) {
    cases.push_back({f, false, kF16BlocksTolerance});
    cases.push_back({f, true, kF16BlocksTolerance});
  }
  return cases;
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  std::string name = info.param.fixture;
  for (char& ch : name) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return name + (info.param.eager ? "_eager" : "_replayed");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfParityCudaTest,
                         ::testing::ValuesIn(Cases({"f32_gqa", "f32_mha_tied",
                                                    "f32_llama3_rope", "bf16_gqa",
                                                    "f32_sharded", "family_qwen2",
                                                    "family_qwen3", "family_mistral",
                                                    "family_phi3", "family_gemma",
                                                    "family_gemma2",
                                                    "family_qwen2_linear_rope",
                                                    "family_qwen2/model.gguf",
                                                    "family_qwen3/model.gguf",
                                                    "family_phi3/model.gguf",
                                                    "family_gemma/model.gguf",
                                                    "family_gemma3",
                                                    "family_gemma3/model.gguf",
                                                    "family_mixtral", "family_qwen3_moe",
                                                    "family_qwen3_moe_mixed",
                                                    "family_qwen3_moe/model.gguf"},
                                                   {"family_mixtral_q8_0/model.gguf"})),
                         CaseName);

// ---- GGUF fixtures ----

struct Decoded {
  std::vector<int32_t> ids;
  std::vector<float> prompt_logits;
};

// Greedy ids of the fixture's prompt on `backend`, and the logits after the prompt.
void Decode(const std::string& path, const testing::ParityExpected& want, Backend backend,
            bool eager, Decoded* out, const CudaOptions& cuda = {}) {
  SessionOptions options;
  options.model_path = path;
  options.backend = backend;
  options.eager = eager;
  options.cuda = cuda;
  options.max_slots = 1;
  options.max_seq = static_cast<int64_t>(want.prompt.size() + want.generated.size());
  // Each backend fuses what it runs (PassOptions::backend is the session's dispatcher).
  absl::StatusOr<std::unique_ptr<DecodeSession>> session = DecodeSession::Create(options);
  ASSERT_TRUE(session.ok()) << session.status();
  DecodeSession& s = **session;
  ASSERT_TRUE(s.Prefill(0, want.prompt).ok());
  absl::StatusOr<std::vector<int32_t>> first = s.Generate(0, 1);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::vector<float>> logits = s.Logits(0);
  ASSERT_TRUE(logits.ok()) << logits.status();
  absl::StatusOr<std::vector<int32_t>> rest =
      s.Generate(0, static_cast<int64_t>(want.generated.size()) - 1);
  ASSERT_TRUE(rest.ok()) << rest.status();
  out->ids = *first;
  out->ids.insert(out->ids.end(), rest->begin(), rest->end());
  out->prompt_logits = *logits;
}

// The greedy ids a fixture's margins make safe to compare (all but F16 and BF16 files').
size_t CheckedTokens(const std::string& dir, const testing::ParityExpected& want) {
  std::ifstream in(dir + "/expected.json");
  const nlohmann::json json = nlohmann::json::parse(in, nullptr, false);
  return json.value("checked_tokens", want.generated.size());
}

// Skipped without a GPU, as HfParityCudaTest.
class GgufParityCudaTest : public HfParityCudaTest {};

TEST_P(GgufParityCudaTest, GreedyIdsAreTheCpuReferences) {
  const std::string dir = absl::StrCat(SG_FIXTURES_DIR, "/gguf_", GetParam().fixture);
  const testing::ParityExpected want = testing::ReadParityExpected(dir + "/expected.json");
  ASSERT_GE(want.generated.size(), 32u);
  const size_t checked = CheckedTokens(dir, want);
  // A few ulps of the logits, relative to their norm: f32 differs from the reference by
  // summation order only.
  const double tolerance = want.dtype == "bfloat16" ? testing::kParityBf16Tolerance
                           : want.dtype == "float16" ? 5e-3
                                                     : 1e-4;
  Decoded cpu, gpu;
  Decode(dir + "/model.gguf", want, Backend::kCpu, true, &cpu);
  Decode(dir + "/model.gguf", want, Backend::kCuda, GetParam().eager, &gpu);
  ASSERT_EQ(gpu.ids.size(), cpu.ids.size());
  size_t matched = 0;
  while (matched < gpu.ids.size() && gpu.ids[matched] == cpu.ids[matched]) ++matched;
  const double err = testing::NormalizedError(gpu.prompt_logits, cpu.prompt_logits);
  std::printf("[ gguf_%s ] %s: %zu of %zu greedy ids equal the CPU reference's (%zu "
              "required); logits after the prompt: normalised error %.3g\n",
              GetParam().fixture, want.dtype.c_str(), matched, cpu.ids.size(), checked, err);
  EXPECT_LE(err, tolerance);
  for (size_t k = 0; k < checked; ++k) {
    ASSERT_EQ(gpu.ids[k], cpu.ids[k]) << "token " << k;
    ASSERT_EQ(cpu.ids[k], want.generated[k]) << "token " << k << ": the CPU reference left "
                                             << "transformers' ids";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufParityCudaTest,
                         ::testing::ValuesIn(Cases({"f32", "f16", "bf16", "q8_0", "q8_0_bias",
                                                    "q4_0", "q4_1", "q5_0", "q5_1", "q4_k_m"})),
                         CaseName);

// ---- GGUF fixtures on the block GEMM ----

// Every MatMul of a block-format weight on the block GEMM (prefill and decode; 128-row
// chunks, so the wider matrices run in several), f32 operands: the CPU reference's greedy
// ids (the fixture's checked ones, as above) and its logits within the f32 files'
// tolerance. TF32 and bf16 operands
// change the logits by their rounding (checked against the bf16 files' tolerance); near
// ties among the random fixture's logits may then flip, so their ids are only reported.
struct BlockGemmCase {
  const char* fixture;
  BlockGemmPrecision precision;
};

void PrintTo(const BlockGemmCase& c, std::ostream* os) {
  *os << c.fixture << " " << BlockGemmPrecisionName(c.precision);
}

std::string BlockGemmCaseName(const ::testing::TestParamInfo<BlockGemmCase>& info) {
  return absl::StrCat(info.param.fixture, "_", BlockGemmPrecisionName(info.param.precision));
}

class GgufBlockGemmCudaTest : public ::testing::TestWithParam<BlockGemmCase> {
 protected:
  void SetUp() override {
    if (!CudaDeviceFound()) GTEST_SKIP() << "no CUDA device";
  }
};

// The fixture decoded on the CPU reference and on the GPU under `cuda`: prints how many
// greedy ids agree and the logits' normalised error after the prompt under `label`, holds
// the error to `tolerance` and, with `ids_equal`, the fixture's checked ids to the CPU's.
void ExpectNearTheCpuReference(const char* fixture, const CudaOptions& cuda,
                               const std::string& label, double tolerance, bool ids_equal) {
  const std::string dir = absl::StrCat(SG_FIXTURES_DIR, "/gguf_", fixture);
  const testing::ParityExpected want = testing::ReadParityExpected(dir + "/expected.json");
  Decoded cpu, gpu;
  Decode(dir + "/model.gguf", want, Backend::kCpu, true, &cpu);
  Decode(dir + "/model.gguf", want, Backend::kCuda, false, &gpu, cuda);
  ASSERT_EQ(gpu.ids.size(), cpu.ids.size());
  size_t matched = 0;
  while (matched < gpu.ids.size() && gpu.ids[matched] == cpu.ids[matched]) ++matched;
  const double err = testing::NormalizedError(gpu.prompt_logits, cpu.prompt_logits);
  std::printf("[ gguf_%s %s ] %zu of %zu greedy ids equal the CPU reference's; "
              "logits after the prompt: normalised error %.3g\n",
              fixture, label.c_str(), matched, cpu.ids.size(), err);
  EXPECT_LE(err, tolerance);
  if (!ids_equal) return;
  const size_t checked = CheckedTokens(dir, want);
  ASSERT_LE(checked, cpu.ids.size());
  for (size_t k = 0; k < checked; ++k) ASSERT_EQ(gpu.ids[k], cpu.ids[k]) << "token " << k;
}

TEST_P(GgufBlockGemmCudaTest, PrefillGivesTheCpuReferencesIds) {
  CudaOptions cuda;
  cuda.block_gemm_min_rows = 1;
  cuda.block_gemm_workspace_bytes = 1;
  cuda.block_gemm_precision = GetParam().precision;
  const BlockGemmPrecision p = GetParam().precision;
  // bf16 operands: every activation entering a block matmul is rounded to 8 bits of
  // mantissa, layer after layer (seen on an H100: 0.030 on q4_k_m with all 40 greedy ids
  // equal), so twice the bound of a model computed in bf16 throughout; TF32 (10 bits) and
  // f16 (11) within that bound.
  const bool near_bf16 = p == BlockGemmPrecision::kTf32 || p == BlockGemmPrecision::kF16;
  const double tolerance = p == BlockGemmPrecision::kF32 ? 1e-4
                           : near_bf16                    ? testing::kParityBf16Tolerance
                                                          : 2 * testing::kParityBf16Tolerance;
  ExpectNearTheCpuReference(GetParam().fixture, cuda,
                            absl::StrCat("block GEMM ", BlockGemmPrecisionName(p)), tolerance,
                            p == BlockGemmPrecision::kF32);
}

std::vector<BlockGemmCase> BlockGemmCases() {
  std::vector<BlockGemmCase> cases;
  for (const char* f : {"q8_0", "q8_0_bias", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k_m"}) {
    cases.push_back({f, BlockGemmPrecision::kF32});
  }
  cases.push_back({"q4_0", BlockGemmPrecision::kTf32});
  cases.push_back({"q4_0", BlockGemmPrecision::kBf16});
  cases.push_back({"q4_k_m", BlockGemmPrecision::kBf16});
  cases.push_back({"q4_0", BlockGemmPrecision::kF16});
  cases.push_back({"q4_k_m", BlockGemmPrecision::kF16});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufBlockGemmCudaTest, ::testing::ValuesIn(BlockGemmCases()),
                         BlockGemmCaseName);

// ---- GGUF fixtures' prompts on the tensor-core block kernel, x in two parts ----
// The prompt (6 rows: from block_mma_min_rows on, every block-format matmul of it on the
// tensor-core kernel) under block_gemm_precision f16x2, x as two f16 parts of each row's
// 32 values scaled by a power of two: f32's precision, so held to the exact path's bounds
// (logits within 1e-4, the fixture's checked greedy ids equal), the test that decides
// whether it can be prefill's default. bf16x2 (16 significant bits of x) is held to 1e-3
// and its ids only reported (near ties among the random fixture's logits may flip); int8
// (x quantized per 32 values, as llama.cpp's int8 activations) to twice the bound of a
// model run in bf16 throughout, as the one-row kernel's int8, ids reported.
// Skipped without a GPU, as GgufBlockGemmCudaTest.
class GgufBlockMmaCudaTest : public GgufBlockGemmCudaTest {};

TEST_P(GgufBlockMmaCudaTest, PromptInTwoPartsStaysNearTheCpuReference) {
  CudaOptions cuda;
  cuda.block_gemm_precision = GetParam().precision;
  const bool f16x2 = GetParam().precision == BlockGemmPrecision::kF16x2;
  const bool int8 = GetParam().precision == BlockGemmPrecision::kInt8;
  ExpectNearTheCpuReference(
      GetParam().fixture, cuda,
      absl::StrCat("block MMA ", BlockGemmPrecisionName(GetParam().precision)),
      f16x2 ? 1e-4 : int8 ? 2 * testing::kParityBf16Tolerance : 1e-3, f16x2);
}

std::vector<BlockGemmCase> BlockMmaCases() {
  std::vector<BlockGemmCase> cases;
  for (const char* f : {"q8_0", "q8_0_bias", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k_m"}) {
    cases.push_back({f, BlockGemmPrecision::kF16x2});
  }
  cases.push_back({"q4_0", BlockGemmPrecision::kBf16x2});
  cases.push_back({"q4_k_m", BlockGemmPrecision::kBf16x2});
  for (const char* f : {"q8_0", "q4_0", "q4_1", "q5_1", "q4_k_m"}) {
    cases.push_back({f, BlockGemmPrecision::kInt8});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufBlockMmaCudaTest, ::testing::ValuesIn(BlockMmaCases()),
                         BlockGemmCaseName);

// ---- GGUF fixtures with x as integers in the one-row kernel ----

// Decode under CudaOptions::block_gemv_precision int16, int8 and int16x2 (every one-row block
// matmul but q/k/v on the one-row kernel, x quantized per 32 values): int16 keeps 15 bits
// a value of each unit's largest, so the logits stay within 1e-3 of the CPU reference's and
// the fixture's checked greedy ids equal it (docs/gguf.md's parity study: 24 of 24 real
// answers unchanged); int8 moves the logits by about 2e-2 (as llama.cpp's int8
// activations), within the bound of a model run in bf16 throughout, and its ids are only
// reported. int16x2 (two parts, 2^-30 of a unit's largest; the default, auto, for every
// format but Q8_0) is held to the exact path's bounds, logits within 1e-4 and the greedy
// ids equal, on every fixture, and so is f32 (the exact kernels throughout, which the
// default keeps for Q8_0).
struct BlockGemvCase {
  const char* fixture;
  BlockGemvPrecision precision;
};

void PrintTo(const BlockGemvCase& c, std::ostream* os) {
  *os << c.fixture << " " << BlockGemvPrecisionName(c.precision);
}

class GgufBlockGemvCudaTest : public ::testing::TestWithParam<BlockGemvCase> {
 protected:
  void SetUp() override {
    if (!CudaDeviceFound()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(GgufBlockGemvCudaTest, DecodeStaysNearTheCpuReference) {
  CudaOptions cuda;
  cuda.block_gemv_precision = GetParam().precision;
  const BlockGemvPrecision p = GetParam().precision;
  const double tolerance = p == BlockGemvPrecision::kInt16x2 || p == BlockGemvPrecision::kF32
                               ? 1e-4
                           : p == BlockGemvPrecision::kInt16 ? 1e-3
                                                             : 2 * testing::kParityBf16Tolerance;
  ExpectNearTheCpuReference(GetParam().fixture, cuda,
                            absl::StrCat("gemv ", BlockGemvPrecisionName(p)), tolerance,
                            p != BlockGemvPrecision::kInt8);
}

std::vector<BlockGemvCase> BlockGemvCases() {
  std::vector<BlockGemvCase> cases;
  for (const char* f : {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k_m"}) {
    cases.push_back({f, BlockGemvPrecision::kF32});
    cases.push_back({f, BlockGemvPrecision::kInt16});
    cases.push_back({f, BlockGemvPrecision::kInt16x2});
  }
  cases.push_back({"q4_0", BlockGemvPrecision::kInt8});
  cases.push_back({"q4_k_m", BlockGemvPrecision::kInt8});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufBlockGemvCudaTest, ::testing::ValuesIn(BlockGemvCases()),
                         [](const ::testing::TestParamInfo<BlockGemvCase>& info) {
                           return absl::StrCat(info.param.fixture, "_",
                                               BlockGemvPrecisionName(info.param.precision));
                         });

}  // namespace
}  // namespace sg
