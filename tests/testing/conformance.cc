#include "tests/testing/conformance.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_handles.h"
#include "dispatch/cuda/cuda_status.h"
#include "stepgraph/dispatch/cpu_dispatch.h"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "absl/strings/numbers.h"
#include "tests/testing/util.h"

namespace sg::testing {

CudaOptions CudaOptionsFromTestEnvironment() {
  CudaOptions o;
  if (const char* v = std::getenv("STEPGRAPH_MATMUL"); v != nullptr && v[0] != '\0') {
    absl::StatusOr<MatmulPolicy> p = ParseMatmulPolicy(v);
    if (p.ok()) o.matmul = *p;
    EXPECT_TRUE(p.ok()) << "STEPGRAPH_MATMUL: " << p.status();
  }
  if (const char* v = std::getenv("STEPGRAPH_PDL"); v != nullptr && std::string(v) == "0") {
    o.programmatic_launch = false;
  }
  // The MoE kernels' walk: pairs per expert from which they walk by expert (0: always).
  if (const char* v = std::getenv("STEPGRAPH_MOE_BY_EXPERT"); v != nullptr && v[0] != '\0') {
    int64_t pairs = 0;
    const bool ok = absl::SimpleAtoi(v, &pairs) && pairs >= 0;
    if (ok) o.moe_by_expert_pairs = pairs;
    EXPECT_TRUE(ok) << "STEPGRAPH_MOE_BY_EXPERT: '" << v << "' is not a count >= 0";
  }
  if (const char* v = std::getenv("STEPGRAPH_COMPILED_NORM");
      v != nullptr && std::string(v) == "1") {
    o.compiled_norm = true;
  }
  return o;
}

bool HasCudaDevice() { return CudaDeviceAvailable(); }

namespace {

// The tensors a run is judged by: graph outputs and every tensor a node writes.
std::vector<int32_t> ComparedTensors(const Graph& g) {
  std::vector<int32_t> ids;
  auto add = [&](int32_t i) {
    if (std::find(ids.begin(), ids.end(), i) == ids.end()) ids.push_back(i);
  };
  for (const GraphOutput& o : g.outputs()) add(o.tensor.index);
  for (const Node& n : g.nodes()) {
    for (int32_t w : WrittenInputs(n.op).inputs) add(n.inputs[w].index);
  }
  return ids;
}

}  // namespace

void RunConformance(const OpCase& c) {
  SCOPED_TRACE(c.name);
  absl::StatusOr<Graph> graph = BuildCase(c);
  ASSERT_TRUE(graph.ok()) << graph.status();
  absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(graph));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const Graph& g = plan->graph();

  const std::map<int32_t, HostTensor> initial = CaseInputs(c, g);

  // CPU reference run on a copy of the inputs.
  std::map<int32_t, HostTensor> cpu_host;
  Bindings cpu_bind(g);
  for (auto& [i, h] : initial) {
    HostTensor copy(h.dtype(), h.shape());
    std::memcpy(copy.data(), h.data(), h.bytes());
    auto [it, _] = cpu_host.emplace(i, std::move(copy));
    ASSERT_TRUE(cpu_bind.Bind(g.id(i), it->second.data(), it->second.bytes()).ok());
  }
  HostTensor cpu_arena(DType::kF32, Shape{std::max<int64_t>(1, plan->arena_bytes() / 4 + 1)});
  cpu_arena.Poison();
  cpu_bind.SetArena(cpu_arena.data(), plan->arena_bytes());
  CpuDispatch cpu;
  absl::StatusOr<ExecStats> cpu_stats = Execute(*plan, cpu_bind, cpu);
  ASSERT_TRUE(cpu_stats.ok()) << cpu_stats.status();
  const uint32_t cpu_flags = cpu.TakeErrorFlags();

  // GPU run from the same inputs.
  absl::StatusOr<UniqueStream> stream = CreateStream("conformance");
  ASSERT_TRUE(stream.ok()) << stream.status();
  CudaDispatch::Options options;
  options.stream = stream->get();
  options.cuda = CudaOptionsFromTestEnvironment();
  if (c.cuda_options) c.cuda_options(options.cuda);
  absl::StatusOr<std::unique_ptr<CudaDispatch>> gpu = CudaDispatch::Create(options);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::map<int32_t, DeviceMemory> device;
  Bindings gpu_bind(g);
  for (auto& [i, h] : initial) {
    absl::StatusOr<DeviceMemory> mem = AllocateDevice(h.bytes(), "conformance input");
    ASSERT_TRUE(mem.ok()) << mem.status();
    // Weights in the layout the dispatcher reads (block formats repacked), as the step
    // runner uploads them.
    const Tensor& t = g.tensors()[i];
    const void* bytes = h.data();
    HostTensor repacked(h.dtype(), h.shape());
    if (t.kind == TensorKind::kWeight && (*gpu)->RepacksWeight(t)) {
      const absl::Status s = (*gpu)->RepackWeight(
          t, {static_cast<const std::byte*>(h.data()), static_cast<size_t>(h.bytes())},
          {static_cast<std::byte*>(repacked.data()), static_cast<size_t>(repacked.bytes())});
      ASSERT_TRUE(s.ok()) << s;
      bytes = repacked.data();
    }
    ASSERT_EQ(cudaMemcpy(mem->get(), bytes, h.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_TRUE(gpu_bind.Bind(g.id(i), mem->get(), h.bytes()).ok());
    device.emplace(i, *std::move(mem));
  }
  absl::StatusOr<DeviceMemory> arena =
      AllocateDevice(std::max<int64_t>(plan->arena_bytes(), 256), "conformance arena");
  ASSERT_TRUE(arena.ok()) << arena.status();
  ASSERT_EQ(cudaMemset(arena->get(), 0xFF, std::max<int64_t>(plan->arena_bytes(), 256)),
            cudaSuccess);
  // The uploads and the memset ran on the legacy stream, which the dispatcher's
  // non-blocking stream does not wait for.
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  gpu_bind.SetArena(arena->get(), plan->arena_bytes());
  absl::StatusOr<ExecStats> gpu_stats = Execute(*plan, gpu_bind, **gpu);
  ASSERT_TRUE(gpu_stats.ok()) << gpu_stats.status();
  ASSERT_EQ(gpu_stats->launches, g.num_nodes());
  absl::StatusOr<uint32_t> gpu_flags = (*gpu)->TakeErrorFlags();
  ASSERT_TRUE(gpu_flags.ok()) << gpu_flags.status();
  EXPECT_EQ(*gpu_flags, cpu_flags) << "error flags differ";

  for (const int32_t i : ComparedTensors(g)) {
    const Tensor& t = g.tensors()[i];
    SCOPED_TRACE(absl::StrCat("tensor '", t.name, "' ", t.shape.ToString(), " ",
                              DTypeName(t.dtype)));
    const TensorArg cpu_arg = ResolveTensor(*plan, cpu_bind, i);
    const TensorArg gpu_arg = ResolveTensor(*plan, gpu_bind, i);
    HostTensor cpu_out(t.dtype, t.shape), gpu_out(t.dtype, t.shape);
    std::memcpy(cpu_out.data(), cpu_arg.data, t.bytes());
    ASSERT_EQ(cudaMemcpy(gpu_out.data(), gpu_arg.data, t.bytes(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    if (t.dtype == DType::kI32) {
      if (!c.exact_ids) continue;
      const auto* a = static_cast<const int32_t*>(cpu_out.data());
      const auto* bb = static_cast<const int32_t*>(gpu_out.data());
      for (int64_t k = 0; k < cpu_out.size(); ++k) {
        ASSERT_EQ(bb[k], a[k]) << "element " << k;
      }
    } else {
      // Infinities are values of some ops (Penalize's min-p writes -inf for a masked id):
      // they must sit at the same elements with the same sign; the rest is compared by
      // normalised error. A NaN on either side fails.
      std::vector<float> got = gpu_out.ToFloat(), want = cpu_out.ToFloat();
      std::vector<float> got_finite, want_finite;
      int64_t infinities = 0;
      for (size_t k = 0; k < got.size(); ++k) {
        if (std::isinf(want[k]) || std::isinf(got[k])) {
          ASSERT_EQ(got[k], want[k]) << "element " << k;
          ++infinities;
          continue;
        }
        got_finite.push_back(got[k]);
        want_finite.push_back(want[k]);
      }
      const double err = NormalizedError(got_finite, want_finite);
      EXPECT_LE(err, c.tolerance) << infinities << " equal infinities left out";
    }
  }
}

}  // namespace sg::testing
