// The buffers of the one-shot all-reduce (kernels/collectives.cuh) for a group of GPUs of
// one process: every rank's exchange buffer, flag words and counts, with peer access
// enabled between every pair of the group's GPUs. The group (runtime/) owns them and hands
// each rank's dispatcher its view (CudaDispatch::Options::one_shot_peers).
#ifndef STEPGRAPH_DISPATCH_CUDA_ONE_SHOT_H_
#define STEPGRAPH_DISPATCH_CUDA_ONE_SHOT_H_

#include <memory>

#include "absl/status/statusor.h"

namespace sg {

class OneShotBuffers {
 public:
  // GPUs 0 .. ranks-1. Null (not an error) where a pair cannot reach each other or the
  // group is larger than the kernel takes: NCCL then carries every all-reduce.
  static absl::StatusOr<std::unique_ptr<OneShotBuffers>> Create(int ranks);
  ~OneShotBuffers();
  OneShotBuffers(const OneShotBuffers&) = delete;
  OneShotBuffers& operator=(const OneShotBuffers&) = delete;

  // Rank `rank`'s view (a kernels::OneShotPeers), valid while this lives.
  const void* peers(int rank) const;

 private:
  struct State;
  explicit OneShotBuffers(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace sg

#endif  // STEPGRAPH_DISPATCH_CUDA_ONE_SHOT_H_
