// HostCollectives: a generation-counted barrier over the ranks' threads
// (stepgraph/dispatch/collectives.h).
#include "stepgraph/dispatch/collectives.h"

#include <algorithm>

namespace sg {

HostCollectives::HostCollectives(int ranks)
    : ranks_(std::max(ranks, 1)), offered_(static_cast<size_t>(std::max(ranks, 1)), nullptr) {}

void HostCollectives::Abort(const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.ok()) {
      aborted_ = status.ok() ? absl::AbortedError("the collective group was aborted") : status;
    }
  }
  met_.notify_all();
}

absl::Status HostCollectives::Meet() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!aborted_.ok()) return aborted_;
  const uint64_t generation = generation_;
  if (++arrived_ == ranks_) {
    arrived_ = 0;
    ++generation_;
    lock.unlock();
    met_.notify_all();
    return absl::OkStatus();
  }
  met_.wait(lock, [&] { return generation_ != generation || !aborted_.ok(); });
  return generation_ != generation ? absl::OkStatus() : aborted_;
}

absl::StatusOr<absl::Span<const void* const>> HostCollectives::Gather(int rank,
                                                                       const void* data) {
  if (rank < 0 || rank >= ranks_) {
    return absl::InvalidArgumentError("a collective's rank is outside its group");
  }
  offered_[static_cast<size_t>(rank)] = data;
  if (absl::Status s = Meet(); !s.ok()) return s;
  return absl::Span<const void* const>(offered_);
}

absl::Status HostCollectives::Release(int rank) {
  if (rank < 0 || rank >= ranks_) {
    return absl::InvalidArgumentError("a collective's rank is outside its group");
  }
  return Meet();
}

}  // namespace sg
