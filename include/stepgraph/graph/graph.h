// An immutable decode-step graph: tensors, and nodes in topological order, each node one
// op with its inputs and one output. Made by GraphBuilder (already valid) or by hand from
// parts (call Validate() before planning it).
#ifndef STEPGRAPH_GRAPH_GRAPH_H_
#define STEPGRAPH_GRAPH_GRAPH_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stepgraph/graph/ops.h"
#include "stepgraph/graph/types.h"

namespace sg {

struct Tensor {
  std::string name;
  TensorKind kind = TensorKind::kIntermediate;
  DType dtype = DType::kF32;
  Shape shape;

  int64_t bytes() const { return TensorBytes(dtype, shape); }
};

// One launch. `output` is a new Intermediate, except for the in-place ops (KvWrite, Copy,
// Advance, CountIds): their output is the State or Input they update, which is also their last
// input, so that a dispatcher sees it in both places and inference sees its type.
struct Node {
  std::string name;
  Op op;
  absl::InlinedVector<TensorId, 4> inputs;
  TensorId output;
};

struct GraphOutput {
  std::string name;
  TensorId tensor;
};

// A fresh tag for the TensorIds of a new builder or hand-made graph.
uint32_t NewGraphOwnerTag();

class Graph {
 public:
  // For graphs not made by the builder: every TensorId must carry `owner`. Nothing is
  // checked here; call Validate().
  Graph(uint32_t owner, std::vector<Tensor> tensors, std::vector<Node> nodes,
        std::vector<GraphOutput> outputs);

  Graph(Graph&&) = default;
  Graph& operator=(Graph&&) = default;
  Graph(const Graph&) = default;
  Graph& operator=(const Graph&) = default;

  // Checks everything the builder guarantees: ids belong to this graph, names are unique,
  // inputs are defined before use (reports a cycle as such), each intermediate is produced
  // exactly once and each State or Input written by at most one node, weights are never
  // written, and every node's output type is what shape inference gives.
  absl::Status Validate() const;

  uint32_t owner() const { return owner_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<GraphOutput>& outputs() const { return outputs_; }
  int num_tensors() const { return static_cast<int>(tensors_.size()); }
  int num_nodes() const { return static_cast<int>(nodes_.size()); }

  TensorId id(int32_t index) const { return TensorId{index, owner_}; }
  // The tensor of `id`; the id must be valid for this graph (see Contains).
  const Tensor& tensor(TensorId id) const { return tensors_[id.index]; }
  bool Contains(TensorId id) const {
    return id.owner == owner_ && id.index >= 0 && id.index < num_tensors();
  }

  // NotFound naming the tensor or output when there is none.
  absl::StatusOr<TensorId> FindTensor(absl::string_view name) const;
  absl::StatusOr<TensorId> FindOutput(absl::string_view name) const;

  // Graphviz text: one box per node (op, node name, params), one ellipse per bound
  // tensor, edges labelled with shape and dtype.
  std::string ToDot() const;
  // One line per tensor declaration and per node, e.g.
  //   %12 = MatMul(%3 x [1,2048] bf16, %4 q_proj.weight [2048,2048] bf16) -> [1,2048] bf16
  std::string ToString() const;

 private:
  uint32_t owner_;
  std::vector<Tensor> tensors_;
  std::vector<Node> nodes_;
  std::vector<GraphOutput> outputs_;
  absl::flat_hash_map<std::string, int32_t> tensor_by_name_;
};

// Bytes of weights one run of `g` reads at most, the floor of a decode step: every weight
// once, except a table read only by Embedding nodes (one row per id, at most every row) and
// stacked experts [E, N, K] read only by MoeMatMul (the experts its M·k routing pairs can
// choose: min(E, M·k) of E, the largest over its nodes). A weight any other node reads
// counts whole. Saturates at INT64_MAX.
int64_t StepWeightBytes(const Graph& g);

// Shape and dtype inference, shared by the builder and Validate: the type of `node`'s
// output given its inputs' tensors, or InvalidArgument naming the node and tensors.
// For in-place ops the result is the type of the written tensor (their last input), which
// must be a State or Input.
// The most inputs a node may have (a FusedMatMul with a norm, three weights and a
// residual has six); inference refuses more.
inline constexpr int kMaxNodeInputs = 8;

struct TensorType {
  DType dtype;
  Shape shape;
};
absl::StatusOr<TensorType> InferOutputType(const Op& op, absl::string_view node_name,
                                           absl::Span<const Tensor* const> inputs);

}  // namespace sg

#endif  // STEPGRAPH_GRAPH_GRAPH_H_
