// The host-only functions of the C ABI, which behave the same in the CUDA build and in the
// stub: the version, the error strings and the RoPE frequency table. Linked into both
// builds' C ABI suites; needs no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "stepgraph/c_api/c_api.h"
#include "stepgraph/graph/ops.h"
#include "stepgraph/graph/rope.h"
#include "tests/c_api/header_check.h"

namespace sg::testing {
namespace {

TEST(CApiHostTest, VersionSeenFromCMatchesTheHeader) {
  EXPECT_EQ(stepgraph_abi_version(), STEPGRAPH_C_API_VERSION);
  EXPECT_EQ(sg_c_api_compiled_version(), STEPGRAPH_C_API_VERSION);
  EXPECT_EQ(sg_c_api_loaded_version(), STEPGRAPH_C_API_VERSION);
}

TEST(CApiHostTest, EveryCodeHasItsOwnString) {
  std::set<std::string> seen;
  for (int32_t code : {STEPGRAPH_OK, STEPGRAPH_ERROR_NO_CUDA, STEPGRAPH_ERROR_INVALID_VALUE,
                       STEPGRAPH_ERROR_LAUNCH_FAILED, STEPGRAPH_ERROR_OUT_OF_MEMORY}) {
    const char* s = stepgraph_error_string(code);
    ASSERT_NE(s, nullptr) << code;
    EXPECT_NE(std::string(s), "unknown error code") << code;
    EXPECT_TRUE(seen.insert(s).second) << "two codes share \"" << s << "\"";
  }
  EXPECT_NE(std::string(stepgraph_error_string(STEPGRAPH_ERROR_INVALID_VALUE)).find("invalid"),
            std::string::npos);
  for (int32_t code : {1, -5, std::numeric_limits<int32_t>::min()}) {
    ASSERT_NE(stepgraph_error_string(code), nullptr);
    EXPECT_EQ(std::string(stepgraph_error_string(code)), "unknown error code") << code;
  }
}

// The table must be bit-identical to the one the CPU reference and the CUDA dispatcher use,
// with and without Llama-3 scaling.
TEST(CApiHostTest, RopeInvFreqIsTheLibrarysTable) {
  struct Case {
    int32_t head_dim;
    float theta;
    bool llama3;
  };
  for (const Case c :
       {Case{64, 10000.0f, false}, Case{128, 500000.0f, true}, Case{6, 1e4f, false}}) {
    ops::Rope rope;
    rope.head_dim = c.head_dim;
    rope.theta = c.theta;
    if (c.llama3) {
      rope.scaling.type = ops::RopeScaling::Type::kLlama3;
      rope.scaling.factor = 8.0f;
      rope.scaling.low_freq_factor = 1.0f;
      rope.scaling.high_freq_factor = 4.0f;
      rope.scaling.original_max_position = 8192;
    }
    const std::vector<float> want = RopeInvFreq(rope);
    // One extra slot, poisoned, must stay untouched.
    std::vector<float> got(c.head_dim / 2 + 1, std::numeric_limits<float>::quiet_NaN());
    ASSERT_EQ(stepgraph_rope_inv_freq(
                  c.head_dim, c.theta,
                  c.llama3 ? STEPGRAPH_ROPE_SCALING_LLAMA3 : STEPGRAPH_ROPE_SCALING_NONE,
                  rope.scaling.factor, rope.scaling.low_freq_factor,
                  rope.scaling.high_freq_factor, rope.scaling.original_max_position, got.data()),
              STEPGRAPH_OK);
    for (int j = 0; j < c.head_dim / 2; ++j) EXPECT_EQ(got[j], want[j]) << "j=" << j;
    EXPECT_TRUE(std::isnan(got.back())) << "wrote past head_dim / 2";
  }
  // Llama-3 scaling changes the low frequencies: the flag is not ignored.
  std::vector<float> plain(64), scaled(64);
  ASSERT_EQ(stepgraph_rope_inv_freq(128, 500000.0f, STEPGRAPH_ROPE_SCALING_NONE, 0, 0, 0, 0,
                                    plain.data()),
            STEPGRAPH_OK);
  ASSERT_EQ(stepgraph_rope_inv_freq(128, 500000.0f, STEPGRAPH_ROPE_SCALING_LLAMA3, 8.0f, 1.0f,
                                    4.0f, 8192, scaled.data()),
            STEPGRAPH_OK);
  EXPECT_NE(plain, scaled);
}

TEST(CApiHostTest, RopeInvFreqFromC) {
  float got[4] = {-1.0f, -1.0f, -1.0f, -1.0f};
  ASSERT_EQ(sg_c_api_rope_inv_freq_from_c(got), STEPGRAPH_OK);
  ops::Rope rope;
  rope.head_dim = 8;
  rope.theta = 10000.0f;
  const std::vector<float> want = RopeInvFreq(rope);
  for (int j = 0; j < 4; ++j) EXPECT_EQ(got[j], want[j]) << "j=" << j;
}

TEST(CApiHostTest, RopeInvFreqRefusesBadArguments) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> out(64, 0.5f);
  float* p = out.data();
  constexpr int32_t kNone = STEPGRAPH_ROPE_SCALING_NONE, kLlama3 = STEPGRAPH_ROPE_SCALING_LLAMA3;
  constexpr int32_t kBad = STEPGRAPH_ERROR_INVALID_VALUE;
  // A valid call first, so that each refusal below is down to the one argument changed.
  ASSERT_EQ(stepgraph_rope_inv_freq(64, 1e4f, kLlama3, 8, 1, 4, 8192, p), STEPGRAPH_OK);
  EXPECT_EQ(stepgraph_rope_inv_freq(64, 1e4f, kNone, 0, 0, 0, 0, nullptr), kBad);
  EXPECT_EQ(stepgraph_rope_inv_freq(64, 1e4f, kNone, 0, 0, 0, 0,
                                    reinterpret_cast<float*>(reinterpret_cast<char*>(p) + 1)),
            kBad);
  for (int32_t d : {0, -2, 7, (1 << 16) + 2}) {
    EXPECT_EQ(stepgraph_rope_inv_freq(d, 1e4f, kNone, 0, 0, 0, 0, p), kBad) << "head_dim " << d;
  }
  // Regression: a theta of 1e-45 was taken and made infinite frequencies. Bases below 1
  // are refused.
  for (float theta : {0.0f, -1.0f, nan, inf, 1e-45f, 0.5f}) {
    EXPECT_EQ(stepgraph_rope_inv_freq(64, theta, kNone, 0, 0, 0, 0, p), kBad) << theta;
  }
  EXPECT_EQ(stepgraph_rope_inv_freq(64, 1e4f, 2, 8, 1, 4, 8192, p), kBad);
  EXPECT_EQ(stepgraph_rope_inv_freq(64, 1e4f, -1, 8, 1, 4, 8192, p), kBad);
  EXPECT_EQ(stepgraph_rope_inv_freq(64, 1e4f, kLlama3, 0, 1, 4, 8192, p), kBad);
  EXPECT_EQ(stepgraph_rope_inv_freq(64, 1e4f, kLlama3, nan, 1, 4, 8192, p), kBad);
  EXPECT_EQ(stepgraph_rope_inv_freq(64, 1e4f, kLlama3, 8, 0, 4, 8192, p), kBad);
  EXPECT_EQ(stepgraph_rope_inv_freq(64, 1e4f, kLlama3, 8, 4, 4, 8192, p), kBad);  // high == low
  EXPECT_EQ(stepgraph_rope_inv_freq(64, 1e4f, kLlama3, 8, 1, inf, 8192, p), kBad);
  EXPECT_EQ(stepgraph_rope_inv_freq(64, 1e4f, kLlama3, 8, 1, 4, 0, p), kBad);
  EXPECT_EQ(stepgraph_rope_inv_freq(64, 1e4f, kLlama3, inf, 1, 4, 8192, p), kBad);
  // Valid factors whose table overflows: refused, nothing written.
  std::fill(out.begin(), out.end(), 0.5f);
  EXPECT_EQ(stepgraph_rope_inv_freq(64, 1e4f, kLlama3, 1e-45f, 1, 4, 8192, p), kBad);
  for (float v : out) ASSERT_EQ(v, 0.5f);
  // The smallest base taken gives a finite table.
  ASSERT_EQ(stepgraph_rope_inv_freq(64, 1.0f, kNone, 0, 0, 0, 0, p), STEPGRAPH_OK);
  for (int j = 0; j < 32; ++j) EXPECT_TRUE(std::isfinite(out[j])) << j;
}

}  // namespace
}  // namespace sg::testing
