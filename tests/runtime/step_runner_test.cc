// The step runner on the CPU (the reference, and the mock through cpu_dispatch): the order
// of its calls, its memory, its outputs checked against the executor run by hand, and the
// promise that Run allocates nothing.
#include "stepgraph/runtime/step_runner.h"
#include "stepgraph/runtime/measure.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "stepgraph/models/llama.h"
#include "models/random_weights.h"
#include "stepgraph/dispatch/cpu_dispatch.h"
#include "stepgraph/dispatch/cuda_options.h"
#include "stepgraph/base/half.h"
#include "stepgraph/dispatch/mock_dispatch.h"
#include "stepgraph/base/status.h"
#include "tests/testing/util.h"

// Every allocation in this test binary is counted, so a test can assert that a stretch of
// code made none.
namespace {
std::atomic<int64_t> g_allocations{0};
}  // namespace

// GCC sees the malloc inside operator new and warns that operator delete's free matches
// it; they are the pair they must be.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace sg {
namespace {

Graph TinyGraph(int64_t batch = 1) {
  absl::StatusOr<Graph> g = BuildLlamaDecodeGraph(TinyLlamaConfig(), {.batch = batch, .slots = 4, .max_seq = 16});
  EXPECT_TRUE(g.ok()) << g.status();
  return *std::move(g);
}

// Weights, KV cache and inputs in runner memory: random weights, ids and positions from
// `ids` / `pos`, a zeroed cache.
struct TinyModel {
  BufferLayout weights, kv;
  std::byte* weight_base = nullptr;
  std::byte* kv_base = nullptr;
  int32_t* ids = nullptr;
  int32_t* pos = nullptr;

  absl::Status Allocate(StepRunner& runner, const Graph& g) {
    weights = LayoutBuffers(g, TensorKind::kWeight);
    kv = LayoutBuffers(g, TensorKind::kState);
    SG_ASSIGN_OR_RETURN(void* w, runner.Allocate(weights.total_bytes, "weights"));
    weight_base = static_cast<std::byte*>(w);
    SG_RETURN_IF_ERROR(FillRandomWeights(
        g, weights, 7, {weight_base, static_cast<size_t>(weights.total_bytes)}, 1));
    SG_ASSIGN_OR_RETURN(void* k, runner.AllocateZeroed(kv.total_bytes, "kv"));
    kv_base = static_cast<std::byte*>(k);
    SG_ASSIGN_OR_RETURN(void* i, runner.Allocate(64, "ids"));
    SG_ASSIGN_OR_RETURN(void* p, runner.Allocate(64, "pos"));
    ids = static_cast<int32_t*>(i);
    pos = static_cast<int32_t*>(p);
    return absl::OkStatus();
  }
  StepRunner::Binder Binder() {
    return [this](const Graph& g, Bindings& b) -> absl::Status {
      SG_RETURN_IF_ERROR(BindLayout(g, TensorKind::kWeight, weights, weight_base, b));
      SG_RETURN_IF_ERROR(BindLayout(g, TensorKind::kState, kv, kv_base, b));
      SG_ASSIGN_OR_RETURN(TensorId id, g.FindTensor(kIdsInput));
      const int64_t rows = g.tensor(id).shape[0];
      SG_RETURN_IF_ERROR(b.Bind(kIdsInput, ids, rows * 4));
      return b.Bind(kPosInput, pos, rows * 4);
    };
  }
};

std::vector<float> ReadF32(const TensorArg& t) {
  std::vector<float> out(static_cast<size_t>(t.shape.NumElements()));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = LoadElement(t.data, t.dtype, static_cast<int64_t>(i));
  }
  return out;
}

TEST(StepRunnerTest, CpuStepMatchesTheExecutorOnTheSameMemory) {
  absl::StatusOr<std::unique_ptr<StepRunner>> runner = StepRunner::Create({});
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_FALSE((*runner)->replays());
  Graph g = TinyGraph();
  TinyModel m;
  ASSERT_TRUE(m.Allocate(**runner, g).ok());
  m.ids[0] = 5;
  m.pos[0] = 0;
  absl::StatusOr<int> step = (*runner)->AddStep(TinyGraph(), m.Binder());
  ASSERT_TRUE(step.ok()) << step.status();
  ASSERT_TRUE((*runner)->Finalize().ok());
  absl::StatusOr<TensorArg> logits = (*runner)->Output(*step, kLogitsOutput);
  ASSERT_TRUE(logits.ok()) << logits.status();
  std::memset(logits->data, 0xff, static_cast<size_t>(logits->bytes()));  // NaN poison
  ASSERT_TRUE((*runner)->Run(*step).ok());
  ASSERT_TRUE((*runner)->Sync().ok());
  const std::vector<float> got = ReadF32(*logits);

  // The same plan through the executor by hand, on its own arena and a fresh cache.
  absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(TinyGraph());
  ASSERT_TRUE(plan.ok());
  std::vector<std::byte> arena(static_cast<size_t>(plan->arena_bytes()));
  std::vector<std::byte> kv(static_cast<size_t>(m.kv.total_bytes));
  Bindings b(plan->graph());
  b.SetArena(arena.data(), static_cast<int64_t>(arena.size()));
  ASSERT_TRUE(BindLayout(plan->graph(), TensorKind::kWeight, m.weights, m.weight_base, b).ok());
  ASSERT_TRUE(BindLayout(plan->graph(), TensorKind::kState, m.kv, kv.data(), b).ok());
  ASSERT_TRUE(b.Bind(kIdsInput, m.ids, 4).ok());
  ASSERT_TRUE(b.Bind(kPosInput, m.pos, 4).ok());
  CpuDispatch cpu;
  ASSERT_TRUE(Execute(*plan, b, cpu).ok());
  absl::StatusOr<TensorId> out = plan->graph().FindOutput(kLogitsOutput);
  ASSERT_TRUE(out.ok());
  const std::vector<float> expected = ReadF32(ResolveTensor(*plan, b, out->index));
  ASSERT_EQ(got.size(), expected.size());
  for (float v : got) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(got, expected);  // the same code on the same inputs: bit for bit
}

TEST(StepRunnerTest, RunsEveryNodeOfTheChosenStepThroughTheGivenDispatcher) {
  MockDispatch mock;
  absl::StatusOr<std::unique_ptr<StepRunner>> runner =
      StepRunner::Create({.cpu_dispatch = &mock});
  ASSERT_TRUE(runner.ok()) << runner.status();
  TinyModel m;
  Graph big = TinyGraph(4);
  ASSERT_TRUE(m.Allocate(**runner, big).ok());
  ASSERT_EQ(*(*runner)->AddStep(TinyGraph(1), m.Binder()), 0);
  ASSERT_EQ(*(*runner)->AddStep(std::move(big), m.Binder()), 1);
  ASSERT_TRUE((*runner)->Finalize().ok());
  EXPECT_EQ((*runner)->num_steps(), 2);
  EXPECT_GE((*runner)->arena_bytes(), (*runner)->plan(1).arena_bytes());
  EXPECT_GE((*runner)->arena_bytes(), (*runner)->plan(0).arena_bytes());
  mock.Clear();
  ASSERT_TRUE((*runner)->Run(1).ok());
  EXPECT_EQ(mock.launches(), static_cast<int64_t>((*runner)->plan(1).graph().nodes().size()));
  mock.Clear();
  ASSERT_TRUE((*runner)->Run(0).ok());
  ASSERT_TRUE((*runner)->Run(0).ok());
  EXPECT_EQ(mock.launches(), 2 * static_cast<int64_t>((*runner)->plan(0).graph().nodes().size()));
  absl::StatusOr<std::vector<double>> times = ProfileNodes(**runner, 0);
  ASSERT_TRUE(times.ok()) << times.status();
  EXPECT_EQ(times->size(), (*runner)->plan(0).graph().nodes().size());
  EXPECT_EQ((*runner)->graph_nodes(0), 0);
}

TEST(StepRunnerTest, RefusesCallsOutOfOrderNamingWhatWasWrong) {
  MockDispatch mock;
  auto runner = *StepRunner::Create({.cpu_dispatch = &mock});
  EXPECT_EQ(runner->Run(0).code(), absl::StatusCode::kFailedPrecondition);
  TinyModel m;
  Graph g = TinyGraph();
  ASSERT_TRUE(m.Allocate(*runner, g).ok());
  ASSERT_TRUE(runner->AddStep(std::move(g), m.Binder()).ok());
  EXPECT_FALSE(runner->Run(0).ok());  // not finalized
  ASSERT_TRUE(runner->Finalize().ok());
  EXPECT_FALSE(runner->AddStep(TinyGraph(), m.Binder()).ok());
  EXPECT_FALSE(runner->Finalize().ok());
  const absl::Status bad = runner->Run(3);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_NE(bad.message().find("3"), absl::string_view::npos) << bad;
  const absl::Status missing = runner->Output(0, "no_such_output").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("no_such_output"), absl::string_view::npos) << missing;
}

TEST(MeasureTest, CopiesMarksAndProfilesOnTheCpu) {
  auto runner = *StepRunner::Create({});
  absl::StatusOr<double> bw = CopyBandwidth(*runner, int64_t{1} << 20, 3);
  ASSERT_TRUE(bw.ok()) << bw.status();
  EXPECT_GT(*bw, 0.0);
  EXPECT_EQ(CopyBandwidth(*runner, 0, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StartMarks(*runner, 1).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(StartMarks(*runner, 3).ok());
  for (int64_t i = 0; i < 3; ++i) ASSERT_TRUE(Mark(*runner, i).ok());
  EXPECT_FALSE(Mark(*runner, 3).ok());
  absl::StatusOr<std::vector<double>> ms = MarkIntervalsMs(*runner);
  ASSERT_TRUE(ms.ok()) << ms.status();
  ASSERT_EQ(ms->size(), 2u);
  for (double t : *ms) EXPECT_GE(t, 0.0);
  // A profile needs a finalized step that exists.
  TinyModel m;
  Graph g = TinyGraph();
  ASSERT_TRUE(m.Allocate(*runner, g).ok());
  ASSERT_TRUE(runner->AddStep(std::move(g), m.Binder()).ok());
  EXPECT_EQ(ProfileNodes(*runner, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(runner->Finalize().ok());
  const absl::Status missing = ProfileNodes(*runner, 1).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("Profile"), absl::string_view::npos) << missing;
  absl::StatusOr<std::vector<double>> nodes = ProfileNodes(*runner, 0);
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_EQ(nodes->size(), runner->plan(0).graph().nodes().size());
}

TEST(StepRunnerTest, ABinderErrorComesBackFromAddStep) {
  auto runner = *StepRunner::Create({});
  const absl::Status s =
      runner
          ->AddStep(TinyGraph(),
                    [](const Graph&, Bindings&) { return absl::DataLossError("weights torn"); })
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("weights torn"), absl::string_view::npos) << s;
}

TEST(StepRunnerTest, CpuMemoryCopiesAndZeroes) {
  auto runner = *StepRunner::Create({});
  EXPECT_FALSE(runner->Allocate(-1, "minus one").ok());
  const absl::Status huge = runner->Allocate(int64_t{1} << 62, "a huge buffer").status();
  EXPECT_EQ(huge.code(), absl::StatusCode::kResourceExhausted) << huge;
  EXPECT_NE(huge.message().find("a huge buffer"), absl::string_view::npos) << huge;

  // Lazily zeroed memory reads as zeros even past what was touched.
  auto* z = static_cast<uint8_t*>(*runner->AllocateZeroed(int64_t{64} << 20, "zeros"));
  z[12345] = 7;
  int64_t nonzero = 0;
  for (int64_t i = 0; i < (int64_t{64} << 20); i += 4093) nonzero += z[i] != 0;
  EXPECT_EQ(nonzero, 0);
  EXPECT_EQ(z[12345], 7);

  std::vector<uint8_t> src(1000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 31 + 1);
  auto* dst = static_cast<uint8_t*>(*runner->Allocate(1000, "dst"));
  ASSERT_TRUE(runner->Copy(dst, src.data(), 1000).ok());
  ASSERT_TRUE(runner->Sync().ok());
  EXPECT_EQ(std::memcmp(dst, src.data(), 1000), 0);
  EXPECT_FALSE(runner->Copy(dst, src.data(), -5).ok());

  absl::StatusOr<int64_t> free_bytes = runner->FreeBytes();
  ASSERT_TRUE(free_bytes.ok());
  EXPECT_GT(*free_bytes, 0);
}

// A dispatcher whose kernels read block-format weights in a layout of their own (their
// bytes reversed), running every op as the CPU reference does.
class ReversingDispatch final : public KernelDispatch {
 public:
  bool Supports(const Op& op, absl::Span<const Tensor* const> inputs) const override {
    return cpu_.Supports(op, inputs);
  }
  bool RepacksWeight(const Tensor& weight) const override { return IsQuantized(weight.dtype); }
  absl::Status RepackWeight(const Tensor& weight, absl::Span<const std::byte> file_bytes,
                            absl::Span<std::byte> out) const override {
    if (!RepacksWeight(weight)) return KernelDispatch::RepackWeight(weight, file_bytes, out);
    for (size_t i = 0; i < out.size(); ++i) out[i] = file_bytes[file_bytes.size() - 1 - i];
    return absl::OkStatus();
  }
#define SG_FORWARD_RUN(Name)                                        \
  absl::Status Run(const ops::Name& op, const NodeArgs& args) override { \
    return cpu_.Run(op, args);                                         \
  }
  SG_OP_LIST(SG_FORWARD_RUN)
#undef SG_FORWARD_RUN

 private:
  CpuDispatch cpu_;
};

// CopyWeight passes a weight through its dispatcher's layout: the CPU reference keeps the
// file's bytes; a dispatcher that repacks gets them repacked; a size that is not the
// weight's is refused by the default layout, naming the weight.
TEST(StepRunnerTest, CopyWeightLaysWeightsOutForTheDispatcher) {
  const Tensor block{"w", TensorKind::kWeight, DType::kQ8_0, Shape{2, 64}};
  const Tensor plain{"b", TensorKind::kWeight, DType::kF32, Shape{17}};
  std::vector<std::byte> src(static_cast<size_t>(block.bytes()));
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 7 + 3);

  auto cpu = *StepRunner::Create({});
  auto* dst = static_cast<std::byte*>(*cpu->Allocate(block.bytes(), "w"));
  ASSERT_TRUE(cpu->CopyWeight(dst, src.data(), block).ok());
  ASSERT_TRUE(cpu->Sync().ok());
  EXPECT_EQ(std::memcmp(dst, src.data(), src.size()), 0);

  ReversingDispatch reversing;
  auto runner = *StepRunner::Create({.cpu_dispatch = &reversing});
  auto* out = static_cast<std::byte*>(*runner->Allocate(block.bytes(), "w"));
  ASSERT_TRUE(runner->CopyWeight(out, src.data(), block).ok());
  ASSERT_TRUE(runner->Sync().ok());
  for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(out[i], src[src.size() - 1 - i]) << i;
  ASSERT_TRUE(runner->CopyWeight(out, src.data(), plain).ok());
  ASSERT_TRUE(runner->Sync().ok());
  EXPECT_EQ(std::memcmp(out, src.data(), static_cast<size_t>(plain.bytes())), 0);

  std::vector<std::byte> small(8);
  const absl::Status wrong = reversing.KernelDispatch::RepackWeight(
      block, src, absl::MakeSpan(small));
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument) << wrong;
  EXPECT_NE(wrong.message().find("'w'"), absl::string_view::npos) << wrong;
}

TEST(StepRunnerTest, CudaWithoutADeviceIsAFailedPrecondition) {
  if (CudaDeviceFound()) GTEST_SKIP() << "a CUDA device is present";
  const absl::Status s = StepRunner::Create({.device = DeviceKind::kCuda}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

TEST(StepRunnerTest, RunAllocatesNothing) {
  MockDispatch mock(/*record_trace=*/false);
  auto runner = *StepRunner::Create({.cpu_dispatch = &mock});
  TinyModel m;
  Graph g = TinyGraph();
  ASSERT_TRUE(m.Allocate(*runner, g).ok());
  ASSERT_TRUE(runner->AddStep(std::move(g), m.Binder()).ok());
  ASSERT_TRUE(runner->Finalize().ok());
  ASSERT_TRUE(runner->Run(0).ok());  // warm
  const int64_t before = g_allocations.load();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(runner->Run(0).ok());
  const int64_t after = g_allocations.load();
  EXPECT_EQ(after - before, 0);
  EXPECT_EQ(mock.launches(), 11 * static_cast<int64_t>(runner->plan(0).graph().nodes().size()));
}

TEST(CudaOptionsTest, MatmulPolicyNamesRoundTrip) {
  for (MatmulPolicy p : {MatmulPolicy::kAuto, MatmulPolicy::kCublasLt, MatmulPolicy::kGemv}) {
    absl::StatusOr<MatmulPolicy> back = ParseMatmulPolicy(MatmulPolicyName(p));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, p);
  }
  const absl::Status s = ParseMatmulPolicy("fastest").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("fastest"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("cublaslt"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace sg
