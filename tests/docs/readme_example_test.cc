// The README's builder example, compiled and run, so that the first code a user reads
// keeps working. Keep the body of ReadmeExample in step with README.md.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "stepgraph/graph/builder.h"
#include "stepgraph/dispatch/cpu_dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace {

absl::StatusOr<std::vector<float>> ReadmeExample() {
  GraphBuilder b;
  TensorId x = b.Input("x", DType::kF32, {1, 4});
  TensorId w = b.Weight("w", DType::kF32, {3, 4});   // HF layout: [out, in]
  TensorId g = b.Weight("g", DType::kF32, {4});
  TensorId h = b.RmsNorm(x, g, 1e-6f, "norm");
  b.Output("y", b.MatMul(h, w, "proj"));             // y = norm(x) · wᵀ
  SG_ASSIGN_OR_RETURN(Graph graph, std::move(b).Build());
  SG_ASSIGN_OR_RETURN(ExecutionPlan plan, ExecutionPlan::Create(std::move(graph)));

  std::vector<float> xv = {1, 2, 3, 4}, gv = {1, 2, 1, 2}, arena(plan.arena_bytes() / 4);
  std::vector<float> wv = {1, 0, 0, 0,  0, 1, 0, -1,  1, 1, 1, 1};  // y = (h0, h1 - h3, Σh)
  Bindings bind(plan.graph());
  SG_RETURN_IF_ERROR(bind.Bind("x", xv.data(), 16));
  SG_RETURN_IF_ERROR(bind.Bind("w", wv.data(), 48));
  SG_RETURN_IF_ERROR(bind.Bind("g", gv.data(), 16));
  bind.SetArena(arena.data(), plan.arena_bytes());
  CpuDispatch cpu;                                    // or CudaDispatch, or MockDispatch
  SG_RETURN_IF_ERROR(Execute(plan, bind, cpu).status());
  SG_ASSIGN_OR_RETURN(TensorId y, plan.graph().FindOutput("y"));
  const float* out = static_cast<const float*>(ResolveTensor(plan, bind, y.index).data);
  return std::vector<float>(out, out + 3);
}

TEST(ReadmeExampleTest, RunsAndComputesNormThenProjection) {
  absl::StatusOr<std::vector<float>> y = ReadmeExample();
  ASSERT_TRUE(y.ok()) << y.status();
  // h = x·g / rms(x) = (1, 4, 3, 8) / sqrt(7.5); each weight row picks a different mix of
  // h, so a wrong row, a transposed w or a misplaced g changes the outputs.
  const float rms = std::sqrt(7.5f + 1e-6f);
  const float want[3] = {1.0f / rms, (4.0f - 8.0f) / rms, 16.0f / rms};
  ASSERT_EQ(y->size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR((*y)[i], want[i], 1e-5f) << "y[" << i << "]";
}

}  // namespace
}  // namespace sg
