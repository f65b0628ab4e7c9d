// What the single-run conformance cases cannot show about the fused matmul: its split-K
// and argmax tickets are reset by the kernel itself, so one prepared node launched again
// and again (as a replayed graph does) stays right; and the rope_kv_write epilogue's
// cache writes, checked row by row: the rows (slot, pos) it must write against the CPU
// reference, every other cache element unchanged to the bit. Each run gets new random
// inputs, the output is poisoned first, and the result is compared with the CPU
// reference. GPU cases GTEST_SKIP without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "dispatch/cuda/cuda_handles.h"
#include "kernels/fused_matmul.cuh"
#include "stepgraph/graph/builder.h"
#include "stepgraph/dispatch/cpu_dispatch.h"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/graph/memory_plan.h"
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

// A graph's plan, prepared on a CudaDispatch of the tests' options and its own stream.
struct OnGpu {
  std::optional<ExecutionPlan> plan;
  UniqueStream stream;
  std::unique_ptr<CudaDispatch> gpu;  // destroyed before the stream it launches on
  std::optional<PreparedPlan> prepared;

  void Prepare(Graph graph) {
    absl::StatusOr<ExecutionPlan> p = ExecutionPlan::Create(std::move(graph));
    ASSERT_TRUE(p.ok()) << p.status();
    plan.emplace(*std::move(p));
    absl::StatusOr<UniqueStream> s = CreateStream("fused test");
    ASSERT_TRUE(s.ok()) << s.status();
    stream = *std::move(s);
    CudaDispatch::Options options;
    options.stream = stream.get();
    options.cuda = CudaOptionsFromTestEnvironment();
    absl::StatusOr<std::unique_ptr<CudaDispatch>> d = CudaDispatch::Create(options);
    ASSERT_TRUE(d.ok()) << d.status();
    gpu = *std::move(d);
    absl::StatusOr<PreparedPlan> pp = gpu->Prepare(*plan);
    ASSERT_TRUE(pp.ok()) << pp.status();
    prepared.emplace(*std::move(pp));
  }
};

void RepeatedRuns(DType t, int64_t m, int64_t k, int64_t n, Epilogue e) {
  GraphBuilder b;
  std::vector<TensorId> in = {b.Input("x", t, {m, k}), b.Weight("norm_w", t, {k}),
                              b.Weight("w", t, {n, k})};
  if (e == Epilogue::kAdd) in.push_back(b.Input("residual", t, {m, n}));
  b.Output("out", b.FusedMatMul({.norm = true, .eps = 1e-5f, .epilogue = e}, in));
  absl::StatusOr<Graph> graph = std::move(b).Build();
  ASSERT_TRUE(graph.ok()) << graph.status();
  OnGpu on;
  ASSERT_NO_FATAL_FAILURE(on.Prepare(*std::move(graph)));
  const Graph& g = on.plan->graph();

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
  HostTensor cpu_arena(DType::kF32, Shape{on.plan->arena_bytes() / 4 + 1});
  absl::StatusOr<DeviceMemory> arena = AllocateDevice(on.plan->arena_bytes() + 256, "arena");
  ASSERT_TRUE(arena.ok());
  cpu_bind.SetArena(cpu_arena.data(), on.plan->arena_bytes());
  gpu_bind.SetArena(arena->get(), on.plan->arena_bytes());
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
    ASSERT_EQ(cudaMemset(arena->get(), 0xFF, on.plan->arena_bytes() + 256), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_TRUE(Execute(*on.plan, cpu_bind, cpu).ok());
    absl::StatusOr<ExecStats> stats = Execute(*on.prepared, gpu_bind, *on.gpu);
    ASSERT_TRUE(stats.ok()) << stats.status();
    ASSERT_EQ(cudaStreamSynchronize(on.stream.get()), cudaSuccess);
    const TensorArg c = ResolveTensor(*on.plan, cpu_bind, out);
    const TensorArg d = ResolveTensor(*on.plan, gpu_bind, out);
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

struct RopeCase {
  DType t;
  int64_t m, k, h, kvh, d;
  bool interleaved, norm;
  std::vector<int32_t> pos;  // m values; < 0 padding, >= kRopeSeq past the cache
};
constexpr int64_t kRopeSeq = 16;

// FusedMatMul(kRopeKvWrite) on the GPU against the CPU reference, run three times on one
// prepared node with new inputs each time.
void RopeEpilogueRuns(const RopeCase& rc) {
  SCOPED_TRACE(::testing::Message()
               << DTypeName(rc.t) << " m=" << rc.m << " k=" << rc.k << " h=" << rc.h
               << " kvh=" << rc.kvh << " d=" << rc.d << (rc.interleaved ? " interleaved" : "")
               << (rc.norm ? " norm" : ""));
  const DType t = rc.t;
  ops::Rope rope{.head_dim = static_cast<int32_t>(rc.d), .theta = 500000.0f,
                 .interleaved = rc.interleaved};
  rope.scaling = {ops::RopeScaling::Type::kLlama3, 32.0f, 1.0f, 4.0f, 8192};
  GraphBuilder b;
  std::vector<TensorId> in = {b.Input("x", t, {rc.m, rc.k})};
  if (rc.norm) in.push_back(b.Weight("norm_w", t, {rc.k}));
  in.push_back(b.Weight("wq", t, {rc.h * rc.d, rc.k}));
  in.push_back(b.Weight("wk", t, {rc.kvh * rc.d, rc.k}));
  in.push_back(b.Weight("wv", t, {rc.kvh * rc.d, rc.k}));
  in.push_back(b.Input("pos", DType::kI32, {rc.m}));
  in.push_back(b.State("kc", t, {rc.m + 1, rc.kvh, kRopeSeq, rc.d}));
  in.push_back(b.State("vc", t, {rc.m + 1, rc.kvh, kRopeSeq, rc.d}));
  b.Output("q", b.FusedMatMul({.norm = rc.norm, .eps = 1e-5f, .weights = 3,
                               .epilogue = Epilogue::kRopeKvWrite, .rope = rope},
                              in));
  absl::StatusOr<Graph> graph = std::move(b).Build();
  ASSERT_TRUE(graph.ok()) << graph.status();
  OnGpu on;
  ASSERT_NO_FATAL_FAILURE(on.Prepare(*std::move(graph)));
  const Graph& g = on.plan->graph();

  // Bound tensors by index: host values (the CPU side runs on them in place) and a
  // device copy; the caches' initial values are kept to check what must stay.
  std::vector<int32_t> index;
  std::vector<HostTensor> host, initial;
  std::vector<DeviceMemory> device;
  for (int32_t i = 0; i < g.num_tensors(); ++i) {
    const Tensor& tensor = g.tensors()[i];
    if (tensor.kind == TensorKind::kIntermediate) continue;
    index.push_back(i);
    host.emplace_back(tensor.dtype, tensor.shape);
    initial.emplace_back(tensor.dtype, tensor.shape);
    absl::StatusOr<DeviceMemory> mem = AllocateDevice(host.back().bytes(), "input");
    ASSERT_TRUE(mem.ok());
    device.push_back(*std::move(mem));
  }
  HostTensor cpu_arena(DType::kF32, Shape{on.plan->arena_bytes() / 4 + 1});
  absl::StatusOr<DeviceMemory> arena = AllocateDevice(on.plan->arena_bytes() + 256, "arena");
  ASSERT_TRUE(arena.ok());
  CpuDispatch cpu;
  const int32_t out = g.FindOutput("q")->index;
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE(run);
    Bindings cpu_bind(g), gpu_bind(g);
    cpu_bind.SetArena(cpu_arena.data(), on.plan->arena_bytes());
    gpu_bind.SetArena(arena->get(), on.plan->arena_bytes());
    for (size_t h = 0; h < host.size(); ++h) {
      const Tensor& tensor = g.tensors()[index[h]];
      if (tensor.name == "pos") {
        ASSERT_EQ(static_cast<int64_t>(rc.pos.size()), rc.m);
        std::memcpy(host[h].data(), rc.pos.data(), host[h].bytes());
      } else {
        host[h].FillUniform(1000 * run + index[h] + 1, tensor.name == "norm_w" ? 0.5f : -1.0f,
                            1.5f);
      }
      std::memcpy(initial[h].data(), host[h].data(), host[h].bytes());
      ASSERT_EQ(cudaMemcpy(device[h].get(), host[h].data(), host[h].bytes(),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_TRUE(cpu_bind.Bind(g.id(index[h]), host[h].data(), host[h].bytes()).ok());
      ASSERT_TRUE(gpu_bind.Bind(g.id(index[h]), device[h].get(), host[h].bytes()).ok());
    }
    cpu_arena.Poison();
    ASSERT_EQ(cudaMemset(arena->get(), 0xFF, on.plan->arena_bytes() + 256), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_TRUE(Execute(*on.plan, cpu_bind, cpu).ok());
    absl::StatusOr<ExecStats> stats = Execute(*on.prepared, gpu_bind, *on.gpu);
    ASSERT_TRUE(stats.ok()) << stats.status();
    ASSERT_EQ(cudaStreamSynchronize(on.stream.get()), cudaSuccess);
    const double tol = t == DType::kF32 ? 1e-5 : 1e-2;

    const TensorArg c = ResolveTensor(*on.plan, cpu_bind, out);
    const TensorArg d = ResolveTensor(*on.plan, gpu_bind, out);
    HostTensor want(c.dtype, c.shape), got(d.dtype, d.shape);
    std::memcpy(want.data(), c.data, c.bytes());
    ASSERT_EQ(cudaMemcpy(got.data(), d.data, d.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_LE(NormalizedError(got.ToFloat(), want.ToFloat()), tol) << "q";

    for (size_t h = 0; h < host.size(); ++h) {
      const Tensor& tensor = g.tensors()[index[h]];
      if (tensor.kind != TensorKind::kState) continue;
      SCOPED_TRACE(tensor.name);
      HostTensor cache(tensor.dtype, tensor.shape);
      ASSERT_EQ(cudaMemcpy(cache.data(), device[h].get(), cache.bytes(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      const std::vector<float> gpu_v = cache.ToFloat(), cpu_v = host[h].ToFloat();
      const int64_t row = rc.d;  // elements of one (slot, head, pos) row
      std::vector<float> got_rows, want_rows;
      for (int64_t e = 0; e < cache.size(); e += row) {
        const int64_t p = (e / row) % kRopeSeq;
        const int64_t slot = e / (row * kRopeSeq * rc.kvh);
        const bool written = slot < rc.m && rc.pos[slot] >= 0 && rc.pos[slot] < kRopeSeq &&
                             p == rc.pos[slot];
        if (written) {
          got_rows.insert(got_rows.end(), gpu_v.begin() + e, gpu_v.begin() + e + row);
          want_rows.insert(want_rows.end(), cpu_v.begin() + e, cpu_v.begin() + e + row);
        } else {
          EXPECT_EQ(std::memcmp(static_cast<const std::byte*>(cache.data()) + e * DTypeBytes(t),
                                static_cast<const std::byte*>(initial[h].data()) +
                                    e * DTypeBytes(t),
                                row * DTypeBytes(t)),
                    0)
              << "element " << e << " was written (slot " << slot << ", position " << p << ")";
        }
      }
      if (!want_rows.empty()) {
        EXPECT_LE(NormalizedError(got_rows, want_rows), tol) << "written cache rows";
      }
    }
    // The CPU reference's flags against the dispatcher's: a position past the cache
    // raises kErrorPositionOutOfRange on both.
    const uint32_t cpu_flags = cpu.TakeErrorFlags();
    absl::StatusOr<uint32_t> gpu_flags = on.gpu->TakeErrorFlags();
    ASSERT_TRUE(gpu_flags.ok()) << gpu_flags.status();
    EXPECT_EQ(*gpu_flags, cpu_flags);
  }
}

TEST(FusedMatmulRopeTest, SplitChoiceForTheTestShapes) {
  // Host-only: which shapes below take split-K on an H100 (132 SMs).
  kernels::FusedMatmulArgs llama;
  llama.m = 1;
  llama.k = 2048;
  llama.weights = 3;
  llama.n[0] = 2048;
  llama.n[1] = llama.n[2] = 512;
  llama.epilogue = kernels::FusedEpilogue::kRopeKvWrite;
  EXPECT_EQ(kernels::FusedSplitsFor(llama, 132), 1);
  kernels::FusedMatmulArgs narrow = llama;
  narrow.k = 4096;
  narrow.n[0] = 128;
  narrow.n[1] = narrow.n[2] = 64;
  EXPECT_GT(kernels::FusedSplitsFor(narrow, 132), 1);
}

TEST(FusedMatmulRopeTest, EpilogueEqualsTheCpuReference) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (bool interleaved : {false, true}) {
      // The Llama-3.2-1B layer (no split-K), M = 1 and 2 (a padding row).
      RopeEpilogueRuns({t, 1, 2048, 32, 8, 64, interleaved, false, {7}});
      RopeEpilogueRuns({t, 2, 2048, 32, 8, 64, interleaved, true, {3, -1}});
      // Narrow: split-K; a row past the cache (the error flag).
      RopeEpilogueRuns({t, 2, 4096, 2, 1, 64, interleaved, false, {kRopeSeq, 15}});
      RopeEpilogueRuns({t, 1, 4096, 2, 1, 64, interleaved, true, {0}});
      // d 128 and d 16 (one and eight blocks per head half), odd K (scalar loads), M > 8
      // (a second launch that writes slots 8 and 9).
      RopeEpilogueRuns({t, 2, 512, 4, 2, 128, interleaved, false, {5, 9}});
      RopeEpilogueRuns({t, 10, 130, 4, 2, 16, interleaved, true,
                        {1, -1, 2, 3, 15, 0, 4, -1, 6, 11}});
    }
  }
}

TEST(FusedMatmulRopeTest, HeadDimNotAMultipleOfFourIsRefused) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  GraphBuilder b;
  const DType t = DType::kBF16;
  ops::Rope rope{.head_dim = 6};
  b.Output("q", b.FusedMatMul(
                    {.weights = 3, .epilogue = Epilogue::kRopeKvWrite, .rope = rope},
                    {b.Input("x", t, {1, 64}), b.Weight("wq", t, {12, 64}),
                     b.Weight("wk", t, {6, 64}), b.Weight("wv", t, {6, 64}),
                     b.Input("pos", DType::kI32, {1}), b.State("kc", t, {1, 1, 8, 6}),
                     b.State("vc", t, {1, 1, 8, 6})}));
  absl::StatusOr<Graph> graph = std::move(b).Build();
  ASSERT_TRUE(graph.ok()) << graph.status();
  absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(graph));
  ASSERT_TRUE(plan.ok()) << plan.status();
  CudaDispatch::Options options;
  options.cuda = CudaOptionsFromTestEnvironment();
  absl::StatusOr<std::unique_ptr<CudaDispatch>> gpu = CudaDispatch::Create(options);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<PreparedPlan> prepared = (*gpu)->Prepare(*plan);
  ASSERT_FALSE(prepared.ok());
  EXPECT_EQ(prepared.status().code(), absl::StatusCode::kUnimplemented) << prepared.status();
  EXPECT_NE(prepared.status().message().find("head_dim"), std::string::npos)
      << prepared.status();
  // What the passes ask before making such a node says so too.
  const Node& node = plan->graph().nodes()[0];
  std::vector<const Tensor*> inputs;
  for (TensorId in : node.inputs) inputs.push_back(&plan->graph().tensor(in));
  EXPECT_FALSE((*gpu)->Supports(node.op, inputs));
}

}  // namespace
}  // namespace sg::testing
