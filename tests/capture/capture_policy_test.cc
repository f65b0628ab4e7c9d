// The host-side decisions of capture, without a GPU: which bucket serves a step, which
// plans may be captured (through the mock dispatcher and a stand-in for "is device
// memory"), and whether a change of bindings patches nodes or captures again.
#include "stepgraph/capture/capture_policy.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "stepgraph/graph/passes.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/dispatch/mock_dispatch.h"
#include "tests/testing/util.h"

namespace sg {
namespace {

ExecutionPlan TinyPlan(int64_t layers = 2, int64_t batch = 1) {
  LlamaConfig c = TinyLlamaConfig();
  c.num_hidden_layers = layers;
  absl::StatusOr<Graph> g = BuildLlamaDecodeGraph(c, {.batch = batch, .max_seq = 16});
  EXPECT_TRUE(g.ok()) << g.status();
  absl::StatusOr<ExecutionPlan> p = ExecutionPlan::Create(*std::move(g));
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

TEST(ChooseBucketTest, SmallestBucketThatHoldsTheRows) {
  const std::vector<int64_t> b = {1, 2, 4, 8, 16, 32};
  EXPECT_EQ(*ChooseBucket(b, 1), 1);
  EXPECT_EQ(*ChooseBucket(b, 2), 2);
  EXPECT_EQ(*ChooseBucket(b, 3), 4);
  EXPECT_EQ(*ChooseBucket(b, 5), 8);
  EXPECT_EQ(*ChooseBucket(b, 17), 32);
  EXPECT_EQ(*ChooseBucket(b, 32), 32);
  EXPECT_EQ(ChooseBucket(b, 33).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ChooseBucket(b, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChooseBucket(b, -2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ChooseBucket(std::vector<int64_t>{3, 6}, 4), 6);
}

TEST(ChooseBucketTest, RefusesBadBucketLists) {
  EXPECT_FALSE(ValidateBuckets({}).ok());
  EXPECT_FALSE(ValidateBuckets(std::vector<int64_t>{0, 1}).ok());
  EXPECT_FALSE(ValidateBuckets(std::vector<int64_t>{2, 2}).ok());
  EXPECT_FALSE(ValidateBuckets(std::vector<int64_t>{4, 2}).ok());
  EXPECT_TRUE(ValidateBuckets(std::vector<int64_t>{1, 3, 7}).ok());
  EXPECT_FALSE(ChooseBucket(std::vector<int64_t>{4, 2}, 1).ok());
}

// Host memory stands in for device memory: every buffer the test binds is "device"
// unless listed as host.
struct FakeMemory {
  absl::flat_hash_set<const void*> host;
  DevicePointerCheck check() const {
    return [this](const void* p) { return p != nullptr && !host.contains(p); };
  }
};

TEST(CheckCaptureSafetyTest, AcceptsAPlanOfDeviceBuffers) {
  const ExecutionPlan plan = TinyPlan();
  testing::HostBindings memory(plan);
  MockDispatch mock;
  FakeMemory fake;
  EXPECT_TRUE(CheckCaptureSafety(plan, memory.bindings(), mock, fake.check()).ok());
}

TEST(CheckCaptureSafetyTest, RefusesAnUnsafeOpNamingTheNode) {
  const ExecutionPlan plan = TinyPlan();
  testing::HostBindings memory(plan);
  MockDispatch mock;
  mock.SetCaptureUnsafe("Attention");
  FakeMemory fake;
  const absl::Status s = CheckCaptureSafety(plan, memory.bindings(), mock, fake.check());
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("Attention"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("model.layers.0"), absl::string_view::npos) << s;
}

TEST(CheckCaptureSafetyTest, RefusesHostBuffersNamingNodeAndTensor) {
  const ExecutionPlan plan = TinyPlan();
  testing::HostBindings memory(plan);
  MockDispatch mock;
  FakeMemory fake;
  const TensorId w = *plan.graph().FindTensor("model.layers.1.mlp.up_proj.weight");
  fake.host.insert(memory.bindings().buffer(w.index).data);
  absl::Status s = CheckCaptureSafety(plan, memory.bindings(), mock, fake.check());
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("model.layers.1.mlp.up_proj.weight"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("MatMul"), absl::string_view::npos) << s;

  fake.host.clear();
  fake.host.insert(memory.bindings().arena().data);
  s = CheckCaptureSafety(plan, memory.bindings(), mock, fake.check());
  EXPECT_NE(s.message().find("arena"), absl::string_view::npos) << s;
}

TEST(CheckCaptureSafetyTest, SaysWhichNodeWritesAHostCache) {
  // The first node to touch a KV cache writes it: a KvWrite in place in the plain step,
  // the FusedMatMul's RoPE + KV-write epilogue, as a side effect, in the fused one.
  LlamaConfig c = TinyLlamaConfig();
  c.num_hidden_layers = 1;
  absl::StatusOr<Graph> plain = BuildLlamaDecodeGraph(c, {.batch = 1, .max_seq = 16});
  ASSERT_TRUE(plain.ok()) << plain.status();
  absl::StatusOr<Graph> fused = RunPasses(*plain);
  ASSERT_TRUE(fused.ok()) << fused.status();
  for (auto [graph, op] : {std::pair{&*plain, "KvWrite"}, std::pair{&*fused, "FusedMatMul"}}) {
    absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*graph);
    ASSERT_TRUE(plan.ok()) << plan.status();
    testing::HostBindings memory(*plan);
    MockDispatch mock;
    FakeMemory fake;
    const TensorId kc = *plan->graph().FindTensor(KCacheName(0));
    fake.host.insert(memory.bindings().buffer(kc.index).data);
    const absl::Status s = CheckCaptureSafety(*plan, memory.bindings(), mock, fake.check());
    ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find(absl::StrCat("(", op, ") writes State '", KCacheName(0))),
              absl::string_view::npos)
        << s;
  }
  // A weight is only read.
  const ExecutionPlan plan = TinyPlan();
  testing::HostBindings memory(plan);
  MockDispatch mock;
  FakeMemory fake;
  const TensorId w = *plan.graph().FindTensor("model.layers.0.self_attn.q_proj.weight");
  fake.host.insert(memory.bindings().buffer(w.index).data);
  const absl::Status s = CheckCaptureSafety(plan, memory.bindings(), mock, fake.check());
  EXPECT_NE(s.message().find("(MatMul) reads Weight"), absl::string_view::npos) << s;
}

TEST(CheckCaptureSafetyTest, RefusesMissingBindings) {
  const ExecutionPlan plan = TinyPlan();
  Bindings empty(plan.graph());
  MockDispatch mock;
  FakeMemory fake;
  EXPECT_FALSE(CheckCaptureSafety(plan, empty, mock, fake.check()).ok());
}

TEST(DecideUpdateTest, SameAddressesNeedNothing) {
  const ExecutionPlan plan = TinyPlan();
  testing::HostBindings memory(plan);
  Bindings copy = memory.bindings();
  const UpdateDecision d = DecideUpdate(plan, memory.bindings(), copy);
  EXPECT_EQ(d.kind, UpdateDecision::Kind::kNothing);
  EXPECT_TRUE(d.nodes.empty());
}

TEST(DecideUpdateTest, ARebindingPatchesExactlyTheNodesThatUseIt) {
  const ExecutionPlan plan = TinyPlan();
  testing::HostBindings memory(plan);
  Bindings next = memory.bindings();
  const std::string name = "model.layers.0.self_attn.k_proj.weight";
  const Tensor& t = plan.graph().tensor(*plan.graph().FindTensor(name));
  std::vector<uint8_t> other(t.bytes());
  ASSERT_TRUE(next.Bind(name, other.data(), t.bytes()).ok());
  const UpdateDecision d = DecideUpdate(plan, memory.bindings(), next);
  ASSERT_EQ(d.kind, UpdateDecision::Kind::kPatchNodes);
  ASSERT_EQ(d.nodes.size(), 1u);
  EXPECT_EQ(plan.graph().nodes()[d.nodes[0]].name, "model.layers.0.self_attn.k_proj");

  // A KV cache is read by attention and written by KvWrite: both move.
  Bindings cache_moved = memory.bindings();
  const Tensor& kc = plan.graph().tensor(*plan.graph().FindTensor(KCacheName(1)));
  std::vector<uint8_t> cache(kc.bytes());
  ASSERT_TRUE(cache_moved.Bind(KCacheName(1), cache.data(), kc.bytes()).ok());
  const UpdateDecision dc = DecideUpdate(plan, memory.bindings(), cache_moved);
  ASSERT_EQ(dc.kind, UpdateDecision::Kind::kPatchNodes);
  std::vector<std::string> ops;
  for (int32_t n : dc.nodes) ops.emplace_back(OpName(plan.graph().nodes()[n].op));
  EXPECT_EQ(ops, (std::vector<std::string>{"KvWrite", "Attention"}));
}

TEST(DecideUpdateTest, MovingTheArenaCapturesAgain) {
  const ExecutionPlan plan = TinyPlan();
  testing::HostBindings memory(plan);
  Bindings next = memory.bindings();
  std::vector<uint8_t> arena(plan.arena_bytes());
  next.SetArena(arena.data(), plan.arena_bytes());
  const UpdateDecision d = DecideUpdate(plan, memory.bindings(), next);
  EXPECT_EQ(d.kind, UpdateDecision::Kind::kRecapture);
  EXPECT_EQ(static_cast<int>(d.nodes.size()), plan.graph().num_nodes());
  // With no patching allowed even one moved weight captures again.
  Bindings one = memory.bindings();
  const Tensor& t = plan.graph().tensor(*plan.graph().FindTensor("lm_head.weight"));
  std::vector<uint8_t> other(t.bytes());
  ASSERT_TRUE(one.Bind("lm_head.weight", other.data(), t.bytes()).ok());
  EXPECT_EQ(DecideUpdate(plan, memory.bindings(), one, 0.0).kind,
            UpdateDecision::Kind::kRecapture);
}

}  // namespace
}  // namespace sg
