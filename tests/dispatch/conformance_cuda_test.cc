// The op-conformance table (tests/testing/conformance_cases.cc) on the GPU: every case run
// on the CPU reference and on CudaDispatch from the same random inputs and compared; and
// CudaDispatch's Supports answer held to its Prepare: it says yes to every node of every
// case (all of which it runs), and whatever it says yes to, including the fused Llama
// steps the passes make for it, its Prepare accepts.
#include <gtest/gtest.h>

#include <cctype>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/graph/passes.h"
#include "stepgraph/models/llama.h"
#include "tests/testing/conformance.h"
#include "tests/testing/quantized_config.h"

namespace sg::testing {
namespace {

class ConformanceTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(ConformanceTest, CpuAndCudaAgree) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  RunConformance(GetParam());
}

// The nodes of `graph` that `dispatch` says it does not run, by name.
std::vector<std::string> Refused(const OpSupport& dispatch, const Graph& graph) {
  std::vector<std::string> refused;
  std::vector<const Tensor*> inputs;
  for (const Node& node : graph.nodes()) {
    inputs.clear();
    for (TensorId in : node.inputs) inputs.push_back(&graph.tensor(in));
    if (!dispatch.Supports(node.op, inputs)) refused.push_back(node.name);
  }
  return refused;
}

void ExpectSupportedAndPrepared(CudaDispatch& dispatch, Graph graph) {
  EXPECT_EQ(Refused(dispatch, graph), std::vector<std::string>());
  absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(std::move(graph));
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<PreparedPlan> prepared = dispatch.Prepare(*plan);
  EXPECT_TRUE(prepared.ok()) << prepared.status();
}

TEST_P(ConformanceTest, WhatCudaSupportsItPrepares) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<Graph> graph = BuildCase(GetParam());
  ASSERT_TRUE(graph.ok()) << graph.status();
  absl::StatusOr<std::unique_ptr<CudaDispatch>> cuda =
      CudaDispatch::Create({.cuda = CudaOptionsFromTestEnvironment()});
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  ExpectSupportedAndPrepared(**cuda, *std::move(graph));
}

INSTANTIATE_TEST_SUITE_P(Ops, ConformanceTest, ::testing::ValuesIn(ConformanceCases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) {
                           std::string n = info.param.name;
                           for (char& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

// Past the MoE kernels' limits (the table's MoE cases are within them), CUDA's Supports
// says no without a device, and on one Prepare refuses the node naming the op.
TEST(CudaSupportTest, MoeOpsPastTheKernelsLimitsAreRefusedByName) {
  const DType f32 = DType::kF32, i32 = DType::kI32;
  const std::vector<std::pair<std::string, std::function<void(GraphBuilder&)>>> past = {
      {"MoeTopK",
       [&](GraphBuilder& b) { b.Output("out", b.MoeTopK(b.Input("logits", f32, {1, 2000}), 1025)); }},
      {"MoeCombine",
       [&](GraphBuilder& b) {
         b.Output("out", b.MoeCombine(b.Input("y", f32, {1, 257 * 2}),
                                      b.Input("weights", f32, {1, 257}),
                                      b.Input("ids", i32, {1, 257})));
       }},
      {"MoeMatMul",
       [&](GraphBuilder& b) {
         b.Output("out", b.MoeMatMul(b.Input("x", f32, {1, 32}),
                                     b.Weight("w", f32, {2, 65535 * 8 + 1, 32}),
                                     b.Input("ids", i32, {1, 1})));
       }},
  };
  for (const auto& [op, build] : past) {
    SCOPED_TRACE(op);
    GraphBuilder b;
    build(b);
    absl::StatusOr<Graph> graph = std::move(b).Build();
    ASSERT_TRUE(graph.ok()) << graph.status();
    EXPECT_EQ(Refused(CudaSupport(), *graph), std::vector<std::string>{graph->nodes()[0].name});
    if (!HasCudaDevice()) continue;
    absl::StatusOr<std::unique_ptr<CudaDispatch>> cuda =
        CudaDispatch::Create({.cuda = CudaOptionsFromTestEnvironment()});
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(graph));
    ASSERT_TRUE(plan.ok()) << plan.status();
    absl::StatusOr<PreparedPlan> prepared = (*cuda)->Prepare(*plan);
    ASSERT_FALSE(prepared.ok());
    EXPECT_EQ(prepared.status().code(), absl::StatusCode::kUnimplemented) << prepared.status();
    EXPECT_TRUE(absl::StrContains(prepared.status().message(), op)) << prepared.status();
  }
}

// Llama steps through every pass with the dispatcher as the backend: f32, bf16 and
// block-format weights, head_dim 8 and 6 (where CUDA keeps the RopeKvWrite), decode
// batches and the logits unread. Every node the passes made, CUDA runs.
TEST(CudaSupportTest, FusedLlamaStepsForCudaArePrepared) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<std::unique_ptr<CudaDispatch>> cuda =
      CudaDispatch::Create({.cuda = CudaOptionsFromTestEnvironment()});
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  PassOptions passes;
  passes.backend = cuda->get();
  passes.unread_outputs = {kLogitsOutput};
  struct Step {
    DType dtype;
    DType weights;
    int64_t head_dim;
    int64_t batch;
  };
  for (const Step& s :
       {Step{DType::kF32, DType::kF32, 8, 1}, Step{DType::kBF16, DType::kBF16, 8, 3},
        Step{DType::kBF16, DType::kBF16, 6, 2}, Step{DType::kBF16, DType::kQ8_0, 8, 1}}) {
    SCOPED_TRACE(absl::StrCat(DTypeName(s.dtype), " weights ", DTypeName(s.weights),
                              " head_dim ", s.head_dim, " batch ", s.batch));
    LlamaConfig config = TinyLlamaConfig();
    config.dtype = s.dtype;
    config.head_dim = s.head_dim;
    config.intermediate_size = 704;  // whole blocks of every block format
    absl::StatusOr<LlamaConfig> with_weights =
        WithMatrixDTypes(config, [&](const std::string& name) {
          return absl::StrContains(name, "model.layers.") ? s.weights : s.dtype;
        });
    ASSERT_TRUE(with_weights.ok()) << with_weights.status();
    config = *std::move(with_weights);
    absl::StatusOr<Graph> plain =
        BuildLlamaDecodeGraph(config, {.batch = s.batch, .max_seq = 64, .closed_loop = true});
    ASSERT_TRUE(plain.ok()) << plain.status();
    absl::StatusOr<Graph> fused = RunPasses(*plain, passes);
    ASSERT_TRUE(fused.ok()) << fused.status();
    EXPECT_LT(fused->num_nodes(), plain->num_nodes());
    ExpectSupportedAndPrepared(**cuda, *std::move(fused));
  }
}

}  // namespace
}  // namespace sg::testing
