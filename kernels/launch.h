// Host-side view of how stepgraph's kernels are launched (kernels/launch.cu).
#ifndef STEPGRAPH_KERNELS_LAUNCH_H_
#define STEPGRAPH_KERNELS_LAUNCH_H_

namespace sg::kernels {

// True when launches carry the programmatic stream serialization attribute (programmatic
// dependent launch): the kernels were compiled for sm_90 or later only
// (STEPGRAPH_KERNELS_PDL), the current device is sm_90 or later, and it was not switched
// off with SetProgrammaticLaunch(false). Cached per device.
bool ProgrammaticLaunchEnabled();

// Process-wide switch (on by default): how stepgraph's kernels are launched is a property
// of the process's launches, not of one caller, so it is not per stream. Set it before
// launching (CudaDispatch does from its options); launches already captured keep theirs.
void SetProgrammaticLaunch(bool enabled);

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_LAUNCH_H_
