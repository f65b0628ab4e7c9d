// The host-side decisions behind capture and replay, kept free of CUDA so that they are
// tested without a GPU: whether a plan may be captured, how an executable follows a
// change of bindings, and which batch bucket serves a step.
#ifndef STEPGRAPH_CAPTURE_CAPTURE_POLICY_H_
#define STEPGRAPH_CAPTURE_CAPTURE_POLICY_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "stepgraph/dispatch/dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/graph/memory_plan.h"

namespace sg {

// Counts and times of what happened to a captured step.
struct CaptureStats {
  int64_t captures = 0;          // whole-step stream captures
  int64_t instantiations = 0;    // executables instantiated (first and re-instantiations)
  int64_t updates = 0;           // Update() calls that changed something
  int64_t node_patches = 0;      //   ... served by patching the changed nodes in place
  int64_t patched_nodes = 0;     //   ... graph nodes patched so, in total
  int64_t exec_updates = 0;      //   ... served by a re-capture and cudaGraphExecUpdate
  int64_t reinstantiations = 0;  //   ... that needed a new executable
  int64_t replays = 0;
  double capture_us = 0;
  double instantiate_us = 0;
  double update_us = 0;

  std::string ToString() const;
};

// True when a pointer may be used by a kernel (device or managed memory).
using DevicePointerCheck = std::function<bool(const void* p)>;

// Refuses, naming the node and tensor, a plan that cannot be captured: a node whose op the
// dispatcher cannot record (KernelDispatch::CaptureSafe), a bound buffer or arena that is
// not device memory (said to be read or written, as WrittenInputs says), or bindings that
// CheckBindings refuses.
absl::Status CheckCaptureSafety(const ExecutionPlan& plan, const Bindings& bindings,
                                const KernelDispatch& dispatch,
                                const DevicePointerCheck& is_device_pointer);

// How an executable captured with `captured` bindings follows `next` ones.
struct UpdateDecision {
  enum class Kind {
    kNothing,     // no node resolves to a different address
    kPatchNodes,  // patch the launches of `nodes` in place
    kRecapture,   // capture again and update the executable as a whole
  };
  Kind kind = Kind::kNothing;
  std::vector<int32_t> nodes;  // nodes with at least one argument at a new address
};

// Nodes whose arguments moved; patching is chosen while they are at most
// `max_patch_fraction` of all nodes (an arena move touches nearly all: recapture).
UpdateDecision DecideUpdate(const ExecutionPlan& plan, const Bindings& captured,
                            const Bindings& next, double max_patch_fraction = 0.5);

// The smallest bucket that holds `live_rows` rows. `buckets` must be ascending and
// positive. InvalidArgument for live_rows <= 0, OutOfRange above the largest bucket.
absl::StatusOr<int64_t> ChooseBucket(absl::Span<const int64_t> buckets, int64_t live_rows);

// Checks a bucket list (non-empty, positive, strictly ascending).
absl::Status ValidateBuckets(absl::Span<const int64_t> buckets);

}  // namespace sg

#endif  // STEPGRAPH_CAPTURE_CAPTURE_POLICY_H_
