// The host-side decisions behind capture and replay, kept free of CUDA so that they are
// tested without a GPU: whether a plan may be captured, and which batch bucket serves a
// step.
#ifndef STEPGRAPH_CAPTURE_CAPTURE_POLICY_H_
#define STEPGRAPH_CAPTURE_CAPTURE_POLICY_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "stepgraph/dispatch/dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/graph/memory_plan.h"

namespace sg {

// Counts and times of what happened to a captured step.
struct CaptureStats {
  int64_t captures = 0;        // whole-step stream captures
  int64_t instantiations = 0;  // executables instantiated
  int64_t replays = 0;
  double capture_us = 0;
  double instantiate_us = 0;

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

// The index in `buckets` of the smallest bucket that holds `live_rows` rows. `buckets`
// must be positive and strictly ascending (ValidateBuckets). InvalidArgument for
// live_rows <= 0 or a bad list, OutOfRange above the largest bucket. Formats nothing
// unless it fails, so that a step may call it.
absl::StatusOr<int> ChooseBucket(absl::Span<const int64_t> buckets, int64_t live_rows);

// Checks a bucket list (non-empty, positive, strictly ascending).
absl::Status ValidateBuckets(absl::Span<const int64_t> buckets);

}  // namespace sg

#endif  // STEPGRAPH_CAPTURE_CAPTURE_POLICY_H_
