// A small Llama with quantized weights (LlamaConfig::weight_dtypes, random blocks from
// RandomWeights) decoded by a CUDA session and by the CPU reference session, both running
// the fused step (FusedMatMul nodes for q/k/v, o, gate/up, down and the lm head): the same
// greedy ids and close logits, for every block format alone and for a mix of formats as
// in a Q4_K_M file. Skipped without a device.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "stepgraph/models/llama.h"
#include "stepgraph/runtime/session.h"
#include "stepgraph/runtime/step_runner.h"
#include "tests/testing/quantized_config.h"
#include "tests/testing/util.h"

namespace sg {
namespace {

// Hidden and intermediate sizes are multiples of 256, so that every format fits every
// matrix.
LlamaConfig SmallConfig() {
  LlamaConfig c;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.rms_norm_eps = 1e-5f;
  c.vocab_size = 512;
  c.max_position_embeddings = 128;
  c.tie_word_embeddings = false;
  return c;
}

// `config` with every matrix in the dtype `pick` gives for its name.
template <typename Pick>
LlamaConfig Quantized(const LlamaConfig& config, Pick pick) {
  absl::StatusOr<LlamaConfig> c = testing::WithMatrixDTypes(config, pick);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : config;
}

struct Decoded {
  std::vector<int32_t> ids;
  std::vector<float> logits;
};

// A session of `config` with `slots` slots of 64 positions, the same weights every time.
absl::StatusOr<std::unique_ptr<DecodeSession>> MakeSession(const LlamaConfig& config,
                                                           Backend backend, int64_t slots) {
  SessionOptions o;
  o.config = config;
  o.weight_seed = 11;
  o.backend = backend;
  // x exact on the GPU: the default's f16 operands (from 16 rows: slot 4's prompt step
  // below) have tests of their own (cuda_quant_test, hf_parity_cuda_test, smollm2_test).
  o.cuda.block_gemm_precision = BlockGemmPrecision::kF32;
  o.max_slots = slots;
  o.max_seq = 64;
  absl::StatusOr<std::unique_ptr<DecodeSession>> s = DecodeSession::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s;
}

Decoded Decode(const LlamaConfig& config, Backend backend, int64_t new_tokens) {
  Decoded out;
  absl::StatusOr<std::unique_ptr<DecodeSession>> s = MakeSession(config, backend, 1);
  if (!s.ok()) return out;
  // The step runs fused on both sides: the passes make FusedMatMul nodes of block-format
  // weights for CUDA too.
  const ExecutionPlan* plan = (*s)->plan(1);
  EXPECT_NE(plan, nullptr);
  if (plan != nullptr) {
    int fused = 0;
    for (const Node& n : plan->graph().nodes()) {
      fused += std::holds_alternative<ops::FusedMatMul>(n.op) ? 1 : 0;
    }
    EXPECT_GE(fused, 4 * config.num_hidden_layers) << "the step was not fused";
  }
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(config.vocab_size - 1));
  std::vector<int32_t> prompt(7);
  for (int32_t& p : prompt) p = id(rng);
  EXPECT_TRUE((*s)->Prefill(0, prompt).ok());
  absl::StatusOr<std::vector<int32_t>> ids = (*s)->Generate(0, new_tokens);
  EXPECT_TRUE(ids.ok()) << ids.status();
  if (ids.ok()) out.ids = *ids;
  absl::StatusOr<std::vector<float>> logits = (*s)->Logits(0);
  EXPECT_TRUE(logits.ok()) << logits.status();
  if (logits.ok()) out.logits = *logits;
  return out;
}

void ExpectCudaEqualsCpu(const LlamaConfig& config, int64_t new_tokens = 12) {
  const Decoded cpu = Decode(config, Backend::kCpu, new_tokens);
  const Decoded gpu = Decode(config, Backend::kCuda, new_tokens);
  ASSERT_EQ(cpu.ids.size(), static_cast<size_t>(new_tokens));
  EXPECT_EQ(gpu.ids, cpu.ids);
  EXPECT_LE(testing::NormalizedError(gpu.logits, cpu.logits), 1e-4);
}

class QuantSessionCudaTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!CudaDeviceFound()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(QuantSessionCudaTest, GreedyIdsEqualTheCpuReference) {
  ExpectCudaEqualsCpu(Quantized(SmallConfig(), [](const std::string&) { return GetParam(); }));
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantSessionCudaTest,
                         ::testing::Values(DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                                           DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// Five sequences decoded together (the bucket of 8 rows: on the GPU the tensor-core path of
// the block-format matmuls, CudaOptions::block_mma_min_rows) against the CPU reference's
// session of the same five: every slot's greedy ids, and slot 3's last logits.
std::vector<std::vector<int32_t>> DecodeBatch(const LlamaConfig& config, Backend backend,
                                              int64_t new_tokens, std::vector<float>* logits) {
  absl::StatusOr<std::unique_ptr<DecodeSession>> s = MakeSession(config, backend, 8);
  if (!s.ok()) return {};
  std::mt19937 rng(9);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(config.vocab_size - 1));
  for (int64_t slot = 0; slot < 5; ++slot) {
    std::vector<int32_t> prompt(static_cast<size_t>(3 + 2 * slot));
    for (int32_t& p : prompt) p = id(rng);
    EXPECT_TRUE((*s)->Prefill(slot, prompt).ok());
  }
  absl::StatusOr<std::vector<std::vector<int32_t>>> ids = (*s)->Generate(new_tokens);
  EXPECT_TRUE(ids.ok()) << ids.status();
  absl::StatusOr<std::vector<float>> last = (*s)->Logits(3);
  EXPECT_TRUE(last.ok()) << last.status();
  if (last.ok()) *logits = *last;
  return ids.ok() ? *ids : std::vector<std::vector<int32_t>>{};
}

TEST_P(QuantSessionCudaTest, BatchGreedyIdsEqualTheCpuReference) {
  LlamaConfig c = SmallConfig();
  c.dtype = DType::kF32;  // as a GGUF file with block-format matrices computes
  c = Quantized(c, [](const std::string&) { return GetParam(); });
  std::vector<float> cpu_logits, gpu_logits;
  const auto cpu = DecodeBatch(c, Backend::kCpu, 10, &cpu_logits);
  const auto gpu = DecodeBatch(c, Backend::kCuda, 10, &gpu_logits);
  ASSERT_GE(cpu.size(), 5u);
  for (size_t slot = 0; slot < 5; ++slot) ASSERT_EQ(cpu[slot].size(), 10u) << slot;
  EXPECT_EQ(gpu, cpu);
  EXPECT_LE(testing::NormalizedError(gpu_logits, cpu_logits), 1e-5);
}

// The mix of a Q4_K_M file (testing::Q4KMixDType). (f32 activations: in bf16 the two
// sides' roundings may legitimately flip a near tie of the greedy pick.)
TEST(QuantSessionCudaMixedTest, MixedFormats) {
  if (!CudaDeviceFound()) GTEST_SKIP() << "no CUDA device";
  ExpectCudaEqualsCpu(Quantized(SmallConfig(), testing::Q4KMixDType));
}

// The logits after a 40-token prompt (its 39 rows in one prefill step of 64, where the
// tiled prefill attention runs: head_dim 64) and one new token, on `backend`, with the
// defaults but `attention`.
std::vector<float> PromptLogits(const LlamaConfig& config, Backend backend,
                                PrefillAttentionPrecision attention) {
  SessionOptions o;
  o.config = config;
  o.weight_seed = 11;
  o.backend = backend;
  o.cuda.prefill_attention = attention;
  o.max_seq = 64;
  absl::StatusOr<std::unique_ptr<DecodeSession>> s = DecodeSession::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return {};
  std::mt19937 rng(9);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(config.vocab_size - 1));
  std::vector<int32_t> prompt(40);
  for (int32_t& p : prompt) p = id(rng);
  EXPECT_TRUE((*s)->Prefill(0, prompt).ok());
  EXPECT_TRUE((*s)->Generate(0, 1).ok());
  absl::StatusOr<std::vector<float>> logits = (*s)->Logits(0);
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? *std::move(logits) : std::vector<float>{};
}

// The session resolves CudaOptions::prefill_attention auto: f16 (the tensor cores) for a
// model whose block-format matrices compute in f32, as their matmuls' x is rounded to f16
// already; f32 for an f32 model of float matrices. Each side equals the explicit choice
// bit for bit and differs from the other one, and both stay near the CPU reference.
TEST(QuantSessionCudaPrefillAttentionTest, AutoFollowsTheModel) {
  if (!CudaDeviceFound()) GTEST_SKIP() << "no CUDA device";
  using P = PrefillAttentionPrecision;
  LlamaConfig base = SmallConfig();
  base.num_attention_heads = 4;
  base.head_dim = 64;
  for (const bool block : {true, false}) {
    SCOPED_TRACE(block ? "Q4_0 matrices" : "f32 matrices");
    const LlamaConfig config =
        block ? Quantized(base, [](const std::string&) { return DType::kQ4_0; }) : base;
    const std::vector<float> cpu = PromptLogits(config, Backend::kCpu, P::kAuto);
    const std::vector<float> automatic = PromptLogits(config, Backend::kCuda, P::kAuto);
    const std::vector<float> f16 = PromptLogits(config, Backend::kCuda, P::kF16);
    const std::vector<float> f32 = PromptLogits(config, Backend::kCuda, P::kF32);
    ASSERT_EQ(automatic.size(), static_cast<size_t>(config.vocab_size));
    EXPECT_EQ(automatic, block ? f16 : f32);
    EXPECT_NE(f16, f32) << "the two attentions gave the same logits: the option did nothing";
    EXPECT_LE(testing::NormalizedError(f16, cpu), 1e-2);
    EXPECT_LE(testing::NormalizedError(f32, cpu), block ? 1e-2 : 1e-4);
  }
}

// The Llama-3.2-1B shape (16 layers, a 128256-id vocabulary, tied embeddings) as
// decode_bench's Quant rows time it: every matrix in Q8_0 or Q4_0, or the Q4_K_M mix;
// 32 greedy ids on the GPU against the CPU reference's (f32 activations, as above). Most
// of its time is the CPU reference's, on every core.
class Quant1BCudaTest : public ::testing::TestWithParam<testing::MatrixFormat> {
 protected:
  void SetUp() override {
    if (!CudaDeviceFound()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(Quant1BCudaTest, ThirtyTwoGreedyIdsEqualTheCpuReference) {
  LlamaConfig c = Llama32_1BConfig();
  c.dtype = DType::kF32;
  const testing::MatrixFormat format = GetParam();
  ExpectCudaEqualsCpu(
      Quantized(c, [format](const std::string& name) { return testing::MatrixDType(format, name); }),
      32);
}

INSTANTIATE_TEST_SUITE_P(Llama1BShape, Quant1BCudaTest,
                         ::testing::Values(testing::MatrixFormat::kQ8_0,
                                           testing::MatrixFormat::kQ4_0,
                                           testing::MatrixFormat::kQ4KMix),
                         [](const ::testing::TestParamInfo<testing::MatrixFormat>& info) {
                           return std::string(testing::MatrixFormatName(info.param));
                         });

}  // namespace
}  // namespace sg
