// What kernels compiled for the plan cost at start-up: a first start compiles them
// through NVRTC (and writes the disk cache), a second start reads them back from disk, a
// dispatcher asking again hits memory. The Cubin rows are host-only (they run without a
// GPU); the Module rows add loading the module into the device (cudaLibraryLoadData) and
// need one. Wall-clock medians over repetitions.
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include "dispatch/cuda/codegen.h"
#include "dispatch/cuda/cuda_status.h"
#include "dispatch/cuda/nvrtc_cache.h"

namespace sg {
namespace {

namespace fs = std::filesystem;

// 0: the MLP's tail (silu(gate)·up + residual, bf16, Llama-3.2-1B's 8192 wide);
// 1: RmsNorm over hidden 2048, bf16.
codegen::GeneratedKernel Kernel(int64_t which) {
  if (which == 0) {
    return codegen::GenerateElementwise({{DType::kBF16, DType::kBF16, DType::kBF16},
                                         {{codegen::EwOp::kSiluMul, 0, 1}, {codegen::EwOp::kAdd, 3, 2}},
                                         {4},
                                         8192})
        .value();
  }
  return codegen::GenerateRmsNorm({1, 2048, 1e-5f, DType::kBF16}).value();
}

const char* KernelLabel(int64_t which) { return which == 0 ? "silu_mul_add_bf16_8192" : "rmsnorm_bf16_2048"; }

class Folder {
 public:
  Folder() {
    std::string t = (fs::temp_directory_path() / "sg_nvrtc_bench_XXXXXX").string();
    path_ = mkdtemp(t.data());
  }
  ~Folder() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  void Empty() {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(path_, ec)) fs::remove(e.path(), ec);
  }

 private:
  std::string path_;
};

int Arch() {
  if (!CudaDeviceAvailable()) return 90;  // what the GPU machines have
  absl::StatusOr<int> a = CurrentDeviceArch();
  return a.ok() ? *a : 90;
}

void BM_CubinFirstStart(benchmark::State& state) {
  const codegen::GeneratedKernel k = Kernel(state.range(0));
  const int arch = Arch();
  Folder folder;
  for (auto _ : state) {
    state.PauseTiming();
    folder.Empty();
    state.ResumeTiming();
    CubinCache cache({folder.path()});
    auto cubin = cache.Get(k.source, arch);
    if (!cubin.ok() || cache.stats().compiles != 1) {
      state.SkipWithError("compile failed");
      break;
    }
  }
  state.SetLabel(KernelLabel(state.range(0)));
}

void BM_CubinSecondStart(benchmark::State& state) {
  const codegen::GeneratedKernel k = Kernel(state.range(0));
  const int arch = Arch();
  Folder folder;
  {
    CubinCache warm({folder.path()});
    if (!warm.Get(k.source, arch).ok()) state.SkipWithError("compile failed");
  }
  for (auto _ : state) {
    CubinCache cache({folder.path()});
    auto cubin = cache.Get(k.source, arch);
    if (!cubin.ok() || cache.stats().disk_hits != 1) {
      state.SkipWithError("no disk hit");
      break;
    }
  }
  state.SetLabel(KernelLabel(state.range(0)));
}

void BM_CubinMemoryHit(benchmark::State& state) {
  const codegen::GeneratedKernel k = Kernel(state.range(0));
  const int arch = Arch();
  CubinCache cache(CubinCacheOptions{});
  if (!cache.Get(k.source, arch).ok()) state.SkipWithError("compile failed");
  for (auto _ : state) benchmark::DoNotOptimize(cache.Get(k.source, arch));
  state.SetLabel(KernelLabel(state.range(0)));
}

// The same three on the GPU, loading the module into the device each start.
enum class Start { kFirst, kSecond, kMemory };

void ModuleStart(benchmark::State& state, Start start) {
  if (!CudaDeviceAvailable()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const codegen::GeneratedKernel k = Kernel(state.range(0));
  Folder folder;
  auto load = [&](CudaModuleCache& modules) {
    return modules.Load(k.source, k.entry, dim3(k.grid), dim3(k.block)).ok();
  };
  auto shared = std::make_shared<CubinCache>(CubinCacheOptions{folder.path()});
  CudaModuleCache resident(shared);
  if (!load(resident)) {
    state.SkipWithError("load failed");
    return;
  }
  for (auto _ : state) {
    if (start == Start::kMemory) {
      if (!load(resident)) state.SkipWithError("load failed");
      continue;
    }
    if (start == Start::kFirst) {
      state.PauseTiming();
      folder.Empty();
      state.ResumeTiming();
    }
    CudaModuleCache modules(std::make_shared<CubinCache>(CubinCacheOptions{folder.path()}));
    if (!load(modules)) {
      state.SkipWithError("load failed");
      break;
    }
  }
  state.SetLabel(KernelLabel(state.range(0)));
}

void BM_ModuleFirstStart(benchmark::State& state) { ModuleStart(state, Start::kFirst); }
void BM_ModuleSecondStart(benchmark::State& state) { ModuleStart(state, Start::kSecond); }
void BM_ModuleMemoryHit(benchmark::State& state) { ModuleStart(state, Start::kMemory); }

#define SG_START_BENCH(fn)                                                                \
  BENCHMARK(fn)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->UseRealTime()->Repetitions(5) \
      ->ReportAggregatesOnly(true)

SG_START_BENCH(BM_CubinFirstStart);
SG_START_BENCH(BM_CubinSecondStart);
SG_START_BENCH(BM_CubinMemoryHit);
SG_START_BENCH(BM_ModuleFirstStart);
SG_START_BENCH(BM_ModuleSecondStart);
SG_START_BENCH(BM_ModuleMemoryHit);

}  // namespace
}  // namespace sg

BENCHMARK_MAIN();
