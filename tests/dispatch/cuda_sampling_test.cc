// Argmax and Sample on CudaDispatch. Argmax must equal the CPU reference exactly. Sample
// is judged by what it must never do and by statistics: the chosen token never leaves
// the top-k set (ties by index, exactly as the CPU orders them) or the top-p nucleus
// (computed in float64 on the host); empirical frequencies over many rows with distinct
// seeds match softmax(logits / T) restricted to those sets; the same seeds and positions
// give the same ids on every launch and every dispatcher; and the GPU agrees with the
// CPU reference on nearly every row (the CPU's f32 running sums may move a boundary).
// Attention cases beyond the shared conformance table live here too: head dims and group
// sizes off the fast paths, and a captured launch replayed while the positions move.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_handles.h"
#include "dispatch/cuda/cuda_status.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/dispatch/cpu_dispatch.h"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/base/status.h"
#include "tests/testing/conformance.h"
#include "tests/testing/util.h"

namespace sg::testing {
namespace {

// What one launch is: Argmax, or Sample with its parameters.
struct Choice {
  bool argmax = false;
  ops::Sample sample;
};

// Inputs of one launch on the host.
struct Batch {
  HostTensor logits;
  std::vector<int32_t> seeds;
  std::vector<int32_t> pos;
};

Batch RandomBatch(DType dtype, int64_t rows, int64_t vocab, uint64_t seed, float lo, float hi) {
  Batch b{HostTensor(dtype, Shape{rows, vocab}), std::vector<int32_t>(rows),
          std::vector<int32_t>(rows)};
  b.logits.FillUniform(seed, lo, hi);
  std::mt19937 rng(static_cast<uint32_t>(seed) * 7919u + 1u);
  for (int64_t i = 0; i < rows; ++i) {
    b.seeds[i] = static_cast<int32_t>(rng());
    b.pos[i] = static_cast<int32_t>(rng() % 8192);
  }
  return b;
}

// A one-node graph (Argmax or Sample over [rows, vocab]) and its plan.
absl::StatusOr<ExecutionPlan> MakePlan(DType dtype, int64_t rows, int64_t vocab,
                                       const Choice& choice) {
  GraphBuilder b;
  const TensorId x = b.Input("logits", dtype, {rows, vocab});
  if (choice.argmax) {
    b.Output("ids", b.Argmax(x, "argmax"));
  } else {
    const TensorId seeds = b.Input("seeds", DType::kI32, {rows});
    const TensorId pos = b.Input("pos", DType::kI32, {rows});
    b.Output("ids", b.Sample(x, seeds, pos, choice.sample, "sample"));
  }
  SG_ASSIGN_OR_RETURN(Graph g, std::move(b).Build());
  return ExecutionPlan::Create(std::move(g));
}

// Runs a batch through CudaDispatch (prepared for the plan, arena poisoned) `repeats`
// times and returns each run's ids.
class GpuRunner {
 public:
  GpuRunner() {
    absl::StatusOr<UniqueStream> s = CreateStream("cuda_sampling_test");
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return;
    stream_ = *std::move(s);
    absl::StatusOr<std::unique_ptr<CudaDispatch>> d = CudaDispatch::Create({.stream = stream_.get()});
    EXPECT_TRUE(d.ok()) << d.status();
    if (d.ok()) dispatch_ = *std::move(d);
  }
  bool ok() const { return dispatch_ != nullptr; }
  CudaDispatch& dispatch() { return *dispatch_; }

  std::vector<std::vector<int32_t>> Run(const Batch& batch, const Choice& choice, int repeats = 1) {
    std::vector<std::vector<int32_t>> results;
    const int64_t rows = batch.logits.shape()[0], vocab = batch.logits.shape()[1];
    absl::StatusOr<ExecutionPlan> plan = MakePlan(batch.logits.dtype(), rows, vocab, choice);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return results;
    absl::StatusOr<PreparedPlan> prepared = dispatch_->Prepare(*plan);
    EXPECT_TRUE(prepared.ok()) << prepared.status();
    if (!prepared.ok()) return results;
    Bindings bind(plan->graph());
    std::vector<DeviceMemory> memory;
    auto upload = [&](absl::string_view name, const void* data, int64_t bytes) {
      absl::StatusOr<DeviceMemory> m = AllocateDevice(bytes, "cuda_sampling_test input");
      EXPECT_TRUE(m.ok()) << m.status();
      if (!m.ok()) return;
      EXPECT_EQ(cudaMemcpy(m->get(), data, bytes, cudaMemcpyHostToDevice), cudaSuccess);
      EXPECT_TRUE(bind.Bind(name, m->get(), bytes).ok());
      memory.push_back(*std::move(m));
    };
    upload("logits", batch.logits.data(), batch.logits.bytes());
    if (!choice.argmax) {
      upload("seeds", batch.seeds.data(), rows * 4);
      upload("pos", batch.pos.data(), rows * 4);
    }
    const int64_t arena_bytes = std::max<int64_t>(plan->arena_bytes(), 256);
    absl::StatusOr<DeviceMemory> arena = AllocateDevice(arena_bytes, "cuda_sampling_test arena");
    EXPECT_TRUE(arena.ok()) << arena.status();
    if (!arena.ok()) return results;
    bind.SetArena(arena->get(), plan->arena_bytes());
    const absl::StatusOr<TensorId> out = plan->graph().FindOutput("ids");
    EXPECT_TRUE(out.ok());
    const TensorArg ids = ResolveTensor(*plan, bind, out->index);
    for (int r = 0; r < repeats; ++r) {
      EXPECT_EQ(cudaMemset(arena->get(), 0xFF, arena_bytes), cudaSuccess);  // ids of -1
      // The memset and uploads ran on the legacy stream, which stream_ does not wait for.
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      absl::StatusOr<ExecStats> stats = Execute(*prepared, bind, *dispatch_);
      EXPECT_TRUE(stats.ok()) << stats.status();
      EXPECT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
      std::vector<int32_t> host(rows);
      EXPECT_EQ(cudaMemcpy(host.data(), ids.data, rows * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      for (int64_t i = 0; i < rows; ++i) {
        EXPECT_GE(host[i], 0) << "row " << i << " not written or out of range";
        EXPECT_LT(host[i], vocab) << "row " << i;
        if (host[i] < 0 || host[i] >= vocab) return results;
      }
      results.push_back(std::move(host));
    }
    return results;
  }

 private:
  UniqueStream stream_;
  std::unique_ptr<CudaDispatch> dispatch_;
};

// The CPU reference's ids for the same batch.
std::vector<int32_t> CpuIds(const Batch& batch, const Choice& choice) {
  const int64_t rows = batch.logits.shape()[0], vocab = batch.logits.shape()[1];
  absl::StatusOr<ExecutionPlan> plan = MakePlan(batch.logits.dtype(), rows, vocab, choice);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  Bindings bind(plan->graph());
  EXPECT_TRUE(bind.Bind("logits", const_cast<void*>(batch.logits.data()), batch.logits.bytes()).ok());
  std::vector<int32_t> seeds = batch.seeds, pos = batch.pos;
  if (!choice.argmax) {
    EXPECT_TRUE(bind.Bind("seeds", seeds.data(), rows * 4).ok());
    EXPECT_TRUE(bind.Bind("pos", pos.data(), rows * 4).ok());
  }
  std::vector<std::byte> arena(std::max<int64_t>(plan->arena_bytes(), 256), std::byte{0xFF});
  bind.SetArena(arena.data(), plan->arena_bytes());
  CpuDispatch cpu;
  EXPECT_TRUE(Execute(*plan, bind, cpu).ok());
  const absl::StatusOr<TensorId> out = plan->graph().FindOutput("ids");
  const TensorArg ids = ResolveTensor(*plan, bind, out->index);
  const auto* p = static_cast<const int32_t*>(ids.data);
  return std::vector<int32_t>(p, p + rows);
}

// z = logit / T as the CPU computes it, for row `i`.
std::vector<float> RowZ(const Batch& b, int64_t i, float temperature) {
  const int64_t vocab = b.logits.shape()[1];
  std::vector<float> z(vocab);
  for (int64_t j = 0; j < vocab; ++j) z[j] = b.logits.At(i * vocab + j) / temperature;
  return z;
}

// Indices in the CPU's candidate order: value descending, index ascending; the first
// `count` of them only.
std::vector<int32_t> TopOrder(const std::vector<float>& z, int64_t count) {
  std::vector<int32_t> order(z.size());
  std::iota(order.begin(), order.end(), 0);
  count = std::min<int64_t>(count, static_cast<int64_t>(z.size()));
  std::partial_sort(order.begin(), order.begin() + count, order.end(), [&](int32_t a, int32_t b) {
    return z[a] > z[b] || (z[a] == z[b] && a < b);
  });
  order.resize(count);
  return order;
}

// The kept set in order and its probabilities (float64), from the op's parameters:
// top-k first, then the smallest prefix whose mass reaches top_p (within `slack` of the
// boundary, the next candidate also counts as kept: f32 rounding may include it).
struct Kept {
  std::vector<int32_t> ids;
  std::vector<double> prob;  // normalised over `ids`
};
Kept KeptSet(const std::vector<float>& z, const ops::Sample& op, double slack = 0.0) {
  const int64_t vocab = static_cast<int64_t>(z.size());
  const int64_t k = op.top_k > 0 ? std::min<int64_t>(op.top_k, vocab) : vocab;
  Kept kept;
  kept.ids = TopOrder(z, k);
  const double mx = z[kept.ids[0]];
  std::vector<double> w(kept.ids.size());
  double total = 0;
  for (size_t r = 0; r < kept.ids.size(); ++r) total += w[r] = std::exp(z[kept.ids[r]] - mx);
  size_t keep = kept.ids.size();
  if (op.top_p < 1.0f) {
    const double target = static_cast<double>(op.top_p) * total;
    double cum = 0;
    size_t r = 0;
    // Element r is kept when the mass before it is below the target.
    while (r < kept.ids.size() && cum < target + slack * total) cum += w[r++];
    keep = r;
  }
  kept.ids.resize(keep);
  w.resize(keep);
  const double kept_total = std::accumulate(w.begin(), w.end(), 0.0);
  for (double x : w) kept.prob.push_back(x / kept_total);
  return kept;
}

class CudaSamplingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaSamplingTest, ArgmaxEqualsCpuExactly) {
  GpuRunner gpu;
  ASSERT_TRUE(gpu.ok());
  struct Case {
    DType dtype;
    int64_t rows, vocab;
    float lo, hi;
  };
  // Narrow ranges in bf16/f16 make exact ties common; odd vocabularies take the scalar
  // path; one row of 128256 is split over many blocks.
  for (const Case& c : {Case{DType::kF32, 1, 128256, -10, 10}, Case{DType::kBF16, 1, 128256, -2, 2},
                        Case{DType::kF16, 8, 128256, -1, 1}, Case{DType::kBF16, 8, 32000, -3, 3},
                        Case{DType::kF32, 64, 1000, -1, 1}, Case{DType::kBF16, 200, 1001, -1, 1},
                        Case{DType::kF16, 3, 257, -0.01f, 0.01f}}) {
    SCOPED_TRACE(absl::StrCat(DTypeName(c.dtype), " ", c.rows, "x", c.vocab));
    Batch b = RandomBatch(c.dtype, c.rows, c.vocab, c.rows * 31 + c.vocab, c.lo, c.hi);
    const std::vector<int32_t> want = CpuIds(b, Choice{.argmax = true});
    // Twice: the per-row slots and counters must be left ready for the next launch.
    const auto got = gpu.Run(b, Choice{.argmax = true}, /*repeats=*/2);
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0], want);
    EXPECT_EQ(got[1], want);
  }
}

TEST_F(CudaSamplingTest, ArgmaxSkipsNanAndMinusInfinity) {
  GpuRunner gpu;
  ASSERT_TRUE(gpu.ok());
  const int64_t vocab = 40000;
  Batch b = RandomBatch(DType::kF32, 4, vocab, 5, -1, 1);
  auto* x = static_cast<float*>(b.logits.data());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < vocab; ++j) x[0 * vocab + j] = -inf;     // all -inf: 0
  for (int64_t j = 0; j < vocab; ++j) x[1 * vocab + j] = nan;      // all NaN: 0
  x[2 * vocab + 17] = nan;                                         // NaN never wins
  x[2 * vocab + 30000] = 5.0f;
  x[3 * vocab + 39999] = 3.0f;  // the last element, with -0/+0 ties elsewhere
  x[3 * vocab + 100] = -0.0f;
  x[3 * vocab + 200] = 0.0f;
  const std::vector<int32_t> want = CpuIds(b, Choice{.argmax = true});
  EXPECT_EQ(want, (std::vector<int32_t>{0, 0, 30000, 39999}));
  const auto got = gpu.Run(b, Choice{.argmax = true});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], want);
}

TEST_F(CudaSamplingTest, TopKOneIsArgmaxOfScaledLogits) {
  GpuRunner gpu;
  ASSERT_TRUE(gpu.ok());
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int64_t vocab : {1000, 128256}) {
      for (float temperature : {0.3f, 1.0f, 1.7f}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(t), " V", vocab, " T", temperature));
        Batch b = RandomBatch(t, 16, vocab, vocab + 3, -2, 2);
        const Choice choice{.sample = {.temperature = temperature, .top_k = 1}};
        const auto got = gpu.Run(b, choice);
        ASSERT_EQ(got.size(), 1u);
        EXPECT_EQ(got[0], CpuIds(b, choice));
      }
    }
  }
}

// Below the greedy temperature (1e-5; 1e-40 is a float denormal whose reciprocal
// overflows) every seed draws the argmax of the logits, as on the CPU, whatever top_k and
// top_p say: not the lowest index among the logits that overflowed to +inf.
TEST_F(CudaSamplingTest, TinyTemperatureIsArgmax) {
  GpuRunner gpu;
  ASSERT_TRUE(gpu.ok());
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int64_t vocab : {1000, 128256}) {
      for (float temperature : {1e-40f, 1e-30f, 9e-6f}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(t), " V", vocab, " T", temperature));
        Batch b = RandomBatch(t, 16, vocab, vocab + 5, -2, 2);
        const std::vector<int32_t> argmax = CpuIds(b, Choice{.argmax = true});
        for (const ops::Sample& op : {ops::Sample{.temperature = temperature},
                                      ops::Sample{.temperature = temperature, .top_k = 40,
                                                  .top_p = 0.9f}}) {
          const auto got = gpu.Run(b, Choice{.sample = op});
          ASSERT_EQ(got.size(), 1u);
          EXPECT_EQ(got[0], argmax);
          EXPECT_EQ(CpuIds(b, Choice{.sample = op}), argmax);
        }
      }
    }
  }
}

TEST_F(CudaSamplingTest, TopKNeverLeavesTheTopK) {
  GpuRunner gpu;
  ASSERT_TRUE(gpu.ok());
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int64_t vocab : {32000, 128256}) {
      for (int32_t k : {1, 5, 50}) {
        // bf16 logits in a narrow range: ties at the k-th value are the rule, and only the
        // lowest indices among them may be drawn.
        const float range = t == DType::kBF16 ? 2.0f : 8.0f;
        const ops::Sample op{.temperature = 0.8f, .top_k = k};
        SCOPED_TRACE(absl::StrCat(DTypeName(t), " V", vocab, " k", k));
        Batch b = RandomBatch(t, 48, vocab, vocab * 7 + k, -range, range);
        const auto got = gpu.Run(b, Choice{.sample = op});
        ASSERT_EQ(got.size(), 1u);
        for (int64_t i = 0; i < 48; ++i) {
          const std::vector<int32_t> top = TopOrder(RowZ(b, i, op.temperature), k);
          EXPECT_NE(std::find(top.begin(), top.end(), got[0][i]), top.end())
              << "row " << i << " drew " << got[0][i] << ", outside the top " << k;
        }
      }
    }
  }
}

// Few distinct values: thousands of candidates share the cut's value, so the cut is
// decided by index among them (the kernel's path for more tied candidates than fit in
// shared memory).
TEST_F(CudaSamplingTest, MassiveTiesAreCutByIndex) {
  GpuRunner gpu;
  ASSERT_TRUE(gpu.ok());
  for (int64_t vocab : {12000, 128256}) {
    for (const ops::Sample& op : {ops::Sample{.top_k = 50}, ops::Sample{.top_k = 3000},
                                  ops::Sample{.top_p = 0.3f},
                                  ops::Sample{.top_k = 20000, .top_p = 0.5f}}) {
      SCOPED_TRACE(absl::StrCat("V", vocab, " k", op.top_k, " p", op.top_p));
      const int64_t rows = 16;
      Batch b = RandomBatch(DType::kBF16, rows, vocab, vocab + op.top_k, 0, 1);
      std::mt19937 rng(static_cast<uint32_t>(vocab));
      std::vector<float> values(rows * vocab);
      for (float& v : values) v = static_cast<float>(rng() % 3);  // 0, 1 or 2
      b.logits.FillFrom(values);
      const auto got = gpu.Run(b, Choice{.sample = op}, 2);
      ASSERT_EQ(got.size(), 2u);
      EXPECT_EQ(got[0], got[1]);
      for (int64_t i = 0; i < rows; ++i) {
        const Kept kept = KeptSet(RowZ(b, i, op.temperature), op, 1e-6);
        EXPECT_NE(std::find(kept.ids.begin(), kept.ids.end(), got[0][i]), kept.ids.end())
            << "row " << i << " drew " << got[0][i] << " outside the kept " << kept.ids.size();
      }
    }
  }
}

// Each sampling path of the larger tests on two rows, small enough for compute-sanitizer's
// racecheck, which takes minutes over one of their launches (tools/gpu_check.sh runs this
// one under racecheck in their place): ties past what shared memory holds, top-k small
// and large, top-p with and without top-k, no limit. Every draw is inside the kept set of
// the CPU's order (value descending, index ascending).
TEST_F(CudaSamplingTest, EveryPathOnTwoRows) {
  GpuRunner gpu;
  ASSERT_TRUE(gpu.ok());
  struct Path {
    DType dtype;
    int64_t vocab;
    bool ties;  // logits of 0, 1 or 2 only
    ops::Sample op;
  };
  const Path paths[] = {
      {DType::kBF16, 12000, true, {.top_k = 50}},
      {DType::kBF16, 12000, true, {.top_k = 3000}},
      {DType::kBF16, 12000, true, {.top_p = 0.3f}},
      {DType::kBF16, 12000, true, {.top_k = 20000, .top_p = 0.5f}},
      {DType::kF32, 32000, false, {.temperature = 0.8f, .top_k = 5}},
      {DType::kBF16, 32000, false, {.temperature = 0.8f, .top_k = 50}},
      {DType::kF32, 32000, false, {.top_p = 0.9f}},
      {DType::kBF16, 32000, false, {.top_k = 50, .top_p = 0.5f}},
      {DType::kF32, 1000, false, {}},
  };
  const int64_t rows = 2;
  uint64_t seed = 0;
  for (const Path& p : paths) {
    SCOPED_TRACE(absl::StrCat(DTypeName(p.dtype), " V", p.vocab, p.ties ? " ties" : "", " k",
                              p.op.top_k, " p", p.op.top_p));
    Batch b = RandomBatch(p.dtype, rows, p.vocab, 4000 + ++seed, -8, 8);
    if (p.ties) {
      std::mt19937 rng(static_cast<uint32_t>(seed));
      std::vector<float> values(rows * p.vocab);
      for (float& v : values) v = static_cast<float>(rng() % 3);
      b.logits.FillFrom(values);
    }
    const auto got = gpu.Run(b, Choice{.sample = p.op});
    ASSERT_EQ(got.size(), 1u);
    for (int64_t i = 0; i < rows; ++i) {
      const Kept kept = KeptSet(RowZ(b, i, p.op.temperature), p.op, 1e-6);
      EXPECT_NE(std::find(kept.ids.begin(), kept.ids.end(), got[0][i]), kept.ids.end())
          << "row " << i << " drew " << got[0][i] << " outside the kept " << kept.ids.size();
    }
  }
}

TEST_F(CudaSamplingTest, TopPStaysInsideTheNucleus) {
  GpuRunner gpu;
  ASSERT_TRUE(gpu.ok());
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int64_t vocab : {32000, 128256}) {
      for (float p : {0.5f, 0.9f}) {
        for (int32_t k : {0, 50}) {
          const ops::Sample op{.temperature = 1.0f, .top_k = k, .top_p = p};
          SCOPED_TRACE(absl::StrCat(DTypeName(t), " V", vocab, " p", p, " k", k));
          const int64_t rows = 32;
          Batch b = RandomBatch(t, rows, vocab, vocab + static_cast<uint64_t>(p * 100) + k, -8, 8);
          const auto got = gpu.Run(b, Choice{.sample = op});
          ASSERT_EQ(got.size(), 1u);
          for (int64_t i = 0; i < rows; ++i) {
            const Kept nucleus = KeptSet(RowZ(b, i, op.temperature), op, 1e-6);
            EXPECT_NE(std::find(nucleus.ids.begin(), nucleus.ids.end(), got[0][i]),
                      nucleus.ids.end())
                << "row " << i << " drew " << got[0][i] << " outside the nucleus of "
                << nucleus.ids.size();
          }
        }
      }
    }
  }
}

// One row of logits repeated over many rows with distinct seeds: the counts per token
// must match the kept distribution within 5 standard errors, and tokens outside the kept
// set must never appear.
TEST_F(CudaSamplingTest, FrequenciesMatchTheDistribution) {
  GpuRunner gpu;
  ASSERT_TRUE(gpu.ok());
  const int64_t rows = 50000;
  for (int64_t vocab : {8, 16}) {
    for (float temperature : {0.5f, 1.0f, 2.0f}) {
      for (const ops::Sample& shape : {ops::Sample{}, ops::Sample{.top_k = 5},
                                       ops::Sample{.top_p = 0.7f},
                                       ops::Sample{.top_k = 6, .top_p = 0.8f}}) {
        ops::Sample op = shape;
        op.temperature = temperature;
        SCOPED_TRACE(absl::StrCat("V", vocab, " T", temperature, " k", op.top_k, " p", op.top_p));
        // Logits whose top-p boundary is not within rounding of the target.
        std::vector<float> row(vocab);
        Kept kept;
        for (uint32_t attempt = 0;; ++attempt) {
          std::mt19937 rng(attempt * 131u + static_cast<uint32_t>(vocab));
          std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
          for (float& v : row) v = dist(rng);
          std::vector<float> z(vocab);
          for (int64_t j = 0; j < vocab; ++j) z[j] = row[j] / temperature;
          kept = KeptSet(z, op);
          if (KeptSet(z, op, 1e-4).ids.size() == kept.ids.size() &&
              KeptSet(z, op, -1e-4).ids.size() == kept.ids.size()) {
            break;
          }
        }
        Batch b{HostTensor(DType::kF32, Shape{rows, vocab}), std::vector<int32_t>(rows),
                std::vector<int32_t>(rows, 42)};
        std::vector<float> all(rows * vocab);
        for (int64_t i = 0; i < rows; ++i) {
          std::copy(row.begin(), row.end(), all.begin() + i * vocab);
          b.seeds[i] = static_cast<int32_t>(i * 2654435761u);
        }
        b.logits.FillFrom(all);
        const auto got = gpu.Run(b, Choice{.sample = op});
        ASSERT_EQ(got.size(), 1u);
        std::vector<int64_t> counts(vocab, 0);
        for (int32_t id : got[0]) ++counts[id];
        std::vector<double> prob(vocab, 0.0);
        for (size_t r = 0; r < kept.ids.size(); ++r) prob[kept.ids[r]] = kept.prob[r];
        for (int64_t j = 0; j < vocab; ++j) {
          const double expect = rows * prob[j];
          const double sigma = std::sqrt(rows * prob[j] * (1.0 - prob[j]));
          if (prob[j] == 0.0) {
            EXPECT_EQ(counts[j], 0) << "token " << j << " is outside the kept set";
          } else {
            EXPECT_LE(std::abs(counts[j] - expect), 5.0 * sigma + 1.0)
                << "token " << j << ": " << counts[j] << " draws, expected " << expect;
          }
        }
      }
    }
  }
}

TEST_F(CudaSamplingTest, SameSeedsSameIdsDifferentSeedsDifferentIds) {
  GpuRunner first, second;
  ASSERT_TRUE(first.ok() && second.ok());
  for (int64_t vocab : {1000, 128256}) {
    for (const ops::Sample& op : {ops::Sample{}, ops::Sample{.temperature = 0.7f, .top_k = 50, .top_p = 0.9f}}) {
      SCOPED_TRACE(absl::StrCat("V", vocab, " k", op.top_k));
      const int64_t rows = 64;
      Batch b = RandomBatch(DType::kBF16, rows, vocab, vocab + 11, -3, 3);
      const auto a = first.Run(b, Choice{.sample = op}, 2);
      const auto c = second.Run(b, Choice{.sample = op});
      ASSERT_EQ(a.size(), 2u);
      ASSERT_EQ(c.size(), 1u);
      EXPECT_EQ(a[0], a[1]) << "two launches differ";
      EXPECT_EQ(a[0], c[0]) << "two dispatchers differ";
      for (int32_t& s : b.seeds) s ^= 0x5bd1e995;
      const auto d = first.Run(b, Choice{.sample = op});
      ASSERT_EQ(d.size(), 1u);
      int64_t same = 0;
      for (int64_t i = 0; i < rows; ++i) same += a[0][i] == d[0][i];
      // The chance that a row draws the same token twice is Σ p², small for these rows.
      EXPECT_LT(same, rows / 2) << "other seeds drew the same ids on " << same << " rows";
    }
  }
}

// With no truncation the only difference from the CPU is summation order: the CPU's f32
// running sums move each token boundary by about √V · 2^-24 of the total, so a draw near
// a boundary may land on the neighbour. At V = 1000 that is a few rows in 10,000.
TEST_F(CudaSamplingTest, AgreesWithCpuOnNearlyEveryRow) {
  GpuRunner gpu;
  ASSERT_TRUE(gpu.ok());
  const int64_t rows = 10000, vocab = 1000;
  for (DType t : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(t));
    Batch b = RandomBatch(t, rows, vocab, 77, -4, 4);
    const Choice choice{.sample = {.temperature = 1.0f}};
    const std::vector<int32_t> want = CpuIds(b, choice);
    const auto got = gpu.Run(b, choice);
    ASSERT_EQ(got.size(), 1u);
    int64_t agree = 0;
    for (int64_t i = 0; i < rows; ++i) agree += got[0][i] == want[i];
    EXPECT_GE(static_cast<double>(agree) / rows, 0.999) << agree << " of " << rows << " rows agree";
  }
}

// ---------------------------------------------------------------------------------------
// Attention

OpCase AttentionCase(DType t, int64_t m, int64_t heads, int64_t kv_heads, int64_t seq, int64_t d,
                     std::vector<int32_t> pos) {
  return OpCase{
      .name = absl::StrCat("Attention/", DTypeName(t), "/M", m, "/h", heads, "/kvh", kv_heads, "/S",
                           seq, "/d", d),
      .build =
          [=](GraphBuilder& b) {
            auto q = b.Input("q", t, {m, heads * d});
            auto kc = b.State("k_cache", t, {m, kv_heads, seq, d});
            auto vc = b.State("v_cache", t, {m, kv_heads, seq, d});
            b.Output("out", b.Attention(q, kc, vc, b.Input("pos", DType::kI32, {m})));
          },
      .tolerance = t == DType::kF32 ? 1e-5 : 1e-2,
      .int_lo = 0,
      .int_hi = static_cast<int32_t>(seq),
      .int_values = {{"pos", pos}}};
}

// Shapes off the table's: head dims without 16-byte rows (the generic path), group sizes
// that are not powers of two, MQA with tiles of 8 heads, d = 256, long caches with many
// chunks and short ones with one.
TEST(CudaAttentionTest, MatchesCpuOffTheFastPaths) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  for (DType t : {DType::kF32, DType::kBF16}) {
    RunConformance(AttentionCase(t, 2, 12, 4, 300, 96, {299, 5}));         // group 3, d 96
    RunConformance(AttentionCase(t, 3, 32, 1, 2048, 128, {2047, -1, 700}));  // MQA
    RunConformance(AttentionCase(t, 1, 8, 8, 5000, 256, {4999}));           // d 256
    RunConformance(AttentionCase(t, 2, 4, 2, 100, 2, {99, 0}));             // d 2
    RunConformance(AttentionCase(t, 2, 6, 2, 1000, 34, {999, 400}));        // group 3, d 34
    RunConformance(AttentionCase(t, 4, 16, 2, 8192, 64, {8191, 4095, 1, 6000}));
  }
}

// One captured launch, replayed while the positions move (as a closed decode loop does):
// the grid must not depend on them and the arrival counters must be reset every time.
TEST(CudaAttentionTest, CapturedLaunchFollowsThePositions) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const int64_t m = 2, heads = 32, kv_heads = 8, seq = 4096, d = 64;
  for (DType t : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(t));
    GraphBuilder b;
    auto q = b.Input("q", t, {m, heads * d});
    auto kc = b.State("k_cache", t, {m, kv_heads, seq, d});
    auto vc = b.State("v_cache", t, {m, kv_heads, seq, d});
    b.Output("out", b.Attention(q, kc, vc, b.Input("pos", DType::kI32, {m})));
    absl::StatusOr<Graph> graph = std::move(b).Build();
    ASSERT_TRUE(graph.ok()) << graph.status();
    absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(graph));
    ASSERT_TRUE(plan.ok()) << plan.status();

    HostTensor hq(t, {m, heads * d}), hk(t, {m, kv_heads, seq, d}), hv(t, {m, kv_heads, seq, d});
    hq.FillUniform(1);
    hk.FillUniform(2);
    hv.FillUniform(3);
    std::vector<int32_t> pos(m, 0);

    absl::StatusOr<UniqueStream> stream = CreateStream("attention capture test");
    ASSERT_TRUE(stream.ok());
    absl::StatusOr<std::unique_ptr<CudaDispatch>> gpu = CudaDispatch::Create({.stream = stream->get()});
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    absl::StatusOr<PreparedPlan> prepared = (*gpu)->Prepare(*plan);
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    Bindings bind(plan->graph());
    std::vector<DeviceMemory> memory;
    auto upload = [&](absl::string_view name, const void* data, int64_t bytes) -> void* {
      absl::StatusOr<DeviceMemory> mem = AllocateDevice(bytes, "attention capture test");
      EXPECT_TRUE(mem.ok());
      EXPECT_EQ(cudaMemcpy(mem->get(), data, bytes, cudaMemcpyHostToDevice), cudaSuccess);
      EXPECT_TRUE(bind.Bind(name, mem->get(), bytes).ok());
      memory.push_back(*std::move(mem));
      return memory.back().get();
    };
    upload("q", hq.data(), hq.bytes());
    upload("k_cache", hk.data(), hk.bytes());
    upload("v_cache", hv.data(), hv.bytes());
    void* pos_dev = upload("pos", pos.data(), m * 4);
    absl::StatusOr<DeviceMemory> arena = AllocateDevice(std::max<int64_t>(plan->arena_bytes(), 256), "arena");
    ASSERT_TRUE(arena.ok());
    bind.SetArena(arena->get(), plan->arena_bytes());

    cudaStream_t s = stream->get();
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const absl::StatusOr<ExecStats> captured = Execute(*prepared, bind, **gpu);
    cudaGraph_t raw = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(s, &raw), cudaSuccess);
    UniqueGraph cuda_graph(raw);
    ASSERT_TRUE(captured.ok()) << captured.status();
    cudaGraphExec_t exec_raw = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec_raw, cuda_graph.get(), 0), cudaSuccess);
    UniqueGraphExec exec(exec_raw);

    const TensorArg out = ResolveTensor(*plan, bind, plan->graph().FindOutput("out")->index);
    for (const std::vector<int32_t>& step : {std::vector<int32_t>{0, 4095}, {100, 1},
                                             {4095, -1}, {2047, 3000}, {63, 64}}) {
      SCOPED_TRACE(absl::StrCat("pos ", step[0], ",", step[1]));
      pos = step;
      ASSERT_EQ(cudaMemcpy(pos_dev, pos.data(), m * 4, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemset(arena->get(), 0xFF, std::max<int64_t>(plan->arena_bytes(), 256)), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // legacy-stream writes landed
      ASSERT_EQ(cudaGraphLaunch(exec.get(), s), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      HostTensor got(t, {m, heads * d});
      ASSERT_EQ(cudaMemcpy(got.data(), out.data, got.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);

      // The CPU reference for these positions.
      Bindings cpu_bind(plan->graph());
      ASSERT_TRUE(cpu_bind.Bind("q", hq.data(), hq.bytes()).ok());
      ASSERT_TRUE(cpu_bind.Bind("k_cache", hk.data(), hk.bytes()).ok());
      ASSERT_TRUE(cpu_bind.Bind("v_cache", hv.data(), hv.bytes()).ok());
      ASSERT_TRUE(cpu_bind.Bind("pos", pos.data(), m * 4).ok());
      std::vector<std::byte> cpu_arena(std::max<int64_t>(plan->arena_bytes(), 256));
      cpu_bind.SetArena(cpu_arena.data(), plan->arena_bytes());
      CpuDispatch cpu;
      ASSERT_TRUE(Execute(*plan, cpu_bind, cpu).ok());
      const TensorArg want = ResolveTensor(*plan, cpu_bind, plan->graph().FindOutput("out")->index);
      HostTensor want_t(t, {m, heads * d});
      std::memcpy(want_t.data(), want.data, want_t.bytes());
      EXPECT_LE(NormalizedError(got.ToFloat(), want_t.ToFloat()), t == DType::kF32 ? 1e-5 : 1e-2);
    }
  }
}

TEST(CudaAttentionTest, UnpreparedNodeIsFailedPrecondition) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<UniqueStream> stream = CreateStream("attention unprepared test");
  ASSERT_TRUE(stream.ok());
  absl::StatusOr<std::unique_ptr<CudaDispatch>> gpu = CudaDispatch::Create({.stream = stream->get()});
  ASSERT_TRUE(gpu.ok());
  const Shape q{1, 32 * 64}, cache{1, 8, 4096, 64};
  const TensorArg inputs[] = {{.dtype = DType::kBF16, .shape = q},
                              {.dtype = DType::kBF16, .shape = cache},
                              {.dtype = DType::kBF16, .shape = cache},
                              {.dtype = DType::kI32, .shape = Shape{1}}};
  NodeArgs args;
  args.node_name = "attn";
  args.inputs = inputs;
  args.output = {.dtype = DType::kBF16, .shape = q};
  const absl::Status s = (*gpu)->Run(ops::Attention{.scale = 0.125f}, args);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("prepared"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace sg::testing
