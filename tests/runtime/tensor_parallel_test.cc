// Tensor parallel (docs/parallel.md): the collectives against their definition, a rank that
// fails without leaving the others waiting, and sharded == unsharded: every dense fixture
// (transformers' small models and the GGUF files) and the real SmolLM2 file give the same
// greedy ids over N ranks as over one, on the CPU reference (ranks are threads) and, where
// a machine has two GPUs and NCCL, on the GPUs.
#include "stepgraph/runtime/tensor_parallel.h"
#include "runtime/sharded_weights.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "models/model_files.h"
#include "models/random_weights.h"
#include "nlohmann/json.hpp"
#include "stepgraph/base/half.h"
#include "stepgraph/base/status.h"
#include "stepgraph/dispatch/collectives.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/runtime/session.h"
#include "tests/testing/json_file.h"
#include "tests/testing/family_configs.h"
#include "tests/testing/util.h"

namespace sg {
namespace {

using Json = nlohmann::json;

// A runner of `ranks` ranks, or the reason there is none here (a skip on machines with
// fewer GPUs or a build without NCCL).
absl::StatusOr<std::unique_ptr<TensorParallelRunner>> MakeRunner(DeviceKind device, int ranks,
                                                                 bool eager = false,
                                                                 bool one_shot = true) {
  RunnerOptions ro;
  ro.device = device;
  ro.eager = eager;
  ro.cpu_threads = 1;
  // 0: every AllReduce through NCCL; else the one-shot kernel for every size it takes.
  ro.cuda.one_shot_all_reduce_bytes = one_shot ? int64_t{1} << 30 : 0;
  return TensorParallelRunner::Create({.runner = ro, .ranks = ranks});
}

// Whether `ranks` ranks of `device` run here.
bool Available(DeviceKind device, int ranks) { return MakeRunner(device, ranks).ok(); }

#define MAKE_RUNNER_OR_SKIP(var, device, ranks, eager, ...)                            \
  absl::StatusOr<std::unique_ptr<TensorParallelRunner>> var##_or =                    \
      MakeRunner(device, ranks, eager __VA_OPT__(, ) __VA_ARGS__);                     \
  if (!var##_or.ok() && var##_or.status().code() == absl::StatusCode::kFailedPrecondition) { \
    GTEST_SKIP() << var##_or.status();                                                 \
  }                                                                                    \
  ASSERT_TRUE(var##_or.ok()) << var##_or.status();                                     \
  TensorParallelRunner& var = **var##_or;

// Every rank's x, random; the collectives' outputs on every rank against the definition:
// the sum in f32 in rank order rounded once, and the ranks' columns side by side.
void CheckCollectives(TensorParallelRunner& tp, DType t, double tolerance, int64_t m = 3,
                      int64_t n = 40) {
  const int ranks = tp.ranks();
  GraphBuilder b;
  const TensorId x = b.Input("x", t, {m, n});
  b.Output("sum", b.AllReduce(x, ranks, "sum"));
  b.Output("all", b.AllGather(x, ranks, "all"));
  // With a residual of each rank's own (the model's is the same on every rank).
  b.Output("sum_plus", b.AllReduce(x, ranks, "sum_plus", b.Input("res", t, {m, n})));
  const Graph g = *std::move(b).Build();
  std::vector<std::vector<std::byte>> host(ranks), res_host(ranks);
  std::vector<void*> dev(ranks), res_dev(ranks);
  const int64_t bytes = m * n * DTypeBytes(t);
  for (int r = 0; r < ranks; ++r) {
    host[r].resize(static_cast<size_t>(bytes));
    res_host[r].resize(static_cast<size_t>(bytes));
    std::mt19937 rng(100 + r);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    for (int64_t i = 0; i < m * n; ++i) StoreElement(host[r].data(), t, i, u(rng));
    for (int64_t i = 0; i < m * n; ++i) StoreElement(res_host[r].data(), t, i, u(rng));
    dev[r] = *tp.rank(r).Allocate(bytes, "x");
    res_dev[r] = *tp.rank(r).Allocate(bytes, "res");
    ASSERT_TRUE(tp.rank(r).Copy(dev[r], host[r].data(), bytes).ok());
    ASSERT_TRUE(tp.rank(r).Copy(res_dev[r], res_host[r].data(), bytes).ok());
  }
  absl::StatusOr<int> step = tp.AddStep(g, [&](int r, const Graph&, Bindings& bind) {
    SG_RETURN_IF_ERROR(bind.Bind("x", dev[r], bytes));
    return bind.Bind("res", res_dev[r], bytes);
  });
  ASSERT_TRUE(step.ok()) << step.status();
  ASSERT_TRUE(tp.Finalize().ok());
  // Poisoned outputs: the arena is the runner's; run twice so a stale result cannot pass.
  for (int run = 0; run < 2; ++run) ASSERT_TRUE(tp.Run(*step).ok());
  for (int r = 0; r < ranks; ++r) {
    absl::StatusOr<TensorArg> sum = tp.rank(r).Output(*step, "sum");
    absl::StatusOr<TensorArg> all = tp.rank(r).Output(*step, "all");
    absl::StatusOr<TensorArg> sum_plus = tp.rank(r).Output(*step, "sum_plus");
    ASSERT_TRUE(sum.ok() && all.ok() && sum_plus.ok());
    std::vector<std::byte> got_sum(static_cast<size_t>(bytes)),
        got_all(static_cast<size_t>(bytes * ranks)), got_plus(static_cast<size_t>(bytes));
    ASSERT_TRUE(tp.rank(r).Copy(got_sum.data(), sum->data, bytes).ok());
    ASSERT_TRUE(tp.rank(r).Copy(got_all.data(), all->data, bytes * ranks).ok());
    ASSERT_TRUE(tp.rank(r).Copy(got_plus.data(), sum_plus->data, bytes).ok());
    ASSERT_TRUE(tp.rank(r).Sync().ok());
    std::vector<float> want, got, want_plus, got_plus_f;
    for (int64_t i = 0; i < m * n; ++i) {
      float s = 0.0f;
      for (int q = 0; q < ranks; ++q) s += LoadElement(host[q].data(), t, i);
      want.push_back(RoundTo(t, s));
      got.push_back(LoadElement(got_sum.data(), t, i));
      // The rounded sum plus this rank's residual, rounded again.
      want_plus.push_back(RoundTo(t, RoundTo(t, s) + LoadElement(res_host[r].data(), t, i)));
      got_plus_f.push_back(LoadElement(got_plus.data(), t, i));
    }
    EXPECT_LE(testing::NormalizedError(got, want), tolerance) << "rank " << r;
    EXPECT_LE(testing::NormalizedError(got_plus_f, want_plus), tolerance) << "rank " << r;
    for (int64_t i = 0; i < m; ++i) {
      for (int q = 0; q < ranks; ++q) {
        EXPECT_EQ(std::memcmp(got_all.data() + (i * ranks + q) * n * DTypeBytes(t),
                              host[q].data() + i * n * DTypeBytes(t),
                              static_cast<size_t>(n * DTypeBytes(t))),
                  0)
            << "rank " << r << " row " << i << " part " << q;
      }
    }
  }
}

TEST(TensorParallelCpu, CollectivesMatchTheirDefinition) {
  for (int ranks : {2, 3}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      MAKE_RUNNER_OR_SKIP(tp, DeviceKind::kCpu, ranks, false);
      CheckCollectives(tp, t, 0.0);
    }
  }
}

TEST(TensorParallelCpu, AFailedRankEndsTheOthersWait) {
  HostCollectives group(3);
  float mine = 1.0f;
  std::vector<absl::Status> seen(2);
  std::vector<std::thread> waiting;
  for (int r = 1; r < 3; ++r) {
    waiting.emplace_back([&, r] { seen[r - 1] = group.Gather(r, &mine).status(); });
  }
  group.Abort(absl::InternalError("rank 0 failed"));
  for (std::thread& t : waiting) t.join();
  for (const absl::Status& s : seen) {
    EXPECT_TRUE(absl::StrContains(s.message(), "rank 0 failed")) << s;
  }
  EXPECT_FALSE(group.Gather(0, &mine).ok());  // the group is spent
}

TEST(TensorParallelCpu, AWrongGroupSizeIsRefusedByName) {
  MAKE_RUNNER_OR_SKIP(tp, DeviceKind::kCpu, 2, false);
  GraphBuilder b;
  b.Output("sum", b.AllReduce(b.Input("x", DType::kF32, {1, 4}), 3, "sum3"));
  const Graph g = *std::move(b).Build();
  void* x0 = *tp.rank(0).AllocateZeroed(16, "x");
  void* x1 = *tp.rank(1).AllocateZeroed(16, "x");
  ASSERT_TRUE(tp.AddStep(g, [&](int r, const Graph&, Bindings& bind) {
                  return bind.Bind("x", r == 0 ? x0 : x1, 16);
                }).ok());
  ASSERT_TRUE(tp.Finalize().ok());
  const absl::Status s = tp.Run(0);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "sum3")) << s;
}

// Greedy steps of a model over `ranks` ranks, fed `tokens` one a step (each step's id is
// the given token, so that runs compare step by step): the chosen ids, which every rank
// must agree on, and rank 0's logits.
struct Trace {
  std::vector<int32_t> ids;
  std::vector<std::vector<float>> logits;
};

absl::StatusOr<Trace> RunTrace(TensorParallelRunner& tp, const LlamaConfig& c,
                               const WeightSource& source,
                               const std::vector<int32_t>& tokens) {
  const int ranks = tp.ranks();
  SG_ASSIGN_OR_RETURN(
      const Graph whole,
      BuildLlamaDecodeGraph(c, {.batch = 1, .max_seq = static_cast<int64_t>(tokens.size())}));
  SG_ASSIGN_OR_RETURN(const ShardPlan plan, LlamaShardPlan(c, ranks));
  SG_ASSIGN_OR_RETURN(const Graph g, ShardGraph(whole, plan, ranks));
  SG_ASSIGN_OR_RETURN(const ShardedBuffers buffers,
                      ShardedBuffers::Upload(tp, whole, g, plan, source));
  std::vector<int32_t*> io(ranks);
  for (int r = 0; r < ranks; ++r) {
    SG_ASSIGN_OR_RETURN(void* p, tp.rank(r).Allocate(8, "ids and positions"));
    io[r] = static_cast<int32_t*>(p);
  }
  SG_ASSIGN_OR_RETURN(const int step, tp.AddStep(g, [&](int r, const Graph& rg, Bindings& b) {
    SG_RETURN_IF_ERROR(buffers.Bind(r, rg, b));
    SG_RETURN_IF_ERROR(b.Bind(kIdsInput, io[r], 4));
    return b.Bind(kPosInput, io[r] + 1, 4);
  }));
  SG_RETURN_IF_ERROR(tp.Finalize());
  Trace trace;
  std::vector<int32_t> next(ranks);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const int32_t in[2] = {tokens[t], static_cast<int32_t>(t)};
    for (int r = 0; r < ranks; ++r) SG_RETURN_IF_ERROR(tp.rank(r).Copy(io[r], in, 8));
    SG_RETURN_IF_ERROR(tp.Run(step));
    SG_ASSIGN_OR_RETURN(const TensorArg logits, tp.rank(0).Output(step, kLogitsOutput));
    std::vector<std::byte> host(static_cast<size_t>(logits.bytes()));
    SG_RETURN_IF_ERROR(tp.rank(0).Copy(host.data(), logits.data, logits.bytes()));
    for (int r = 0; r < ranks; ++r) {
      SG_ASSIGN_OR_RETURN(const TensorArg ids, tp.rank(r).Output(step, kNextIdsOutput));
      SG_RETURN_IF_ERROR(tp.rank(r).Copy(&next[r], ids.data, 4));
    }
    SG_RETURN_IF_ERROR(tp.Sync());
    for (int r = 1; r < ranks; ++r) {
      if (next[r] != next[0]) {
        return absl::InternalError(absl::StrCat("step ", t, ": rank ", r, " chose ", next[r],
                                                ", rank 0 ", next[0]));
      }
    }
    trace.ids.push_back(next[0]);
    std::vector<float> row(static_cast<size_t>(logits.shape.NumElements()));
    for (size_t i = 0; i < row.size(); ++i) row[i] = LoadElement(host.data(), logits.dtype, i);
    trace.logits.push_back(std::move(row));
  }
  return trace;
}

struct Fixture {
  std::string name;
  std::string path;  // a folder or a GGUF file
  std::vector<int32_t> tokens;  // prompt then transformers' (or the writer's) ids
};

// Every fixture whose splits divide by two ranks, with its tokens: the dense families and
// the mixtures of experts, from their folders and (names ending in .gguf) the GGUF files
// llama.cpp's converter wrote of them. The Mixtral Q8_0 file's experts do not split on
// block boundaries (below).
std::vector<Fixture> Fixtures() {
  std::vector<Fixture> out;
  const std::string dir = SG_FIXTURES_DIR;
  for (const std::string name :
       {"f32_gqa", "f32_llama3_rope", "f32_mha_tied", "bf16_gqa", "family_gemma",
        "family_gemma2", "family_gemma3", "family_mistral", "family_phi3", "family_qwen2",
        "family_qwen3", "gguf_f32", "gguf_f16", "gguf_bf16", "family_mixtral",
        "family_qwen3_moe", "family_qwen3_moe_mixed", "family_mixtral.gguf",
        "family_qwen3_moe.gguf"}) {
    const bool gguf = absl::EndsWith(name, ".gguf");
    const std::string folder =
        dir + "/" + (gguf ? name.substr(0, name.size() - 5) : name);
    const Json e = testing::ReadJsonFile(folder + "/expected.json");
    Fixture f{name, gguf || absl::StartsWith(name, "gguf_") ? folder + "/model.gguf" : folder,
              {}};
    if (e.contains("prompt_ids")) f.tokens = e.at("prompt_ids").get<std::vector<int32_t>>();
    const auto gen = e.at("generated_ids").get<std::vector<int32_t>>();
    f.tokens.insert(f.tokens.end(), gen.begin(), gen.end());
    if (f.tokens.size() > 24) f.tokens.resize(24);
    out.push_back(std::move(f));
  }
  return out;
}

// f32 models choose the same ids and logits within f32 rounding of the split sums; bf16
// and f16 activations round each rank's partial sums, so only their logits are compared.
void CompareTraces(const Trace& one, const Trace& many, DType dtype, const std::string& what) {
  ASSERT_EQ(one.ids.size(), many.ids.size());
  const double tolerance = dtype == DType::kF32 ? 1e-5 : 3e-2;
  for (size_t t = 0; t < one.ids.size(); ++t) {
    EXPECT_LE(testing::NormalizedError(many.logits[t], one.logits[t]), tolerance)
        << what << " step " << t;
  }
  if (dtype == DType::kF32) {
    EXPECT_EQ(many.ids, one.ids) << what;
  }
}

void CheckFixtures(DeviceKind device, int ranks, bool eager) {
  for (const Fixture& f : Fixtures()) {
    absl::StatusOr<ModelFiles> files = ModelFiles::Open(f.path);
    ASSERT_TRUE(files.ok()) << files.status();
    const LlamaConfig& c = files->config();
    auto source = [&](const std::string& name) { return files->WeightData(name); };
    absl::StatusOr<std::unique_ptr<TensorParallelRunner>> one = MakeRunner(DeviceKind::kCpu, 1);
    ASSERT_TRUE(one.ok());
    absl::StatusOr<Trace> want = RunTrace(**one, c, source, f.tokens);
    ASSERT_TRUE(want.ok()) << f.name << ": " << want.status();
    MAKE_RUNNER_OR_SKIP(tp, device, ranks, eager);
    absl::StatusOr<Trace> got = RunTrace(tp, c, source, f.tokens);
    ASSERT_TRUE(got.ok()) << f.name << ": " << got.status();
    CompareTraces(*want, *got, c.dtype, absl::StrCat(f.name, " over ", ranks, " ranks"));
  }
}

TEST(TensorParallelCpu, ShardedEqualsUnshardedOnEveryFixture) {
  CheckFixtures(DeviceKind::kCpu, 2, false);
}

// Names every weight of `rank` dimensions of `c`'s graph in weight_dtypes as `t` (the
// matrices 2, the stacked experts 3), for CheckRandomWeights to pick their formats.
void NameWeights(LlamaConfig& c, int rank, DType t) {
  const Graph g = *BuildLlamaDecodeGraph(c, {.max_seq = 8});
  for (const Tensor& w : g.tensors()) {
    if (w.kind == TensorKind::kWeight && w.shape.rank() == rank) c.weight_dtypes[w.name] = t;
  }
}

// Block-format experts whose down matrices would split inside a block are refused by the
// tensor's name: 96 intermediate values are 48 a rank, not whole Q8_0 blocks of 32. (The
// Mixtral Q8_0 fixture is refused too, by its first such matrix: o's 32 columns.)
TEST(TensorParallelCpu, RoutedBlocksThatDoNotSplitAreRefusedByName) {
  LlamaConfig c = testing::MoeTinyConfigs(DType::kF32)[0].second;
  NameWeights(c, 3, DType::kQ8_0);
  absl::StatusOr<Graph> g = ShardGraph(*BuildLlamaDecodeGraph(c, {.max_seq = 8}),
                                       *LlamaShardPlan(c, 2), 2);
  ASSERT_FALSE(g.ok());
  EXPECT_TRUE(absl::StrContains(g.status().message(),
                                "experts.down_proj.weight' [8,256,96] in q8_0 splits into "
                                "[8,256,48]"))
      << g.status();
  absl::StatusOr<ModelFiles> files =
      ModelFiles::Open(std::string(SG_FIXTURES_DIR) + "/family_mixtral_q8_0/model.gguf");
  ASSERT_TRUE(files.ok()) << files.status();
  const LlamaConfig& q8 = files->config();
  g = ShardGraph(*BuildLlamaDecodeGraph(q8, {.max_seq = 8}), *LlamaShardPlan(q8, 2), 2);
  ASSERT_FALSE(g.ok());
  EXPECT_TRUE(absl::StrContains(g.status().message(), "o_proj.weight' [32,32] in q8_0"))
      << g.status();
}

// The fixtures' quantized files split their 160-value MLP rows into 80 per rank: not whole
// blocks, refused by name.
TEST(TensorParallelCpu, BlocksThatDoNotSplitAreRefusedByName) {
  absl::StatusOr<ModelFiles> files =
      ModelFiles::Open(std::string(SG_FIXTURES_DIR) + "/gguf_q4_0/model.gguf");
  ASSERT_TRUE(files.ok()) << files.status();
  const LlamaConfig& c = files->config();
  absl::StatusOr<Graph> g =
      ShardGraph(*BuildLlamaDecodeGraph(c, {.max_seq = 8}), *LlamaShardPlan(c, 2), 2);
  ASSERT_FALSE(g.ok());
  EXPECT_TRUE(absl::StrContains(g.status().message(), "down_proj.weight' [64,160] in q4_0"))
      << g.status();
}

// Random weights, the matrices in `pick`'s formats, over `ranks` ranks against one.
template <typename Pick>
void CheckRandomWeights(LlamaConfig c, int ranks, Pick pick, const std::string& what,
                        DeviceKind device = DeviceKind::kCpu, bool eager = false,
                        bool one_shot = true) {
  for (auto& [name, dtype] : c.weight_dtypes) dtype = pick(name);
  const Graph whole = *BuildLlamaDecodeGraph(c, {.max_seq = 12});
  absl::StatusOr<RandomWeights> weights = RandomWeights::Create(whole, 11, 1);
  ASSERT_TRUE(weights.ok());
  auto source = [&](const std::string& name) -> absl::StatusOr<absl::Span<const std::byte>> {
    const BufferLayout::Entry* e = weights->layout().Find(name);
    if (e == nullptr) return absl::NotFoundError(name);
    return weights->bytes().subspan(static_cast<size_t>(e->offset), static_cast<size_t>(e->bytes));
  };
  std::vector<int32_t> tokens = {5, 900, 17, 3, 256, 1000, 42, 7, 8, 600, 1, 2};
  MAKE_RUNNER_OR_SKIP(one, DeviceKind::kCpu, 1, false);
  MAKE_RUNNER_OR_SKIP(many, device, ranks, eager, one_shot);
  absl::StatusOr<Trace> want = RunTrace(one, c, source, tokens);
  absl::StatusOr<Trace> got = RunTrace(many, c, source, tokens);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  CompareTraces(*want, *got, c.dtype, what);
}

// Heads that divide by 4: four ranks, two layers, f32.
TEST(TensorParallelCpu, FourRanksOfRandomWeights) {
  LlamaConfig c = TinyLlamaConfig();
  c.num_key_value_heads = 4;
  c.num_hidden_layers = 2;
  CheckRandomWeights(c, 4, [](const std::string&) { return DType::kF32; }, "f32 over 4 ranks");
}

// Biases everywhere: q, k, v, gate and up split with their rows; o's and down's, added
// before the AllReduce, held by the first rank alone.
TEST(TensorParallelCpu, BiasesOverTwoRanks) {
  LlamaConfig c = TinyLlamaConfig();
  c.attention_bias = true;
  c.mlp_bias = true;
  c.num_hidden_layers = 2;
  CheckRandomWeights(c, 2, [](const std::string&) { return DType::kF32; }, "biases over 2 ranks");
}

// Every block format the loaders take, split on block boundaries: 512 hidden, 8 heads of
// 64 (o's 512 columns are 256 per rank: whole K-format blocks), MLP 1024.
TEST(TensorParallelCpu, BlockFormatsOverTwoRanks) {
  LlamaConfig c = TinyLlamaConfig();
  c.hidden_size = 512;
  c.head_dim = 64;
  c.intermediate_size = 1024;
  c.num_hidden_layers = 2;
  NameWeights(c, 2, DType::kF32);
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                  DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    CheckRandomWeights(c, 2, [t](const std::string&) { return t; },
                       absl::StrCat(DTypeName(t), " over 2 ranks"));
  }
}

// Mixtures of experts of random weights (Mixtral's routing; Qwen3-MoE's with a dense first
// layer, three experts a token and weights not renormalised): f32 experts over two and four
// ranks, and block-format experts over two (128 intermediate values, 64 a rank: whole
// blocks of the 32-value formats).
TEST(TensorParallelCpu, RoutedLayersOverTwoAndFourRanks) {
  for (auto [name, c] : testing::MoeTinyConfigs(DType::kF32)) {
    c.num_key_value_heads = 4;
    CheckRandomWeights(c, 2, [](const std::string&) { return DType::kF32; },
                       name + " over 2 ranks");
    CheckRandomWeights(c, 4, [](const std::string&) { return DType::kF32; },
                       name + " over 4 ranks");
    c.moe_intermediate_size = 128;
    NameWeights(c, 3, DType::kF32);
    for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ5_1}) {
      CheckRandomWeights(c, 2, [t](const std::string&) { return t; },
                         absl::StrCat(name, ", ", DTypeName(t), " experts over 2 ranks"));
    }
  }
}

// The real SmolLM2-135M (Q4_1, 9 heads, 3 KV heads) over three ranks reproduces
// transformers' greedy ids.
TEST(TensorParallelCpu, SmolLM2OverThreeRanksEqualsTransformers) {
  const std::string path = testing::TestCacheDir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::ifstream(path).good()) {
    GTEST_SKIP() << path << " is absent: run tests/fixtures/fetch_smollm2.sh";
  }
  absl::StatusOr<ModelFiles> files = ModelFiles::Open(path);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_FALSE(LlamaShardPlan(files->config(), 2).ok());  // 3 KV heads
  const Json expected =
      testing::ReadJsonFile(std::string(SG_FIXTURES_DIR) + "/smollm2/expected.json");
  const Json& c = expected.at("cases").at(0);
  std::vector<int32_t> tokens = c.at("prompt_ids").get<std::vector<int32_t>>();
  const size_t prompt = tokens.size();
  std::vector<int32_t> generated = c.at("generated").get<std::vector<int32_t>>();
  // Under the sanitizers (ten times slower) the first ids cover every code path.
  if (testing::kSanitizedBuild) generated.resize(std::min<size_t>(generated.size(), 4));
  tokens.insert(tokens.end(), generated.begin(), generated.end() - 1);
  MAKE_RUNNER_OR_SKIP(tp, DeviceKind::kCpu, 3, false);
  absl::StatusOr<Trace> got =
      RunTrace(tp, files->config(),
               [&](const std::string& name) { return files->WeightData(name); }, tokens);
  ASSERT_TRUE(got.ok()) << got.status();
  const std::vector<int32_t> chosen(got->ids.begin() + static_cast<long>(prompt) - 1,
                                    got->ids.end());
  EXPECT_EQ(chosen, generated);
}

// ---- Sessions over several ranks: every call on every rank, rank 0's answer.

absl::StatusOr<std::unique_ptr<DecodeSession>> ShardedSession(const std::string& path, int ranks,
                                                              Backend backend,
                                                              int64_t slots = 1,
                                                              bool penalties = false) {
  SessionOptions o;
  o.model_path = path;
  o.backend = backend;
  o.cpu_threads = 1;
  o.max_slots = slots;
  o.max_seq = 64;
  o.prefill_chunk = 16;  // prompts through sharded prefill steps too
  o.penalties = penalties;
  o.tensor_parallel = ranks;
  return DecodeSession::Create(o);
}

// Greedy ids of the prompts (one slot each) after `n` steps, and of slot 0 again after its
// sequence moved to the last slot and the others were released.
absl::StatusOr<std::vector<std::vector<int32_t>>> SessionIds(DecodeSession& s,
                                                            const std::vector<int32_t>& prompt,
                                                            int64_t n, bool penalize = false) {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<PrefillRequest> requests;
  for (int64_t slot = 0; slot < s.max_slots(); ++slot) {
    std::vector<int32_t> p(prompt.begin(), prompt.end() - slot);  // different lengths
    prompts.push_back(p);
  }
  Penalties penalties;
  penalties.repetition = 1.3f;
  for (int64_t slot = 0; slot < s.max_slots(); ++slot) {
    PrefillRequest r{slot, prompts[static_cast<size_t>(slot)], 7};
    if (penalize) r.sampling = SlotSampling{std::nullopt, penalties};
    requests.push_back(r);
  }
  SG_RETURN_IF_ERROR(s.Prefill(requests));
  SG_ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> ids, s.Generate(n));
  if (s.max_slots() > 1) {
    const int64_t last = s.max_slots() - 1;
    SG_RETURN_IF_ERROR(s.Release(last));
    SG_RETURN_IF_ERROR(s.MoveSlot(0, last));
    SG_ASSIGN_OR_RETURN(std::vector<int32_t> more, s.Generate(last, 4));
    ids.push_back(more);
  }
  return ids;
}

TEST(TensorParallelCpu, SessionsOverTwoRanksEqualOneRank) {
  for (const char* name :
       {"f32_gqa", "family_qwen2", "family_gemma2", "gguf_f32", "family_qwen3_moe_mixed"}) {
    const std::string dir = std::string(SG_FIXTURES_DIR) + "/" + name;
    const std::string path = absl::StartsWith(name, "gguf_") ? dir + "/model.gguf" : dir;
    const Json e = testing::ReadJsonFile(dir + "/expected.json");
    std::vector<int32_t> prompt = e.contains("prompt_ids")
                                      ? e.at("prompt_ids").get<std::vector<int32_t>>()
                                      : std::vector<int32_t>{1, 2, 3, 4, 5, 6};
    for (bool penalize : {false, true}) {
      SCOPED_TRACE(absl::StrCat(name, penalize ? " with penalties" : ""));
      absl::StatusOr<std::unique_ptr<DecodeSession>> one =
          ShardedSession(path, 1, Backend::kCpu, 3, penalize);
      absl::StatusOr<std::unique_ptr<DecodeSession>> two =
          ShardedSession(path, 2, Backend::kCpu, 3, penalize);
      ASSERT_TRUE(one.ok()) << one.status();
      ASSERT_TRUE(two.ok()) << two.status();
      EXPECT_TRUE(absl::StrContains((*two)->Describe(), "tensor parallel over 2 ranks"));
      absl::StatusOr<std::vector<std::vector<int32_t>>> want = SessionIds(**one, prompt, 10, penalize);
      absl::StatusOr<std::vector<std::vector<int32_t>>> got = SessionIds(**two, prompt, 10, penalize);
      ASSERT_TRUE(want.ok()) << want.status();
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, *want);
      if (!penalize && e.contains("generated_ids")) {
        // Slot 0 fed the whole prompt: transformers' own greedy ids.
        const auto gen = e.at("generated_ids").get<std::vector<int32_t>>();
        EXPECT_EQ((*got)[0], std::vector<int32_t>(gen.begin(), gen.begin() + 10));
      }
    }
  }
  absl::StatusOr<std::unique_ptr<DecodeSession>> three =
      ShardedSession(std::string(SG_FIXTURES_DIR) + "/f32_gqa", 3, Backend::kCpu);
  ASSERT_FALSE(three.ok());
  EXPECT_TRUE(absl::StrContains(three.status().message(), "does not divide by 3")) << three.status();
}

// The real SmolLM2 through a session over three ranks: transformers' ids.
TEST(TensorParallelCpu, SmolLM2SessionOverThreeRanksEqualsTransformers) {
  const std::string path = testing::TestCacheDir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::ifstream(path).good()) {
    GTEST_SKIP() << path << " is absent: run tests/fixtures/fetch_smollm2.sh";
  }
  const Json expected =
      testing::ReadJsonFile(std::string(SG_FIXTURES_DIR) + "/smollm2/expected.json");
  absl::StatusOr<std::unique_ptr<DecodeSession>> s = ShardedSession(path, 3, Backend::kCpu);
  ASSERT_TRUE(s.ok()) << s.status();
  const size_t cases = testing::kSanitizedBuild ? 1 : 2;
  for (size_t i = 0; i < cases; ++i) {
    const Json& c = expected.at("cases").at(i);
    const auto prompt = c.at("prompt_ids").get<std::vector<int32_t>>();
    std::vector<int32_t> want = c.at("generated").get<std::vector<int32_t>>();
    if (testing::kSanitizedBuild) want.resize(std::min<size_t>(want.size(), 4));
    ASSERT_TRUE((*s)->Prefill(0, prompt).ok());
    absl::StatusOr<std::vector<int32_t>> got =
        (*s)->Generate(0, static_cast<int64_t>(want.size()));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, want) << c.at("text").get<std::string>();
    ASSERT_TRUE((*s)->Release(0).ok());
  }
}

// ---- GPUs: skip unless this machine has two and the build has NCCL.

// Through NCCL and through the one-shot kernel, small (one block of the kernel) and 128 KiB
// (several blocks).
TEST(TensorParallelCuda, CollectivesMatchTheirDefinition) {
  for (bool one_shot : {false, true}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      for (const auto& [m, n] : {std::pair<int64_t, int64_t>{3, 40}, {16, 4096}}) {
        MAKE_RUNNER_OR_SKIP(tp, DeviceKind::kCuda, 2, false, one_shot);
        SCOPED_TRACE(absl::StrCat(one_shot ? "one-shot " : "NCCL ", DTypeName(t), " ", m, "x", n));
        // Two ranks: one addition, rounded once, as the reference does.
        CheckCollectives(tp, t, 0.0, m, n);
      }
    }
  }
}

// Four and eight GPUs where the machine has them: NCCL adds in its own order and rounds
// its partial sums in the dtype.
TEST(TensorParallelCuda, CollectivesOverFourAndEightGpus) {
  if (!Available(DeviceKind::kCuda, 4)) GTEST_SKIP() << "fewer than 4 GPUs, or no NCCL";
  for (int ranks : {4, 8}) {
    if (!Available(DeviceKind::kCuda, ranks)) continue;
    for (bool one_shot : {false, true}) {
      for (DType t : {DType::kF32, DType::kBF16}) {
        MAKE_RUNNER_OR_SKIP(tp, DeviceKind::kCuda, ranks, false, one_shot);
        SCOPED_TRACE(absl::StrCat(ranks, " GPUs, ", one_shot ? "one-shot " : "NCCL ", DTypeName(t)));
        // The one-shot kernel adds in rank order in f32 and rounds once, as the reference.
        CheckCollectives(tp, t, one_shot ? 0.0 : t == DType::kF32 ? 1e-6 : 1e-2, 16, 4096);
      }
    }
  }
}

// Random weights (8 KV heads) over 2, 4 and 8 GPUs against one rank of the CPU reference.
TEST(TensorParallelCuda, RandomWeightsOverEveryGpuCount) {
  LlamaConfig c = TinyLlamaConfig();
  c.num_key_value_heads = 8;
  c.num_hidden_layers = 2;
  c.intermediate_size = 1024;
  if (!Available(DeviceKind::kCuda, 2)) GTEST_SKIP() << "fewer than 2 GPUs, or no NCCL";
  for (int ranks : {2, 4, 8}) {
    if (!Available(DeviceKind::kCuda, ranks)) continue;
    for (bool eager : {false, true}) {
      for (bool one_shot : {false, true}) {
        CheckRandomWeights(c, ranks, [](const std::string&) { return DType::kF32; },
                           absl::StrCat("f32 over ", ranks, " GPUs", eager ? ", eager" : "",
                                        one_shot ? ", one-shot" : ", NCCL"),
                           DeviceKind::kCuda, eager, one_shot);
      }
    }
  }
}

TEST(TensorParallelCuda, ShardedEqualsUnshardedReplayed) { CheckFixtures(DeviceKind::kCuda, 2, false); }

TEST(TensorParallelCuda, ShardedEqualsUnshardedEager) { CheckFixtures(DeviceKind::kCuda, 2, true); }

TEST(TensorParallelCuda, SessionsOverTwoGpusEqualTheCpuReference) {
  if (!Available(DeviceKind::kCuda, 2)) GTEST_SKIP() << "fewer than 2 GPUs, or no NCCL";
  const std::string dir = std::string(SG_FIXTURES_DIR) + "/f32_gqa";
  const auto prompt = testing::ReadJsonFile(dir + "/expected.json")
                          .at("prompt_ids")
                          .get<std::vector<int32_t>>();
  for (bool penalize : {false, true}) {
    absl::StatusOr<std::unique_ptr<DecodeSession>> cpu =
        ShardedSession(dir, 1, Backend::kCpu, 3, penalize);
    absl::StatusOr<std::unique_ptr<DecodeSession>> gpu =
        ShardedSession(dir, 2, Backend::kCuda, 3, penalize);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    absl::StatusOr<std::vector<std::vector<int32_t>>> want = SessionIds(**cpu, prompt, 10, penalize);
    absl::StatusOr<std::vector<std::vector<int32_t>>> got = SessionIds(**gpu, prompt, 10, penalize);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, *want) << (penalize ? "with penalties" : "");
  }
}

}  // namespace
}  // namespace sg
