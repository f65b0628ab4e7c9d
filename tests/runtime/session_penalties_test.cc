// Per-slot penalties, min-p and logit bias in a session (SessionOptions::penalties), on the
// CPU reference with the built-in tiny model: every id a greedy slot chooses is the argmax
// of its logits penalised as an independent host implementation (double) says, from the
// prompt and the ids chosen so far; min-p keeps every draw above its bound; a slot choosing
// on the host, a moved slot, an appended turn and prompts fed through decode steps keep the
// counts right; bad penalties are refused by name. On a GPU the ids equal the CPU's.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "stepgraph/runtime/session.h"
#include "stepgraph/runtime/step_runner.h"

namespace sg {
namespace {

SessionOptions Tiny(int64_t slots, int64_t max_seq = 96) {
  SessionOptions o;
  o.config = TinyLlamaConfig();
  o.weight_seed = 23;
  o.backend = Backend::kCpu;
  o.max_slots = slots;
  o.max_seq = max_seq;
  o.penalties = true;
  return o;
}

std::unique_ptr<DecodeSession> Make(const SessionOptions& o) {
  absl::StatusOr<std::unique_ptr<DecodeSession>> s = DecodeSession::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

std::vector<int32_t> RandomPrompt(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, 1023);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int32_t& v : p) v = id(rng);
  return p;
}

// What a slot's penalties do to its logits, written from their definition (transformers'
// repetition penalty, OpenAI's presence and frequency penalties and logit bias) in double,
// with the slot's history kept on the host.
class HostPenalties {
 public:
  HostPenalties(Penalties p, const std::vector<int32_t>& prompt) : p_(std::move(p)) {
    for (int32_t id : prompt) prompt_[id] = true;
  }
  void Chose(int32_t id) { ++generated_[id]; }
  std::vector<double> Apply(const std::vector<float>& logits) const {
    std::vector<double> l(logits.begin(), logits.end());
    for (size_t v = 0; v < l.size(); ++v) {
      const int32_t id = static_cast<int32_t>(v);
      const auto g = generated_.find(id);
      const int times = g == generated_.end() ? 0 : g->second;
      if (prompt_.count(id) || times > 0) l[v] = l[v] > 0 ? l[v] / p_.repetition : l[v] * p_.repetition;
      if (times > 0) l[v] -= p_.presence + p_.frequency * times;
    }
    for (const auto& [id, bias] : p_.logit_bias) l[static_cast<size_t>(id)] += bias;
    return l;
  }

 private:
  Penalties p_;
  std::map<int32_t, bool> prompt_;
  std::map<int32_t, int> generated_;
};

int32_t ArgMax(const std::vector<double>& l) {
  size_t best = 0;
  for (size_t v = 1; v < l.size(); ++v) {
    if (l[v] > l[best]) best = v;
  }
  return static_cast<int32_t>(best);
}

Penalties Strong() {
  Penalties p;
  p.repetition = 1.6f;
  p.presence = 0.5f;
  p.frequency = 0.7f;
  p.logit_bias = {{17, 2.5f}, {400, -100.0f}, {901, 1.25f}};
  return p;
}

// `n` greedy ids of one sequence alone in a fresh session.
std::vector<int32_t> Alone(const SessionOptions& base, const std::vector<int32_t>& prompt,
                           int64_t n, const SlotSampling& sampling, int32_t seed = 0) {
  SessionOptions o = base;
  o.max_slots = 1;
  std::unique_ptr<DecodeSession> s = Make(o);
  if (s == nullptr) return {};
  const PrefillRequest r{0, prompt, seed, sampling};
  EXPECT_TRUE(s->Prefill(absl::MakeConstSpan(&r, 1)).ok());
  absl::StatusOr<std::vector<int32_t>> ids = s->Generate(0, n);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

TEST(SessionPenaltiesTest, GreedyIdsAreTheArgmaxOfTheHostPenalizedLogits) {
  std::unique_ptr<DecodeSession> s = Make(Tiny(3));
  ASSERT_NE(s, nullptr);
  const std::vector<int32_t> a = RandomPrompt(9, 1), b = RandomPrompt(5, 2);
  const Penalties strong = Strong();
  Penalties repeat_only;
  repeat_only.repetition = 0.7f;  // < 1 favours repeats
  const PrefillRequest requests[] = {{0, a, 0, SlotSampling{std::nullopt, strong}},
                                     {2, b, 0, SlotSampling{std::nullopt, repeat_only}}};
  ASSERT_TRUE(s->Prefill(requests).ok());
  HostPenalties ref0(strong, a), ref2(repeat_only, b);
  int changed = 0;
  for (int step = 0; step < 24; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    absl::StatusOr<std::vector<std::vector<int32_t>>> ids = s->Generate(1);
    ASSERT_TRUE(ids.ok()) << ids.status();
    for (auto [slot, ref] : {std::pair{0, &ref0}, std::pair{2, &ref2}}) {
      absl::StatusOr<std::vector<float>> logits = s->Logits(slot);
      ASSERT_TRUE(logits.ok()) << logits.status();
      const int32_t want = ArgMax(ref->Apply(*logits));
      ASSERT_EQ((*ids)[slot].size(), 1u);
      EXPECT_EQ((*ids)[slot][0], want) << "slot " << slot;
      std::vector<double> raw(logits->begin(), logits->end());
      changed += ArgMax(raw) != want;
      ref->Chose((*ids)[slot][0]);
    }
  }
  EXPECT_GT(changed, 0) << "the penalties never changed a choice";
  // The -100 bias keeps its id out for good.
  const std::vector<int32_t> tokens = *s->Tokens(0);
  for (int32_t id : tokens) EXPECT_NE(id, 400);
}

TEST(SessionPenaltiesTest, NeutralSlotsGetTheIdsOfASessionWithoutPenalties) {
  SessionOptions with = Tiny(2), without = Tiny(2);
  without.penalties = false;
  const std::vector<int32_t> a = RandomPrompt(7, 3), b = RandomPrompt(6, 4);
  const std::vector<int32_t> want = Alone(without, a, 16, SlotSampling{});
  std::unique_ptr<DecodeSession> s = Make(with);
  ASSERT_NE(s, nullptr);
  // A penalised neighbour does not disturb the neutral slot.
  const PrefillRequest requests[] = {{0, b, 0, SlotSampling{std::nullopt, Strong()}},
                                     {1, a, 0, SlotSampling{}}};
  ASSERT_TRUE(s->Prefill(requests).ok());
  ASSERT_TRUE(s->Generate(16).ok());
  EXPECT_EQ(*s->Tokens(1), want);
  EXPECT_NE(*s->Tokens(0), Alone(without, b, 16, SlotSampling{}));
}

TEST(SessionPenaltiesTest, MinPKeepsEveryDrawAboveItsBound) {
  SessionOptions o = Tiny(1);
  const ops::Sample sample{1.5f, 0, 1.0f};
  o.sampling = sample;
  const std::vector<int32_t> a = RandomPrompt(6, 5);
  // Whether the id drawn at each step has probability >= min_p times the top one's.
  auto above = [&](float min_p, int32_t seed) {
    std::unique_ptr<DecodeSession> s = Make(o);
    std::vector<bool> out;
    if (s == nullptr) return out;
    Penalties p;
    p.min_p = min_p;
    const PrefillRequest r{0, a, seed, SlotSampling{sample, p}};
    EXPECT_TRUE(s->Prefill(absl::MakeConstSpan(&r, 1)).ok());
    for (int step = 0; step < 40; ++step) {
      absl::StatusOr<std::vector<int32_t>> id = s->Generate(0, 1);
      absl::StatusOr<std::vector<float>> logits = s->Logits(0);
      if (!id.ok() || !logits.ok()) {
        ADD_FAILURE() << id.status() << logits.status();
        break;
      }
      const float top = *std::max_element(logits->begin(), logits->end());
      const double ratio = std::exp(((*logits)[(*id)[0]] - top) / sample.temperature);
      out.push_back(ratio >= 0.25 * (1 - 1e-5));
    }
    return out;
  };
  for (bool ok : above(0.25f, 8)) EXPECT_TRUE(ok);
  // Without min-p the same draws leave the bound: the check above can fail.
  const std::vector<bool> free = above(0.0f, 8);
  EXPECT_NE(std::count(free.begin(), free.end(), false), 0);
}

TEST(SessionPenaltiesTest, HostChosenSlotsCountWhatTheyChose) {
  // Steps greedy, the slot sampled on the host: its ids must be those of a session whose
  // steps sample so, which count on the device what they chose.
  const ops::Sample sample{0.9f, 40, 0.95f};
  SessionOptions greedy = Tiny(2), sampled = Tiny(2);
  sampled.sampling = sample;
  const std::vector<int32_t> a = RandomPrompt(8, 6);
  const SlotSampling slot{sample, Strong()};
  const std::vector<int32_t> want = Alone(sampled, a, 20, slot, 31);
  ASSERT_NE(want, Alone(sampled, a, 20, SlotSampling{sample}, 31));
  std::unique_ptr<DecodeSession> s = Make(greedy);
  ASSERT_NE(s, nullptr);
  const PrefillRequest requests[] = {{1, a, 31, slot}};
  ASSERT_TRUE(s->Prefill(requests).ok());
  absl::StatusOr<std::vector<int32_t>> ids = s->Generate(1, 20);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, want);
}

TEST(SessionPenaltiesTest, MovedSlotAndPromptsThroughDecodeStepsKeepTheirCounts) {
  const SlotSampling slot{std::nullopt, Strong()};
  const std::vector<int32_t> a = RandomPrompt(12, 7);
  const std::vector<int32_t> want = Alone(Tiny(1), a, 15, slot);
  // Prompt tokens fed through decode steps are not counted as chosen.
  SessionOptions by_steps = Tiny(1);
  by_steps.prefill_chunk = 0;
  EXPECT_EQ(Alone(by_steps, a, 15, slot), want);

  std::unique_ptr<DecodeSession> s = Make(Tiny(4));
  ASSERT_NE(s, nullptr);
  const PrefillRequest r{3, a, 0, slot};
  ASSERT_TRUE(s->Prefill(absl::MakeConstSpan(&r, 1)).ok());
  ASSERT_TRUE(s->Generate(6).ok());
  ASSERT_TRUE(s->MoveSlot(3, 1).ok());
  ASSERT_TRUE(s->Generate(9).ok());
  EXPECT_EQ(*s->Tokens(1), want);
  // A new sequence in the freed slot starts with counts of its own prompt only.
  const PrefillRequest again{3, a, 0, slot};
  ASSERT_TRUE(s->Prefill(absl::MakeConstSpan(&again, 1)).ok());
  ASSERT_TRUE(s->Generate(15).ok());
  EXPECT_EQ(*s->Tokens(3), want);
}

TEST(SessionPenaltiesTest, AnAppendedTurnIsPenalizedAsTheWholeHistoryPrefilled) {
  const SlotSampling slot{std::nullopt, Strong()};
  const std::vector<int32_t> first = RandomPrompt(7, 8), turn = RandomPrompt(5, 9);
  std::unique_ptr<DecodeSession> s = Make(Tiny(1));
  ASSERT_NE(s, nullptr);
  const PrefillRequest r{0, first, 0, slot};
  ASSERT_TRUE(s->Prefill(absl::MakeConstSpan(&r, 1)).ok());
  ASSERT_TRUE(s->Generate(6).ok());
  ASSERT_TRUE(s->Append(0, turn).ok());
  ASSERT_TRUE(s->Generate(4).ok());
  ASSERT_TRUE(s->Append(0, turn).ok());  // a second turn: nothing counted twice
  ASSERT_TRUE(s->Generate(8).ok());
  const std::vector<int32_t> tokens = *s->Tokens(0);
  ASSERT_EQ(tokens.size(), 18u);
  std::vector<int32_t> history = first;
  history.insert(history.end(), tokens.begin(), tokens.begin() + 6);
  history.insert(history.end(), turn.begin(), turn.end());
  history.insert(history.end(), tokens.begin() + 6, tokens.begin() + 10);
  history.insert(history.end(), turn.begin(), turn.end());
  EXPECT_EQ(std::vector<int32_t>(tokens.begin() + 10, tokens.end()),
            Alone(Tiny(1), history, 8, slot));
}

TEST(SessionPenaltiesTest, BadPenaltiesAreRefusedByName) {
  std::unique_ptr<DecodeSession> s = Make(Tiny(1));
  ASSERT_NE(s, nullptr);
  const std::vector<int32_t> a = RandomPrompt(4, 10);
  auto refused = [&](Penalties p, absl::StatusCode code, const std::string& says) {
    const PrefillRequest r{0, a, 0, SlotSampling{std::nullopt, std::move(p)}};
    const absl::Status st = s->Prefill(absl::MakeConstSpan(&r, 1));
    EXPECT_EQ(st.code(), code) << st;
    EXPECT_NE(std::string(st.message()).find(says), std::string::npos) << st;
  };
  const auto invalid = absl::StatusCode::kInvalidArgument;
  Penalties p;
  p.repetition = 0.0f;
  refused(p, invalid, "repetition");
  p = {};
  p.presence = NAN;
  refused(p, invalid, "presence");
  p = {};
  p.frequency = 2.5f;
  refused(p, invalid, "frequency");
  p = {};
  p.min_p = 1.5f;
  refused(p, invalid, "min_p");
  p = {};
  p.logit_bias = {{1024, 1.0f}};
  refused(p, invalid, "outside the vocabulary");
  p.logit_bias = {{5, 1.0f}, {5, 2.0f}};
  refused(p, invalid, "two logit biases");
  p.logit_bias = {{5, 101.0f}};
  refused(p, invalid, "logit bias 0");
  p.logit_bias.assign(ops::kMaxLogitBias + 1, {1, 1.0f});
  refused(p, invalid, "at most 64");
  EXPECT_FALSE(s->live(0)) << "a refused Prefill started the slot";

  // A session made without penalties refuses them, and takes neutral ones.
  SessionOptions plain = Tiny(1);
  plain.penalties = false;
  s = Make(plain);
  ASSERT_NE(s, nullptr);
  refused(Strong(), absl::StatusCode::kFailedPrecondition, "SessionOptions::penalties");
  const PrefillRequest neutral{0, a, 0, SlotSampling{}};
  EXPECT_TRUE(s->Prefill(absl::MakeConstSpan(&neutral, 1)).ok());
}

TEST(SessionPenaltiesTest, CudaIdsEqualTheCpuReference) {
  if (!CudaDeviceFound()) GTEST_SKIP() << "no CUDA device";
  for (const bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "sampled" : "greedy");
    SessionOptions o = Tiny(3);
    if (sampled) o.sampling = ops::Sample{0.8f, 50, 0.9f};
    Penalties min_p = Strong();
    min_p.min_p = 0.1f;
    auto run = [&](Backend backend) {
      o.backend = backend;
      std::unique_ptr<DecodeSession> s = Make(o);
      std::vector<std::vector<int32_t>> out;
      if (s == nullptr) return out;
      const std::vector<int32_t> a = RandomPrompt(9, 11), b = RandomPrompt(20, 12);
      const PrefillRequest requests[] = {{0, a, 5, SlotSampling{o.sampling, Strong()}},
                                         {2, b, 6, SlotSampling{o.sampling, min_p}}};
      EXPECT_TRUE(s->Prefill(requests).ok());
      EXPECT_TRUE(s->Generate(20).ok());
      EXPECT_TRUE(s->MoveSlot(2, 1).ok());
      EXPECT_TRUE(s->Generate(10).ok());
      for (int64_t i = 0; i < 2; ++i) out.push_back(*s->Tokens(i));
      return out;
    };
    EXPECT_EQ(run(Backend::kCuda), run(Backend::kCpu));
  }
}

}  // namespace
}  // namespace sg
