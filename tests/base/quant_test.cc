// The GGUF block formats on the host (stepgraph/base/quant.h): dequantization equal bit for bit
// to the `gguf` Python package on random valid blocks of every format, quantizers equal
// byte for byte to it where it has one, the simple K-format quantizers close to their
// input, and the quantized dot product against a float64 sum of the dequantized row.
// Fixtures: tests/fixtures/quant/, made by tests/fixtures/make_quant_fixtures.py.
#include "stepgraph/base/quant.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "base/quant_isa.h"
#include "stepgraph/base/half.h"
#include "stepgraph/graph/types.h"
#include "tests/testing/util.h"

#ifndef SG_FIXTURES_DIR
#error "SG_FIXTURES_DIR must name tests/fixtures"
#endif

namespace sg {

void PrintTo(DType t, std::ostream* os) { *os << DTypeName(t); }

namespace {

constexpr DType kBlockTypes[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                                 DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

std::vector<uint8_t> ReadFile(const std::string& name) {
  const std::string path = std::string(SG_FIXTURES_DIR) + "/quant/" + name;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<float> ReadFloats(const std::string& name) {
  const std::vector<uint8_t> bytes = ReadFile(name);
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

std::string Name(DType t) { return std::string(DTypeName(t)); }

class QuantFormatTest : public ::testing::TestWithParam<DType> {};

TEST_P(QuantFormatTest, DequantizeIsBitExactWithGguf) {
  const DType t = GetParam();
  const std::vector<uint8_t> blocks = ReadFile(Name(t) + ".blocks");
  const std::vector<float> want = ReadFloats(Name(t) + ".f32");
  ASSERT_FALSE(want.empty());
  const int64_t n = static_cast<int64_t>(want.size());
  ASSERT_EQ(static_cast<int64_t>(blocks.size()), DTypeRowBytes(t, n));
  std::vector<float> got(n + 1, std::nanf(""));
  got[n] = 12345.0f;  // a guard past the row: must stay untouched
  ASSERT_TRUE(DequantizeRow(t, blocks.data(), got.data(), n));
  EXPECT_EQ(got[n], 12345.0f);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    if (a != b && ++mismatches <= 5) {
      ADD_FAILURE() << "value " << i << ": got " << got[i] << " (0x" << std::hex << a
                    << "), gguf " << want[i] << " (0x" << b << ")" << std::dec;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// out = row · x for several x, against a float64 sum of the dequantized row.
TEST_P(QuantFormatTest, DotMatchesDequantizedRow) {
  const DType t = GetParam();
  const int64_t n = 4 * 256;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> src(n);
  for (float& v : src) v = normal(rng);
  std::vector<uint8_t> blocks(DTypeRowBytes(t, n));
  ASSERT_TRUE(QuantizeRow(t, src.data(), blocks.data(), n));
  std::vector<float> row(n);
  ASSERT_TRUE(DequantizeRow(t, blocks.data(), row.data(), n));
  const int64_t m = 3, x_stride = n + 5, out_stride = 2;
  std::vector<float> x(m * x_stride);
  for (float& v : x) v = normal(rng);
  std::vector<float> out(m * out_stride, std::nanf(""));
  ASSERT_TRUE(DotQuantizedRow(t, blocks.data(), n, x.data(), x_stride, m, out.data(), out_stride));
  for (int64_t i = 0; i < m; ++i) {
    double want = 0, norm = 0;
    for (int64_t c = 0; c < n; ++c) {
      want += static_cast<double>(row[c]) * x[i * x_stride + c];
      norm += std::fabs(static_cast<double>(row[c]) * x[i * x_stride + c]);
    }
    EXPECT_NEAR(out[i * out_stride], want, 1e-5 * norm) << "vector " << i;
  }
}

// Every vector width the processor has gives the baseline path's bits, for m = 1..6 (the
// groups of four vectors and their remainders).
TEST_P(QuantFormatTest, EveryIsaGivesTheBaselineBits) {
  const DType t = GetParam();
  const int64_t n = 3 * 256;
  std::mt19937 rng(19);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> src(n);
  for (float& v : src) v = normal(rng);
  std::vector<uint8_t> blocks(DTypeRowBytes(t, n));
  ASSERT_TRUE(QuantizeRow(t, src.data(), blocks.data(), n));
  const int64_t m = 6;
  std::vector<float> x(m * n);
  for (float& v : x) v = normal(rng);
  std::vector<float> want(m, std::nanf(""));
  ASSERT_TRUE(DotQuantizedRowWith(QuantIsa::kBaseline, t, blocks.data(), n, x.data(), n, m,
                                  want.data(), 1));
  int paths = 0;
  for (const QuantIsa isa : {QuantIsa::kAvx2, QuantIsa::kAvx512}) {
    std::vector<float> got(m, std::nanf(""));
    if (!QuantIsaSupported(isa)) {
      EXPECT_FALSE(DotQuantizedRowWith(isa, t, blocks.data(), n, x.data(), n, m, got.data(), 1));
      continue;
    }
    ++paths;
    ASSERT_TRUE(DotQuantizedRowWith(isa, t, blocks.data(), n, x.data(), n, m, got.data(), 1));
    for (int64_t i = 0; i < m; ++i) {
      EXPECT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
          << "path " << static_cast<int>(isa) << ", vector " << i;
    }
  }
  // The default entry point takes one of them.
  std::vector<float> chosen(m, std::nanf(""));
  ASSERT_TRUE(DotQuantizedRow(t, blocks.data(), n, x.data(), n, m, chosen.data(), 1));
  for (int64_t i = 0; i < m; ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(chosen[i]), std::bit_cast<uint32_t>(want[i]));
  }
  RecordProperty("wider_paths", paths);
}

// Quantize, then dequantize: close to the input, relative to the format's resolution.
TEST_P(QuantFormatTest, QuantizeRoundTripIsClose) {
  const DType t = GetParam();
  const int64_t n = 8 * 256;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> src(n);
  for (float& v : src) v = normal(rng);
  std::vector<uint8_t> blocks(DTypeRowBytes(t, n));
  ASSERT_TRUE(QuantizeRow(t, src.data(), blocks.data(), n));
  std::vector<float> back(n);
  ASSERT_TRUE(DequantizeRow(t, blocks.data(), back.data(), n));
  const double bits = t == DType::kQ8_0 ? 8 : t == DType::kQ6_K ? 6
                    : (t == DType::kQ5_0 || t == DType::kQ5_1 || t == DType::kQ5_K) ? 5 : 4;
  // A uniform quantizer over ±3σ with 2^bits codes has an rms error of about
  // 6σ / 2^bits / √12 ≈ 1.7σ / 2^bits; allow twice that.
  const double bound = 2 * 1.7 / std::pow(2.0, bits);
  EXPECT_LE(testing::NormalizedError(back, src), bound) << DTypeName(t);
  EXPECT_GT(testing::NormalizedError(back, src), 0.0) << "lossless quantization is suspicious";
}

TEST_P(QuantFormatTest, RefusesBadArguments) {
  const DType t = GetParam();
  const int64_t block = DTypeBlockElems(t);
  std::vector<float> f(2 * block, 1.0f);
  std::vector<uint8_t> b(2 * DTypeBlockBytes(t), 0xAB);
  const std::vector<uint8_t> before = b;
  EXPECT_FALSE(QuantizeRow(t, f.data(), b.data(), block + 1));
  EXPECT_FALSE(QuantizeRow(t, f.data(), b.data(), -block));
  EXPECT_EQ(b, before);
  EXPECT_FALSE(DequantizeRow(t, b.data(), f.data(), block - 1));
  float out = 0;
  EXPECT_FALSE(DotQuantizedRow(t, b.data(), block / 2, f.data(), 0, 1, &out, 1));
  EXPECT_TRUE(DequantizeRow(t, b.data(), f.data(), 0));  // an empty row is fine
}

INSTANTIATE_TEST_SUITE_P(AllFormats, QuantFormatTest, ::testing::ValuesIn(kBlockTypes),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return Name(info.param);
                         });

class GgufQuantizerTest : public ::testing::TestWithParam<DType> {};

TEST_P(GgufQuantizerTest, QuantizeIsByteExactWithGguf) {
  const DType t = GetParam();
  const std::vector<float> in = ReadFloats("input.f32");
  const std::vector<uint8_t> want = ReadFile(Name(t) + ".quantized");
  const int64_t n = static_cast<int64_t>(in.size());
  ASSERT_EQ(static_cast<int64_t>(want.size()), DTypeRowBytes(t, n));
  std::vector<uint8_t> got(want.size(), 0xCD);
  ASSERT_TRUE(QuantizeRow(t, in.data(), got.data(), n));
  const int64_t block_bytes = DTypeBlockBytes(t);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << "byte " << i % block_bytes << " of block " << i / block_bytes;
  }
}

INSTANTIATE_TEST_SUITE_P(GgufQuantizers, GgufQuantizerTest,
                         ::testing::Values(DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                                           DType::kQ5_1),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return Name(info.param);
                         });

// Every f16 scale, through Q8_0 blocks with the code 1: the value is the scale itself,
// converted exactly (normal, subnormal, zero, inf, NaN with its payload).
TEST(QuantTest, EveryF16ScaleConvertsExactly) {
  std::vector<BlockQ8_0> blocks(65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    blocks[h].d = static_cast<uint16_t>(h);
    for (int8_t& q : blocks[h].qs) q = 1;
  }
  std::vector<float> out(65536 * 32);
  ASSERT_TRUE(DequantizeRow(DType::kQ8_0, blocks.data(), out.data(), 65536 * 32));
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = HalfToFloat(static_cast<uint16_t>(h));
    uint32_t a, b;
    std::memcpy(&a, &out[h * 32 + 31], 4);
    std::memcpy(&b, &want, 4);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(out[h * 32])) << "f16 0x" << std::hex << h;
    } else {
      ASSERT_EQ(a, b) << "f16 0x" << std::hex << h;
    }
  }
}

TEST(QuantTest, PlainTypesAreRefused) {
  float f[32] = {1.0f};
  uint8_t b[128] = {};
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    EXPECT_FALSE(DequantizeRow(t, b, f, 32)) << DTypeName(t);
    EXPECT_FALSE(QuantizeRow(t, f, b, 32)) << DTypeName(t);
  }
}

}  // namespace
}  // namespace sg
