// Generated kernels compile with NVRTC for sm_90 and become what they were meant to: 16-byte
// vector accesses, the griddepcontrol wait, nothing spilled to local memory; they include
// the shipped device headers (embedded at build time, the files of the tree) rather than
// copies, and the cache keys carry the headers' digest; malformed descriptions are
// refused. No GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "dispatch/cuda/codegen.h"
#include "dispatch/cuda/nvrtc_cache.h"
#include "dispatch/cuda/nvrtc_headers.h"

namespace sg::codegen {
namespace {

constexpr int kArch = 90;

// 16-byte global loads and stores in the PTX.
bool HasVectorLoads(const std::string& ptx) {
  return ptx.find("ld.global.nc.v4.") != std::string::npos ||
         ptx.find("ld.global.v4.") != std::string::npos;
}
bool HasVectorStores(const std::string& ptx) { return ptx.find("st.global.v4.") != std::string::npos; }

struct NamedChain {
  const char* name;
  ElementwiseChain chain;
};

std::vector<NamedChain> Chains() {
  std::vector<NamedChain> c;
  // SwiGLU then the residual add, bf16: the MLP's tail.
  c.push_back({"silu_mul_add_bf16",
               {{DType::kBF16, DType::kBF16, DType::kBF16},
                {{EwOp::kSiluMul, 0, 1}, {EwOp::kAdd, 3, 2}},
                {4},
                8192}});
  c.push_back({"add_f32", {{DType::kF32, DType::kF32}, {{EwOp::kAdd, 0, 1}}, {2}, 2048}});
  // Odd count (tail), f16, silu then a product, two outputs.
  c.push_back({"silu_mul_f16_two_outputs",
               {{DType::kF16, DType::kF16},
                {{EwOp::kSilu, 0}, {EwOp::kMul, 2, 1}},
                {2, 3},
                1001}});
  // Mixed dtypes: an f32 and a bf16 input, each with its own steps and output.
  c.push_back({"mixed_dtypes",
               {{DType::kF32, DType::kBF16},
                {{EwOp::kSilu, 0}, {EwOp::kMul, 1, 1}, {EwOp::kAdd, 2, 0}},
                {4, 3},
                4096 + 3}});
  c.push_back({"one_element", {{DType::kBF16}, {{EwOp::kSilu, 0}}, {1}, 1}});
  return c;
}

TEST(NvrtcCodegen, ElementwiseChainsCompileForSm90) {
  for (const NamedChain& nc : Chains()) {
    SCOPED_TRACE(nc.name);
    absl::StatusOr<GeneratedKernel> k = GenerateElementwise(nc.chain);
    ASSERT_TRUE(k.ok()) << k.status();
    EXPECT_NE(k->source.code.find(absl::StrCat("kN = ", nc.chain.elements, ";")), std::string::npos)
        << "the element count is a compile-time constant";
    absl::StatusOr<std::string> cubin = CompileToCubin(k->source, kArch);
    ASSERT_TRUE(cubin.ok()) << cubin.status() << "\n" << k->source.code;
    EXPECT_GT(cubin->size(), 100u);
    absl::StatusOr<std::string> ptx = CompileToPtx(k->source, kArch);
    ASSERT_TRUE(ptx.ok()) << ptx.status();
    EXPECT_NE(ptx->find(".entry " + k->entry), std::string::npos) << "extern \"C\" entry";
    EXPECT_NE(ptx->find("griddepcontrol.wait"), std::string::npos);
    EXPECT_NE(ptx->find("griddepcontrol.launch_dependents"), std::string::npos);
    // A chain shorter than one vector has no vector path.
    const bool vector = nc.chain.elements >= 8;
    EXPECT_EQ(HasVectorLoads(*ptx), vector) << *ptx;
    EXPECT_EQ(HasVectorStores(*ptx), vector) << *ptx;
    EXPECT_EQ(ptx->find(".local"), std::string::npos) << "registers spilled\n" << *ptx;
    // Elements per thread: a 16-byte vector of the narrowest dtype.
    bool all_f32 = true;
    for (DType t : nc.chain.inputs) all_f32 = all_f32 && t == DType::kF32;
    const int64_t per_thread = all_f32 ? 4 : 8;
    EXPECT_GE(int64_t{k->grid} * k->block * per_thread, nc.chain.elements) << "covers every element";
    EXPECT_LT(int64_t{k->grid - 1} * k->block * per_thread, nc.chain.elements) << "no idle blocks";
  }
}

TEST(NvrtcCodegen, RmsNormCompilesForSm90) {
  struct Case {
    int64_t hidden;
    DType dtype;
    bool vector;
  };
  for (const Case& c : {Case{2048, DType::kBF16, true}, Case{576, DType::kF16, true},
                        Case{8192, DType::kF32, true}, Case{100, DType::kBF16, false},
                        Case{kMaxRmsNormHidden, DType::kBF16, true}}) {
    SCOPED_TRACE(absl::StrCat(c.hidden, " ", static_cast<int>(c.dtype)));
    RmsNormSpec spec{4, c.hidden, 1e-5f, c.dtype};
    absl::StatusOr<GeneratedKernel> k = GenerateRmsNorm(spec);
    ASSERT_TRUE(k.ok()) << k.status();
    EXPECT_EQ(k->grid, 4u);
    EXPECT_LE(k->block, 1024u);
    EXPECT_EQ(k->block % 32, 0u);
    absl::StatusOr<std::string> ptx = CompileToPtx(k->source, kArch);
    ASSERT_TRUE(ptx.ok()) << ptx.status() << "\n" << k->source.code;
    EXPECT_NE(ptx->find("griddepcontrol.wait"), std::string::npos);
    EXPECT_EQ(HasVectorLoads(*ptx), c.vector) << *ptx;
    EXPECT_EQ(HasVectorStores(*ptx), c.vector) << *ptx;
    EXPECT_EQ(ptx->find(".local"), std::string::npos) << "registers spilled\n" << *ptx;
    ASSERT_TRUE(CompileToCubin(k->source, kArch).ok());
  }
}

// NVRTC compiles the headers of the tree, not copies: every stepgraph header embedded is
// byte for byte the file nvcc compiles the built-in kernels from, and the generated
// sources include them instead of defining device math of their own.
TEST(NvrtcHeaders, AreTheShippedFiles) {
  int ours = 0;
  std::vector<std::string> names;
  for (const internal::NvrtcHeader& h : internal::NvrtcHeaders()) {
    names.push_back(h.include_name);
    ASSERT_FALSE(h.text.empty()) << h.include_name;
    EXPECT_EQ(h.text.data()[h.text.size()], '\0') << "NVRTC takes C strings";
    if (!absl::StartsWith(h.include_name, "kernels/")) continue;
    ++ours;
    std::ifstream file(std::string(SG_SOURCE_DIR) + "/" + h.include_name, std::ios::binary);
    ASSERT_TRUE(file.good()) << h.include_name;
    std::stringstream text;
    text << file.rdbuf();
    EXPECT_EQ(h.text, text.str()) << h.include_name << " differs from the file in the tree";
  }
  EXPECT_EQ(ours, 2);
  for (const char* needed : {"kernels/device_common.cuh", "kernels/rms_norm_row.cuh",
                             "cuda_fp16.h", "cuda_bf16.h"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), needed), names.end()) << needed;
  }

  const GeneratedKernel chain =
      GenerateElementwise({{DType::kBF16, DType::kBF16}, {{EwOp::kSiluMul, 0, 1}}, {2}, 64})
          .value();
  const GeneratedKernel norm = GenerateRmsNorm({1, 2048, 1e-5f, DType::kBF16}).value();
  EXPECT_TRUE(absl::StrContains(chain.source.code, "#include \"kernels/device_common.cuh\""));
  EXPECT_TRUE(absl::StrContains(norm.source.code, "#include \"kernels/rms_norm_row.cuh\""));
  for (const std::string* code : {&chain.source.code, &norm.source.code}) {
    EXPECT_FALSE(absl::StrContains(*code, "griddepcontrol")) << *code;
    EXPECT_FALSE(absl::StrContains(*code, "asm")) << *code;
    EXPECT_FALSE(absl::StrContains(*code, "__shfl")) << *code;
    EXPECT_FALSE(absl::StrContains(*code, "expf")) << *code;
  }
}

// The kernel cache's key covers the embedded headers: a change to one compiles anew.
TEST(NvrtcHeaders, DigestIsInTheCacheKey) {
  const absl::string_view digest = internal::NvrtcHeadersDigest();
  EXPECT_EQ(digest.size(), 64u) << digest;
  const KernelSource s{"k.cu", "extern \"C\" __global__ void k() {}", {}};
  EXPECT_TRUE(absl::StrContains(CubinCache::KeyText(s), digest));
}

TEST(NvrtcCodegen, PlanValuesChangeTheSource) {
  RmsNormSpec a{1, 2048, 1e-5f, DType::kBF16};
  RmsNormSpec b = a;
  b.eps = 1e-6f;
  RmsNormSpec c = a;
  c.hidden = 4096;
  const std::string sa = GenerateRmsNorm(a)->source.code;
  EXPECT_NE(sa, GenerateRmsNorm(b)->source.code);
  EXPECT_NE(sa, GenerateRmsNorm(c)->source.code);
  EXPECT_EQ(sa, GenerateRmsNorm(a)->source.code) << "generation is deterministic (cache keys)";
}

TEST(NvrtcCodegen, MalformedChainsAreRefused) {
  const ElementwiseChain good{{DType::kBF16, DType::kBF16}, {{EwOp::kAdd, 0, 1}}, {2}, 64};
  ASSERT_TRUE(GenerateElementwise(good).ok());
  auto expect_bad = [](ElementwiseChain c, absl::string_view needle) {
    absl::StatusOr<GeneratedKernel> k = GenerateElementwise(c);
    ASSERT_FALSE(k.ok()) << needle;
    EXPECT_EQ(k.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(k.status().message().find(needle), absl::string_view::npos) << k.status();
  };
  ElementwiseChain c = good;
  c.steps[0].b = 2;  // its own result
  expect_bad(c, "operand b = 2");
  c = good;
  c.inputs[1] = DType::kF16;
  expect_bad(c, "different dtypes");
  c = good;
  c.inputs[1] = DType::kI32;
  expect_bad(c, "input 1");
  c = good;
  c.steps.push_back({EwOp::kSilu, 2, 0});
  expect_bad(c, "unary");
  c = good;
  c.elements = 0;
  expect_bad(c, "elements");
  c = good;
  c.outputs = {3};
  expect_bad(c, "value 3");
  c = good;
  c.outputs.clear();
  expect_bad(c, "outputs");

  EXPECT_FALSE(GenerateRmsNorm({0, 2048, 1e-5f, DType::kBF16}).ok());
  EXPECT_FALSE(GenerateRmsNorm({1, kMaxRmsNormHidden + 1, 1e-5f, DType::kBF16}).ok());
  EXPECT_FALSE(GenerateRmsNorm({1, 2048, std::numeric_limits<float>::quiet_NaN(), DType::kBF16}).ok());
  EXPECT_FALSE(GenerateRmsNorm({1, 2048, 1e-5f, DType::kI32}).ok());
}

TEST(NvrtcCompile, ErrorsCarryTheLogAndTheArchitecture) {
  KernelSource bad{"broken.cu", "extern \"C\" __global__ void k() { undeclared_name = 1; }", {}};
  absl::StatusOr<std::string> r = CompileToCubin(bad, kArch);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("undeclared_name"), absl::string_view::npos) << r.status();
  EXPECT_NE(r.status().message().find("broken.cu"), absl::string_view::npos) << r.status();

  KernelSource fine{"fine.cu", "extern \"C\" __global__ void k(int* p) { *p = 1; }", {}};
  r = CompileToCubin(fine, 50);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("sm_50"), absl::string_view::npos) << r.status();
  EXPECT_TRUE(CompileToCubin(fine, kArch).ok());
}

}  // namespace
}  // namespace sg::codegen
