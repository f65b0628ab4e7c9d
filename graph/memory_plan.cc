// Arena planning by lifetime (greedy by size, best-fit gap) and ExecutionPlan.
#include <algorithm>
#include <limits>
#include <vector>

#include "stepgraph/plan.h"
#include "stepgraph/status.h"

namespace sg {
namespace {

int64_t AlignUp(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

}  // namespace

std::vector<Lifetime> ComputeLifetimes(const Graph& graph) {
  std::vector<Lifetime> life(graph.tensors().size());
  const int32_t n = graph.num_nodes();
  for (int32_t i = 0; i < n; ++i) {
    const Node& node = graph.nodes()[i];
    for (const TensorId in : node.inputs) {
      if (graph.tensor(in).kind == TensorKind::kIntermediate) {
        life[in.index].last = std::max(life[in.index].last, i);
      }
    }
    if (graph.tensor(node.output).kind == TensorKind::kIntermediate) {
      Lifetime& l = life[node.output.index];
      l.first = i;
      l.last = std::max(l.last, i);
    }
  }
  // Outputs are read by the caller after the step: they must survive to its end.
  for (const GraphOutput& o : graph.outputs()) {
    if (graph.tensor(o.tensor).kind == TensorKind::kIntermediate) life[o.tensor.index].last = n - 1;
  }
  return life;
}

MemoryPlan PlanMemory(const Graph& graph) {
  MemoryPlan plan;
  const size_t num_tensors = graph.tensors().size();
  plan.offsets.assign(num_tensors, -1);
  plan.lifetimes = ComputeLifetimes(graph);

  struct Item {
    int32_t tensor;
    int64_t size;
    Lifetime life;
  };
  std::vector<Item> items;
  for (int32_t i = 0; i < static_cast<int32_t>(num_tensors); ++i) {
    const Tensor& t = graph.tensors()[i];
    if (t.kind != TensorKind::kIntermediate) continue;
    const int64_t size = AlignUp(t.bytes(), MemoryPlan::kAlignment);
    items.push_back({i, size, plan.lifetimes[i]});
    plan.intermediate_bytes += size;
  }
  // Largest first; ties by first use, then index, so the plan is deterministic.
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.size != b.size) return a.size > b.size;
    if (a.life.first != b.life.first) return a.life.first < b.life.first;
    return a.tensor < b.tensor;
  });

  struct Placed {
    int64_t offset;
    int64_t size;
    Lifetime life;
  };
  std::vector<Placed> placed;
  std::vector<const Placed*> conflicts;
  placed.reserve(items.size());
  for (const Item& item : items) {
    conflicts.clear();
    for (const Placed& p : placed) {
      if (p.life.Overlaps(item.life)) conflicts.push_back(&p);
    }
    std::sort(conflicts.begin(), conflicts.end(),
              [](const Placed* a, const Placed* b) { return a->offset < b->offset; });
    int64_t best = -1;
    int64_t best_gap = std::numeric_limits<int64_t>::max();
    int64_t end = 0;  // end of the bytes taken by conflicts seen so far
    for (const Placed* c : conflicts) {
      const int64_t gap = c->offset - end;
      if (gap >= item.size && gap < best_gap) {
        best = end;
        best_gap = gap;
      }
      end = std::max(end, c->offset + c->size);
    }
    if (best < 0) best = end;
    placed.push_back({best, item.size, item.life});
    plan.offsets[item.tensor] = best;
    plan.arena_bytes = std::max(plan.arena_bytes, best + item.size);
  }
  return plan;
}

absl::StatusOr<ExecutionPlan> ExecutionPlan::Create(Graph graph) {
  SG_RETURN_IF_ERROR(graph.Validate());
  MemoryPlan memory = PlanMemory(graph);
  return ExecutionPlan(std::move(graph), std::move(memory));
}

}  // namespace sg
