// Tensor-parallel sharding (docs/parallel.md): the graph one rank of a group of `ranks`
// runs, made from the whole model's graph and a plan that says how each Weight and State
// is split. Every rank runs the same graph over its own part of the weights and the KV
// cache; where a rank's partial result must meet the others' the pass inserts a collective:
//
//   - a MatMul whose weight is split by rows (dim 0: output columns) over an input every
//     rank holds whole gives each rank its columns ("split" activations);
//   - ops that work per head or per element (Rope, HeadRmsNorm, KvWrite and Attention over
//     a cache split by heads, SiluMul, GeluTanhMul, Silu, Mul, Scale, Softcap) keep a
//     split activation split;
//   - a MatMul whose weight is split by columns (dim 1: the input's features) over a split
//     input gives each rank a partial sum: an AllReduce follows it, and its result is whole
//     again;
//   - any other reader of a split activation (a norm, the token choice, a graph output)
//     gets it whole through an AllGather.
//
// The pass runs on the plain graph, before the fusion passes (which then see AllReduce and
// AllGather as ordinary nodes). It is generic: it knows ops, not models. The model says
// which tensors split (LlamaShardPlan, stepgraph/models/llama.h) and refuses shapes whose
// heads do not divide by the ranks.
#ifndef STEPGRAPH_GRAPH_SHARD_H_
#define STEPGRAPH_GRAPH_SHARD_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "stepgraph/graph/graph.h"

namespace sg {

// How one Weight or State is held by the ranks.
struct ShardSpec {
  enum class Kind : uint8_t {
    // Every rank holds the whole tensor (any tensor the plan does not name).
    kReplicated,
    // Dimension `dim` in `ranks` equal contiguous parts; rank r holds part r. A block-format
    // weight splits its last dimension on block boundaries only.
    kSplit,
    // Rank 0 holds the tensor and every other rank zeros of its shape: a bias added before
    // an AllReduce, which must count once.
    kFirstRank,
  };
  Kind kind = Kind::kReplicated;
  int dim = 0;
};

struct ShardPlan {
  absl::flat_hash_map<std::string, ShardSpec> tensors;

  // The spec of `name` (kReplicated when the plan does not name it).
  ShardSpec Of(const std::string& name) const {
    auto it = tensors.find(name);
    return it == tensors.end() ? ShardSpec{} : it->second;
  }
};

// The graph of every rank of a group of `ranks` (the graphs of all ranks are the same; the
// rank shows only in the bytes bound to it, ShardTensorBytes). ranks = 1 returns the graph
// unchanged. InvalidArgument naming the tensor or node when a split does not divide, when
// an op cannot take a split input (an Embedding over a split table, a fused node: shard
// before fusing) or when a column-split matmul meets an input every rank holds whole.
absl::StatusOr<Graph> ShardGraph(const Graph& graph, const ShardPlan& plan, int ranks);

// Rank `rank`'s part of `tensor` (its whole shape and dtype; `whole` its bytes as stored)
// written to `part` (exactly the bytes of the rank's shape). InvalidArgument when a size
// does not match or the split does not divide.
absl::Status ShardTensorBytes(const Tensor& tensor, const ShardSpec& spec, int rank, int ranks,
                              absl::Span<const std::byte> whole, absl::Span<std::byte> part);

// The shape rank r holds of a tensor of `shape` (every rank holds the same shape).
absl::StatusOr<Shape> ShardShape(const Tensor& tensor, const ShardSpec& spec, int ranks);

}  // namespace sg

#endif  // STEPGRAPH_GRAPH_SHARD_H_
