// Capture and replay on the GPU: a replayed step gives the same bits as the same plan run
// eagerly, a closed loop decodes on the device alone, and batch buckets give the
// exact-size results for their live rows. Skipped without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_handles.h"
#include "dispatch/cuda/cuda_status.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/capture/capture_policy.h"
#include "stepgraph/capture/cuda_graph.h"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/base/status.h"
#include "stepgraph/runtime/step_runner.h"
#include "tests/testing/util.h"

namespace sg {
namespace {

using testing::HostTensor;

#define SKIP_WITHOUT_GPU()                                  \
  do {                                                      \
    if (!CudaDeviceAvailable()) GTEST_SKIP() << "no GPU";   \
  } while (0)

#define ASSERT_OK(expr)                                     \
  do {                                                      \
    const absl::Status _s = (expr);                         \
    ASSERT_TRUE(_s.ok()) << _s;                             \
  } while (0)

void Check(cudaError_t e, const char* what) {
  ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e);
}

// Device buffers for every Input, Weight and State of a graph, filled from seeded host
// values (ids and positions in range), plus a poisoned arena.
class DeviceModel {
 public:
  DeviceModel(const ExecutionPlan& plan, uint64_t seed, int32_t vocab, int32_t first_pos)
      : plan_(plan), bindings_(plan.graph()) {
    const Graph& g = plan.graph();
    for (int32_t i = 0; i < g.num_tensors(); ++i) {
      const Tensor& t = g.tensors()[i];
      if (t.kind == TensorKind::kIntermediate) continue;
      HostTensor h(t.dtype, t.shape);
      if (t.name == kIdsInput) {
        h.FillUniform(seed + i, 0, static_cast<float>(vocab));
      } else if (t.name == kPosInput) {
        std::vector<float> p(t.shape.NumElements());
        for (size_t r = 0; r < p.size(); ++r) p[r] = static_cast<float>(first_pos + r);
        h.FillFrom(p);
      } else if (t.name == kSeedsInput) {
        h.FillUniform(seed + i, 0, 1 << 20);
      } else if (t.kind == TensorKind::kWeight && t.name.find("norm") != std::string::npos) {
        h.FillUniform(seed + i, 0.8f, 1.2f);
      } else {
        h.FillUniform(seed + i, -0.1f, 0.1f);
      }
      void* d = nullptr;
      Check(cudaMalloc(&d, t.bytes()), "cudaMalloc");
      owned_.emplace_back(d);
      Check(cudaMemcpy(d, h.data(), t.bytes(), cudaMemcpyHostToDevice), "upload");
      EXPECT_TRUE(bindings_.Bind(t.name, d, t.bytes()).ok());
    }
    void* arena = nullptr;
    Check(cudaMalloc(&arena, plan.arena_bytes()), "cudaMalloc(arena)");
    owned_.emplace_back(arena);
    Check(cudaMemset(arena, 0xFF, plan.arena_bytes()), "poison arena");
    Settle();
    bindings_.SetArena(arena, plan.arena_bytes());
  }

  Bindings& bindings() { return bindings_; }

  // The bytes of any tensor (an output in the arena or a bound buffer).
  std::vector<uint8_t> Read(absl::string_view name) {
    absl::StatusOr<TensorId> output = plan_.graph().FindOutput(name);
    const TensorId id = output.ok() ? *output : *plan_.graph().FindTensor(name);
    const TensorArg a = ResolveTensor(plan_, bindings_, id.index);
    std::vector<uint8_t> out(plan_.graph().tensor(id).bytes());
    Check(cudaDeviceSynchronize(), "sync");
    Check(cudaMemcpy(out.data(), a.data, out.size(), cudaMemcpyDeviceToHost), "read");
    return out;
  }

 private:
  // Uploads and memsets run on the legacy stream, which the steps' non-blocking streams do
  // not wait for (a pageable upload may return before its DMA lands).
  static void Settle() { Check(cudaDeviceSynchronize(), "sync after upload"); }

  const ExecutionPlan& plan_;
  Bindings bindings_;
  std::vector<DeviceMemory> owned_;
};

ExecutionPlan LlamaPlan(const LlamaGraphOptions& o, int64_t layers = 4) {
  LlamaConfig c = TinyLlamaConfig();
  c.num_hidden_layers = layers;
  absl::StatusOr<Graph> g = BuildLlamaDecodeGraph(c, o);
  EXPECT_TRUE(g.ok()) << g.status();
  absl::StatusOr<ExecutionPlan> p = ExecutionPlan::Create(*std::move(g));
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

std::unique_ptr<CudaDispatch> MakeDispatch() {
  absl::StatusOr<std::unique_ptr<CudaDispatch>> d = CudaDispatch::Create();
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *std::move(d) : nullptr;
}

// A plan prepared with one dispatcher and run either as a captured graph or eagerly (the
// executor's launches on the same stream), so the two can be compared.
class TestStep {
 public:
  static absl::StatusOr<std::unique_ptr<TestStep>> Make(const ExecutionPlan& plan,
                                                        const Bindings& bindings,
                                                        CudaDispatch& dispatch, bool eager) {
    auto step = std::unique_ptr<TestStep>(new TestStep(bindings, dispatch));
    SG_ASSIGN_OR_RETURN(PreparedPlan prepared, dispatch.Prepare(plan));
    step->prepared_ = std::make_unique<PreparedPlan>(std::move(prepared));
    if (!eager) {
      SG_ASSIGN_OR_RETURN(step->captured_,
                          CapturedStep::Create(*step->prepared_, bindings, dispatch));
    }
    return step;
  }
  absl::Status Replay() {
    if (captured_ != nullptr) return captured_->Replay();
    return Execute(*prepared_, bindings_, *dispatch_).status();
  }
  CapturedStep* captured() { return captured_.get(); }
  cudaStream_t stream() const { return dispatch_->stream(); }

 private:
  TestStep(const Bindings& bindings, CudaDispatch& dispatch)
      : bindings_(bindings), dispatch_(&dispatch) {}
  Bindings bindings_;
  CudaDispatch* dispatch_;
  std::unique_ptr<PreparedPlan> prepared_;
  std::unique_ptr<CapturedStep> captured_;
};

constexpr int32_t kVocab = 1024;

// 100 closed-loop steps of a four-layer model: after every step the logits, and at the
// end the KV caches and step inputs, are bit for bit those of the eager run.
TEST(CapturedStepTest, ReplayEqualsEagerBitwiseOver100Steps) {
  SKIP_WITHOUT_GPU();
  const ExecutionPlan plan = LlamaPlan({.batch = 2, .max_seq = 128, .closed_loop = true});
  // The two steps run at the same time on their own streams, so each has its own
  // dispatcher: steps sharing one share its workspaces and must not overlap.
  auto dispatch = MakeDispatch();
  auto eager_dispatch = MakeDispatch();
  ASSERT_NE(dispatch, nullptr);
  ASSERT_NE(eager_dispatch, nullptr);
  DeviceModel eager_model(plan, 7, kVocab, 0), replay_model(plan, 7, kVocab, 0);
  auto eager = TestStep::Make(plan, eager_model.bindings(), *eager_dispatch, /*eager=*/true);
  ASSERT_TRUE(eager.ok()) << eager.status();
  auto replay = TestStep::Make(plan, replay_model.bindings(), *dispatch, /*eager=*/false);
  ASSERT_TRUE(replay.ok()) << replay.status();
  ASSERT_NE((*replay)->captured(), nullptr);
  EXPECT_GE((*replay)->captured()->num_graph_nodes(), plan.graph().num_nodes());

  for (int step = 0; step < 100; ++step) {
    ASSERT_OK((*eager)->Replay());
    ASSERT_OK((*replay)->Replay());
    ASSERT_EQ(eager_model.Read(kLogitsOutput), replay_model.Read(kLogitsOutput))
        << "step " << step;
  }
  for (const char* name : {kIdsInput, kPosInput}) {
    EXPECT_EQ(eager_model.Read(name), replay_model.Read(name)) << name;
  }
  for (int layer = 0; layer < 4; ++layer) {
    EXPECT_EQ(eager_model.Read(KCacheName(layer)), replay_model.Read(KCacheName(layer)));
    EXPECT_EQ(eager_model.Read(VCacheName(layer)), replay_model.Read(VCacheName(layer)));
  }
  // The positions advanced once per step on the device.
  std::vector<uint8_t> pos = replay_model.Read(kPosInput);
  int32_t p0 = 0, p1 = 0;
  std::memcpy(&p0, pos.data(), 4);
  std::memcpy(&p1, pos.data() + 4, 4);
  EXPECT_EQ(p0, 100);
  EXPECT_EQ(p1, 101);
  EXPECT_EQ((*replay)->captured()->stats().captures, 1);
  EXPECT_EQ((*replay)->captured()->stats().replays, 100);
}

// N replays launched back to back, the ids read with one async copy per step and one
// synchronisation at the end, equal N eager steps read one by one.
TEST(CapturedStepTest, ClosedLoopOfNReplaysEqualsNEagerSteps) {
  SKIP_WITHOUT_GPU();
  const ExecutionPlan plan = LlamaPlan({.batch = 3, .max_seq = 64, .closed_loop = true});
  auto dispatch = MakeDispatch();
  ASSERT_NE(dispatch, nullptr);
  DeviceModel eager_model(plan, 11, kVocab, 5), replay_model(plan, 11, kVocab, 5);
  auto eager = TestStep::Make(plan, eager_model.bindings(), *dispatch, /*eager=*/true);
  auto replay = TestStep::Make(plan, replay_model.bindings(), *dispatch, /*eager=*/false);
  ASSERT_TRUE(eager.ok() && replay.ok());
  constexpr int kSteps = 24;
  const TensorId next = *plan.graph().FindOutput(kNextIdsOutput);
  const void* next_dev = ResolveTensor(plan, replay_model.bindings(), next.index).data;
  int32_t* ring = nullptr;
  Check(cudaMallocHost(reinterpret_cast<void**>(&ring), kSteps * 3 * sizeof(int32_t)), "cudaMallocHost");
  std::memset(ring, 0xFF, kSteps * 3 * sizeof(int32_t));
  for (int s = 0; s < kSteps; ++s) {
    ASSERT_OK((*replay)->Replay());
    Check(cudaMemcpyAsync(ring + 3 * s, next_dev, 3 * sizeof(int32_t), cudaMemcpyDeviceToHost,
                          (*replay)->stream()),
          "async read");
  }
  Check(cudaStreamSynchronize((*replay)->stream()), "sync");
  for (int s = 0; s < kSteps; ++s) {
    ASSERT_OK((*eager)->Replay());
    std::vector<uint8_t> ids = eager_model.Read(kNextIdsOutput);
    ASSERT_EQ(std::memcmp(ids.data(), ring + 3 * s, ids.size()), 0) << "step " << s;
    for (int r = 0; r < 3; ++r) {
      EXPECT_GE(ring[3 * s + r], 0);
      EXPECT_LT(ring[3 * s + r], kVocab);
    }
  }
  cudaFreeHost(ring);
}

TEST(CapturedStepTest, RefusesHostMemoryNamingNodeAndTensor) {
  SKIP_WITHOUT_GPU();
  const ExecutionPlan plan = LlamaPlan({.batch = 1, .max_seq = 32}, 1);
  auto dispatch = MakeDispatch();
  ASSERT_NE(dispatch, nullptr);
  DeviceModel m(plan, 1, kVocab, 0);
  const Tensor& w = plan.graph().tensor(*plan.graph().FindTensor("model.norm.weight"));
  std::vector<uint8_t> host(w.bytes(), 1);
  ASSERT_OK(m.bindings().Bind("model.norm.weight", host.data(), w.bytes()));
  auto step = TestStep::Make(plan, m.bindings(), *dispatch, /*eager=*/false);
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(step.status().message().find("model.norm.weight"), absl::string_view::npos)
      << step.status();
  EXPECT_NE(step.status().message().find("RmsNorm"), absl::string_view::npos) << step.status();
}

TEST(CapturedStepTest, DotNamesOurNodesAndKernels) {
  SKIP_WITHOUT_GPU();
  const ExecutionPlan plan = LlamaPlan({.batch = 1, .max_seq = 32}, 1);
  auto dispatch = MakeDispatch();
  ASSERT_NE(dispatch, nullptr);
  DeviceModel m(plan, 1, kVocab, 0);
  auto step = TestStep::Make(plan, m.bindings(), *dispatch, /*eager=*/false);
  ASSERT_TRUE(step.ok()) << step.status();
  absl::StatusOr<std::string> dot = (*step)->captured()->ToDot();
  ASSERT_TRUE(dot.ok()) << dot.status();
  EXPECT_NE(dot->find("digraph"), std::string::npos);
  for (const Node& n : plan.graph().nodes()) {
    EXPECT_NE(dot->find(n.name), std::string::npos) << n.name;
  }
  EXPECT_NE(dot->find("->"), std::string::npos);
}

// Three live rows run in bucket 4: rows 0..2 match an exact batch-3 run, the padding row
// writes no KV and its slot's cache is untouched.
TEST(StepRunnerCudaTest, BucketLiveRowsMatchExactSizeRun) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kSlots = 4, kSeq = 64;
  LlamaConfig config = TinyLlamaConfig();
  config.num_hidden_layers = 2;
  auto dispatch = MakeDispatch();
  ASSERT_NE(dispatch, nullptr);

  // Exact-size reference: batch 3, slots 4.
  absl::StatusOr<Graph> g3 =
      BuildLlamaDecodeGraph(config, {.batch = 3, .slots = kSlots, .max_seq = kSeq});
  ASSERT_TRUE(g3.ok());
  absl::StatusOr<ExecutionPlan> p3 = ExecutionPlan::Create(*std::move(g3));
  ASSERT_TRUE(p3.ok());
  DeviceModel exact(*p3, 17, kVocab, 6);

  // The cache binds each bucket's graph to shared buffers holding the same weights,
  // caches and (for the live rows) inputs as the exact-size model.
  std::vector<DeviceMemory> owned;
  absl::flat_hash_map<std::string, void*> shared;
  auto bind = [&](const Graph& g, Bindings& b) -> absl::Status {
    for (const Tensor& t : g.tensors()) {
      if (t.kind == TensorKind::kIntermediate) continue;
      const int64_t max_bytes = (t.kind == TensorKind::kInput)
                                    ? kSlots * DTypeBytes(t.dtype)
                                    : t.bytes();
      void*& d = shared[t.name];
      if (d == nullptr) {
        SG_RETURN_IF_ERROR(ToStatus(cudaMalloc(&d, max_bytes), "cudaMalloc"));
        owned.emplace_back(d);
        const TensorId src = *p3->graph().FindTensor(t.name);
        if (t.kind == TensorKind::kInput) {
          // Live rows from the exact model, the padding row: a valid id at pos -1.
          std::vector<int32_t> v(kSlots, -1);
          SG_RETURN_IF_ERROR(ToStatus(
              cudaMemcpy(v.data(), exact.bindings().buffer(src.index).data, 3 * 4,
                         cudaMemcpyDeviceToHost), "read"));
          if (t.name != kPosInput) v[3] = 1;
          SG_RETURN_IF_ERROR(ToStatus(
              cudaMemcpy(d, v.data(), kSlots * 4, cudaMemcpyHostToDevice), "write"));
        } else {
          SG_RETURN_IF_ERROR(ToStatus(cudaMemcpy(d, exact.bindings().buffer(src.index).data,
                                                 t.bytes(), cudaMemcpyDeviceToDevice),
                                      "copy"));
        }
      }
      SG_RETURN_IF_ERROR(b.Bind(t.name, d, t.bytes()));
    }
    return ToStatus(cudaDeviceSynchronize(), "sync after upload");
  };
  absl::StatusOr<std::unique_ptr<StepRunner>> runner =
      StepRunner::Create({.device = DeviceKind::kCuda});
  ASSERT_TRUE(runner.ok()) << runner.status();
  const std::vector<int64_t> buckets = {1, 2, 4};
  for (int64_t batch : buckets) {
    absl::StatusOr<Graph> g =
        BuildLlamaDecodeGraph(config, {.batch = batch, .slots = kSlots, .max_seq = kSeq});
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_OK((*runner)->AddStep(*std::move(g), bind).status());
  }
  ASSERT_OK((*runner)->Finalize());
  ASSERT_TRUE((*runner)->replays());
  absl::StatusOr<int> bucket = ChooseBucket(buckets, 3);
  ASSERT_TRUE(bucket.ok());
  EXPECT_EQ(buckets[*bucket], 4);
  const std::vector<uint8_t> slot3_before = exact.Read(KCacheName(0));
  ASSERT_OK((*runner)->Run(*bucket));
  ASSERT_OK((*runner)->Sync());

  auto eager = TestStep::Make(*p3, exact.bindings(), *dispatch, /*eager=*/true);
  ASSERT_TRUE(eager.ok());
  ASSERT_OK((*eager)->Replay());

  absl::StatusOr<TensorArg> logits4 = (*runner)->Output(*bucket, kLogitsOutput);
  ASSERT_TRUE(logits4.ok()) << logits4.status();
  std::vector<float> got(4 * kVocab), want(3 * kVocab);
  Check(cudaMemcpy(got.data(), logits4->data, got.size() * 4, cudaMemcpyDeviceToHost), "read");
  std::vector<uint8_t> w = exact.Read(kLogitsOutput);
  std::memcpy(want.data(), w.data(), w.size());
  got.resize(3 * kVocab);
  EXPECT_LT(testing::NormalizedError(got, want), 1e-5);

  // Slot 3's cache rows are those the exact model never touches: unchanged.
  std::vector<uint8_t> k0(exact.Read(KCacheName(0)).size());
  Check(cudaMemcpy(k0.data(), shared[KCacheName(0)], k0.size(), cudaMemcpyDeviceToHost), "read");
  const size_t slot_bytes = k0.size() / kSlots;
  EXPECT_EQ(std::memcmp(k0.data() + 3 * slot_bytes, slot3_before.data() + 3 * slot_bytes,
                        slot_bytes),
            0);

  for (int i = 0; i < 3; ++i) {
    EXPECT_GE((*runner)->graph_nodes(i), (*runner)->plan(i).graph().num_nodes());
    EXPECT_LE((*runner)->plan(i).arena_bytes(), (*runner)->arena_bytes());
  }
  EXPECT_TRUE(CapturedStep::DeviceGraphMemory().ok());
  EXPECT_EQ((*runner)->Run(3).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*runner)->Run(-1).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sg
