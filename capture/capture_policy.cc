// Capture safety and bucket choice: pure host logic (see capture_policy.h), in
// stepgraph_capture.
#include "stepgraph/capture/capture_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "stepgraph/base/status.h"

namespace sg {

std::string CaptureStats::ToString() const {
  return absl::StrFormat("captures=%d instantiations=%d replays=%d capture=%.1fus "
                         "instantiate=%.1fus",
                         captures, instantiations, replays, capture_us, instantiate_us);
}

absl::Status CheckCaptureSafety(const ExecutionPlan& plan, const Bindings& bindings,
                                const KernelDispatch& dispatch,
                                const DevicePointerCheck& is_device_pointer) {
  SG_RETURN_IF_ERROR(CheckBindings(plan, bindings));
  const Graph& g = plan.graph();
  if (plan.arena_bytes() > 0 && !is_device_pointer(bindings.arena().data)) {
    return absl::FailedPreconditionError(
        "capture refused: the arena is not device memory");
  }
  for (int32_t i = 0; i < g.num_nodes(); ++i) {
    const Node& node = g.nodes()[i];
    if (!dispatch.CaptureSafe(node.op)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "capture refused: node ", i, " '", node.name, "' (", OpName(node.op),
          ") is not capture-safe on this dispatcher; run the plan eagerly instead"));
    }
    auto check = [&](TensorId id, bool written) -> absl::Status {
      const Tensor& t = g.tensor(id);
      if (t.kind == TensorKind::kIntermediate) return absl::OkStatus();  // in the arena
      if (is_device_pointer(bindings.buffer(id.index).data)) return absl::OkStatus();
      return absl::FailedPreconditionError(absl::StrCat(
          "capture refused: node ", i, " '", node.name, "' (", OpName(node.op), ") ",
          written ? "writes " : "reads ", TensorKindName(t.kind), " '", t.name,
          "', which is bound to memory the GPU cannot use (host memory?)"));
    };
    const InputWrites writes = WrittenInputs(node.op);
    for (int32_t k = 0; k < static_cast<int32_t>(node.inputs.size()); ++k) {
      const bool written =
          std::find(writes.inputs.begin(), writes.inputs.end(), k) != writes.inputs.end();
      SG_RETURN_IF_ERROR(check(node.inputs[k], written));
    }
    if (!writes.output_is_written) SG_RETURN_IF_ERROR(check(node.output, true));
  }
  return absl::OkStatus();
}

absl::Status ValidateBuckets(absl::Span<const int64_t> buckets) {
  if (buckets.empty()) return absl::InvalidArgumentError("bucket list is empty");
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (buckets[i] <= 0 || (i > 0 && buckets[i] <= buckets[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("buckets must be positive and strictly ascending, got [",
                       absl::StrJoin(buckets, ","), "]"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ChooseBucket(absl::Span<const int64_t> buckets, int64_t live_rows) {
  SG_RETURN_IF_ERROR(ValidateBuckets(buckets));
  if (live_rows <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a step needs at least one live row, got ", live_rows));
  }
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (buckets[i] >= live_rows) return static_cast<int>(i);
  }
  return absl::OutOfRangeError(absl::StrCat(live_rows, " live rows exceed the largest bucket (",
                                            buckets.back(), ")"));
}

}  // namespace sg
