// What the single-run conformance cases cannot show about the fused matmul: its split-K
// and argmax tickets are reset by the kernel itself, so one prepared node launched again
// and again (as a replayed graph does) stays right. Each run gets new random inputs, the
// output is poisoned first, and the result is compared with the CPU reference. GPU cases
// GTEST_SKIP without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "dispatch/cuda/cuda_handles.h"
#include "kernels/fused_matmul.cuh"
#include "stepgraph/builder.h"
#include "stepgraph/cpu_dispatch.h"
#include "stepgraph/cuda_dispatch.h"
#include "stepgraph/executor.h"
#include "stepgraph/plan.h"
#include "tests/testing/conformance.h"
#include "tests/testing/util.h"

namespace sg::testing {
namespace {

using Epilogue = ops::FusedMatMul::Epilogue;

TEST(FusedMatmulSplitsTest, NarrowOutputsSplitK) {
  // Host-only: the split choice for the shapes of the Llama-3.2-1B step on 132 SMs.
  kernels::FusedMatmulArgs k;
  k.m = 1;
  k.k = 2048;
  k.n[0] = 512;
  EXPECT_EQ(kernels::FusedColumnBlocks(k), 128);
  EXPECT_EQ(kernels::FusedSplitsFor(k, 132), 3);
  kernels::FusedMatmulArgs qkv = k;
  qkv.weights = 3;
  qkv.n[0] = 2048;
  qkv.n[1] = qkv.n[2] = 512;
  EXPECT_EQ(kernels::FusedColumnBlocks(qkv), 768);
  EXPECT_EQ(kernels::FusedSplitsFor(qkv, 132), 1);
  kernels::FusedMatmulArgs silu = k;
  silu.weights = 2;
  silu.n[0] = silu.n[1] = 8192;
  silu.epilogue = kernels::FusedEpilogue::kSiluMul;
  EXPECT_EQ(kernels::FusedColumnBlocks(silu), 4096);
  kernels::FusedMatmulArgs tiny = k;
  tiny.k = 300;  // too short to split
  EXPECT_EQ(kernels::FusedSplitsFor(tiny, 132), 1);
}

void RepeatedRuns(DType t, int64_t m, int64_t k, int64_t n, Epilogue e) {
  GraphBuilder b;
  std::vector<TensorId> in = {b.Input("x", t, {m, k}), b.Weight("norm_w", t, {k}),
                              b.Weight("w", t, {n, k})};
  if (e == Epilogue::kAdd) in.push_back(b.Input("residual", t, {m, n}));
  b.Output("out", b.FusedMatMul({.norm = true, .eps = 1e-5f, .epilogue = e}, in));
  absl::StatusOr<Graph> graph = std::move(b).Build();
  ASSERT_TRUE(graph.ok()) << graph.status();
  absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(graph));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const Graph& g = plan->graph();

  absl::StatusOr<UniqueStream> stream = CreateStream("fused test");
  ASSERT_TRUE(stream.ok());
  CudaDispatch::Options options;
  options.stream = stream->get();
  options.cuda = CudaOptionsFromTestEnvironment();
  absl::StatusOr<std::unique_ptr<CudaDispatch>> gpu = CudaDispatch::Create(options);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<PreparedPlan> prepared = (*gpu)->Prepare(*plan);
  ASSERT_TRUE(prepared.ok()) << prepared.status();

  std::vector<HostTensor> host;
  std::vector<DeviceMemory> device;
  Bindings cpu_bind(g), gpu_bind(g);
  for (int32_t i = 0; i < g.num_tensors(); ++i) {
    const Tensor& tensor = g.tensors()[i];
    if (tensor.kind == TensorKind::kIntermediate) continue;
    host.emplace_back(tensor.dtype, tensor.shape);
    absl::StatusOr<DeviceMemory> mem = AllocateDevice(host.back().bytes(), "input");
    ASSERT_TRUE(mem.ok());
    device.push_back(*std::move(mem));
  }
  HostTensor cpu_arena(DType::kF32, Shape{plan->arena_bytes() / 4 + 1});
  absl::StatusOr<DeviceMemory> arena = AllocateDevice(plan->arena_bytes() + 256, "arena");
  ASSERT_TRUE(arena.ok());
  cpu_bind.SetArena(cpu_arena.data(), plan->arena_bytes());
  gpu_bind.SetArena(arena->get(), plan->arena_bytes());
  CpuDispatch cpu;
  const int32_t out = g.FindOutput("out")->index;
  for (int run = 0; run < 4; ++run) {
    SCOPED_TRACE(run);
    size_t h = 0;
    for (int32_t i = 0; i < g.num_tensors(); ++i) {
      const Tensor& tensor = g.tensors()[i];
      if (tensor.kind == TensorKind::kIntermediate) continue;
      host[h].FillUniform(1000 * run + i + 1, tensor.name == "norm_w" ? 0.5f : -1.0f, 1.5f);
      ASSERT_EQ(cudaMemcpy(device[h].get(), host[h].data(), host[h].bytes(),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_TRUE(cpu_bind.Bind(g.id(i), host[h].data(), host[h].bytes()).ok());
      ASSERT_TRUE(gpu_bind.Bind(g.id(i), device[h].get(), host[h].bytes()).ok());
      ++h;
    }
    cpu_arena.Poison();
    ASSERT_EQ(cudaMemset(arena->get(), 0xFF, plan->arena_bytes() + 256), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_TRUE(Execute(*plan, cpu_bind, cpu).ok());
    absl::StatusOr<ExecStats> stats = Execute(*prepared, gpu_bind, **gpu);
    ASSERT_TRUE(stats.ok()) << stats.status();
    ASSERT_EQ(cudaStreamSynchronize(stream->get()), cudaSuccess);
    const TensorArg c = ResolveTensor(*plan, cpu_bind, out);
    const TensorArg d = ResolveTensor(*plan, gpu_bind, out);
    HostTensor want(c.dtype, c.shape), got(d.dtype, d.shape);
    std::memcpy(want.data(), c.data, c.bytes());
    ASSERT_EQ(cudaMemcpy(got.data(), d.data, d.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    if (e == Epilogue::kArgmax) {
      // f32: sums in another order cannot flip a random argmax but by a near tie.
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.bytes()), 0);
    } else {
      EXPECT_LE(NormalizedError(got.ToFloat(), want.ToFloat()), t == DType::kF32 ? 1e-5 : 1e-2);
    }
  }
}

TEST(FusedMatmulReplayTest, SplitKTicketsResetBetweenRuns) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  RepeatedRuns(DType::kBF16, 1, 2048, 512, Epilogue::kNone);
  RepeatedRuns(DType::kF32, 3, 4096, 200, Epilogue::kAdd);
}

TEST(FusedMatmulReplayTest, ArgmaxTicketResetsBetweenRuns) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  RepeatedRuns(DType::kF32, 1, 2048, 3001, Epilogue::kArgmax);
  RepeatedRuns(DType::kF32, 2, 1024, 77, Epilogue::kArgmax);  // split-K and argmax
}

}  // namespace
}  // namespace sg::testing
