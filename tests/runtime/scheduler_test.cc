// What a server needs from a session and the continuous-batching scheduler over it, on the
// CPU reference with the built-in tiny model: a prompt fed in chunks while another slot
// decodes (Hold, Append, Resume), a slot's own sampling chosen on the host and a slot moved
// to another give exactly the ids of the same sequence alone; requests submitted from many
// threads at once get the ids each would get alone, whatever joins and leaves around them;
// the queue is bounded, cancelled requests free their slots, Drain and Stop end cleanly.
#include "stepgraph/runtime/scheduler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "stepgraph/runtime/session.h"
#include "stepgraph/runtime/step_runner.h"

namespace sg {
namespace {

using Clock = std::chrono::steady_clock;

SessionOptions Tiny(int64_t slots, int64_t max_seq = 96) {
  SessionOptions o;
  o.config = TinyLlamaConfig();
  o.weight_seed = 11;
  o.backend = Backend::kCpu;
  o.cpu_threads = 1;
  o.max_slots = slots;
  o.max_seq = max_seq;
  o.prefill_chunk = 32;
  return o;
}

std::unique_ptr<DecodeSession> Make(const SessionOptions& o) {
  absl::StatusOr<std::unique_ptr<DecodeSession>> s = DecodeSession::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

std::vector<int32_t> RandomPrompt(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(
      0, static_cast<int32_t>(TinyLlamaConfig().vocab_size - 1));
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int32_t& v : p) v = id(rng);
  return p;
}

// `n` ids of `prompt` alone in a fresh one-slot session made with `o`'s sampling.
std::vector<int32_t> Alone(SessionOptions o, const std::vector<int32_t>& prompt, int64_t n,
                           int32_t seed = 0) {
  o.max_slots = 1;
  std::unique_ptr<DecodeSession> s = Make(o);
  if (s == nullptr) return {};
  EXPECT_TRUE(s->Prefill(0, prompt, seed).ok());
  absl::StatusOr<std::vector<int32_t>> ids = s->Generate(0, n);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

// ---- the session's additions ----------------------------------------------------------

TEST(SessionServingTest, PromptFedInChunksBesideADecodingSlotEqualsItAlone) {
  const SessionOptions o = Tiny(4);
  const std::vector<int32_t> a = RandomPrompt(7, 1), b = RandomPrompt(50, 2);
  std::unique_ptr<DecodeSession> s = Make(o);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Prefill(0, a).ok());
  ASSERT_TRUE(s->Generate(3).ok());
  // b goes into slot 2 in pieces of 11, 16, 16 and 7, slot 0 stepping between them.
  ASSERT_TRUE(s->Prefill(2, absl::MakeConstSpan(b).subspan(0, 11)).ok());
  ASSERT_TRUE(s->Hold(2).ok());
  EXPECT_TRUE(s->held(2));
  size_t at = 11;
  for (size_t piece : {16, 16, 7}) {
    absl::StatusOr<std::vector<std::vector<int32_t>>> step = s->Generate(1);
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ((*step)[0].size(), 1u);
    EXPECT_TRUE((*step)[2].empty()) << "a held slot made an id";
    ASSERT_TRUE(s->Append(2, absl::MakeConstSpan(b).subspan(at, piece)).ok());
    at += piece;
  }
  ASSERT_EQ(at, b.size());
  EXPECT_EQ(s->position(2), static_cast<int64_t>(b.size()) - 1);
  ASSERT_TRUE(s->Resume(2).ok());
  ASSERT_TRUE(s->Generate(8).ok());
  EXPECT_EQ(*s->Tokens(2), Alone(o, b, 8));
  EXPECT_EQ(*s->Tokens(0), Alone(o, a, 14));
  EXPECT_EQ(s->Hold(1).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SessionServingTest, OnlyHeldSlotsLeaveNothingToStep) {
  std::unique_ptr<DecodeSession> s = Make(Tiny(2));
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Prefill(1, RandomPrompt(5, 3)).ok());
  ASSERT_TRUE(s->Hold(1).ok());
  EXPECT_EQ(s->Step().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s->Logits(1).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(s->Release(1).ok());
  EXPECT_FALSE(s->held(1));
}

// A slot whose sampling differs from the steps' gets the ids of a session whose steps
// sample so: the host's choice is the reference's.
TEST(SessionServingTest, SlotSamplingOnTheHostEqualsTheStepsSampling) {
  const ops::Sample sample{0.9f, 40, 0.95f};
  SessionOptions greedy = Tiny(3), sampled = Tiny(3);
  sampled.sampling = sample;
  const std::vector<int32_t> a = RandomPrompt(6, 4), b = RandomPrompt(9, 5);
  const std::vector<int32_t> want_sampled = Alone(sampled, b, 12, 77);
  const std::vector<int32_t> want_greedy = Alone(greedy, a, 12);
  ASSERT_NE(want_sampled, Alone(greedy, b, 12)) << "sampling made no difference";

  for (const SessionOptions& o : {greedy, sampled}) {
    std::unique_ptr<DecodeSession> s = Make(o);
    ASSERT_NE(s, nullptr);
    const PrefillRequest requests[] = {
        {0, a, 5, SlotSampling{}},                 // greedy
        {2, b, 77, SlotSampling{sample}}};         // sampled
    ASSERT_TRUE(s->Prefill(requests).ok());
    ASSERT_TRUE(s->Generate(12).ok());
    EXPECT_EQ(*s->Tokens(0), want_greedy);
    EXPECT_EQ(*s->Tokens(2), want_sampled);
  }
}

TEST(SessionServingTest, MovedSlotGoesOnAsIfItHadStayed) {
  SessionOptions o = Tiny(4);
  o.sampling = ops::Sample{1.0f, 0, 1.0f};
  const std::vector<int32_t> a = RandomPrompt(12, 6), b = RandomPrompt(40, 7);
  std::unique_ptr<DecodeSession> s = Make(o);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Prefill(3, a, 9).ok());
  ASSERT_TRUE(s->Generate(5).ok());
  ASSERT_TRUE(s->Prefill(2, absl::MakeConstSpan(b).subspan(0, 20), 4).ok());
  ASSERT_TRUE(s->Hold(2).ok());
  ASSERT_TRUE(s->MoveSlot(3, 0).ok());
  ASSERT_TRUE(s->MoveSlot(2, 1).ok());  // a held slot moves with its hold
  EXPECT_FALSE(s->live(3));
  EXPECT_FALSE(s->live(2));
  EXPECT_TRUE(s->held(1));
  ASSERT_TRUE(s->Generate(4).ok());
  ASSERT_TRUE(s->Append(1, absl::MakeConstSpan(b).subspan(20)).ok());
  ASSERT_TRUE(s->Resume(1).ok());
  ASSERT_TRUE(s->Generate(6).ok());
  EXPECT_EQ(*s->Tokens(0), Alone(o, a, 15, 9));
  EXPECT_EQ(*s->Tokens(1), Alone(o, b, 6, 4));
  EXPECT_EQ(s->MoveSlot(0, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s->MoveSlot(2, 3).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s->MoveSlot(0, 9).code(), absl::StatusCode::kInvalidArgument);
}

// ---- the scheduler --------------------------------------------------------------------

struct Outcome {
  std::vector<int32_t> ids;
  FinishReason finish = FinishReason::kNone;
};

Outcome ReadAll(GenerationStream& stream) {
  Outcome out;
  while (out.finish == FinishReason::kNone) {
    out.finish = stream.Wait(&out.ids, Clock::now() + std::chrono::seconds(60));
  }
  return out;
}

std::unique_ptr<Scheduler> StartScheduler(DecodeSession* s, SchedulerOptions o = {}) {
  absl::StatusOr<std::unique_ptr<Scheduler>> made = Scheduler::Start(s, o);
  EXPECT_TRUE(made.ok()) << made.status();
  return made.ok() ? *std::move(made) : nullptr;
}

// Waits until `done` holds of the stats (the scheduler thread updates them).
template <typename F>
bool Eventually(const Scheduler& sch, F done) {
  const Clock::time_point end = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < end) {
    if (done(sch.stats())) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

// Requests from many threads through a scheduler over a session on `backend` (replayed
// steps on CUDA) get the ids each gets alone on the CPU reference.
void ConcurrentRequestsGetTheIdsEachGetsAloneOn(Backend backend) {
  const SessionOptions o = Tiny(4);
  constexpr int kRequests = 12;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> lengths;
  std::vector<std::vector<int32_t>> want;
  for (int i = 0; i < kRequests; ++i) {
    // Short prompts that start together and long ones fed a chunk at a time.
    prompts.push_back(RandomPrompt(i % 3 == 0 ? 45 + i : 3 + i, 100 + i));
    lengths.push_back(4 + (i * 5) % 11);
    want.push_back(Alone(o, prompts[i], lengths[i]));
  }
  SessionOptions on = o;
  on.backend = backend;
  std::unique_ptr<DecodeSession> s = Make(on);
  ASSERT_NE(s, nullptr);
  std::unique_ptr<Scheduler> sch = StartScheduler(s.get(), {.max_queue = 16, .prefill_budget = 16});
  ASSERT_NE(sch, nullptr);
  std::vector<Outcome> got(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      std::this_thread::sleep_for(std::chrono::milliseconds(7 * (i % 4)));
      GenerationRequest r;
      r.prompt = prompts[i];
      r.max_tokens = lengths[i];
      absl::StatusOr<std::shared_ptr<GenerationStream>> stream = sch->Submit(std::move(r));
      ASSERT_TRUE(stream.ok()) << stream.status();
      got[i] = ReadAll(**stream);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(got[i].finish, FinishReason::kLength) << "request " << i;
    EXPECT_EQ(got[i].ids, want[i]) << "request " << i;
  }
  ASSERT_TRUE(Eventually(*sch, [](const SchedulerStats& st) { return st.active == 0; }));
  const SchedulerStats st = sch->stats();
  EXPECT_EQ(st.submitted, kRequests);
  EXPECT_EQ(st.finished[static_cast<int>(FinishReason::kLength)], kRequests);
  EXPECT_EQ(st.queued, 0);
  EXPECT_EQ(st.decoding, 0);
  int64_t made = 0;
  for (int64_t n : lengths) made += n;
  EXPECT_EQ(st.generated_tokens, made);
  EXPECT_GT(st.prefill_calls, kRequests / 3) << "long prompts went in one piece";
}

TEST(SchedulerTest, ConcurrentRequestsGetTheIdsEachGetsAlone) {
  ConcurrentRequestsGetTheIdsEachGetsAloneOn(Backend::kCpu);
}

// The same on the GPU (held slots, moved slots and every bucket's captured step), against
// the CPU reference's ids; skipped without a device.
TEST(SchedulerTest, OnTheGpuConcurrentRequestsGetTheCpuReferenceIds) {
  if (!CudaDeviceFound()) GTEST_SKIP() << "no CUDA device";
  ConcurrentRequestsGetTheIdsEachGetsAloneOn(Backend::kCuda);
}

TEST(SchedulerTest, StopIdsEndARequestWithoutGivingTheId) {
  const SessionOptions o = Tiny(2);
  const std::vector<int32_t> p = RandomPrompt(5, 8);
  const std::vector<int32_t> alone = Alone(o, p, 10);
  // The first id that did not come earlier stops it there.
  size_t k = 3;
  while (std::find(alone.begin(), alone.begin() + k, alone[k]) != alone.begin() + k) ++k;
  std::unique_ptr<DecodeSession> s = Make(o);
  ASSERT_NE(s, nullptr);
  std::unique_ptr<Scheduler> sch = StartScheduler(s.get());
  GenerationRequest r;
  r.prompt = p;
  r.max_tokens = 10;
  r.stop_ids = {alone[k], -5};
  absl::StatusOr<std::shared_ptr<GenerationStream>> stream = sch->Submit(r);
  ASSERT_TRUE(stream.ok());
  const Outcome out = ReadAll(**stream);
  EXPECT_EQ(out.finish, FinishReason::kStop);
  EXPECT_EQ(out.ids, std::vector<int32_t>(alone.begin(), alone.begin() + k));
}

TEST(SchedulerTest, OwnSamplingAndSeedsAreTheRequests) {
  SessionOptions o = Tiny(3);
  const ops::Sample sample{0.8f, 0, 0.9f};
  SessionOptions sampled = o;
  sampled.sampling = sample;
  const std::vector<int32_t> p = RandomPrompt(8, 9);
  std::unique_ptr<DecodeSession> s = Make(o);
  ASSERT_NE(s, nullptr);
  std::unique_ptr<Scheduler> sch = StartScheduler(s.get());
  std::vector<std::shared_ptr<GenerationStream>> streams;
  for (int32_t seed : {3, 4, 3}) {
    GenerationRequest r;
    r.prompt = p;
    r.max_tokens = 9;
    r.seed = seed;
    r.sampling = SlotSampling{sample};
    streams.push_back(*sch->Submit(r));
  }
  const Outcome a = ReadAll(*streams[0]), b = ReadAll(*streams[1]), c = ReadAll(*streams[2]);
  EXPECT_EQ(a.ids, Alone(sampled, p, 9, 3));
  EXPECT_EQ(b.ids, Alone(sampled, p, 9, 4));
  EXPECT_EQ(c.ids, a.ids);
  EXPECT_NE(a.ids, b.ids);
}

TEST(SchedulerTest, BadRequestsAreRefusedNamingTheField) {
  std::unique_ptr<DecodeSession> s = Make(Tiny(1, 32));
  ASSERT_NE(s, nullptr);
  std::unique_ptr<Scheduler> sch = StartScheduler(s.get());
  auto submit = [&](std::vector<int32_t> prompt, int64_t max_tokens) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    return sch->Submit(std::move(r)).status();
  };
  EXPECT_EQ(submit({}, 4).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status bad_id = submit({1, 1 << 20}, 4);
  EXPECT_EQ(bad_id.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_id.message().find("token 1"), std::string::npos) << bad_id;
  EXPECT_EQ(submit({1, 2}, 0).code(), absl::StatusCode::kInvalidArgument);
  // 30 prompt ids and 3 more take 32 positions: fits; 4 more do not.
  EXPECT_TRUE(submit(RandomPrompt(30, 1), 3).ok());
  const absl::Status too_long = submit(RandomPrompt(30, 1), 4);
  EXPECT_EQ(too_long.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(too_long.message().find("32"), std::string::npos) << too_long;
}

TEST(SchedulerTest, TheQueueIsBoundedAndEveryAcceptedRequestEnds) {
  std::unique_ptr<DecodeSession> s = Make(Tiny(2));
  ASSERT_NE(s, nullptr);
  std::unique_ptr<Scheduler> sch = StartScheduler(s.get(), {.max_queue = 3});
  std::vector<std::shared_ptr<GenerationStream>> accepted;
  int refused = 0;
  for (int i = 0; i < 12; ++i) {
    GenerationRequest r;
    r.prompt = RandomPrompt(4, 200 + i);
    r.max_tokens = 30;
    absl::StatusOr<std::shared_ptr<GenerationStream>> stream = sch->Submit(r);
    if (stream.ok()) {
      accepted.push_back(*stream);
    } else {
      EXPECT_EQ(stream.status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_NE(stream.status().message().find("queue holds 3"), std::string::npos);
      ++refused;
    }
  }
  // Two run and three wait; the rest are refused at once.
  EXPECT_EQ(accepted.size(), 5u);
  EXPECT_EQ(refused, 7);
  for (auto& stream : accepted) EXPECT_EQ(ReadAll(*stream).finish, FinishReason::kLength);
  ASSERT_TRUE(Eventually(*sch, [](const SchedulerStats& st) { return st.active == 0; }));
  EXPECT_EQ(sch->stats().refused, 7);
}

// A client that sends its next request as soon as its answer ended (as an HTTP client on
// one connection does) always finds room: the request leaves the counts before its reader
// learns that it ended.
TEST(SchedulerTest, ARequestSubmittedOnTheEndOfTheLastFindsItsSlotFree) {
  std::unique_ptr<DecodeSession> s = Make(Tiny(1));
  ASSERT_NE(s, nullptr);
  std::unique_ptr<Scheduler> sch = StartScheduler(s.get(), {.max_queue = 0});
  for (int i = 0; i < 40; ++i) {
    GenerationRequest r;
    r.prompt = RandomPrompt(3, 500 + i);
    r.max_tokens = 1 + i % 3;
    absl::StatusOr<std::shared_ptr<GenerationStream>> stream = sch->Submit(r);
    ASSERT_TRUE(stream.ok()) << "request " << i << ": " << stream.status();
    EXPECT_EQ(ReadAll(**stream).finish, FinishReason::kLength);
  }
  EXPECT_EQ(sch->stats().refused, 0);
}

TEST(SchedulerTest, CancelledRequestsFreeTheirSlotsBeforeTheNextStep) {
  std::unique_ptr<DecodeSession> s = Make(Tiny(2, 400));
  ASSERT_NE(s, nullptr);
  std::unique_ptr<Scheduler> sch = StartScheduler(s.get());
  GenerationRequest r;
  r.prompt = RandomPrompt(6, 10);
  r.max_tokens = 390;
  std::shared_ptr<GenerationStream> a = *sch->Submit(r), b = *sch->Submit(r);
  std::vector<int32_t> ids;
  while (ids.size() < 3) a->Wait(&ids, Clock::now() + std::chrono::seconds(10));
  a->Cancel();
  b->Cancel();
  EXPECT_EQ(ReadAll(*a).finish, FinishReason::kCancelled);
  EXPECT_EQ(ReadAll(*b).finish, FinishReason::kCancelled);
  ASSERT_TRUE(Eventually(*sch, [](const SchedulerStats& st) { return st.active == 0; }));
  const SchedulerStats st = sch->stats();
  EXPECT_EQ(st.finished[static_cast<int>(FinishReason::kCancelled)], 2);
  EXPECT_LT(st.decode_steps, 50) << "cancelled requests kept stepping";
  EXPECT_FALSE(s->live(0));
  EXPECT_FALSE(s->live(1));
}

TEST(SchedulerTest, SlotsMoveDownSoThatStepsRunInTheSmallestBucket) {
  SessionOptions o = Tiny(4);
  o.buckets = {1, 2, 4};
  std::unique_ptr<DecodeSession> s = Make(o);
  ASSERT_NE(s, nullptr);
  std::unique_ptr<Scheduler> sch = StartScheduler(s.get());
  // Four start together in slots 0-3; the one in slot 3 runs longest.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<GenerationStream>> streams;
  const int64_t lengths[] = {4, 3, 2, 40};
  for (int i = 0; i < 4; ++i) prompts.push_back(RandomPrompt(5, 300 + i));
  {
    // Submitted while the scheduler waits for the first, so that all four start at once.
    for (int i = 0; i < 4; ++i) {
      GenerationRequest r;
      r.prompt = prompts[i];
      r.max_tokens = lengths[i];
      streams.push_back(*sch->Submit(r));
    }
  }
  std::vector<Outcome> got;
  for (auto& stream : streams) got.push_back(ReadAll(*stream));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i].ids, Alone(o, prompts[i], lengths[i])) << i;
  ASSERT_TRUE(Eventually(*sch, [](const SchedulerStats& st) { return st.active == 0; }));
  const SchedulerStats st = sch->stats();
  EXPECT_GE(st.compactions, 1);
  EXPECT_EQ(st.last_bucket, 1) << "the last sequence did not move to slot 0";
}

TEST(SchedulerTest, ManyThreadsManyRequests) {
  const SessionOptions o = Tiny(4, 64);
  std::unique_ptr<DecodeSession> s = Make(o);
  ASSERT_NE(s, nullptr);
  std::unique_ptr<Scheduler> sch = StartScheduler(s.get(), {.max_queue = 64});
  constexpr int kThreads = 16, kEach = 4;
  const std::vector<int32_t> shared_prompt = RandomPrompt(6, 400);
  const std::vector<int32_t> want = Alone(o, shared_prompt, 5);
  std::atomic<int> wrong{0}, ended{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kEach; ++k) {
        GenerationRequest r;
        r.prompt = shared_prompt;
        r.max_tokens = 5;
        absl::StatusOr<std::shared_ptr<GenerationStream>> stream = sch->Submit(r);
        if (!stream.ok()) {
          ++wrong;
          continue;
        }
        if ((t + k) % 5 == 4) (*stream)->Cancel();
        const Outcome out = ReadAll(**stream);
        ++ended;
        if (out.finish == FinishReason::kLength && out.ids != want) ++wrong;
        if (out.finish != FinishReason::kLength && out.finish != FinishReason::kCancelled) ++wrong;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(ended.load(), kThreads * kEach);
  ASSERT_TRUE(Eventually(*sch, [](const SchedulerStats& st) { return st.active == 0; }));
}

TEST(SchedulerTest, DrainWaitsForAcceptedRequestsAndStopAbortsTheRest) {
  std::unique_ptr<DecodeSession> s = Make(Tiny(1, 200));
  ASSERT_NE(s, nullptr);
  std::unique_ptr<Scheduler> sch = StartScheduler(s.get());
  GenerationRequest r;
  r.prompt = RandomPrompt(4, 500);
  r.max_tokens = 6;
  std::shared_ptr<GenerationStream> a = *sch->Submit(r), b = *sch->Submit(r);
  EXPECT_TRUE(sch->Drain(Clock::now() + std::chrono::seconds(60)));
  EXPECT_EQ(ReadAll(*a).finish, FinishReason::kLength);
  EXPECT_EQ(ReadAll(*b).finish, FinishReason::kLength);
  EXPECT_EQ(sch->Submit(r).status().code(), absl::StatusCode::kUnavailable);

  std::unique_ptr<DecodeSession> s2 = Make(Tiny(1, 200));
  std::unique_ptr<Scheduler> sch2 = StartScheduler(s2.get());
  r.max_tokens = 190;
  std::shared_ptr<GenerationStream> c = *sch2->Submit(r), d = *sch2->Submit(r);
  EXPECT_FALSE(sch2->Drain(Clock::now() + std::chrono::milliseconds(20)));
  sch2->Stop();
  EXPECT_EQ(ReadAll(*c).finish, FinishReason::kAborted);
  EXPECT_EQ(ReadAll(*d).finish, FinishReason::kAborted);
}

}  // namespace
}  // namespace sg
