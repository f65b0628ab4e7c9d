// What the op-conformance table cannot reach: the kernels' fallbacks for buffers that are
// not 16-byte aligned (every tensor there is bound at an aligned address), cuBLASLt's
// element-aligned algorithm, and how MatmulRunner picks a matmul path (the policy parsed
// from STEPGRAPH_MATMUL, then per shape), programmatic dependent launch between dependent
// kernels, and that each dispatcher launches as its own options say; and what CUDA says it
// runs (CudaSupport), host side. GPU cases GTEST_SKIP without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_handles.h"
#include "dispatch/cuda/cuda_status.h"
#include "dispatch/cuda/codegen.h"
#include "dispatch/cuda/matmul.h"
#include "kernels/attention.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/launch.h"
#include "stepgraph/base/half.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/dispatch/cpu_dispatch.h"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/graph/passes.h"
#include "stepgraph/models/llama.h"
#include "tests/testing/conformance.h"
#include "tests/testing/quantized_config.h"
#include "tests/testing/util.h"

namespace sg::testing {
namespace {

// The current device's compute capability major (9 on Hopper); 0 when it cannot be read.
int ComputeCapabilityMajor() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    return 0;
  }
  return major;
}

// The edges of a captured graph, and how many of them are programmatic (the kernel after
// may launch while the one before drains).
struct EdgeCount {
  int all = 0;
  int programmatic = 0;
};
EdgeCount CountEdges(cudaGraph_t graph) {
  size_t edges = 0;
  EXPECT_EQ(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges), cudaSuccess);
  std::vector<cudaGraphNode_t> from(edges), to(edges);
  std::vector<cudaGraphEdgeData> data(edges);
  EXPECT_EQ(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &edges), cudaSuccess);
  EdgeCount count;
  count.all = static_cast<int>(edges);
  for (const cudaGraphEdgeData& d : data) {
    count.programmatic += d.type == cudaGraphDependencyTypeProgrammatic ? 1 : 0;
  }
  return count;
}

// A chain of dependent Adds, each reading the previous one's output and overwriting the
// buffer the one before it read, captured and replayed: on sm_90 the edges are
// programmatic (each kernel may launch while the previous runs), and the result must be
// exactly the sequential one, which it would not be if a kernel touched memory before its
// prerequisite finished.
TEST(ProgrammaticLaunchTest, DependentKernelsSeeTheirPrerequisitesWrites) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  const int major = ComputeCapabilityMajor();
  ASSERT_GT(major, 0);
  const bool wanted = CudaOptionsFromTestEnvironment().programmatic_launch;
  const bool expect = major >= 9 && wanted;
  EXPECT_EQ(kernels::ProgrammaticLaunchSupported(), major >= 9);

  constexpr int64_t kN = 1 << 16;
  constexpr int kSteps = 200;
  HostTensor a(DType::kF32, Shape{kN}), b(DType::kF32, Shape{kN});
  a.FillUniform(11);
  b.FillUniform(12);
  std::vector<float> want(static_cast<const float*>(a.data()),
                          static_cast<const float*>(a.data()) + kN);
  for (int s = 0; s < kSteps; ++s) {
    for (int64_t i = 0; i < kN; ++i) want[i] += static_cast<const float*>(b.data())[i];
  }
  absl::StatusOr<DeviceMemory> da = AllocateDevice(kN * 4, "a"), db = AllocateDevice(kN * 4, "b"),
                               ping = AllocateDevice(kN * 4, "ping"),
                               pong = AllocateDevice(kN * 4, "pong");
  ASSERT_TRUE(da.ok() && db.ok() && ping.ok() && pong.ok());
  ASSERT_EQ(cudaMemcpy(da->get(), a.data(), kN * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(db->get(), b.data(), kN * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(ping->get(), 0xFF, kN * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(pong->get(), 0xFF, kN * 4), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  absl::StatusOr<UniqueStream> stream = CreateStream("programmatic launch test");
  ASSERT_TRUE(stream.ok());
  cudaStream_t s = stream->get();
  const kernels::Stream launch(s, wanted);

  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaError_t launched =
      kernels::LaunchAdd(da->get(), db->get(), ping->get(), kN, DType::kF32, launch);
  void* in = ping->get();
  void* out = pong->get();
  for (int step = 1; step < kSteps && launched == cudaSuccess; ++step) {
    launched = kernels::LaunchAdd(in, db->get(), out, kN, DType::kF32, launch);
    std::swap(in, out);
  }
  cudaGraph_t raw = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &raw), cudaSuccess);
  UniqueGraph graph(raw);
  ASSERT_EQ(launched, cudaSuccess);

  const EdgeCount edges = CountEdges(graph.get());
  ASSERT_EQ(edges.all, kSteps - 1);
  EXPECT_EQ(edges.programmatic, expect ? kSteps - 1 : 0);

  cudaGraphExec_t exec_raw = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec_raw, graph.get(), 0), cudaSuccess);
  UniqueGraphExec exec(exec_raw);
  for (int replay = 0; replay < 3; ++replay) {
    ASSERT_EQ(cudaGraphLaunch(exec.get(), s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    std::vector<float> got(kN);
    ASSERT_EQ(cudaMemcpy(got.data(), in, kN * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(got, want) << "replay " << replay;
  }
}


// Host side, no device: the launch a kernels::Stream asks for. Programmatic serialisation
// is set only when the caller allows it and the kernels and device can take it, and a
// bare stream (the C ABI's, the benchmarks') allows it.
TEST(ProgrammaticLaunchTest, LaunchConfigFollowsTheCallersStream) {
  cudaStream_t s = reinterpret_cast<cudaStream_t>(uintptr_t{0x1000});
  for (bool allowed : {true, false}) {
    for (bool supported : {true, false}) {
      cudaLaunchAttribute attribute{};
      const cudaLaunchConfig_t c = kernels::MakeLaunchConfig(
          dim3(3), dim3(64), 128, kernels::Stream(s, allowed), supported, &attribute);
      EXPECT_EQ(c.numAttrs, allowed && supported ? 1u : 0u) << allowed << supported;
      EXPECT_EQ(c.stream, s);
      EXPECT_EQ(c.gridDim.x, 3u);
      EXPECT_EQ(c.blockDim.x, 64u);
      EXPECT_EQ(c.dynamicSmemBytes, 128u);
      EXPECT_EQ(c.attrs, &attribute);
      EXPECT_EQ(attribute.id, cudaLaunchAttributeProgrammaticStreamSerialization);
    }
  }
  const kernels::Stream bare = s;
  EXPECT_TRUE(bare.programmatic);
  EXPECT_EQ(bare.stream, s);
}

// Programmatic edges of the graph captured from one eager pass of `prepared` on
// `dispatch`'s stream, and all its edges.
std::pair<int, int> CapturedEdges(CudaDispatch& dispatch, const PreparedPlan& prepared,
                                  const Bindings& bindings) {
  cudaStream_t s = dispatch.stream();
  EXPECT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::StatusOr<ExecStats> ran = Execute(prepared, bindings, dispatch);
  cudaGraph_t raw = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &raw), cudaSuccess);
  UniqueGraph graph(raw);
  EXPECT_TRUE(ran.ok()) << ran.status();
  const EdgeCount edges = CountEdges(graph.get());
  return {edges.programmatic, edges.all};
}

// CudaOptions::programmatic_launch belongs to its dispatcher: two dispatchers of one
// process with different settings each launch as their own option says, whichever was made
// last. The step chains stepgraph's kernels (Add, the small-M matmul, Silu) and a kernel
// compiled through NVRTC (RmsNorm with compiled_norm), each reading the previous result.
TEST(ProgrammaticLaunchTest, EachDispatcherLaunchesAsItsOwnOptionSays) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  const int major = ComputeCapabilityMajor();
  ASSERT_GT(major, 0);
  GraphBuilder b;
  const Shape shape{4, 256};
  const TensorId x = b.Input("x", DType::kF32, shape), r = b.Input("r", DType::kF32, shape);
  const TensorId normed = b.RmsNorm(b.Add(x, r, "add0"), b.Weight("w", DType::kF32, {256}),
                                    1e-5f, "norm");
  const TensorId y = b.MatMul(b.Add(normed, r, "add1"), b.Weight("wm", DType::kF32, {256, 256}),
                              "mm");
  b.Output("y", b.Silu(y, "silu"));
  absl::StatusOr<Graph> graph = std::move(b).Build();
  ASSERT_TRUE(graph.ok()) << graph.status();
  absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(graph));
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<DeviceMemory> buffers;
  Bindings bindings(plan->graph());
  for (const Tensor& t : plan->graph().tensors()) {
    if (t.kind == TensorKind::kIntermediate) continue;
    absl::StatusOr<DeviceMemory> m = AllocateDevice(t.bytes(), "a bound tensor");
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(bindings.Bind(t.name, m->get(), t.bytes()).ok());
    buffers.push_back(*std::move(m));
  }
  absl::StatusOr<DeviceMemory> arena = AllocateDevice(plan->arena_bytes(), "the arena");
  ASSERT_TRUE(arena.ok()) << arena.status();
  bindings.SetArena(arena->get(), plan->arena_bytes());

  auto make = [](bool programmatic) {
    CudaDispatch::Options o;
    o.cuda.programmatic_launch = programmatic;
    o.cuda.compiled_norm = true;
    o.cuda.matmul = MatmulPolicy::kGemv;
    return CudaDispatch::Create(o);
  };
  absl::StatusOr<std::unique_ptr<CudaDispatch>> on = make(true);
  ASSERT_TRUE(on.ok()) << on.status();
  absl::StatusOr<std::unique_ptr<CudaDispatch>> off = make(false);
  ASSERT_TRUE(off.ok()) << off.status();
  absl::StatusOr<PreparedPlan> on_plan = (*on)->Prepare(*plan);
  absl::StatusOr<PreparedPlan> off_plan = (*off)->Prepare(*plan);
  ASSERT_TRUE(on_plan.ok()) << on_plan.status();
  ASSERT_TRUE(off_plan.ok()) << off_plan.status();
  const int kEdges = 4;  // add0 -> norm -> add1 -> mm -> silu
  const int expect_on = major >= 9 ? kEdges : 0;
  EXPECT_EQ(CapturedEdges(**on, *on_plan, bindings), std::make_pair(expect_on, kEdges))
      << "made before the dispatcher without programmatic launch";
  EXPECT_EQ(CapturedEdges(**off, *off_plan, bindings), std::make_pair(0, kEdges));
  // A third dispatcher, made last and asking for it, changes neither.
  absl::StatusOr<std::unique_ptr<CudaDispatch>> later = make(true);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(CapturedEdges(**off, *off_plan, bindings), std::make_pair(0, kEdges));
  EXPECT_EQ(CapturedEdges(**on, *on_plan, bindings), std::make_pair(expect_on, kEdges));
}

// The decode attention grid's chunks (host side): enough blocks for 4 a multiprocessor (2
// for f32 rows of 128 in head tiles of 8, whose kernel holds three), at least 64 keys a
// chunk at the cache's length, 16 where a chunk has fewer than 8 blocks (rows · KV heads ·
// head tiles) and there, above 8, a multiple of 8 (a thread block cluster's chunks), at
// most kAttentionMaxChunks.
TEST(AttentionChunksTest, GridFollowsBlocksPerChunkAndCacheLength) {
  using kernels::AttentionShape;
  using kernels::ChooseAttentionChunks;
  constexpr DType kBf16 = DType::kBF16, kF32 = DType::kF32;
  // Qwen3-30B-A3B at batch 1: 4 KV heads, a group of 8 in one tile: 4 blocks a chunk.
  const AttentionShape moe{.rows = 1, .heads = 32, .kv_heads = 4, .seq_len = 241, .head_dim = 128};
  EXPECT_EQ(ChooseAttentionChunks(moe, kBf16, 132), 16);  // ceil(241 / 16)
  EXPECT_EQ(ChooseAttentionChunks(moe, kF32, 132), 16);
  AttentionShape moe_long = moe;
  moe_long.seq_len = 4096;
  EXPECT_EQ(ChooseAttentionChunks(moe_long, kBf16, 132), 136);  // 528 blocks / 4, to 8s
  EXPECT_EQ(kernels::AttentionBlocksPerSm(moe_long, kF32), 2);
  EXPECT_EQ(ChooseAttentionChunks(moe_long, kF32, 132), 72);  // 264 blocks / 4, to 8s
  // Llama-3.2-1B at batch 1: 8 KV heads, a group of 4: 8 blocks a chunk keep 64 keys.
  const AttentionShape dense{.rows = 1, .heads = 32, .kv_heads = 8, .seq_len = 241, .head_dim = 64};
  EXPECT_EQ(ChooseAttentionChunks(dense, kBf16, 132), 4);  // ceil(241 / 64)
  AttentionShape dense_long = dense;
  dense_long.seq_len = 8192;
  EXPECT_EQ(ChooseAttentionChunks(dense_long, kBf16, 132), 66);  // 528 blocks / 8
  // f32 in head tiles of 4 holds four blocks an SM as bf16 does.
  EXPECT_EQ(kernels::AttentionBlocksPerSm(dense_long, kF32), 4);
  EXPECT_EQ(ChooseAttentionChunks(dense_long, kF32, 132), 66);
  // Many blocks a chunk: the device is filled with few chunks.
  AttentionShape batch = dense_long;
  batch.rows = 16;
  EXPECT_EQ(ChooseAttentionChunks(batch, kBf16, 132), 5);  // ceil(528 / 128)
  // Capped: one KV head of one row on a large device.
  const AttentionShape one{.rows = 1, .heads = 1, .kv_heads = 1, .seq_len = 65536, .head_dim = 64};
  EXPECT_EQ(ChooseAttentionChunks(one, kBf16, 132), kernels::kAttentionMaxChunks);
  EXPECT_EQ(ChooseAttentionChunks(one, kBf16, 132, 8), 8);
  // Never more chunks than bf16's (the C ABI's workspace query sizes with those).
  for (const AttentionShape& s : {moe, moe_long, dense, dense_long, batch, one}) {
    for (DType t : {DType::kF32, DType::kF16}) {
      EXPECT_LE(ChooseAttentionChunks(s, t, 132), ChooseAttentionChunks(s, kBf16, 132));
    }
  }
}

// Decode attention merges a row's chunks within thread block clusters (sm_90;
// AttentionClusters::kAlways). Against the merge of every chunk through the workspace
// (kNever), on the same
// random inputs: grids of 8, 7, 66 and 72 chunks (clusters of 8, 7, 6 and 8), rows at
// positions where one cluster holds every taking-part chunk (100 and 128 at 16 keys a
// chunk), where the last taking-part cluster holds keyless blocks (129 of 8-chunk
// clusters; 100 of 6-chunk ones), where many clusters meet in the workspace (1,000,
// 4,095), one chunk alone (16) and a padding row (-1), in f32 rows of 128 (Qwen3-MoE's
// heads, eight to a block) and bf16 rows of 64 (the 1B's, four). The sums meet in another
// order, so the outputs agree to f32's rounding (bf16: to its own); the output is poisoned
// before each launch.
TEST(AttentionClustersTest, ClusterMergeMatchesTheWorkspaceMerge) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  if (ComputeCapabilityMajor() < 9) GTEST_SKIP() << "thread block clusters need sm_90";
  struct Shape {
    DType dtype;
    int heads, kv_heads, head_dim;
    double tolerance;
  };
  const std::vector<int32_t> positions = {100, 128, 129, -1, 1000, 4095, 16};
  const int rows = static_cast<int>(positions.size());
  constexpr int kSeq = 4096;
  auto device = [](size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    return std::unique_ptr<void, cudaError_t (*)(void*)>(p, cudaFree);
  };
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (const Shape& shape : {Shape{DType::kF32, 32, 4, 128, 1e-6}, Shape{DType::kBF16, 32, 8, 64, 2e-3}}) {
    const kernels::AttentionShape as{.rows = rows, .heads = shape.heads, .kv_heads = shape.kv_heads,
                                     .seq_len = kSeq, .head_dim = shape.head_dim};
    const size_t elem = DTypeBytes(shape.dtype);
    const int64_t q_elems = int64_t{rows} * shape.heads * shape.head_dim;
    const int64_t cache_elems = int64_t{rows} * shape.kv_heads * kSeq * shape.head_dim;
    auto random_bytes = [&](int64_t n) {
      std::vector<uint8_t> bytes(static_cast<size_t>(n) * elem);
      for (int64_t i = 0; i < n; ++i) StoreElement(bytes.data(), shape.dtype, i, value(rng));
      return bytes;
    };
    auto q = device(q_elems * elem), k = device(cache_elems * elem), v = device(cache_elems * elem);
    auto out = device(q_elems * elem), pos = device(positions.size() * 4), flags = device(4);
    ASSERT_TRUE(q && k && v && out && pos && flags);
    for (auto* buffer : {&q, &k, &v}) {
      const std::vector<uint8_t> bytes =
          random_bytes(buffer == &q ? q_elems : cache_elems);
      ASSERT_EQ(cudaMemcpy(buffer->get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    ASSERT_EQ(cudaMemcpy(pos.get(), positions.data(), positions.size() * 4, cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemset(flags.get(), 0, 4), cudaSuccess);
    for (const int chunks : {8, 7, 66, 72}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(shape.dtype) << " chunks " << chunks);
      const int64_t ws_bytes = kernels::AttentionWorkspaceBytes(as, chunks);
      auto ws = device(static_cast<size_t>(ws_bytes));
      ASSERT_TRUE(ws);
      ASSERT_EQ(cudaMemset(ws.get(), 0, static_cast<size_t>(ws_bytes)), cudaSuccess);
      std::vector<float> got[2];
      for (const bool clusters : {false, true}) {
        ASSERT_EQ(cudaMemset(out.get(), 0xff, q_elems * elem), cudaSuccess);  // NaN
        kernels::AttentionArgs a;
        a.q = q.get();
        a.k_cache = k.get();
        a.v_cache = v.get();
        a.pos = static_cast<const int32_t*>(pos.get());
        a.out = out.get();
        a.scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
        a.workspace = ws.get();
        a.error_flags = static_cast<uint32_t*>(flags.get());
        a.clusters = clusters ? kernels::AttentionClusters::kAlways
                              : kernels::AttentionClusters::kNever;
        ASSERT_EQ(kernels::LaunchAttention(a, as, chunks, shape.dtype, kernels::Stream{}),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<uint8_t> bytes(static_cast<size_t>(q_elems) * elem);
        ASSERT_EQ(cudaMemcpy(bytes.data(), out.get(), bytes.size(), cudaMemcpyDeviceToHost),
                  cudaSuccess);
        got[clusters].resize(static_cast<size_t>(q_elems));
        for (int64_t i = 0; i < q_elems; ++i) got[clusters][i] = LoadElement(bytes.data(), shape.dtype, i);
      }
      // Every element written (the padding row with zeros), and the two merges agree.
      for (int c = 0; c < 2; ++c) {
        for (float x : got[c]) ASSERT_TRUE(std::isfinite(x)) << "clusters " << c;
      }
      const int64_t row_elems = q_elems / rows;
      for (int64_t i = 3 * row_elems; i < 4 * row_elems; ++i) ASSERT_EQ(got[1][i], 0.0f);
      EXPECT_LE(NormalizedError(got[1], got[0]), shape.tolerance);
    }
    uint32_t raised = 1;
    ASSERT_EQ(cudaMemcpy(&raised, flags.get(), 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(raised, 0u);
  }
}

// The fused kernel's block bound is one of the instantiations there are (0, 5, 6); any
// other value is refused by name when the dispatcher is made.
TEST(CudaDispatchTest, FusedMinBlocksOutsideTheCompiledOnesIsRefused) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  for (const int blocks : {0, 5, 6}) {
    CudaDispatch::Options o;
    o.cuda.fused_float_min_blocks = blocks;
    EXPECT_TRUE(CudaDispatch::Create(o).ok()) << blocks;
  }
  for (const int blocks : {-1, 1, 4, 7, 8}) {
    CudaDispatch::Options o;
    o.cuda.fused_float_min_blocks = blocks;
    const absl::Status s = CudaDispatch::Create(o).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << blocks;
    EXPECT_NE(s.message().find("fused_float_min_blocks"), absl::string_view::npos) << s;
  }
}

TEST(MatmulRunnerTest, PathFollowsPolicyAndShape) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  using internal::MatmulPath;
  using internal::MatmulRunner;
  using internal::MatmulShape;
  const MatmulShape decode{1, 512, 256, DType::kBF16, false};
  const MatmulShape batch8{8, 512, 256, DType::kBF16, true};
  const MatmulShape prefill{16, 512, 256, DType::kBF16, false};
  struct Want {
    MatmulPolicy policy;
    MatmulPath decode, batch8, prefill;
  };
  for (const Want& w : {Want{MatmulPolicy::kAuto, MatmulPath::kGemv, MatmulPath::kGemv,
                             MatmulPath::kCublasLt},
                        Want{MatmulPolicy::kCublasLt, MatmulPath::kCublasLt,
                             MatmulPath::kCublasLt, MatmulPath::kCublasLt},
                        Want{MatmulPolicy::kGemv, MatmulPath::kGemv, MatmulPath::kGemv,
                             MatmulPath::kCublasLt}}) {
    SCOPED_TRACE(static_cast<int>(w.policy));
    absl::StatusOr<std::unique_ptr<MatmulRunner>> runner =
        MatmulRunner::Create(CudaDeviceInfo{}, 1 << 20, w.policy);
    ASSERT_TRUE(runner.ok()) << runner.status();
    EXPECT_EQ((*runner)->PathFor(decode).status().code(), absl::StatusCode::kNotFound);
    for (const MatmulShape& s : {decode, batch8, prefill}) {
      ASSERT_TRUE((*runner)->Prepare(s).ok());
    }
    EXPECT_EQ(*(*runner)->PathFor(decode), w.decode);
    EXPECT_EQ(*(*runner)->PathFor(batch8), w.batch8);
    EXPECT_EQ(*(*runner)->PathFor(prefill), w.prefill);
  }
  // The automatic choice by shape: the small-M kernel for one or two rows, and up to eight
  // for narrow outputs only.
  absl::StatusOr<std::unique_ptr<MatmulRunner>> automatic =
      MatmulRunner::Create(CudaDeviceInfo{}, 1 << 20, MatmulPolicy::kAuto);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  struct ByShape {
    MatmulShape shape;
    MatmulPath path;
  };
  for (const ByShape& c : {ByShape{{2, 8192, 2048, DType::kBF16, false}, MatmulPath::kGemv},
                           ByShape{{4, 8192, 2048, DType::kBF16, false}, MatmulPath::kCublasLt},
                           ByShape{{4, 512, 2048, DType::kBF16, false}, MatmulPath::kGemv},
                           ByShape{{8, 2048, 2048, DType::kBF16, false}, MatmulPath::kCublasLt}}) {
    SCOPED_TRACE(::testing::Message() << "M=" << c.shape.m << " N=" << c.shape.n);
    ASSERT_TRUE((*automatic)->Prepare(c.shape).ok());
    EXPECT_EQ(*(*automatic)->PathFor(c.shape), c.path);
  }
}

// A Run whose node carries no prepared state, or one of another type (a plan executed
// without the PreparedPlan CudaDispatch made), is refused before anything is launched.
TEST(CudaDispatchTest, NodeNotPreparedIsFailedPrecondition) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<std::unique_ptr<CudaDispatch>> gpu = CudaDispatch::Create();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::vector<TensorArg> inputs(2);
  inputs[0].dtype = inputs[1].dtype = DType::kF32;
  inputs[0].shape = Shape{2, 64};
  inputs[1].shape = Shape{32, 64};
  NodeArgs args;
  args.inputs = absl::MakeConstSpan(inputs);
  args.output.shape = Shape{2, 32};
  const absl::Status s = (*gpu)->Run(ops::MatMul{}, args);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("prepared"), absl::string_view::npos) << s;
  EXPECT_EQ((*gpu)->Run(ops::Attention{0.125f}, args).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*gpu)->Run(ops::Argmax{}, args).code(), absl::StatusCode::kFailedPrecondition);
  // A state of another type (another dispatcher's, another op's) is refused the same way.
  struct OtherState final : PreparedState<OtherState> {};
  const OtherState other;
  args.prepared = &other;
  const absl::Status wrong = (*gpu)->Run(ops::MatMul{}, args);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kFailedPrecondition) << wrong;
  EXPECT_NE(wrong.message().find("not of the type"), absl::string_view::npos) << wrong;
  EXPECT_EQ((*gpu)->Run(ops::RmsNorm{}, args).code(), absl::StatusCode::kFailedPrecondition);
}

// One node run on the CPU reference and on CudaDispatch with every device buffer placed
// `offset` bytes past an aligned address.
struct MisalignedCase {
  std::string name;
  std::function<void(GraphBuilder&)> build;
  int64_t offset = 2;
  MatmulPolicy matmul_policy = MatmulPolicy::kAuto;
  double tolerance = 1e-2;
  int32_t int_hi = 16;
};

// Names the case in test listings instead of a dump of its bytes.
void PrintTo(const MisalignedCase& c, std::ostream* os) { *os << c.name; }

void RunMisaligned(const MisalignedCase& c) {
  GraphBuilder builder;
  c.build(builder);
  absl::StatusOr<Graph> graph = std::move(builder).Build();
  ASSERT_TRUE(graph.ok()) << graph.status();
  absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(graph));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const Graph& g = plan->graph();
  ASSERT_EQ(g.num_nodes(), 1);
  const Node& node = g.nodes()[0];

  std::vector<int32_t> tensors;
  for (TensorId id : node.inputs) tensors.push_back(id.index);
  if (std::find(tensors.begin(), tensors.end(), node.output.index) == tensors.end()) {
    tensors.push_back(node.output.index);
  }
  std::map<int32_t, HostTensor> cpu;
  for (int32_t t : tensors) {
    const Tensor& tensor = g.tensors()[t];
    HostTensor h(tensor.dtype, tensor.shape);
    if (tensor.kind == TensorKind::kIntermediate) {
      h.Poison();
    } else if (tensor.dtype == DType::kI32) {
      h.FillUniform(100 + t, 0.0f, static_cast<float>(c.int_hi));
    } else {
      h.FillUniform(100 + t, -2.0f, 2.0f);
    }
    cpu.emplace(t, std::move(h));
  }

  // Device copies of the same contents (the poisoned output included), misaligned.
  absl::StatusOr<UniqueStream> stream = CreateStream("test");
  ASSERT_TRUE(stream.ok()) << stream.status();
  std::map<int32_t, DeviceMemory> device;
  std::map<int32_t, void*> address;
  for (int32_t t : tensors) {
    const HostTensor& h = cpu.at(t);
    absl::StatusOr<DeviceMemory> mem = AllocateDevice(h.bytes() + 64, "test buffer");
    ASSERT_TRUE(mem.ok()) << mem.status();
    // Misaligned for vector loads, but aligned to the tensor's own element (an i32 id
    // buffer at a 2-byte offset would be invalid for any caller).
    const int64_t elem = DTypeBytes(g.tensors()[t].dtype);
    void* p = static_cast<char*>(mem->get()) + (c.offset + elem - 1) / elem * elem;
    ASSERT_EQ(cudaMemcpy(p, h.data(), h.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    address[t] = p;
    device.emplace(t, *std::move(mem));
  }
  // The copies from pageable memory may still be landing; the dispatcher's stream does
  // not wait on the legacy stream.
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  auto make_args = [&](std::vector<TensorArg>& inputs, bool on_gpu) {
    auto arg = [&](int32_t t) {
      const Tensor& tensor = g.tensors()[t];
      TensorArg a;
      a.data = on_gpu ? address.at(t) : cpu.at(t).data();
      a.dtype = tensor.dtype;
      a.shape = tensor.shape;
      a.kind = tensor.kind;
      a.tensor = t;
      a.name = tensor.name;
      return a;
    };
    for (TensorId id : node.inputs) inputs.push_back(arg(id.index));
    NodeArgs args;
    args.node_name = node.name;
    args.inputs = absl::MakeConstSpan(inputs);
    args.output = arg(node.output.index);
    return args;
  };

  CpuDispatch reference;
  absl::StatusOr<PreparedPlan> cpu_prepared = reference.Prepare(*plan);
  ASSERT_TRUE(cpu_prepared.ok()) << cpu_prepared.status();
  std::vector<TensorArg> cpu_inputs;
  NodeArgs cpu_args = make_args(cpu_inputs, /*on_gpu=*/false);
  cpu_args.prepared = cpu_prepared->node(0);
  ASSERT_TRUE(
      std::visit([&](const auto& op) { return reference.Run(op, cpu_args); }, node.op).ok());

  CudaDispatch::Options options;
  options.stream = stream->get();
  options.cuda.matmul = c.matmul_policy;
  absl::StatusOr<std::unique_ptr<CudaDispatch>> gpu = CudaDispatch::Create(options);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<PreparedPlan> gpu_prepared = (*gpu)->Prepare(*plan);
  ASSERT_TRUE(gpu_prepared.ok()) << gpu_prepared.status();
  std::vector<TensorArg> gpu_inputs;
  NodeArgs gpu_args = make_args(gpu_inputs, /*on_gpu=*/true);
  gpu_args.prepared = gpu_prepared->node(0);
  const absl::Status run =
      std::visit([&](const auto& op) { return (*gpu)->Run(op, gpu_args); }, node.op);
  ASSERT_TRUE(run.ok()) << run;
  absl::StatusOr<uint32_t> flags = (*gpu)->TakeErrorFlags();
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(*flags, reference.TakeErrorFlags());

  const int32_t out = node.output.index;
  const HostTensor& want = cpu.at(out);
  HostTensor got(want.dtype(), want.shape());
  ASSERT_EQ(cudaMemcpy(got.data(), address.at(out), got.bytes(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_LE(NormalizedError(got.ToFloat(), want.ToFloat()), c.tolerance);
}

class MisalignedTest : public ::testing::TestWithParam<MisalignedCase> {};

TEST_P(MisalignedTest, MatchesReference) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  RunMisaligned(GetParam());
}

std::vector<MisalignedCase> MisalignedCases() {
  std::vector<MisalignedCase> cases;
  for (MatmulPolicy policy : {MatmulPolicy::kCublasLt, MatmulPolicy::kGemv}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      const int64_t offset = DTypeBytes(t);
      cases.push_back({.name = absl::StrCat("MatMul_", MatmulPolicyName(policy), "_", DTypeName(t)),
                       .build = [=](GraphBuilder& b) {
                         b.Output("y", b.MatMul(b.Input("x", t, {4, 256}),
                                                b.Weight("w", t, {96, 256}),
                                                b.Weight("bias", t, {96})));
                       },
                       .offset = offset,
                       .matmul_policy = policy,
                       .tolerance = t == DType::kF32 ? 1e-5 : 1e-2});
    }
  }
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    const int64_t offset = DTypeBytes(t);
    const double tol = t == DType::kF32 ? 1e-5 : 1e-2;
    const std::string dt(DTypeName(t));
    cases.push_back({.name = "RmsNorm_" + dt,
                     .build = [=](GraphBuilder& b) {
                       b.Output("y", b.RmsNorm(b.Input("x", t, {3, 512}),
                                               b.Weight("w", t, {512}), 1e-5f));
                     },
                     .offset = offset,
                     .tolerance = tol});
    cases.push_back({.name = "Add_" + dt,
                     .build = [=](GraphBuilder& b) {
                       b.Output("y", b.Add(b.Input("a", t, {5, 1000}), b.Input("b", t, {5, 1000})));
                     },
                     .offset = offset,
                     .tolerance = tol});
    cases.push_back({.name = "SiluMul_" + dt,
                     .build = [=](GraphBuilder& b) {
                       b.Output("y", b.SiluMul(b.Input("g", t, {2, 777}), b.Input("u", t, {2, 777})));
                     },
                     .offset = offset,
                     .tolerance = tol});
    cases.push_back({.name = "Softmax_" + dt,
                     .build = [=](GraphBuilder& b) {
                       b.Output("y", b.Softmax(b.Input("x", t, {2, 4096})));
                     },
                     .offset = offset,
                     .tolerance = tol});
    cases.push_back({.name = "Embedding_" + dt,
                     .build = [=](GraphBuilder& b) {
                       b.Output("y", b.Embedding(b.Weight("table", t, {100, 256}),
                                                 b.Input("ids", DType::kI32, {3})));
                     },
                     .offset = offset,
                     .tolerance = 0.0,
                     .int_hi = 100});
    cases.push_back({.name = "KvWrite_" + dt,
                     .build = [=](GraphBuilder& b) {
                       b.KvWrite(b.Input("kv", t, {3, 4 * 64}), b.Input("pos", DType::kI32, {3}),
                                 b.State("cache", t, {3, 4, 32, 64}));
                     },
                     .offset = offset,
                     .tolerance = 0.0,
                     .int_hi = 32});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Kernels, MisalignedTest, ::testing::ValuesIn(MisalignedCases()),
                         [](const ::testing::TestParamInfo<MisalignedCase>& info) {
                           return info.param.name;
                         });

// ---- What CUDA says it runs: answered on the host, without a device (CI) ---------------

Tensor Make(const char* name, TensorKind kind, DType dtype, Shape shape) {
  return Tensor{name, kind, dtype, std::move(shape)};
}

bool Asks(const OpSupport& support, const Op& op, const std::vector<Tensor>& inputs) {
  std::vector<const Tensor*> p;
  for (const Tensor& t : inputs) p.push_back(&t);
  return support.Supports(op, p);
}

TEST(CudaSupportTest, FusedMatMulLimitsWithoutADevice) {
  const CudaSupport cuda;
  const int64_t rows = 3, k = 64, kvh = 2, h = 4;
  auto qkv = [&](int64_t d, DType w_dtype) {
    return std::vector<Tensor>{
        Make("x", TensorKind::kInput, DType::kF32, {rows, k}),
        Make("wq", TensorKind::kWeight, w_dtype, {h * d, k}),
        Make("wk", TensorKind::kWeight, w_dtype, {kvh * d, k}),
        Make("wv", TensorKind::kWeight, w_dtype, {kvh * d, k}),
        Make("pos", TensorKind::kInput, DType::kI32, {rows}),
        Make("kc", TensorKind::kState, DType::kF32, {rows, kvh, 8, d}),
        Make("vc", TensorKind::kState, DType::kF32, {rows, kvh, 8, d})};
  };
  auto epilogue = [](int32_t d) {
    return ops::FusedMatMul{.weights = 3,
                            .epilogue = ops::FusedMatMul::Epilogue::kRopeKvWrite,
                            .rope = {.head_dim = d, .theta = 10000.0f}};
  };
  // The rope_kv_write epilogue: a block's four columns must hold whole RoPE pairs.
  EXPECT_FALSE(Asks(cuda, epilogue(6), qkv(6, DType::kF32))) << "head_dim 6";
  EXPECT_FALSE(Asks(cuda, epilogue(10), qkv(10, DType::kF32))) << "head_dim 10";
  EXPECT_TRUE(Asks(cuda, epilogue(8), qkv(8, DType::kF32))) << "head_dim 8";
  // The same nodes as RopeKvWrite after a grouped product: any even head_dim.
  const ops::Rope rope6{.head_dim = 6, .theta = 10000.0f};
  std::vector<Tensor> rkw = qkv(6, DType::kF32);
  const std::vector<Tensor> rope_inputs = {
      Make("qkv", TensorKind::kIntermediate, DType::kF32, {rows, (h + 2 * kvh) * 6}), rkw[4],
      rkw[5], rkw[6]};
  EXPECT_TRUE(Asks(cuda, ops::RopeKvWrite{rope6}, rope_inputs));

  // Block-format weights: the plain MatMul and the fused kernel; never float and block
  // weights in one fused op.
  const std::vector<Tensor> quant = {Make("x", TensorKind::kInput, DType::kF32, {rows, k}),
                                     Make("w", TensorKind::kWeight, DType::kQ8_0, {96, k})};
  EXPECT_TRUE(Asks(cuda, ops::MatMul{}, quant));
  EXPECT_TRUE(Asks(cuda, ops::FusedMatMul{}, quant));
  EXPECT_FALSE(Asks(cuda, ops::FusedMatMul{.weights = 2},
                    {quant[0], quant[1], Make("w2", TensorKind::kWeight, DType::kF32, {96, k})}));
  const std::vector<Tensor> plain = {Make("x", TensorKind::kInput, DType::kBF16, {rows, k}),
                                     Make("w", TensorKind::kWeight, DType::kBF16, {96, k})};
  EXPECT_TRUE(Asks(cuda, ops::FusedMatMul{}, plain));
  EXPECT_TRUE(Asks(cuda, ops::FusedMatMul{.norm = true},
                   {plain[0], Make("nw", TensorKind::kWeight, DType::kBF16, {k}), plain[1]}));
  // A node the graph itself refuses (an input missing) is not one CUDA runs.
  EXPECT_FALSE(Asks(cuda, ops::FusedMatMul{.weights = 2}, plain));

  // The compiled RmsNorm takes hidden sizes up to its limit; the built-in kernel any.
  const std::vector<Tensor> wide = {
      Make("x", TensorKind::kInput, DType::kBF16, {2, codegen::kMaxRmsNormHidden + 64}),
      Make("w", TensorKind::kWeight, DType::kBF16, {codegen::kMaxRmsNormHidden + 64})};
  EXPECT_TRUE(Asks(cuda, ops::RmsNorm{}, wide));
  CudaOptions compiled;
  compiled.compiled_norm = true;
  EXPECT_FALSE(Asks(CudaSupport(compiled), ops::RmsNorm{}, wide));
}

// The passes asking CUDA's answer: the head_dim 6 step keeps its RopeKvWrite nodes and a
// head_dim 8 step gets every fusion; without a backend (the CPU reference's answer) both
// are fused. Block-format weights are fused as on the CPU, but for gate and up in two
// formats, which the kernel's silu_mul blocks cannot pair.
TEST(CudaSupportTest, PassesMakeOnlyWhatCudaRuns) {
  const CudaSupport cuda;
  PassOptions for_cuda;
  for_cuda.backend = &cuda;
  auto count = [](const Graph& g, absl::string_view op) {
    int n = 0;
    for (const Node& node : g.nodes()) n += OpName(node.op) == op;
    return n;
  };
  auto rope_epilogues = [](const Graph& g) {
    int n = 0;
    for (const Node& node : g.nodes()) {
      const auto* f = std::get_if<ops::FusedMatMul>(&node.op);
      n += f != nullptr && f->epilogue == ops::FusedMatMul::Epilogue::kRopeKvWrite;
    }
    return n;
  };
  LlamaGraphOptions o;
  o.max_seq = 32;
  o.closed_loop = true;
  for (int64_t d : {6, 8}) {
    LlamaConfig c = TinyLlamaConfig();
    c.head_dim = d;
    absl::StatusOr<Graph> plain = BuildLlamaDecodeGraph(c, o);
    ASSERT_TRUE(plain.ok()) << plain.status();
    absl::StatusOr<Graph> fused = RunPasses(*plain, for_cuda);
    ASSERT_TRUE(fused.ok()) << fused.status();
    const int layers = static_cast<int>(c.num_hidden_layers);
    EXPECT_EQ(rope_epilogues(*fused), d == 8 ? layers : 0) << "head_dim " << d;
    EXPECT_EQ(count(*fused, "RopeKvWrite"), d == 8 ? 0 : layers) << "head_dim " << d;
    absl::StatusOr<Graph> on_cpu = RunPasses(*plain);
    ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
    EXPECT_EQ(rope_epilogues(*on_cpu), layers) << "head_dim " << d;
  }
  LlamaConfig tiny = TinyLlamaConfig();
  tiny.intermediate_size = 704;  // whole Q8_0 blocks
  const LlamaConfig q = WithMatrixDTypes(tiny, [](const std::string& name) {
                          return absl::StrContains(name, "model.layers.") ? DType::kQ8_0
                                                                         : DType::kF32;
                        }).value();
  absl::StatusOr<Graph> quant = BuildLlamaDecodeGraph(q, o);
  ASSERT_TRUE(quant.ok()) << quant.status();
  absl::StatusOr<Graph> for_gpu = RunPasses(*quant, for_cuda);
  ASSERT_TRUE(for_gpu.ok()) << for_gpu.status();
  EXPECT_EQ(count(*for_gpu, "MatMul"), 0);
  EXPECT_EQ(rope_epilogues(*for_gpu), q.num_hidden_layers);
  absl::StatusOr<Graph> on_cpu = RunPasses(*quant);
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
  EXPECT_EQ(count(*on_cpu, "MatMul"), 0);

  auto silu_epilogues = [](const Graph& g) {
    int n = 0;
    for (const Node& node : g.nodes()) {
      const auto* f = std::get_if<ops::FusedMatMul>(&node.op);
      n += f != nullptr && f->epilogue == ops::FusedMatMul::Epilogue::kSiluMul;
    }
    return n;
  };
  const LlamaConfig split = WithMatrixDTypes(tiny, [](const std::string& name) {
                              if (absl::StrContains(name, "up_proj")) return DType::kQ4_0;
                              return absl::StrContains(name, "model.layers.") ? DType::kQ8_0
                                                                             : DType::kF32;
                            }).value();
  absl::StatusOr<Graph> split_graph = BuildLlamaDecodeGraph(split, o);
  ASSERT_TRUE(split_graph.ok()) << split_graph.status();
  absl::StatusOr<Graph> split_gpu = RunPasses(*split_graph, for_cuda);
  ASSERT_TRUE(split_gpu.ok()) << split_gpu.status();
  EXPECT_EQ(silu_epilogues(*split_gpu), 0);
  EXPECT_EQ(rope_epilogues(*split_gpu), split.num_hidden_layers);
  absl::StatusOr<Graph> split_cpu = RunPasses(*split_graph);
  ASSERT_TRUE(split_cpu.ok()) << split_cpu.status();
  EXPECT_EQ(silu_epilogues(*split_cpu), split.num_hidden_layers);
}

// MoeCombine with matmul (moe_down_into_combine) on CUDA: block-format experts or float
// ones of x's dtype, at any row count (the pass makes it at decode only), top_k up to 8.
TEST(CudaSupportTest, DownIntoCombineLimits) {
  auto inputs = [](int64_t rows, int64_t top_k, DType w_dtype) {
    return std::vector<Tensor>{
        Make("x", TensorKind::kInput, DType::kBF16, {rows, top_k * 768}),
        Make("logits", TensorKind::kInput, DType::kBF16, {rows, 128}),
        Make("ids", TensorKind::kInput, DType::kI32, {rows, top_k}),
        Make("w", TensorKind::kWeight, w_dtype, {128, 2048, 768})};
  };
  const ops::MoeCombine op{.route = true, .matmul = true};
  const CudaSupport cuda;
  EXPECT_TRUE(Asks(cuda, op, inputs(1, 8, DType::kQ6_K)));
  EXPECT_TRUE(Asks(cuda, op, inputs(4, 8, DType::kBF16)));
  EXPECT_TRUE(Asks(cuda, op, inputs(512, 8, DType::kQ4_K)));
  EXPECT_FALSE(Asks(cuda, op, inputs(1, 9, DType::kQ6_K)));  // past the register sums
  EXPECT_FALSE(Asks(cuda, op, inputs(1, 8, DType::kF32)));   // not x's dtype
  EXPECT_FALSE(Asks(cuda, op, inputs(65536, 1, DType::kQ6_K)));  // a grid row a row
}

}  // namespace
}  // namespace sg::testing
