// Arena planning by lifetime (greedy by size, best-fit gap) and ExecutionPlan.
#include <algorithm>
#include <limits>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace {

// Sizes past this are refused: far beyond any device, and keeping every offset sum below
// it (offset + size <= the sum of all aligned sizes) leaves int64 arithmetic exact.
constexpr int64_t kMaxArenaBytes = int64_t{1} << 56;

// A tensor's bytes in the arena.
struct Extent {
  int64_t offset = -1;  // -1 while not placed
  int64_t size = 0;
};

// Conflict sets are about the size of the live set, a few dozen: insertion sort beats
// std::sort's setup there.
void SortByOffset(std::vector<Extent>& v) {
  if (v.size() > 32) {
    std::sort(v.begin(), v.end(),
              [](const Extent& a, const Extent& b) { return a.offset < b.offset; });
    return;
  }
  for (size_t i = 1; i < v.size(); ++i) {
    const Extent x = v[i];
    size_t j = i;
    for (; j > 0 && v[j - 1].offset > x.offset; --j) v[j] = v[j - 1];
    v[j] = x;
  }
}

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

namespace {

absl::StatusOr<MemoryPlan> PlanMemoryImpl(const Graph& graph) {
  MemoryPlan plan;
  const size_t num_tensors = graph.tensors().size();
  plan.offsets.assign(num_tensors, -1);
  plan.lifetimes = ComputeLifetimes(graph);

  struct Item {
    int32_t tensor;
    int64_t size;
    Lifetime life;
    int32_t slot;  // rank by first use
  };
  std::vector<Item> items;
  for (int32_t i = 0; i < static_cast<int32_t>(num_tensors); ++i) {
    const Tensor& t = graph.tensors()[i];
    if (t.kind != TensorKind::kIntermediate) continue;
    const int64_t bytes = t.bytes();
    if (bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("memory plan: intermediate '", t.name, "' ", t.shape.ToString(), " ",
                       DTypeName(t.dtype), " has no valid size"));
    }
    // bytes <= 2^51 (a valid shape), so aligning it cannot overflow.
    const int64_t size =
        (bytes + MemoryPlan::kAlignment - 1) / MemoryPlan::kAlignment * MemoryPlan::kAlignment;
    if (!CheckedAdd(plan.intermediate_bytes, size, &plan.intermediate_bytes) ||
        plan.intermediate_bytes > kMaxArenaBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "memory plan: intermediate '", t.name, "' ", t.shape.ToString(), " ",
          DTypeName(t.dtype), " brings the intermediates past ", kMaxArenaBytes,
          " bytes, more than any device holds"));
    }
    items.push_back({i, size, plan.lifetimes[i], -1});
  }
  const int32_t num_items = static_cast<int32_t>(items.size());

  // The placed tensors overlapping a lifetime [f, l] are found without testing every
  // placed tensor. They are those first used in (f, l] (a range of slots, which are ranked
  // by first use) and those alive at node f. The latter are on a per-node list that each
  // placed tensor joins for every node of its life; long-lived ones (outputs, far skips)
  // instead join a list per block of nodes and are tested against f, so that a tensor
  // takes at most kListedSpan per-node entries or about 256 block entries (memory stays
  // linear in the graph's size). Each set is about the size of the graph's live
  // set, so a plan costs about the sum of its conflict sets (and sorting each) instead of
  // n² overlap tests.
  auto by_first = [](const Item& a, const Item& b) {
    if (a.life.first != b.life.first) return a.life.first < b.life.first;
    return a.tensor < b.tensor;
  };
  // A builder's graph lists tensors in the order nodes produce them: already sorted.
  if (!std::is_sorted(items.begin(), items.end(), by_first)) {
    std::sort(items.begin(), items.end(), by_first);
  }
  std::vector<int32_t> slot_first(num_items);
  std::vector<int32_t> slot_last(num_items);
  for (int32_t s = 0; s < num_items; ++s) {
    items[s].slot = s;
    slot_first[s] = items[s].life.first;
    slot_last[s] = items[s].life.last;
  }

  // Largest first; ties by first use, then index, so the plan is deterministic.
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.size != b.size) return a.size > b.size;
    if (a.life.first != b.life.first) return a.life.first < b.life.first;
    return a.tensor < b.tensor;
  });

  std::vector<Extent> extent_of_slot(num_items);
  // Node t is list t + 1: a tensor of an invalid graph that no node produces has
  // first == -1. Blocks grow with the graph so that a long-lived tensor joins at most
  // about 256 block lists.
  const int32_t num_lists = graph.num_nodes() + 1;
  constexpr int32_t kListedSpan = 64;
  const int32_t block = std::max(kListedSpan, num_lists / 256 + 1);
  struct ListEntry {
    int32_t slot;
    int32_t next;
  };
  std::vector<ListEntry> entries;
  std::vector<int32_t> alive_head(num_lists, -1);
  std::vector<int32_t> block_head(num_lists / block + 1, -1);
  auto push = [&entries](int32_t& head, int32_t slot) {
    entries.push_back({slot, head});
    head = static_cast<int32_t>(entries.size() - 1);
  };
  std::vector<Extent> conflicts;
  for (const Item& item : items) {
    const int32_t f = item.life.first, l = item.life.last;
    conflicts.clear();
    for (int32_t e = alive_head[f + 1]; e >= 0; e = entries[e].next) {
      conflicts.push_back(extent_of_slot[entries[e].slot]);
    }
    for (int32_t e = block_head[(f + 1) / block]; e >= 0; e = entries[e].next) {
      const int32_t s = entries[e].slot;
      if (slot_first[s] <= f && f <= slot_last[s]) conflicts.push_back(extent_of_slot[s]);
    }
    const auto born_begin = std::upper_bound(slot_first.begin(), slot_first.end(), f);
    const auto born_end = std::upper_bound(born_begin, slot_first.end(), l);
    for (auto it = born_begin; it != born_end; ++it) {
      const Extent& e = extent_of_slot[it - slot_first.begin()];
      if (e.offset >= 0) conflicts.push_back(e);
    }
    SortByOffset(conflicts);
    // Best fit: the smallest gap between conflicts that holds the item, else the end.
    int64_t best = -1;
    int64_t best_gap = std::numeric_limits<int64_t>::max();
    int64_t end_of_taken = 0;  // end of the bytes taken by conflicts seen so far
    for (const Extent& c : conflicts) {
      const int64_t gap = c.offset - end_of_taken;
      if (gap >= item.size && gap < best_gap) {
        best = end_of_taken;
        best_gap = gap;
      }
      end_of_taken = std::max(end_of_taken, c.offset + c.size);
    }
    if (best < 0) best = end_of_taken;
    extent_of_slot[item.slot] = {best, item.size};
    if (l - f < kListedSpan) {
      for (int32_t t = f; t <= l; ++t) push(alive_head[t + 1], item.slot);
    } else {
      for (int32_t b = (f + 1) / block; b <= (l + 1) / block; ++b) push(block_head[b], item.slot);
    }
    plan.offsets[item.tensor] = best;
    plan.arena_bytes = std::max(plan.arena_bytes, best + item.size);
  }
  return plan;
}

}  // namespace

absl::StatusOr<MemoryPlan> PlanMemory(const Graph& graph) {
  // The plan's lists grow with the graph; running out of memory is an error, not a crash.
  try {
    return PlanMemoryImpl(graph);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory plan: out of host memory planning a graph of ", graph.num_nodes(), " nodes"));
  }
}

absl::StatusOr<ExecutionPlan> ExecutionPlan::Create(Graph graph) {
  SG_RETURN_IF_ERROR(graph.Validate());
  SG_ASSIGN_OR_RETURN(MemoryPlan memory, PlanMemory(graph));
  return ExecutionPlan(std::move(graph), std::move(memory));
}

}  // namespace sg
