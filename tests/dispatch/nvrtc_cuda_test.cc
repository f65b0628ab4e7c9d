// Generated kernels loaded through CudaModuleCache and run on the GPU, against plain-loop
// references (checked here against the CPU dispatcher where an op exists) and the CPU
// reference's RmsNorm: random inputs, outputs poisoned first, normalised error. Aligned
// buffers take the 16-byte path, buffers one element off take the fallback; a generated
// pair captured into a CUDA graph with programmatic edges replays correctly. GPU cases
// skip without a device.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/codegen.h"
#include "dispatch/cuda/cuda_handles.h"
#include "dispatch/cuda/cuda_status.h"
#include "dispatch/cuda/nvrtc_cache.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/dispatch/cpu_dispatch.h"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/base/half.h"
#include "stepgraph/graph/memory_plan.h"
#include "tests/testing/util.h"

namespace sg::testing {
namespace {

using codegen::ElementwiseChain;
using codegen::EwOp;
using codegen::GeneratedKernel;

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

// The chain's meaning, element by element: f32 math, each step rounded to its dtype.
std::vector<std::vector<float>> ReferenceChain(const ElementwiseChain& chain,
                                               const std::vector<const HostTensor*>& inputs) {
  const std::vector<DType> dtypes = codegen::ChainValueDTypes(chain).value();
  const size_t n_in = chain.inputs.size();
  std::vector<std::vector<float>> out(chain.outputs.size(), std::vector<float>(chain.elements));
  std::vector<float> v(dtypes.size());
  for (int64_t i = 0; i < chain.elements; ++i) {
    for (size_t k = 0; k < n_in; ++k) v[k] = inputs[k]->At(i);
    for (size_t s = 0; s < chain.steps.size(); ++s) {
      const codegen::EwStep& st = chain.steps[s];
      const float a = v[st.a], b = st.b >= 0 ? v[st.b] : 0.0f;
      float r = 0.0f;
      switch (st.op) {
        case EwOp::kAdd: r = a + b; break;
        case EwOp::kMul: r = a * b; break;
        case EwOp::kSilu: r = Silu(a); break;
        case EwOp::kSiluMul: r = Silu(a) * b; break;
      }
      v[n_in + s] = RoundTo(dtypes[n_in + s], r);
    }
    for (size_t o = 0; o < chain.outputs.size(); ++o) out[o][i] = v[chain.outputs[o]];
  }
  return out;
}

double Tolerance(DType t) {
  switch (t) {
    case DType::kF32: return 1e-5;
    case DType::kF16: return 2e-3;
    default: return 1e-2;
  }
}

std::vector<ElementwiseChain> Chains() {
  return {
      {{DType::kBF16, DType::kBF16, DType::kBF16},
       {{EwOp::kSiluMul, 0, 1}, {EwOp::kAdd, 3, 2}},
       {4},
       8192},
      {{DType::kF32, DType::kF32}, {{EwOp::kAdd, 0, 1}, {EwOp::kMul, 2, 0}}, {3}, 2048 * 3},
      {{DType::kF16, DType::kF16}, {{EwOp::kSilu, 0}, {EwOp::kMul, 2, 1}}, {2, 3}, 1001},
      {{DType::kF32, DType::kBF16},
       {{EwOp::kSilu, 0}, {EwOp::kMul, 1, 1}, {EwOp::kAdd, 2, 0}},
       {4, 3},
       4096 + 3},
      {{DType::kBF16}, {{EwOp::kSilu, 0}}, {1}, 1},
  };
}

// The plain-loop reference agrees with the CPU dispatcher where the op exists (no GPU).
TEST(NvrtcReference, MatchesCpuDispatch) {
  const int64_t n = 777;
  HostTensor g(DType::kBF16, Shape{n}), u(DType::kBF16, Shape{n});
  g.FillUniform(1, -3.0f, 3.0f);
  u.FillUniform(2, -3.0f, 3.0f);
  for (EwOp op : {EwOp::kSiluMul, EwOp::kAdd, EwOp::kMul}) {
    ElementwiseChain chain{{DType::kBF16, DType::kBF16}, {{op, 0, 1}}, {2}, n};
    const std::vector<float> ref = ReferenceChain(chain, {&g, &u})[0];
    HostTensor out(DType::kBF16, Shape{n});
    out.Poison();
    std::vector<TensorArg> in(2);
    in[0] = {g.data(), DType::kBF16, Shape{n}};
    in[1] = {u.data(), DType::kBF16, Shape{n}};
    NodeArgs args;
    args.inputs = in;
    args.output = {out.data(), DType::kBF16, Shape{n}};
    CpuDispatch cpu;
    absl::Status s = op == EwOp::kSiluMul ? cpu.Run(ops::SiluMul{}, args)
                     : op == EwOp::kAdd   ? cpu.Run(ops::Add{}, args)
                                          : cpu.Run(ops::Mul{}, args);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(out.ToFloat(), ref) << static_cast<int>(op);
  }
}

class NvrtcCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
    auto stream = CreateStream("nvrtc test");
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = std::move(*stream);
    modules_ = std::make_unique<CudaModuleCache>(std::make_shared<CubinCache>(CubinCacheOptions{}));
  }

  // A device copy of `t`, `offset_elems` elements past a 256-byte boundary.
  void* Upload(const HostTensor& t, int offset_elems) {
    const int64_t pad = offset_elems * DTypeBytes(t.dtype());
    auto mem = AllocateDevice(t.bytes() + pad + 16, "test buffer");
    EXPECT_TRUE(mem.ok()) << mem.status();
    char* p = static_cast<char*>(mem->get()) + pad;
    EXPECT_EQ(cudaMemcpy(p, t.data(), t.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    // From pageable memory cudaMemcpy may return before the DMA lands, and stream_ does
    // not wait on the legacy stream: without this a kernel could read the copy's source
    // half-landed, or have its output overwritten by the poison (seen under ctest -j 8).
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    buffers_.push_back(std::move(*mem));
    return p;
  }

  void Download(HostTensor& t, const void* p) {
    ASSERT_EQ(cudaMemcpy(t.data(), p, t.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  }

  CompiledKernel Load(const GeneratedKernel& g) {
    absl::StatusOr<CompiledKernel> k = modules_->Load(g.source, g.entry, dim3(g.grid), dim3(g.block));
    EXPECT_TRUE(k.ok()) << k.status();
    return k.ok() ? *k : CompiledKernel{};
  }

  void RunChain(const ElementwiseChain& chain, int offset_elems) {
    SCOPED_TRACE(absl::StrCat("offset ", offset_elems));
    absl::StatusOr<GeneratedKernel> g = codegen::GenerateElementwise(chain);
    ASSERT_TRUE(g.ok()) << g.status();
    const CompiledKernel k = Load(*g);
    ASSERT_NE(k.kernel, nullptr);
    const std::vector<DType> dtypes = codegen::ChainValueDTypes(chain).value();

    std::vector<HostTensor> inputs;
    std::vector<const HostTensor*> input_ptrs;
    std::vector<void*> pointers;
    for (size_t i = 0; i < chain.inputs.size(); ++i) {
      inputs.emplace_back(chain.inputs[i], Shape{chain.elements});
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      inputs[i].FillUniform(100 + i, -3.0f, 3.0f);
      input_ptrs.push_back(&inputs[i]);
      pointers.push_back(Upload(inputs[i], offset_elems));
    }
    std::vector<HostTensor> outputs;
    for (int32_t o : chain.outputs) outputs.emplace_back(dtypes[o], Shape{chain.elements});
    for (HostTensor& o : outputs) {
      o.Poison();
      pointers.push_back(Upload(o, offset_elems));
    }
    std::vector<void*> args;
    for (void*& p : pointers) args.push_back(&p);
    ASSERT_EQ(k.Launch(stream_.get(), args.data()), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);

    const std::vector<std::vector<float>> want = ReferenceChain(chain, input_ptrs);
    for (size_t o = 0; o < outputs.size(); ++o) {
      Download(outputs[o], pointers[inputs.size() + o]);
      const double err = NormalizedError(outputs[o].ToFloat(), want[o]);
      EXPECT_LE(err, Tolerance(outputs[o].dtype())) << g->entry << " output " << o;
    }
  }

  void RunRmsNorm(const codegen::RmsNormSpec& spec, int offset_elems) {
    SCOPED_TRACE(absl::StrCat("hidden ", spec.hidden, " offset ", offset_elems));
    absl::StatusOr<GeneratedKernel> g = codegen::GenerateRmsNorm(spec);
    ASSERT_TRUE(g.ok()) << g.status();
    const CompiledKernel k = Load(*g);
    ASSERT_NE(k.kernel, nullptr);
    const Shape xs{spec.rows, spec.hidden}, ws{spec.hidden};
    HostTensor x(spec.dtype, xs), w(spec.dtype, ws), y(spec.dtype, xs), want(spec.dtype, xs);
    x.FillUniform(7, -2.0f, 2.0f);
    w.FillUniform(8, 0.5f, 1.5f);
    y.Poison();
    void* px = Upload(x, offset_elems);
    void* pw = Upload(w, offset_elems);
    void* py = Upload(y, offset_elems);
    void* args[] = {&px, &pw, &py};
    ASSERT_EQ(k.Launch(stream_.get(), args), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
    Download(y, py);

    std::vector<TensorArg> in(2);
    in[0] = {x.data(), spec.dtype, xs};
    in[1] = {w.data(), spec.dtype, ws};
    NodeArgs a;
    a.inputs = in;
    a.output = {want.data(), spec.dtype, xs};
    CpuDispatch cpu;
    ASSERT_TRUE(cpu.Run(ops::RmsNorm{spec.eps}, a).ok());
    EXPECT_LE(NormalizedError(y.ToFloat(), want.ToFloat()), Tolerance(spec.dtype)) << g->entry;
  }

  UniqueStream stream_;
  std::unique_ptr<CudaModuleCache> modules_;
  std::vector<DeviceMemory> buffers_;
};

TEST_F(NvrtcCudaTest, ElementwiseChainsMatchTheReference) {
  for (const ElementwiseChain& c : Chains()) {
    RunChain(c, 0);
    RunChain(c, 1);  // not 16-byte aligned: element accesses
  }
}

TEST_F(NvrtcCudaTest, RmsNormMatchesTheCpuReference) {
  for (const codegen::RmsNormSpec& s :
       {codegen::RmsNormSpec{3, 2048, 1e-5f, DType::kBF16},
        codegen::RmsNormSpec{2, 576, 1e-5f, DType::kF16},
        codegen::RmsNormSpec{2, 8192, 1e-6f, DType::kF32},
        codegen::RmsNormSpec{5, 100, 1e-6f, DType::kBF16},
        codegen::RmsNormSpec{2, 2048, 1e-5f, DType::kBF16, /*weight_is_constant=*/false}}) {
    RunRmsNorm(s, 0);
    RunRmsNorm(s, 1);
  }
}

TEST_F(NvrtcCudaTest, ModulesAreLoadedOncePerDevice) {
  const GeneratedKernel g = codegen::GenerateRmsNorm({1, 1024, 1e-5f, DType::kBF16}).value();
  const CompiledKernel a = Load(g);
  const CompiledKernel b = Load(g);
  EXPECT_EQ(a.kernel, b.kernel);
  EXPECT_EQ(modules_->loaded_modules(), 1);
  EXPECT_EQ(modules_->cubins().stats().compiles, 1);
  absl::StatusOr<CompiledKernel> missing = modules_->Load(g.source, "no_such_entry", dim3(1), dim3(32));
  EXPECT_FALSE(missing.ok());
  absl::StatusOr<CompiledKernel> too_wide = modules_->Load(g.source, g.entry, dim3(1), dim3(2048));
  EXPECT_FALSE(too_wide.ok());
}

// CudaDispatch compiles a FusedElementwise node at Prepare through the process's cache for
// its folder: a second dispatcher compiles nothing, and a folder receives the CUBIN.
TEST_F(NvrtcCudaTest, DispatchersShareTheProcessCache) {
  GraphBuilder b;
  ops::FusedElementwise op;
  op.num_steps = 2;
  op.steps[0] = {ops::FusedElementwise::Kind::kMul, 0, 1};
  op.steps[1] = {ops::FusedElementwise::Kind::kSilu, 2, 0};
  // A size no other test of this process compiles.
  b.Output("y", b.FusedElementwise(op, {b.Input("a", DType::kF16, {3, 4099}),
                                        b.Input("b", DType::kF16, {3, 4099})}));
  absl::StatusOr<Graph> graph = std::move(b).Build();
  ASSERT_TRUE(graph.ok()) << graph.status();
  absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(graph));
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto prepare = [&](const std::string& folder) {
    CudaDispatch::Options o;
    o.stream = stream_.get();
    o.cuda.kernel_cache_folder = folder;
    absl::StatusOr<std::unique_ptr<CudaDispatch>> d = CudaDispatch::Create(o);
    ASSERT_TRUE(d.ok()) << d.status();
    absl::StatusOr<PreparedPlan> p = (*d)->Prepare(*plan);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_NE(p->node(0), nullptr);
  };
  const std::shared_ptr<CubinCache> memory = SharedCubinCache("");
  const CubinCacheStats before = memory->stats();
  prepare("");
  prepare("");
  EXPECT_EQ(memory->stats().compiles, before.compiles + 1);
  EXPECT_EQ(memory->stats().memory_hits, before.memory_hits + 1);

  std::string folder =
      (std::filesystem::path(::testing::TempDir()) / "sg_dispatch_XXXXXX").string();
  ASSERT_NE(mkdtemp(folder.data()), nullptr);
  prepare(folder);
  EXPECT_EQ(SharedCubinCache(folder)->stats().disk_writes, 1);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(folder),
                          std::filesystem::directory_iterator()), 1);
  std::filesystem::remove_all(folder);
}

// RmsNorm then a generated residual add reading its output, captured with programmatic
// edges and replayed: the add must see the norm's complete result every time.
TEST_F(NvrtcCudaTest, GeneratedKernelsReplayInACudaGraph) {
  const int64_t rows = 4, h = 2048, n = rows * h;
  const codegen::RmsNormSpec norm_spec{rows, h, 1e-5f, DType::kBF16};
  const ElementwiseChain add{{DType::kBF16, DType::kBF16}, {{EwOp::kAdd, 0, 1}}, {2}, n};
  const CompiledKernel norm = Load(codegen::GenerateRmsNorm(norm_spec).value());
  const CompiledKernel sum = Load(codegen::GenerateElementwise(add).value());
  ASSERT_NE(norm.kernel, nullptr);
  ASSERT_NE(sum.kernel, nullptr);

  HostTensor x(DType::kBF16, Shape{rows, h}), w(DType::kBF16, Shape{h}),
      residual(DType::kBF16, Shape{rows, h}), normed(DType::kBF16, Shape{rows, h}),
      out(DType::kBF16, Shape{rows, h});
  x.FillUniform(11, -2.0f, 2.0f);
  w.FillUniform(12, 0.5f, 1.5f);
  residual.FillUniform(13, -1.0f, 1.0f);
  normed.Poison();
  out.Poison();
  void* px = Upload(x, 0);
  void* pw = Upload(w, 0);
  void* pr = Upload(residual, 0);
  void* pn = Upload(normed, 0);
  void* po = Upload(out, 0);

  cudaGraph_t raw_graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  void* norm_args[] = {&px, &pw, &pn};
  void* sum_args[] = {&pn, &pr, &po};
  const cudaError_t e1 = norm.Launch(stream_.get(), norm_args);
  const cudaError_t e2 = sum.Launch(stream_.get(), sum_args);
  ASSERT_EQ(cudaStreamEndCapture(stream_.get(), &raw_graph), cudaSuccess);
  UniqueGraph graph(raw_graph);
  ASSERT_EQ(e1, cudaSuccess);
  ASSERT_EQ(e2, cudaSuccess);
  cudaGraphExec_t raw_exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&raw_exec, graph.get(), 0), cudaSuccess);
  UniqueGraphExec exec(raw_exec);

  // Reference: CPU RmsNorm, then the add in bf16.
  HostTensor want_norm(DType::kBF16, Shape{rows, h});
  std::vector<TensorArg> in(2);
  in[0] = {x.data(), DType::kBF16, Shape{rows, h}};
  in[1] = {w.data(), DType::kBF16, Shape{h}};
  NodeArgs a;
  a.inputs = in;
  a.output = {want_norm.data(), DType::kBF16, Shape{rows, h}};
  CpuDispatch cpu;
  ASSERT_TRUE(cpu.Run(ops::RmsNorm{norm_spec.eps}, a).ok());
  const std::vector<float> want = ReferenceChain(add, {&want_norm, &residual})[0];

  for (int replay = 0; replay < 3; ++replay) {
    HostTensor poison(DType::kBF16, Shape{rows, h});
    poison.Poison();
    ASSERT_EQ(cudaMemcpy(pn, poison.data(), poison.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(po, poison.data(), poison.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec.get(), stream_.get()), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
    Download(out, po);
    EXPECT_LE(NormalizedError(out.ToFloat(), want), Tolerance(DType::kBF16)) << "replay " << replay;
  }
}

}  // namespace
}  // namespace sg::testing
