// Measurements on a StepRunner's device (stepgraph/runtime/measure.h): each reaches the
// runner's device through StepRunnerAccess and reports medians (runtime/timing.h).
#include "stepgraph/runtime/measure.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/runner_device.h"
#include "runtime/timing.h"
#include "stepgraph/base/half.h"
#include "stepgraph/base/status.h"
#include "stepgraph/graph/builder.h"

namespace sg {

absl::StatusOr<double> CopyBandwidth(StepRunner& runner, int64_t bytes, int repeats) {
  if (bytes <= 0 || repeats <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "copy bandwidth: bytes and repeats must be > 0, got ", bytes, " and ", repeats));
  }
  // Every measurement makes the runner's device current first (a process may drive several).
  SG_RETURN_IF_ERROR(StepRunnerAccess::Device(runner).MakeCurrent());
  SG_ASSIGN_OR_RETURN(std::vector<double> seconds,
                      StepRunnerAccess::Device(runner).TimeCopies(bytes, repeats));
  const double median = Median(std::move(seconds));
  if (!(median > 0.0)) return absl::InternalError("copy bandwidth: a copy took no time");
  return 2.0 * static_cast<double>(bytes) / median;
}

absl::Status StartMarks(StepRunner& runner, int64_t n) {
  if (n < 2) return absl::InvalidArgumentError("time marks: StartMarks needs n >= 2");
  SG_RETURN_IF_ERROR(StepRunnerAccess::Device(runner).MakeCurrent());
  return StepRunnerAccess::Device(runner).StartMarks(n);
}

absl::Status Mark(StepRunner& runner, int64_t i) {
  SG_RETURN_IF_ERROR(StepRunnerAccess::Device(runner).MakeCurrent());
  return StepRunnerAccess::Device(runner).Mark(i);
}

absl::StatusOr<std::vector<double>> MarkIntervalsMs(StepRunner& runner) {
  SG_RETURN_IF_ERROR(StepRunnerAccess::Device(runner).MakeCurrent());
  return StepRunnerAccess::Device(runner).MarkIntervalsMs();
}

absl::StatusOr<std::vector<double>> ProfileNodes(StepRunner& runner, int step) {
  SG_ASSIGN_OR_RETURN(const StepRunnerAccess::PreparedStep s,
                      StepRunnerAccess::Prepared(runner, step, "Profile"));
  SG_RETURN_IF_ERROR(StepRunnerAccess::Device(runner).MakeCurrent());
  return StepRunnerAccess::Device(runner).Profile(*s.prepared, *s.bindings);
}

absl::StatusOr<double> MeasureMatmulTflops(const RunnerOptions& options, int64_t n, int runs) {
  if (n < 1 || n > 16384 || runs < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "matmul rate: n must be in [1, 16384] and runs >= 1, got ", n, " and ", runs));
  }
  SG_ASSIGN_OR_RETURN(std::unique_ptr<StepRunner> runner, StepRunner::Create(options));
  const int64_t bytes = n * n * 2;
  GraphBuilder b;
  b.Output("y", b.MatMul(b.Input("x", DType::kBF16, {n, n}), b.Weight("w", DType::kBF16, {n, n}),
                         "matmul"));
  SG_ASSIGN_OR_RETURN(Graph graph, std::move(b).Build());
  // Small non-zero values: a rate is measured, not a result.
  std::vector<uint16_t> host(static_cast<size_t>(n * n));
  for (size_t i = 0; i < host.size(); ++i) {
    const float v = static_cast<float>(static_cast<int64_t>(i * 37 % 17) - 8) / 64.0f + 0.01f;
    host[i] = FloatToBF16(v);
  }
  SG_ASSIGN_OR_RETURN(void* x, runner->Allocate(bytes, "matmul rate: x"));
  SG_ASSIGN_OR_RETURN(void* w, runner->Allocate(bytes, "matmul rate: w"));
  SG_RETURN_IF_ERROR(runner->Copy(x, host.data(), bytes));
  SG_RETURN_IF_ERROR(runner->Copy(w, host.data(), bytes));
  SG_RETURN_IF_ERROR(runner->Sync());
  SG_ASSIGN_OR_RETURN(const int step,
                      runner->AddStep(std::move(graph), [&](const Graph&, Bindings& bind) {
                        SG_RETURN_IF_ERROR(bind.Bind("x", x, bytes));
                        return bind.Bind("w", w, bytes);
                      }));
  SG_RETURN_IF_ERROR(runner->Finalize());
  for (int i = 0; i < 3; ++i) SG_RETURN_IF_ERROR(runner->Run(step));
  SG_RETURN_IF_ERROR(StartMarks(*runner, runs + 1));
  SG_RETURN_IF_ERROR(Mark(*runner, 0));
  for (int i = 0; i < runs; ++i) {
    SG_RETURN_IF_ERROR(runner->Run(step));
    SG_RETURN_IF_ERROR(Mark(*runner, i + 1));
  }
  SG_ASSIGN_OR_RETURN(std::vector<double> ms, MarkIntervalsMs(*runner));
  const double median_s = Median(std::move(ms)) * 1e-3;
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) /
         median_s * 1e-12;
}

}  // namespace sg
