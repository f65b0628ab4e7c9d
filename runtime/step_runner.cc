// StepRunner: the steps of one model (per batch bucket, per prefill chunk) over one device.
// Planning, binding, preparing and capturing happen once, in AddStep and Finalize; Run is
// one replay or one eager pass and neither allocates nor formats.
#include "stepgraph/runtime/step_runner.h"

#include <algorithm>
#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/runner_device.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace {

struct Step {
  std::unique_ptr<ExecutionPlan> plan;
  std::unique_ptr<Bindings> bindings;
  std::optional<PreparedPlan> prepared;
  std::unique_ptr<ReplayableStep> replay;
  // Declared after `replay`, destroyed before it: the loop holds the step's graph.
  std::unique_ptr<DeviceLoop> loop;
  int64_t loop_rows = 0, loop_steps = 0;
};

}  // namespace

struct StepRunner::Impl {
  Impl(const RunnerOptions& o, std::unique_ptr<RunnerDevice> d)
      : options(o), eager(o.eager || !d->can_capture()), device(std::move(d)) {}
  ~Impl() {
    // Steps (and their captured graphs) go before the device's memory and stream.
    if (device != nullptr) (void)device->Sync();
    steps.clear();
  }

  // OK for a step that Run and its kin may use; `what` names the caller in the error.
  absl::Status CheckStep(int step, absl::string_view what) const;

  RunnerOptions options;
  bool eager = true;
  bool finalized = false;
  // Declared first, destroyed last: the steps' captures, the arena and every buffer live
  // on it.
  std::unique_ptr<RunnerDevice> device;
  void* arena = nullptr;  // owned by the device
  int64_t arena_bytes = 0;
  std::vector<std::unique_ptr<Step>> steps;
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

StepRunner::StepRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StepRunner::~StepRunner() = default;

namespace {
// The CPU device's answer: the dispatcher it was given, else the reference, which runs
// every op (CpuDispatch::Supports).
class CpuOpSupport final : public OpSupport {
 public:
  explicit CpuOpSupport(const KernelDispatch* given) : given_(given) {}
  bool Supports(const Op& op, absl::Span<const Tensor* const> inputs) const override {
    return given_ == nullptr || given_->Supports(op, inputs);
  }

 private:
  const KernelDispatch* given_;
};
}  // namespace

absl::StatusOr<std::unique_ptr<OpSupport>> OpSupportFor(const RunnerOptions& options) {
  if (options.device == DeviceKind::kCuda) return CudaOpSupport(options.cuda);
  return std::unique_ptr<OpSupport>(std::make_unique<CpuOpSupport>(options.cpu_dispatch));
}

absl::StatusOr<std::unique_ptr<StepRunner>> StepRunner::Create(const RunnerOptions& options) {
  if (options.cpu_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step runner: cpu_threads must be >= 0 (0: one per core), got ", options.cpu_threads));
  }
  std::unique_ptr<RunnerDevice> device;
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
  return std::unique_ptr<StepRunner>(
      new StepRunner(std::make_unique<Impl>(options, std::move(device))));
}

DeviceKind StepRunner::device() const { return impl_->options.device; }
bool StepRunner::replays() const { return !impl_->eager; }
int StepRunner::num_steps() const { return static_cast<int>(impl_->steps.size()); }
int64_t StepRunner::arena_bytes() const { return impl_->arena_bytes; }

std::string StepRunner::Describe() const {
  return absl::StrCat(impl_->device->Describe(), impl_->eager ? ", eager (one launch per node)"
                                                              : ", replayed CUDA graphs");
}

const OpSupport& StepRunner::op_support() const { return impl_->device->dispatch(); }

absl::StatusOr<void*> StepRunner::Allocate(int64_t bytes, absl::string_view what) {
  SG_RETURN_IF_ERROR(impl_->device->MakeCurrent());
  return impl_->device->Allocate(bytes, /*zeroed=*/false, what);
}

absl::StatusOr<void*> StepRunner::AllocateZeroed(int64_t bytes, absl::string_view what) {
  SG_RETURN_IF_ERROR(impl_->device->MakeCurrent());
  return impl_->device->Allocate(bytes, /*zeroed=*/true, what);
}

absl::StatusOr<void*> StepRunner::AllocateHost(int64_t bytes, absl::string_view what) {
  SG_RETURN_IF_ERROR(impl_->device->MakeCurrent());
  return impl_->device->AllocateHost(bytes, what);
}

absl::StatusOr<int64_t> StepRunner::FreeBytes() const {
  SG_RETURN_IF_ERROR(impl_->device->MakeCurrent());
  return impl_->device->FreeBytes();
}

absl::Status StepRunner::Copy(void* dst, const void* src, int64_t bytes) {
  SG_RETURN_IF_ERROR(impl_->device->MakeCurrent());
  if (bytes == 0) return absl::OkStatus();
  if (dst == nullptr || src == nullptr || bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step runner: copy of ", bytes,
                                                   " bytes between null or negative buffers"));
  }
  return impl_->device->Copy(dst, src, bytes);
}

absl::Status StepRunner::CopyWeight(void* dst, const void* src, const Tensor& weight) {
  SG_RETURN_IF_ERROR(impl_->device->MakeCurrent());
  KernelDispatch& dispatch = impl_->device->dispatch();
  const int64_t bytes = weight.bytes();
  if (!dispatch.RepacksWeight(weight)) return Copy(dst, src, bytes);
  if (dst == nullptr || src == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("step runner: copy of weight '", weight.name, "' from or to null"));
  }
  // Repacked on the host into a buffer of its own (load time, once per weight), which must
  // outlive the copy: hence the wait.
  std::vector<std::byte> staging(static_cast<size_t>(bytes));
  SG_RETURN_IF_ERROR(dispatch.RepackWeight(
      weight, {static_cast<const std::byte*>(src), static_cast<size_t>(bytes)},
      absl::MakeSpan(staging)));
  SG_RETURN_IF_ERROR(impl_->device->Copy(dst, staging.data(), bytes));
  return impl_->device->Sync();
}

absl::Status StepRunner::Sync() {
  SG_RETURN_IF_ERROR(impl_->device->MakeCurrent());
  return impl_->device->Sync();
}

absl::StatusOr<int> StepRunner::AddStep(Graph graph, const Binder& bind) {
  Impl& r = *impl_;
  if (r.finalized) return absl::FailedPreconditionError("step runner: AddStep after Finalize");
  auto step = std::make_unique<Step>();
  SG_ASSIGN_OR_RETURN(ExecutionPlan plan, ExecutionPlan::Create(std::move(graph)));
  step->plan = std::make_unique<ExecutionPlan>(std::move(plan));
  step->bindings = std::make_unique<Bindings>(step->plan->graph());
  const int index = static_cast<int>(r.steps.size());
  if (absl::Status s = bind(step->plan->graph(), *step->bindings); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("binding step ", index, ": ", s.message()));
  }
  r.arena_bytes = std::max(r.arena_bytes, step->plan->arena_bytes());
  r.steps.push_back(std::move(step));
  return index;
}

absl::Status StepRunner::Finalize() {
  SG_RETURN_IF_ERROR(impl_->device->MakeCurrent());
  Impl& r = *impl_;
  if (r.finalized) return absl::FailedPreconditionError("step runner: Finalize called twice");
  if (r.steps.empty()) return absl::FailedPreconditionError("step runner: no steps to finalize");
  if (r.arena_bytes > 0) {
    SG_ASSIGN_OR_RETURN(r.arena, r.device->Allocate(r.arena_bytes, false, "the step arena"));
  }
  KernelDispatch& dispatch = r.device->dispatch();
  // Every step is prepared before the first capture, so that no workspace the dispatcher
  // grows moves under a graph already captured.
  for (size_t i = 0; i < r.steps.size(); ++i) {
    Step& step = *r.steps[i];
    step.bindings->SetArena(r.arena, r.arena_bytes);
    SG_RETURN_IF_ERROR(CheckBindings(*step.plan, *step.bindings));
    absl::StatusOr<PreparedPlan> prepared = dispatch.Prepare(*step.plan);
    if (!prepared.ok()) {
      return absl::Status(prepared.status().code(), absl::StrCat("preparing step ", i, ": ",
                                                                 prepared.status().message()));
    }
    step.prepared.emplace(*std::move(prepared));
  }
  if (!r.eager) {
    for (size_t i = 0; i < r.steps.size(); ++i) {
      Step& step = *r.steps[i];
      absl::StatusOr<std::unique_ptr<ReplayableStep>> replay =
          r.device->Capture(*step.prepared, *step.bindings);
      if (!replay.ok()) {
        return absl::Status(replay.status().code(), absl::StrCat("capturing step ", i, ": ",
                                                                 replay.status().message()));
      }
      step.replay = *std::move(replay);
    }
  }
  r.finalized = true;
  return absl::OkStatus();
}

absl::Status StepRunner::Impl::CheckStep(int step, absl::string_view what) const {
  const int n = static_cast<int>(steps.size());
  if (ABSL_PREDICT_TRUE(finalized && step >= 0 && step < n)) return absl::OkStatus();
  if (!finalized) {
    return absl::FailedPreconditionError(absl::StrCat("step runner: ", what, " before Finalize"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("step runner: ", what, " of step ", step, ", which is not in [0, ", n, ")"));
}

absl::Status StepRunner::Run(int step) {
  SG_RETURN_IF_ERROR(impl_->device->MakeCurrent());
  SG_RETURN_IF_ERROR(impl_->CheckStep(step, "Run"));
  Step& s = *impl_->steps[step];
  if (s.replay != nullptr) return s.replay->Replay();
  return Execute(*s.prepared, *s.bindings, impl_->device->dispatch()).status();
}

const ExecutionPlan& StepRunner::plan(int step) const { return *impl_->steps[step]->plan; }
const Bindings& StepRunner::bindings(int step) const { return *impl_->steps[step]->bindings; }

absl::StatusOr<TensorArg> StepRunner::Output(int step, absl::string_view name) const {
  if (step < 0 || step >= num_steps()) {
    return absl::InvalidArgumentError(absl::StrCat("step runner: no step ", step));
  }
  const Step& s = *impl_->steps[step];
  SG_ASSIGN_OR_RETURN(TensorId id, s.plan->graph().FindOutput(name));
  if (s.plan->graph().tensor(id).kind == TensorKind::kIntermediate && !impl_->finalized) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step runner: output '", name, "' lives in the arena, which exists after Finalize"));
  }
  return ResolveTensor(*s.plan, *s.bindings, id.index);
}

int64_t StepRunner::graph_nodes(int step) const {
  if (step < 0 || step >= num_steps() || impl_->steps[step]->replay == nullptr) return 0;
  return impl_->steps[step]->replay->graph_nodes();
}

absl::Status StepRunner::AddLoop(int step, absl::string_view ids_output, int64_t max_steps) {
  SG_RETURN_IF_ERROR(impl_->device->MakeCurrent());
  SG_RETURN_IF_ERROR(impl_->CheckStep(step, "AddLoop"));
  Step& s = *impl_->steps[step];
  if (s.replay == nullptr) {
    return absl::FailedPreconditionError(
        "step runner: a device loop needs a captured step (CUDA, not eager)");
  }
  if (max_steps < 1 || max_steps > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("step runner: a device loop of ", max_steps, " steps (1 to 2^20)"));
  }
  SG_ASSIGN_OR_RETURN(const TensorArg ids, Output(step, ids_output));
  if (ids.dtype != DType::kI32 || ids.shape.rank() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("step runner: the device loop's ids '",
                                                   ids_output, "' must be a [rows] i32 output"));
  }
  SG_ASSIGN_OR_RETURN(s.loop, s.replay->MakeLoop(static_cast<const int32_t*>(ids.data),
                                                 ids.shape[0], max_steps));
  s.loop_rows = ids.shape[0];
  s.loop_steps = max_steps;
  return absl::OkStatus();
}

bool StepRunner::has_loop(int step) const {
  return step >= 0 && step < num_steps() && impl_->steps[step]->loop != nullptr;
}

absl::StatusOr<int64_t> StepRunner::RunLoop(int step, int64_t limit,
                                            absl::Span<const int32_t> stop_ids,
                                            absl::Span<const uint8_t> live, int32_t* ids_out,
                                            int64_t ids_stride) {
  SG_RETURN_IF_ERROR(impl_->device->MakeCurrent());
  SG_RETURN_IF_ERROR(impl_->CheckStep(step, "RunLoop"));
  Step& s = *impl_->steps[step];
  if (s.loop == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("step runner: step ", step,
                                                      " has no device loop (AddLoop)"));
  }
  if (limit < 1 || limit > s.loop_steps || static_cast<int64_t>(live.size()) != s.loop_rows ||
      ids_stride < s.loop_rows || ids_out == nullptr || stop_ids.size() > kMaxLoopStopIds) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step runner: RunLoop of ", limit, " steps (1 to ", s.loop_steps, "), ", live.size(),
        " live flags (", s.loop_rows, " rows), ", stop_ids.size(), " stop ids (at most ",
        kMaxLoopStopIds, ")"));
  }
  return s.loop->Run(limit, stop_ids, live, ids_out, ids_stride);
}

absl::StatusOr<uint32_t> StepRunner::TakeErrorFlags() {
  SG_RETURN_IF_ERROR(impl_->device->MakeCurrent());
  return impl_->device->TakeErrorFlags();
}

RunnerDevice& StepRunnerAccess::Device(StepRunner& runner) { return *runner.impl_->device; }

absl::StatusOr<StepRunnerAccess::PreparedStep> StepRunnerAccess::Prepared(
    const StepRunner& runner, int step, absl::string_view what) {
  SG_RETURN_IF_ERROR(runner.impl_->CheckStep(step, what));
  const auto& s = *runner.impl_->steps[step];
  return PreparedStep{&*s.prepared, s.bindings.get()};
}

}  // namespace sg
