// The C ABI's argument checks, in both builds (with CUDA and without): every entry point
// refuses each bad argument (null or misaligned pointer, zero, negative or too large size,
// bad dims, bad dtype or parameter) with -2 before it looks for a device, so these run
// everywhere, CI included; without a device (and always in the build without CUDA) the
// same calls with valid arguments get -1, which shows that each refusal is the bad
// argument's. Nothing here touches memory: the pointers are fake.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "stepgraph/c_api/c_api.h"
#include "tests/c_api/header_check.h"

namespace sg::testing {
namespace {

constexpr int32_t kNoCuda = STEPGRAPH_ERROR_NO_CUDA;
constexpr int32_t kInvalid = STEPGRAPH_ERROR_INVALID_VALUE;
constexpr int32_t kFloatDTypes[] = {STEPGRAPH_F32, STEPGRAPH_BF16, STEPGRAPH_F16};
constexpr int64_t kTooMany = STEPGRAPH_MAX_ELEMENTS + 1;

// Asked of the library itself, so that the build without CUDA (which has no CUDA runtime
// to ask) answers "no device" too.
bool HasDevice() {
  int64_t bytes = 0;
  return stepgraph_argmax_workspace_bytes(1, 64, &bytes) == STEPGRAPH_OK;
}

// Distinct, 256-byte aligned addresses standing for device buffers in calls that must be
// refused before any launch; never dereferenced.
template <typename T = void>
T* Fake(int i) {
  return reinterpret_cast<T*>(uintptr_t{0x10000000} + static_cast<uintptr_t>(i) * 0x10000);
}

template <typename T>
T* Shifted(T* p, int bytes) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) + bytes);
}

template <typename Call>
using Breaks = std::vector<std::pair<std::string, std::function<void(Call&)>>>;

// `valid` holds a call with valid arguments; each break spoils one of them, and every
// spoiled call must be refused with -2. Without a device the valid call must get -1 (with
// one it would launch on the fake addresses, so it is not made): then each refusal is down
// to the spoiled argument and nothing else.
template <typename Call>
void ExpectRefusals(const Call& valid, const Breaks<Call>& breaks) {
  if (!HasDevice()) {
    EXPECT_EQ(valid(), kNoCuda) << "the valid call";
  }
  for (const auto& [what, spoil] : breaks) {
    Call c = valid;
    spoil(c);
    EXPECT_EQ(c(), kInvalid) << what;
  }
}

template <typename Call>
void AddDTypeBreaks(Breaks<Call>& breaks, bool i32_allowed) {
  breaks.push_back({"dtype 4", [](Call& c) { c.dtype = 4; }});
  breaks.push_back({"dtype -1", [](Call& c) { c.dtype = -1; }});
  if (!i32_allowed) breaks.push_back({"dtype i32", [](Call& c) { c.dtype = STEPGRAPH_I32; }});
}

struct EmbeddingCall {
  const void* table = Fake(0);
  const int32_t* ids = Fake<int32_t>(1);
  void* out = Fake(2);
  int64_t rows = 8, vocab = 1000, hidden = 256;
  int32_t dtype = STEPGRAPH_BF16;
  uint32_t* flags = Fake<uint32_t>(3);
  int32_t operator()() const {
    return stepgraph_embedding(table, ids, out, rows, vocab, hidden, dtype, flags, nullptr);
  }
};

TEST(CApiArgumentsTest, Embedding) {
  using C = EmbeddingCall;
  Breaks<C> b = {
      {"null table", [](C& c) { c.table = nullptr; }},
      {"null ids", [](C& c) { c.ids = nullptr; }},
      {"null out", [](C& c) { c.out = nullptr; }},
      {"null flags", [](C& c) { c.flags = nullptr; }},
      {"misaligned table", [](C& c) { c.table = Shifted(c.table, 1); }},
      {"misaligned ids", [](C& c) { c.ids = Shifted(c.ids, 2); }},
      {"misaligned out", [](C& c) { c.out = Shifted(c.out, 1); }},
      {"misaligned flags", [](C& c) { c.flags = Shifted(c.flags, 2); }},
      {"rows 0", [](C& c) { c.rows = 0; }},
      {"rows -1", [](C& c) { c.rows = -1; }},
      {"rows 65536", [](C& c) { c.rows = 65536; }},
      {"vocab 0", [](C& c) { c.vocab = 0; }},
      {"hidden -4", [](C& c) { c.hidden = -4; }},
      {"table too large", [](C& c) { c.vocab = kTooMany; }},
      {"table overflowing int64", [](C& c) { c.vocab = c.hidden = int64_t{1} << 40; }},
  };
  AddDTypeBreaks(b, false);
  ExpectRefusals(C{}, b);
}

struct MatmulCall {
  const void* x = Fake(0);
  const void* w = Fake(1);
  const void* bias = Fake(2);
  void* y = Fake(3);
  int64_t m = 8, n = 1000, k = 512;
  int32_t dtype = STEPGRAPH_F16;
  int32_t operator()() const { return stepgraph_matmul(x, w, bias, y, m, n, k, dtype, nullptr); }
};

TEST(CApiArgumentsTest, Matmul) {
  using C = MatmulCall;
  Breaks<C> b = {
      {"null x", [](C& c) { c.x = nullptr; }},
      {"null w", [](C& c) { c.w = nullptr; }},
      {"null y", [](C& c) { c.y = nullptr; }},
      {"misaligned x", [](C& c) { c.x = Shifted(c.x, 1); }},
      {"misaligned bias", [](C& c) { c.bias = Shifted(c.bias, 1); }},
      {"m 0", [](C& c) { c.m = 0; }},
      {"m above the small-M kernel's", [](C& c) { c.m = STEPGRAPH_MATMUL_MAX_ROWS + 1; }},
      {"m 64", [](C& c) { c.m = 64; }},
      {"n 0", [](C& c) { c.n = 0; }},
      {"k -1", [](C& c) { c.k = -1; }},
      {"w too large", [](C& c) { c.n = kTooMany; }},
  };
  AddDTypeBreaks(b, false);
  ExpectRefusals(C{}, b);
  // bias is optional.
  C no_bias;
  no_bias.bias = nullptr;
  if (!HasDevice()) {
    EXPECT_EQ(no_bias(), kNoCuda);
  }
}

struct RmsNormCall {
  const void* x = Fake(0);
  const void* w = Fake(1);
  void* y = Fake(2);
  int64_t rows = 4, hidden = 2048;
  float eps = 1e-5f;
  int32_t dtype = STEPGRAPH_F32;
  int32_t operator()() const {
    return stepgraph_rmsnorm(x, w, y, rows, hidden, eps, dtype, nullptr);
  }
};

TEST(CApiArgumentsTest, RmsNorm) {
  using C = RmsNormCall;
  Breaks<C> b = {
      {"null x", [](C& c) { c.x = nullptr; }},
      {"null weight", [](C& c) { c.w = nullptr; }},
      {"null y", [](C& c) { c.y = nullptr; }},
      {"misaligned y", [](C& c) { c.y = Shifted(c.y, 2); }},
      {"rows 0", [](C& c) { c.rows = 0; }},
      {"hidden -1", [](C& c) { c.hidden = -1; }},
      {"too large", [](C& c) { c.rows = kTooMany; }},
      {"eps -1", [](C& c) { c.eps = -1.0f; }},
      {"eps nan", [](C& c) { c.eps = std::numeric_limits<float>::quiet_NaN(); }},
      {"eps inf", [](C& c) { c.eps = std::numeric_limits<float>::infinity(); }},
  };
  AddDTypeBreaks(b, false);
  ExpectRefusals(C{}, b);
}

// add, mul, silu_mul (silu is the same with one input).
struct BinaryCall {
  int32_t (*fn)(const void*, const void*, void*, int64_t, int32_t, void*) = nullptr;
  const void* a = Fake(0);
  const void* b = Fake(1);
  void* y = Fake(2);
  int64_t n = 10007;
  int32_t dtype = STEPGRAPH_BF16;
  int32_t operator()() const { return fn(a, b, y, n, dtype, nullptr); }
};

TEST(CApiArgumentsTest, Elementwise) {
  using C = BinaryCall;
  for (const auto& [name, fn] : {std::pair{"add", &stepgraph_add}, std::pair{"mul", &stepgraph_mul},
                                 std::pair{"silu_mul", &stepgraph_silu_mul}}) {
    SCOPED_TRACE(name);
    C valid;
    valid.fn = fn;
    Breaks<C> b = {
        {"null a", [](C& c) { c.a = nullptr; }},
        {"null b", [](C& c) { c.b = nullptr; }},
        {"null y", [](C& c) { c.y = nullptr; }},
        {"misaligned a", [](C& c) { c.a = Shifted(c.a, 1); }},
        {"misaligned y", [](C& c) { c.y = Shifted(c.y, 1); }},
        {"n 0", [](C& c) { c.n = 0; }},
        {"n -5", [](C& c) { c.n = -5; }},
        {"n too large", [](C& c) { c.n = kTooMany; }},
        {"n max int64", [](C& c) { c.n = std::numeric_limits<int64_t>::max(); }},
    };
    AddDTypeBreaks(b, fn == &stepgraph_add);
    ExpectRefusals(valid, b);
  }
  C add_i32;
  add_i32.fn = &stepgraph_add;
  add_i32.dtype = STEPGRAPH_I32;
  if (!HasDevice()) {
    EXPECT_EQ(add_i32(), kNoCuda) << "add takes i32";
  }
  add_i32.a = Shifted(add_i32.a, 2);
  EXPECT_EQ(add_i32(), kInvalid) << "i32 needs 4-byte alignment";

  // silu and copy: one input.
  const void* x = Fake(0);
  void* y = Fake(1);
  EXPECT_EQ(stepgraph_silu(nullptr, y, 64, STEPGRAPH_F32, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_silu(x, nullptr, 64, STEPGRAPH_F32, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_silu(x, y, 0, STEPGRAPH_F32, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_silu(x, y, 64, STEPGRAPH_I32, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_silu(x, Shifted(y, 1), 64, STEPGRAPH_F16, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_copy(nullptr, y, 64, STEPGRAPH_I32, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_copy(x, nullptr, 64, STEPGRAPH_I32, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_copy(x, y, -64, STEPGRAPH_I32, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_copy(x, y, 64, 9, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_copy(Shifted(x, 2), y, 64, STEPGRAPH_F32, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_advance(nullptr, 8, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_advance(Fake<int32_t>(0), 0, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_advance(Shifted(Fake<int32_t>(0), 1), 8, nullptr), kInvalid);
  // scale: silu's rules and a finite alpha.
  EXPECT_EQ(stepgraph_scale(nullptr, y, 64, 2.0f, STEPGRAPH_F32, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_scale(x, nullptr, 64, 2.0f, STEPGRAPH_F32, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_scale(x, y, 0, 2.0f, STEPGRAPH_F32, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_scale(x, y, kTooMany, 2.0f, STEPGRAPH_F32, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_scale(x, y, 64, 2.0f, STEPGRAPH_I32, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_scale(x, Shifted(y, 1), 64, 2.0f, STEPGRAPH_BF16, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_scale(x, y, 64, std::nanf(""), STEPGRAPH_F32, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_scale(x, y, 64, std::numeric_limits<float>::infinity(), STEPGRAPH_F16,
                            nullptr),
            kInvalid);
  if (!HasDevice()) {
    EXPECT_EQ(stepgraph_silu(x, y, 64, STEPGRAPH_F32, nullptr), kNoCuda);
    EXPECT_EQ(stepgraph_scale(x, y, 64, -0.5f, STEPGRAPH_BF16, nullptr), kNoCuda);
    EXPECT_EQ(stepgraph_copy(x, y, 64, STEPGRAPH_I32, nullptr), kNoCuda);
    EXPECT_EQ(stepgraph_advance(Fake<int32_t>(0), 8, nullptr), kNoCuda);
  }
}

struct RopeCall {
  const void* x = Fake(0);
  const int32_t* pos = Fake<int32_t>(1);
  const float* inv_freq = Fake<float>(2);
  void* y = Fake(3);
  int64_t rows = 4, cols = 512, head_dim = 128;
  int32_t interleaved = 0;
  int32_t dtype = STEPGRAPH_BF16;
  int32_t operator()() const {
    return stepgraph_rope(x, pos, inv_freq, y, rows, cols, head_dim, interleaved, dtype, nullptr);
  }
};

TEST(CApiArgumentsTest, Rope) {
  using C = RopeCall;
  Breaks<C> b = {
      {"null x", [](C& c) { c.x = nullptr; }},
      {"null pos", [](C& c) { c.pos = nullptr; }},
      {"null inv_freq", [](C& c) { c.inv_freq = nullptr; }},
      {"null y", [](C& c) { c.y = nullptr; }},
      {"misaligned pos", [](C& c) { c.pos = Shifted(c.pos, 2); }},
      {"misaligned inv_freq", [](C& c) { c.inv_freq = Shifted(c.inv_freq, 2); }},
      {"rows 0", [](C& c) { c.rows = 0; }},
      {"cols -512", [](C& c) { c.cols = -512; }},
      {"head_dim 0", [](C& c) { c.head_dim = 0; }},
      {"head_dim odd", [](C& c) { c.head_dim = 127; }},
      {"cols not a multiple of head_dim", [](C& c) { c.cols = 500; }},
      {"interleaved 2", [](C& c) { c.interleaved = 2; }},
      // Regression: head_dim was narrowed to int unchecked, so 2^32 + 128 became 128.
      {"head_dim 2^32 + 128",
       [](C& c) {
         c.rows = 1;
         c.cols = c.head_dim = (int64_t{1} << 32) + 128;
       }},
      {"head_dim above 65536",
       [](C& c) {
         c.rows = 1;
         c.cols = c.head_dim = (1 << 16) + 2;
       }},
      {"interleaved -1", [](C& c) { c.interleaved = -1; }},
  };
  AddDTypeBreaks(b, false);
  ExpectRefusals(C{}, b);
}

struct KvWriteCall {
  const void* kv = Fake(0);
  const int32_t* pos = Fake<int32_t>(1);
  void* cache = Fake(2);
  int64_t rows = 3, slots = 4, kv_heads = 2, seq_len = 64, head_dim = 128;
  int32_t dtype = STEPGRAPH_F16;
  uint32_t* flags = Fake<uint32_t>(3);
  int32_t operator()() const {
    return stepgraph_kv_write(kv, pos, cache, rows, slots, kv_heads, seq_len, head_dim, dtype,
                              flags, nullptr);
  }
};

TEST(CApiArgumentsTest, KvWrite) {
  using C = KvWriteCall;
  Breaks<C> b = {
      {"null kv", [](C& c) { c.kv = nullptr; }},
      {"null pos", [](C& c) { c.pos = nullptr; }},
      {"null cache", [](C& c) { c.cache = nullptr; }},
      {"null flags", [](C& c) { c.flags = nullptr; }},
      {"misaligned cache", [](C& c) { c.cache = Shifted(c.cache, 1); }},
      {"rows 0", [](C& c) { c.rows = 0; }},
      {"fewer slots than rows", [](C& c) { c.slots = 2; }},
      {"kv_heads 0", [](C& c) { c.kv_heads = 0; }},
      {"seq_len -1", [](C& c) { c.seq_len = -1; }},
      {"head_dim 0", [](C& c) { c.head_dim = 0; }},
      {"cache too large", [](C& c) { c.seq_len = int64_t{1} << 32; }},
  };
  AddDTypeBreaks(b, false);
  ExpectRefusals(C{}, b);
}

struct AttentionCall {
  const void* q = Fake(0);
  const void* k = Fake(1);
  const void* v = Fake(2);
  const int32_t* pos = Fake<int32_t>(3);
  void* out = Fake(4);
  int64_t rows = 4, heads = 8, kv_heads = 2, slots = 4, seq_len = 1024, head_dim = 128;
  float scale = 0.088f;
  int32_t dtype = STEPGRAPH_BF16;
  void* workspace = Fake(5);
  int64_t workspace_bytes = 1 << 20;
  uint32_t* flags = Fake<uint32_t>(6);
  int32_t operator()() const {
    return stepgraph_attention(q, k, v, pos, out, rows, heads, kv_heads, slots, seq_len, head_dim,
                               scale, dtype, workspace, workspace_bytes, flags, nullptr);
  }
};

TEST(CApiArgumentsTest, Attention) {
  using C = AttentionCall;
  Breaks<C> b = {
      {"null q", [](C& c) { c.q = nullptr; }},
      {"null k_cache", [](C& c) { c.k = nullptr; }},
      {"null v_cache", [](C& c) { c.v = nullptr; }},
      {"null pos", [](C& c) { c.pos = nullptr; }},
      {"null out", [](C& c) { c.out = nullptr; }},
      {"null flags", [](C& c) { c.flags = nullptr; }},
      {"q not pair aligned", [](C& c) { c.q = Shifted(c.q, 2); }},
      {"v_cache not pair aligned", [](C& c) { c.v = Shifted(c.v, 2); }},
      {"out not pair aligned", [](C& c) { c.out = Shifted(c.out, 2); }},
      {"misaligned workspace", [](C& c) { c.workspace = Shifted(c.workspace, 8); }},
      {"workspace bytes without a workspace", [](C& c) { c.workspace = nullptr; }},
      {"negative workspace bytes", [](C& c) { c.workspace_bytes = -1; }},
      {"rows 0", [](C& c) { c.rows = 0; }},
      {"rows 65536", [](C& c) { c.rows = c.slots = 65536; }},
      {"fewer slots than rows", [](C& c) { c.slots = 3; }},
      {"heads not a multiple of kv_heads", [](C& c) { c.heads = 7; }},
      {"kv_heads 0", [](C& c) { c.kv_heads = 0; }},
      {"seq_len 0", [](C& c) { c.seq_len = 0; }},
      {"head_dim odd", [](C& c) { c.head_dim = 127; }},
      {"head_dim above the maximum",
       [](C& c) { c.head_dim = STEPGRAPH_ATTENTION_MAX_HEAD_DIM + 2; }},
      {"seq_len beyond int", [](C& c) { c.seq_len = int64_t{1} << 31; }},
      {"scale nan", [](C& c) { c.scale = std::numeric_limits<float>::quiet_NaN(); }},
      {"scale inf", [](C& c) { c.scale = -std::numeric_limits<float>::infinity(); }},
  };
  AddDTypeBreaks(b, false);
  ExpectRefusals(C{}, b);
  C no_workspace;
  no_workspace.workspace = nullptr;
  no_workspace.workspace_bytes = 0;
  if (!HasDevice()) {
    EXPECT_EQ(no_workspace(), kNoCuda) << "the workspace is optional";
  }
}

TEST(CApiArgumentsTest, WorkspaceQueries) {
  int64_t bytes = -7;
  EXPECT_EQ(stepgraph_attention_workspace_bytes(4, 8, 2, 1024, 128, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_attention_workspace_bytes(0, 8, 2, 1024, 128, &bytes), kInvalid);
  EXPECT_EQ(stepgraph_attention_workspace_bytes(4, 7, 2, 1024, 128, &bytes), kInvalid);
  EXPECT_EQ(stepgraph_attention_workspace_bytes(4, 8, 2, -1, 128, &bytes), kInvalid);
  EXPECT_EQ(stepgraph_attention_workspace_bytes(4, 8, 2, 1024, 129, &bytes), kInvalid);
  EXPECT_EQ(stepgraph_attention_workspace_bytes(4, 8, 2, 1024, 512, &bytes), kInvalid);
  EXPECT_EQ(stepgraph_argmax_workspace_bytes(4, 1000, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_argmax_workspace_bytes(0, 1000, &bytes), kInvalid);
  EXPECT_EQ(stepgraph_argmax_workspace_bytes(65536, 1000, &bytes), kInvalid);
  EXPECT_EQ(stepgraph_argmax_workspace_bytes(4, int64_t{1} << 31, &bytes), kInvalid);
  EXPECT_EQ(bytes, -7) << "a refused query wrote its result";
  if (!HasDevice()) {
    EXPECT_EQ(stepgraph_attention_workspace_bytes(4, 8, 2, 1024, 128, &bytes), kNoCuda);
    EXPECT_EQ(stepgraph_argmax_workspace_bytes(4, 1000, &bytes), kNoCuda);
    EXPECT_EQ(bytes, -7);
  }
}

struct SoftmaxCall {
  const void* x = Fake(0);
  void* y = Fake(1);
  int64_t rows = 4, n = 32000;
  int32_t dtype = STEPGRAPH_F32;
  int32_t operator()() const { return stepgraph_softmax(x, y, rows, n, dtype, nullptr); }
};

TEST(CApiArgumentsTest, Softmax) {
  using C = SoftmaxCall;
  Breaks<C> b = {
      {"null x", [](C& c) { c.x = nullptr; }},
      {"null y", [](C& c) { c.y = nullptr; }},
      {"misaligned x", [](C& c) { c.x = Shifted(c.x, 2); }},
      {"rows 0", [](C& c) { c.rows = 0; }},
      {"n -1", [](C& c) { c.n = -1; }},
      {"too large", [](C& c) { c.n = kTooMany; }},
  };
  AddDTypeBreaks(b, false);
  ExpectRefusals(C{}, b);
}

struct ArgmaxCall {
  const void* logits = Fake(0);
  int32_t* ids = Fake<int32_t>(1);
  int64_t rows = 4, vocab = 128000;
  int32_t dtype = STEPGRAPH_BF16;
  void* workspace = Fake(2);
  int64_t workspace_bytes = 4096;
  int32_t operator()() const {
    return stepgraph_argmax(logits, ids, rows, vocab, dtype, workspace, workspace_bytes, nullptr);
  }
};

TEST(CApiArgumentsTest, Argmax) {
  using C = ArgmaxCall;
  Breaks<C> b = {
      {"null logits", [](C& c) { c.logits = nullptr; }},
      {"null ids", [](C& c) { c.ids = nullptr; }},
      {"misaligned logits", [](C& c) { c.logits = Shifted(c.logits, 1); }},
      {"misaligned ids", [](C& c) { c.ids = Shifted(c.ids, 2); }},
      {"misaligned workspace", [](C& c) { c.workspace = Shifted(c.workspace, 4); }},
      {"workspace bytes without a workspace", [](C& c) { c.workspace = nullptr; }},
      {"negative workspace bytes", [](C& c) { c.workspace_bytes = -16; }},
      {"rows 0", [](C& c) { c.rows = 0; }},
      {"rows 65536", [](C& c) { c.rows = 65536; }},
      {"vocab 0", [](C& c) { c.vocab = 0; }},
      {"vocab 2^31",
       [](C& c) {
         c.rows = 1;
         c.vocab = int64_t{1} << 31;
       }},
  };
  AddDTypeBreaks(b, false);
  ExpectRefusals(C{}, b);
}

struct SampleCall {
  const void* logits = Fake(0);
  const int32_t* seeds = Fake<int32_t>(1);
  const int32_t* pos = Fake<int32_t>(2);
  int32_t* ids = Fake<int32_t>(3);
  int64_t rows = 4, vocab = 32000;
  float temperature = 0.7f;
  int32_t top_k = 50;
  float top_p = 0.9f;
  int32_t dtype = STEPGRAPH_F16;
  int32_t operator()() const {
    return stepgraph_sample(logits, seeds, pos, ids, rows, vocab, temperature, top_k, top_p, dtype,
                            nullptr);
  }
};

TEST(CApiArgumentsTest, Sample) {
  using C = SampleCall;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  Breaks<C> b = {
      {"null logits", [](C& c) { c.logits = nullptr; }},
      {"null seeds", [](C& c) { c.seeds = nullptr; }},
      {"null pos", [](C& c) { c.pos = nullptr; }},
      {"null ids", [](C& c) { c.ids = nullptr; }},
      {"misaligned seeds", [](C& c) { c.seeds = Shifted(c.seeds, 1); }},
      {"rows 0", [](C& c) { c.rows = 0; }},
      {"vocab -1", [](C& c) { c.vocab = -1; }},
      {"vocab 2^31",
       [](C& c) {
         c.rows = 1;
         c.vocab = int64_t{1} << 31;
       }},
      {"temperature 0", [](C& c) { c.temperature = 0.0f; }},
      {"temperature -1", [](C& c) { c.temperature = -1.0f; }},
      {"temperature nan", [=](C& c) { c.temperature = nan; }},
      {"temperature inf", [=](C& c) { c.temperature = inf; }},
      {"top_k -1", [](C& c) { c.top_k = -1; }},
      {"top_p 0", [](C& c) { c.top_p = 0.0f; }},
      {"top_p 1.5", [](C& c) { c.top_p = 1.5f; }},
      {"top_p nan", [=](C& c) { c.top_p = nan; }},
  };
  AddDTypeBreaks(b, false);
  ExpectRefusals(C{}, b);
}

// The same calls made from C code (header_check.c): all refused.
TEST(CApiArgumentsTest, CallsFromCAreRefused) {
  int32_t codes[64];
  const int n = sg_c_api_null_pointer_calls(codes, 64);
  EXPECT_EQ(n, sg_c_api_device_function_count()) << "one call per device function";
  for (int i = 0; i < n; ++i) EXPECT_EQ(codes[i], kInvalid) << "call " << i;
}

// The training functions: each bad argument is -2 in both builds, each valid call -1
// without a device.
TEST(CApiArgumentsTest, Training) {
  const void* logits = Fake(0);
  const int32_t* targets = Fake<int32_t>(1);
  float* loss = Fake<float>(2);
  void* lp = Fake(3);
  uint32_t* flags = Fake<uint32_t>(4);
  auto ce = [&](const void* l, const int32_t* t, float* o, void* p, int64_t rows, int64_t vocab,
                int32_t dtype, uint32_t* f) {
    return stepgraph_cross_entropy(l, t, o, p, rows, vocab, -100, dtype, f, nullptr);
  };
  EXPECT_EQ(ce(nullptr, targets, loss, lp, 4, 100, STEPGRAPH_F32, flags), kInvalid);
  EXPECT_EQ(ce(logits, nullptr, loss, lp, 4, 100, STEPGRAPH_F32, flags), kInvalid);
  EXPECT_EQ(ce(logits, targets, nullptr, lp, 4, 100, STEPGRAPH_F32, flags), kInvalid);
  EXPECT_EQ(ce(logits, targets, loss, lp, 4, 100, STEPGRAPH_F32, nullptr), kInvalid);
  EXPECT_EQ(ce(logits, targets, loss, lp, 0, 100, STEPGRAPH_F32, flags), kInvalid);
  EXPECT_EQ(ce(logits, targets, loss, lp, 4, -1, STEPGRAPH_F32, flags), kInvalid);
  EXPECT_EQ(ce(logits, targets, loss, lp, 4, int64_t{1} << 31, STEPGRAPH_F32, flags), kInvalid);
  EXPECT_EQ(ce(logits, targets, loss, lp, 1 << 20, 1 << 20, STEPGRAPH_F32, flags), kInvalid);
  EXPECT_EQ(ce(logits, targets, loss, lp, 4, 100, STEPGRAPH_I32, flags), kInvalid);
  EXPECT_EQ(ce(logits, targets, loss, Shifted(lp, 1), 4, 100, STEPGRAPH_BF16, flags), kInvalid);
  EXPECT_EQ(ce(logits, Shifted(targets, 2), loss, lp, 4, 100, STEPGRAPH_F32, flags), kInvalid);
  // The backward's dlogits is required.
  EXPECT_EQ(stepgraph_cross_entropy_backward(logits, targets, loss, nullptr, 4, 100, -100,
                                             STEPGRAPH_F32, flags, nullptr),
            kInvalid);

  auto moe = [&](int64_t tokens, int64_t experts, int64_t top_k, int32_t dtype) {
    return stepgraph_moe_aux_loss(logits, targets, loss, tokens, experts, top_k, dtype, flags,
                                  nullptr);
  };
  EXPECT_EQ(moe(0, 8, 2, STEPGRAPH_F32), kInvalid);
  EXPECT_EQ(moe(10, STEPGRAPH_MOE_MAX_EXPERTS + 1, 2, STEPGRAPH_F32), kInvalid);
  EXPECT_EQ(moe(10, 8, 0, STEPGRAPH_F32), kInvalid);
  EXPECT_EQ(moe(10, 8, 9, STEPGRAPH_F32), kInvalid);
  EXPECT_EQ(moe(10, 8, 2, STEPGRAPH_I32), kInvalid);
  EXPECT_EQ(stepgraph_moe_aux_loss(logits, targets, nullptr, 10, 8, 2, STEPGRAPH_F32, flags,
                                   nullptr),
            kInvalid);

  float* p = Fake<float>(5);
  float* m = Fake<float>(6);
  float* v = Fake<float>(7);
  const void* g = Fake(8);
  struct Adam {
    float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
    int64_t step = 1, n = 64;
    int32_t dtype = STEPGRAPH_BF16;
  };
  auto adam = [&](Adam a, float* param = nullptr) {
    return stepgraph_adamw_step(param != nullptr ? param : p, g, m, v, a.n, a.lr, a.b1, a.b2,
                                a.eps, a.wd, a.step, a.dtype, nullptr);
  };
  const float nan = std::nanf("");
  const float inf = std::numeric_limits<float>::infinity();
  for (const auto& [what, a] : std::vector<std::pair<const char*, Adam>>{
           {"lr < 0", {.lr = -1e-3f}},
           {"lr NaN", {.lr = nan}},
           {"beta1 = 1", {.b1 = 1.0f}},
           {"beta2 < 0", {.b2 = -0.1f}},
           {"eps inf", {.eps = inf}},
           {"wd < 0", {.wd = -0.5f}},
           {"step 0", {.step = 0}},
           {"n 0", {.n = 0}},
           {"i32 grad", {.dtype = STEPGRAPH_I32}}}) {
    EXPECT_EQ(adam(a), kInvalid) << what;
  }
  EXPECT_EQ(adam(Adam{}, Shifted(p, 2)), kInvalid) << "misaligned param";
  EXPECT_EQ(stepgraph_adamw_step(p, nullptr, m, v, 64, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1,
                                 STEPGRAPH_F32, nullptr),
            kInvalid);

  void* grads[2] = {Fake(9), Fake(10)};
  const int64_t sizes[2] = {100, 7};
  const int64_t bad_sizes[2] = {100, 0};
  float* norm = Fake<float>(11);
  EXPECT_EQ(stepgraph_clip_grad_norm(nullptr, sizes, 2, 1.0f, STEPGRAPH_F32, norm, nullptr),
            kInvalid);
  EXPECT_EQ(stepgraph_clip_grad_norm(grads, nullptr, 2, 1.0f, STEPGRAPH_F32, norm, nullptr),
            kInvalid);
  EXPECT_EQ(stepgraph_clip_grad_norm(grads, sizes, 0, 1.0f, STEPGRAPH_F32, norm, nullptr),
            kInvalid);
  EXPECT_EQ(stepgraph_clip_grad_norm(grads, bad_sizes, 2, 1.0f, STEPGRAPH_F32, norm, nullptr),
            kInvalid);
  EXPECT_EQ(stepgraph_clip_grad_norm(grads, sizes, 2, 0.0f, STEPGRAPH_F32, norm, nullptr),
            kInvalid);
  EXPECT_EQ(stepgraph_clip_grad_norm(grads, sizes, 2, nan, STEPGRAPH_F32, norm, nullptr),
            kInvalid);
  EXPECT_EQ(stepgraph_clip_grad_norm(grads, sizes, 2, 1.0f, STEPGRAPH_F32, nullptr, nullptr),
            kInvalid);
  void* misaligned[2] = {Fake(9), Shifted(Fake(10), 2)};
  EXPECT_EQ(stepgraph_clip_grad_norm(misaligned, sizes, 2, 1.0f, STEPGRAPH_F32, norm, nullptr),
            kInvalid);

  if (!HasDevice()) {
    EXPECT_EQ(ce(logits, targets, loss, nullptr, 4, 100, STEPGRAPH_F16, flags), kNoCuda);
    EXPECT_EQ(stepgraph_cross_entropy_backward(logits, targets, loss, lp, 4, 100, -100,
                                               STEPGRAPH_F32, flags, nullptr),
              kNoCuda);
    EXPECT_EQ(moe(10, 8, 8, STEPGRAPH_BF16), kNoCuda);
    EXPECT_EQ(adam(Adam{}), kNoCuda);
    EXPECT_EQ(stepgraph_clip_grad_norm(grads, sizes, 2, 1.0f, STEPGRAPH_F16, norm, nullptr),
              kNoCuda);
  }
}

TEST(CApiArgumentsTest, Gemm) {
  struct C {
    const void* a = Fake(0);
    const void* b = Fake(1);
    void* c = Fake(2);
    int64_t batch = 3, m = 16, n = 24, k = 32;
    int64_t stride_a = 16 * 32, stride_b = 0, stride_c = 16 * 24;
    int32_t trans_a = 0, trans_b = 1;
    float alpha = 1.0f, beta = 0.5f;
    int32_t dtype = STEPGRAPH_BF16;
    void* workspace = Fake(3);
    int64_t workspace_bytes = 1 << 20;
  };
  auto single = [](const C& c) {
    return stepgraph_gemm(c.a, c.b, c.c, c.m, c.n, c.k, c.trans_a, c.trans_b, c.alpha, c.beta,
                          c.dtype, c.workspace, c.workspace_bytes, nullptr);
  };
  auto batched = [](const C& c) {
    return stepgraph_gemm_batched(c.a, c.b, c.c, c.batch, c.m, c.n, c.k, c.stride_a, c.stride_b,
                                  c.stride_c, c.trans_a, c.trans_b, c.alpha, c.beta, c.dtype,
                                  c.workspace, c.workspace_bytes, nullptr);
  };
  const float nan = std::nanf("");
  const std::vector<std::pair<const char*, std::function<void(C&)>>> both = {
      {"a NULL", [](C& c) { c.a = nullptr; }},
      {"b NULL", [](C& c) { c.b = nullptr; }},
      {"c NULL", [](C& c) { c.c = nullptr; }},
      {"c misaligned", [](C& c) { c.c = Shifted(c.c, 1); }},
      {"m 0", [](C& c) { c.m = 0; }},
      {"n -1", [](C& c) { c.n = -1; }},
      {"k 2^31", [](C& c) { c.k = int64_t{1} << 31; }},
      {"m · k too many", [](C& c) { c.m = int64_t{1} << 20; c.k = int64_t{1} << 20; }},
      {"trans_a 2", [](C& c) { c.trans_a = 2; }},
      {"trans_b -1", [](C& c) { c.trans_b = -1; }},
      {"alpha NaN", [=](C& c) { c.alpha = nan; }},
      {"beta inf", [](C& c) { c.beta = std::numeric_limits<float>::infinity(); }},
      {"dtype i32", [](C& c) { c.dtype = STEPGRAPH_I32; }},
      {"workspace misaligned", [](C& c) { c.workspace = Shifted(c.workspace, 16); }},
      {"workspace NULL with bytes", [](C& c) { c.workspace = nullptr; }},
      {"workspace bytes < 0", [](C& c) { c.workspace_bytes = -1; }},
  };
  const std::vector<std::pair<const char*, std::function<void(C&)>>> batch_only = {
      {"batch 0", [](C& c) { c.batch = 0; }},
      {"stride_a < 0", [](C& c) { c.stride_a = -1; }},
      {"stride_c overlaps", [](C& c) { c.stride_c = 16 * 24 - 1; }},
      {"extent past the bound", [](C& c) { c.stride_a = int64_t{1} << 35; }},
  };
  if (!HasDevice()) {
    EXPECT_EQ(single(C{}), kNoCuda);
    EXPECT_EQ(batched(C{}), kNoCuda);
    C no_ws;
    no_ws.workspace = nullptr;
    no_ws.workspace_bytes = 0;
    EXPECT_EQ(single(no_ws), kNoCuda);
  }
  for (const auto& [what, spoil] : both) {
    C c;
    spoil(c);
    EXPECT_EQ(single(c), kInvalid) << what;
    EXPECT_EQ(batched(c), kInvalid) << what;
  }
  for (const auto& [what, spoil] : batch_only) {
    C c;
    spoil(c);
    EXPECT_EQ(batched(c), kInvalid) << what;
  }
}

TEST(CApiArgumentsTest, TopkAndFlashAttention) {
  const void* x = Fake(0);
  void* values = Fake(1);
  int32_t* indices = Fake<int32_t>(2);
  auto topk = [&](int64_t rows, int64_t n, int64_t k, int32_t dtype) {
    return stepgraph_topk(x, values, indices, rows, n, k, dtype, nullptr);
  };
  EXPECT_EQ(stepgraph_topk(nullptr, values, indices, 4, 100, 8, STEPGRAPH_F32, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_topk(x, nullptr, indices, 4, 100, 8, STEPGRAPH_F32, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_topk(x, values, nullptr, 4, 100, 8, STEPGRAPH_F32, nullptr), kInvalid);
  EXPECT_EQ(stepgraph_topk(x, values, Shifted(indices, 2), 4, 100, 8, STEPGRAPH_F32, nullptr),
            kInvalid);
  EXPECT_EQ(topk(0, 100, 8, STEPGRAPH_F32), kInvalid);
  EXPECT_EQ(topk(4, 100, 0, STEPGRAPH_F32), kInvalid);
  EXPECT_EQ(topk(4, 100, 101, STEPGRAPH_F32), kInvalid) << "k > n";
  EXPECT_EQ(topk(4, 5000, STEPGRAPH_TOPK_MAX_K + 1, STEPGRAPH_F32), kInvalid);
  EXPECT_EQ(topk(4, int64_t{1} << 31, 8, STEPGRAPH_F32), kInvalid);
  EXPECT_EQ(topk(4, 100, 8, STEPGRAPH_I32), kInvalid);

  struct F {
    const void* q = Fake(3);
    const void* k = Fake(4);
    const void* v = Fake(5);
    void* out = Fake(6);
    int64_t batch = 2, seq = 17, heads = 8, kv_heads = 2, head_dim = 64;
    float scale = 0.125f;
    int32_t causal = 1, dtype = STEPGRAPH_F16;
  };
  auto fa = [](const F& f) {
    return stepgraph_flash_attention(f.q, f.k, f.v, f.out, f.batch, f.seq, f.heads, f.kv_heads,
                                     f.head_dim, f.scale, f.causal, f.dtype, nullptr);
  };
  const std::vector<std::pair<const char*, std::function<void(F&)>>> breaks = {
      {"q NULL", [](F& f) { f.q = nullptr; }},
      {"v NULL", [](F& f) { f.v = nullptr; }},
      {"out misaligned", [](F& f) { f.out = Shifted(f.out, 1); }},
      {"batch 0", [](F& f) { f.batch = 0; }},
      {"batch 65536", [](F& f) { f.batch = 65536; }},
      {"seq -1", [](F& f) { f.seq = -1; }},
      {"heads 65536", [](F& f) { f.heads = 65536; f.kv_heads = 1; }},
      {"heads not a multiple", [](F& f) { f.kv_heads = 3; }},
      {"kv_heads 0", [](F& f) { f.kv_heads = 0; }},
      {"head_dim 257", [](F& f) { f.head_dim = 257; }},
      {"scale 0", [](F& f) { f.scale = 0.0f; }},
      {"scale NaN", [](F& f) { f.scale = std::nanf(""); }},
      {"causal 2", [](F& f) { f.causal = 2; }},
      {"dtype i32", [](F& f) { f.dtype = STEPGRAPH_I32; }},
      {"too many elements", [](F& f) { f.seq = int64_t{1} << 30; }},
  };
  if (!HasDevice()) {
    EXPECT_EQ(topk(4, 100, 8, STEPGRAPH_BF16), kNoCuda);
    EXPECT_EQ(topk(1, 100, 100, STEPGRAPH_F32), kNoCuda);
    EXPECT_EQ(fa(F{}), kNoCuda);
  }
  for (const auto& [what, spoil] : breaks) {
    F f;
    spoil(f);
    EXPECT_EQ(fa(f), kInvalid) << what;
  }
}

}  // namespace
}  // namespace sg::testing
