// Launcher for Embedding: out[i, :] = table[ids[i], :]. An id outside [0, vocab) writes a
// zero row and raises kErrorTokenOutOfRange in *error_flags (never reads out of bounds).
// One launch on `stream`; the result is cudaGetLastError() after it.
#ifndef STEPGRAPH_KERNELS_EMBEDDING_CUH_
#define STEPGRAPH_KERNELS_EMBEDDING_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/launch.h"
#include "stepgraph/base/dtype.h"

namespace sg::kernels {

// table [vocab, hidden], ids [rows] (device memory, read by the kernel), out [rows, hidden].
cudaError_t LaunchEmbedding(const void* table, const int32_t* ids, void* out, int64_t rows,
                            int64_t vocab, int64_t hidden, DType dtype, uint32_t* error_flags,
                            Stream stream);

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_EMBEDDING_CUH_
