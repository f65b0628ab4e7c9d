// MockDispatch: turns each Run into a trace entry that names the buffers it touches.
#include "stepgraph/dispatch/mock_dispatch.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sg {
namespace {

TraceArg ToTraceArg(const TensorArg& a) {
  TraceArg t;
  t.tensor = std::string(a.name);
  t.dtype = a.dtype;
  t.shape = a.shape;
  if (a.kind == TensorKind::kIntermediate) {
    t.buffer = absl::StrCat("arena+", a.arena_offset);
  } else {
    t.buffer = absl::StrCat(absl::AsciiStrToLower(TensorKindName(a.kind)), ":", a.name);
  }
  return t;
}

std::string ArgText(const TraceArg& a) {
  return absl::StrCat(a.tensor, " ", a.shape.ToString(), " ", DTypeName(a.dtype), " @",
                      a.buffer);
}

}  // namespace

std::string TraceEntry::ToString() const {
  return absl::StrCat("#", node_index, " ", op, " ", node, " (",
                      absl::StrJoin(inputs, ", ",
                                    [](std::string* out, const TraceArg& a) {
                                      absl::StrAppend(out, ArgText(a));
                                    }),
                      ") -> ", ArgText(output));
}

absl::Status MockDispatch::Record(const char* op, const NodeArgs& args) {
  if (args.node_index == fail_at_) {
    fail_at_ = -1;
    return fail_status_;
  }
  ++launches_;
  if (!record_trace_) return absl::OkStatus();
  TraceEntry e;
  e.node_index = args.node_index;
  e.node = std::string(args.node_name);
  e.op = op;
  e.inputs.reserve(args.inputs.size());
  for (const TensorArg& a : args.inputs) e.inputs.push_back(ToTraceArg(a));
  e.output = ToTraceArg(args.output);
  trace_.push_back(std::move(e));
  return absl::OkStatus();
}

}  // namespace sg
