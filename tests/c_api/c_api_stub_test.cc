// The C ABI of a build without CUDA. Every function that would touch the GPU checks its
// arguments as the CUDA build does (the same code: -2 for a bad one, c_api_args_test.cc
// has every case) and returns -1 (STEPGRAPH_ERROR_NO_CUDA) for valid ones, writing
// nothing; the host-only functions are tested in c_api_host_test.cc.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "stepgraph/c_api/c_api.h"
#include "tests/c_api/header_check.h"

namespace sg::testing {
namespace {

constexpr int32_t kNoCuda = STEPGRAPH_ERROR_NO_CUDA;
constexpr int32_t kInvalid = STEPGRAPH_ERROR_INVALID_VALUE;

// Real host memory, so that a stub that did write would be seen doing it.
struct Buffers {
  std::vector<float> a = std::vector<float>(4096, 1.5f);
  std::vector<float> b = std::vector<float>(4096, 2.5f);
  std::vector<float> y = std::vector<float>(4096, 3.5f);
  std::vector<int32_t> ids = std::vector<int32_t>(64, 7);
  uint32_t flags = 0;
};

TEST(CApiStubTest, EveryGpuEntryPointReturnsNoCudaForValidArguments) {
  Buffers m;
  const void* a = m.a.data();
  const void* b = m.b.data();
  void* y = m.y.data();
  int32_t* ids = m.ids.data();
  const float* freq = m.a.data();
  const int32_t f32 = STEPGRAPH_F32;
  EXPECT_EQ(stepgraph_embedding(a, ids, y, 4, 16, 64, f32, &m.flags, nullptr), kNoCuda);
  EXPECT_EQ(stepgraph_matmul(a, b, nullptr, y, 1, 32, 64, f32, nullptr), kNoCuda);
  EXPECT_EQ(stepgraph_rmsnorm(a, b, y, 4, 64, 1e-5f, f32, nullptr), kNoCuda);
  EXPECT_EQ(stepgraph_add(a, b, y, 64, f32, nullptr), kNoCuda);
  EXPECT_EQ(stepgraph_add(a, b, y, 64, STEPGRAPH_I32, nullptr), kNoCuda);
  EXPECT_EQ(stepgraph_mul(a, b, y, 64, f32, nullptr), kNoCuda);
  EXPECT_EQ(stepgraph_silu(a, y, 64, f32, nullptr), kNoCuda);
  EXPECT_EQ(stepgraph_silu_mul(a, b, y, 64, f32, nullptr), kNoCuda);
  EXPECT_EQ(stepgraph_rope(a, ids, freq, y, 4, 128, 64, 0, f32, nullptr), kNoCuda);
  EXPECT_EQ(stepgraph_kv_write(a, ids, y, 2, 2, 2, 4, 64, f32, &m.flags, nullptr), kNoCuda);
  EXPECT_EQ(stepgraph_attention(a, b, b, ids, y, 2, 4, 2, 2, 4, 64, 0.125f, f32, nullptr, 0,
                                &m.flags, nullptr),
            kNoCuda);
  EXPECT_EQ(stepgraph_softmax(a, y, 4, 64, f32, nullptr), kNoCuda);
  EXPECT_EQ(stepgraph_argmax(a, ids, 4, 64, f32, nullptr, 0, nullptr), kNoCuda);
  EXPECT_EQ(stepgraph_sample(a, ids, ids, ids + 8, 4, 64, 1.0f, 0, 1.0f, f32, nullptr), kNoCuda);
  EXPECT_EQ(stepgraph_copy(a, y, 64, f32, nullptr), kNoCuda);
  EXPECT_EQ(stepgraph_advance(ids, 4, nullptr), kNoCuda);
  int64_t bytes = -7;
  EXPECT_EQ(stepgraph_attention_workspace_bytes(2, 4, 2, 4, 64, &bytes), kNoCuda);
  EXPECT_EQ(stepgraph_argmax_workspace_bytes(4, 64, &bytes), kNoCuda);
  EXPECT_EQ(bytes, -7);


  // Nothing was written.
  const Buffers untouched;
  EXPECT_EQ(m.y, untouched.y);
  EXPECT_EQ(m.ids, untouched.ids);
  EXPECT_EQ(m.flags, 0u);
}

// The regression of the stub that checked nothing and said -1 to every call: a bad
// argument is -2 here as with CUDA, checked before the -1.
TEST(CApiStubTest, InvalidArgumentsAreRefusedAsWithCuda) {
  EXPECT_EQ(stepgraph_add(nullptr, nullptr, nullptr, 0, 99, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_matmul(nullptr, nullptr, nullptr, nullptr, 100, -1, 0, -1, nullptr),
            kInvalid);
  EXPECT_EQ(stepgraph_attention_workspace_bytes(0, 0, 0, 0, 0, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_sample(nullptr, nullptr, nullptr, nullptr, -1, 0, -1.0f, -1, 2.0f, 7,
                             nullptr),
            kInvalid);
  EXPECT_EQ(stepgraph_advance(nullptr, -5, nullptr), kInvalid);
  // One bad argument among valid ones, which alone get -1.
  Buffers m;
  EXPECT_EQ(stepgraph_add(m.a.data(), m.b.data(), m.y.data(), 64, STEPGRAPH_F32, nullptr),
            kNoCuda);
  EXPECT_EQ(stepgraph_add(m.a.data(), m.b.data(), m.y.data(), 64, 42, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_sample(m.a.data(), m.ids.data(), m.ids.data(), m.ids.data() + 8, 4, 64,
                             1.0f, 0, 1.5f, STEPGRAPH_F32, nullptr),
            kInvalid);
}

TEST(CApiStubTest, CallsFromCWithANullAreRefused) {
  int32_t codes[64];
  const int n = sg_c_api_null_pointer_calls(codes, 64);
  EXPECT_EQ(n, sg_c_api_device_function_count());
  for (int i = 0; i < n; ++i) EXPECT_EQ(codes[i], kInvalid) << "call " << i;
}

}  // namespace
}  // namespace sg::testing
