// MockDispatch: records what would be launched, for graph tests without a GPU. Its Run
// overloads are generated from SG_OP_LIST, so it covers every op by construction.
#ifndef STEPGRAPH_DISPATCH_MOCK_DISPATCH_H_
#define STEPGRAPH_DISPATCH_MOCK_DISPATCH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "stepgraph/dispatch/dispatch.h"

namespace sg {

struct TraceArg {
  std::string tensor;  // tensor name
  DType dtype = DType::kF32;
  Shape shape;
  // Which buffer the argument points into: "arena+<offset>" for intermediates,
  // "<kind>:<name>" ("weight:embed", "state:k_cache.0") for bound tensors.
  std::string buffer;
};

struct TraceEntry {
  int32_t node_index = -1;
  std::string node;
  std::string op;
  std::vector<TraceArg> inputs;
  TraceArg output;

  // "#3 MatMul q_proj (x [1,64] f32 @arena+0, w [64,64] f32 @weight:wq) -> [1,64] f32 @arena+256"
  std::string ToString() const;
};

class MockDispatch final : public KernelDispatch {
 public:
  // With record_trace false only launches are counted (for overhead benchmarks).
  explicit MockDispatch(bool record_trace = true) : record_trace_(record_trace) {}

  // The next Run of node `node_index` returns `status` instead of recording.
  void FailAt(int32_t node_index, absl::Status status) {
    fail_at_ = node_index;
    fail_status_ = std::move(status);
  }

  // Records every op, so it takes every node the graph accepts.
  bool Supports(const Op&, absl::Span<const Tensor* const>) const override { return true; }

  // Marks an op (by name, e.g. "Sample") as not capture-safe, to test capture's refusal.
  void SetCaptureUnsafe(absl::string_view op_name) { capture_unsafe_.emplace(op_name); }
  bool CaptureSafe(const Op& op) const override {
    return !capture_unsafe_.contains(OpName(op));
  }

  const std::vector<TraceEntry>& trace() const { return trace_; }
  int64_t launches() const { return launches_; }
  void Clear() {
    trace_.clear();
    launches_ = 0;
  }

#define SG_MOCK_RUN(Name)                                                \
  absl::Status Run(const ops::Name& op, const NodeArgs& args) override { \
    return Record(#Name, args);                                          \
  }
  SG_OP_LIST(SG_MOCK_RUN)
#undef SG_MOCK_RUN

 private:
  absl::Status Record(const char* op, const NodeArgs& args);

  bool record_trace_;
  std::vector<TraceEntry> trace_;
  int64_t launches_ = 0;
  int32_t fail_at_ = -1;
  absl::Status fail_status_;
  absl::flat_hash_set<std::string> capture_unsafe_;
};

}  // namespace sg

#endif  // STEPGRAPH_DISPATCH_MOCK_DISPATCH_H_
