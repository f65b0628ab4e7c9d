// RankThreads (runtime/rank_threads.h): a generation count the threads wait on, and a
// count of the ranks still running the current job.
#include "runtime/rank_threads.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "stepgraph/dispatch/collectives.h"

namespace sg {

RankThreads::RankThreads(int ranks, CollectiveGroup* group)
    : group_(group), status_(static_cast<size_t>(ranks < 1 ? 1 : ranks)) {
  for (int r = 1; r < this->ranks(); ++r) threads_.emplace_back([this, r] { Loop(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void RankThreads::Loop(int rank) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<absl::Status(int)>* fn = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = job_;
    }
    absl::Status s = (*fn)(rank);
    if (!s.ok() && group_ != nullptr) group_->Abort(s);
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_[static_cast<size_t>(rank)] = std::move(s);
      --pending_;
    }
    done_.notify_all();
  }
}

absl::Status RankThreads::ForEach(const std::function<absl::Status(int rank)>& fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    pending_ = ranks() - 1;
    ++generation_;
  }
  start_.notify_all();
  absl::Status first = fn(0);
  if (!first.ok() && group_ != nullptr) group_->Abort(first);
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return pending_ == 0; });
  for (int r = 1; r < ranks() && first.ok(); ++r) {
    const absl::Status& s = status_[static_cast<size_t>(r)];
    if (!s.ok()) first = absl::Status(s.code(), absl::StrCat("rank ", r, ": ", s.message()));
  }
  return first;
}

}  // namespace sg
