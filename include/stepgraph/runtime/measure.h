// Measurements on a StepRunner's device, for the benchmarks, the program and the session's
// timed steps: the ceilings a step is compared with (the bandwidth of a large copy, the
// bf16 matmul rate), time marks on the runner's stream, and a step's time per node. Kept
// apart from StepRunner so that the runner is only what runs steps.
#ifndef STEPGRAPH_RUNTIME_MEASURE_H_
#define STEPGRAPH_RUNTIME_MEASURE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stepgraph/runtime/step_runner.h"

namespace sg {

// The bandwidth of a large copy within the runner's device memory, counted as bytes read
// plus bytes written per second (median of `repeats`): the ceiling a memory-bound step is
// compared with. Allocates two buffers of `bytes` for the measurement.
absl::StatusOr<double> CopyBandwidth(StepRunner& runner, int64_t bytes, int repeats);

// Time marks on the runner's stream (CUDA events; the host clock on the CPU): StartMarks
// with n >= 2, then Mark(i) for i in [0, n), then the n - 1 intervals in ms (waits for the
// last mark). A runner holds one set of marks at a time; Mark neither allocates nor
// formats.
absl::Status StartMarks(StepRunner& runner, int64_t n);
absl::Status Mark(StepRunner& runner, int64_t i);
absl::StatusOr<std::vector<double>> MarkIntervalsMs(StepRunner& runner);

// Runs step `step` of a finalized runner eagerly with the time of each node in ms (on CUDA
// the launches are queued before the first starts, so each time is the node's device
// time).
absl::StatusOr<std::vector<double>> ProfileNodes(StepRunner& runner, int step);

// The bf16 matmul rate of the device `options` names, in TFLOP/s: one n×n×n MatMul node
// on a runner of its own, through the dispatcher's matmul path (cuBLASLt at the default
// size), median of `runs` replays: the ceiling a compute-bound step (prefill) is compared
// with.
absl::StatusOr<double> MeasureMatmulTflops(const RunnerOptions& options, int64_t n = 4096,
                                           int runs = 20);

}  // namespace sg

#endif  // STEPGRAPH_RUNTIME_MEASURE_H_
