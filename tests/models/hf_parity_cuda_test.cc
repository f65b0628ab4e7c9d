// End-to-end parity with transformers on the GPU: every fixture folder (tests/fixtures,
// made by make_fixtures.py) is decoded by a CUDA DecodeSession, its steps captured and
// replayed (and, as a second case, run eagerly). f32 fixtures must reproduce all of the
// reference's greedy tokens and its logits within 1e-4 (normalised error); bf16 ones the
// first 16 tokens. Skipped without a GPU; the same checks run on the CPU session in
// session_test.
#include <ostream>
#include <string>

#include "gtest/gtest.h"
#include "stepgraph/runtime/session.h"
#include "tests/models/session_parity.h"

#ifndef SG_FIXTURES_DIR
#error "SG_FIXTURES_DIR must name tests/fixtures"
#endif

namespace sg {
namespace {

struct Case {
  const char* fixture;
  bool eager;
};

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
                              Backend::kCuda, GetParam().eager);
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (const char* f : {"f32_gqa", "f32_mha_tied", "f32_llama3_rope", "bf16_gqa", "f32_sharded"}) {
    cases.push_back({f, false});
    cases.push_back({f, true});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfParityCudaTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.fixture) +
                                  (info.param.eager ? "_eager" : "_replayed");
                         });

}  // namespace
}  // namespace sg
