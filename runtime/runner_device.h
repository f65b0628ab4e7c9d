// The device behind a StepRunner: its memory, its stream, its dispatcher, its clocks and,
// on CUDA, capture. Internal to runtime/: the CPU device (cpu_runner_device.cc) is core
// code, the CUDA device (cuda_runner_device.cc) is built only with CUDA. The measurements
// of stepgraph/runtime/measure.h reach a runner's device through StepRunnerAccess.
#ifndef STEPGRAPH_RUNTIME_RUNNER_DEVICE_H_
#define STEPGRAPH_RUNTIME_RUNNER_DEVICE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "stepgraph/dispatch/collectives.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "stepgraph/dispatch/dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/runtime/step_runner.h"

namespace sg {

// A captured step run as a loop on the device (StepRunner::AddLoop).
class DeviceLoop {
 public:
  virtual ~DeviceLoop() = default;
  // StepRunner::RunLoop's work: one launch of up to `limit` steps, then the steps' ids.
  virtual absl::StatusOr<int64_t> Run(int64_t limit, absl::Span<const int32_t> stop_ids,
                                      absl::Span<const uint8_t> live, int32_t* ids_out,
                                      int64_t ids_stride) = 0;
};

// One captured step, replayed as a whole.
class ReplayableStep {
 public:
  virtual ~ReplayableStep() = default;
  virtual absl::Status Replay() = 0;
  virtual int64_t graph_nodes() const = 0;
  // The step as a loop of up to `max_steps` steps whose sampled ids (`rows` of them) the
  // step writes at `ids`; Unimplemented where the device has no such loops.
  virtual absl::StatusOr<std::unique_ptr<DeviceLoop>> MakeLoop(const int32_t* ids, int64_t rows,
                                                               int64_t max_steps) {
    return absl::UnimplementedError("this device runs no loops of steps");
  }
};

class RunnerDevice {
 public:
  virtual ~RunnerDevice() = default;

  virtual std::string Describe() const = 0;
  // Makes the device current for the calling thread (CUDA: its ordinal, where a process
  // drives several); a no-op where there is one device.
  virtual absl::Status MakeCurrent() { return absl::OkStatus(); }
  virtual KernelDispatch& dispatch() = 0;
  // Whether Capture is available (the CPU runs every step eagerly).
  virtual bool can_capture() const = 0;

  // Memory the device owns until it is destroyed.
  virtual absl::StatusOr<void*> Allocate(int64_t bytes, bool zeroed, absl::string_view what) = 0;
  virtual absl::StatusOr<void*> AllocateHost(int64_t bytes, absl::string_view what) = 0;
  virtual absl::StatusOr<int64_t> FreeBytes() const = 0;
  virtual absl::Status Copy(void* dst, const void* src, int64_t bytes) = 0;
  virtual absl::Status Sync() = 0;
  virtual absl::StatusOr<uint32_t> TakeErrorFlags() = 0;
  // Seconds per copy of `bytes` within the device's memory, `repeats` times after one warm-up.
  virtual absl::StatusOr<std::vector<double>> TimeCopies(int64_t bytes, int repeats) = 0;

  virtual absl::StatusOr<std::unique_ptr<ReplayableStep>> Capture(const PreparedPlan& prepared,
                                                                  const Bindings& bindings) = 0;
  // One eager pass with each node's time in ms.
  virtual absl::StatusOr<std::vector<double>> Profile(const PreparedPlan& prepared,
                                                      const Bindings& bindings) = 0;

  virtual absl::Status StartMarks(int64_t n) = 0;
  virtual absl::Status Mark(int64_t i) = 0;
  virtual absl::StatusOr<std::vector<double>> MarkIntervalsMs() = 0;
};

absl::StatusOr<std::unique_ptr<RunnerDevice>> MakeCpuRunnerDevice(const RunnerOptions& options);
// Built with CUDA only (FailedPrecondition otherwise).
absl::StatusOr<std::unique_ptr<RunnerDevice>> MakeCudaRunnerDevice(const RunnerOptions& options);
absl::StatusOr<std::unique_ptr<OpSupport>> CudaOpSupport(const CudaOptions& options);
// One NCCL communicator per GPU 0 .. ranks-1 of this process (NVLink multicast off).
// FailedPrecondition without CUDA, without NCCL or with fewer GPUs.
absl::StatusOr<std::unique_ptr<CollectiveGroup>> MakeCudaCollectives(int ranks);

// What runtime code beside the runner (measure.cc) reaches inside a StepRunner.
class StepRunnerAccess {
 public:
  static RunnerDevice& Device(StepRunner& runner);
  // Step `step`, prepared and bound: after Finalize only (FailedPrecondition before,
  // InvalidArgument for a step that is not there, naming `what`).
  struct PreparedStep {
    const PreparedPlan* prepared = nullptr;
    const Bindings* bindings = nullptr;
  };
  static absl::StatusOr<PreparedStep> Prepared(const StepRunner& runner, int step,
                                               absl::string_view what);
};

}  // namespace sg

#endif  // STEPGRAPH_RUNTIME_RUNNER_DEVICE_H_
