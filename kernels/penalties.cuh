// Launchers for the per-sequence sampling controls: Penalize (repetition, presence and
// frequency penalties, logit bias, min-p, from per-slot parameters and token counts in
// device memory) and CountIds (the in-place count of each step's chosen ids). Their
// semantics are the CPU reference's (dispatch/cpu/cpu_dispatch.cc, ops::Penalize and
// ops::CountIds in stepgraph/graph/ops.h); each is one launch on `stream` and returns
// cudaGetLastError() after it.
#ifndef STEPGRAPH_KERNELS_PENALTIES_CUH_
#define STEPGRAPH_KERNELS_PENALTIES_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/launch.h"
#include "stepgraph/base/dtype.h"

namespace sg::kernels {

// out[i, :] (f32) = ops::Penalize of logits[i, :] (a float dtype) with slot i's
// `param_stride` parameters and counts[i, :]. Every f32 operation is rounded as the CPU
// reference rounds it (no contraction), so the result is bit-equal to the CPU's.
cudaError_t LaunchPenalize(const void* logits, DType dtype, int64_t rows, int64_t vocab,
                           const float* params, int64_t param_stride, const int32_t* counts,
                           float* out, Stream stream);

// counts[i, ids[i]] += 2 for rows with pos[i] >= 0; an id outside [0, vocab) counts nothing
// and raises kErrorTokenOutOfRange in *error_flags (when given).
cudaError_t LaunchCountIds(const int32_t* ids, const int32_t* pos, int64_t rows, int64_t vocab,
                           int32_t* counts, Stream stream, uint32_t* error_flags = nullptr);

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_PENALTIES_CUH_
