// The rotary family.
//
// Rope: one thread per rotated pair, a 1-D grid over rows · cols / 2, each pair rotated
// by RotatePair (kernels/rope_rotate.cuh: the reference's angle and order of rounding).
//
// KvWrite: a copy of raw bytes (to slot i, or to the slot of row i's sequence), one thread per 16-byte unit (or per element when a head's
// row is not a multiple of 16 bytes or a buffer is unaligned), over rows · kv_heads ·
// units-per-head.
#include <algorithm>

#include "kernels/common.cuh"
#include "kernels/rope.cuh"
#include "kernels/rope_rotate.cuh"
#include "stepgraph/base/error_flags.h"

namespace sg::kernels {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    RopeKernel(const T* __restrict__ x, const int32_t* __restrict__ pos,
               const float* __restrict__ inv_freq, T* __restrict__ y, int64_t rows,
               int64_t cols, int head_dim, bool interleaved) {
  AwaitPrerequisiteGrids();
  const int64_t pairs_per_row = cols / 2;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= rows * pairs_per_row) return;
  const int64_t row = t / pairs_per_row;
  const int64_t pair = t - row * pairs_per_row;
  const int half = head_dim / 2;
  const int64_t head = pair / half;
  const int j = static_cast<int>(pair - head * half);
  const int64_t base = row * cols + head * head_dim;
  const int64_t a = base + (interleaved ? 2 * j : j);
  const int64_t b = base + (interleaved ? 2 * j + 1 : j + half);
  const T x1 = x[a], x2 = x[b];
  const int32_t p = pos[row];
  if (p < 0) {  // padding row: unchanged
    y[a] = x1;
    y[b] = x2;
    return;
  }
  float y1, y2;
  RotatePair<T>(ToFloat(x1), ToFloat(x2), p, inv_freq[j], y1, y2);
  y[a] = FromFloat<T>(y1);
  y[b] = FromFloat<T>(y2);
}

template <typename U>
__global__ void __launch_bounds__(kThreads)
    KvWriteKernel(const U* __restrict__ kv, const int32_t* __restrict__ pos,
                  U* __restrict__ cache, int64_t rows, int64_t kv_heads, int64_t seq,
                  int64_t units_per_head, uint32_t* error_flags, KvSlots slots) {
  AwaitPrerequisiteGrids();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t units_per_row = kv_heads * units_per_head;
  if (t >= rows * units_per_row) return;
  const int64_t row = t / units_per_row;
  const int32_t p = pos[row];
  if (p < 0) return;  // padding row
  const int64_t in_row = t - row * units_per_row;
  const int64_t slot =
      slots.seq_slots == nullptr ? row : slots.seq_slots[row / slots.rows_per_seq];
  if (p >= seq || slot < 0 || slot >= slots.slots) {
    if (in_row == 0) atomicOr(error_flags, static_cast<uint32_t>(kErrorPositionOutOfRange));
    return;
  }
  const int64_t head = in_row / units_per_head;
  const int64_t unit = in_row - head * units_per_head;
  cache[((slot * kv_heads + head) * seq + p) * units_per_head + unit] = kv[t];
}

template <typename U>
cudaError_t LaunchKvUnits(const void* kv, const int32_t* pos, void* cache, int64_t rows,
                          int64_t kv_heads, int64_t seq, int64_t head_bytes,
                          uint32_t* error_flags, const KvSlots& slots, Stream stream) {
  const int64_t units_per_head = head_bytes / static_cast<int64_t>(sizeof(U));
  const int64_t blocks = CeilDiv(rows * kv_heads * units_per_head, kThreads);
  return LaunchKernel(KvWriteKernel<U>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), stream,
                      static_cast<const U*>(kv), pos, static_cast<U*>(cache), rows, kv_heads, seq,
                      units_per_head, error_flags, slots);
}

}  // namespace

cudaError_t LaunchRope(const void* x, const int32_t* pos, const float* inv_freq, void* y,
                       int64_t rows, int64_t cols, int head_dim, bool interleaved, DType dtype,
                       Stream stream) {
  if (rows <= 0 || head_dim <= 0 || head_dim % 2 != 0 || cols <= 0 || cols % head_dim != 0 ||
      inv_freq == nullptr) {
    return cudaErrorInvalidValue;
  }
  return DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t blocks = CeilDiv(rows * cols / 2, kThreads);
    return LaunchKernel(RopeKernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), stream,
                        static_cast<const T*>(x), pos, inv_freq, static_cast<T*>(y), rows, cols,
                        head_dim, interleaved);
  });
}

cudaError_t LaunchKvWrite(const void* kv, const int32_t* pos, void* cache, int64_t rows,
                          int64_t kv_heads, int64_t seq, int64_t head_dim, DType dtype,
                          uint32_t* error_flags, Stream stream, const KvSlots& in_slots) {
  if (rows <= 0 || kv_heads <= 0 || seq <= 0 || head_dim <= 0 || !IsFloat(dtype) ||
      error_flags == nullptr || in_slots.rows_per_seq <= 0 || rows % in_slots.rows_per_seq != 0) {
    return cudaErrorInvalidValue;
  }
  KvSlots slots = in_slots;
  if (slots.seq_slots == nullptr) slots.slots = rows;  // row i is slot i
  const int64_t head_bytes = head_dim * DTypeBytes(dtype);
  if (head_bytes % 16 == 0 && Aligned16(kv) && Aligned16(cache)) {
    return LaunchKvUnits<uint4>(kv, pos, cache, rows, kv_heads, seq, head_bytes, error_flags,
                                slots, stream);
  }
  if (DTypeBytes(dtype) == 4) {
    return LaunchKvUnits<uint32_t>(kv, pos, cache, rows, kv_heads, seq, head_bytes,
                                   error_flags, slots, stream);
  }
  return LaunchKvUnits<uint16_t>(kv, pos, cache, rows, kv_heads, seq, head_bytes, error_flags,
                                 slots, stream);
}

}  // namespace sg::kernels
