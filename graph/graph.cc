// Graph: validation of hand-made graphs, lookups, DOT and text dumps.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/base/status.h"

namespace sg {

uint32_t NewGraphOwnerTag() {
  static std::atomic<uint32_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

Graph::Graph(uint32_t owner, std::vector<Tensor> tensors, std::vector<Node> nodes,
             std::vector<GraphOutput> outputs)
    : owner_(owner),
      tensors_(std::move(tensors)),
      nodes_(std::move(nodes)),
      outputs_(std::move(outputs)) {
  tensor_by_name_.reserve(tensors_.size());
  for (int32_t i = 0; i < num_tensors(); ++i) tensor_by_name_.emplace(tensors_[i].name, i);
}

absl::StatusOr<TensorId> Graph::FindTensor(absl::string_view name) const {
  auto it = tensor_by_name_.find(name);
  if (it == tensor_by_name_.end()) {
    return absl::NotFoundError(absl::StrCat("graph has no tensor named '", name, "'"));
  }
  return id(it->second);
}

absl::StatusOr<TensorId> Graph::FindOutput(absl::string_view name) const {
  for (const GraphOutput& o : outputs_) {
    if (o.name == name) return o.tensor;
  }
  return absl::NotFoundError(absl::StrCat("graph has no output named '", name, "'"));
}

namespace {

// Finds a cycle among nodes through intermediate edges; returns the node names along it,
// or an empty vector.
std::vector<std::string> FindCycle(const Graph& g, const std::vector<int32_t>& producer) {
  const int n = g.num_nodes();
  std::vector<int8_t> color(n, 0);  // 0 unvisited, 1 on stack, 2 done
  std::vector<int32_t> parent(n, -1);
  for (int start = 0; start < n; ++start) {
    if (color[start] != 0) continue;
    // Iterative DFS: (node, next input to look at).
    std::vector<std::pair<int32_t, size_t>> stack{{start, 0}};
    color[start] = 1;
    while (!stack.empty()) {
      auto& [v, next] = stack.back();
      const auto& inputs = g.nodes()[v].inputs;
      if (next == inputs.size()) {
        color[v] = 2;
        stack.pop_back();
        continue;
      }
      const TensorId in = inputs[next++];
      // Only intermediates order nodes; a State or Input read before its writer simply
      // reads the previous step's value.
      if (!g.Contains(in) || g.tensor(in).kind != TensorKind::kIntermediate) continue;
      const int32_t u = producer[in.index];
      if (u < 0) continue;
      if (u == v) return {g.nodes()[v].name, g.nodes()[v].name};
      if (color[u] == 1) {
        std::vector<std::string> cycle{g.nodes()[u].name};
        for (auto it = stack.rbegin(); it != stack.rend() && it->first != u; ++it) {
          cycle.push_back(g.nodes()[it->first].name);
        }
        cycle.push_back(g.nodes()[u].name);
        return cycle;
      }
      if (color[u] == 0) {
        color[u] = 1;
        stack.emplace_back(u, 0);
      }
    }
  }
  return {};
}

}  // namespace

absl::Status Graph::Validate() const {
  auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(parts...));
  };
  if (nodes_.empty()) return invalid("graph is empty: it has no nodes");

  // The constructor indexed every name, keeping the first of each: fewer entries than
  // tensors means a name repeats, and only then is each tensor looked up.
  const bool names_unique = tensor_by_name_.size() == tensors_.size();
  for (int32_t i = 0; i < num_tensors(); ++i) {
    const Tensor& t = tensors_[i];
    if (t.name.empty()) return invalid("a tensor has an empty name");
    if (!names_unique && tensor_by_name_.find(t.name)->second != i) {
      return invalid("duplicate tensor name '", t.name, "'");
    }
    if (!t.shape.valid() || t.shape.rank() == 0) {
      return invalid("tensor '", t.name, "' has an invalid shape ", t.shape.ToString());
    }
    if (!IsValidDType(t.dtype)) {
      return invalid("tensor '", t.name, "' has an unknown dtype (value ",
                     static_cast<int>(t.dtype), ")");
    }
  }

  // Producers of intermediates and writers of in-place targets.
  std::vector<int32_t> producer(tensors_.size(), -1);
  absl::flat_hash_set<absl::string_view> node_names;
  node_names.reserve(nodes_.size());
  for (int32_t i = 0; i < num_nodes(); ++i) {
    const Node& node = nodes_[i];
    if (node.name.empty()) return invalid("node ", i, " has an empty name");
    if (!node_names.insert(node.name).second) {
      return invalid("duplicate node name '", node.name, "'");
    }
    for (const TensorId in : node.inputs) {
      if (!Contains(in)) {
        return invalid("node '", node.name, "' reads an unknown or foreign tensor id (index ",
                       in.index, ", owner ", in.owner, ")");
      }
    }
    if (!Contains(node.output)) {
      return invalid("node '", node.name, "' writes an unknown or foreign tensor id (index ",
                     node.output.index, ")");
    }
    const Tensor& out = tensors_[node.output.index];
    if (IsInPlace(node.op)) {
      if (node.inputs.empty() || node.inputs.back() != node.output) {
        return invalid("in-place node '", node.name, "' must list the tensor it writes, '",
                       out.name, "', as its last input");
      }
      if (out.kind != TensorKind::kState && out.kind != TensorKind::kInput) {
        return invalid("node '", node.name, "' writes ", TensorKindName(out.kind), " '",
                       out.name, "' in place; only a State or Input can be written");
      }
    } else if (out.kind != TensorKind::kIntermediate) {
      return invalid("node '", node.name, "' writes ", TensorKindName(out.kind), " '", out.name,
                     "'; only the in-place ops KvWrite, Copy, Advance and CountIds write ",
                     "bound tensors");
    }
    if (producer[node.output.index] >= 0) {
      return invalid(TensorKindName(out.kind), " '", out.name, "' is written by two nodes, '",
                     nodes_[producer[node.output.index]].name, "' and '", node.name, "'");
    }
    producer[node.output.index] = i;
  }

  for (int32_t i = 0; i < num_tensors(); ++i) {
    if (tensors_[i].kind == TensorKind::kIntermediate && producer[i] < 0) {
      return invalid("dangling tensor: intermediate '", tensors_[i].name,
                     "' is produced by no node");
    }
  }

  // Order: every intermediate is produced before it is read.
  for (int32_t i = 0; i < num_nodes(); ++i) {
    const Node& node = nodes_[i];
    for (const TensorId in : node.inputs) {
      const Tensor& t = tensors_[in.index];
      if (t.kind != TensorKind::kIntermediate || producer[in.index] < i) continue;
      std::vector<std::string> cycle = FindCycle(*this, producer);
      if (!cycle.empty()) return invalid("graph has a cycle: ", absl::StrJoin(cycle, " -> "));
      return invalid("nodes out of topological order: node ", i, " '", node.name, "' reads '",
                     t.name, "' before node ", producer[in.index], " '",
                     nodes_[producer[in.index]].name, "' produces it");
    }
  }

  // Types.
  std::vector<const Tensor*> inputs;
  for (const Node& node : nodes_) {
    inputs.clear();
    for (const TensorId in : node.inputs) inputs.push_back(&tensors_[in.index]);
    SG_ASSIGN_OR_RETURN(const TensorType type, InferOutputType(node.op, node.name, inputs));
    const Tensor& out = tensors_[node.output.index];
    if (type.dtype != out.dtype || type.shape != out.shape) {
      return invalid(OpName(node.op), " node '", node.name, "': output '", out.name, "' is ",
                     out.shape.ToString(), " ", DTypeName(out.dtype), " but its inputs give ",
                     type.shape.ToString(), " ", DTypeName(type.dtype));
    }
  }

  absl::flat_hash_set<absl::string_view> output_names;
  for (const GraphOutput& o : outputs_) {
    if (!output_names.insert(o.name).second) {
      return invalid("duplicate output name '", o.name, "'");
    }
    if (!Contains(o.tensor)) {
      return invalid("output '", o.name, "' names an unknown or foreign tensor id");
    }
  }
  return absl::OkStatus();
}

namespace {

std::string DotEscape(absl::string_view s) {
  return absl::StrReplaceAll(s, {{"\\", "\\\\"}, {"\"", "\\\""}});
}

std::string TypeText(const Tensor& t) {
  return absl::StrCat(t.shape.ToString(), " ", DTypeName(t.dtype));
}

}  // namespace

std::string Graph::ToDot() const {
  std::string dot = "digraph stepgraph {\n  rankdir=TB;\n  node [fontname=\"monospace\"];\n";
  std::vector<int32_t> producer(tensors_.size(), -1);
  for (int32_t i = 0; i < num_tensors(); ++i) {
    const Tensor& t = tensors_[i];
    if (t.kind == TensorKind::kIntermediate) continue;
    absl::StrAppend(&dot, "  t", i, " [shape=ellipse, label=\"", DotEscape(t.name), "\\n",
                    TensorKindName(t.kind), " ", TypeText(t), "\"];\n");
  }
  for (int32_t i = 0; i < num_nodes(); ++i) {
    const Node& n = nodes_[i];
    const std::string params = OpParamsToString(n.op);
    absl::StrAppend(&dot, "  n", i, " [shape=box, label=\"", OpName(n.op), "\\n",
                    DotEscape(n.name), params.empty() ? "" : "\\n", DotEscape(params),
                    "\"];\n");
    for (const TensorId in : n.inputs) {
      if (!Contains(in)) continue;
      const Tensor& t = tensors_[in.index];
      const std::string from = producer[in.index] >= 0 && t.kind == TensorKind::kIntermediate
                                   ? absl::StrCat("n", producer[in.index])
                                   : absl::StrCat("t", in.index);
      if (IsInPlace(n.op) && in == n.output) continue;  // drawn as the write edge below
      absl::StrAppend(&dot, "  ", from, " -> n", i, " [label=\"", TypeText(t), "\"];\n");
    }
    if (Contains(n.output)) {
      if (IsInPlace(n.op)) {
        absl::StrAppend(&dot, "  n", i, " -> t", n.output.index,
                        " [style=dashed, label=\"writes\"];\n");
      } else {
        producer[n.output.index] = i;
      }
    }
  }
  for (size_t k = 0; k < outputs_.size(); ++k) {
    const GraphOutput& o = outputs_[k];
    if (!Contains(o.tensor)) continue;
    const Tensor& t = tensors_[o.tensor.index];
    absl::StrAppend(&dot, "  out", k, " [shape=note, label=\"output ", DotEscape(o.name),
                    "\"];\n");
    const std::string from = producer[o.tensor.index] >= 0
                                 ? absl::StrCat("n", producer[o.tensor.index])
                                 : absl::StrCat("t", o.tensor.index);
    absl::StrAppend(&dot, "  ", from, " -> out", k, " [label=\"", TypeText(t), "\"];\n");
  }
  absl::StrAppend(&dot, "}\n");
  return dot;
}

std::string Graph::ToString() const {
  std::string s = absl::StrCat("graph: ", num_tensors(), " tensors, ", num_nodes(), " nodes\n");
  auto ref = [&](TensorId id) {
    if (!Contains(id)) return absl::StrCat("%?", id.index);
    return absl::StrCat("%", id.index, " ", tensors_[id.index].name);
  };
  for (int32_t i = 0; i < num_tensors(); ++i) {
    const Tensor& t = tensors_[i];
    if (t.kind == TensorKind::kIntermediate) continue;
    absl::StrAppend(&s, "  %", i, " ", t.name, ": ", TensorKindName(t.kind), " ", TypeText(t),
                    "\n");
  }
  for (int32_t i = 0; i < num_nodes(); ++i) {
    const Node& n = nodes_[i];
    const std::string params = OpParamsToString(n.op);
    absl::StrAppend(&s, "  #", i, " ", n.name, " = ", OpName(n.op), "(",
                    absl::StrJoin(n.inputs, ", ",
                                  [&](std::string* out, TensorId id) {
                                    absl::StrAppend(out, ref(id));
                                  }),
                    ")", params.empty() ? "" : " {", params, params.empty() ? "" : "}");
    if (Contains(n.output)) {
      absl::StrAppend(&s, " -> %", n.output.index, " ", TypeText(tensors_[n.output.index]));
    }
    absl::StrAppend(&s, "\n");
  }
  for (const GraphOutput& o : outputs_) {
    absl::StrAppend(&s, "  output ", o.name, " = ", ref(o.tensor), "\n");
  }
  return s;
}

namespace {
int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t sum = 0;
  return CheckedAdd(a, b, &sum) ? sum : std::numeric_limits<int64_t>::max();
}
}  // namespace

int64_t StepWeightBytes(const Graph& g) {
  // Per weight: read whole by some node, the rows Embedding nodes read, and the most experts
  // a MoeMatMul (or a MoeCombine with matmul, its last input) can choose (0: none reads it
  // that way).
  struct Use {
    bool whole = false;
    int64_t rows = 0;
    int64_t experts = 0;
  };
  std::vector<Use> use(g.tensors().size());
  for (const Node& node : g.nodes()) {
    const bool embedding = std::holds_alternative<ops::Embedding>(node.op);
    const auto* moe = std::get_if<ops::MoeMatMul>(&node.op);
    const auto* combine = std::get_if<ops::MoeCombine>(&node.op);
    const bool down = combine != nullptr && combine->matmul && node.inputs.size() >= 4 &&
                      g.Contains(node.inputs[2]);
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      if (!g.Contains(node.inputs[i])) continue;
      const Tensor& t = g.tensor(node.inputs[i]);
      if (t.kind != TensorKind::kWeight) continue;
      Use& u = use[node.inputs[i].index];
      if (embedding && i == 0 && node.inputs.size() == 2 && g.Contains(node.inputs[1])) {
        u.rows = SaturatingAdd(u.rows, g.tensor(node.inputs[1]).shape.NumElements());
      } else if (moe != nullptr && i >= 1 && i + 1 < node.inputs.size() &&
                 t.shape.rank() == 3 && g.Contains(node.inputs.back())) {
        // The stacked experts (w, or w_gate and w_up); ids [M, k] is the last input.
        u.experts = std::max(u.experts, g.tensor(node.inputs.back()).shape.NumElements());
      } else if (down && i + 1 == node.inputs.size() && t.shape.rank() == 3) {
        // The down experts; ids [M, k] is input 2.
        u.experts = std::max(u.experts, g.tensor(node.inputs[2]).shape.NumElements());
      } else {
        u.whole = true;
      }
    }
  }
  int64_t total = 0;
  for (size_t i = 0; i < use.size(); ++i) {
    const Tensor& t = g.tensors()[i];
    if (t.kind != TensorKind::kWeight) continue;
    const int64_t bytes = t.bytes();
    int64_t read = bytes;
    const Use& u = use[i];
    const int64_t first_dim = t.shape.rank() > 0 ? t.shape.dims()[0] : 0;
    if (!u.whole && first_dim > 0 && (u.rows > 0) != (u.experts > 0)) {
      // Rows of the table, or experts of the stack: equal slices of the first dimension.
      const int64_t slices = std::min(first_dim, u.rows > 0 ? u.rows : u.experts);
      read = bytes / first_dim * slices;
    }
    total = SaturatingAdd(total, read);
  }
  return total;
}

}  // namespace sg
