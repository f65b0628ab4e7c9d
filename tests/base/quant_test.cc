// The GGUF block formats on the host (stepgraph/base/quant.h): dequantization equal bit for bit
// to the `gguf` Python package on random valid blocks of every format, quantizers equal
// byte for byte to it where it has one, the simple K-format quantizers close to their
// input, and the quantized dot product against a float64 sum of the dequantized row.
// Fixtures: tests/fixtures/quant/, made by tests/fixtures/make_quant_fixtures.py.
#include "stepgraph/base/quant.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstddef>
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

// A random f16 scale: either sign, a normal magnitude between 2^-6 and 2^5, never zero.
uint16_t RandomScale(std::mt19937& rng) {
  const uint32_t sign = rng() & 1, exponent = 9 + rng() % 12, mantissa = rng() & 0x3ff;
  return static_cast<uint16_t>(sign << 15 | exponent << 10 | mantissa);
}

// `count` blocks of random bytes (every code pattern) whose f16 scales are RandomScale;
// the K formats' packed 6-bit scales and Q6_K's int8 scales random and nonzero.
std::vector<uint8_t> RandomBlocks(DType t, int64_t count, std::mt19937& rng) {
  const int64_t bytes = DTypeBlockBytes(t);
  std::vector<uint8_t> out(static_cast<size_t>(count * bytes));
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng());
  for (int64_t i = 0; i < count; ++i) {
    uint8_t* block = out.data() + i * bytes;
    auto scale = [&](size_t offset) {
      const uint16_t h = RandomScale(rng);
      std::memcpy(block + offset, &h, 2);
    };
    switch (t) {
      case DType::kQ8_0: case DType::kQ4_0: case DType::kQ5_0: scale(0); break;
      case DType::kQ4_1: case DType::kQ5_1: scale(0); scale(2); break;
      case DType::kQ4_K: case DType::kQ5_K:
        scale(0);
        scale(2);
        for (int j = 4; j < 16; ++j) block[j] |= 0x11;  // no 6-bit scale or min is zero
        break;
      case DType::kQ6_K:
        for (int j = 192; j < 208; ++j) block[j] = block[j] == 0 ? 1 : block[j];
        scale(offsetof(BlockQ6_K, d));
        break;
      default: break;
    }
  }
  return out;
}

// Every vector path the processor has against the scalar path, on random blocks: rows not a
// multiple of the paths' row groups, vector counts that leave every remainder of their
// vector groups, strided x and out. Only the order and rounding of the sums may differ, so
// each result is within a few f32 roundings of the scalar one, relative to Σ|value·x|.
TEST_P(QuantFormatTest, EveryIsaMatchesTheScalarPath) {
  const DType t = GetParam();
  const int64_t n = 3 * 256, rows = 7, x_stride = n + 3;
  std::mt19937 rng(19);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<uint8_t> blocks = RandomBlocks(t, rows * n / DTypeBlockElems(t), rng);
  const int64_t row_bytes = DTypeRowBytes(t, n);
  std::vector<float> values(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    ASSERT_TRUE(DequantizeRow(t, blocks.data() + r * row_bytes, values.data() + r * n, n));
  }
  int paths = 0;
  for (const int64_t m : {1, 2, 3, 5, 9, 16, 17}) {
    const int64_t out_stride = rows + 2;
    std::vector<float> x(m * x_stride);
    for (float& v : x) v = normal(rng);
    std::vector<float> want(m * out_stride, std::nanf(""));
    ASSERT_TRUE(DotQuantizedRowsWith(QuantIsa::kBaseline, t, blocks.data(), rows, n, x.data(),
                                     x_stride, m, want.data(), out_stride));
    for (const QuantIsa isa : {QuantIsa::kAvx2, QuantIsa::kAvx512}) {
      std::vector<float> got(m * out_stride, std::nanf(""));
      if (!QuantIsaSupported(isa)) {
        EXPECT_FALSE(DotQuantizedRowsWith(isa, t, blocks.data(), rows, n, x.data(), x_stride,
                                          m, got.data(), out_stride));
        continue;
      }
      paths += m == 1;
      ASSERT_TRUE(DotQuantizedRowsWith(isa, t, blocks.data(), rows, n, x.data(), x_stride, m,
                                       got.data(), out_stride));
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t r = 0; r < rows; ++r) {
          double norm = 0;
          for (int64_t c = 0; c < n; ++c) {
            norm += std::fabs(static_cast<double>(values[r * n + c]) * x[i * x_stride + c]);
          }
          ASSERT_GT(norm, 0.0);
          const float g = got[i * out_stride + r], w = want[i * out_stride + r];
          EXPECT_LE(std::fabs(static_cast<double>(g) - w), 4e-7 * norm)
              << "path " << static_cast<int>(isa) << ", m " << m << ", vector " << i
              << ", row " << r << ": got " << g << ", scalar " << w;
        }
        // The padding between rows of out stays untouched.
        EXPECT_TRUE(std::isnan(got[i * out_stride + rows]));
      }
      // A row's result is the same bits whatever the call's rows and m: one row and one
      // vector at a time.
      for (int64_t i = 0; i < m; i += 4) {
        for (int64_t r = 0; r < rows; r += 3) {
          float one = std::nanf("");
          ASSERT_TRUE(DotQuantizedRowsWith(isa, t, blocks.data() + r * row_bytes, 1, n,
                                           x.data() + i * x_stride, 0, 1, &one, 0));
          EXPECT_EQ(std::bit_cast<uint32_t>(one), std::bit_cast<uint32_t>(got[i * out_stride + r]))
              << "path " << static_cast<int>(isa) << ", m " << m << ", vector " << i
              << ", row " << r;
        }
      }
    }
    // The default entry point takes the widest path the processor has.
    std::vector<float> chosen(m * out_stride, std::nanf("")), best(m * out_stride, std::nanf(""));
    ASSERT_TRUE(DotQuantizedRows(t, blocks.data(), rows, n, x.data(), x_stride, m,
                                 chosen.data(), out_stride));
    ASSERT_TRUE(DotQuantizedRowsWith(BestQuantIsa(), t, blocks.data(), rows, n, x.data(),
                                     x_stride, m, best.data(), out_stride));
    for (int64_t e = 0; e < m * out_stride; ++e) {
      if (e % out_stride < rows) {
        EXPECT_EQ(std::bit_cast<uint32_t>(chosen[e]), std::bit_cast<uint32_t>(best[e]));
      }
    }
  }
  RecordProperty("vector_paths", paths);
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

// Sanitizer builds compile base/quant.cc uninstrumented and check each entry's whole
// buffers against ASan's shadow instead (base/CMakeLists.txt): a row whose blocks or
// output end one byte early is still reported, before any of it is read.
TEST(QuantDeathTest, SanitizersStillSeeBuffersThatEndEarly) {
#ifndef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "checked under AddressSanitizer only";
#else
  const int64_t n = 64;
  std::mt19937 rng(7);
  std::vector<uint8_t> short_blocks(DTypeRowBytes(DType::kQ4_0, n) - 1);
  for (uint8_t& b : short_blocks) b = static_cast<uint8_t>(rng());
  std::vector<float> x(n);
  for (float& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  float out = 0;
  EXPECT_DEATH(DotQuantizedRow(DType::kQ4_0, short_blocks.data(), n, x.data(), n, 1, &out, 1),
               "DotQuantizedRows: blocks .* reaches unaddressable memory");
  std::vector<uint8_t> blocks(DTypeRowBytes(DType::kQ4_0, n));
  for (uint8_t& b : blocks) b = static_cast<uint8_t>(rng());
  std::vector<float> short_out(n - 1);
  EXPECT_DEATH(DequantizeRow(DType::kQ4_0, blocks.data(), short_out.data(), n),
               "DequantizeRow: out .* reaches unaddressable memory");
  EXPECT_DEATH(QuantizeRow(DType::kQ4_0, short_out.data(), blocks.data(), n),
               "QuantizeRow: in .* reaches unaddressable memory");
  // Whole buffers pass.
  std::vector<float> row(n);
  EXPECT_TRUE(DequantizeRow(DType::kQ4_0, blocks.data(), row.data(), n));
  EXPECT_TRUE(DotQuantizedRow(DType::kQ4_0, blocks.data(), n, x.data(), n, 1, &out, 1));
#endif
}

}  // namespace
}  // namespace sg
