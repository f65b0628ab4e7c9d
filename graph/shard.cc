// Tensor-parallel sharding (stepgraph/graph/shard.h): one walk over the nodes in order,
// keeping for every activation whether each rank holds it whole or only its own columns,
// re-inferring every node's output over the ranks' shapes and inserting the collectives
// where partial results meet. Tensor indices are kept; inserted tensors are appended.
#include "stepgraph/graph/shard.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace {

// How the ranks hold an activation: whole; its own columns ([M, N / ranks], rank r's
// slice of N); or, for the routed experts' outputs, its own columns of each chosen
// expert's slot ([M, k · N / ranks], the slot-major layout MoeMatMul writes: no AllGather
// makes the whole of it, so only column-local ops and the down MoeMatMul may read it); or a
// partial sum of the whole (the down MoeMatMul over its rank's share of K), which only
// MoeCombine may read, before the AllReduce that its output takes.
enum class Dist : uint8_t { kWhole, kSplit, kSlotSplit, kPartial };

// Ops that compute each column (or each head) from the same columns of their inputs, so a
// rank holding some columns of every input computes those columns of the output.
bool ColumnLocal(const Op& op) {
  return std::holds_alternative<ops::Rope>(op) || std::holds_alternative<ops::HeadRmsNorm>(op) ||
         std::holds_alternative<ops::SiluMul>(op) || std::holds_alternative<ops::GeluTanhMul>(op) ||
         std::holds_alternative<ops::Silu>(op) || std::holds_alternative<ops::Mul>(op) ||
         std::holds_alternative<ops::Add>(op) || std::holds_alternative<ops::Scale>(op) ||
         std::holds_alternative<ops::Softcap>(op);
}

class Sharder {
 public:
  Sharder(const Graph& g, const ShardPlan& plan, int ranks)
      : g_(g), plan_(plan), ranks_(ranks), owner_(NewGraphOwnerTag()), tensors_(g.tensors()),
        dist_(tensors_.size(), Dist::kWhole), gathered_(tensors_.size(), -1) {
    for (const Tensor& t : tensors_) names_.insert(t.name);
    for (const Node& n : g.nodes()) names_.insert(n.name);
  }

  absl::StatusOr<Graph> Run() && {
    SG_RETURN_IF_ERROR(ShardBound());
    for (const Node& node : g_.nodes()) SG_RETURN_IF_ERROR(Visit(node));
    std::vector<GraphOutput> outputs;
    for (const GraphOutput& o : g_.outputs()) {
      int32_t t = o.tensor.index;
      if (dist_[t] != Dist::kWhole) {
        SG_ASSIGN_OR_RETURN(t, Gather(t));
      }
      outputs.push_back(GraphOutput{o.name, Id(t)});
    }
    Graph out(owner_, std::move(tensors_), std::move(nodes_), std::move(outputs));
    SG_RETURN_IF_ERROR(out.Validate());
    return out;
  }

 private:
  TensorId Id(int32_t index) const { return TensorId{index, owner_}; }
  ShardSpec Spec(int32_t t) const {
    const Tensor& tensor = tensors_[t];
    if (tensor.kind != TensorKind::kWeight && tensor.kind != TensorKind::kState) return {};
    return plan_.Of(tensor.name);
  }
  bool SplitOn(int32_t t, int dim) const {
    const ShardSpec s = Spec(t);
    return s.kind == ShardSpec::Kind::kSplit && s.dim == dim;
  }
  absl::Status NodeError(const Node& node, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel over ", ranks_, " ranks: ",
                                                   OpName(node.op), " node '", node.name,
                                                   "': ", what));
  }

  // Weights and States the plan splits take the ranks' shape.
  absl::Status ShardBound() {
    for (Tensor& t : tensors_) {
      if (t.kind != TensorKind::kWeight && t.kind != TensorKind::kState) continue;
      const ShardSpec spec = plan_.Of(t.name);
      SG_ASSIGN_OR_RETURN(t.shape, ShardShape(t, spec, ranks_));
    }
    return absl::OkStatus();
  }

  std::string Unique(const std::string& base) {
    std::string name = base;
    for (int i = 1; names_.contains(name); ++i) name = absl::StrCat(base, "_", i);
    names_.insert(name);
    return name;
  }

  int32_t NewTensor(const std::string& name, DType dtype, Shape shape) {
    tensors_.push_back(Tensor{Unique(name), TensorKind::kIntermediate, dtype, shape});
    dist_.push_back(Dist::kWhole);
    gathered_.push_back(-1);
    return static_cast<int32_t>(tensors_.size() - 1);
  }

  // The whole of split activation `t`, gathered once (right after the first need).
  absl::StatusOr<int32_t> Gather(int32_t t) {
    if (gathered_[t] >= 0) return gathered_[t];
    const Tensor& in = tensors_[t];
    if (dist_[t] == Dist::kSlotSplit || dist_[t] == Dist::kPartial) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor parallel: '", in.name, "' holds each rank's ",
          dist_[t] == Dist::kSlotSplit ? "columns of the chosen experts"
                                       : "partial sums of the experts' down projection",
          " and is read by an op that needs it whole; only column-local ops, the down "
          "MoeMatMul and MoeCombine read it"));
    }
    if (in.shape.rank() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor parallel: '", in.name, "' ", in.shape.ToString(),
          " is split over the ranks but read whole, and only [M, N] activations gather"));
    }
    const Shape whole{in.shape[0], in.shape[1] * ranks_};
    const int32_t out = NewTensor(in.name + ".gathered", in.dtype, whole);
    nodes_.push_back(Node{tensors_[out].name, ops::AllGather{ranks_}, {Id(t)}, Id(out)});
    gathered_[t] = out;
    return out;
  }

  absl::Status Visit(const Node& node) {
    absl::InlinedVector<int32_t, 4> in;
    for (TensorId id : node.inputs) in.push_back(id.index);
    Dist out_dist = Dist::kWhole;
    bool reduce = false;  // each rank's output is a partial sum: an AllReduce follows
    auto whole = [&](size_t i) -> absl::Status {
      if (dist_[in[i]] != Dist::kWhole) {
        SG_ASSIGN_OR_RETURN(in[i], Gather(in[i]));
      }
      return absl::OkStatus();
    };
    auto no_split_bound = [&](size_t from) -> absl::Status {
      for (size_t i = from; i < in.size(); ++i) {
        if (Spec(in[i]).kind != ShardSpec::Kind::kReplicated) {
          return NodeError(node, absl::StrCat("reads '", tensors_[in[i]].name,
                                              "', which the plan splits, where it must be whole"));
        }
      }
      return absl::OkStatus();
    };

    if (std::holds_alternative<ops::MatMul>(node.op)) {
      const int32_t w = in[1];
      const bool has_bias = in.size() > 2;
      const ShardSpec bias = has_bias ? Spec(in[2]) : ShardSpec{};
      if (SplitOn(w, 0)) {  // output columns: x whole
        SG_RETURN_IF_ERROR(whole(0));
        if (has_bias && !SplitOn(in[2], 0)) {
          return NodeError(node, "the weight is split by rows, so its bias must be too");
        }
        out_dist = Dist::kSplit;
      } else if (SplitOn(w, 1)) {  // the input's features: x split, partial sums out
        if (dist_[in[0]] != Dist::kSplit) {
          return NodeError(node, absl::StrCat("the weight '", tensors_[w].name,
                                              "' is split by columns, but its input '",
                                              tensors_[in[0]].name, "' is whole on every rank"));
        }
        if (has_bias && bias.kind != ShardSpec::Kind::kFirstRank) {
          return NodeError(node, "the weight is split by columns, so its bias must be held by "
                                 "the first rank only (it is added before the AllReduce)");
        }
        reduce = true;
      } else {
        if (Spec(w).kind != ShardSpec::Kind::kReplicated ||
            (has_bias && bias.kind != ShardSpec::Kind::kReplicated)) {
          return NodeError(node, "a weight held whole needs a bias held whole");
        }
        SG_RETURN_IF_ERROR(whole(0));
      }
    } else if (const auto* moe = std::get_if<ops::MoeMatMul>(&node.op)) {
      // x, w [E, N, K], ids: the experts split like a MatMul's weight, each expert alike.
      if (moe->silu_mul) return NodeError(node, "fused nodes are not sharded: shard before fusing");
      const int32_t w = in[1];
      SG_RETURN_IF_ERROR(whole(2));
      if (SplitOn(w, 1)) {  // each expert's output columns: x whole
        SG_RETURN_IF_ERROR(whole(0));
        out_dist = Dist::kSlotSplit;
      } else if (SplitOn(w, 2)) {  // each expert's input features: partial sums out
        if (dist_[in[0]] != Dist::kSlotSplit) {
          return NodeError(node, absl::StrCat("the experts '", tensors_[w].name,
                                              "' are split by columns, but their input '",
                                              tensors_[in[0]].name,
                                              "' is not the chosen experts' split columns"));
        }
        out_dist = Dist::kPartial;
      } else {
        SG_RETURN_IF_ERROR(no_split_bound(1));
        SG_RETURN_IF_ERROR(whole(0));
      }
    } else if (const auto* combine = std::get_if<ops::MoeCombine>(&node.op)) {
      // y, weights (or the router's logits), ids: linear in y, so partial sums of y give
      // partial sums of the output, which an AllReduce then adds.
      if (combine->residual || combine->matmul) {
        return NodeError(node, "fused nodes are not sharded: shard before fusing");
      }
      for (size_t i = 1; i < in.size(); ++i) SG_RETURN_IF_ERROR(whole(i));
      if (dist_[in[0]] == Dist::kPartial) {
        reduce = true;
      } else {
        SG_RETURN_IF_ERROR(whole(0));
      }
    } else if (std::holds_alternative<ops::KvWrite>(node.op)) {
      // kv, pos, (slots,) cache: the cache split by heads takes the rank's heads.
      const int32_t cache = in.back();
      if (SplitOn(cache, 1)) {
        if (dist_[in[0]] != Dist::kSplit) {
          return NodeError(node, "the cache is split by heads, but the keys or values are whole");
        }
      } else {
        SG_RETURN_IF_ERROR(no_split_bound(in.size() - 1));
        SG_RETURN_IF_ERROR(whole(0));
      }
    } else if (std::holds_alternative<ops::Attention>(node.op)) {
      // q, k_cache, v_cache, pos (, slots).
      const bool split_cache = SplitOn(in[1], 1) && SplitOn(in[2], 1);
      if (split_cache) {
        if (dist_[in[0]] != Dist::kSplit) {
          return NodeError(node, "the caches are split by heads, but q is whole");
        }
        out_dist = Dist::kSplit;
      } else {
        SG_RETURN_IF_ERROR(no_split_bound(1));
        SG_RETURN_IF_ERROR(whole(0));
      }
    } else if (ColumnLocal(node.op)) {
      // Split when every activation input is split the same way (its own columns, or its
      // own columns of each chosen expert); otherwise all whole. Weights (a head norm's)
      // must be whole.
      std::optional<Dist> common;
      bool same = true;
      for (size_t i = 0; i < in.size(); ++i) {
        const Tensor& t = tensors_[in[i]];
        if (t.kind == TensorKind::kWeight || t.kind == TensorKind::kState ||
            t.dtype == DType::kI32) {
          continue;
        }
        if (!common.has_value()) common = dist_[in[i]];
        same = same && dist_[in[i]] == *common;
      }
      SG_RETURN_IF_ERROR(no_split_bound(0));
      if (same && common.has_value() &&
          (*common == Dist::kSplit || *common == Dist::kSlotSplit)) {
        out_dist = *common;
      } else {
        for (size_t i = 0; i < in.size(); ++i) SG_RETURN_IF_ERROR(whole(i));
      }
    } else {
      const bool fused = std::holds_alternative<ops::FusedMatMul>(node.op) ||
                         std::holds_alternative<ops::RopeKvWrite>(node.op) ||
                         std::holds_alternative<ops::FusedElementwise>(node.op);
      if (fused) return NodeError(node, "fused nodes are not sharded: shard before fusing");
      SG_RETURN_IF_ERROR(no_split_bound(0));
      for (size_t i = 0; i < in.size(); ++i) SG_RETURN_IF_ERROR(whole(i));
    }

    // The node over the ranks' shapes.
    absl::InlinedVector<const Tensor*, kMaxNodeInputs> types;
    for (int32_t t : in) types.push_back(&tensors_[t]);
    SG_ASSIGN_OR_RETURN(const TensorType type, InferOutputType(node.op, node.name, types));
    const int32_t out = node.output.index;
    Node copy = node;
    copy.inputs.clear();
    for (int32_t t : in) copy.inputs.push_back(Id(t));
    if (tensors_[out].kind != TensorKind::kIntermediate) {
      // In place: the written State or Input keeps the type its (sharded) binding has.
      copy.output = Id(out);
      nodes_.push_back(std::move(copy));
      return absl::OkStatus();
    }
    if (!reduce) {
      tensors_[out].dtype = type.dtype;
      tensors_[out].shape = type.shape;
      dist_[out] = out_dist;
      copy.output = Id(out);
      nodes_.push_back(std::move(copy));
      return absl::OkStatus();
    }
    // The partial sums go to a new tensor; the AllReduce writes the node's own output,
    // so that every reader sees the whole sum under the name it had.
    const int32_t partial = NewTensor(tensors_[out].name + ".partial", type.dtype, type.shape);
    copy.output = Id(partial);
    nodes_.push_back(std::move(copy));
    tensors_[out].dtype = type.dtype;
    tensors_[out].shape = type.shape;
    dist_[out] = Dist::kWhole;
    nodes_.push_back(Node{Unique(node.name + ".all_reduce"), ops::AllReduce{ranks_},
                          {Id(partial)}, Id(out)});
    return absl::OkStatus();
  }

  const Graph& g_;
  const ShardPlan& plan_;
  const int32_t ranks_;
  const uint32_t owner_;
  std::vector<Tensor> tensors_;
  std::vector<Dist> dist_;
  std::vector<int32_t> gathered_;
  std::vector<Node> nodes_;
  absl::flat_hash_set<std::string> names_;
};

}  // namespace

absl::StatusOr<Shape> ShardShape(const Tensor& tensor, const ShardSpec& spec, int ranks) {
  if (spec.kind != ShardSpec::Kind::kSplit || ranks == 1) return tensor.shape;
  const Shape& s = tensor.shape;
  if (spec.dim < 0 || spec.dim >= s.rank()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel: '", tensor.name, "' ",
                                                   s.ToString(), " has no dimension ", spec.dim,
                                                   " to split"));
  }
  if (s[spec.dim] % ranks != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallel: dimension ", spec.dim, " of '", tensor.name, "' ", s.ToString(),
        " does not divide by ", ranks, " ranks"));
  }
  std::vector<int64_t> dims(s.dims().begin(), s.dims().end());
  dims[static_cast<size_t>(spec.dim)] /= ranks;
  Shape part{absl::Span<const int64_t>(dims)};
  if (TensorBytes(tensor.dtype, part) < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallel: '", tensor.name, "' ", s.ToString(), " in ", DTypeName(tensor.dtype),
        " splits into ", part.ToString(), ", which is not a whole number of its blocks"));
  }
  return part;
}

absl::StatusOr<Graph> ShardGraph(const Graph& graph, const ShardPlan& plan, int ranks) {
  if (ranks < 1 || ranks > ops::kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel: ranks must be in [1, ",
                                                   ops::kMaxRanks, "], got ", ranks));
  }
  if (ranks == 1) return graph;
  return Sharder(graph, plan, ranks).Run();
}

absl::Status ShardTensorBytes(const Tensor& tensor, const ShardSpec& spec, int rank, int ranks,
                              absl::Span<const std::byte> whole, absl::Span<std::byte> part) {
  if (rank < 0 || rank >= ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallel: rank ", rank, " is outside a group of ", ranks));
  }
  SG_ASSIGN_OR_RETURN(const Shape shape, ShardShape(tensor, spec, ranks));
  const int64_t whole_bytes = tensor.bytes();
  const int64_t part_bytes = TensorBytes(tensor.dtype, shape);
  if (static_cast<int64_t>(whole.size()) != whole_bytes ||
      static_cast<int64_t>(part.size()) != part_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallel: '", tensor.name, "' holds ", whole.size(), " bytes for ",
        whole_bytes, " and its part ", part.size(), " for ", part_bytes));
  }
  if (spec.kind == ShardSpec::Kind::kFirstRank) {
    if (rank == 0) {
      std::memcpy(part.data(), whole.data(), whole.size());
    } else {
      std::memset(part.data(), 0, part.size());
    }
    return absl::OkStatus();
  }
  if (spec.kind == ShardSpec::Kind::kReplicated || ranks == 1) {
    std::memcpy(part.data(), whole.data(), whole.size());
    return absl::OkStatus();
  }
  // Every index of the dimensions before `dim` holds a contiguous run of the rest, of
  // which each rank takes its equal slice.
  int64_t outer = 1;
  for (int i = 0; i < spec.dim; ++i) outer *= tensor.shape[i];
  const int64_t run = whole_bytes / outer, slice = part_bytes / outer;
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(part.data() + o * slice, whole.data() + o * run + rank * slice,
                static_cast<size_t>(slice));
  }
  return absl::OkStatus();
}

}  // namespace sg
