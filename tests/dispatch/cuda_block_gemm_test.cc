// The block GEMM, MatMul's path for weights in GGUF block formats at many rows
// (dispatch/cuda/matmul.cc): its dequantization kernel against the CPU reference's
// DequantizeRow bit for bit (kernels/dequant.cuh), the chunking it plans (host only), and
// MatMul conformance against the CPU reference (tests/testing/conformance.h: random
// inputs, poisoned arenas, normalised error) for every format × activation dtype ×
// precision × M in {8, 17, 64, 300}, with the workspace shrunk so that each weight runs
// in several chunks and a shorter last one. GPU cases skip without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_handles.h"
#include "dispatch/cuda/matmul.h"
#include "kernels/dequant.cuh"
#include "kernels/quant_layout.h"
#include "stepgraph/base/half.h"
#include "stepgraph/base/quant.h"
#include "tests/testing/conformance.h"
#include "tests/testing/util.h"

namespace sg::testing {
namespace {

constexpr DType kQuantTypes[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                                 DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
constexpr DType kFloatTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

// ---- the chunking (no device) ----

using internal::BlockGemmLayout;
using internal::BlockGemmLayoutFor;
using internal::BlockMmaTermsFor;

TEST(BlockGemmLayoutTest, ChunksFillTheWorkspaceInWholeQuanta) {
  CudaOptions o;
  o.block_gemm_workspace_bytes = int64_t{32} << 20;
  // A Llama-3.2-1B lm head at a 512-token prefill: 8192 bf16 rows of 2048 fill 32 MiB.
  absl::StatusOr<BlockGemmLayout> l =
      BlockGemmLayoutFor(512, 128256, 2048, DType::kBF16, o, int64_t{50} << 20);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->operand, DType::kBF16);
  EXPECT_FALSE(l->round_x);
  EXPECT_FALSE(l->tf32);
  EXPECT_EQ(l->chunk_rows, 8192);
  EXPECT_EQ(l->chunk_offset, 0);
  EXPECT_EQ(l->bytes, int64_t{32} << 20);
  // At 16 rows the GEMM streams the chunk: a quarter of L2 (12.5 MiB: 3200 rows).
  l = BlockGemmLayoutFor(16, 128256, 2048, DType::kBF16, o, int64_t{50} << 20);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->chunk_rows, 3200);
  // A weight narrower than a chunk is one chunk of its own rows.
  l = BlockGemmLayoutFor(512, 512, 2048, DType::kF16, o, int64_t{50} << 20);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->chunk_rows, 512);
  EXPECT_EQ(l->bytes, 512 * 2048 * 2);
  // A workspace below one quantum still holds 128 rows.
  o.block_gemm_workspace_bytes = 1;
  l = BlockGemmLayoutFor(512, 1000, 4096, DType::kBF16, o, 0);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->chunk_rows, 128);
}

TEST(BlockGemmLayoutTest, F32ActivationsFollowThePrecision) {
  CudaOptions o;
  o.block_gemm_workspace_bytes = int64_t{8} << 20;
  o.block_gemm_precision = BlockGemmPrecision::kF32;
  absl::StatusOr<BlockGemmLayout> l = BlockGemmLayoutFor(300, 8192, 2048, DType::kF32, o, 0);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->operand, DType::kF32);
  EXPECT_FALSE(l->tf32);
  EXPECT_EQ(l->chunk_rows, 1024);  // 8 MiB of f32 rows of 2048
  o.block_gemm_precision = BlockGemmPrecision::kTf32;
  l = BlockGemmLayoutFor(300, 8192, 2048, DType::kF32, o, 0);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->operand, DType::kF32);
  EXPECT_TRUE(l->tf32);
  o.block_gemm_precision = BlockGemmPrecision::kBf16;
  l = BlockGemmLayoutFor(300, 8192, 2048, DType::kF32, o, 0);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->operand, DType::kBF16);
  EXPECT_TRUE(l->round_x);
  // x rounded to bf16 first (300·2048·2 bytes, a multiple of 256), the chunk after it.
  EXPECT_EQ(l->chunk_offset, 300 * 2048 * 2);
  EXPECT_EQ(l->chunk_rows, 2048);
  EXPECT_EQ(l->bytes, 300 * 2048 * 2 + 2048 * 2048 * 2);
  EXPECT_FALSE(l->scale_x());
  EXPECT_EQ(l->x_offset, 0);
  // f16: the same in f16, x scaled into f16's range as it is rounded, the scaling's
  // scratch (alpha and beta among it) first.
  o.block_gemm_precision = BlockGemmPrecision::kF16;
  l = BlockGemmLayoutFor(300, 8192, 2048, DType::kF32, o, 0);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->operand, DType::kF16);
  EXPECT_TRUE(l->round_x);
  EXPECT_TRUE(l->scale_x());
  EXPECT_FALSE(l->tf32);
  EXPECT_EQ(l->x_offset, kernels::kRoundScaleBytes);
  EXPECT_EQ(l->chunk_offset, kernels::kRoundScaleBytes + 300 * 2048 * 2);
  EXPECT_EQ(l->bytes, kernels::kRoundScaleBytes + 300 * 2048 * 2 + 2048 * 2048 * 2);
  o.block_gemm_precision = BlockGemmPrecision::kBf16;
  // bf16 activations ignore the f32 precision.
  l = BlockGemmLayoutFor(300, 8192, 2048, DType::kBF16, o, 0);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_FALSE(l->round_x);
  EXPECT_EQ(l->chunk_offset, 0);
}

TEST(BlockGemmLayoutTest, OverflowIsAnError) {
  const absl::StatusOr<BlockGemmLayout> l =
      BlockGemmLayoutFor(int64_t{1} << 40, 4096, int64_t{1} << 30, DType::kF32,
                         CudaOptions{.block_gemm_precision = BlockGemmPrecision::kBf16}, 0);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BlockGemmPrecisionTest, NamesRoundTrip) {
  for (BlockGemmPrecision p : {BlockGemmPrecision::kF32, BlockGemmPrecision::kTf32,
                               BlockGemmPrecision::kBf16, BlockGemmPrecision::kBf16x2,
                               BlockGemmPrecision::kF16x2, BlockGemmPrecision::kInt8,
                               BlockGemmPrecision::kAuto, BlockGemmPrecision::kF16}) {
    absl::StatusOr<BlockGemmPrecision> back = ParseBlockGemmPrecision(BlockGemmPrecisionName(p));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, p);
  }
  EXPECT_EQ(ParseBlockGemmPrecision("fp8").status().code(), absl::StatusCode::kInvalidArgument);
}

// The default, auto: the tensor-core kernel's x as one scaled f16 part for launches of
// kBlockGemmAutoF16Rows rows or more (decode batches of 16, prompts' experts), three exact
// bf16 parts below; the block GEMM in f16 from 32 rows (f16's layout); bf16 and f16 x keep
// their own parts; explicit choices do not look at the rows.
TEST(BlockGemmPrecisionTest, AutoTakesF16FromItsRows) {
  const CudaOptions o;
  ASSERT_EQ(o.block_gemm_precision, BlockGemmPrecision::kAuto);
  EXPECT_EQ(BlockMmaTermsFor(DType::kF32, 1, o), 3);
  EXPECT_EQ(BlockMmaTermsFor(DType::kF32, kBlockGemmAutoF16Rows - 1, o), 3);
  EXPECT_EQ(BlockMmaTermsFor(DType::kF32, kBlockGemmAutoF16Rows, o), kernels::kBlockMmaF16x1);
  EXPECT_EQ(BlockMmaTermsFor(DType::kF32, 4096, o), kernels::kBlockMmaF16x1);
  EXPECT_EQ(BlockMmaTermsFor(DType::kBF16, 4096, o), 1);
  EXPECT_EQ(BlockMmaTermsFor(DType::kF16, 4096, o), 2);
  EXPECT_EQ(BlockGemmMinRows(o, DType::kF32), 32);
  absl::StatusOr<BlockGemmLayout> l = BlockGemmLayoutFor(300, 8192, 2048, DType::kF32, o, 0);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->operand, DType::kF16);
  EXPECT_TRUE(l->scale_x());
  const CudaOptions exact{.block_gemm_precision = BlockGemmPrecision::kF32};
  EXPECT_EQ(BlockMmaTermsFor(DType::kF32, 4096, exact), 3);
  const CudaOptions int8{.block_gemm_precision = BlockGemmPrecision::kInt8};
  EXPECT_EQ(BlockMmaTermsFor(DType::kF32, 2, int8), kernels::kBlockMmaInt8);
  // f16 and bf16 hand the GEMM their rows from 32 on (BlockGemmMinRows) and leave the rows
  // below to the tensor-core kernel, f16 as one scaled f16 part there; bf16 and f16
  // activations keep their own parts.
  const CudaOptions f16{.block_gemm_precision = BlockGemmPrecision::kF16};
  EXPECT_EQ(BlockMmaTermsFor(DType::kF32, 8, f16), kernels::kBlockMmaF16x1);
  EXPECT_EQ(BlockMmaTermsFor(DType::kBF16, 8, f16), 1);
  EXPECT_EQ(BlockMmaTermsFor(DType::kF16, 8, f16), 2);
  EXPECT_EQ(BlockGemmMinRows(f16, DType::kF32), 32);
  EXPECT_EQ(BlockGemmMinRows(CudaOptions{.block_gemm_precision = BlockGemmPrecision::kBf16},
                             DType::kF32),
            32);
  const CudaOptions f16x2{.block_gemm_precision = BlockGemmPrecision::kF16x2};
  EXPECT_EQ(BlockGemmMinRows(f16x2, DType::kF32), 0) << "f16x2: the tensor-core kernel throughout";
}

// ---- the dequantization kernel ----

// The CPU reference's value rounded to `t` as base/half.h rounds, as raw bits.
uint32_t ReferenceBits(float v, DType t) {
  if (t == DType::kBF16) return FloatToBF16(v);
  if (t == DType::kF16) return FloatToHalf(v);
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return bits;
}

uint32_t BitsAt(const std::vector<uint8_t>& bytes, int64_t i, DType t) {
  const int64_t size = DTypeBytes(t);
  uint32_t bits = 0;
  std::memcpy(&bits, bytes.data() + i * size, static_cast<size_t>(size));
  return bits;
}

class DequantizeTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(DequantizeTest, EqualsTheCpuReferenceBitForBit) {
  const DType q = GetParam();
  constexpr int64_t kRows = 37;
  const int64_t k = 3 * DTypeBlockElems(q);
  HostTensor w(q, Shape{kRows, k});
  w.FillUniform(7, -2.0f, 2.0f);
  std::vector<float> want(static_cast<size_t>(kRows * k));
  const int64_t row_bytes = w.bytes() / kRows;
  for (int64_t r = 0; r < kRows; ++r) {
    ASSERT_TRUE(DequantizeRow(q, static_cast<const uint8_t*>(w.data()) + r * row_bytes,
                              want.data() + r * k, k));
  }
  absl::StatusOr<DeviceMemory> dw = AllocateDevice(w.bytes(), "w");
  ASSERT_TRUE(dw.ok()) << dw.status();
  // The weight as the GPU holds it: in the device layout.
  std::vector<uint8_t> device_layout(static_cast<size_t>(w.bytes()));
  ASSERT_TRUE(kernels::RepackBlocksForDevice(q, kRows * k / DTypeBlockElems(q), w.data(),
                                             device_layout.data()));
  ASSERT_EQ(cudaMemcpy(dw->get(), device_layout.data(), w.bytes(), cudaMemcpyHostToDevice),
            cudaSuccess);
  for (DType t : kFloatTypes) {
    SCOPED_TRACE(DTypeName(t));
    // One row more than written: it must keep its poison.
    const int64_t out_bytes = (kRows + 1) * k * DTypeBytes(t);
    absl::StatusOr<DeviceMemory> out = AllocateDevice(out_bytes, "out");
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(cudaMemset(out->get(), 0xFF, out_bytes), cudaSuccess);
    // Rows 1 .. kRows-1 first (a chunk that starts inside the weight), then row 0 after
    // them: the whole weight, row by row in place.
    ASSERT_EQ(kernels::LaunchDequantize(dw->get(), q, kRows, 1, kRows - 1, k,
                                        static_cast<uint8_t*>(out->get()) + k * DTypeBytes(t), t,
                                        nullptr),
              cudaSuccess);
    ASSERT_EQ(kernels::LaunchDequantize(dw->get(), q, kRows, 0, 1, k, out->get(), t, nullptr),
              cudaSuccess);
    std::vector<uint8_t> got(static_cast<size_t>(out_bytes));
    ASSERT_EQ(cudaMemcpy(got.data(), out->get(), out_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t i = 0; i < kRows * k; ++i) {
      ASSERT_EQ(BitsAt(got, i, t), ReferenceBits(want[i], t))
          << "row " << i / k << ", value " << i % k << " (reference " << want[i] << ")";
    }
    for (int64_t i = kRows * k; i < (kRows + 1) * k; ++i) {
      ASSERT_EQ(BitsAt(got, i, t), DTypeBytes(t) == 4 ? 0xFFFFFFFFu : 0xFFFFu)
          << "value " << i << " past the rows was written";
    }
  }
}

TEST_P(DequantizeTest, RefusesWhatItCannotRead) {
  const DType q = GetParam();
  const int64_t k = DTypeBlockElems(q);
  absl::StatusOr<DeviceMemory> buf = AllocateDevice(4096, "buffer");
  ASSERT_TRUE(buf.ok()) << buf.status();
  auto* p = static_cast<uint8_t*>(buf->get());
  EXPECT_EQ(kernels::LaunchDequantize(p, q, 1, 0, 1, k + 1, p + 2048, DType::kF32, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::LaunchDequantize(p, q, 1, 0, 1, k, p + 2048, DType::kI32, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::LaunchDequantize(p, DType::kBF16, 1, 0, 1, k, p + 2048, DType::kF32, nullptr),
            cudaErrorInvalidValue);
  // Rows past the weight.
  EXPECT_EQ(kernels::LaunchDequantize(p, q, 2, 1, 2, k, p + 2048, DType::kF32, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::LaunchDequantize(p, q, 2, -1, 1, k, p + 2048, DType::kF32, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::LaunchDequantize(p + 8, q, 1, 0, 1, k, p + 2048, DType::kF32, nullptr),
            cudaErrorMisalignedAddress);
  EXPECT_EQ(kernels::LaunchDequantize(p, q, 1, 0, 1, k, p + 2050, DType::kF32, nullptr),
            cudaErrorMisalignedAddress);
  // Eight 16-bit values are one 16-byte store: 8-byte alignment is not enough.
  EXPECT_EQ(kernels::LaunchDequantize(p, q, 1, 0, 1, k, p + 2056, DType::kF16, nullptr),
            cudaErrorMisalignedAddress);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

std::string FormatName(const ::testing::TestParamInfo<DType>& info) {
  return std::string(DTypeName(info.param));
}

INSTANTIATE_TEST_SUITE_P(Formats, DequantizeTest, ::testing::ValuesIn(kQuantTypes), FormatName);

TEST(RoundFloatsTest, RoundsAsTheHostDoes) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  HostTensor in(DType::kF32, Shape{1001});
  in.FillUniform(3, -300.0f, 300.0f);
  absl::StatusOr<DeviceMemory> din = AllocateDevice(in.bytes(), "in");
  absl::StatusOr<DeviceMemory> dout = AllocateDevice(2 * 1001, "out");
  ASSERT_TRUE(din.ok() && dout.ok());
  ASSERT_EQ(cudaMemcpy(din->get(), in.data(), in.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  const auto* v = static_cast<const float*>(in.data());
  // From element 0 (four at a time, the last value alone) and from element 1 (x and out
  // not aligned: one at a time); the element before the start keeps its poison.
  for (int first : {0, 1}) {
    for (DType t : {DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(t), " from element ", first));
      ASSERT_EQ(cudaMemset(dout->get(), 0xFF, 2 * 1001), cudaSuccess);
      ASSERT_EQ(kernels::LaunchRoundFloats(static_cast<const float*>(din->get()) + first,
                                           static_cast<uint16_t*>(dout->get()) + first, t,
                                           1001 - first, nullptr),
                cudaSuccess);
      std::vector<uint16_t> got(1001);
      ASSERT_EQ(cudaMemcpy(got.data(), dout->get(), 2 * 1001, cudaMemcpyDeviceToHost),
                cudaSuccess);
      if (first > 0) {
        ASSERT_EQ(got[0], 0xFFFFu);
      }
      for (int i = first; i < 1001; ++i) {
        ASSERT_EQ(got[i], ReferenceBits(v[i], t)) << "element " << i;
      }
    }
  }
  EXPECT_EQ(kernels::LaunchRoundFloats(nullptr, nullptr, DType::kF32, 1, nullptr),
            cudaErrorInvalidValue);
}

// The f16 GEMM's x: scaled by 2^-e, e the least that brings the largest finite magnitude
// below 2^15, rounded as the host rounds; alpha 2^e and beta 0 in the scratch. Values of
// every range (e = 0 below 2^15; one element past f16's 65,504; f32's largest), with an
// infinity and a NaN that neither set e nor stop being what they are.
TEST(RoundFloatsTest, F16ScaledKeepsTheRangeAndWritesAlpha) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kCount = 70001;  // more than the first pass's blocks take in one round
  absl::StatusOr<DeviceMemory> din = AllocateDevice(kCount * 4, "in");
  absl::StatusOr<DeviceMemory> dout = AllocateDevice(kCount * 2, "out");
  absl::StatusOr<DeviceMemory> scratch = AllocateDevice(kernels::kRoundScaleBytes, "scratch");
  ASSERT_TRUE(din.ok() && dout.ok() && scratch.ok());
  struct Range {
    float top;       // the largest finite magnitude put in
    int e;           // the exponent expected
    bool specials;   // an infinity and a NaN among the values
  };
  for (const Range r : {Range{300.0f, 0, false}, Range{32767.0f, 0, true},
                        Range{70000.0f, 2, false}, Range{3.0e6f, 7, true},
                        Range{FLT_MAX, 113, false}}) {
    SCOPED_TRACE(r.top);
    HostTensor in(DType::kF32, Shape{kCount});
    in.FillUniform(11, -1.0f, 1.0f);
    auto* v = static_cast<float*>(in.data());
    for (int64_t i = 0; i < kCount; ++i) v[i] *= r.top;
    v[kCount / 3] = -r.top;  // the largest, somewhere in the middle
    if (r.specials) {
      v[5] = std::numeric_limits<float>::infinity();
      v[kCount - 2] = std::numeric_limits<float>::quiet_NaN();
    }
    ASSERT_EQ(cudaMemcpy(din->get(), v, kCount * 4, cudaMemcpyHostToDevice), cudaSuccess);
    // From element 0 (four at a time) and from element 1 (unaligned: one at a time).
    for (int64_t first : {0, 1}) {
      SCOPED_TRACE(absl::StrCat("from element ", first));
      ASSERT_EQ(cudaMemset(dout->get(), 0xFF, kCount * 2), cudaSuccess);
      ASSERT_EQ(cudaMemset(scratch->get(), 0xFF, kernels::kRoundScaleBytes), cudaSuccess);
      ASSERT_EQ(kernels::LaunchRoundFloatsF16Scaled(
                    static_cast<const float*>(din->get()) + first,
                    static_cast<uint16_t*>(dout->get()) + first, kCount - first,
                    static_cast<float*>(scratch->get()), nullptr),
                cudaSuccess);
      std::vector<uint16_t> got(kCount);
      ASSERT_EQ(cudaMemcpy(got.data(), dout->get(), kCount * 2, cudaMemcpyDeviceToHost),
                cudaSuccess);
      float alpha_beta[2];
      ASSERT_EQ(cudaMemcpy(alpha_beta,
                           static_cast<float*>(scratch->get()) + kernels::kRoundScaleAlpha,
                           sizeof(alpha_beta), cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_EQ(alpha_beta[0], std::ldexp(1.0f, r.e));
      EXPECT_EQ(alpha_beta[1], 0.0f);
      if (first > 0) {
        ASSERT_EQ(got[0], 0xFFFFu);
      }
      for (int64_t i = first; i < kCount; ++i) {
        if (std::isnan(v[i])) {  // any NaN (the device's and the host's bits may differ)
          ASSERT_TRUE((got[i] & 0x7C00) == 0x7C00 && (got[i] & 0x3FF) != 0)
              << "element " << i;
          continue;
        }
        ASSERT_EQ(got[i], FloatToHalf(std::ldexp(v[i], -r.e)))
            << "element " << i << ": " << v[i];
      }
    }
  }
  EXPECT_EQ(kernels::LaunchRoundFloatsF16Scaled(nullptr, nullptr, -1, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::LaunchRoundFloatsF16Scaled(
                static_cast<const float*>(din->get()), dout->get(), 1,
                reinterpret_cast<float*>(static_cast<uint8_t*>(scratch->get()) + 4), nullptr),
            cudaErrorMisalignedAddress);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// ---- MatMul through the block GEMM against the CPU reference ----

struct Variant {
  DType x;
  BlockGemmPrecision precision;
  double tolerance;
};

// f32 operands differ from the reference by the order of the additions only; TF32 rounds
// both operands to 10-bit mantissas (about 5e-4 each), bf16 to 8 bits, f16 to 11 bits
// (f16 activations: plus the output's rounding).
constexpr Variant kVariants[] = {
    {DType::kF32, BlockGemmPrecision::kF32, 1e-5},
    {DType::kF32, BlockGemmPrecision::kTf32, 3e-3},
    {DType::kF32, BlockGemmPrecision::kBf16, 1e-2},
    {DType::kF32, BlockGemmPrecision::kF16, 3e-3},
    {DType::kBF16, BlockGemmPrecision::kF32, 1e-2},
    {DType::kF16, BlockGemmPrecision::kF32, 1e-2},
};

// n values of x uniform in ±3·10^5, past f16's range (seeded by `seed`).
std::vector<float> WideX(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-3.0e5f, 3.0e5f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = u(rng);
  return x;
}

std::vector<OpCase> BlockGemmCases() {
  std::vector<OpCase> cases;
  struct Mm {
    int64_t k, n;
    bool bias;
  };
  // With 128-row chunks: three whole chunks, then one chunk and a last one of 72 rows with
  // a bias (the bias and y's columns advance with the chunks).
  constexpr Mm kShapes[] = {{512, 384, false}, {256, 200, true}};
  for (DType q : kQuantTypes) {
    for (const Variant& v : kVariants) {
      for (const Mm& s : kShapes) {
        for (int64_t m : {8, 17, 64, 300}) {
          cases.push_back(
              {.name = absl::StrCat("BlockGemm/", DTypeName(q), "/", DTypeName(v.x), "_",
                                    BlockGemmPrecisionName(v.precision), "/", m, "x", s.k, "x",
                                    s.n, s.bias ? "+bias" : ""),
               .build = [=](GraphBuilder& b) {
                 auto x = b.Input("x", v.x, {m, s.k});
                 auto w = b.Weight("w", q, {s.n, s.k});
                 b.Output("out", s.bias ? b.MatMul(x, w, b.Weight("bias", v.x, {s.n}))
                                        : b.MatMul(x, w));
               },
               .tolerance = v.tolerance,
               .cuda_options = [=](CudaOptions& o) {
                 o.block_gemm_min_rows = 1;
                 o.block_gemm_workspace_bytes = 1;  // 128-row chunks
                 o.block_gemm_precision = v.precision;
               }});
        }
      }
    }
    // f16 operands with x past f16's range (up to 3·10^5; 65,504 is f16's largest; the
    // weights and bias in the usual range, as a model's): x is scaled into range as it is
    // rounded and alpha scales y back, so the products stay finite and within f16's
    // tolerance of the reference's.
    for (int64_t m : {17, 300}) {
      cases.push_back(
          {.name = absl::StrCat("BlockGemm/", DTypeName(q), "/f32_f16_wide/", m, "x256x200+bias"),
           .build = [=](GraphBuilder& b) {
             b.Output("out", b.MatMul(b.Input("x", DType::kF32, {m, 256}),
                                      b.Weight("w", q, {200, 256}),
                                      b.Weight("bias", DType::kF32, {200})));
           },
           .tolerance = 3e-3,
           .float_values = {{"x", WideX(m * 256, static_cast<uint32_t>(m))}},
           .cuda_options = [](CudaOptions& o) {
             o.block_gemm_min_rows = 1;
             o.block_gemm_workspace_bytes = 1;
             o.block_gemm_precision = BlockGemmPrecision::kF16;
           }});
    }
  }
  return cases;
}

// Matmuls that read one x in a row share its rounding (the later ones read what the first
// left in the workspace): x [m, 256] into w1, w2 (sharing), then x2 into w3 (which rounds
// x2 over it), then x into w4 (which must round x again, and with it x's own scale). x
// reaches past f16's range and x2 does not, so a w4 that read x2's rounding or scale
// would be far off. Formats mixed, as a Q4_K_M file's layers are.
std::vector<OpCase> SharedXCases() {
  std::vector<OpCase> cases;
  for (const Variant& v : kVariants) {
    if (v.x != DType::kF32) continue;
    for (int64_t m : {40, 300}) {
      cases.push_back(
          {.name = absl::StrCat("BlockGemmSharedX/", BlockGemmPrecisionName(v.precision), "/",
                                m),
           .build = [=](GraphBuilder& b) {
             auto x = b.Input("x", DType::kF32, {m, 256});
             auto x2 = b.Input("x2", DType::kF32, {m, 256});
             b.Output("y1", b.MatMul(x, b.Weight("w1", DType::kQ4_K, {200, 256})));
             b.Output("y2", b.MatMul(x, b.Weight("w2", DType::kQ6_K, {72, 256}),
                                     b.Weight("b2", DType::kF32, {72})));
             b.Output("y3", b.MatMul(x2, b.Weight("w3", DType::kQ4_0, {128, 256})));
             b.Output("y4", b.MatMul(x, b.Weight("w4", DType::kQ8_0, {96, 256})));
           },
           .tolerance = v.tolerance,
           .float_values = {{"x", WideX(m * 256, static_cast<uint32_t>(m + 5))}},
           .cuda_options = [=](CudaOptions& o) {
             o.block_gemm_min_rows = 1;
             o.block_gemm_precision = v.precision;
           }});
    }
  }
  return cases;
}

class BlockGemmConformanceTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(BlockGemmConformanceTest, CpuAndCudaAgree) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  RunConformance(GetParam());
}

INSTANTIATE_TEST_SUITE_P(MatMul, BlockGemmConformanceTest, ::testing::ValuesIn(BlockGemmCases()),
                         OpCaseTestName{});
INSTANTIATE_TEST_SUITE_P(SharedX, BlockGemmConformanceTest, ::testing::ValuesIn(SharedXCases()),
                         OpCaseTestName{});

// Which nodes of the shared-x graph reuse the rounding: only the second matmul on x right
// after the first (f16 and bf16 round x; f32 and TF32 read it as it is, so none does).
TEST(BlockGemmSharedXTest, OnlyAMatmulRightAfterOneOnTheSameXReusesItsRounding) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  for (const BlockGemmPrecision precision :
       {BlockGemmPrecision::kF16, BlockGemmPrecision::kBf16, BlockGemmPrecision::kF32}) {
    SCOPED_TRACE(BlockGemmPrecisionName(precision));
    GraphBuilder b;
    auto x = b.Input("x", DType::kF32, {64, 256});
    auto x2 = b.Input("x2", DType::kF32, {64, 256});
    b.Output("y1", b.MatMul(x, b.Weight("w1", DType::kQ4_0, {128, 256})));
    b.Output("y2", b.MatMul(x, b.Weight("w2", DType::kQ4_0, {128, 256})));
    b.Output("y3", b.MatMul(x2, b.Weight("w3", DType::kQ4_0, {128, 256})));
    b.Output("y4", b.MatMul(x, b.Weight("w4", DType::kQ4_0, {128, 256})));
    b.Output("y5", b.MatMul(b.Add(x, x2), b.Weight("w5", DType::kQ4_0, {128, 256})));
    absl::StatusOr<Graph> g = std::move(b).Build();
    ASSERT_TRUE(g.ok()) << g.status();
    absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(g));
    ASSERT_TRUE(plan.ok()) << plan.status();
    CudaDispatch::Options options;
    options.cuda.block_gemm_min_rows = 1;
    options.cuda.block_gemm_precision = precision;
    absl::StatusOr<std::unique_ptr<CudaDispatch>> gpu = CudaDispatch::Create(options);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    absl::StatusOr<PreparedPlan> prepared = (*gpu)->Prepare(*plan);
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    std::vector<bool> reuses;
    for (int32_t i = 0; i < plan->graph().num_nodes(); ++i) {
      if (std::holds_alternative<ops::MatMul>(plan->graph().nodes()[i].op)) {
        reuses.push_back(internal::BlockGemmReusesX(prepared->node(i)));
      }
    }
    const bool rounds = precision != BlockGemmPrecision::kF32;
    EXPECT_EQ(reuses, (std::vector<bool>{false, rounds, false, false, false}));
  }
}

TEST(BlockGemmCasesTest, EveryFormatVariantAndRowCountIsCovered) {
  // Per format: 6 variants × 2 shapes × 4 row counts, and f16 with wide x at 2 row counts.
  EXPECT_EQ(BlockGemmCases().size(), 8u * (6u * 2u * 4u + 2u));
}

}  // namespace
}  // namespace sg::testing
