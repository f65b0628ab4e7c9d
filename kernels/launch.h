// Host-side view of how stepgraph's kernels are launched (kernels/launch.cu).
#ifndef STEPGRAPH_KERNELS_LAUNCH_H_
#define STEPGRAPH_KERNELS_LAUNCH_H_

namespace sg::kernels {

// True when launches carry the programmatic stream serialization attribute (programmatic
// dependent launch): the kernels were compiled for sm_90 or later only
// (STEPGRAPH_KERNELS_PDL), the current device is sm_90 or later, and the environment does
// not set STEPGRAPH_PDL=0. Cached per device.
bool ProgrammaticLaunchEnabled();

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_LAUNCH_H_
