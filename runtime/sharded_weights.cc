// UploadWeights and ShardedBuffers (runtime/sharded_weights.h).
#include "runtime/sharded_weights.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "stepgraph/base/status.h"

namespace sg {

absl::Status UploadWeights(StepRunner& runner, const WeightUpload& u, std::byte* base) {
  const Graph& graph = *u.graph;
  const BufferLayout& layout = *u.layout;
  if (!u.source) {
    // Drawn on the host, exactly as the CPU reference draws them, then copied at once.
    SG_ASSIGN_OR_RETURN(AlignedHostBuffer host, AlignedHostBuffer::Allocate(
                                                    std::max<int64_t>(layout.total_bytes, 1),
                                                    "random weights"));
    SG_RETURN_IF_ERROR(FillRandomWeights(graph, layout, u.seed + static_cast<uint64_t>(u.rank),
                                         host.span(), u.threads));
    for (const BufferLayout::Entry& e : layout.entries) {
      SG_RETURN_IF_ERROR(
          runner.CopyWeight(base + e.offset, host.data() + e.offset, graph.tensors()[e.tensor]));
    }
    return runner.Sync();
  }
  if (u.ranks == 1) {
    // The files' bytes as they are.
    for (const BufferLayout::Entry& e : layout.entries) {
      SG_ASSIGN_OR_RETURN(absl::Span<const std::byte> data, u.source(e.name));
      if (static_cast<int64_t>(data.size()) != e.bytes) {
        return absl::InvalidArgumentError(absl::StrCat("weight '", e.name, "' holds ",
                                                       data.size(), " bytes, the graph needs ",
                                                       e.bytes));
      }
      SG_RETURN_IF_ERROR(runner.CopyWeight(base + e.offset, data.data(), graph.tensors()[e.tensor]));
    }
    // The source may be dropped only after the copies read it.
    return runner.Sync();
  }
  // This rank's part of each weight, cut on the host from the whole's bytes.
  int64_t most = 1;
  for (const BufferLayout::Entry& e : layout.entries) most = std::max(most, e.bytes);
  SG_ASSIGN_OR_RETURN(AlignedHostBuffer part, AlignedHostBuffer::Allocate(most, "a weight's part"));
  for (const BufferLayout::Entry& e : layout.entries) {
    SG_ASSIGN_OR_RETURN(const TensorId id, u.whole->FindTensor(e.name));
    SG_ASSIGN_OR_RETURN(absl::Span<const std::byte> data, u.source(e.name));
    absl::Span<std::byte> dst(part.data(), static_cast<size_t>(e.bytes));
    SG_RETURN_IF_ERROR(
        ShardTensorBytes(u.whole->tensor(id), u.plan->Of(e.name), u.rank, u.ranks, data, dst));
    SG_RETURN_IF_ERROR(runner.CopyWeight(base + e.offset, part.data(), graph.tensors()[e.tensor]));
    SG_RETURN_IF_ERROR(runner.Sync());  // the part's buffer is the next weight's
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardedBuffers> ShardedBuffers::Upload(TensorParallelRunner& tp, const Graph& whole,
                                                      const Graph& sharded, const ShardPlan& plan,
                                                      const WeightSource& source, uint64_t seed) {
  ShardedBuffers out;
  out.weights_ = LayoutBuffers(sharded, TensorKind::kWeight);
  out.states_ = LayoutBuffers(sharded, TensorKind::kState);
  for (int r = 0; r < tp.ranks(); ++r) {
    StepRunner& runner = tp.rank(r);
    SG_ASSIGN_OR_RETURN(void* w, runner.Allocate(std::max<int64_t>(out.weights_.total_bytes, 1),
                                                 "a rank's weights"));
    SG_ASSIGN_OR_RETURN(void* kv,
                        runner.AllocateZeroed(std::max<int64_t>(out.states_.total_bytes, 1),
                                              "a rank's KV cache"));
    out.weight_base_.push_back(static_cast<std::byte*>(w));
    out.state_base_.push_back(static_cast<std::byte*>(kv));
    const WeightUpload upload{.graph = &sharded, .layout = &out.weights_, .source = source,
                              .whole = &whole, .plan = &plan, .rank = r, .ranks = tp.ranks(),
                              .seed = seed};
    SG_RETURN_IF_ERROR(UploadWeights(runner, upload, out.weight_base_.back()));
  }
  return out;
}

absl::Status ShardedBuffers::Bind(int rank, const Graph& graph, Bindings& bindings) const {
  if (rank < 0 || rank >= static_cast<int>(weight_base_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel: no rank ", rank));
  }
  const size_t r = static_cast<size_t>(rank);
  SG_RETURN_IF_ERROR(BindLayout(graph, TensorKind::kWeight, weights_, weight_base_[r], bindings));
  return BindLayout(graph, TensorKind::kState, states_, state_base_[r], bindings);
}

}  // namespace sg
