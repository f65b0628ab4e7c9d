// TensorParallelRunner (stepgraph/runtime/tensor_parallel.h): the ranks' runners, the
// group they meet through, and one persistent thread per rank beyond the first for the
// work each rank must do at the same time as the others.
#include "stepgraph/runtime/tensor_parallel.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/rank_threads.h"
#include "runtime/runner_device.h"
#include "stepgraph/base/status.h"
#include "stepgraph/dispatch/collectives.h"
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

}  // namespace sg
