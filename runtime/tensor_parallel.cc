// TensorParallelRunner (stepgraph/runtime/tensor_parallel.h): the ranks' runners, the
// group they meet through, and one persistent thread per rank beyond the first for the
// work each rank must do at the same time as the others.
#include "stepgraph/runtime/tensor_parallel.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/rank_threads.h"
#include "runtime/runner_device.h"
#include "stepgraph/base/status.h"
#include "stepgraph/dispatch/collectives.h"
#include "models/random_weights.h"
#include "stepgraph/graph/ops.h"

namespace sg {

absl::StatusOr<std::unique_ptr<TensorParallelRunner>> TensorParallelRunner::Create(
    const TensorParallelOptions& options) {
  const int ranks = options.ranks;
  if (ranks < 1 || ranks > ops::kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel: ranks must be in [1, ",
                                                   ops::kMaxRanks, "], got ", ranks));
  }
  auto tp = std::unique_ptr<TensorParallelRunner>(new TensorParallelRunner());
  if (ranks > 1) {
    if (options.runner.device == DeviceKind::kCuda) {
      SG_ASSIGN_OR_RETURN(tp->group_, MakeCudaCollectives(ranks));
    } else {
      tp->group_ = std::make_unique<HostCollectives>(ranks);
    }
  }
  for (int r = 0; r < ranks; ++r) {
    RunnerOptions ro = options.runner;
    ro.cuda_device = options.runner.device == DeviceKind::kCuda ? r : 0;
    ro.collectives = tp->group_.get();
    ro.rank = r;
    absl::StatusOr<std::unique_ptr<StepRunner>> runner = StepRunner::Create(ro);
    if (!runner.ok()) {
      return absl::Status(runner.status().code(),
                          absl::StrCat("rank ", r, ": ", runner.status().message()));
    }
    tp->runners_.push_back(*std::move(runner));
  }
  tp->workers_ = std::make_unique<RankThreads>(ranks, tp->group_.get());
  return tp;
}

TensorParallelRunner::~TensorParallelRunner() {
  // The threads end before the runners they drive; the runners before the group.
  workers_.reset();
  runners_.clear();
}

absl::Status TensorParallelRunner::ForEachRank(
    const std::function<absl::Status(int rank)>& fn) {
  return workers_->ForEach(fn);
}

absl::StatusOr<int> TensorParallelRunner::AddStep(const Graph& graph, const Binder& bind) {
  int index = -1;
  for (int r = 0; r < ranks(); ++r) {
    SG_ASSIGN_OR_RETURN(const int step, runners_[static_cast<size_t>(r)]->AddStep(
                                            graph, [&](const Graph& g, Bindings& b) {
                                              return bind(r, g, b);
                                            }));
    if (index >= 0 && step != index) {
      return absl::InternalError("tensor parallel: the ranks' step indices differ");
    }
    index = step;
  }
  return index;
}

absl::Status TensorParallelRunner::Finalize() {
  return ForEachRank([this](int r) { return runners_[static_cast<size_t>(r)]->Finalize(); });
}

absl::Status TensorParallelRunner::Run(int step) {
  if (ranks() > 1 && !replays()) {
    return ForEachRank(
        [this, step](int r) { return runners_[static_cast<size_t>(r)]->Run(step); });
  }
  // Replays only enqueue: the ranks' collectives meet on the GPUs.
  for (int r = 0; r < ranks(); ++r) {
    if (absl::Status s = runners_[static_cast<size_t>(r)]->Run(step); !s.ok()) {
      if (group_ != nullptr) group_->Abort(s);
      return absl::Status(s.code(), absl::StrCat("rank ", r, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status TensorParallelRunner::Sync() {
  for (int r = 0; r < ranks(); ++r) SG_RETURN_IF_ERROR(runners_[static_cast<size_t>(r)]->Sync());
  return absl::OkStatus();
}

absl::StatusOr<ShardedBuffers> ShardedBuffers::Upload(TensorParallelRunner& tp, const Graph& whole,
                                                      const Graph& sharded, const ShardPlan& plan,
                                                      const WeightSource& source, uint64_t seed) {
  ShardedBuffers out;
  auto convert = [](const BufferLayout& l) {
    Layout layout;
    for (const BufferLayout::Entry& e : l.entries) layout.entries[e.name] = {e.offset, e.bytes};
    layout.total_bytes = l.total_bytes;
    return layout;
  };
  const BufferLayout weights = LayoutBuffers(sharded, TensorKind::kWeight);
  const BufferLayout states = LayoutBuffers(sharded, TensorKind::kState);
  out.weights_ = convert(weights);
  out.states_ = convert(states);
  // Rank r's part of one weight is staged on the host, then copied (and repacked for the
  // rank's dispatcher) into its block.
  int64_t largest = 1;
  for (const BufferLayout::Entry& e : weights.entries) largest = std::max(largest, e.bytes);
  SG_ASSIGN_OR_RETURN(AlignedHostBuffer part, AlignedHostBuffer::Allocate(largest, "a weight's part"));
  for (int r = 0; r < tp.ranks(); ++r) {
    StepRunner& runner = tp.rank(r);
    SG_ASSIGN_OR_RETURN(void* w, runner.Allocate(std::max<int64_t>(weights.total_bytes, 1),
                                                 "a rank's weights"));
    SG_ASSIGN_OR_RETURN(void* kv, runner.AllocateZeroed(std::max<int64_t>(states.total_bytes, 1),
                                                        "a rank's KV cache"));
    auto* base = static_cast<std::byte*>(w);
    out.weight_base_.push_back(base);
    out.state_base_.push_back(static_cast<std::byte*>(kv));
    if (!source) {
      SG_ASSIGN_OR_RETURN(AlignedHostBuffer host,
                          AlignedHostBuffer::Allocate(std::max<int64_t>(weights.total_bytes, 1),
                                                      "a rank's random weights"));
      SG_RETURN_IF_ERROR(FillRandomWeights(sharded, weights, seed + static_cast<uint64_t>(r),
                                           host.span()));
      for (const BufferLayout::Entry& e : weights.entries) {
        SG_RETURN_IF_ERROR(runner.CopyWeight(base + e.offset, host.data() + e.offset,
                                             sharded.tensors()[e.tensor]));
      }
      SG_RETURN_IF_ERROR(runner.Sync());
      continue;
    }
    for (const BufferLayout::Entry& e : weights.entries) {
      SG_ASSIGN_OR_RETURN(const TensorId id, whole.FindTensor(e.name));
      const Tensor& whole_tensor = whole.tensor(id);
      SG_ASSIGN_OR_RETURN(absl::Span<const std::byte> bytes, source(e.name));
      absl::Span<std::byte> dst(part.data(), static_cast<size_t>(e.bytes));
      SG_RETURN_IF_ERROR(ShardTensorBytes(whole_tensor, plan.Of(e.name), r, tp.ranks(), bytes, dst));
      SG_RETURN_IF_ERROR(runner.CopyWeight(base + e.offset, part.data(), sharded.tensors()[e.tensor]));
      // The staging buffer is reused by the next weight.
      SG_RETURN_IF_ERROR(runner.Sync());
    }
  }
  return out;
}

absl::Status ShardedBuffers::BindKind(const Layout& layout, std::byte* base, const Graph& graph,
                                      TensorKind kind, Bindings& bindings) {
  for (const Tensor& t : graph.tensors()) {
    if (t.kind != kind) continue;
    auto it = layout.entries.find(t.name);
    const Layout::Entry* found = it == layout.entries.end() ? nullptr : &it->second;
    if (found == nullptr || found->bytes != t.bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor parallel: '", t.name, "' is not among the model's uploaded tensors of its size"));
    }
    SG_RETURN_IF_ERROR(bindings.Bind(t.name, base + found->offset, found->bytes));
  }
  return absl::OkStatus();
}

absl::Status ShardedBuffers::Bind(int rank, const Graph& graph, Bindings& bindings) const {
  if (rank < 0 || rank >= static_cast<int>(weight_base_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel: no rank ", rank));
  }
  const size_t r = static_cast<size_t>(rank);
  SG_RETURN_IF_ERROR(BindKind(weights_, weight_base_[r], graph, TensorKind::kWeight, bindings));
  return BindKind(states_, state_base_[r], graph, TensorKind::kState, bindings);
}

}  // namespace sg
