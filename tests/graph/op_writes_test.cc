// What each op writes besides its output (WrittenInputs, stepgraph/graph/ops.h): every op
// of SG_OP_LIST, with the parameters that move its written inputs, against what ops.h and
// docs/ops.md say. op_coverage_test checks the other direction on the CPU reference: a
// run changes no bound tensor that its nodes do not declare written.
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/ops.h"

namespace sg {
namespace {

using Epilogue = ops::FusedMatMul::Epilogue;

struct Expected {
  Op op;
  std::vector<int32_t> written;  // input indices
  bool output_is_written = false;
};

std::vector<Expected> Documented() {
  std::vector<Expected> t = {
      {ops::Embedding{}, {}},
      {ops::MatMul{}, {}},
      {ops::MatMul{.has_bias = true}, {}},
      {ops::RmsNorm{}, {}},
      {ops::Add{}, {}},
      {ops::Mul{}, {}},
      {ops::Silu{}, {}},
      {ops::SiluMul{}, {}},
      {ops::Rope{}, {}},
      // kv, pos, cache (the cache is the last input and the output).
      {ops::KvWrite{}, {2}, true},
      // kv, pos, seq_slots, cache.
      {ops::KvWrite{.has_slots = true}, {3}, true},
      {ops::Attention{}, {}},
      {ops::Attention{.has_slots = true}, {}},
      {ops::Softmax{}, {}},
      {ops::Argmax{}, {}},
      {ops::Sample{}, {}},
      {ops::Penalize{}, {}},
      {ops::CountIds{}, {2}, true},  // ids, pos, counts
      {ops::Copy{}, {1}, true},     // src, dst
      {ops::Advance{}, {0}, true},  // pos
      // qkv, pos, k_cache, v_cache: the caches beside the output q.
      {ops::RopeKvWrite{}, {2, 3}},
      {ops::FusedElementwise{}, {}},
      {ops::HeadRmsNorm{}, {}},
      {ops::GeluTanhMul{}, {}},
      {ops::Scale{}, {}},
      {ops::Softcap{}, {}},
      {ops::MoeTopK{}, {}},
      {ops::MoeRouteWeights{}, {}},
      {ops::MoeMatMul{}, {}},
      {ops::MoeCombine{}, {}},
      {ops::AllReduce{}, {}},
      {ops::AllGather{}, {}},
  };
  // x, [norm_w], w_0 .. w_{weights-1}, then the epilogue's inputs; only kRopeKvWrite
  // (pos, k_cache, v_cache after three weights) writes.
  for (bool norm : {false, true}) {
    for (Epilogue e : {Epilogue::kNone, Epilogue::kAdd, Epilogue::kSiluMul, Epilogue::kArgmax}) {
      for (int32_t weights = 1; weights <= 3; ++weights) {
        t.push_back({ops::FusedMatMul{.norm = norm, .weights = weights, .epilogue = e}, {}});
      }
    }
    const int32_t pos = (norm ? 2 : 1) + 3;
    t.push_back({ops::FusedMatMul{.norm = norm, .weights = 3, .epilogue = Epilogue::kRopeKvWrite},
                 {pos + 1, pos + 2}});
  }
  return t;
}

TEST(OpWritesTest, EveryOpWritesWhatItsDocumentationSays) {
  std::set<std::string> covered;
  for (const Expected& e : Documented()) {
    const std::string name(OpName(e.op));
    SCOPED_TRACE(absl::StrCat(name, " {", OpParamsToString(e.op), "}"));
    covered.insert(name);
    const InputWrites w = WrittenInputs(e.op);
    EXPECT_EQ(std::vector<int32_t>(w.inputs.begin(), w.inputs.end()), e.written);
    EXPECT_EQ(w.output_is_written, e.output_is_written);
    EXPECT_EQ(IsInPlace(e.op), e.output_is_written);
    EXPECT_EQ(WritesInputs(e.op), !e.written.empty());
  }
  // An op added to the list needs a row here (and its answer in graph/ops.cc).
  for (absl::string_view op : AllOpNames()) {
    const std::string name(op);
    EXPECT_TRUE(covered.contains(name))
        << "op " << name << " has no row in this test's table of written inputs";
  }
}

TEST(OpWritesTest, WrittenInputsOfBuiltNodesAreTheBoundTensorsTheyUpdate) {
  // Every written input of a built node is a State or Input; an in-place node's output is
  // its written input.
  GraphBuilder b;
  const int64_t rows = 2, kvh = 1, d = 8, seq = 4;
  ops::Rope rope{.head_dim = static_cast<int32_t>(d)};
  TensorId x = b.Input("x", DType::kF32, {rows, 16});
  TensorId pos = b.Input("pos", DType::kI32, {rows});
  TensorId kc = b.State("kc", DType::kF32, {rows, kvh, seq, d});
  TensorId vc = b.State("vc", DType::kF32, {rows, kvh, seq, d});
  TensorId kc2 = b.State("kc2", DType::kF32, {rows, kvh, seq, d});
  TensorId wq = b.Weight("wq", DType::kF32, {2 * d, 16});
  TensorId wk = b.Weight("wk", DType::kF32, {kvh * d, 16});
  TensorId wv = b.Weight("wv", DType::kF32, {kvh * d, 16});
  TensorId q = b.FusedMatMul({.weights = 3, .epilogue = Epilogue::kRopeKvWrite, .rope = rope},
                             {x, wq, wk, wv, pos, kc, vc}, "qkv");
  b.KvWrite(b.MatMul(x, wk, "k2"), pos, kc2, "kw");
  b.Copy(b.Input("next", DType::kI32, {rows}), b.Input("ids", DType::kI32, {rows}), "copy");
  b.Advance(pos, "advance");
  b.Output("q", q);
  absl::StatusOr<Graph> g = std::move(b).Build();
  ASSERT_TRUE(g.ok()) << g.status();
  std::vector<std::string> written;
  for (const Node& n : g->nodes()) {
    const InputWrites w = WrittenInputs(n.op);
    for (int32_t i : w.inputs) {
      ASSERT_LT(i, static_cast<int32_t>(n.inputs.size())) << n.name;
      const Tensor& t = g->tensor(n.inputs[i]);
      EXPECT_TRUE(t.kind == TensorKind::kState || t.kind == TensorKind::kInput) << t.name;
      written.push_back(absl::StrCat(n.name, ":", t.name));
    }
    if (w.output_is_written) {
      EXPECT_EQ(n.output, n.inputs[w.inputs.back()]) << n.name;
    }
  }
  EXPECT_EQ(written, (std::vector<std::string>{"qkv:kc", "qkv:vc", "kw:kc2", "copy:ids",
                                               "advance:pos"}));
}

}  // namespace
}  // namespace sg
