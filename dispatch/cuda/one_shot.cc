// OneShotBuffers (dispatch/cuda/one_shot.h).
#include "dispatch/cuda/one_shot.h"

#include <cstddef>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_handles.h"
#include "dispatch/cuda/cuda_status.h"
#include "kernels/collectives.cuh"
#include "stepgraph/base/status.h"

namespace sg {

struct OneShotBuffers::State {
  std::vector<DeviceMemory> buffers;  // one block per rank, on its GPU
  std::vector<kernels::OneShotPeers> peers;
};

OneShotBuffers::OneShotBuffers(std::unique_ptr<State> state) : state_(std::move(state)) {}
OneShotBuffers::~OneShotBuffers() = default;

const void* OneShotBuffers::peers(int rank) const {
  return &state_->peers[static_cast<size_t>(rank)];
}

absl::StatusOr<std::unique_ptr<OneShotBuffers>> OneShotBuffers::Create(int ranks) {
  if (ranks < 2 || ranks > kernels::kOneShotMaxRanks) return std::unique_ptr<OneShotBuffers>();
  for (int r = 0; r < ranks; ++r) {
    for (int q = 0; q < ranks; ++q) {
      int can = 0;
      if (q != r && (cudaDeviceCanAccessPeer(&can, r, q) != cudaSuccess || can == 0)) {
        return std::unique_ptr<OneShotBuffers>();
      }
    }
  }
  // Two slots of 256 KiB a rank: every message the dispatcher sends this way fits.
  constexpr int64_t kSlotBytes = int64_t{256} << 10;
  auto state = std::make_unique<State>();
  std::vector<std::byte*> base(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    SG_RETURN_IF_ERROR(ToStatus(cudaSetDevice(r), "cudaSetDevice"));
    for (int q = 0; q < ranks; ++q) {
      if (q == r) continue;
      const cudaError_t e = cudaDeviceEnablePeerAccess(q, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
      } else {
        SG_RETURN_IF_ERROR(
            ToStatus(e, absl::StrCat("cudaDeviceEnablePeerAccess(", r, " to ", q, ")")));
      }
    }
    const int64_t bytes =
        2 * kSlotBytes + kernels::kOneShotFlagBytes + kernels::kOneShotCountBytes;
    SG_ASSIGN_OR_RETURN(DeviceMemory m, AllocateDevice(bytes, "the one-shot all-reduce buffers"));
    SG_RETURN_IF_ERROR(ToStatus(cudaMemset(m.get(), 0, static_cast<size_t>(bytes)), "cudaMemset"));
    SG_RETURN_IF_ERROR(ToStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
    base[static_cast<size_t>(r)] = static_cast<std::byte*>(m.get());
    state->buffers.push_back(std::move(m));
  }
  for (int r = 0; r < ranks; ++r) {
    kernels::OneShotPeers p;
    for (int q = 0; q < ranks; ++q) {
      p.data[q] = base[static_cast<size_t>(q)];
      p.flags[q] = reinterpret_cast<uint32_t*>(base[static_cast<size_t>(q)] + 2 * kSlotBytes);
    }
    p.counts = reinterpret_cast<uint32_t*>(base[static_cast<size_t>(r)] + 2 * kSlotBytes +
                                           kernels::kOneShotFlagBytes);
    p.slot_bytes = kSlotBytes;
    p.rank = r;
    p.ranks = ranks;
    state->peers.push_back(p);
  }
  return std::unique_ptr<OneShotBuffers>(new OneShotBuffers(std::move(state)));
}

}  // namespace sg
