// The sharding pass (stepgraph/graph/shard.h) and the Llama plan: where collectives go,
// the ranks' shapes, what is refused and why, and the bytes each rank is given.
#include "stepgraph/graph/shard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/graph/passes.h"
#include "stepgraph/models/llama.h"
#include "tests/testing/family_configs.h"

namespace sg {
namespace {

std::map<std::string, int> OpCounts(const Graph& g) {
  std::map<std::string, int> counts;
  for (const Node& n : g.nodes()) ++counts[std::string(OpName(n.op))];
  return counts;
}

const Tensor& Named(const Graph& g, const std::string& name) {
  return g.tensor(*g.FindTensor(name));
}

TEST(ShardGraph, LlamaOverTwoRanks) {
  const LlamaConfig c = TinyLlamaConfig();  // 8 heads, 2 KV heads, intermediate 688
  absl::StatusOr<Graph> whole = BuildLlamaDecodeGraph(c, {.batch = 2, .max_seq = 32});
  ASSERT_TRUE(whole.ok()) << whole.status();
  absl::StatusOr<ShardPlan> plan = LlamaShardPlan(c, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<Graph> g = ShardGraph(*whole, *plan, 2);
  ASSERT_TRUE(g.ok()) << g.status();
  std::map<std::string, int> counts = OpCounts(*g);
  // o and down of every layer; the lm head's logits (split by vocabulary) gathered once.
  EXPECT_EQ(counts["AllReduce"], 2 * c.num_hidden_layers);
  EXPECT_EQ(counts["AllGather"], 1);
  EXPECT_EQ(g->num_nodes(), whole->num_nodes() + 2 * c.num_hidden_layers + 1);
  const int64_t d = c.head_dim;
  EXPECT_EQ(Named(*g, "model.layers.0.self_attn.q_proj.weight").shape,
            (Shape{4 * d, c.hidden_size}));
  EXPECT_EQ(Named(*g, "model.layers.0.self_attn.k_proj.weight").shape, (Shape{d, c.hidden_size}));
  EXPECT_EQ(Named(*g, "model.layers.0.self_attn.o_proj.weight").shape,
            (Shape{c.hidden_size, 4 * d}));
  EXPECT_EQ(Named(*g, "model.layers.0.mlp.down_proj.weight").shape,
            (Shape{c.hidden_size, c.intermediate_size / 2}));
  EXPECT_EQ(Named(*g, "lm_head.weight").shape, (Shape{c.vocab_size / 2, c.hidden_size}));
  EXPECT_EQ(Named(*g, KCacheName(3)).shape, (Shape{2, 1, 32, d}));
  EXPECT_EQ(Named(*g, "model.embed_tokens.weight").shape, (Shape{c.vocab_size, c.hidden_size}));
  // The activations the model's readers see keep their whole shapes and names.
  EXPECT_EQ(Named(*g, "model.layers.0.self_attn.o_proj").shape, (Shape{2, c.hidden_size}));
  EXPECT_EQ(Named(*g, "model.layers.0.self_attn.attention").shape, (Shape{2, 4 * d}));
  const Tensor& logits = g->tensor(*g->FindOutput(kLogitsOutput));
  EXPECT_EQ(logits.shape, (Shape{2, c.vocab_size}));
  // Every AllReduce follows the matmul whose partial sums it adds.
  for (int n = 1; n < g->num_nodes(); ++n) {
    if (std::holds_alternative<ops::AllReduce>(g->nodes()[n].op)) {
      EXPECT_TRUE(std::holds_alternative<ops::MatMul>(g->nodes()[n - 1].op)) << g->nodes()[n].name;
    }
  }
  // The fusion passes run after the pass over its graph.
  absl::StatusOr<Graph> fused = RunPasses(*g);
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_EQ(OpCounts(*fused)["AllReduce"], 2 * c.num_hidden_layers);
  // Each takes its residual add in (all_reduce_add): the sharded step has the unsharded
  // one's nodes and its collectives, no more.
  EXPECT_EQ(OpCounts(*fused)["Add"], 0) << fused->ToString();
  absl::StatusOr<Graph> whole_fused = RunPasses(*whole);
  ASSERT_TRUE(whole_fused.ok());
  EXPECT_EQ(fused->num_nodes(), whole_fused->num_nodes() + 2 * c.num_hidden_layers + 1);
}

TEST(ShardGraph, OneRankIsTheGraphItselfAndTiedHeadsStayWhole) {
  LlamaConfig c = TinyLlamaConfig();
  c.tie_word_embeddings = true;
  absl::StatusOr<Graph> whole = BuildLlamaDecodeGraph(c, {.max_seq = 16});
  ASSERT_TRUE(whole.ok());
  absl::StatusOr<Graph> one = ShardGraph(*whole, *LlamaShardPlan(c, 1), 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->ToString(), whole->ToString());
  absl::StatusOr<Graph> two = ShardGraph(*whole, *LlamaShardPlan(c, 2), 2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(OpCounts(*two)["AllGather"], 0);  // the tied head is whole on every rank
}

// A routed layer over two ranks: every expert split as the dense MLP is, the router whole
// (every rank routes alike), and one AllReduce after the routed sum, not after the down
// experts; Qwen3-MoE's dense first layer keeps its own MLP split.
TEST(ShardGraph, RoutedLayersOverTwoRanks) {
  // Qwen3-MoE's routing: 8 experts of 96, 3 a token, a dense first layer.
  const LlamaConfig c = testing::MoeTinyConfigs(DType::kF32)[1].second;
  ASSERT_EQ(c.architecture, "qwen3_moe");
  absl::StatusOr<Graph> whole = BuildLlamaDecodeGraph(c, {.batch = 2, .max_seq = 16});
  ASSERT_TRUE(whole.ok()) << whole.status();
  absl::StatusOr<Graph> g = ShardGraph(*whole, *LlamaShardPlan(c, 2), 2);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(OpCounts(*g)["AllReduce"], 2 * c.num_hidden_layers);
  const std::string e = "model.layers.1.mlp.";
  EXPECT_EQ(Named(*g, e + "gate.weight").shape, (Shape{8, c.hidden_size}));
  EXPECT_EQ(Named(*g, e + "experts.gate_proj.weight").shape, (Shape{8, 48, c.hidden_size}));
  EXPECT_EQ(Named(*g, e + "experts.up_proj.weight").shape, (Shape{8, 48, c.hidden_size}));
  EXPECT_EQ(Named(*g, e + "experts.down_proj.weight").shape, (Shape{8, c.hidden_size, 48}));
  EXPECT_EQ(Named(*g, "model.layers.0.mlp.down_proj.weight").shape,
            (Shape{c.hidden_size, c.intermediate_size / 2}));
  // The chosen experts' columns: each rank's 48 of every slot's 96.
  EXPECT_EQ(Named(*g, e + "experts.act").shape, (Shape{2, 3 * 48}));
  const Tensor& combined = Named(*g, e + "combine");
  EXPECT_EQ(combined.shape, (Shape{2, c.hidden_size}));
  // The AllReduce writes the routed sum under its own name, from the combine's partial sums.
  const Node* reduce = nullptr;
  for (const Node& n : g->nodes()) {
    if (g->tensor(n.output).name == e + "combine") reduce = &n;
  }
  ASSERT_NE(reduce, nullptr);
  ASSERT_TRUE(std::holds_alternative<ops::AllReduce>(reduce->op)) << OpName(reduce->op);
  EXPECT_EQ(g->tensor(reduce->inputs[0]).name, e + "combine.partial");
  // Fused after sharding: the passes still make the experts' gate/up SiluMul node.
  absl::StatusOr<Graph> fused = RunPasses(*g);
  ASSERT_TRUE(fused.ok()) << fused.status();
  // The split experts' columns are never gathered: a reader that needs them whole is
  // refused by name.
  GraphBuilder b;
  const TensorId x = b.Input("x", DType::kF32, {1, 64});
  const TensorId ids = b.Input("ids", DType::kI32, {1, 2});
  const TensorId y = b.MoeMatMul(x, b.Weight("experts", DType::kF32, {4, 32, 64}), ids, "up");
  b.Output("y", b.RmsNorm(y, b.Weight("n", DType::kF32, {64}), 1e-5f, "norm"));
  ShardPlan plan;
  plan.tensors["experts"] = {ShardSpec::Kind::kSplit, 1};
  absl::StatusOr<Graph> r = ShardGraph(*std::move(b).Build(), plan, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "'up'")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "columns of the chosen experts"))
      << r.status();
}

TEST(ShardGraph, RefusesWhatDoesNotDivideOrCannotSplit) {
  const LlamaConfig c = TinyLlamaConfig();
  absl::StatusOr<ShardPlan> four = LlamaShardPlan(c, 4);  // 2 KV heads
  ASSERT_FALSE(four.ok());
  EXPECT_TRUE(absl::StrContains(four.status().message(), "num_key_value_heads (2)"))
      << four.status();
  LlamaConfig moe = c;
  moe.num_experts = 4;
  moe.experts_per_token = 2;
  moe.moe_intermediate_size = 66;  // 16.5 a rank over 4
  moe.num_key_value_heads = 4;
  moe.intermediate_size = 690;  // no dense layer reads it: not checked
  absl::StatusOr<ShardPlan> routed = LlamaShardPlan(moe, 4);
  ASSERT_FALSE(routed.ok());
  EXPECT_TRUE(absl::StrContains(routed.status().message(), "moe_intermediate_size (66)"))
      << routed.status();
  moe.moe_intermediate_size = 64;
  EXPECT_TRUE(LlamaShardPlan(moe, 4).ok());
  moe.moe_layers = {false, true, true, true};  // a dense first layer reads it
  routed = LlamaShardPlan(moe, 4);
  ASSERT_FALSE(routed.ok());
  EXPECT_TRUE(absl::StrContains(routed.status().message(), "intermediate_size (690)"))
      << routed.status();
  EXPECT_FALSE(LlamaShardPlan(c, 0).ok());
  EXPECT_FALSE(ShardGraph(*BuildLlamaDecodeGraph(c, {.max_seq = 16}), {}, 65).ok());

  GraphBuilder b;
  const TensorId x = b.Input("x", DType::kF32, {1, 64});
  const TensorId table = b.Weight("table", DType::kF32, {100, 64});
  const TensorId w = b.Weight("w", DType::kF32, {32, 64});
  b.Output("y", b.MatMul(x, w, "mm"));
  b.Output("e", b.Embedding(table, b.Input("ids", DType::kI32, {1}), "embed"));
  const Graph g = *std::move(b).Build();
  ShardPlan split_table;
  split_table.tensors["table"] = {ShardSpec::Kind::kSplit, 0};
  absl::StatusOr<Graph> r = ShardGraph(g, split_table, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "'table'")) << r.status();
  // A weight split by columns over an input every rank holds whole.
  ShardPlan by_columns;
  by_columns.tensors["w"] = {ShardSpec::Kind::kSplit, 1};
  r = ShardGraph(g, by_columns, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "whole on every rank")) << r.status();
  // Three ranks do not divide 32 rows.
  ShardPlan rows;
  rows.tensors["w"] = {ShardSpec::Kind::kSplit, 0};
  r = ShardGraph(g, rows, 3);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "does not divide by 3")) << r.status();
  // Two ranks split it, and its output is gathered for the graph's reader.
  r = ShardGraph(g, rows, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(OpCounts(*r)["AllGather"], 1);
  // A block-format weight splits its columns on block boundaries only.
  GraphBuilder q;
  const TensorId qx = q.Input("x", DType::kF32, {1, 96});
  q.Output("y", q.MatMul(qx, q.Weight("wq", DType::kQ4_0, {8, 96}), "mm"));
  Tensor wq{"wq", TensorKind::kWeight, DType::kQ4_0, Shape{8, 96}};
  absl::StatusOr<Shape> s = ShardShape(wq, {ShardSpec::Kind::kSplit, 1}, 2);  // 48 per rank
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.status().message(), "blocks")) << s.status();
  EXPECT_TRUE(ShardShape(wq, {ShardSpec::Kind::kSplit, 1}, 3).ok());  // 32 per rank
  // Fused nodes are not sharded.
  absl::StatusOr<Graph> fused = RunPasses(*BuildLlamaDecodeGraph(c, {.max_seq = 16}));
  ASSERT_TRUE(fused.ok());
  r = ShardGraph(*fused, *LlamaShardPlan(c, 2), 2);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "shard before fusing")) << r.status();
}

TEST(ShardTensorBytes, PartsJoinIntoTheWhole) {
  std::mt19937 rng(7);
  for (DType t : {DType::kF32, DType::kBF16, DType::kQ8_0}) {
    const Tensor w{"w", TensorKind::kWeight, t, Shape{6, 192}};
    std::vector<std::byte> whole(static_cast<size_t>(w.bytes()));
    for (std::byte& v : whole) v = static_cast<std::byte>(rng());
    for (int dim : {0, 1}) {
      const int ranks = 3;
      const ShardSpec spec{ShardSpec::Kind::kSplit, dim};
      const Shape part_shape = *ShardShape(w, spec, ranks);
      const int64_t part_bytes = TensorBytes(t, part_shape);
      std::vector<std::vector<std::byte>> parts(ranks);
      for (int r = 0; r < ranks; ++r) {
        parts[r].assign(static_cast<size_t>(part_bytes), std::byte{0xAB});
        ASSERT_TRUE(ShardTensorBytes(w, spec, r, ranks, whole, absl::MakeSpan(parts[r])).ok());
      }
      // Joined back: by rows, one part after another; by columns, row by row.
      std::vector<std::byte> joined;
      const int64_t rows = dim == 0 ? 1 : 6;
      const int64_t run = part_bytes / rows;
      for (int64_t i = 0; i < rows; ++i) {
        for (int r = 0; r < ranks; ++r) {
          joined.insert(joined.end(), parts[r].begin() + i * run, parts[r].begin() + (i + 1) * run);
        }
      }
      EXPECT_EQ(joined, whole) << DTypeName(t) << " dim " << dim;
    }
  }
  const Tensor bias{"b", TensorKind::kWeight, DType::kF32, Shape{4}};
  std::vector<float> values = {1.5f, -2.0f, 3.25f, 4.0f}, part(4, 9.0f);
  auto bytes = [](std::vector<float>& v) {
    return absl::MakeSpan(reinterpret_cast<std::byte*>(v.data()), v.size() * 4);
  };
  ASSERT_TRUE(ShardTensorBytes(bias, {ShardSpec::Kind::kFirstRank, 0}, 0, 2, bytes(values),
                               bytes(part)).ok());
  EXPECT_EQ(part, values);
  ASSERT_TRUE(ShardTensorBytes(bias, {ShardSpec::Kind::kFirstRank, 0}, 1, 2, bytes(values),
                               bytes(part)).ok());
  EXPECT_EQ(part, std::vector<float>(4, 0.0f));
  EXPECT_FALSE(ShardTensorBytes(bias, {}, 2, 2, bytes(values), bytes(part)).ok());
}

}  // namespace
}  // namespace sg
