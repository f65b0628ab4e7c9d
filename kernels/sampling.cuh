// Launchers for the token-choosing ops: Argmax (greedy) and Sample (temperature, top-k,
// top-p, a counter-based uniform per row). Both read logits [rows, vocab] of a float dtype
// and write i32 ids; each is one launch on `stream` and returns cudaGetLastError() after
// it. Their semantics are the CPU reference's (dispatch/cpu/cpu_dispatch.cc).
#ifndef STEPGRAPH_KERNELS_SAMPLING_CUH_
#define STEPGRAPH_KERNELS_SAMPLING_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/launch.h"
#include "stepgraph/base/dtype.h"

namespace sg::kernels {

// Blocks that share one row of Argmax on a device with `sm_count` multiprocessors (1 for
// short rows or many rows). `max_blocks_per_row` > 0 caps it (benchmarks compare).
int ArgmaxBlocksPerRow(int64_t rows, int64_t vocab, int sm_count, int max_blocks_per_row = 0);

// Device workspace of an Argmax launch over `rows` rows: a 64-bit best (value, index) key
// and an arrival counter per row, which must be zero before the first launch (every
// launch leaves them zero). Unused when blocks_per_row is 1.
int64_t ArgmaxWorkspaceBytes(int64_t rows);

// ids[i] = the lowest index among the maxima of row i; NaN never wins and a row of NaN
// or -inf gives 0. A logit that is not finite raises kErrorNonFiniteLogits in
// *error_flags (when given).
cudaError_t LaunchArgmax(const void* x, DType dtype, int64_t rows, int64_t vocab,
                         int blocks_per_row, void* workspace, int32_t* ids,
                         Stream stream, uint32_t* error_flags = nullptr);

struct SampleParams {
  float temperature = 1.0f;  // > 0
  int32_t top_k = 0;         // 0: no limit
  float top_p = 1.0f;        // in (0, 1]
};

// ids[i] drawn from softmax(logits[i] / temperature) restricted to the top_k largest
// (equal values by index) and then to the smallest prefix of those whose mass reaches
// top_p, with u = SampleUniform(seeds[i], pos[i]) walked over the kept tokens in index
// order. Masses are exact integers (exp(z - max) in units of 2^-32), so the result is
// deterministic and independent of the launch shape. top_k = 1 is exactly Argmax of
// logits / temperature. NaN logits count as -inf; any logit that is not finite raises
// kErrorNonFiniteLogits in *error_flags (when given). Rows of 16384 or more logits are
// shared by a cluster of 8 blocks.
cudaError_t LaunchSample(const void* logits, DType dtype, int64_t rows, int64_t vocab,
                         const int32_t* seeds, const int32_t* pos, const SampleParams& params,
                         int32_t* ids, Stream stream, uint32_t* error_flags = nullptr);

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_SAMPLING_CUH_
