// Launchers for the elementwise family: Add, Mul, Silu, SiluMul (f32, bf16, f16 storage,
// f32 math; Add also on i32, wrapping) and Advance (pos + 1 where pos >= 0). Each is one
// launch on `stream`; the result is cudaGetLastError() after it. n counts elements.
#ifndef STEPGRAPH_KERNELS_ELEMENTWISE_CUH_
#define STEPGRAPH_KERNELS_ELEMENTWISE_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/launch.h"
#include "stepgraph/base/dtype.h"

namespace sg::kernels {

// y = a + b.
cudaError_t LaunchAdd(const void* a, const void* b, void* y, int64_t n, DType dtype,
                      Stream stream);
// y = a · b.
cudaError_t LaunchMul(const void* a, const void* b, void* y, int64_t n, DType dtype,
                      Stream stream);
// y = x · sigmoid(x).
cudaError_t LaunchSilu(const void* x, void* y, int64_t n, DType dtype, Stream stream);
// y = silu(gate) · up.
cudaError_t LaunchSiluMul(const void* gate, const void* up, void* y, int64_t n, DType dtype,
                          Stream stream);
// pos[i] += 1 where pos[i] >= 0, in place.
// A position at INT32_MAX stays and raises kErrorPositionOutOfRange in *error_flags
// (when given) instead of wrapping.
cudaError_t LaunchAdvance(int32_t* pos, int64_t n, Stream stream,
                          uint32_t* error_flags = nullptr);

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_ELEMENTWISE_CUH_
