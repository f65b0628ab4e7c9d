// The RoPE frequency tables of CudaDispatch, shared by the units that rotate (rope.cc,
// which holds the Rope and KvWrite unit, and fused.cc): RopeInvFreq's f32 values, computed
// on the host like the CPU reference's and uploaded once per distinct set of Rope
// parameters in Prepare, so both dispatchers rotate by bit-identical angles' inputs and Run
// only reads the table its state points at.
#ifndef STEPGRAPH_DISPATCH_CUDA_ROPE_H_
#define STEPGRAPH_DISPATCH_CUDA_ROPE_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "dispatch/cuda/cuda_handles.h"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/graph/ops.h"

namespace sg::internal {

class RopeTables {
 public:
  static absl::StatusOr<std::unique_ptr<RopeTables>> Create(const CudaDeviceInfo& info);

  // The device table of head_dim / 2 frequencies for `op`'s parameters, uploaded on first
  // use and shared by every node with the same parameters; valid while the tables live.
  absl::StatusOr<const float*> Table(const ops::Rope& op);

 private:
  // The parameters the frequencies depend on (not `interleaved`); floats by their bits.
  struct Key {
    int32_t head_dim;
    uint32_t theta;
    uint8_t scaling;
    uint32_t factor;
    uint32_t low_freq_factor;
    uint32_t high_freq_factor;
    int32_t original_max_position;

    friend bool operator==(const Key& a, const Key& b) {
      return a.head_dim == b.head_dim && a.theta == b.theta && a.scaling == b.scaling &&
             a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
             a.high_freq_factor == b.high_freq_factor &&
             a.original_max_position == b.original_max_position;
    }
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.head_dim, k.theta, k.scaling, k.factor,
                        k.low_freq_factor, k.high_freq_factor, k.original_max_position);
    }
  };
  static Key KeyOf(const ops::Rope& op);

  absl::flat_hash_map<Key, DeviceMemory> tables_;
};

}  // namespace sg::internal

#endif  // STEPGRAPH_DISPATCH_CUDA_ROPE_H_
