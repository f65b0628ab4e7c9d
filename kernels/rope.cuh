// Launchers for the rotary family: Rope (rotate every head of a row by the row's position)
// and KvWrite (store a step's K or V rows into the cache at their positions). Positions are
// device memory read by the kernels. One launch on `stream` each; the result is
// cudaGetLastError() after it.
#ifndef STEPGRAPH_KERNELS_ROPE_CUH_
#define STEPGRAPH_KERNELS_ROPE_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/launch.h"
#include "stepgraph/base/dtype.h"

namespace sg::kernels {

// x, y [rows, cols] with cols a multiple of head_dim (even); pos [rows]; inv_freq
// [head_dim / 2] f32 in device memory. Pairs (j, j + d/2) of each head, or (2j, 2j + 1)
// when `interleaved`, are rotated by pos · inv_freq[j], with HF's roundings for 16-bit
// types. Rows with pos < 0 are copied unchanged.
cudaError_t LaunchRope(const void* x, const int32_t* pos, const float* inv_freq, void* y,
                       int64_t rows, int64_t cols, int head_dim, bool interleaved, DType dtype,
                       Stream stream);

// kv [rows, kv_heads * head_dim]; cache [slots, kv_heads, seq, head_dim]. Row i goes to
// (its slot, pos[i]) of every head: slot i when seq_slots is null (slots >= rows), else
// seq_slots[i / rows_per_seq] (a prefill step of rows_per_seq rows per sequence). pos < 0
// writes nothing; pos >= seq or a slot outside [0, slots) writes nothing and raises
// kErrorPositionOutOfRange in *error_flags.
struct KvSlots {
  const int32_t* seq_slots = nullptr;  // device, [rows / rows_per_seq]
  int64_t rows_per_seq = 1;
  int64_t slots = 0;
};
cudaError_t LaunchKvWrite(const void* kv, const int32_t* pos, void* cache, int64_t rows,
                          int64_t kv_heads, int64_t seq, int64_t head_dim, DType dtype,
                          uint32_t* error_flags, Stream stream,
                          const KvSlots& slots = KvSlots{});

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_ROPE_CUH_
