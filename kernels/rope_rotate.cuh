// The rotation of one RoPE pair, shared by every kernel that rotates (Rope, RopeKvWrite,
// the fused matmul's rope_kv_write epilogue) so that they round alike and alike to the
// CPU reference's RotateHeads. The angle is the f32 product pos · inv_freq[j] with the
// host-computed table, and cos/sin are the accurate sincosf (positions reach 131072, far
// outside what the fast intrinsics keep accurate). As Hugging Face: cos and sin cast to
// the model dtype, each product and the sum in that dtype; __fmul_rn keeps the compiler
// from contracting a product into an fma.
#ifndef STEPGRAPH_KERNELS_ROPE_ROTATE_CUH_
#define STEPGRAPH_KERNELS_ROPE_ROTATE_CUH_

#include <cstdint>

#include "kernels/common.cuh"

namespace sg::kernels {

// (x1, x2) rotated by pos · inv_freq into (y1, y2), each already rounded to T's values.
template <typename T>
__device__ __forceinline__ void RotatePair(float x1, float x2, int32_t pos, float inv_freq,
                                           float& y1, float& y2) {
  float s, c;
  sincosf(__fmul_rn(static_cast<float>(pos), inv_freq), &s, &c);
  c = RoundTo<T>(c);
  s = RoundTo<T>(s);
  y1 = RoundTo<T>(RoundTo<T>(__fmul_rn(x1, c)) - RoundTo<T>(__fmul_rn(x2, s)));
  y2 = RoundTo<T>(RoundTo<T>(__fmul_rn(x2, c)) + RoundTo<T>(__fmul_rn(x1, s)));
}

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_ROPE_ROTATE_CUH_
