// The CPU paths of the quantized dot product (DotQuantizedRow): one source compiled for
// several x86 vector widths, chosen once at run time by what the processor has. Every path
// computes the same f32 operations in the same order, so they give the same bits; this
// header lets tests and benchmarks run each path by name.
#ifndef STEPGRAPH_BASE_QUANT_ISA_H_
#define STEPGRAPH_BASE_QUANT_ISA_H_

#include <cstdint>

#include "stepgraph/base/dtype.h"

// GCC and Clang on x86-64 build the wider paths; elsewhere there is the baseline only.
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define SG_QUANT_X86_PATHS 1
#else
#define SG_QUANT_X86_PATHS 0
#endif

namespace sg {

// In order of width: a path is supported when the processor has its instructions.
enum class QuantIsa : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

bool QuantIsaSupported(QuantIsa isa);

// DotQuantizedRow on the given path; false where DotQuantizedRow is, or for a path this
// processor lacks.
bool DotQuantizedRowWith(QuantIsa isa, DType t, const void* blocks, int64_t n, const float* x,
                         int64_t x_stride, int64_t m, float* out, int64_t out_stride);

}  // namespace sg

#endif  // STEPGRAPH_BASE_QUANT_ISA_H_
