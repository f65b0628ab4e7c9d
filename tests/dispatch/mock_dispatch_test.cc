// The mock trace of a one-layer Llama decode step: which ops launch, in what order, on
// which buffers. The buffers make the memory plan visible: weights and caches by their
// Hugging Face names, intermediates by arena offset, so the trace shows both that the arena
// is reused and that nothing alive is overwritten.
#include "stepgraph/dispatch/mock_dispatch.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/graph/memory_plan.h"
#include "tests/testing/util.h"

namespace sg {
namespace {

ExecutionPlan OneLayerPlan(const LlamaGraphOptions& options) {
  LlamaConfig config = TinyLlamaConfig();
  config.num_hidden_layers = 1;
  absl::StatusOr<Graph> g = BuildLlamaDecodeGraph(config, options);
  EXPECT_TRUE(g.ok()) << g.status();
  absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(g));
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

std::vector<TraceEntry> TraceOneStep(const ExecutionPlan& plan) {
  testing::HostBindings memory(plan);
  MockDispatch mock;
  absl::StatusOr<ExecStats> stats = Execute(plan, memory.bindings(), mock);
  EXPECT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->launches, static_cast<int64_t>(mock.trace().size()));
  return mock.trace();
}

int64_t TraceBytes(const TraceArg& a) { return a.shape.NumElements() * DTypeBytes(a.dtype); }

TEST(MockTraceTest, OneLayerLlamaLaunchesTheBlockInOrder) {
  const ExecutionPlan plan = OneLayerPlan({.batch = 1});
  const std::vector<TraceEntry> trace = TraceOneStep(plan);
  const std::vector<std::string> want = {
      "Embedding", "RmsNorm", "MatMul",  "MatMul", "MatMul",  "Rope",    "Rope",
      "KvWrite",   "KvWrite", "Attention", "MatMul", "Add",   "RmsNorm", "MatMul",
      "MatMul",    "SiluMul", "MatMul",  "Add",    "RmsNorm", "MatMul",  "Argmax"};
  ASSERT_EQ(trace.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(trace[i].op, want[i]) << "launch " << i << ": " << trace[i].ToString();
    EXPECT_EQ(trace[i].node_index, static_cast<int32_t>(i));
  }
  // Node names are the HF module paths.
  EXPECT_EQ(trace[2].node, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(trace[16].node, "model.layers.0.mlp.down_proj");
  EXPECT_EQ(trace[19].node, "lm_head");
}

TEST(MockTraceTest, BoundBuffersAreNamedByKindAndHfName) {
  const ExecutionPlan plan = OneLayerPlan({.batch = 1});
  const std::vector<TraceEntry> trace = TraceOneStep(plan);
  ASSERT_EQ(trace.size(), 21u);
  EXPECT_EQ(trace[0].inputs[0].buffer, "weight:model.embed_tokens.weight");
  EXPECT_EQ(trace[0].inputs[1].buffer, "input:ids");
  EXPECT_EQ(trace[1].inputs[1].buffer, "weight:model.layers.0.input_layernorm.weight");
  EXPECT_EQ(trace[2].inputs[1].buffer, "weight:model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(trace[3].inputs[1].buffer, "weight:model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(trace[4].inputs[1].buffer, "weight:model.layers.0.self_attn.v_proj.weight");
  EXPECT_EQ(trace[5].inputs[1].buffer, "input:pos");
  EXPECT_EQ(trace[10].inputs[1].buffer, "weight:model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(trace[12].inputs[1].buffer,
            "weight:model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(trace[13].inputs[1].buffer, "weight:model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(trace[14].inputs[1].buffer, "weight:model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(trace[16].inputs[1].buffer, "weight:model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(trace[18].inputs[1].buffer, "weight:model.norm.weight");
  EXPECT_EQ(trace[19].inputs[1].buffer, "weight:lm_head.weight");
  // The cache writes go to the States they name, which attention then reads.
  EXPECT_EQ(trace[7].output.buffer, "state:model.layers.0.k_cache");
  EXPECT_EQ(trace[7].inputs[2].buffer, "state:model.layers.0.k_cache");
  EXPECT_EQ(trace[8].output.buffer, "state:model.layers.0.v_cache");
  EXPECT_EQ(trace[9].inputs[1].buffer, "state:model.layers.0.k_cache");
  EXPECT_EQ(trace[9].inputs[2].buffer, "state:model.layers.0.v_cache");
  // Every argument's buffer follows from its tensor's kind.
  for (const TraceEntry& e : trace) {
    std::vector<TraceArg> args = e.inputs;
    args.push_back(e.output);
    for (const TraceArg& a : args) {
      const Tensor& t = plan.graph().tensor(*plan.graph().FindTensor(a.tensor));
      if (t.kind == TensorKind::kIntermediate) {
        EXPECT_TRUE(absl::StartsWith(a.buffer, "arena+")) << e.ToString();
      } else {
        EXPECT_EQ(a.buffer, absl::StrCat(absl::AsciiStrToLower(TensorKindName(t.kind)), ":",
                                         t.name))
            << e.ToString();
      }
    }
  }
}

TEST(MockTraceTest, ArenaIsReusedAndNeverOverwrittenWhileAlive) {
  const ExecutionPlan plan = OneLayerPlan({.batch = 1});
  const std::vector<TraceEntry> trace = TraceOneStep(plan);
  const int32_t last_launch = static_cast<int32_t>(trace.size()) - 1;

  // What the trace alone says about each intermediate: where it is, how big, and from
  // which launch to which it must stay intact.
  struct Seen {
    std::string buffer;
    int64_t offset = -1;
    int64_t bytes = 0;
    int32_t first = -1;
    int32_t last = -1;
  };
  std::map<std::string, Seen> seen;
  auto note = [&](const TraceArg& a, int32_t launch, bool produced) {
    if (!absl::StartsWith(a.buffer, "arena+")) return;
    Seen& s = seen[a.tensor];
    if (s.buffer.empty()) {
      s.buffer = a.buffer;
      ASSERT_TRUE(absl::SimpleAtoi(a.buffer.substr(6), &s.offset)) << a.buffer;
      s.bytes = TraceBytes(a);
    }
    EXPECT_EQ(s.buffer, a.buffer) << a.tensor << " moved between launches";
    if (produced) {
      EXPECT_EQ(s.first, -1) << a.tensor << " produced twice";
      s.first = launch;
    } else {
      EXPECT_NE(s.first, -1) << a.tensor << " read before it was produced";
    }
    s.last = std::max(s.last, launch);
  };
  for (const TraceEntry& e : trace) {
    for (const TraceArg& a : e.inputs) note(a, e.node_index, /*produced=*/false);
    note(e.output, e.node_index, /*produced=*/true);
  }
  for (const GraphOutput& o : plan.graph().outputs()) {
    auto it = seen.find(plan.graph().tensor(o.tensor).name);
    if (it != seen.end()) it->second.last = last_launch;
  }
  // 19 intermediates: every launch but the two cache writes produces one.
  ASSERT_EQ(seen.size(), 19u);

  int shared_disjoint = 0;
  for (auto a = seen.begin(); a != seen.end(); ++a) {
    for (auto b = std::next(a); b != seen.end(); ++b) {
      const Seen& x = a->second;
      const Seen& y = b->second;
      const bool live_together = x.first <= y.last && y.first <= x.last;
      const bool bytes_overlap =
          x.offset < y.offset + y.bytes && y.offset < x.offset + x.bytes;
      if (live_together) {
        EXPECT_FALSE(bytes_overlap)
            << a->first << " @" << x.buffer << " (" << x.bytes << " bytes, launches "
            << x.first << ".." << x.last << ") and " << b->first << " @" << y.buffer << " ("
            << y.bytes << " bytes, launches " << y.first << ".." << y.last << ")";
        EXPECT_NE(x.buffer, y.buffer) << a->first << " and " << b->first;
      } else if (x.buffer == y.buffer) {
        ++shared_disjoint;
      }
    }
  }
  EXPECT_GE(shared_disjoint, 2) << "no two intermediates with disjoint lifetimes share bytes";
  EXPECT_LT(plan.arena_bytes(), plan.memory().intermediate_bytes);
}

TEST(MockTraceTest, EntryToStringShowsOpArgumentsAndBuffers) {
  const ExecutionPlan plan = OneLayerPlan({.batch = 1});
  const std::vector<TraceEntry> trace = TraceOneStep(plan);
  ASSERT_GT(trace.size(), 2u);
  const TraceEntry& q = trace[2];
  const std::string text = q.ToString();
  EXPECT_TRUE(absl::StartsWith(text, "#2 MatMul model.layers.0.self_attn.q_proj (")) << text;
  EXPECT_TRUE(absl::StrContains(
      text, "model.layers.0.self_attn.q_proj.weight [256,256] f32 "
            "@weight:model.layers.0.self_attn.q_proj.weight"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, absl::StrCat("-> model.layers.0.self_attn.q_proj [1,256] f32 @",
                                                   q.output.buffer)))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "@arena+")) << text;
}

TEST(MockTraceTest, ClosedLoopWithSamplingWritesTheStepInputs) {
  const ExecutionPlan plan =
      OneLayerPlan({.batch = 2, .sampling = ops::Sample{.temperature = 0.7f, .top_k = 40},
                    .closed_loop = true});
  const std::vector<TraceEntry> trace = TraceOneStep(plan);
  ASSERT_EQ(trace.size(), 23u);
  EXPECT_EQ(trace[20].op, "Sample");
  EXPECT_EQ(trace[20].inputs[1].buffer, "input:seeds");
  EXPECT_EQ(trace[21].op, "Copy");
  EXPECT_EQ(trace[21].output.buffer, "input:ids");
  EXPECT_EQ(trace[22].op, "Advance");
  EXPECT_EQ(trace[22].output.buffer, "input:pos");
  EXPECT_EQ(trace[22].output.shape, Shape({2}));
}

TEST(MockTraceTest, ClearAndCounting) {
  const ExecutionPlan plan = OneLayerPlan({.batch = 1});
  testing::HostBindings memory(plan);
  MockDispatch mock;
  ASSERT_TRUE(Execute(plan, memory.bindings(), mock).ok());
  ASSERT_TRUE(Execute(plan, memory.bindings(), mock).ok());
  EXPECT_EQ(mock.launches(), 42);
  EXPECT_EQ(mock.trace().size(), 42u);
  mock.Clear();
  EXPECT_EQ(mock.launches(), 0);
  EXPECT_TRUE(mock.trace().empty());
}

}  // namespace
}  // namespace sg
