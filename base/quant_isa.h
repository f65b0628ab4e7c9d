// The CPU paths of the quantized dot products (DotQuantizedRows): the scalar definition
// (quant.cc) and, on x86-64, vector paths for AVX2 + FMA + F16C and AVX-512
// (quant_dot.cc), chosen once at run time by what the processor has. The paths differ only
// in the order and rounding of the dot's sums (the dequantized values are the same bits);
// this header lets tests and benchmarks run each path by name.
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

// The widest supported path (the one DotQuantizedRows takes).
QuantIsa BestQuantIsa();

// DotQuantizedRows on the given path; false where DotQuantizedRows is, or for a path this
// processor lacks.
bool DotQuantizedRowsWith(QuantIsa isa, DType t, const void* blocks, int64_t rows, int64_t n,
                          const float* x, int64_t x_stride, int64_t m, float* out,
                          int64_t out_stride);

#if SG_QUANT_X86_PATHS
// The vector paths (quant_dot.cc), for arguments already checked; false for a dtype that
// is not a block format.
bool DotRowsAvx2(DType t, const void* blocks, int64_t rows, int64_t n, const float* x,
                 int64_t x_stride, int64_t m, float* out, int64_t out_stride);
bool DotRowsAvx512(DType t, const void* blocks, int64_t rows, int64_t n, const float* x,
                   int64_t x_stride, int64_t m, float* out, int64_t out_stride);
#endif

}  // namespace sg

#endif  // STEPGRAPH_BASE_QUANT_ISA_H_
