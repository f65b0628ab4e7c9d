// DecodeSession: on the CPU reference, a session's ids must be exactly those of a plain
// token-by-token Execute loop over a batch-1 graph, whatever the slot, the bucket, the
// other live slots and the padding around it; sampling must be reproducible; bad input
// must be refused with errors that say what was wrong. On a GPU (skipped without one)
// the CUDA backend, replayed and eager, must give the CPU's ids.
#include "stepgraph/runtime/session.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "stepgraph/models/llama.h"
#include "nlohmann/json.hpp"
#include "models/random_weights.h"
#include "stepgraph/dispatch/cpu_dispatch.h"
#include "stepgraph/dispatch/executor.h"
#include "stepgraph/base/half.h"
#include "stepgraph/graph/memory_plan.h"
#include "tests/models/session_parity.h"
#include "tests/testing/family_configs.h"
#include "tests/testing/util.h"

#ifndef SG_FIXTURES_DIR
#error "SG_FIXTURES_DIR must name tests/fixtures"
#endif

namespace sg {
namespace {

constexpr uint64_t kWeightSeed = 7;

SessionOptions CpuOptions(int64_t slots, int64_t max_seq) {
  SessionOptions o;
  o.config = TinyLlamaConfig();
  o.weight_seed = kWeightSeed;
  o.backend = Backend::kCpu;
  o.max_slots = slots;
  o.max_seq = max_seq;
  return o;
}

std::unique_ptr<DecodeSession> MakeSession(const SessionOptions& o) {
  absl::StatusOr<std::unique_ptr<DecodeSession>> s = DecodeSession::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

// Distinct random prompts: ids spread over the vocabulary.
std::vector<int32_t> Prompt(int64_t n, uint32_t seed, int64_t vocab = 1024) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int32_t& v : p) v = id(rng);
  return p;
}

// `n` greedy ids of one sequence from a fresh single-slot session.
std::vector<int32_t> Alone(const SessionOptions& base, const std::vector<int32_t>& prompt,
                           int64_t n, int32_t seed = 0) {
  SessionOptions o = base;
  o.max_slots = 1;
  std::unique_ptr<DecodeSession> s = MakeSession(o);
  if (s == nullptr) return {};
  EXPECT_TRUE(s->Prefill(0, prompt, seed).ok());
  absl::StatusOr<std::vector<int32_t>> ids = s->Generate(0, n);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

struct PlainRun {
  std::vector<int32_t> ids;
  std::vector<float> last_logits;
};

// The definition a session must meet: a batch-1, open-loop graph executed one token per
// step on the CPU reference, the host feeding each chosen id back, arena poisoned before
// every step.
PlainRun PlainExecuteLoop(const LlamaConfig& config, const std::vector<int32_t>& prompt,
                          int64_t n, int64_t max_seq) {
  PlainRun out;
  LlamaGraphOptions go;
  go.batch = 1;
  go.max_seq = max_seq;
  absl::StatusOr<Graph> graph = BuildLlamaDecodeGraph(config, go);
  EXPECT_TRUE(graph.ok()) << graph.status();
  if (!graph.ok()) return out;
  absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*std::move(graph));
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return out;
  const Graph& g = plan->graph();
  absl::StatusOr<RandomWeights> weights = RandomWeights::Create(g, kWeightSeed, 1);
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (!weights.ok()) return out;
  Bindings b(g);
  EXPECT_TRUE(weights->Bind(g, b).ok());
  std::vector<std::byte> arena(static_cast<size_t>(plan->arena_bytes()));
  b.SetArena(arena.data(), static_cast<int64_t>(arena.size()));
  std::vector<std::vector<std::byte>> states;
  for (int32_t i = 0; i < g.num_tensors(); ++i) {
    const Tensor& t = g.tensors()[i];
    if (t.kind != TensorKind::kState) continue;
    states.emplace_back(static_cast<size_t>(t.bytes()), std::byte{0});
    EXPECT_TRUE(b.Bind(g.id(i), states.back().data(), t.bytes()).ok());
  }
  int32_t ids = 0, pos = 0;
  EXPECT_TRUE(b.Bind(kIdsInput, &ids, sizeof(ids)).ok());
  EXPECT_TRUE(b.Bind(kPosInput, &pos, sizeof(pos)).ok());
  EXPECT_TRUE(CheckBindings(*plan, b).ok());
  CpuDispatch dispatch;
  const int32_t next_index = g.FindOutput(kNextIdsOutput)->index;
  const int32_t logits_index = g.FindOutput(kLogitsOutput)->index;
  const int64_t p = static_cast<int64_t>(prompt.size());
  for (int64_t step = 0; step < p + n - 1; ++step) {
    ids = step < p ? prompt[step] : out.ids[step - p];
    pos = static_cast<int32_t>(step);
    std::memset(arena.data(), 0xFF, arena.size());
    absl::StatusOr<ExecStats> st = Execute(*plan, b, dispatch);
    EXPECT_TRUE(st.ok()) << st.status();
    if (!st.ok()) return out;
    if (step >= p - 1) {
      out.ids.push_back(*static_cast<const int32_t*>(ResolveTensor(*plan, b, next_index).data));
    }
  }
  const TensorArg l = ResolveTensor(*plan, b, logits_index);
  out.last_logits.assign(l.as<const float>(), l.as<const float>() + l.shape.NumElements());
  return out;
}

// ---- random weights -----------------------------------------------------------------

TEST(RandomWeightsTest, DeterministicWhateverTheThreadsAndDistinctPerSeed) {
  LlamaGraphOptions go;
  absl::StatusOr<Graph> g = BuildLlamaDecodeGraph(TinyLlamaConfig(), go);
  ASSERT_TRUE(g.ok());
  absl::StatusOr<RandomWeights> one = RandomWeights::Create(*g, 3, 1);
  absl::StatusOr<RandomWeights> four = RandomWeights::Create(*g, 3, 4);
  absl::StatusOr<RandomWeights> other = RandomWeights::Create(*g, 4, 4);
  ASSERT_TRUE(one.ok() && four.ok() && other.ok());
  ASSERT_EQ(one->bytes().size(), four->bytes().size());
  EXPECT_EQ(std::memcmp(one->bytes().data(), four->bytes().data(), one->bytes().size()), 0);
  EXPECT_NE(std::memcmp(one->bytes().data(), other->bytes().data(), one->bytes().size()), 0);

  // Every element is the documented function of (seed, name, index), inside its range.
  for (const BufferLayout::Entry& e : one->layout().entries) {
    const Tensor& t = g->tensors()[e.tensor];
    const float* v = reinterpret_cast<const float*>(one->bytes().data() + e.offset);
    const bool norm = t.shape.rank() == 1 && absl::EndsWith(t.name, "norm.weight");
    const float center = norm ? 1.0f : 0.0f, a = RandomWeightScale(t);
    double sum = 0;
    for (int64_t i = 0; i < t.shape.NumElements(); ++i) {
      ASSERT_LE(std::fabs(v[i] - center), a) << t.name << "[" << i << "]";
      sum += v[i] - center;
    }
    EXPECT_LT(std::fabs(sum / t.shape.NumElements()), a * 0.2) << t.name << " is not centred";
    for (int64_t i : {int64_t{0}, t.shape.NumElements() / 2, t.shape.NumElements() - 1}) {
      EXPECT_EQ(v[i], RandomWeightValue(3, t.name, i, t)) << t.name << "[" << i << "]";
    }
  }
}

TEST(RandomWeightsTest, Bf16WeightsAreTheF32ValuesRounded) {
  LlamaConfig c = TinyLlamaConfig();
  c.dtype = DType::kBF16;
  absl::StatusOr<Graph> g = BuildLlamaDecodeGraph(c, LlamaGraphOptions{});
  ASSERT_TRUE(g.ok());
  absl::StatusOr<RandomWeights> w = RandomWeights::Create(*g, 5);
  ASSERT_TRUE(w.ok());
  const BufferLayout::Entry& e = w->layout().entries[1];
  const Tensor& t = g->tensors()[e.tensor];
  const uint16_t* v = reinterpret_cast<const uint16_t*>(w->bytes().data() + e.offset);
  for (int64_t i = 0; i < 64; ++i) {
    EXPECT_EQ(v[i], FloatToBF16(RandomWeightValue(5, t.name, i, t)));
  }
}

// ---- CPU sessions ---------------------------------------------------------------------

class SessionEqualsPlainLoop : public ::testing::TestWithParam<int64_t> {};

TEST_P(SessionEqualsPlainLoop, IdsAndLogits) {
  const int64_t prompt_len = GetParam();
  constexpr int64_t kNew = 20, kMaxSeq = 48;
  const std::vector<int32_t> prompt = Prompt(prompt_len, 11);
  std::unique_ptr<DecodeSession> s = MakeSession(CpuOptions(1, kMaxSeq));
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->backend(), Backend::kCpu);
  EXPECT_TRUE(s->eager());
  ASSERT_TRUE(s->Prefill(0, prompt).ok());
  EXPECT_EQ(s->position(0), prompt_len - 1);
  absl::StatusOr<std::vector<int32_t>> ids = s->Generate(0, kNew);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(s->position(0), prompt_len - 1 + kNew);
  absl::StatusOr<std::vector<float>> logits = s->Logits(0);
  ASSERT_TRUE(logits.ok()) << logits.status();

  const PlainRun want = PlainExecuteLoop(TinyLlamaConfig(), prompt, kNew, kMaxSeq);
  ASSERT_EQ(want.ids.size(), static_cast<size_t>(kNew));
  EXPECT_EQ(*ids, want.ids);
  EXPECT_LE(testing::NormalizedError(*logits, want.last_logits), 1e-6);
  // A model whose ids do not depend on the context would pass trivially.
  EXPECT_GT(std::set<int32_t>(ids->begin(), ids->end()).size(), 3u);
  absl::StatusOr<std::vector<int32_t>> tokens = s->Tokens(0);
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ(*tokens, *ids);
}

INSTANTIATE_TEST_SUITE_P(PromptLengths, SessionEqualsPlainLoop, ::testing::Values(1, 2, 9));

TEST(SessionCpuTest, TwoSlotsAtDifferentPositionsMatchIndependentSessions) {
  const SessionOptions o = CpuOptions(2, 40);
  const std::vector<int32_t> a = Prompt(5, 1), b = Prompt(9, 2);
  std::unique_ptr<DecodeSession> s = MakeSession(o);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Prefill(0, a).ok());
  ASSERT_TRUE(s->Generate(3).ok());
  ASSERT_TRUE(s->Prefill(1, b).ok());
  absl::StatusOr<std::vector<std::vector<int32_t>>> both = s->Generate(10);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(s->position(0), 4 + 13);
  EXPECT_EQ(s->position(1), 8 + 10);
  absl::StatusOr<std::vector<int32_t>> slot0 = s->Tokens(0);
  ASSERT_TRUE(slot0.ok());
  EXPECT_EQ(*slot0, Alone(o, a, 13));
  EXPECT_EQ((*both)[1], Alone(o, b, 10));
  EXPECT_NE((*both)[0], (*both)[1]);
}

TEST(SessionCpuTest, PassesRunOnBucketsUpToPassesMaxRows) {
  SessionOptions o = CpuOptions(4, 40);
  o.buckets = {1, 2, 4};
  std::unique_ptr<DecodeSession> fused = MakeSession(o);
  ASSERT_NE(fused, nullptr);
  o.passes.enabled = false;
  std::unique_ptr<DecodeSession> plain = MakeSession(o);
  ASSERT_NE(plain, nullptr);
  for (int64_t bucket : {1, 2}) {
    EXPECT_LT(fused->plan(bucket)->graph().num_nodes(), plain->plan(bucket)->graph().num_nodes())
        << "bucket " << bucket;
  }
  EXPECT_EQ(fused->plan(4)->graph().num_nodes(), plain->plan(4)->graph().num_nodes());
  // The same ids whichever graph a bucket runs.
  for (DecodeSession* s : {fused.get(), plain.get()}) {
    for (int64_t slot = 0; slot < 4; ++slot) ASSERT_TRUE(s->Prefill(slot, Prompt(3, slot)).ok());
  }
  absl::StatusOr<std::vector<std::vector<int32_t>>> a = fused->Generate(4);
  absl::StatusOr<std::vector<std::vector<int32_t>>> b = plain->Generate(4);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*a, *b);
}

TEST(SessionCpuTest, PaddingRowsDoNotDisturbLiveRows) {
  SessionOptions o = CpuOptions(4, 40);
  o.buckets = {1, 2, 4};
  const std::vector<int32_t> a = Prompt(6, 3), b = Prompt(4, 4);
  std::unique_ptr<DecodeSession> s = MakeSession(o);
  ASSERT_NE(s, nullptr);
  // Slot 3 alone: rows 0..2 of the 4-row bucket are padding.
  ASSERT_TRUE(s->Prefill(3, a).ok());
  absl::StatusOr<std::vector<int32_t>> alone = s->Generate(3, 12);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(*alone, Alone(o, a, 12));
  ASSERT_TRUE(s->Release(3).ok());
  EXPECT_FALSE(s->live(3));

  // Slot 0 keeps decoding while slot 2 is prefilled (slot 0 padded meanwhile), decodes
  // beside it, and is released.
  ASSERT_TRUE(s->Prefill(0, a).ok());
  ASSERT_TRUE(s->Generate(4).ok());
  ASSERT_TRUE(s->Prefill(2, b).ok());
  absl::StatusOr<std::vector<std::vector<int32_t>>> mid = s->Generate(4);
  ASSERT_TRUE(mid.ok()) << mid.status();
  ASSERT_TRUE(s->Release(2).ok());
  ASSERT_TRUE(s->Generate(4).ok());
  absl::StatusOr<std::vector<int32_t>> slot0 = s->Tokens(0);
  ASSERT_TRUE(slot0.ok());
  EXPECT_EQ(*slot0, Alone(o, a, 12));
  EXPECT_EQ((*mid)[2], Alone(o, b, 4));
  EXPECT_TRUE((*mid)[1].empty() && (*mid)[3].empty());
}

TEST(SessionCpuTest, PrefillRestartsASlot) {
  const SessionOptions o = CpuOptions(1, 40);
  const std::vector<int32_t> a = Prompt(7, 5), b = Prompt(3, 6);
  std::unique_ptr<DecodeSession> s = MakeSession(o);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Prefill(0, a).ok());
  ASSERT_TRUE(s->Generate(20).ok());
  // The old sequence's KV entries beyond the new prompt must not leak into the new one.
  ASSERT_TRUE(s->Prefill(0, b).ok());
  absl::StatusOr<std::vector<int32_t>> ids = s->Generate(0, 10);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, Alone(o, b, 10));
  EXPECT_EQ(*s->Tokens(0), *ids);
}

TEST(SessionCpuTest, IdRingSmallerThanTheRunIsDrainedOnTheWay) {
  SessionOptions o = CpuOptions(2, 40);
  o.id_ring_steps = 3;
  const std::vector<int32_t> a = Prompt(4, 7), b = Prompt(6, 8);
  std::unique_ptr<DecodeSession> s = MakeSession(o);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Prefill(0, a).ok());
  ASSERT_TRUE(s->Prefill(1, b).ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(s->Step().ok());
  absl::StatusOr<std::vector<std::vector<int32_t>>> more = s->Generate(6);
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_EQ(*s->Tokens(0), Alone(o, a, 11));
  EXPECT_EQ(*s->Tokens(1), Alone(o, b, 11));
  EXPECT_EQ((*more)[1].size(), 6u);
}

TEST(SessionCpuTest, SamplingIsReproducibleAndPerSlot) {
  SessionOptions o = CpuOptions(2, 40);
  o.sampling = ops::Sample{1.0f, 0, 0.95f};
  const std::vector<int32_t> a = Prompt(5, 9);
  auto sampled = [&](int32_t seed) { return Alone(o, a, 16, seed); };
  const std::vector<int32_t> first = sampled(42);
  ASSERT_EQ(first.size(), 16u);
  EXPECT_EQ(sampled(42), first);
  EXPECT_NE(sampled(43), first);
  EXPECT_NE(Alone(CpuOptions(1, 40), a, 16), first) << "sampling made no difference";

  // The same seed in slot 1 beside another sequence draws the same ids.
  std::unique_ptr<DecodeSession> s = MakeSession(o);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Prefill(0, Prompt(8, 10), 7).ok());
  ASSERT_TRUE(s->Generate(2).ok());
  ASSERT_TRUE(s->Prefill(1, a, 42).ok());
  absl::StatusOr<std::vector<int32_t>> ids = s->Generate(1, 16);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, first);
}

TEST(SessionCpuTest, TimedStepsAndProfiledStepsAreOrdinarySteps) {
  const SessionOptions o = CpuOptions(1, 40);
  const std::vector<int32_t> a = Prompt(5, 12);
  std::unique_ptr<DecodeSession> s = MakeSession(o);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Prefill(0, a).ok());
  absl::StatusOr<std::vector<double>> times = s->TimedSteps(4);
  ASSERT_TRUE(times.ok()) << times.status();
  ASSERT_EQ(times->size(), 4u);
  for (double t : *times) EXPECT_GT(t, 0.0);
  absl::StatusOr<std::vector<NodeTime>> profile = s->ProfileStep();
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_EQ(profile->size(), static_cast<size_t>(s->plan(1)->graph().num_nodes()));
  EXPECT_EQ(profile->front().op, "Embedding");
  EXPECT_EQ(profile->back().op, "Advance");
  ASSERT_TRUE(s->Generate(3).ok());
  EXPECT_EQ(*s->Tokens(0), Alone(o, a, 8));
}

// A profiled prefill is an ordinary prefill: the same ids after it; its nodes are the
// prefill graph's, once each by name, summed over the prompt's steps (three of 8 rows
// and one of the rest for a prompt of 29 tokens).
TEST(SessionCpuTest, ProfiledPrefillIsAnOrdinaryPrefill) {
  SessionOptions o = CpuOptions(1, 64);
  o.prefill_chunk = 8;
  const std::vector<int32_t> a = Prompt(29, 31);
  std::unique_ptr<DecodeSession> s = MakeSession(o);
  ASSERT_NE(s, nullptr);
  absl::StatusOr<std::vector<NodeTime>> nodes = s->ProfilePrefill(0, a);
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_EQ(s->prefill_steps(), 4);
  ASSERT_FALSE(nodes->empty());
  std::set<std::string> names;
  std::map<std::string, int> ops;
  double total = 0;
  for (const NodeTime& n : *nodes) {
    EXPECT_TRUE(names.insert(n.name).second) << n.name << " twice";
    EXPECT_GE(n.ms, 0.0) << n.name;
    ++ops[n.op];
    total += n.ms;
  }
  EXPECT_GT(total, 0.0);
  // A prefill step computes no logits, so its last layer stops at the KV writes.
  EXPECT_EQ(ops["Attention"], TinyLlamaConfig().num_hidden_layers - 1);
  EXPECT_EQ(ops["KvWrite"], 2 * TinyLlamaConfig().num_hidden_layers);
  EXPECT_EQ(nodes->front().op, "Embedding");
  ASSERT_TRUE(s->Generate(6).ok());
  EXPECT_EQ(*s->Tokens(0), Alone(o, a, 6));
  // No prefill step, nothing to time: a one-token prompt, and prompts fed by decode steps.
  nodes = s->ProfilePrefill(0, Prompt(1, 3));
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_TRUE(nodes->empty());
  // What Prefill refuses, ProfilePrefill refuses.
  EXPECT_EQ(s->ProfilePrefill(3, a).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SessionCpuTest, FixtureFoldersMatchTransformers) {
  for (const char* name : {"f32_gqa", "f32_mha_tied", "f32_llama3_rope", "bf16_gqa", "f32_sharded"}) {
    SCOPED_TRACE(name);
    testing::CheckSessionParity(std::string(SG_FIXTURES_DIR) + "/" + name, Backend::kCpu, false);
  }
}

// The other families (make_family_fixtures.py), through the session's prefill steps: the
// sliding windows, q/k norms, biases and soft-caps in prefill as in decode.
TEST(SessionCpuTest, FamilyFixtureFoldersMatchTransformers) {
  for (const char* name : {"family_qwen2", "family_qwen3", "family_mistral", "family_phi3",
                           "family_gemma", "family_gemma2", "family_qwen2_linear_rope",
                           "family_qwen3/model.gguf", "family_phi3/model.gguf",
                           "family_gemma/model.gguf", "family_gemma3",
                           "family_gemma3/model.gguf", "family_mixtral", "family_qwen3_moe",
                           "family_qwen3_moe_mixed", "family_qwen3_moe/model.gguf",
                           "family_mixtral_q8_0/model.gguf"}) {
    SCOPED_TRACE(name);
    testing::CheckSessionParity(std::string(SG_FIXTURES_DIR) + "/" + name, Backend::kCpu, false);
  }
}

// ---- prefill steps ---------------------------------------------------------------------

// Ids and last logits of `prompts` (one per slot) after Prefill(requests) and `n` steps.
struct PrefillRun {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<float>> logits;
  int64_t prefill_steps = 0;
};
PrefillRun RunPrefilled(SessionOptions o, const std::vector<std::vector<int32_t>>& prompts,
                        int64_t n) {
  PrefillRun out;
  o.max_slots = static_cast<int64_t>(prompts.size());
  std::unique_ptr<DecodeSession> s = MakeSession(o);
  if (s == nullptr) return out;
  std::vector<PrefillRequest> requests;
  for (size_t i = 0; i < prompts.size(); ++i) {
    requests.push_back({static_cast<int64_t>(i), prompts[i], static_cast<int32_t>(i)});
  }
  const absl::Status st = s->Prefill(requests);
  EXPECT_TRUE(st.ok()) << st;
  if (!st.ok()) return out;
  out.prefill_steps = s->prefill_steps();
  absl::StatusOr<std::vector<std::vector<int32_t>>> ids = s->Generate(n);
  EXPECT_TRUE(ids.ok()) << ids.status();
  if (!ids.ok()) return out;
  out.ids = *ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    absl::StatusOr<std::vector<float>> l = s->Logits(static_cast<int64_t>(i));
    EXPECT_TRUE(l.ok()) << l.status();
    out.logits.push_back(l.ok() ? *l : std::vector<float>{});
  }
  return out;
}

// The CPU reference computes every row on its own, so a prefill step gives exactly the
// values of token-by-token decode steps: ids equal, logits equal to f32 rounding.
void ExpectSameRuns(const PrefillRun& got, const PrefillRun& want) {
  ASSERT_EQ(got.ids.size(), want.ids.size());
  for (size_t i = 0; i < want.ids.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(got.ids[i], want.ids[i]);
    EXPECT_LE(testing::NormalizedError(got.logits[i], want.logits[i]), 1e-6);
  }
}

TEST(SessionPrefillTest, PrefillStepsEqualTokenByTokenAtEveryLength) {
  SessionOptions by_token = CpuOptions(1, 160);
  by_token.prefill_chunk = 0;
  SessionOptions chunked = by_token;
  chunked.prefill_chunk = 32;  // steps of 32, 16 and 8 rows
  for (int64_t len : {1, 2, 7, 8, 9, 33, 64, 65, 130}) {
    SCOPED_TRACE(len);
    const std::vector<std::vector<int32_t>> prompts = {Prompt(len, 100 + static_cast<uint32_t>(len))};
    const PrefillRun want = RunPrefilled(by_token, prompts, 6);
    const PrefillRun got = RunPrefilled(chunked, prompts, 6);
    ExpectSameRuns(got, want);
    // Steps: whole chunks of 32, then one step for the rest.
    const int64_t feed = len - 1;
    EXPECT_EQ(got.prefill_steps, feed / 32 + (feed % 32 != 0 ? 1 : 0));
    EXPECT_EQ(want.prefill_steps, 0);
  }
}

// A rest that its covering step would pad by more than prefill_max_pad_rows splits into
// the steps it fills first (chunk 64, so steps of 64, 32, 16 and 8 rows; at most 4 rows
// of padding here), with the same ids and logits as token by token.
TEST(SessionPrefillTest, ARestThatWouldPadManyRowsGoesInTheStepsItFills) {
  SessionOptions by_token = CpuOptions(1, 160);
  by_token.prefill_chunk = 0;
  SessionOptions split = by_token;
  split.prefill_chunk = 64;
  split.prefill_max_pad_rows = 4;
  SessionOptions padded = split;
  padded.prefill_max_pad_rows = 256;
  // Prompt length (every token but the last is fed), then the steps the rule gives:
  const std::pair<int64_t, int64_t> cases[] = {
      {2, 1},    // 1 row: no step fills it, the step of 8 pads it
      {20, 2},   // 19 rows: 32 would pad 13; 16, then 3 rows in a step of 8
      {42, 3},   // 41 rows: 32, then 9 (16 would pad 7): 8, then 1 in a step of 8
      {62, 1},   // 61 rows: 64 pads 3
      {100, 3},  // 99 rows: a chunk of 64, then 35: 32, then 3 in a step of 8
      {130, 3}}; // 129 rows: two chunks, then 1 in a step of 8
  for (const auto& [len, steps] : cases) {
    SCOPED_TRACE(len);
    const std::vector<std::vector<int32_t>> prompts = {Prompt(len, 300 + static_cast<uint32_t>(len))};
    const PrefillRun want = RunPrefilled(by_token, prompts, 6);
    const PrefillRun got = RunPrefilled(split, prompts, 6);
    ExpectSameRuns(got, want);
    EXPECT_EQ(got.prefill_steps, steps);
    const int64_t feed = len - 1;
    EXPECT_EQ(RunPrefilled(padded, prompts, 1).prefill_steps,
              feed / 64 + (feed % 64 != 0 ? 1 : 0));
  }
  SessionOptions bad = split;
  bad.prefill_max_pad_rows = -1;
  absl::StatusOr<std::unique_ptr<DecodeSession>> refused = DecodeSession::Create(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "prefill_max_pad_rows")) << refused.status();
}

TEST(SessionPrefillTest, ChunkedEqualsOneChunk) {
  SessionOptions one = CpuOptions(1, 256);
  one.prefill_chunk = 256;
  SessionOptions small = one;
  small.prefill_chunk = 8;
  const std::vector<std::vector<int32_t>> prompts = {Prompt(201, 5)};
  const PrefillRun a = RunPrefilled(one, prompts, 8);
  const PrefillRun b = RunPrefilled(small, prompts, 8);
  EXPECT_EQ(a.prefill_steps, 1);
  EXPECT_EQ(b.prefill_steps, 25);
  ExpectSameRuns(b, a);
}

TEST(SessionPrefillTest, PackedSequencesEqualEachAlone) {
  // Lengths that land in the step shapes of chunk 64 (64, 32, 16 and 8 rows; packed 4 x 16
  // and 8 x 8), some sharing a packed step, one spanning two chunks.
  SessionOptions o = CpuOptions(1, 200);
  o.prefill_chunk = 64;
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t len : {3, 17, 1, 12, 150, 16, 40, 9}) {
    prompts.push_back(Prompt(len, 300 + static_cast<uint32_t>(len)));
  }
  const PrefillRun packed = RunPrefilled(o, prompts, 5);
  // Tokens fed (all but the last): 150 -> 2 chunks + 21 (a 32-row step), 39 (a 64-row
  // step); 16, 11, 15: a packed step of 4 x 16 rows; 2, 8: a packed step of 8 x 8; 0.
  EXPECT_EQ(packed.prefill_steps, 2 + 1 + 1 + 1 + 1);
  SessionOptions by_token = o;
  by_token.prefill_chunk = 0;
  ExpectSameRuns(packed, RunPrefilled(by_token, prompts, 5));
}

TEST(SessionPrefillTest, DecodingSlotsKeepTheirStateAcrossAnotherPrefill) {
  SessionOptions o = CpuOptions(2, 96);
  o.prefill_chunk = 16;
  const std::vector<int32_t> a = Prompt(20, 1), b = Prompt(37, 2);
  std::unique_ptr<DecodeSession> s = MakeSession(o);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Prefill(0, a).ok());
  absl::StatusOr<std::vector<int32_t>> first = s->Generate(0, 4);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(s->Prefill(1, b).ok());  // slot 0 is decoding; the prefill step is b's alone
  absl::StatusOr<std::vector<std::vector<int32_t>>> rest = s->Generate(6);
  ASSERT_TRUE(rest.ok()) << rest.status();
  std::vector<int32_t> a_ids = *first;
  a_ids.insert(a_ids.end(), (*rest)[0].begin(), (*rest)[0].end());
  EXPECT_EQ(a_ids, Alone(o, a, 10));
  EXPECT_EQ((*rest)[1], Alone(o, b, 6));
}

// Every transformers fixture (f32 and bf16, GQA, MHA, llama3 RoPE, sharded): prefill steps
// (chunks of 4, so prompts span several) equal the token-by-token path. Their parity with
// transformers itself is FixtureFoldersMatchTransformers, which prefills by default.
TEST(SessionPrefillTest, FixturesPrefillEqualsTokenByToken) {
  for (const char* name : {"f32_gqa", "f32_mha_tied", "f32_llama3_rope", "bf16_gqa", "f32_sharded"}) {
    SCOPED_TRACE(name);
    const std::string dir = std::string(SG_FIXTURES_DIR) + "/" + name;
    const testing::ParityExpected want = testing::ReadParityExpected(dir + "/expected.json");
    SessionOptions o;
    o.model_path = dir;
    o.backend = Backend::kCpu;
    o.max_seq = static_cast<int64_t>(want.prompt.size() + want.generated.size());
    o.prefill_chunk = 4;
    SessionOptions by_token = o;
    by_token.prefill_chunk = 0;
    const std::vector<std::vector<int32_t>> prompts = {want.prompt, want.prompt};
    const PrefillRun got = RunPrefilled(o, prompts, 8);
    EXPECT_GT(got.prefill_steps, 1);
    ExpectSameRuns(got, RunPrefilled(by_token, prompts, 8));
    ASSERT_FALSE(got.ids.empty());
    EXPECT_EQ(got.ids[0], std::vector<int32_t>(want.generated.begin(), want.generated.begin() + 8));
  }
}

TEST(SessionPrefillTest, BadRequestsAreRefusedBeforeAnythingRuns) {
  std::unique_ptr<DecodeSession> s = MakeSession(CpuOptions(2, 16));
  ASSERT_NE(s, nullptr);
  const std::vector<int32_t> p = Prompt(4, 9);
  const std::vector<PrefillRequest> twice = {{0, p, 0}, {0, p, 0}};
  const absl::Status st = s->Prefill(twice);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("named by two requests"), absl::string_view::npos) << st;
  EXPECT_EQ(s->prefill_steps(), 0);
  SessionOptions bad = CpuOptions(1, 16);
  bad.prefill_chunk = -1;
  EXPECT_EQ(DecodeSession::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

// A sanity bound only (the speed claim is cpu_bench's): 1,024 short prompts prefill on
// the CPU reference in seconds, where token-by-token decode steps over 1,024 rows took
// hours.
TEST(SessionPrefillTest, ManyShortPromptsPrefillInSeconds) {
  // Under the sanitizers the same packing runs at an eighth of the size and the time is
  // not asserted: there the test is about memory, not speed.
  constexpr int64_t kPrompts = testing::kSanitizedBuild ? 128 : 1024;
  // max_seq 64 makes the chunk 64 rows: every prompt goes in packed steps of 4 x 16.
  SessionOptions o = CpuOptions(kPrompts, 64);
  o.buckets = {kPrompts};
  std::vector<std::vector<int32_t>> prompts;
  std::vector<PrefillRequest> requests;
  for (int64_t i = 0; i < kPrompts; ++i) prompts.push_back(Prompt(8 + i % 9, 7000 + static_cast<uint32_t>(i)));
  for (int64_t i = 0; i < kPrompts; ++i) requests.push_back({i, prompts[i], 0});
  std::unique_ptr<DecodeSession> s = MakeSession(o);
  ASSERT_NE(s, nullptr);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(s->Prefill(requests).ok());
  absl::StatusOr<std::vector<std::vector<int32_t>>> ids = s->Generate(2);
  ASSERT_TRUE(ids.ok()) << ids.status();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!testing::kSanitizedBuild) {
    EXPECT_LT(seconds, 120.0);
  }
  std::printf("%lld prompts of 8-16 tokens: prefill + 2 steps in %.2f s, %lld prefill steps\n",
              static_cast<long long>(kPrompts), seconds,
              static_cast<long long>(s->prefill_steps()));
  for (int64_t i : {int64_t{0}, kPrompts / 2 + 1, kPrompts - 1}) {
    SessionOptions one = CpuOptions(1, 32);
    EXPECT_EQ((*ids)[i], Alone(one, prompts[i], 2)) << "slot " << i;
  }
}

// ---- errors ---------------------------------------------------------------------------

void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& says) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find(says), absl::string_view::npos)
      << "'" << s.message() << "' does not say '" << says << "'";
}

TEST(SessionCpuTest, BadInputsAreRefusedClearly) {
  std::unique_ptr<DecodeSession> s = MakeSession(CpuOptions(2, 16));
  ASSERT_NE(s, nullptr);
  const std::vector<int32_t> ok = {1, 2, 3};
  ExpectError(s->Prefill(2, ok), absl::StatusCode::kInvalidArgument, "slot 2 is out of range");
  ExpectError(s->Prefill(-1, ok), absl::StatusCode::kInvalidArgument, "slot -1");
  ExpectError(s->Prefill(0, {}), absl::StatusCode::kInvalidArgument, "prompt is empty");
  ExpectError(s->Prefill(0, std::vector<int32_t>(17, 1)), absl::StatusCode::kOutOfRange,
              "max_seq = 16");
  ExpectError(s->Prefill(0, std::vector<int32_t>{1, 1024}), absl::StatusCode::kInvalidArgument,
              "token 1 is id 1024, outside the vocabulary [0, 1024)");
  ExpectError(s->Prefill(0, std::vector<int32_t>{-5}), absl::StatusCode::kInvalidArgument,
              "id -5");
  EXPECT_FALSE(s->live(0));
  ExpectError(s->Step(), absl::StatusCode::kFailedPrecondition, "no slot is live");
  ExpectError(s->Generate(3).status(), absl::StatusCode::kFailedPrecondition, "no slot is live");
  ExpectError(s->Logits(0).status(), absl::StatusCode::kFailedPrecondition, "not live");

  ASSERT_TRUE(s->Prefill(0, ok).ok());
  ExpectError(s->Generate(1, 2).status(), absl::StatusCode::kFailedPrecondition,
              "slot 1 is not live");
  ExpectError(s->Generate(-1).status(), absl::StatusCode::kInvalidArgument, "n must be >= 0");
  ExpectError(s->Logits(0).status(), absl::StatusCode::kFailedPrecondition, "no step ran");
  // Position 2 leaves room for 14 steps; 15 is refused before anything runs.
  ExpectError(s->Generate(15).status(), absl::StatusCode::kOutOfRange, "room for 14 more");
  EXPECT_EQ(s->position(0), 2);
  absl::StatusOr<std::vector<int32_t>> all = s->Generate(0, 14);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 14u);
  ExpectError(s->Step(), absl::StatusCode::kOutOfRange, "slot 0 is at position 16");
  EXPECT_TRUE(s->eager());  // the CPU runs every step eagerly
  ExpectError(s->Release(5), absl::StatusCode::kInvalidArgument, "slot 5");
}

// The f32_gqa fixture copied into a temporary folder with one element of `tensor`
// replaced by NaN (every logit turns NaN when that tensor is the final norm).
std::string FixtureWithNaN(const std::string& tensor) {
  const std::filesystem::path src = std::filesystem::path(SG_FIXTURES_DIR) / "f32_gqa";
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("sg_session_nan_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(src / "config.json", dir / "config.json");
  std::ifstream in(src / "model.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  const nlohmann::json h = nlohmann::json::parse(bytes.substr(8, header));
  const int64_t begin = h.at(tensor).at("data_offsets").at(0).get<int64_t>();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bytes.data() + 8 + header + begin + 4 * 3, &nan, 4);
  std::ofstream(dir / "model.safetensors", std::ios::binary) << bytes;
  return dir.string();
}

// NaN weights: the optional load-time check names the tensor; without it, the step whose
// logits hold NaN is reported by number and position instead of printing ids 0,0,0.
TEST(SessionCpuTest, NonFiniteWeightsAndLogitsAreReported) {
  const std::string dir = FixtureWithNaN("model.norm.weight");
  SessionOptions o = CpuOptions(1, 16);
  o.model_path = dir;
  o.check_weights = true;
  absl::StatusOr<std::unique_ptr<DecodeSession>> checked = DecodeSession::Create(o);
  ASSERT_FALSE(checked.ok());
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kDataLoss) << checked.status();
  EXPECT_TRUE(absl::StrContains(checked.status().message(), "'model.norm.weight'"))
      << checked.status();

  o.check_weights = false;
  absl::StatusOr<std::unique_ptr<DecodeSession>> s = DecodeSession::Create(o);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE((*s)->Prefill(0, {1, 2, 3}).ok());
  absl::StatusOr<std::vector<int32_t>> one = (*s)->Generate(0, 1);
  ASSERT_FALSE(one.ok());
  EXPECT_EQ(one.status().code(), absl::StatusCode::kDataLoss) << one.status();
  EXPECT_TRUE(absl::StrContains(one.status().message(),
                                "decode step 1 of this session (slot 0 at position 2)"))
      << one.status();
  absl::StatusOr<std::vector<int32_t>> more = (*s)->Generate(0, 3);
  ASSERT_FALSE(more.ok());
  EXPECT_TRUE(absl::StrContains(more.status().message(),
                                "one of decode steps 2 to 4 of this session (slot 0 at "
                                "positions 3-5)"))
      << more.status();
}

TEST(SessionCpuTest, BadOptionsAreRefusedClearly) {
  auto refused = [](SessionOptions o, absl::StatusCode code, const std::string& says) {
    absl::StatusOr<std::unique_ptr<DecodeSession>> s = DecodeSession::Create(o);
    ASSERT_FALSE(s.ok());
    ExpectError(s.status(), code, says);
  };
  SessionOptions o = CpuOptions(1, 16);
  o.max_slots = 0;
  refused(o, absl::StatusCode::kInvalidArgument, "max_slots must be >= 1");
  o = CpuOptions(1, 513);
  refused(o, absl::StatusCode::kInvalidArgument, "max_seq must be in [1, max_position_embeddings = 512]");
  o = CpuOptions(1, 16);
  o.sampling = ops::Sample{0.0f, 0, 1.0f};
  refused(o, absl::StatusCode::kInvalidArgument, "temperature must be > 0");
  o.sampling = ops::Sample{1.0f, 0, 1.5f};
  refused(o, absl::StatusCode::kInvalidArgument, "top_p");
  o = CpuOptions(1, 16);
  o.buckets = {4, 2};
  refused(o, absl::StatusCode::kInvalidArgument, "buckets");
  o = CpuOptions(1, 16);
  o.config.hidden_size = 0;
  refused(o, absl::StatusCode::kInvalidArgument, "hidden_size");
  o = CpuOptions(1, 16);
  o.model_path = std::string(SG_FIXTURES_DIR) + "/no_such_model";
  refused(o, absl::StatusCode::kNotFound, "no_such_model");
  if (!CudaDeviceFound()) {
    o = CpuOptions(1, 16);
    o.backend = Backend::kCuda;
    refused(o, absl::StatusCode::kFailedPrecondition, "CUDA");
  }
  o = CpuOptions(1, 16);
  o.device_loop_steps = 8;
  refused(o, absl::StatusCode::kInvalidArgument, "device_loop_steps needs the CUDA backend");
  o.device_loop_steps = -1;
  refused(o, absl::StatusCode::kInvalidArgument, "device_loop_steps must be in [0, id_ring_steps");
  o.id_ring_steps = 4;
  o.device_loop_steps = 5;
  refused(o, absl::StatusCode::kInvalidArgument,
          "device_loop_steps must be in [0, id_ring_steps = 4]");
}

// Three slots' prompts for the stop-id cases.
std::vector<std::vector<int32_t>> StopPrompts() {
  return {Prompt(5, 31), Prompt(9, 32), Prompt(3, 33)};
}

// Every slot's ids of Generate(n) in a session of `o` after StopPrompts.
std::vector<std::vector<int32_t>> PlainRun(const SessionOptions& o, int64_t n) {
  std::unique_ptr<DecodeSession> s = MakeSession(o);
  if (s == nullptr) return {};
  const std::vector<std::vector<int32_t>> prompts = StopPrompts();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_TRUE(s->Prefill(i, prompts[i]).ok());
  absl::StatusOr<std::vector<std::vector<int32_t>>> ids = s->Generate(n);
  EXPECT_TRUE(ids.ok()) << ids.status();
  if (!ids.ok()) return {};
  // The live slots' ids (a slot not live gets none).
  for (size_t i = prompts.size(); i < ids->size(); ++i) EXPECT_TRUE((*ids)[i].empty());
  ids->resize(prompts.size());
  return *ids;
}

// Stop ids taken from a plain run (one a slot, at different steps) and the steps after
// which every slot has produced one of them.
struct Stops {
  std::vector<int32_t> ids;
  size_t steps = 0;
};
Stops StopsOf(const std::vector<std::vector<int32_t>>& plain) {
  Stops out;
  const size_t at[] = {6, 2, 9};
  for (size_t i = 0; i < plain.size(); ++i) out.ids.push_back(plain[i][at[i]]);
  for (const std::vector<int32_t>& ids : plain) {
    size_t first = ids.size();
    for (size_t k = 0; k < ids.size() && first == ids.size(); ++k) {
      if (std::find(out.ids.begin(), out.ids.end(), ids[k]) != out.ids.end()) first = k;
    }
    out.steps = std::max(out.steps, first + 1);
  }
  return out;
}

// Generate(n, stop ids) runs until every slot has produced a stop id, giving each slot the
// ids of the steps run (the plain run's first ones); stop ids never produced run all n.
void ExpectStopsCut(const SessionOptions& o) {
  constexpr int64_t kSteps = 14;
  const std::vector<std::vector<int32_t>> plain = PlainRun(o, kSteps);
  ASSERT_EQ(plain.size(), 3u);
  const Stops stops = StopsOf(plain);
  ASSERT_LT(stops.steps, static_cast<size_t>(kSteps));
  std::unique_ptr<DecodeSession> s = MakeSession(o);
  ASSERT_NE(s, nullptr);
  const std::vector<std::vector<int32_t>> prompts = StopPrompts();
  for (size_t i = 0; i < prompts.size(); ++i) ASSERT_TRUE(s->Prefill(i, prompts[i]).ok());
  absl::StatusOr<std::vector<std::vector<int32_t>>> cut = s->Generate(kSteps, stops.ids);
  ASSERT_TRUE(cut.ok()) << cut.status();
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ((*cut)[i], std::vector<int32_t>(plain[i].begin(), plain[i].begin() + stops.steps))
        << "slot " << i;
  }
  // The slots go on from there as the plain run did.
  absl::StatusOr<std::vector<std::vector<int32_t>>> rest =
      s->Generate(kSteps - static_cast<int64_t>(stops.steps), std::vector<int32_t>{-1});
  ASSERT_TRUE(rest.ok()) << rest.status();
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ((*rest)[i], std::vector<int32_t>(plain[i].begin() + stops.steps, plain[i].end()))
        << "slot " << i;
  }
}

TEST(SessionCpuTest, GenerateStopsWhenEverySlotProducedAStopId) {
  ExpectStopsCut(CpuOptions(4, 48));
  std::unique_ptr<DecodeSession> s = MakeSession(CpuOptions(1, 16));
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Prefill(0, Prompt(3, 1)).ok());
  ExpectError(s->Generate(2, std::vector<int32_t>(17, 1)).status(),
              absl::StatusCode::kInvalidArgument, "at most 16 stop ids, got 17");
}

TEST(SessionCpuTest, BucketsAreTrimmedToTheSlots) {
  SessionOptions o = CpuOptions(3, 16);
  o.buckets = {1, 2, 4, 8};
  std::unique_ptr<DecodeSession> s = MakeSession(o);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->buckets(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(s->max_slots(), 3);
  ASSERT_NE(s->plan(3), nullptr);
  EXPECT_EQ(s->plan(4), nullptr);
  // Every bucket's graph addresses all three KV slots.
  const Graph& g = s->plan(1)->graph();
  EXPECT_EQ(g.tensor(*g.FindTensor(KCacheName(0))).shape[0], 3);
}

// ---- Append: a conversation's next turn ----------------------------------------------

// Two turns in one slot, the second appended after `answer` generated ids, against the
// whole history (prompt, answer, next turn) prefilled at once in a fresh session: the CPU
// computes every row on its own, so the ids after the second turn must be equal. Slot 1
// decodes beside it all along and must not notice.
struct AppendRun {
  std::vector<int32_t> after_append;
  std::vector<int32_t> history;  // what slot 0's KV cache holds before the last generate
  std::vector<int32_t> neighbour;
  int64_t position = -1;
  int64_t append_steps = 0;
};
AppendRun RunAppended(SessionOptions o, const std::vector<int32_t>& first,
                      const std::vector<int32_t>& next, int64_t answer, int64_t n) {
  AppendRun out;
  o.max_slots = 2;
  std::unique_ptr<DecodeSession> s = MakeSession(o);
  if (s == nullptr) return out;
  EXPECT_TRUE(s->Prefill(1, Prompt(5, 77), 2).ok());
  EXPECT_TRUE(s->Prefill(0, first, 1).ok());
  absl::StatusOr<std::vector<int32_t>> a = s->Generate(0, answer);
  EXPECT_TRUE(a.ok()) << a.status();
  if (!a.ok()) return out;
  const int64_t steps = s->prefill_steps();
  const absl::Status st = s->Append(0, next);
  EXPECT_TRUE(st.ok()) << st;
  out.append_steps = s->prefill_steps() - steps;
  out.position = s->position(0);
  absl::StatusOr<std::vector<int32_t>> b = s->Generate(0, n);
  EXPECT_TRUE(b.ok()) << b.status();
  if (b.ok()) out.after_append = *b;
  out.history = first;
  out.history.insert(out.history.end(), a->begin(), a->end());
  out.history.insert(out.history.end(), next.begin(), next.end());
  // Tokens keeps every id since the Prefill, the answer's and the last generate's.
  absl::StatusOr<std::vector<int32_t>> tokens = s->Tokens(0);
  EXPECT_TRUE(tokens.ok());
  if (tokens.ok()) {
    EXPECT_EQ(tokens->size(), static_cast<size_t>(answer + n));
  }
  out.neighbour = *s->Tokens(1);
  return out;
}

TEST(SessionAppendTest, AppendedTurnEqualsTheWholeHistoryPrefilled) {
  for (const int64_t chunk : {int64_t{0}, int64_t{8}, int64_t{32}}) {
    for (const int64_t len : {int64_t{1}, int64_t{2}, int64_t{9}, int64_t{40}}) {
      SCOPED_TRACE(::testing::Message() << "prefill_chunk " << chunk << ", turn of " << len);
      SessionOptions o = CpuOptions(2, 96);
      o.prefill_chunk = chunk;
      const std::vector<int32_t> first = Prompt(7, 11), next = Prompt(len, 12 + len);
      const AppendRun got = RunAppended(o, first, next, 6, 5);
      // The pending answer id and all of the turn but its last token went in; the last
      // waits for the next step.
      EXPECT_EQ(got.position, static_cast<int64_t>(got.history.size()) - 1);
      if (chunk > 0) {
        EXPECT_EQ(got.append_steps, (len + chunk - 1) / chunk);
      }
      EXPECT_EQ(got.after_append, Alone(o, got.history, 5, 1));
      // The neighbour's ids are those of its own session.
      SessionOptions alone = o;
      EXPECT_EQ(got.neighbour.size(), 11u);
      EXPECT_EQ(got.neighbour, Alone(alone, Prompt(5, 77), 11, 2));
    }
  }
}

// Append splits a turn's rest as Prefill does: 21 tokens with chunk 32 and at most 4
// padding rows go in steps of 16 and 8, and the turn equals the whole history prefilled.
TEST(SessionAppendTest, AnAppendedRestSplitsAsAPromptDoes) {
  SessionOptions o = CpuOptions(2, 96);
  o.prefill_chunk = 32;
  o.prefill_max_pad_rows = 4;
  const AppendRun got = RunAppended(o, Prompt(7, 11), Prompt(21, 33), 6, 5);
  EXPECT_EQ(got.append_steps, 2);
  EXPECT_EQ(got.after_append, Alone(o, got.history, 5, 1));
}

TEST(SessionAppendTest, BadAppendsAreRefusedBeforeAnythingRuns) {
  std::unique_ptr<DecodeSession> s = MakeSession(CpuOptions(2, 16));
  ASSERT_NE(s, nullptr);
  const std::vector<int32_t> two = {1, 2};
  ExpectError(s->Append(0, two), absl::StatusCode::kFailedPrecondition, "slot 0 is not live");
  ExpectError(s->Append(2, two), absl::StatusCode::kInvalidArgument, "slot 2 is out of range");
  ASSERT_TRUE(s->Prefill(0, {1, 2, 3}).ok());
  const int64_t steps = s->prefill_steps();
  ExpectError(s->Append(0, {}), absl::StatusCode::kInvalidArgument, "no tokens");
  ExpectError(s->Append(0, std::vector<int32_t>{4, 1024}), absl::StatusCode::kInvalidArgument,
              "token 1 is id 1024, outside the vocabulary [0, 1024)");
  // At position 2 of 16, 13 more tokens fit (the last at position 15), 14 do not.
  ExpectError(s->Append(0, std::vector<int32_t>(14, 5)), absl::StatusCode::kOutOfRange,
              "the slot is at position 2; 14 more tokens do not fit");
  EXPECT_EQ(s->prefill_steps(), steps);
  EXPECT_EQ(s->position(0), 2);
  ASSERT_TRUE(s->Append(0, std::vector<int32_t>(13, 5)).ok());
  EXPECT_EQ(s->position(0), 15);
  ExpectError(s->Generate(2).status(), absl::StatusCode::kOutOfRange, "room for 1 more");
}

// On the GPU, replayed and eager, the same turns give the CPU reference's ids (skipped
// without a device).
TEST(SessionAppendTest, CudaAppendGivesTheCpuReferenceIds) {
  if (!CudaDeviceFound()) GTEST_SKIP() << "no CUDA device";
  for (const bool eager : {false, true}) {
    SCOPED_TRACE(eager ? "eager" : "replayed");
    SessionOptions o = CpuOptions(2, 96);
    o.prefill_chunk = 16;
    const std::vector<int32_t> first = Prompt(20, 31), next = Prompt(37, 32);
    const AppendRun cpu = RunAppended(o, first, next, 6, 8);
    o.backend = Backend::kCuda;
    o.eager = eager;
    const AppendRun gpu = RunAppended(o, first, next, 6, 8);
    EXPECT_EQ(gpu.history, cpu.history);
    EXPECT_EQ(gpu.after_append, cpu.after_append);
    EXPECT_EQ(gpu.neighbour, cpu.neighbour);
  }
}

// ---- CUDA against the CPU reference (skipped without a GPU) ----------------------------

class SessionCudaTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!CudaDeviceFound()) GTEST_SKIP() << "no CUDA device";
  }
};

// A scenario with two slots at different positions, a prefill beside a decoding slot and
// a release; returns every slot's ids and slot 1's last logits.
struct Scenario {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<float> logits;
};
Scenario RunScenario(SessionOptions o) {
  Scenario out;
  std::unique_ptr<DecodeSession> s = MakeSession(o);
  if (s == nullptr) return out;
  EXPECT_TRUE(s->Prefill(0, Prompt(6, 21), 3).ok());
  EXPECT_TRUE(s->Generate(5).ok());
  EXPECT_TRUE(s->Prefill(1, Prompt(11, 22), 4).ok());
  EXPECT_TRUE(s->Generate(12).ok());
  EXPECT_TRUE(s->Release(0).ok());
  EXPECT_TRUE(s->Generate(3).ok());
  absl::StatusOr<std::vector<float>> logits = s->Logits(1);
  EXPECT_TRUE(logits.ok()) << logits.status();
  if (logits.ok()) out.logits = *logits;
  for (int64_t i = 0; i < 2; ++i) out.tokens.push_back(*s->Tokens(i));
  return out;
}

TEST_P(SessionCudaTest, GreedyIdsEqualTheCpuReference) {
  SessionOptions o = CpuOptions(2, 64);
  const Scenario cpu = RunScenario(o);
  o.backend = Backend::kCuda;
  o.eager = GetParam();
  const Scenario gpu = RunScenario(o);
  EXPECT_EQ(gpu.tokens, cpu.tokens);
  EXPECT_LE(testing::NormalizedError(gpu.logits, cpu.logits), 1e-4);
}

// RmsNorm through the kernel compiled for the plan (NVRTC), in every bucket's graph.
TEST_P(SessionCudaTest, CompiledNormGivesTheCpuReferenceIds) {
  SessionOptions o = CpuOptions(2, 64);
  const Scenario cpu = RunScenario(o);
  o.backend = Backend::kCuda;
  o.eager = GetParam();
  o.cuda.compiled_norm = true;
  const Scenario gpu = RunScenario(o);
  EXPECT_EQ(gpu.tokens, cpu.tokens);
  EXPECT_LE(testing::NormalizedError(gpu.logits, cpu.logits), 1e-4);
}

TEST_P(SessionCudaTest, SampledIdsEqualTheCpuReference) {
  SessionOptions o = CpuOptions(2, 64);
  o.sampling = ops::Sample{0.8f, 50, 0.9f};
  const Scenario cpu = RunScenario(o);
  o.backend = Backend::kCuda;
  o.eager = GetParam();
  const Scenario gpu = RunScenario(o);
  EXPECT_EQ(gpu.tokens, cpu.tokens);
}

TEST_P(SessionCudaTest, TimedAndProfiledStepsAreOrdinarySteps) {
  SessionOptions o = CpuOptions(1, 64);
  o.backend = Backend::kCuda;
  o.eager = GetParam();
  const std::vector<int32_t> a = Prompt(5, 23);
  std::unique_ptr<DecodeSession> s = MakeSession(o);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->backend(), Backend::kCuda);
  if (GetParam()) {
    EXPECT_TRUE(s->eager());
  }
  ASSERT_TRUE(s->Prefill(0, a).ok());
  absl::StatusOr<std::vector<double>> times = s->TimedSteps(6);
  ASSERT_TRUE(times.ok()) << times.status();
  ASSERT_EQ(times->size(), 6u);
  for (double t : *times) EXPECT_GT(t, 0.0);
  absl::StatusOr<std::vector<NodeTime>> profile = s->ProfileStep();
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_EQ(profile->size(), static_cast<size_t>(s->plan(1)->graph().num_nodes()));
  double total = 0;
  for (const NodeTime& n : *profile) {
    EXPECT_GE(n.ms, 0.0) << n.name;
    total += n.ms;
  }
  EXPECT_GT(total, 0.0);
  ASSERT_TRUE(s->Generate(3).ok());
  absl::StatusOr<std::vector<int32_t>> tokens = s->Tokens(0);
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ(*tokens, Alone(CpuOptions(1, 64), a, static_cast<int64_t>(tokens->size())));
}

// Mixture-of-experts models on the GPU: the kernels of dispatch/cuda/moe.cc route each row
// from the router's logits on the device. Every MoE family fixture (Mixtral and Qwen3-MoE
// folders, a Qwen3-MoE with dense layers, their GGUF files, Mixtral with Q8_0 experts)
// gives the CPU reference session's greedy ids (hf_parity_cuda_test holds the same
// fixtures to transformers' ids and logits).
TEST_P(SessionCudaTest, MoeFamilyFixturesGiveTheCpuReferenceIds) {
  for (const char* name : {"family_mixtral", "family_qwen3_moe", "family_qwen3_moe_mixed",
                           "family_qwen3_moe/model.gguf", "family_mixtral_q8_0/model.gguf"}) {
    SCOPED_TRACE(name);
    const std::string dir = std::string(SG_FIXTURES_DIR) + "/" + name;
    const testing::ParityExpected want = testing::ReadParityExpected(testing::ExpectedJsonOf(dir));
    std::vector<std::vector<int32_t>> ids;
    for (const Backend backend : {Backend::kCpu, Backend::kCuda}) {
      SessionOptions o;
      o.model_path = dir;
      o.backend = backend;
      o.eager = GetParam();
      o.max_slots = 1;
      o.max_seq = static_cast<int64_t>(want.prompt.size() + want.generated.size());
      std::unique_ptr<DecodeSession> s = MakeSession(o);
      ASSERT_NE(s, nullptr);
      ASSERT_TRUE(s->Prefill(0, want.prompt).ok());
      absl::StatusOr<std::vector<int32_t>> got =
          s->Generate(0, static_cast<int64_t>(want.generated.size()));
      ASSERT_TRUE(got.ok()) << got.status();
      ids.push_back(*got);
    }
    ASSERT_EQ(ids[0].size(), want.generated.size());
    EXPECT_EQ(ids[1], ids[0]);
  }
}

// Tiny random Mixtral and Qwen3-MoE models in the two-slot scenario (rows of one step
// routed to different experts, prefill beside decode, a release): the CPU reference's ids.
TEST_P(SessionCudaTest, MoeGreedyIdsEqualTheCpuReference) {
  for (const auto& [family, config] : testing::MoeTinyConfigs(DType::kF32)) {
    SCOPED_TRACE(family);
    SessionOptions o = CpuOptions(2, 64);
    o.config = config;
    const Scenario cpu = RunScenario(o);
    o.backend = Backend::kCuda;
    o.eager = GetParam();
    const Scenario gpu = RunScenario(o);
    ASSERT_EQ(gpu.tokens.size(), 2u);
    EXPECT_EQ(gpu.tokens, cpu.tokens);
    EXPECT_LE(testing::NormalizedError(gpu.logits, cpu.logits), 1e-4);
  }
}

// Replays of every bucket (switching between them as slots come and go) compute what the
// same steps run eagerly compute, bit for bit, in bf16 too.
// The device loop (SessionOptions::device_loop_steps): the ids one graph launch per step
// gives, over launches of the loop (8 steps each) and with stop ids decided on the device.
TEST(SessionDeviceLoopTest, LoopGivesThePerStepIds) {
  if (!CudaDeviceFound()) GTEST_SKIP() << "no CUDA device";
  SessionOptions o = CpuOptions(4, 64);
  o.backend = Backend::kCuda;
  const Scenario per_step = RunScenario(o);
  o.device_loop_steps = 8;
  const Scenario looped = RunScenario(o);
  EXPECT_EQ(looped.tokens, per_step.tokens);
  EXPECT_LE(testing::NormalizedError(looped.logits, per_step.logits), 1e-6);
  ExpectStopsCut(o);
}

TEST(SessionCudaBucketsTest, ReplayedBucketsEqualEagerSteps) {
  if (!CudaDeviceFound()) GTEST_SKIP() << "no CUDA device";
  auto run = [](bool eager) {
    SessionOptions o = CpuOptions(4, 64);
    o.config.dtype = DType::kBF16;
    o.backend = Backend::kCuda;
    o.buckets = {1, 2, 4};
    o.eager = eager;
    std::vector<std::vector<int32_t>> tokens;
    std::unique_ptr<DecodeSession> s = MakeSession(o);
    if (s == nullptr) return tokens;
    EXPECT_TRUE(s->Prefill(2, Prompt(7, 31)).ok());  // bucket 4, rows 0, 1 and 3 padding
    EXPECT_TRUE(s->Generate(3).ok());
    EXPECT_TRUE(s->Prefill(0, Prompt(3, 32)).ok());
    EXPECT_TRUE(s->Generate(6).ok());
    EXPECT_TRUE(s->Prefill(1, Prompt(12, 33)).ok());
    EXPECT_TRUE(s->Generate(5).ok());
    EXPECT_TRUE(s->Release(2).ok());  // bucket 2 from here on
    EXPECT_TRUE(s->Generate(4).ok());
    EXPECT_TRUE(s->Release(1).ok());  // bucket 1
    EXPECT_TRUE(s->Generate(4).ok());
    for (int64_t i = 0; i < 3; ++i) tokens.push_back(*s->Tokens(i));
    return tokens;
  };
  const std::vector<std::vector<int32_t>> replayed = run(false);
  ASSERT_EQ(replayed.size(), 3u);
  EXPECT_EQ(replayed[0].size(), 19u);
  EXPECT_EQ(replayed[1].size(), 9u);
  EXPECT_EQ(replayed[2].size(), 14u);
  EXPECT_EQ(replayed, run(true));
}

INSTANTIATE_TEST_SUITE_P(ReplayedAndEager, SessionCudaTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Eager" : "Replayed";
                         });

}  // namespace
}  // namespace sg
