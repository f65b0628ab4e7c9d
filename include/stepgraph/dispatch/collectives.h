// The group of ranks a sharded step runs on (tensor parallel; docs/parallel.md), as the
// dispatchers of its ranks see it. Every rank runs its own graph with its own dispatcher;
// a collective node (ops::AllReduce, ops::AllGather) meets the same node of every other
// rank through the group. On CUDA the group is a set of NCCL communicators
// (runtime/cuda_runner_device.cc); on the CPU it is HostCollectives: ranks are threads of
// one process meeting at a barrier.
#ifndef STEPGRAPH_DISPATCH_COLLECTIVES_H_
#define STEPGRAPH_DISPATCH_COLLECTIVES_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace sg {

class CollectiveGroup {
 public:
  virtual ~CollectiveGroup() = default;
  virtual int ranks() const = 0;
  // Ends every rank's wait in a collective with `status` (a rank failed mid-step and will
  // never arrive); every later collective fails at once with it. The group is spent.
  virtual void Abort(const absl::Status& status) = 0;
};

// Ranks that are threads of one process, each with its own CPU dispatcher. A collective is
// two meetings: at the first, every rank offers its input and gets every rank's; each
// computes its own output from them; at the second, every rank has finished reading, so
// each may go on to overwrite its input.
class HostCollectives final : public CollectiveGroup {
 public:
  // ranks in [1, ops::kMaxRanks].
  explicit HostCollectives(int ranks);

  int ranks() const override { return ranks_; }
  void Abort(const absl::Status& status) override;

  // Rank `rank` offers `data` (unchanged until Release) and waits for every rank's offer.
  // The span holds one pointer per rank, in rank order, until Release.
  absl::StatusOr<absl::Span<const void* const>> Gather(int rank, const void* data);
  // Waits until every rank has released (has finished reading the others' data).
  absl::Status Release(int rank);

 private:
  absl::Status Meet();

  const int ranks_;
  std::mutex mu_;
  std::condition_variable met_;
  // Guarded by mu_.
  int arrived_ = 0;
  uint64_t generation_ = 0;
  absl::Status aborted_;
  // Written by each rank in its own slot before the first meeting, read by all after it.
  std::vector<const void*> offered_;
};

}  // namespace sg

#endif  // STEPGRAPH_DISPATCH_COLLECTIVES_H_
