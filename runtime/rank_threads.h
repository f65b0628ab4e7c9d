// Threads for the ranks of a tensor-parallel group beyond the first, each waiting for the
// next job, running it for its rank and reporting its status; rank 0's part runs on the
// caller's thread. Work a rank must do at the same time as the others (a step with
// collectives that is not a replay, a capture, a session's call) goes through ForEach.
// Internal to runtime/.
#ifndef STEPGRAPH_RUNTIME_RANK_THREADS_H_
#define STEPGRAPH_RUNTIME_RANK_THREADS_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace sg {

class CollectiveGroup;

class RankThreads {
 public:
  // `group` (not owned; may be null) is aborted when a rank fails, so that no other rank
  // waits for it forever.
  RankThreads(int ranks, CollectiveGroup* group);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int ranks() const { return static_cast<int>(status_.size()); }
  // fn(r) for every rank r at once; the first failure, its rank named (rank 0's as it is).
  absl::Status ForEach(const std::function<absl::Status(int rank)>& fn);

 private:
  void Loop(int rank);

  CollectiveGroup* group_;
  std::mutex mu_;
  std::condition_variable start_, done_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  const std::function<absl::Status(int)>* job_ = nullptr;
  std::vector<absl::Status> status_;
  std::vector<std::thread> threads_;
};

}  // namespace sg

#endif  // STEPGRAPH_RUNTIME_RANK_THREADS_H_
