// A model's weights put into a runner's memory: the whole of them, or one rank's part of a
// tensor-parallel model (docs/parallel.md), cut from the files' bytes or drawn at random;
// and ShardedBuffers, every rank's weights and KV cache for a TensorParallelRunner.
// Internal to runtime/ (and its tools and tests).
#ifndef STEPGRAPH_RUNTIME_SHARDED_WEIGHTS_H_
#define STEPGRAPH_RUNTIME_SHARDED_WEIGHTS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "models/random_weights.h"
#include "stepgraph/graph/bindings.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/shard.h"
#include "stepgraph/runtime/step_runner.h"
#include "stepgraph/runtime/tensor_parallel.h"

namespace sg {

// The stored bytes of a weight of the whole model, by name.
using WeightSource =
    std::function<absl::StatusOr<absl::Span<const std::byte>>(const std::string& name)>;

// Where a rank's weights come from.
struct WeightUpload {
  // The rank's graph, whose Weights `layout` places (LayoutBuffers(graph, kWeight)).
  const Graph* graph = nullptr;
  const BufferLayout* layout = nullptr;
  // The files' bytes; empty: random weights drawn for the graph's own tensors with
  // seed + rank (with several ranks, each rank's own values, not a part of the whole's).
  WeightSource source;
  // With a source and several ranks: the whole model's graph (the files' shapes) and how
  // it splits.
  const Graph* whole = nullptr;
  const ShardPlan* plan = nullptr;
  int rank = 0;
  int ranks = 1;
  uint64_t seed = 0;
  int threads = 0;  // of the random fill; 0: one per core
};

// Copies every Weight into `runner` memory at `base` + its layout offset, in the layout
// its dispatcher reads, and waits for the copies (the source may be dropped after).
// InvalidArgument naming the weight when the source's bytes are not its size.
absl::Status UploadWeights(StepRunner& runner, const WeightUpload& upload, std::byte* base);

// A model's Weights and States (KV caches) in every rank's memory, for the steps of one
// sharded model (every bucket's graph has the same weights and states).
class ShardedBuffers {
 public:
  // Uploads every rank's part of each Weight of `sharded` (ShardGraph(whole, plan, ranks))
  // and zeroes every rank's States; without a source, random weights (UploadWeights).
  static absl::StatusOr<ShardedBuffers> Upload(TensorParallelRunner& tp, const Graph& whole,
                                               const Graph& sharded, const ShardPlan& plan,
                                               const WeightSource& source, uint64_t seed = 0);

  // Binds rank `rank`'s Weights and States of `graph` (a rank's graph of the same model).
  absl::Status Bind(int rank, const Graph& graph, Bindings& bindings) const;
  int64_t weight_bytes_per_rank() const { return weights_.total_bytes; }

 private:
  BufferLayout weights_, states_;
  std::vector<std::byte*> weight_base_, state_base_;
};

}  // namespace sg

#endif  // STEPGRAPH_RUNTIME_SHARDED_WEIGHTS_H_
