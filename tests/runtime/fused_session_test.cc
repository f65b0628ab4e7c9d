// Fused == plain through a DecodeSession on the CPU reference: the transformers fixtures
// (tests/fixtures) and random tiny configs decode the same greedy ids with the graph
// passes on and off, and the logits the session reports are the same to the bit (the
// fused ops are defined with the plain ops' roundings).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "stepgraph/runtime/session.h"
#include "stepgraph/graph/passes.h"

namespace sg {
namespace {

struct Decoded {
  std::vector<int32_t> ids;
  std::vector<float> logits;
  int nodes_per_step = 0;
};

Decoded Decode(SessionOptions options, bool fuse, const std::vector<int32_t>& prompt,
               int64_t steps) {
  options.backend = Backend::kCpu;
  options.cpu_threads = 2;
  options.passes.enabled = fuse;
  Decoded out;
  absl::StatusOr<std::unique_ptr<DecodeSession>> session = DecodeSession::Create(options);
  EXPECT_TRUE(session.ok()) << session.status();
  if (!session.ok()) return out;
  DecodeSession& s = **session;
  EXPECT_TRUE(s.Prefill(0, prompt).ok());
  absl::StatusOr<std::vector<int32_t>> ids = s.Generate(0, steps);
  EXPECT_TRUE(ids.ok()) << ids.status();
  if (ids.ok()) out.ids = *ids;
  absl::StatusOr<std::vector<float>> logits = s.Logits(0);
  EXPECT_TRUE(logits.ok()) << logits.status();
  if (logits.ok()) out.logits = *logits;
  return out;
}

void ExpectFusedEqualsPlain(const SessionOptions& options, const std::vector<int32_t>& prompt) {
  const Decoded plain = Decode(options, false, prompt, 12);
  const Decoded fused = Decode(options, true, prompt, 12);
  ASSERT_EQ(plain.ids.size(), 12u);
  EXPECT_EQ(fused.ids, plain.ids);
  ASSERT_EQ(fused.logits.size(), plain.logits.size());
  ASSERT_FALSE(plain.logits.empty());
  for (size_t i = 0; i < plain.logits.size(); ++i) {
    ASSERT_EQ(fused.logits[i], plain.logits[i]) << "logit " << i;
  }
}

class FusedFixtureTest : public ::testing::TestWithParam<const char*> {};

TEST_P(FusedFixtureTest, SameIdsAndLogits) {
  SessionOptions options;
  options.model_path = std::string(SG_FIXTURES_DIR) + "/" + GetParam();
  options.max_slots = 1;
  options.max_seq = 40;
  ExpectFusedEqualsPlain(options, {1, 17, 5, 42, 7, 3});
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FusedFixtureTest,
                         ::testing::Values("f32_gqa", "bf16_gqa", "f32_llama3_rope",
                                           "f32_mha_tied", "f32_sharded", "family_qwen2",
                                           "family_qwen3", "family_mistral", "family_phi3",
                                           "family_gemma", "family_gemma2", "family_gemma3",
                                           "family_mixtral",
                                           "family_qwen3_moe", "family_qwen3_moe_mixed"));

TEST(FusedSessionTest, RandomTinyConfigs) {
  const DType types[] = {DType::kF32, DType::kBF16, DType::kF16};
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(DTypeName(types[i]));
    SessionOptions options;
    options.config = TinyLlamaConfig();
    options.config.dtype = types[i];
    options.config.num_hidden_layers = 2;
    options.config.num_key_value_heads = 1 + i;
    options.config.num_attention_heads = 2 * (1 + i);
    options.config.tie_word_embeddings = i == 1;
    options.weight_seed = 11 + i;
    options.max_slots = 2;
    options.max_seq = 32;
    ExpectFusedEqualsPlain(options, {3, 99, 250, 7});
  }
}

}  // namespace
}  // namespace sg
