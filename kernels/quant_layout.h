// Host side of the device layout of GGUF's block formats (kernels/quant_blocks.cuh says
// what it is): the repacking a weight goes through on its way to the GPU, and the host
// reading of the repacked bytes that tests hold against the CPU reference. Plain C++:
// dispatch/cuda and the tests include it.
#ifndef STEPGRAPH_KERNELS_QUANT_LAYOUT_H_
#define STEPGRAPH_KERNELS_QUANT_LAYOUT_H_

#include <cstdint>

#include "stepgraph/base/dtype.h"

namespace sg::kernels {

// dst (DTypeBlockBytes(t) · blocks bytes, not overlapping src) = the `blocks` blocks at
// src, as a file stores them, in the device layout. The tensor's whole set of blocks goes
// in one call: its planes span all of them. False, writing nothing, for a dtype that is no
// block format or blocks < 0.
bool RepackBlocksForDevice(DType t, int64_t blocks, const void* src, void* dst);

// How DequantizeDeviceLayoutRow reads a unit: kEights, Load then Values8 of each eight;
// kParts, each eight from its own LoadPart (the 32-value formats; the others as kEights);
// kQuarters, the tensor-core kernel's QuadCodes.
enum class DeviceLayoutReading { kEights, kParts, kQuarters };

// out[0 .. k) = row `row` of a [rows, k] tensor of `blocks` = rows · k / DTypeBlockElems(t)
// blocks held at `device_layout` (host memory) in the device layout, dequantized by the
// kernels' own readers, as `reading` says. False for a dtype that is no block format or
// sizes out of range.
bool DequantizeDeviceLayoutRow(DType t, const void* device_layout, int64_t blocks, int64_t row,
                               int64_t k, float* out,
                               DeviceLayoutReading reading = DeviceLayoutReading::kEights);

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_QUANT_LAYOUT_H_
