// GraphBuilder: every kind of error it reports (the code, and a message that names the node
// and the tensors involved), sticky errors, the spent builder after Build(), auto-naming of
// unnamed nodes and the default attention scale.
#include "stepgraph/graph/builder.h"

#include <cmath>
#include <initializer_list>
#include <string>
#include <variant>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/ops.h"
#include "tests/testing/status_matchers.h"

namespace sg {
namespace {

using ::sg::testing::IsError;

// The error recorded by the builder, and the same error from Build().
::testing::AssertionResult BuildFails(GraphBuilder& b, absl::StatusCode code,
                                      std::initializer_list<absl::string_view> parts) {
  ::testing::AssertionResult recorded = IsError(b.status(), code, parts);
  if (!recorded) return recorded << " (builder status)";
  const absl::Status first = b.status();
  absl::StatusOr<Graph> g = std::move(b).Build();
  if (g.ok()) return ::testing::AssertionFailure() << "Build() succeeded after an error";
  if (g.status() != first) {
    return ::testing::AssertionFailure()
           << "Build() returned " << g.status() << " instead of the first error " << first;
  }
  return ::testing::AssertionSuccess();
}

TEST(BuilderTest, BuildsAndInfersTypes) {
  GraphBuilder b;
  const TensorId x = b.Input("x", DType::kBF16, {3, 64});
  const TensorId w = b.Weight("w", DType::kBF16, {48, 64});
  const TensorId y = b.MatMul(x, w, "proj");
  const TensorId s = b.Silu(y, "act");
  const TensorId ids = b.Argmax(s, "pick");
  b.Output("ids", ids);
  ASSERT_TRUE(b.status().ok()) << b.status();
  absl::StatusOr<Graph> g = std::move(b).Build();
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(g->Validate().ok()) << g->Validate();
  EXPECT_EQ(g->num_nodes(), 3);
  EXPECT_EQ(g->tensor(y).shape, Shape({3, 48}));
  EXPECT_EQ(g->tensor(y).dtype, DType::kBF16);
  EXPECT_EQ(g->tensor(y).kind, TensorKind::kIntermediate);
  EXPECT_EQ(g->tensor(y).name, "proj");
  EXPECT_EQ(g->tensor(ids).shape, Shape({3}));
  EXPECT_EQ(g->tensor(ids).dtype, DType::kI32);
  EXPECT_EQ(g->nodes()[2].output, ids);
  EXPECT_EQ(*g->FindOutput("ids"), ids);
  EXPECT_EQ(*g->FindTensor("act"), s);
}

TEST(BuilderTest, MatMulInnerDimMismatchNamesNodeAndTensors) {
  GraphBuilder b;
  const TensorId x = b.Input("x_in", DType::kF32, {2, 64});
  const TensorId w = b.Weight("w_proj", DType::kF32, {32, 48});
  const TensorId y = b.MatMul(x, w, "proj");
  EXPECT_FALSE(y.valid());
  EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                         {"MatMul", "'proj'", "'x_in' [2,64]", "'w_proj' [32,48]", "K=64",
                          "K=48"}));
}

TEST(BuilderTest, AddShapeMismatchNamesNodeAndTensors) {
  GraphBuilder b;
  const TensorId a = b.Input("lhs", DType::kF32, {2, 8});
  const TensorId c = b.Input("rhs", DType::kF32, {2, 9});
  EXPECT_FALSE(b.Add(a, c, "sum").valid());
  EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                         {"Add", "'sum'", "shape mismatch", "'lhs' [2,8]", "'rhs' [2,9]"}));
}

TEST(BuilderTest, RmsNormWeightLengthMismatch) {
  GraphBuilder b;
  const TensorId x = b.Input("x", DType::kF32, {1, 16});
  const TensorId w = b.Weight("norm_w", DType::kF32, {15});
  EXPECT_FALSE(b.RmsNorm(x, w, 1e-5f, "norm").valid());
  EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                         {"RmsNorm", "'norm'", "'norm_w' [15]", "'x' [1,16]"}));
}

TEST(BuilderTest, DTypeMismatchNamesNodeAndTensors) {
  {
    GraphBuilder b;
    const TensorId a = b.Input("a32", DType::kF32, {4, 8});
    const TensorId c = b.Input("a16", DType::kBF16, {4, 8});
    EXPECT_FALSE(b.Mul(a, c, "scale").valid());
    EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                           {"Mul", "'scale'", "dtype mismatch", "'a32' [4,8] f32",
                            "'a16' [4,8] bf16"}));
  }
  {
    GraphBuilder b;
    const TensorId x = b.Input("x", DType::kF16, {4, 8});
    const TensorId w = b.Weight("w", DType::kF32, {8, 8});
    EXPECT_FALSE(b.MatMul(x, w, "proj").valid());
    EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                           {"MatMul", "'proj'", "dtype mismatch", "'x' [4,8] f16",
                            "'w' [8,8] f32"}));
  }
  {
    // Token ids must be i32.
    GraphBuilder b;
    const TensorId table = b.Weight("table", DType::kF32, {100, 8});
    const TensorId ids = b.Input("ids", DType::kF32, {2});
    EXPECT_FALSE(b.Embedding(table, ids, "embed").valid());
    EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                           {"Embedding", "'embed'", "'ids' [2] f32", "i32"}));
  }
}

TEST(BuilderTest, InvalidTensorIdNamesNodeAndInput) {
  GraphBuilder b;
  const TensorId x = b.Input("x", DType::kF32, {1, 8});
  EXPECT_FALSE(b.Add(x, TensorId{}, "sum").valid());
  EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                         {"Add", "'sum'", "input 1", "invalid TensorId"}));
}

TEST(BuilderTest, OutOfRangeTensorIdOfThisBuilderIsInvalidNotForeign) {
  GraphBuilder b;
  const TensorId x = b.Input("x", DType::kF32, {1, 8});
  const TensorId beyond{x.index + 100, x.owner};
  EXPECT_FALSE(b.Silu(beyond, "act").valid());
  EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                         {"Silu", "'act'", "input 0", "invalid TensorId", "index 100"}));
}

TEST(BuilderTest, ForeignTensorIdIsRefused) {
  GraphBuilder other;
  const TensorId foreign = other.Input("x", DType::kF32, {1, 8});
  GraphBuilder b;
  const TensorId x = b.Input("x", DType::kF32, {1, 8});
  // Same index and shape: only the owner tag tells them apart.
  ASSERT_EQ(foreign.index, x.index);
  EXPECT_FALSE(b.Add(x, foreign, "sum").valid());
  EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                         {"Add", "'sum'", "input 1", "another builder"}));
}

TEST(BuilderTest, ForeignOrInvalidOutputIsRefused) {
  {
    GraphBuilder other;
    const TensorId foreign = other.Input("x", DType::kF32, {1, 8});
    GraphBuilder b;
    b.Silu(b.Input("x", DType::kF32, {1, 8}), "act");
    b.Output("result", foreign);
    EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                           {"Output 'result'", "another builder"}));
  }
  {
    GraphBuilder b;
    b.Silu(b.Input("x", DType::kF32, {1, 8}), "act");
    b.Output("result", TensorId{});
    EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                           {"Output 'result'", "invalid TensorId"}));
  }
}

TEST(BuilderTest, DuplicateTensorNames) {
  GraphBuilder b;
  b.Input("x", DType::kF32, {1, 8});
  EXPECT_FALSE(b.Weight("x", DType::kF32, {8}).valid());
  EXPECT_TRUE(
      BuildFails(b, absl::StatusCode::kInvalidArgument, {"duplicate name", "Weight 'x'"}));
}

TEST(BuilderTest, DuplicateNodeNames) {
  {
    GraphBuilder b;
    const TensorId x = b.Input("x", DType::kF32, {1, 8});
    const TensorId a = b.Silu(x, "act");
    EXPECT_TRUE(a.valid());
    EXPECT_FALSE(b.Add(a, x, "act").valid());
    EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                           {"duplicate name", "Add node 'act'"}));
  }
  {
    // A node may not take the name of a bound tensor either: node names are tensor names.
    GraphBuilder b;
    const TensorId x = b.Input("x", DType::kF32, {1, 8});
    b.State("cache", DType::kF32, {1, 8});
    EXPECT_FALSE(b.Silu(x, "cache").valid());
    EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                           {"duplicate name", "Silu node 'cache'"}));
  }
  {
    // In-place nodes produce no tensor but their names are still taken.
    GraphBuilder b;
    const TensorId x = b.Input("x", DType::kF32, {1, 8});
    const TensorId dst = b.State("dst", DType::kF32, {1, 8});
    const TensorId dst2 = b.State("dst2", DType::kF32, {1, 8});
    EXPECT_TRUE(b.Copy(x, dst, "feed").valid());
    EXPECT_FALSE(b.Copy(x, dst2, "feed").valid());
    EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                           {"duplicate name", "Copy node 'feed'"}));
  }
}

TEST(BuilderTest, DuplicateOutputNamesNameBothTensors) {
  GraphBuilder b;
  const TensorId x = b.Input("x", DType::kF32, {1, 8});
  const TensorId a = b.Silu(x, "first");
  const TensorId c = b.Silu(a, "second");
  b.Output("result", a);
  b.Output("result", c);
  EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                         {"duplicate output name 'result'", "'first'", "'second'"}));
}

TEST(BuilderTest, OneTensorMayBeTwoOutputs) {
  GraphBuilder b;
  const TensorId a = b.Silu(b.Input("x", DType::kF32, {1, 8}), "act");
  b.Output("one", a);
  b.Output("two", a);
  absl::StatusOr<Graph> g = std::move(b).Build();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->outputs().size(), 2u);
}

TEST(BuilderTest, InvalidShapesAndEmptyNames) {
  {
    GraphBuilder b;
    EXPECT_FALSE(b.Input("zero_dim", DType::kF32, {4, 0}).valid());
    EXPECT_TRUE(
        BuildFails(b, absl::StatusCode::kInvalidArgument, {"'zero_dim'", "invalid shape"}));
  }
  {
    GraphBuilder b;
    EXPECT_FALSE(b.Weight("rank5", DType::kF32, {1, 2, 3, 4, 5}).valid());
    EXPECT_TRUE(
        BuildFails(b, absl::StatusCode::kInvalidArgument, {"'rank5'", "invalid shape"}));
  }
  {
    GraphBuilder b;
    EXPECT_FALSE(b.Input("scalar", DType::kF32, {}).valid());
    EXPECT_TRUE(
        BuildFails(b, absl::StatusCode::kInvalidArgument, {"'scalar'", "invalid shape"}));
  }
  {
    GraphBuilder b;
    EXPECT_FALSE(b.State("", DType::kF32, {4}).valid());
    EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument, {"State", "empty name"}));
  }
}

// A dtype value past the enum (a cast, or a caller through the C ABI) is refused at
// declaration; it used to pass as "quantized" and divide by a block size of 0.
TEST(BuilderTest, UnknownDTypeIsRefused) {
  for (int value : {kNumDTypes, kNumDTypes + 1, 255}) {
    GraphBuilder b;
    const DType bad = static_cast<DType>(value);
    EXPECT_FALSE(IsValidDType(bad));
    EXPECT_FALSE(IsQuantized(bad));
    EXPECT_FALSE(b.Weight("w", bad, {2, 64}).valid());
    EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument, {"'w'", "unknown dtype"}));
  }
  EXPECT_TRUE(IsValidDType(DType::kQ6_K));
}

// Shapes whose element count overflows int64 (or passes the 2^48 bound) are refused at
// declaration, naming the tensor: a wrapped product would make a huge weight "need" a few
// bytes and let every later size check pass.
TEST(BuilderTest, ShapesThatOverflowAreRefused) {
  {
    GraphBuilder b;
    // 2^62 + 1 rows of one f32: 2^64 + 4 bytes wraps to 4.
    EXPECT_FALSE(b.Weight("huge", DType::kF32, {(int64_t{1} << 62) + 1, 1}).valid());
    EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument, {"'huge'", "2^48"}));
  }
  {
    GraphBuilder b;
    EXPECT_FALSE(
        b.Input("wraps", DType::kF32, {int64_t{1} << 32, int64_t{1} << 32, 4}).valid());
    EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument, {"'wraps'", "2^48"}));
  }
  {
    GraphBuilder b;  // the bound itself is allowed, one more is not
    EXPECT_TRUE(b.Weight("at_bound", DType::kF32, {int64_t{1} << 24, int64_t{1} << 24}).valid());
    EXPECT_FALSE(
        b.Weight("past_bound", DType::kF32, {(int64_t{1} << 24) + 1, int64_t{1} << 24}).valid());
    EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument, {"'past_bound'"}));
  }
  EXPECT_EQ(TensorBytes(DType::kF32, Shape{int64_t{1} << 24, int64_t{1} << 24}),
            int64_t{1} << 50);
  EXPECT_EQ(TensorBytes(DType::kF32, Shape{(int64_t{1} << 62) + 1, 1}), -1);
}

// Valid inputs whose output is past the bound: MatMul of [2^31, 8] by [2^31, 8] would be
// [2^31, 2^31]. The builder used to make that tensor, and Build's graph failed Validate.
TEST(BuilderTest, OutputShapePastTheBoundIsRefused) {
  GraphBuilder b;
  const int64_t big = int64_t{1} << 31;
  TensorId x = b.Input("x", DType::kF32, {big, 8});
  TensorId w = b.Weight("w", DType::kF32, {big, 8});
  ASSERT_TRUE(x.valid() && w.valid());
  EXPECT_FALSE(b.MatMul(x, w, "mm").valid());
  EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument, {"'mm'", "output shape", "2^48"}));
}

// A quantized dtype is a rank-2 Weight of whole blocks, read by MatMul (as w) or Embedding
// (as the table); anywhere else the builder says so.
TEST(BuilderTest, QuantizedDTypesOnlyForMatMulAndEmbeddingWeights) {
  {
    GraphBuilder b;
    TensorId x = b.Input("x", DType::kF32, {2, 64});
    TensorId w = b.Weight("w", DType::kQ4_0, {8, 64});
    TensorId table = b.Weight("table", DType::kQ4_K, {10, 256});
    TensorId ids = b.Input("ids", DType::kI32, {2});
    TensorId y = b.MatMul(x, w, "proj");
    TensorId e = b.Embedding(table, ids, DType::kBF16, "embed");
    b.Output("y", y);
    b.Output("e", e);
    absl::StatusOr<Graph> g = std::move(b).Build();
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->tensor(y).dtype, DType::kF32);
    EXPECT_EQ(g->tensor(e).dtype, DType::kBF16);
    EXPECT_EQ(g->tensor(w).bytes(), 8 * 2 * 18);
    EXPECT_EQ(g->tensor(table).bytes(), 10 * 144);
  }
  {
    GraphBuilder b;
    EXPECT_FALSE(b.Input("qx", DType::kQ8_0, {1, 32}).valid());
    EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                           {"'qx'", "q8_0", "only for rank-2 weights"}));
  }
  {
    GraphBuilder b;
    EXPECT_FALSE(b.Weight("ragged", DType::kQ6_K, {4, 300}).valid());
    EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                           {"'ragged'", "256-element blocks"}));
  }
  {
    GraphBuilder b;
    TensorId x = b.Input("x", DType::kF32, {1, 32});
    TensorId w = b.Weight("g", DType::kQ8_0, {1, 32});
    b.Add(x, w, "add_quantized");
    EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument, {"'add_quantized'"}));
  }
  {
    GraphBuilder b;
    TensorId x = b.Input("x", DType::kF32, {1, 32});
    TensorId w = b.Weight("g", DType::kQ8_0, {1, 32});
    b.RmsNorm(x, w, 1e-5f, "norm_quantized");
    EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument, {"'norm_quantized'"}));
  }
}

// A cache [slots=1, kvh, S=32, d] and a query with `heads` heads of the same d.
struct AttentionInputs {
  TensorId q, k_cache, v_cache, pos;
};
AttentionInputs DeclareAttention(GraphBuilder& b, int64_t heads, int64_t kv_heads,
                                 int64_t head_dim) {
  AttentionInputs a;
  a.q = b.Input("q", DType::kF32, {1, heads * head_dim});
  a.k_cache = b.State("k_cache", DType::kF32, {1, kv_heads, 32, head_dim});
  a.v_cache = b.State("v_cache", DType::kF32, {1, kv_heads, 32, head_dim});
  a.pos = b.Input("pos", DType::kI32, {1});
  return a;
}

TEST(BuilderTest, GqaHeadsNotDivisible) {
  GraphBuilder b;
  const AttentionInputs a = DeclareAttention(b, /*heads=*/6, /*kv_heads=*/4, /*head_dim=*/16);
  EXPECT_FALSE(b.Attention(a.q, a.k_cache, a.v_cache, a.pos, "attn").valid());
  EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                         {"Attention", "'attn'", "GQA", "6 query heads", "'q' [1,96]",
                          "4 kv heads", "'k_cache' [1,4,32,16]"}));
}

TEST(BuilderTest, AttentionDefaultScaleIsInverseSqrtHeadDim) {
  for (const int64_t d : {16, 64, 128}) {
    GraphBuilder b;
    const AttentionInputs a = DeclareAttention(b, /*heads=*/8, /*kv_heads=*/2, d);
    const TensorId out = b.Attention(a.q, a.k_cache, a.v_cache, a.pos, "attn");
    const TensorId scaled = b.Attention(a.q, a.k_cache, a.v_cache, a.pos, 0.5f, "scaled");
    b.Output("out", out);
    b.Output("scaled", scaled);
    absl::StatusOr<Graph> g = std::move(b).Build();
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_FLOAT_EQ(std::get<ops::Attention>(g->nodes()[0].op).scale,
                    1.0f / std::sqrt(static_cast<float>(d)))
        << "head_dim " << d;
    EXPECT_FLOAT_EQ(std::get<ops::Attention>(g->nodes()[1].op).scale, 0.5f);
    EXPECT_EQ(g->tensor(out).shape, Shape({1, 8 * d}));
  }
}

TEST(BuilderTest, StateWrittenByTwoNodes) {
  GraphBuilder b;
  const TensorId k = b.Input("k", DType::kF32, {1, 32});
  const TensorId pos = b.Input("pos", DType::kI32, {1});
  const TensorId cache = b.State("k_cache", DType::kF32, {1, 2, 16, 16});
  const TensorId written = b.KvWrite(k, pos, cache, "write_a");
  // In-place ops return the tensor they write.
  EXPECT_EQ(written, cache);
  EXPECT_FALSE(b.KvWrite(k, pos, cache, "write_b").valid());
  EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                         {"KvWrite node 'write_b'", "State 'k_cache'",
                          "already written by node 'write_a'"}));
}

TEST(BuilderTest, InputWrittenByCopyAndAdvance) {
  GraphBuilder b;
  const TensorId pos = b.Input("pos", DType::kI32, {1});
  const TensorId next = b.Input("next", DType::kI32, {1});
  EXPECT_EQ(b.Advance(pos, "advance"), pos);
  EXPECT_FALSE(b.Copy(next, pos, "overwrite").valid());
  EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                         {"Copy node 'overwrite'", "Input 'pos'",
                          "already written by node 'advance'"}));
}

TEST(BuilderTest, WritingAWeightInPlaceIsRefused) {
  {
    GraphBuilder b;
    const TensorId src = b.Input("src", DType::kF32, {4, 8});
    const TensorId w = b.Weight("frozen", DType::kF32, {4, 8});
    EXPECT_FALSE(b.Copy(src, w, "clobber").valid());
    EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                           {"Copy node 'clobber'", "'frozen' [4,8] f32", "Weight",
                            "only a State or Input"}));
  }
  {
    GraphBuilder b;
    const TensorId k = b.Input("k", DType::kF32, {1, 32});
    const TensorId pos = b.Input("pos", DType::kI32, {1});
    const TensorId w = b.Weight("cache_w", DType::kF32, {1, 2, 16, 16});
    EXPECT_FALSE(b.KvWrite(k, pos, w, "write").valid());
    EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                           {"KvWrite node 'write'", "'cache_w'", "must be a State"}));
  }
  {
    // Nor an intermediate: only bound memory that persists may be written in place.
    GraphBuilder b;
    const TensorId src = b.Input("src", DType::kF32, {4, 8});
    const TensorId act = b.Silu(src, "act");
    EXPECT_FALSE(b.Copy(src, act, "into_act").valid());
    EXPECT_TRUE(BuildFails(b, absl::StatusCode::kInvalidArgument,
                           {"Copy node 'into_act'", "'act'", "Intermediate"}));
  }
}

TEST(BuilderTest, EmptyGraph) {
  {
    GraphBuilder b;
    absl::StatusOr<Graph> g = std::move(b).Build();
    EXPECT_TRUE(IsError(g.status(), absl::StatusCode::kInvalidArgument, {"empty"}));
  }
  {
    // Declarations alone are no graph.
    GraphBuilder b;
    b.Input("x", DType::kF32, {1, 8});
    b.Weight("w", DType::kF32, {8, 8});
    absl::StatusOr<Graph> g = std::move(b).Build();
    EXPECT_TRUE(IsError(g.status(), absl::StatusCode::kInvalidArgument, {"empty", "no nodes"}));
  }
}

TEST(BuilderTest, UseAfterBuild) {
  GraphBuilder b;
  const TensorId x = b.Input("x", DType::kF32, {1, 8});
  b.Output("y", b.Silu(x, "act"));
  ASSERT_TRUE(std::move(b).Build().ok());

  EXPECT_FALSE(b.Silu(x, "late").valid());
  EXPECT_TRUE(IsError(b.status(), absl::StatusCode::kFailedPrecondition,
                      {"used after Build()", "Silu('late')"}));
  // The first misuse is kept.
  EXPECT_FALSE(b.Input("late_input", DType::kF32, {1}).valid());
  EXPECT_TRUE(IsError(b.status(), absl::StatusCode::kFailedPrecondition, {"Silu('late')"}));

  absl::StatusOr<Graph> again = std::move(b).Build();
  EXPECT_TRUE(IsError(again.status(), absl::StatusCode::kFailedPrecondition,
                      {"Build() called twice"}));
}

TEST(BuilderTest, DeclarationAndOutputAfterBuildAreRefused) {
  {
    GraphBuilder b;
    b.Silu(b.Input("x", DType::kF32, {1, 8}), "act");
    ASSERT_TRUE(std::move(b).Build().ok());
    EXPECT_FALSE(b.Weight("w", DType::kF32, {8}).valid());
    EXPECT_TRUE(IsError(b.status(), absl::StatusCode::kFailedPrecondition,
                        {"used after Build()", "Weight('w')"}));
  }
  {
    GraphBuilder b;
    const TensorId act = b.Silu(b.Input("x", DType::kF32, {1, 8}), "act");
    ASSERT_TRUE(std::move(b).Build().ok());
    b.Output("late_out", act);
    EXPECT_TRUE(IsError(b.status(), absl::StatusCode::kFailedPrecondition,
                        {"used after Build()", "Output('late_out')"}));
  }
}

TEST(BuilderTest, SecondBuildAfterFailedBuild) {
  GraphBuilder b;
  const TensorId x = b.Input("x", DType::kF32, {1, 8});
  b.Add(x, b.Input("y", DType::kF32, {1, 9}), "sum");
  EXPECT_TRUE(IsError(std::move(b).Build().status(), absl::StatusCode::kInvalidArgument,
                      {"'sum'"}));
  EXPECT_TRUE(IsError(std::move(b).Build().status(), absl::StatusCode::kFailedPrecondition,
                      {"called twice"}));
}

TEST(BuilderTest, ErrorsAreSticky) {
  GraphBuilder b;
  const TensorId x = b.Input("x", DType::kF32, {2, 8});
  const TensorId w = b.Weight("w", DType::kF32, {4, 7});
  EXPECT_FALSE(b.MatMul(x, w, "first_bad").valid());
  const absl::Status first = b.status();
  ASSERT_TRUE(IsError(first, absl::StatusCode::kInvalidArgument, {"'first_bad'"}));

  // Later calls, good or bad, return invalid ids and leave the first error in place.
  EXPECT_FALSE(b.Silu(x, "good_after").valid());
  EXPECT_FALSE(b.Input("fresh", DType::kF32, {1}).valid());
  EXPECT_FALSE(b.Weight("x", DType::kF32, {1}).valid());  // would be a duplicate name
  EXPECT_FALSE(b.Add(x, TensorId{}, "second_bad").valid());
  b.Output("out", x);
  EXPECT_EQ(b.status(), first);
  EXPECT_FALSE(absl::StrContains(b.status().message(), "second_bad"));
  absl::StatusOr<Graph> g = std::move(b).Build();
  EXPECT_EQ(g.status(), first);
}

TEST(BuilderTest, AutoNamesUnnamedNodes) {
  GraphBuilder b;
  const TensorId x = b.Input("x", DType::kF32, {2, 8});
  // Takes the name the counter would reach next, so the builder must skip it.
  const TensorId taken = b.Input("silu_2", DType::kF32, {2, 8});
  const TensorId a = b.Add(x, taken);
  const TensorId m = b.Mul(a, x);
  const TensorId s = b.Silu(m);
  const TensorId sm = b.SiluMul(s, a, "named");
  const TensorId soft = b.Softmax(sm);
  b.Output("out", soft);
  absl::StatusOr<Graph> g = std::move(b).Build();
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(g->Validate().ok()) << g->Validate();
  ASSERT_EQ(g->num_nodes(), 5);
  EXPECT_EQ(g->nodes()[0].name, "add_0");
  EXPECT_EQ(g->nodes()[1].name, "mul_1");
  EXPECT_EQ(g->nodes()[2].name, "silu_3");
  EXPECT_EQ(g->nodes()[3].name, "named");
  EXPECT_EQ(g->nodes()[4].name, "softmax_4");
  // A node's output tensor carries the node's name.
  EXPECT_EQ(g->tensor(a).name, "add_0");
  EXPECT_EQ(g->tensor(m).name, "mul_1");
  EXPECT_EQ(g->tensor(s).name, "silu_3");
  EXPECT_EQ(g->tensor(soft).name, "softmax_4");
}

TEST(BuilderTest, TinyLlamaBuildsAValidGraph) {
  absl::StatusOr<Graph> g = BuildLlamaDecodeGraph(TinyLlamaConfig(), {.batch = 2});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(g->Validate().ok()) << g->Validate();
  // 17 nodes per layer, plus embedding, final norm, lm head and argmax.
  EXPECT_EQ(g->num_nodes(), 4 * 17 + 4);
  const TensorId logits = *g->FindOutput("logits");
  EXPECT_EQ(g->tensor(logits).shape, Shape({2, 1024}));
}

}  // namespace
}  // namespace sg
