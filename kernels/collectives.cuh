// The one-shot all-reduce of a tensor-parallel group in one process (docs/parallel.md):
// every rank copies its x into its own exchange buffer, tells every rank so through their
// flag words (NVLink stores, release order), waits for every rank's word, then reads every
// rank's buffer (NVLink loads) and adds them in f32 in rank order, rounding once. One
// launch, no host work: it can be captured. Small messages only: each block of a rank meets
// the same block of the others, so the latency is one flag exchange and one remote read.
#ifndef STEPGRAPH_KERNELS_COLLECTIVES_CUH_
#define STEPGRAPH_KERNELS_COLLECTIVES_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/launch.h"
#include "stepgraph/base/dtype.h"

namespace sg::kernels {

inline constexpr int kOneShotMaxRanks = 8;
// Blocks of one all-reduce, each with its own flags and count.
inline constexpr int kOneShotMaxBlocks = 16;

// What the kernel of one rank reads and writes; every pointer is device memory that the
// rank's GPU can reach (its own, or a peer's with peer access enabled).
struct OneShotPeers {
  // Every rank's exchange buffer: two slots of slot_bytes (one all-reduce writes the slot
  // its count's parity names, so that a rank may write the next while a slower one still
  // reads the last).
  void* data[kOneShotMaxRanks] = {};
  // Every rank's flag words: [kOneShotMaxBlocks][kOneShotMaxRanks] uint32, zeroed at start.
  uint32_t* flags[kOneShotMaxRanks] = {};
  // This rank's all-reduces so far, one count per block, zeroed at start.
  uint32_t* counts = nullptr;
  int64_t slot_bytes = 0;
  int32_t rank = 0;
  int32_t ranks = 0;
};

// Bytes of one rank's flag words and counts.
inline constexpr int64_t kOneShotFlagBytes = int64_t{4} * kOneShotMaxBlocks * kOneShotMaxRanks;
inline constexpr int64_t kOneShotCountBytes = int64_t{4} * kOneShotMaxBlocks;

// Whether the kernel takes n elements of dtype at x, residual (or null) and out: 16-byte
// aligned, a whole number of 16-byte vectors, within a slot.
bool OneShotFits(const void* x, const void* residual, const void* out, int64_t n, DType dtype,
                 const OneShotPeers& p);

// out = the sum over the ranks of their x (n elements), rounded, plus this rank's residual
// (n elements, or null for none) rounded again: ops::AllReduce. Every rank must launch it,
// in the same order as its other one-shot all-reduces.
cudaError_t LaunchOneShotAllReduce(const void* x, const void* residual, void* out, int64_t n,
                                   DType dtype, const OneShotPeers& peers, Stream stream);

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_COLLECTIVES_CUH_
