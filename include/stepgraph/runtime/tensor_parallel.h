// TensorParallelRunner: one step runner per rank of a tensor-parallel group, driven in
// lockstep by one process (docs/parallel.md). Each rank's runner holds that rank's graph
// (ShardGraph of the model's), its part of the weights and KV cache, its arena and its
// stream; the steps' collective ops meet through the group: NCCL communicators over GPUs
// 0 .. N-1 on CUDA, threads of this process on the CPU reference.
//
//   auto tp = TensorParallelRunner::Create({.runner = {.device = DeviceKind::kCuda}, .ranks = 2});
//   int step = tp->AddStep(sharded_graph, bind);  // bind(rank, graph, bindings)
//   tp->Finalize();                               // every rank prepares and captures
//   tp->Run(step);                                // every rank's replay
//
// A replayed step is one graph launch per rank from the calling thread (no host work
// beyond the launches). Eager steps, capture and preparation run each rank on a thread of
// its own, since a rank's collective waits for the others. When a rank fails, the group is
// aborted so that no rank waits forever, and the runner is spent.
#ifndef STEPGRAPH_RUNTIME_TENSOR_PARALLEL_H_
#define STEPGRAPH_RUNTIME_TENSOR_PARALLEL_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stepgraph/graph/bindings.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/runtime/step_runner.h"

namespace sg {

class CollectiveGroup;
class RankThreads;

struct TensorParallelOptions {
  // Every rank's runner options; cuda_device, collectives and rank are set per rank.
  RunnerOptions runner;
  int ranks = 1;
};

class TensorParallelRunner {
 public:
  // FailedPrecondition when the device kind cannot run `ranks` ranks here (fewer GPUs, a
  // build without CUDA or NCCL); InvalidArgument for ranks outside [1, ops::kMaxRanks].
  static absl::StatusOr<std::unique_ptr<TensorParallelRunner>> Create(
      const TensorParallelOptions& options);
  ~TensorParallelRunner();
  TensorParallelRunner(const TensorParallelRunner&) = delete;
  TensorParallelRunner& operator=(const TensorParallelRunner&) = delete;

  int ranks() const { return static_cast<int>(runners_.size()); }
  // Rank r's runner: its memory, copies, outputs and measurements.
  StepRunner& rank(int r) { return *runners_[static_cast<size_t>(r)]; }
  bool replays() const { return runners_.front()->replays(); }

  // Adds `graph` (a rank's graph) to every rank, bound by `bind` for each; returns the
  // step's index, the same on every rank.
  using Binder = std::function<absl::Status(int rank, const Graph& graph, Bindings& bindings)>;
  absl::StatusOr<int> AddStep(const Graph& graph, const Binder& bind);
  // Every rank's Finalize, concurrently (their captures record the collectives together).
  absl::Status Finalize();
  // Step `step` on every rank.
  absl::Status Run(int step);
  // Waits for every rank.
  absl::Status Sync();
  // Runs fn(r) for every rank r, each on its rank's thread (rank 0 on the caller's), and
  // returns the first failure; a failure aborts the group.
  absl::Status ForEachRank(const std::function<absl::Status(int rank)>& fn);

 private:
  TensorParallelRunner() = default;

  std::unique_ptr<CollectiveGroup> group_;
  std::vector<std::unique_ptr<StepRunner>> runners_;
  std::unique_ptr<RankThreads> workers_;
};

}  // namespace sg

#endif  // STEPGRAPH_RUNTIME_TENSOR_PARALLEL_H_
