// Graph: Validate() on hand-made graphs (each thing the builder guarantees, broken one at a
// time), lookups, and the DOT and text dumps.
#include "stepgraph/graph/graph.h"

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/graph/ops.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/graph/passes.h"
#include "tests/testing/status_matchers.h"

namespace sg {
namespace {

using ::sg::testing::IsError;

// Parts of a hand-made graph; every id carries `owner`. The default contents form a valid
// graph:
//   proj = MatMul(x, w)          [2,4]
//   act  = Silu(proj)            [2,4]
//   sum  = Add(act, proj)        [2,4]     output "out"
//   write = KvWrite(k, pos, cache)         (in place on State cache)
struct Parts {
  uint32_t owner = NewGraphOwnerTag();
  std::vector<Tensor> tensors;
  std::vector<Node> nodes;
  std::vector<GraphOutput> outputs;

  TensorId Add(std::string name, TensorKind kind, DType dtype, Shape shape) {
    tensors.push_back(Tensor{std::move(name), kind, dtype, shape});
    return TensorId{static_cast<int32_t>(tensors.size() - 1), owner};
  }
  void AddNode(std::string name, Op op, std::initializer_list<TensorId> inputs,
               TensorId output) {
    nodes.push_back(Node{std::move(name), std::move(op), {inputs.begin(), inputs.end()}, output});
  }
  Graph Make() const { return Graph(owner, tensors, nodes, outputs); }
};

struct Ids {
  TensorId x, w, proj, act, sum, k, pos, cache;
};

Parts ValidParts(Ids* ids) {
  Parts p;
  Ids& i = *ids;
  i.x = p.Add("x", TensorKind::kInput, DType::kF32, {2, 8});
  i.w = p.Add("w", TensorKind::kWeight, DType::kF32, {4, 8});
  i.k = p.Add("k", TensorKind::kInput, DType::kF32, {2, 16});
  i.pos = p.Add("pos", TensorKind::kInput, DType::kI32, {2});
  i.cache = p.Add("cache", TensorKind::kState, DType::kF32, {2, 2, 8, 8});
  i.proj = p.Add("proj", TensorKind::kIntermediate, DType::kF32, {2, 4});
  i.act = p.Add("act", TensorKind::kIntermediate, DType::kF32, {2, 4});
  i.sum = p.Add("sum", TensorKind::kIntermediate, DType::kF32, {2, 4});
  p.AddNode("proj", ops::MatMul{}, {i.x, i.w}, i.proj);
  p.AddNode("act", ops::Silu{}, {i.proj}, i.act);
  p.AddNode("sum", ops::Add{}, {i.act, i.proj}, i.sum);
  p.AddNode("write", ops::KvWrite{}, {i.k, i.pos, i.cache}, i.cache);
  p.outputs.push_back({"out", i.sum});
  return p;
}

TEST(GraphValidateTest, ValidHandMadeGraphPasses) {
  Ids ids;
  const Graph g = ValidParts(&ids).Make();
  EXPECT_TRUE(g.Validate().ok()) << g.Validate();
  absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(g);
  EXPECT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(*g.FindTensor("cache"), ids.cache);
  EXPECT_EQ(*g.FindOutput("out"), ids.sum);
}

TEST(GraphValidateTest, LookupsOfUnknownNamesAreNotFound) {
  Ids ids;
  const Graph g = ValidParts(&ids).Make();
  EXPECT_TRUE(IsError(g.FindTensor("nope").status(), absl::StatusCode::kNotFound, {"'nope'"}));
  EXPECT_TRUE(
      IsError(g.FindOutput("proj").status(), absl::StatusCode::kNotFound, {"output", "'proj'"}));
}

TEST(GraphValidateTest, EmptyGraph) {
  Parts p;
  p.Add("x", TensorKind::kInput, DType::kF32, {1});
  EXPECT_TRUE(IsError(p.Make().Validate(), absl::StatusCode::kInvalidArgument, {"empty"}));
}

TEST(GraphValidateTest, NodesOutOfOrder) {
  Ids ids;
  Parts p = ValidParts(&ids);
  std::swap(p.nodes[0], p.nodes[1]);  // act reads proj before proj runs
  const absl::Status s = p.Make().Validate();
  EXPECT_TRUE(IsError(s, absl::StatusCode::kInvalidArgument,
                      {"out of topological order", "node 0 'act'", "reads 'proj'",
                       "node 1 'proj'"}));
  EXPECT_FALSE(absl::StrContains(s.message(), "cycle")) << s;
  EXPECT_EQ(ExecutionPlan::Create(p.Make()).status(), s);
}

TEST(GraphValidateTest, DanglingIntermediate) {
  Ids ids;
  Parts p = ValidParts(&ids);
  const TensorId ghost = p.Add("ghost", TensorKind::kIntermediate, DType::kF32, {2, 4});
  p.nodes[1].inputs[0] = ghost;
  EXPECT_TRUE(IsError(p.Make().Validate(), absl::StatusCode::kInvalidArgument,
                      {"dangling", "'ghost'", "produced by no node"}));
}

TEST(GraphValidateTest, CycleNamesItsNodes) {
  Parts p;
  const TensorId x = p.Add("x", TensorKind::kInput, DType::kF32, {2, 8});
  const TensorId l = p.Add("left", TensorKind::kIntermediate, DType::kF32, {2, 8});
  const TensorId r = p.Add("right", TensorKind::kIntermediate, DType::kF32, {2, 8});
  p.AddNode("left", ops::Add{}, {x, r}, l);
  p.AddNode("right", ops::Add{}, {l, x}, r);
  p.outputs.push_back({"out", r});
  const absl::Status s = p.Make().Validate();
  EXPECT_TRUE(IsError(s, absl::StatusCode::kInvalidArgument, {"cycle", "left", "right"}));
  // The cycle is listed in the direction data flows and closes on its first node.
  EXPECT_TRUE(absl::StrContains(s.message(), "left -> right -> left") ||
              absl::StrContains(s.message(), "right -> left -> right"))
      << s;
}

TEST(GraphValidateTest, LongerCycleBehindValidPrefix) {
  // a -> b -> c -> a, with a valid node in front of it: the cycle is found from wherever
  // the order check trips.
  Parts p;
  const TensorId x = p.Add("x", TensorKind::kInput, DType::kF32, {1, 4});
  const TensorId pre = p.Add("pre", TensorKind::kIntermediate, DType::kF32, {1, 4});
  const TensorId a = p.Add("a", TensorKind::kIntermediate, DType::kF32, {1, 4});
  const TensorId b = p.Add("b", TensorKind::kIntermediate, DType::kF32, {1, 4});
  const TensorId c = p.Add("c", TensorKind::kIntermediate, DType::kF32, {1, 4});
  p.AddNode("pre", ops::Silu{}, {x}, pre);
  p.AddNode("a", ops::Add{}, {pre, c}, a);
  p.AddNode("b", ops::Silu{}, {a}, b);
  p.AddNode("c", ops::Silu{}, {b}, c);
  const absl::Status s = p.Make().Validate();
  EXPECT_TRUE(IsError(s, absl::StatusCode::kInvalidArgument, {"cycle", "a -> b -> c -> a"}));
  EXPECT_FALSE(absl::StrContains(s.message(), "pre")) << s;
}

TEST(GraphValidateTest, SelfLoopIsACycle) {
  Parts p;
  const TensorId x = p.Add("x", TensorKind::kInput, DType::kF32, {2, 8});
  const TensorId y = p.Add("loop", TensorKind::kIntermediate, DType::kF32, {2, 8});
  p.AddNode("loop", ops::Add{}, {x, y}, y);
  EXPECT_TRUE(IsError(p.Make().Validate(), absl::StatusCode::kInvalidArgument,
                      {"cycle", "loop -> loop"}));
}

TEST(GraphValidateTest, ForeignOrUnknownIds) {
  {
    Ids ids;
    Parts p = ValidParts(&ids);
    p.nodes[1].inputs[0] = TensorId{ids.proj.index, NewGraphOwnerTag()};
    EXPECT_TRUE(IsError(p.Make().Validate(), absl::StatusCode::kInvalidArgument,
                        {"node 'act'", "unknown or foreign tensor id"}));
  }
  {
    Ids ids;
    Parts p = ValidParts(&ids);
    p.nodes[2].inputs[1] = TensorId{99, p.owner};
    EXPECT_TRUE(IsError(p.Make().Validate(), absl::StatusCode::kInvalidArgument,
                        {"node 'sum'", "index 99"}));
  }
  {
    Ids ids;
    Parts p = ValidParts(&ids);
    p.nodes[0].output = TensorId{ids.proj.index, NewGraphOwnerTag()};
    EXPECT_TRUE(IsError(p.Make().Validate(), absl::StatusCode::kInvalidArgument,
                        {"node 'proj'", "writes an unknown or foreign tensor id"}));
  }
  {
    Ids ids;
    Parts p = ValidParts(&ids);
    p.outputs[0].tensor = TensorId{ids.sum.index, NewGraphOwnerTag()};
    EXPECT_TRUE(IsError(p.Make().Validate(), absl::StatusCode::kInvalidArgument,
                        {"output 'out'", "foreign"}));
  }
}

TEST(GraphValidateTest, OutputTypeDisagreesWithInference) {
  {
    Ids ids;
    Parts p = ValidParts(&ids);
    p.tensors[ids.proj.index].shape = Shape{2, 5};
    p.tensors[ids.act.index].shape = Shape{2, 5};
    EXPECT_TRUE(IsError(p.Make().Validate(), absl::StatusCode::kInvalidArgument,
                        {"MatMul node 'proj'", "output 'proj' is [2,5] f32",
                         "inputs give [2,4] f32"}));
  }
  {
    Ids ids;
    Parts p = ValidParts(&ids);
    p.tensors[ids.act.index].dtype = DType::kBF16;
    EXPECT_TRUE(IsError(p.Make().Validate(), absl::StatusCode::kInvalidArgument,
                        {"Silu node 'act'", "output 'act' is [2,4] bf16",
                         "inputs give [2,4] f32"}));
  }
  {
    // Inputs that inference refuses: the node and tensors are named as the builder would.
    Ids ids;
    Parts p = ValidParts(&ids);
    p.tensors[ids.w.index].shape = Shape{4, 9};
    EXPECT_TRUE(IsError(p.Make().Validate(), absl::StatusCode::kInvalidArgument,
                        {"MatMul node 'proj'", "'x' [2,8]", "'w' [4,9]"}));
  }
}

TEST(GraphValidateTest, WrongArityIsRefused) {
  // The executor resolves at most four arguments per node on its stack; a hand-made node
  // with more must never get that far.
  Ids ids;
  Parts p = ValidParts(&ids);
  p.nodes[2].inputs = {ids.act, ids.proj, ids.act, ids.proj, ids.act};
  EXPECT_TRUE(IsError(p.Make().Validate(), absl::StatusCode::kInvalidArgument,
                      {"Add node 'sum'", "takes 2 inputs, got 5"}));
}

TEST(GraphValidateTest, InPlaceOutputMustBeLastInput) {
  Ids ids;
  Parts p = ValidParts(&ids);
  const TensorId other =
      p.Add("other_cache", TensorKind::kState, DType::kF32, {2, 2, 8, 8});
  p.nodes[3].output = other;
  EXPECT_TRUE(IsError(p.Make().Validate(), absl::StatusCode::kInvalidArgument,
                      {"in-place node 'write'", "'other_cache'", "last input"}));
}

TEST(GraphValidateTest, IntermediateProducedTwice) {
  Ids ids;
  Parts p = ValidParts(&ids);
  p.nodes[2].output = ids.act;  // sum also writes act
  p.outputs[0].tensor = ids.act;
  EXPECT_TRUE(IsError(p.Make().Validate(), absl::StatusCode::kInvalidArgument,
                      {"Intermediate 'act'", "written by two nodes", "'act' and 'sum'"}));
}

TEST(GraphValidateTest, StateWrittenTwiceAndWeightWritten) {
  {
    Ids ids;
    Parts p = ValidParts(&ids);
    p.AddNode("write_again", ops::KvWrite{}, {ids.k, ids.pos, ids.cache}, ids.cache);
    EXPECT_TRUE(IsError(p.Make().Validate(), absl::StatusCode::kInvalidArgument,
                        {"State 'cache'", "written by two nodes", "'write' and 'write_again'"}));
  }
  {
    Ids ids;
    Parts p = ValidParts(&ids);
    const TensorId src = p.Add("src", TensorKind::kInput, DType::kF32, {4, 8});
    p.AddNode("clobber", ops::Copy{}, {src, ids.w}, ids.w);
    EXPECT_TRUE(IsError(p.Make().Validate(), absl::StatusCode::kInvalidArgument,
                        {"node 'clobber'", "Weight 'w'", "only a State or Input"}));
  }
  {
    // A non-in-place op may only produce a fresh intermediate.
    Ids ids;
    Parts p = ValidParts(&ids);
    p.nodes[1].output = ids.x;
    EXPECT_TRUE(IsError(p.Make().Validate(), absl::StatusCode::kInvalidArgument,
                        {"node 'act'", "Input 'x'", "only the in-place ops"}));
  }
}

TEST(GraphValidateTest, DuplicateNames) {
  {
    Ids ids;
    Parts p = ValidParts(&ids);
    p.tensors[ids.w.index].name = p.tensors[ids.x.index].name;
    EXPECT_TRUE(IsError(p.Make().Validate(), absl::StatusCode::kInvalidArgument,
                        {"duplicate tensor name 'x'"}));
  }
  {
    Ids ids;
    Parts p = ValidParts(&ids);
    p.nodes[3].name = "act";
    EXPECT_TRUE(IsError(p.Make().Validate(), absl::StatusCode::kInvalidArgument,
                        {"duplicate node name 'act'"}));
  }
  {
    Ids ids;
    Parts p = ValidParts(&ids);
    p.outputs.push_back({"out", ids.act});
    EXPECT_TRUE(IsError(p.Make().Validate(), absl::StatusCode::kInvalidArgument,
                        {"duplicate output name 'out'"}));
  }
}

// --- dumps -------------------------------------------------------------------------------

Graph DumpGraph() {
  GraphBuilder b;
  const TensorId x = b.Input("x", DType::kBF16, {2, 64});
  const TensorId w = b.Weight("my \"quoted\" weight", DType::kBF16, {32, 64});
  const TensorId pos = b.Input("pos", DType::kI32, {2});
  const TensorId cache = b.State("k_cache", DType::kBF16, {2, 2, 16, 16});
  const TensorId proj = b.MatMul(x, w, "proj");
  b.KvWrite(proj, pos, cache, "k_write");
  const TensorId norm = b.RmsNorm(proj, b.Weight("norm.weight", DType::kBF16, {32}), 1e-5f,
                                  "say \"hi\"");
  b.Output("out", norm);
  absl::StatusOr<Graph> g = std::move(b).Build();
  EXPECT_TRUE(g.ok()) << g.status();
  return *std::move(g);
}

// Every double quote in a line is either escaped or one of an even number of delimiters.
bool QuotesBalanced(absl::string_view line) {
  int unescaped = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '\\') {
      ++i;
      continue;
    }
    if (line[i] == '"') ++unescaped;
  }
  return unescaped % 2 == 0;
}

TEST(GraphDumpTest, ToDotShowsNodesBoundTensorsEdgesAndWrites) {
  const Graph g = DumpGraph();
  const std::string dot = g.ToDot();
  EXPECT_TRUE(absl::StartsWith(dot, "digraph")) << dot;
  EXPECT_TRUE(absl::EndsWith(dot, "}\n")) << dot;
  for (int i = 0; i < g.num_nodes(); ++i) {
    const Node& n = g.nodes()[i];
    EXPECT_TRUE(absl::StrContains(dot, absl::StrCat("n", i, " [shape=box, label=\"",
                                                    OpName(n.op), "\\n")))
        << "node " << i << "\n"
        << dot;
  }
  EXPECT_TRUE(absl::StrContains(dot, "proj")) << dot;
  EXPECT_TRUE(absl::StrContains(dot, "k_write")) << dot;
  EXPECT_TRUE(absl::StrContains(dot, "eps=1e-05")) << dot;
  // Bound tensors are ellipses labelled with kind and type; intermediates are not.
  for (const char* bound : {"x", "pos", "k_cache", "norm.weight"}) {
    const TensorId id = *g.FindTensor(bound);
    EXPECT_TRUE(
        absl::StrContains(dot, absl::StrCat("t", id.index, " [shape=ellipse, label=\"", bound)))
        << bound << "\n"
        << dot;
  }
  EXPECT_FALSE(absl::StrContains(dot, absl::StrCat("t", g.FindTensor("proj")->index, " [")))
      << dot;
  EXPECT_TRUE(absl::StrContains(dot, "State [2,2,16,16] bf16")) << dot;
  // Edges carry shape and dtype.
  const int x = g.FindTensor("x")->index;
  EXPECT_TRUE(absl::StrContains(dot, absl::StrCat("t", x, " -> n0 [label=\"[2,64] bf16\"]")))
      << dot;
  EXPECT_TRUE(absl::StrContains(dot, "n0 -> n1 [label=\"[2,32] bf16\"]")) << dot;
  EXPECT_TRUE(absl::StrContains(dot, absl::StrCat("t", g.FindTensor("pos")->index,
                                                  " -> n1 [label=\"[2] i32\"]")))
      << dot;
  // The in-place write is a dashed edge into the State, and the cache is not drawn as an
  // ordinary input of the node that writes it.
  const int cache = g.FindTensor("k_cache")->index;
  EXPECT_TRUE(absl::StrContains(
      dot, absl::StrCat("n1 -> t", cache, " [style=dashed, label=\"writes\"]")))
      << dot;
  EXPECT_FALSE(absl::StrContains(dot, absl::StrCat("t", cache, " -> n1"))) << dot;
  EXPECT_TRUE(absl::StrContains(dot, "output out")) << dot;
}

TEST(GraphDumpTest, ToDotEscapesQuotes) {
  const std::string dot = DumpGraph().ToDot();
  EXPECT_TRUE(absl::StrContains(dot, "my \\\"quoted\\\" weight")) << dot;
  EXPECT_TRUE(absl::StrContains(dot, "say \\\"hi\\\"")) << dot;
  for (absl::string_view line : absl::StrSplit(dot, '\n')) {
    EXPECT_TRUE(QuotesBalanced(line)) << line;
  }
}

TEST(GraphDumpTest, ToStringHasOneLinePerNode) {
  const Graph g = DumpGraph();
  const std::string text = g.ToString();
  std::vector<std::string> node_lines;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, "  #")) node_lines.emplace_back(line);
  }
  ASSERT_EQ(static_cast<int>(node_lines.size()), g.num_nodes()) << text;
  for (int i = 0; i < g.num_nodes(); ++i) {
    const Node& n = g.nodes()[i];
    EXPECT_TRUE(absl::StartsWith(node_lines[i], absl::StrCat("  #", i, " ", n.name, " = ",
                                                            OpName(n.op), "(")))
        << node_lines[i];
  }
  EXPECT_TRUE(absl::StrContains(node_lines[0], "-> %")) << node_lines[0];
  EXPECT_TRUE(absl::StrContains(node_lines[0], "[2,32] bf16")) << node_lines[0];
  EXPECT_TRUE(absl::StrContains(node_lines[2], "{eps=1e-05}")) << node_lines[2];
  EXPECT_TRUE(absl::StrContains(text, "k_cache: State [2,2,16,16] bf16")) << text;
  EXPECT_TRUE(absl::StrContains(text, "output out = %")) << text;
}

// The weight bytes a step reads (the decode floor of `stepgraph bench`): an untied
// embedding table by the rows of its ids, stacked experts by the ones the routing pairs
// can reach, a tied table (also the lm head's w) and every other weight whole.
TEST(StepWeightBytesTest, EmbeddingRowsAndReachableExpertsOnly) {
  constexpr int64_t kVocab = 100, kHidden = 64, kExperts = 16, kFf = 32, kTopK = 2;
  for (const int64_t rows : {1, 3, 8}) {
    for (const bool tied : {false, true}) {
      SCOPED_TRACE(absl::StrCat(rows, " rows", tied ? ", tied" : ""));
      GraphBuilder b;
      auto ids = b.Input("ids", DType::kI32, {rows});
      auto table = b.Weight("table", DType::kF32, {kVocab, kHidden});
      auto x = b.Embedding(table, ids);
      auto logits = b.MatMul(x, b.Weight("router", DType::kF32, {kExperts, kHidden}));
      auto chosen = b.MoeTopK(logits, kTopK);
      auto gate = b.Weight("gate", DType::kF32, {kExperts, kFf, kHidden});
      auto up = b.Weight("up", DType::kF32, {kExperts, kFf, kHidden});
      auto down = b.Weight("down", DType::kQ8_0, {kExperts, kHidden, kFf});
      auto h = b.MoeGateUpSiluMul(x, gate, up, chosen);
      auto y = b.MoeCombine(b.MoeMatMul(h, down, chosen),
                            b.MoeRouteWeights(logits, chosen, {}), chosen);
      auto head = tied ? table : b.Weight("head", DType::kF32, {kVocab, kHidden});
      b.Output("logits", b.MatMul(y, head));
      absl::StatusOr<Graph> g = std::move(b).Build();
      ASSERT_TRUE(g.ok()) << g.status();
      const int64_t reach = std::min(kExperts, kTopK * rows);
      const int64_t expert_bytes =
          2 * kFf * kHidden * 4 + TensorBytes(DType::kQ8_0, Shape{kHidden, kFf});
      const int64_t table_bytes = (tied ? kVocab : rows) * kHidden * 4;
      const int64_t want = table_bytes + kExperts * kHidden * 4 + reach * expert_bytes +
                           (tied ? 0 : kVocab * kHidden * 4);
      EXPECT_EQ(StepWeightBytes(*g), want);
      // The same with the down experts summed in the combine (moe_down_into_combine).
      absl::StatusOr<Graph> fused = RunPass("moe_down_into_combine", *g);
      ASSERT_TRUE(fused.ok()) << fused.status();
      EXPECT_EQ(fused->num_nodes(), g->num_nodes() - (kTopK * rows < kExperts ? 1 : 0));
      EXPECT_EQ(StepWeightBytes(*fused), want);
    }
  }
}

}  // namespace
}  // namespace sg
