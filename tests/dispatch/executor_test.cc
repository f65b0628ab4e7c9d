// The executor against MockDispatch: one launch per node in graph order, every binding
// checked before anything runs (each refusal names the tensor), and a dispatch failure
// stopping the step with the node's index and name and the original error code.
#include "stepgraph/dispatch/executor.h"

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/dispatch/mock_dispatch.h"
#include "stepgraph/graph/memory_plan.h"
#include "tests/testing/status_matchers.h"

namespace sg {
namespace {

using ::sg::testing::IsError;

// A small step that touches every kind of bound tensor:
//   h = Embedding(table, ids); k = MatMul(h, wk); KvWrite(k -> k_cache, v_cache);
//   a = Attention(h, caches, pos); s = Add(a, h); logits = MatMul(s, table); Argmax.
ExecutionPlan SmallPlan() {
  GraphBuilder b;
  const TensorId ids = b.Input("ids", DType::kI32, {2});
  const TensorId pos = b.Input("pos", DType::kI32, {2});
  const TensorId table = b.Weight("table", DType::kF32, {32, 16});
  const TensorId wk = b.Weight("wk", DType::kF32, {16, 16});
  const TensorId kc = b.State("k_cache", DType::kF32, {2, 1, 8, 16});
  const TensorId vc = b.State("v_cache", DType::kF32, {2, 1, 8, 16});
  const TensorId h = b.Embedding(table, ids, "embed");
  const TensorId k = b.MatMul(h, wk, "k_proj");
  b.KvWrite(k, pos, kc, "k_write");
  b.KvWrite(k, pos, vc, "v_write");
  const TensorId a = b.Attention(h, kc, vc, pos, "attn");
  const TensorId s = b.Add(a, h, "residual");
  const TensorId logits = b.MatMul(s, table, "lm_head");
  b.Output("logits", logits);
  b.Output("next_ids", b.Argmax(logits, "argmax"));
  absl::StatusOr<Graph> g = std::move(b).Build();
  EXPECT_TRUE(g.ok()) << g.status();
  absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(g));
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

// Host memory for every bound tensor and the arena. Mock dispatch never reads it, but it
// is real so that a dispatcher that did would not fault.
class Memory {
 public:
  // Binds every bound tensor except `skip`, giving `shrink` its size minus one byte.
  explicit Memory(const ExecutionPlan& plan, absl::string_view skip = {},
                  absl::string_view shrink = {})
      : bindings_(plan.graph()) {
    const Graph& g = plan.graph();
    arena_.resize(plan.arena_bytes());
    bindings_.SetArena(arena_.data(), plan.arena_bytes());
    for (int32_t i = 0; i < g.num_tensors(); ++i) {
      const Tensor& t = g.tensors()[i];
      if (t.kind == TensorKind::kIntermediate || (!skip.empty() && t.name == skip)) continue;
      const int64_t bytes = !shrink.empty() && t.name == shrink ? t.bytes() - 1 : t.bytes();
      buffers_.push_back(std::make_unique<std::byte[]>(t.bytes()));
      const absl::Status s = bindings_.Bind(t.name, buffers_.back().get(), bytes);
      EXPECT_TRUE(s.ok()) << s;
    }
  }

  Bindings& bindings() { return bindings_; }
  std::byte* arena() { return arena_.data(); }

 private:
  Bindings bindings_;
  std::vector<std::byte> arena_;
  std::vector<std::unique_ptr<std::byte[]>> buffers_;
};

TEST(ExecutorTest, OneLaunchPerNodeInOrder) {
  const ExecutionPlan plan = SmallPlan();
  Memory memory(plan);
  MockDispatch mock;
  absl::StatusOr<ExecStats> stats = Execute(plan, memory.bindings(), mock);
  ASSERT_TRUE(stats.ok()) << stats.status();
  const Graph& g = plan.graph();
  EXPECT_EQ(g.num_nodes(), 8);
  EXPECT_EQ(stats->launches, g.num_nodes());
  EXPECT_EQ(mock.launches(), g.num_nodes());
  ASSERT_EQ(static_cast<int>(mock.trace().size()), g.num_nodes());
  for (int i = 0; i < g.num_nodes(); ++i) {
    const TraceEntry& e = mock.trace()[i];
    const Node& n = g.nodes()[i];
    EXPECT_EQ(e.node_index, i);
    EXPECT_EQ(e.node, n.name);
    EXPECT_EQ(e.op, OpName(n.op));
    ASSERT_EQ(e.inputs.size(), n.inputs.size()) << n.name;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      EXPECT_EQ(e.inputs[k].tensor, g.tensor(n.inputs[k]).name);
      EXPECT_EQ(e.inputs[k].shape, g.tensor(n.inputs[k]).shape);
      EXPECT_EQ(e.inputs[k].dtype, g.tensor(n.inputs[k]).dtype);
    }
    EXPECT_EQ(e.output.tensor, g.tensor(n.output).name);
  }

  // A second step launches every node again.
  stats = Execute(plan, memory.bindings(), mock);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->launches, g.num_nodes());
  EXPECT_EQ(mock.launches(), 2 * g.num_nodes());
}

TEST(ExecutorTest, EveryMissingBindingIsRefusedBeforeAnythingRuns) {
  const ExecutionPlan plan = SmallPlan();
  int checked = 0;
  for (const Tensor& t : plan.graph().tensors()) {
    if (t.kind == TensorKind::kIntermediate) continue;
    ++checked;
    Memory memory(plan, /*skip=*/t.name);
    MockDispatch mock;
    absl::StatusOr<ExecStats> stats = Execute(plan, memory.bindings(), mock);
    EXPECT_TRUE(IsError(stats.status(), absl::StatusCode::kInvalidArgument,
                        {absl::StrCat(TensorKindName(t.kind), " '", t.name, "'"),
                         t.shape.ToString(), "not bound"}))
        << t.name;
    EXPECT_EQ(mock.launches(), 0) << t.name;
    EXPECT_TRUE(mock.trace().empty()) << t.name;
    EXPECT_EQ(CheckBindings(plan, memory.bindings()), stats.status());
  }
  EXPECT_EQ(checked, 6);  // ids, pos, table, wk, k_cache, v_cache
}

TEST(ExecutorTest, EveryTooSmallBufferIsRefusedBeforeAnythingRuns) {
  const ExecutionPlan plan = SmallPlan();
  for (const Tensor& t : plan.graph().tensors()) {
    if (t.kind == TensorKind::kIntermediate) continue;
    Memory memory(plan, /*skip=*/{}, /*shrink=*/t.name);
    MockDispatch mock;
    absl::StatusOr<ExecStats> stats = Execute(plan, memory.bindings(), mock);
    EXPECT_TRUE(IsError(stats.status(), absl::StatusCode::kInvalidArgument,
                        {absl::StrCat("'", t.name, "'"),
                         absl::StrCat("needs ", t.bytes(), " bytes"),
                         absl::StrCat("has ", t.bytes() - 1)}))
        << t.name;
    EXPECT_EQ(mock.launches(), 0) << t.name;
  }
}

TEST(ExecutorTest, LargerBuffersAreAccepted) {
  const ExecutionPlan plan = SmallPlan();
  Memory memory(plan);
  std::vector<std::byte> big(4096);
  ASSERT_TRUE(memory.bindings().Bind("ids", big.data(), big.size()).ok());
  std::vector<std::byte> arena(plan.arena_bytes() + 1024);
  memory.bindings().SetArena(arena.data(), arena.size());
  MockDispatch mock;
  absl::StatusOr<ExecStats> stats = Execute(plan, memory.bindings(), mock);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->launches, plan.graph().num_nodes());
}

TEST(ExecutorTest, MissingOrSmallArenaIsRefused) {
  const ExecutionPlan plan = SmallPlan();
  ASSERT_GT(plan.arena_bytes(), 0);
  {
    Memory memory(plan);
    memory.bindings().SetArena(nullptr, 0);
    MockDispatch mock;
    EXPECT_TRUE(IsError(Execute(plan, memory.bindings(), mock).status(),
                        absl::StatusCode::kInvalidArgument,
                        {"arena is not bound",
                         absl::StrCat("the plan needs ", plan.arena_bytes())}));
    EXPECT_EQ(mock.launches(), 0);
  }
  {
    Memory memory(plan);
    memory.bindings().SetArena(memory.arena(), plan.arena_bytes() - 1);
    MockDispatch mock;
    EXPECT_TRUE(IsError(Execute(plan, memory.bindings(), mock).status(),
                        absl::StatusCode::kInvalidArgument,
                        {"arena is too small", absl::StrCat(plan.arena_bytes() - 1, " bytes"),
                         absl::StrCat("the plan needs ", plan.arena_bytes())}));
    EXPECT_EQ(mock.launches(), 0);
  }
}

TEST(ExecutorTest, BindingsOfAnotherGraphAreRefused) {
  const ExecutionPlan plan = SmallPlan();
  const ExecutionPlan twin = SmallPlan();  // same tensors and names, another graph
  Memory memory(twin);
  MockDispatch mock;
  EXPECT_TRUE(IsError(Execute(plan, memory.bindings(), mock).status(),
                      absl::StatusCode::kInvalidArgument, {"another graph"}));
  EXPECT_EQ(mock.launches(), 0);
  // The twin's own plan runs.
  EXPECT_TRUE(Execute(twin, memory.bindings(), mock).ok());
}

TEST(ExecutorTest, BindRefusals) {
  const ExecutionPlan plan = SmallPlan();
  Bindings bindings(plan.graph());
  std::vector<std::byte> buffer(4096);
  EXPECT_TRUE(IsError(bindings.Bind("no_such_tensor", buffer.data(), buffer.size()),
                      absl::StatusCode::kNotFound, {"'no_such_tensor'"}));
  EXPECT_TRUE(IsError(bindings.Bind("k_proj", buffer.data(), buffer.size()),
                      absl::StatusCode::kInvalidArgument,
                      {"'k_proj'", "Intermediate", "arena"}));
  EXPECT_TRUE(IsError(bindings.Bind("wk", nullptr, 1024), absl::StatusCode::kInvalidArgument,
                      {"'wk'", "null"}));
  EXPECT_TRUE(IsError(bindings.Bind("wk", buffer.data(), 0),
                      absl::StatusCode::kInvalidArgument, {"'wk'", "empty"}));

  const ExecutionPlan twin = SmallPlan();
  const TensorId foreign = *twin.graph().FindTensor("wk");
  EXPECT_TRUE(IsError(bindings.Bind(foreign, buffer.data(), buffer.size()),
                      absl::StatusCode::kInvalidArgument, {"another graph"}));
  const TensorId out_of_range{plan.graph().num_tensors(), plan.graph().owner()};
  EXPECT_TRUE(IsError(bindings.Bind(out_of_range, buffer.data(), buffer.size()),
                      absl::StatusCode::kInvalidArgument,
                      {absl::StrCat("tensor id ", plan.graph().num_tensors())}));

  // None of the refusals bound anything.
  const int32_t wk = plan.graph().FindTensor("wk")->index;
  EXPECT_EQ(bindings.buffer(wk).data, nullptr);
  ASSERT_TRUE(bindings.Bind(*plan.graph().FindTensor("wk"), buffer.data(), buffer.size()).ok());
  EXPECT_EQ(bindings.buffer(wk).data, buffer.data());
  EXPECT_EQ(bindings.buffer(wk).bytes, 4096);
}

TEST(ExecutorTest, InjectedFailureStopsAfterKLaunches) {
  const ExecutionPlan plan = SmallPlan();
  const Graph& g = plan.graph();
  for (int k = 0; k < g.num_nodes(); ++k) {
    Memory memory(plan);
    MockDispatch mock;
    mock.FailAt(k, absl::ResourceExhaustedError("simulated out of memory"));
    absl::StatusOr<ExecStats> stats = Execute(plan, memory.bindings(), mock);
    const Node& node = g.nodes()[k];
    EXPECT_TRUE(IsError(stats.status(), absl::StatusCode::kResourceExhausted,
                        {absl::StrCat("node ", k, " '", node.name, "'"), OpName(node.op),
                         "simulated out of memory"}))
        << "k=" << k;
    EXPECT_EQ(mock.launches(), k);
    ASSERT_EQ(static_cast<int>(mock.trace().size()), k);
    if (k > 0) {
      EXPECT_EQ(mock.trace().back().node_index, k - 1);
    }

    // The failure is injected once: the next step runs to the end.
    mock.Clear();
    stats = Execute(plan, memory.bindings(), mock);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->launches, g.num_nodes());
  }
}

TEST(ExecutorTest, ErrorCodesPassThrough) {
  const ExecutionPlan plan = SmallPlan();
  Memory memory(plan);
  for (const absl::Status& injected :
       {absl::InternalError("kernel fault"), absl::OutOfRangeError("token id 99999"),
        absl::UnavailableError("device lost")}) {
    MockDispatch mock;
    mock.FailAt(3, injected);
    const absl::Status s = Execute(plan, memory.bindings(), mock).status();
    EXPECT_EQ(s.code(), injected.code());
    EXPECT_TRUE(absl::StrContains(s.message(), injected.message())) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "node 3 'v_write' (KvWrite)")) << s;
  }
}

TEST(ExecutorTest, ResolveTensorPointsIntoArenaOrBinding) {
  const ExecutionPlan plan = SmallPlan();
  Memory memory(plan);
  const Graph& g = plan.graph();
  for (int32_t i = 0; i < g.num_tensors(); ++i) {
    const Tensor& t = g.tensors()[i];
    const TensorArg arg = ResolveTensor(plan, memory.bindings(), i);
    EXPECT_EQ(arg.tensor, i);
    EXPECT_EQ(arg.name, t.name);
    EXPECT_EQ(arg.shape, t.shape);
    EXPECT_EQ(arg.dtype, t.dtype);
    EXPECT_EQ(arg.kind, t.kind);
    EXPECT_EQ(arg.bytes(), t.bytes());
    if (t.kind == TensorKind::kIntermediate) {
      EXPECT_EQ(arg.arena_offset, plan.memory().offsets[i]);
      EXPECT_EQ(arg.data, memory.arena() + plan.memory().offsets[i]);
    } else {
      EXPECT_EQ(arg.arena_offset, -1);
      EXPECT_EQ(arg.data, memory.bindings().buffer(i).data);
    }
  }
}

TEST(ExecutorTest, UntracedMockOnlyCounts) {
  const ExecutionPlan plan = SmallPlan();
  Memory memory(plan);
  MockDispatch mock(/*record_trace=*/false);
  absl::StatusOr<ExecStats> stats = Execute(plan, memory.bindings(), mock);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(mock.launches(), plan.graph().num_nodes());
  EXPECT_TRUE(mock.trace().empty());
}

// A tensor of 2^50 bytes (a valid shape, far past any device) bound to an 8-byte buffer is
// refused with its true size, never with a wrapped one; no buffer is touched to check.
TEST(CheckBindingsTest, HugeTensorNeedsItsTrueSize) {
  GraphBuilder b;
  const TensorId x = b.Input("x", DType::kF32, {int64_t{1} << 24, int64_t{1} << 24});
  b.Output("y", b.Silu(x, "y"));
  absl::StatusOr<Graph> g = std::move(b).Build();
  ASSERT_TRUE(g.ok()) << g.status();
  absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(g));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->arena_bytes(), int64_t{1} << 50);
  Bindings bindings(plan->graph());
  alignas(8) static std::byte small[8];
  bindings.SetArena(small, plan->arena_bytes());  // a claim only: nothing runs
  ASSERT_TRUE(bindings.Bind("x", small, sizeof(small)).ok());
  const absl::Status st = CheckBindings(*plan, bindings);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), "needs 1125899906842624 bytes but its buffer has 8"))
      << st;
}

// A Run reads its node's state back by type: the state Prepare made for it is returned, a
// missing one or one of another type is FailedPrecondition (a plan executed with another
// dispatcher's or another node's state), never reinterpreted.
struct StateA final : PreparedState<StateA> {
  int value = 7;
};
struct StateB final : PreparedState<StateB> {
  double other = 0.5;
};

TEST(PreparedStateTest, RunGetsItsOwnTypeOrAnError) {
  StateA a;
  StateB b;
  EXPECT_NE(PreparedState<StateA>::Tag(), PreparedState<StateB>::Tag());
  NodeArgs args;
  args.prepared = &a;
  absl::StatusOr<const StateA*> got = args.PreparedAs<StateA>();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, &a);
  EXPECT_EQ((*got)->value, 7);
  absl::StatusOr<const StateB*> wrong = args.PreparedAs<StateB>();
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(wrong.status().message(), "not of the type")) << wrong.status();
  args.prepared = &b;
  EXPECT_FALSE(args.PreparedAs<StateA>().ok());
  EXPECT_TRUE(args.PreparedAs<StateB>().ok());
  args.prepared = nullptr;
  absl::StatusOr<const StateA*> missing = args.PreparedAs<StateA>();
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "no prepared state"))
      << missing.status();
}

}  // namespace
}  // namespace sg
