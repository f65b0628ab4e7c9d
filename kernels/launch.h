// How stepgraph's kernels are launched: on which stream, and whether with programmatic
// dependent launch (kernels/common.cuh's AwaitPrerequisiteGrids and LaunchKernel). Host
// code; nothing here is process-wide, so that callers with different wishes (two
// dispatchers with different CudaOptions) share a process without interfering.
#ifndef STEPGRAPH_KERNELS_LAUNCH_H_
#define STEPGRAPH_KERNELS_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstddef>

namespace sg::kernels {

// Where a launcher enqueues its kernel and whether it may launch it programmatically (each
// kernel may start while its predecessor drains). Every launcher takes one; a bare stream
// converts to one that allows programmatic launch, the default of the C ABI and the
// benchmarks. CudaDispatch passes its own, from CudaOptions::programmatic_launch.
struct Stream {
  cudaStream_t stream = nullptr;
  bool programmatic = true;

  Stream() = default;
  Stream(cudaStream_t s) : stream(s) {}  // NOLINT(google-explicit-constructor): by design
  Stream(cudaStream_t s, bool allow_programmatic) : stream(s), programmatic(allow_programmatic) {}
};

// True when the current device can take stepgraph's kernels launched programmatically:
// they were compiled for sm_90 or later only (STEPGRAPH_KERNELS_PDL) and the device is
// sm_90 or later. Cached per device.
bool ProgrammaticLaunchSupported();

// The launch of grid × block threads with `shared_bytes` of dynamic shared memory on
// s.stream, with programmatic stream serialization when s.programmatic and `supported`
// (the kernel's build and the device can take it). `attribute` holds the attribute the
// config points at and must outlive it.
inline cudaLaunchConfig_t MakeLaunchConfig(dim3 grid, dim3 block, size_t shared_bytes,
                                           const Stream& s, bool supported,
                                           cudaLaunchAttribute* attribute) {
  attribute->id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute->val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = s.stream;
  config.attrs = attribute;
  config.numAttrs = s.programmatic && supported ? 1 : 0;
  return config;
}

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_LAUNCH_H_
