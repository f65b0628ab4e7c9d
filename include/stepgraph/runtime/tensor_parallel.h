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

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "stepgraph/graph/bindings.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/shard.h"
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

// A model's Weights and States (KV caches) in every rank's memory, for the steps of one
// sharded model (every bucket's graph has the same weights and states).
class ShardedBuffers {
 public:
  // The stored bytes of a weight of the whole model, by name.
  using WeightSource =
      std::function<absl::StatusOr<absl::Span<const std::byte>>(const std::string& name)>;

  // Uploads every rank's part of each Weight of `sharded` (ShardGraph(whole, plan, ranks)),
  // cut from `source`'s whole bytes (ShardTensorBytes), and zeroes every rank's States.
  // Without a source, each rank draws random weights for its part (FillRandomWeights with
  // seed + rank: a speed run, not the whole model's values).
  static absl::StatusOr<ShardedBuffers> Upload(TensorParallelRunner& tp, const Graph& whole,
                                               const Graph& sharded, const ShardPlan& plan,
                                               const WeightSource& source, uint64_t seed = 0);

  // Binds rank `rank`'s Weights and States of `graph` (a rank's graph of the same model).
  absl::Status Bind(int rank, const Graph& graph, Bindings& bindings) const;
  int64_t weight_bytes_per_rank() const { return weights_.total_bytes; }
  int64_t state_bytes_per_rank() const { return states_.total_bytes; }

 private:
  // Where each tensor of one kind lives in every rank's block of that kind.
  struct Layout {
    struct Entry {
      int64_t offset = 0;
      int64_t bytes = 0;
    };
    absl::flat_hash_map<std::string, Entry> entries;
    int64_t total_bytes = 0;
  };
  static absl::Status BindKind(const Layout& layout, std::byte* base, const Graph& graph,
                               TensorKind kind, Bindings& bindings);

  Layout weights_, states_;
  std::vector<std::byte*> weight_base_, state_base_;
};

}  // namespace sg

#endif  // STEPGRAPH_RUNTIME_TENSOR_PARALLEL_H_
