// The installed package used from outside: a graph made with the builder and run on the
// CPU reference, a decode session on random weights, the tokenizer library and the C ABI.
// Each part checks a computed value, so that a package that links but computes wrongly
// (or hands over the wrong headers) fails. Exits 0 when every check holds.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "stepgraph/graph/builder.h"
#include "stepgraph/c_api/c_api.h"
#include "stepgraph/dispatch/cpu_dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/runtime/session.h"
#include "stepgraph/base/status.h"
#include "stepgraph/text/tokenizer.h"

namespace {

int failures = 0;

void Check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

// y = RmsNorm(x, g) · wᵀ on the CPU reference; h = x·g / rms(x) = (1, 4, 3, 8) / sqrt(7.5).
absl::StatusOr<std::vector<float>> NormThenProjection() {
  sg::GraphBuilder b;
  sg::TensorId x = b.Input("x", sg::DType::kF32, {1, 4});
  sg::TensorId w = b.Weight("w", sg::DType::kF32, {3, 4});
  sg::TensorId g = b.Weight("g", sg::DType::kF32, {4});
  b.Output("y", b.MatMul(b.RmsNorm(x, g, 1e-6f, "norm"), w, "proj"));
  SG_ASSIGN_OR_RETURN(sg::Graph graph, std::move(b).Build());
  SG_ASSIGN_OR_RETURN(sg::ExecutionPlan plan, sg::ExecutionPlan::Create(std::move(graph)));
  std::vector<float> xv = {1, 2, 3, 4}, gv = {1, 2, 1, 2};
  std::vector<float> wv = {1, 0, 0, 0, 0, 1, 0, -1, 1, 1, 1, 1};
  std::vector<float> arena(plan.arena_bytes() / 4 + 1);
  sg::Bindings bind(plan.graph());
  SG_RETURN_IF_ERROR(bind.Bind("x", xv.data(), 16));
  SG_RETURN_IF_ERROR(bind.Bind("w", wv.data(), 48));
  SG_RETURN_IF_ERROR(bind.Bind("g", gv.data(), 16));
  bind.SetArena(arena.data(), plan.arena_bytes());
  sg::CpuDispatch cpu;
  SG_RETURN_IF_ERROR(sg::Execute(plan, bind, cpu).status());
  SG_ASSIGN_OR_RETURN(sg::TensorId y, plan.graph().FindOutput("y"));
  const float* out = static_cast<const float*>(sg::ResolveTensor(plan, bind, y.index).data);
  return std::vector<float>(out, out + 3);
}

// Greedy ids of a tiny random-weight model on the CPU.
absl::StatusOr<std::vector<int32_t>> Generate(uint64_t weight_seed) {
  sg::SessionOptions options;
  options.config = sg::TinyLlamaConfig();
  options.weight_seed = weight_seed;
  options.backend = sg::Backend::kCpu;
  options.max_seq = 32;
  options.cpu_threads = 1;
  SG_ASSIGN_OR_RETURN(std::unique_ptr<sg::DecodeSession> session,
                      sg::DecodeSession::Create(options));
  const std::vector<int32_t> prompt = {1, 5, 9};
  SG_RETURN_IF_ERROR(session->Prefill(0, prompt));
  return session->Generate(0, 6);
}

}  // namespace

int main() {
  absl::StatusOr<std::vector<float>> y = NormThenProjection();
  Check(y.ok(), "builder graph runs on the CPU reference");
  if (y.ok()) {
    const float rms = std::sqrt(7.5f + 1e-6f);
    const float want[3] = {1.0f / rms, -4.0f / rms, 16.0f / rms};
    for (int i = 0; i < 3; ++i) {
      Check(std::fabs((*y)[i] - want[i]) <= 1e-5f * std::fabs(want[i]),
            "y[" + std::to_string(i) + "] = " + std::to_string((*y)[i]) + ", want " +
                std::to_string(want[i]));
    }
  } else {
    std::printf("%s\n", y.status().ToString().c_str());
  }

  absl::StatusOr<std::vector<int32_t>> a = Generate(7), b = Generate(7);
  Check(a.ok() && b.ok(), "a session on random weights generates");
  if (a.ok() && b.ok()) {
    bool in_range = a->size() == 6;
    for (int32_t id : *a) in_range = in_range && id >= 0 && id < sg::TinyLlamaConfig().vocab_size;
    Check(in_range, "six ids within the vocabulary");
    Check(*a == *b, "the same weights and prompt give the same ids");
  } else {
    std::printf("%s\n", (a.ok() ? b : a).status().ToString().c_str());
  }

  Check(sg::Utf8Lossy("a\xff" "b") == "a\xEF\xBF\xBD" "b", "tokenizer library: Utf8Lossy");

  float inv_freq[2] = {0, 0};
  const int32_t rc = stepgraph_rope_inv_freq(4, 10000.0f, STEPGRAPH_ROPE_SCALING_NONE, 0, 0, 0,
                                             0, inv_freq);
  Check(rc == 0 && inv_freq[0] == 1.0f && std::fabs(inv_freq[1] - 0.01f) < 1e-7f,
        "C ABI: stepgraph_rope_inv_freq");
  Check(stepgraph_abi_version() == STEPGRAPH_C_API_VERSION, "C ABI: the header's version");

  std::printf("%s\n", failures == 0 ? "package consumer: all checks passed"
                                    : "package consumer: FAILED");
  return failures == 0 ? 0 : 1;
}
