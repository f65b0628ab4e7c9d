// StepRunner: the steps of one model (per batch bucket, per prefill chunk) over one device.
// Planning, binding, preparing and capturing happen once, in AddStep and Finalize; Run is
// one replay or one eager pass and neither allocates nor formats.
#include "stepgraph/runtime/step_runner.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/runner_device.h"
#include "runtime/timing.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/base/half.h"
#include "stepgraph/base/status.h"

namespace sg {

struct StepRunner::Step {
  std::unique_ptr<ExecutionPlan> plan;
  std::unique_ptr<Bindings> bindings;
  std::optional<PreparedPlan> prepared;
  std::unique_ptr<ReplayableStep> replay;
};

absl::string_view DeviceKindName(DeviceKind d) {
  switch (d) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "?";
}

StepRunner::StepRunner(const RunnerOptions& options, std::unique_ptr<Device> device)
    : options_(options), device_(std::move(device)) {
  eager_ = options.eager || !device_->can_capture();
}

StepRunner::~StepRunner() {
  // Steps (and their captured graphs) go before the device's memory and stream.
  if (device_ != nullptr) (void)device_->Sync();
  steps_.clear();
}

absl::StatusOr<std::unique_ptr<StepRunner>> StepRunner::Create(const RunnerOptions& options) {
  if (!(options.max_patch_fraction >= 0.0 && options.max_patch_fraction <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step runner: max_patch_fraction must be in [0, 1], got ", options.max_patch_fraction));
  }
  if (options.cpu_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step runner: cpu_threads must be >= 0 (0: one per core), got ", options.cpu_threads));
  }
  std::unique_ptr<Device> device;
  if (options.device == DeviceKind::kCuda) {
    if (!BuiltWithCuda()) {
      return absl::FailedPreconditionError(
          "the CUDA device was asked for, but this build of stepgraph has no CUDA "
          "(configure with -DSTEPGRAPH_WITH_CUDA=ON)");
    }
    if (!CudaDeviceFound()) {
      return absl::FailedPreconditionError(
          "the CUDA device was asked for, but no CUDA device is available");
    }
    SG_ASSIGN_OR_RETURN(device, MakeCudaRunnerDevice(options));
  } else {
    SG_ASSIGN_OR_RETURN(device, MakeCpuRunnerDevice(options));
  }
  return std::unique_ptr<StepRunner>(new StepRunner(options, std::move(device)));
}

std::string StepRunner::Describe() const {
  return absl::StrCat(device_->Describe(),
                      eager_ ? ", eager (one launch per node)" : ", replayed CUDA graphs");
}

const OpSupport& StepRunner::op_support() const { return device_->dispatch(); }

absl::StatusOr<void*> StepRunner::Allocate(int64_t bytes, absl::string_view what) {
  return device_->Allocate(bytes, /*zeroed=*/false, what);
}

absl::StatusOr<void*> StepRunner::AllocateZeroed(int64_t bytes, absl::string_view what) {
  return device_->Allocate(bytes, /*zeroed=*/true, what);
}

absl::StatusOr<void*> StepRunner::AllocateHost(int64_t bytes, absl::string_view what) {
  return device_->AllocateHost(bytes, what);
}

absl::StatusOr<int64_t> StepRunner::FreeBytes() const { return device_->FreeBytes(); }

absl::Status StepRunner::Copy(void* dst, const void* src, int64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (dst == nullptr || src == nullptr || bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step runner: copy of ", bytes,
                                                   " bytes between null or negative buffers"));
  }
  return device_->Copy(dst, src, bytes);
}

absl::Status StepRunner::Sync() { return device_->Sync(); }

absl::StatusOr<double> StepRunner::CopyBandwidth(int64_t bytes, int repeats) {
  if (bytes <= 0 || repeats <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "copy bandwidth: bytes and repeats must be > 0, got ", bytes, " and ", repeats));
  }
  SG_ASSIGN_OR_RETURN(std::vector<double> seconds, device_->TimeCopies(bytes, repeats));
  const double median = Median(std::move(seconds));
  if (!(median > 0.0)) return absl::InternalError("copy bandwidth: a copy took no time");
  return 2.0 * static_cast<double>(bytes) / median;
}

absl::StatusOr<int> StepRunner::AddStep(Graph graph, const Binder& bind) {
  if (finalized_) {
    return absl::FailedPreconditionError("step runner: AddStep after Finalize");
  }
  auto step = std::make_unique<Step>();
  SG_ASSIGN_OR_RETURN(ExecutionPlan plan, ExecutionPlan::Create(std::move(graph)));
  step->plan = std::make_unique<ExecutionPlan>(std::move(plan));
  step->bindings = std::make_unique<Bindings>(step->plan->graph());
  const int index = static_cast<int>(steps_.size());
  if (absl::Status s = bind(step->plan->graph(), *step->bindings); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("binding step ", index, ": ", s.message()));
  }
  arena_bytes_ = std::max(arena_bytes_, step->plan->arena_bytes());
  steps_.push_back(std::move(step));
  return index;
}

absl::Status StepRunner::Finalize() {
  if (finalized_) return absl::FailedPreconditionError("step runner: Finalize called twice");
  if (steps_.empty()) return absl::FailedPreconditionError("step runner: no steps to finalize");
  if (arena_bytes_ > 0) {
    SG_ASSIGN_OR_RETURN(arena_, device_->Allocate(arena_bytes_, false, "the step arena"));
  }
  KernelDispatch& dispatch = device_->dispatch();
  // Every step is prepared before the first capture, so that no workspace the dispatcher
  // grows moves under a graph already captured.
  for (size_t i = 0; i < steps_.size(); ++i) {
    Step& step = *steps_[i];
    step.bindings->SetArena(arena_, arena_bytes_);
    SG_RETURN_IF_ERROR(CheckBindings(*step.plan, *step.bindings));
    absl::StatusOr<PreparedPlan> prepared = dispatch.Prepare(*step.plan);
    if (!prepared.ok()) {
      return absl::Status(prepared.status().code(), absl::StrCat("preparing step ", i, ": ",
                                                                 prepared.status().message()));
    }
    step.prepared.emplace(*std::move(prepared));
  }
  if (!eager_) {
    for (size_t i = 0; i < steps_.size(); ++i) {
      Step& step = *steps_[i];
      absl::StatusOr<std::unique_ptr<ReplayableStep>> replay =
          device_->Capture(*step.prepared, *step.bindings, options_.max_patch_fraction);
      if (!replay.ok()) {
        return absl::Status(replay.status().code(), absl::StrCat("capturing step ", i, ": ",
                                                                 replay.status().message()));
      }
      step.replay = *std::move(replay);
    }
  }
  finalized_ = true;
  return absl::OkStatus();
}

absl::Status StepRunner::CheckStep(int step, absl::string_view what) const {
  if (ABSL_PREDICT_TRUE(finalized_ && step >= 0 && step < num_steps())) {
    return absl::OkStatus();
  }
  if (!finalized_) {
    return absl::FailedPreconditionError(absl::StrCat("step runner: ", what, " before Finalize"));
  }
  return absl::InvalidArgumentError(absl::StrCat("step runner: ", what, " of step ", step,
                                                 ", which is not in [0, ", num_steps(), ")"));
}

absl::Status StepRunner::Run(int step) {
  SG_RETURN_IF_ERROR(CheckStep(step, "Run"));
  Step& s = *steps_[step];
  if (s.replay != nullptr) return s.replay->Replay();
  return Execute(*s.prepared, *s.bindings, device_->dispatch()).status();
}

absl::StatusOr<std::vector<double>> StepRunner::Profile(int step) {
  SG_RETURN_IF_ERROR(CheckStep(step, "Profile"));
  const Step& s = *steps_[step];
  return device_->Profile(*s.prepared, *s.bindings);
}

const ExecutionPlan& StepRunner::plan(int step) const { return *steps_[step]->plan; }
const Bindings& StepRunner::bindings(int step) const { return *steps_[step]->bindings; }

absl::StatusOr<TensorArg> StepRunner::Output(int step, absl::string_view name) const {
  if (step < 0 || step >= num_steps()) {
    return absl::InvalidArgumentError(absl::StrCat("step runner: no step ", step));
  }
  const Step& s = *steps_[step];
  SG_ASSIGN_OR_RETURN(TensorId id, s.plan->graph().FindOutput(name));
  if (s.plan->graph().tensor(id).kind == TensorKind::kIntermediate && !finalized_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step runner: output '", name, "' lives in the arena, which exists after Finalize"));
  }
  return ResolveTensor(*s.plan, *s.bindings, id.index);
}

int64_t StepRunner::graph_nodes(int step) const {
  if (step < 0 || step >= num_steps() || steps_[step]->replay == nullptr) return 0;
  return steps_[step]->replay->graph_nodes();
}

absl::StatusOr<uint32_t> StepRunner::TakeErrorFlags() { return device_->TakeErrorFlags(); }

absl::Status StepRunner::StartMarks(int64_t n) {
  if (n < 2) return absl::InvalidArgumentError("step runner: StartMarks needs n >= 2");
  return device_->StartMarks(n);
}
absl::Status StepRunner::Mark(int64_t i) { return device_->Mark(i); }
absl::StatusOr<std::vector<double>> StepRunner::MarkIntervalsMs() {
  return device_->MarkIntervalsMs();
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
    host[i] = FloatToBF16(static_cast<float>(static_cast<int64_t>(i * 37 % 17) - 8) / 64.0f + 0.01f);
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
  SG_RETURN_IF_ERROR(runner->StartMarks(runs + 1));
  SG_RETURN_IF_ERROR(runner->Mark(0));
  for (int i = 0; i < runs; ++i) {
    SG_RETURN_IF_ERROR(runner->Run(step));
    SG_RETURN_IF_ERROR(runner->Mark(i + 1));
  }
  SG_ASSIGN_OR_RETURN(std::vector<double> ms, runner->MarkIntervalsMs());
  const double median_s = Median(std::move(ms)) * 1e-3;
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) /
         median_s * 1e-12;
}

}  // namespace sg
