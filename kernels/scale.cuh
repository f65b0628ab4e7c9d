// Launcher of the C ABI's scale kernel (stepgraph_scale): y = alpha · x over n elements of
// a float dtype, math in f32. One launch on `stream`; returns the launch's error.
#ifndef STEPGRAPH_KERNELS_SCALE_CUH_
#define STEPGRAPH_KERNELS_SCALE_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/launch.h"
#include "stepgraph/base/dtype.h"

namespace sg::kernels {

cudaError_t LaunchScale(const void* x, void* y, int64_t n, float alpha, DType dtype,
                        Stream stream);

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_SCALE_CUH_
