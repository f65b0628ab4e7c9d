// Bindings: caller-owned memory for a plan (the arena and one buffer per Input, Weight and
// State), and CheckBindings, which refuses bindings that do not fit the plan. Loaders bind
// weights through this without the executor.
#ifndef STEPGRAPH_GRAPH_BINDINGS_H_
#define STEPGRAPH_GRAPH_BINDINGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/memory_plan.h"

namespace sg {

// Caller-owned memory for a plan: the arena and one buffer per Input, Weight and State.
// Host memory for the CPU reference, device memory for CUDA; the executor never looks
// inside. A buffer may be larger than its tensor (e.g. sized for the largest batch).
class Bindings {
 public:
  struct Buffer {
    void* data = nullptr;
    int64_t bytes = 0;
  };

  explicit Bindings(const Graph& graph);

  // InvalidArgument for intermediates (they live in the arena), null data or a foreign id;
  // NotFound for an unknown name. Sizes are checked by CheckBindings.
  absl::Status Bind(absl::string_view tensor_name, void* data, int64_t bytes);
  absl::Status Bind(TensorId id, void* data, int64_t bytes);
  void SetArena(void* data, int64_t bytes) { arena_ = {data, bytes}; }

  const Buffer& arena() const { return arena_; }
  const Buffer& buffer(int32_t tensor_index) const { return buffers_[tensor_index]; }
  uint32_t graph_owner() const { return owner_; }

 private:
  uint32_t owner_;
  std::vector<TensorKind> kinds_;
  absl::flat_hash_map<std::string, int32_t> index_by_name_;
  Buffer arena_;
  std::vector<Buffer> buffers_;
};

// Refuses, before anything runs, bindings made for another graph, a missing or too-small
// buffer for any Input, Weight or State, and an arena smaller than the plan's.
absl::Status CheckBindings(const ExecutionPlan& plan, const Bindings& bindings);

}  // namespace sg

#endif  // STEPGRAPH_GRAPH_BINDINGS_H_
