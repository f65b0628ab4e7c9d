// The README's builder example, compiled and run, so that the first code a user reads
// keeps working. Keep the body of ReadmeExample in step with README.md.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "stepgraph/builder.h"
#include "stepgraph/cpu_dispatch.h"
#include "stepgraph/executor.h"
#include "stepgraph/plan.h"
#include "stepgraph/status.h"

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

  std::vector<float> xv = {1, 2, 3, 4}, wv(12, 0.5f), gv(4, 1.0f), arena(plan.arena_bytes() / 4);
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
  // rms of (1,2,3,4) = sqrt(7.5); each output is 0.5 · Σ x / rms.
  const float want = 0.5f * 10.0f / std::sqrt(7.5f + 1e-6f);
  for (float v : *y) EXPECT_NEAR(v, want, 1e-5f);
}

}  // namespace
}  // namespace sg
