// Memory planning: every intermediate gets an offset in one arena, chosen by lifetime so
// that tensors never live at the same time share bytes. Inputs, weights and states are
// bound by the caller and never placed here. Once planned, addresses never move, which is
// what lets a captured CUDA graph stay valid.
#ifndef STEPGRAPH_GRAPH_MEMORY_PLAN_H_
#define STEPGRAPH_GRAPH_MEMORY_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "stepgraph/graph/graph.h"

namespace sg {

// The node interval over which a tensor's bytes must stay intact: from the node that
// produces it to the last node that reads it (to the end of the graph for outputs).
struct Lifetime {
  int32_t first = -1;
  int32_t last = -1;
  bool Overlaps(const Lifetime& o) const { return first <= o.last && o.first <= last; }
};

struct MemoryPlan {
  static constexpr int64_t kAlignment = 256;

  std::vector<int64_t> offsets;     // per tensor; -1 unless it is an Intermediate
  std::vector<Lifetime> lifetimes;  // per tensor; {-1,-1} unless it is an Intermediate
  int64_t arena_bytes = 0;          // size of the arena the caller must bind
  int64_t intermediate_bytes = 0;   // sum of every intermediate's aligned size
};

// Lifetimes of the intermediates of a valid graph.
std::vector<Lifetime> ComputeLifetimes(const Graph& graph);

// Greedy by size: intermediates are placed largest first, each at the best-fitting gap
// (the smallest one that holds it) among the tensors already placed whose lifetimes
// overlap its own. The graph must be valid. InvalidArgument, naming the tensor, when an
// intermediate has no valid size or the intermediates together pass 2^56 bytes (which
// keeps every offset computed here exact).
absl::StatusOr<MemoryPlan> PlanMemory(const Graph& graph);

// A validated graph with its memory plan: what Execute and capture run.
class ExecutionPlan {
 public:
  // Validates `graph` and plans its memory.
  static absl::StatusOr<ExecutionPlan> Create(Graph graph);

  const Graph& graph() const { return graph_; }
  const MemoryPlan& memory() const { return memory_; }
  int64_t arena_bytes() const { return memory_.arena_bytes; }

 private:
  ExecutionPlan(Graph graph, MemoryPlan memory)
      : graph_(std::move(graph)), memory_(std::move(memory)) {}

  Graph graph_;
  MemoryPlan memory_;
};

}  // namespace sg

#endif  // STEPGRAPH_GRAPH_MEMORY_PLAN_H_
