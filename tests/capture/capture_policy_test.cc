// The host-side decisions of capture, without a GPU: which bucket serves a step, and which
// plans may be captured (through the mock dispatcher and a stand-in for "is device
// memory").
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
  // The bucket ChooseBucket picks, by its size.
  auto chosen = [&](const std::vector<int64_t>& buckets, int64_t rows) {
    absl::StatusOr<int> i = ChooseBucket(buckets, rows);
    EXPECT_TRUE(i.ok()) << i.status();
    return i.ok() ? buckets[*i] : int64_t{-1};
  };
  EXPECT_EQ(chosen(b, 1), 1);
  EXPECT_EQ(chosen(b, 2), 2);
  EXPECT_EQ(chosen(b, 3), 4);
  EXPECT_EQ(chosen(b, 5), 8);
  EXPECT_EQ(chosen(b, 17), 32);
  EXPECT_EQ(chosen(b, 32), 32);
  EXPECT_EQ(*ChooseBucket(b, 32), 5);
  EXPECT_EQ(ChooseBucket(b, 33).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ChooseBucket(b, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChooseBucket(b, -2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(chosen({3, 6}, 4), 6);
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

}  // namespace
}  // namespace sg
