// The session C ABI (include/stepgraph/c_api/c_session.h) on the built-in model and the CPU
// backend: its ids and logits are the C++ DecodeSession's, every bad argument or state is a
// code with a message on the handle, and a failed create leaves a handle holding the reason.
#include "stepgraph/c_api/c_session.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "stepgraph/runtime/session.h"
#include "stepgraph/runtime/step_runner.h"

namespace {

struct Destroy {
  void operator()(stepgraph_session* s) const { stepgraph_session_destroy(s); }
};
using Handle = std::unique_ptr<stepgraph_session, Destroy>;

stepgraph_session_options CpuOptions(uint64_t seed) {
  stepgraph_session_options o;
  EXPECT_EQ(stepgraph_session_options_init(&o), STEPGRAPH_OK);
  o.backend = STEPGRAPH_BACKEND_CPU;
  o.max_slots = 2;
  o.max_seq = 32;
  o.weight_seed = seed;
  return o;
}

Handle Create(const stepgraph_session_options& o, const char* path = nullptr) {
  stepgraph_session* s = nullptr;
  const int32_t rc = stepgraph_session_create(path, &o, &s);
  EXPECT_EQ(rc, STEPGRAPH_OK) << (s ? stepgraph_session_error(s) : "no handle");
  return Handle(s);
}

std::vector<int32_t> RandomIds(int n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = d(rng);
  return ids;
}

TEST(CSessionTest, OptionsDefaults) {
  stepgraph_session_options o;
  o.max_slots = -7;  // poison: init must set every field
  ASSERT_EQ(stepgraph_session_options_init(&o), STEPGRAPH_OK);
  EXPECT_EQ(o.struct_size, static_cast<int64_t>(sizeof(o)));
  EXPECT_EQ(o.max_slots, 1);
  EXPECT_EQ(o.backend, STEPGRAPH_BACKEND_AUTO);
  EXPECT_EQ(o.sampling, STEPGRAPH_SAMPLING_GREEDY);
  EXPECT_EQ(stepgraph_session_options_init(nullptr), STEPGRAPH_ERROR_INVALID_VALUE);
  EXPECT_EQ(stepgraph_session_abi_version(), STEPGRAPH_SESSION_API_VERSION);
}

// The C session is the C++ session: same ids, same logits, for two slots at different
// positions.
TEST(CSessionTest, IdsAndLogitsAreTheDecodeSessionsOnes) {
  const stepgraph_session_options o = CpuOptions(1234);
  Handle h = Create(o);
  ASSERT_NE(h, nullptr);
  stepgraph_session_info info{};
  ASSERT_EQ(stepgraph_session_get_info(h.get(), &info), STEPGRAPH_OK);
  EXPECT_EQ(info.backend, STEPGRAPH_BACKEND_CPU);
  EXPECT_EQ(info.max_slots, 2);
  EXPECT_EQ(info.max_seq, 32);
  ASSERT_GT(info.vocab_size, 1);

  sg::SessionOptions ref_opts;
  ref_opts.backend = sg::Backend::kCpu;
  ref_opts.max_slots = 2;
  ref_opts.max_seq = 32;
  ref_opts.weight_seed = 1234;
  auto ref = sg::DecodeSession::Create(ref_opts);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ((*ref)->config().vocab_size, info.vocab_size);

  const std::vector<int32_t> p0 = RandomIds(5, info.vocab_size, 1);
  const std::vector<int32_t> p1 = RandomIds(3, info.vocab_size, 2);
  ASSERT_EQ(stepgraph_session_prefill(h.get(), 0, p0.data(), 5, 0), STEPGRAPH_OK);
  ASSERT_EQ(stepgraph_session_prefill(h.get(), 1, p1.data(), 3, 0), STEPGRAPH_OK);
  ASSERT_TRUE((*ref)->Prefill(0, p0).ok());
  ASSERT_TRUE((*ref)->Prefill(1, p1).ok());

  std::vector<int32_t> ids(6, -1);
  ASSERT_EQ(stepgraph_session_generate(h.get(), 0, 6, ids.data()), STEPGRAPH_OK)
      << stepgraph_session_error(h.get());
  EXPECT_STREQ(stepgraph_session_error(h.get()), "");
  auto ref_ids = (*ref)->Generate(0, 6);
  ASSERT_TRUE(ref_ids.ok()) << ref_ids.status();
  EXPECT_EQ(ids, *ref_ids);
  for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < info.vocab_size);

  for (int64_t slot : {0, 1}) {
    std::vector<float> logits(info.vocab_size, std::nanf(""));
    ASSERT_EQ(stepgraph_session_logits(h.get(), slot, logits.data(), info.vocab_size),
              STEPGRAPH_OK);
    auto ref_logits = (*ref)->Logits(slot);
    ASSERT_TRUE(ref_logits.ok()) << ref_logits.status();
    EXPECT_EQ(logits, *ref_logits) << "slot " << slot;
  }

  ASSERT_EQ(stepgraph_session_release(h.get(), 1), STEPGRAPH_OK);
  std::vector<int32_t> more(2, -1);
  ASSERT_EQ(stepgraph_session_generate(h.get(), 0, 2, more.data()), STEPGRAPH_OK);
  ASSERT_TRUE((*ref)->Release(1).ok());
  auto ref_more = (*ref)->Generate(0, 2);
  ASSERT_TRUE(ref_more.ok());
  EXPECT_EQ(more, *ref_more);
}

TEST(CSessionTest, BadArgumentsAndStatesAreCodesWithMessages) {
  Handle h = Create(CpuOptions(7));
  ASSERT_NE(h, nullptr);
  stepgraph_session_info info{};
  ASSERT_EQ(stepgraph_session_get_info(h.get(), &info), STEPGRAPH_OK);
  const std::vector<int32_t> prompt = RandomIds(4, info.vocab_size, 3);
  std::vector<int32_t> ids(4);
  std::vector<float> logits(info.vocab_size);

  auto expect_invalid = [&](int32_t rc, const char* what) {
    EXPECT_EQ(rc, STEPGRAPH_ERROR_INVALID_VALUE) << what;
    EXPECT_STRNE(stepgraph_session_error(h.get()), "") << what;
  };
  // Nothing live yet.
  expect_invalid(stepgraph_session_generate(h.get(), 0, 1, ids.data()), "generate before prefill");
  expect_invalid(stepgraph_session_logits(h.get(), 0, logits.data(), info.vocab_size),
                 "logits before any step");
  expect_invalid(stepgraph_session_prefill(h.get(), 2, prompt.data(), 4, 0), "slot == max_slots");
  expect_invalid(stepgraph_session_prefill(h.get(), -1, prompt.data(), 4, 0), "slot < 0");
  expect_invalid(stepgraph_session_prefill(h.get(), 0, nullptr, 4, 0), "NULL ids");
  expect_invalid(stepgraph_session_prefill(h.get(), 0, prompt.data(), 0, 0), "n == 0");
  expect_invalid(stepgraph_session_prefill(h.get(), 0, prompt.data(), 33, 0), "n > max_seq");
  const int32_t bad[2] = {0, static_cast<int32_t>(info.vocab_size)};
  expect_invalid(stepgraph_session_prefill(h.get(), 0, bad, 2, 0), "id == vocab");
  const int32_t negative[1] = {-1};
  expect_invalid(stepgraph_session_prefill(h.get(), 0, negative, 1, 0), "id < 0");
  expect_invalid(stepgraph_session_get_info(h.get(), nullptr), "NULL info");

  // A success clears the message.
  ASSERT_EQ(stepgraph_session_prefill(h.get(), 0, prompt.data(), 4, 0), STEPGRAPH_OK);
  EXPECT_STREQ(stepgraph_session_error(h.get()), "");
  expect_invalid(stepgraph_session_generate(h.get(), 0, 0, ids.data()), "n == 0");
  expect_invalid(stepgraph_session_generate(h.get(), 0, 1, nullptr), "NULL ids");
  expect_invalid(stepgraph_session_generate(h.get(), 1, 1, ids.data()), "slot not live");
  expect_invalid(stepgraph_session_generate(h.get(), 0, 1000, ids.data()),
                 "more steps than positions left");
  ASSERT_EQ(stepgraph_session_generate(h.get(), 0, 1, ids.data()), STEPGRAPH_OK);
  expect_invalid(stepgraph_session_logits(h.get(), 0, logits.data(), info.vocab_size - 1),
                 "capacity < vocab");
  expect_invalid(stepgraph_session_logits(h.get(), 0, nullptr, info.vocab_size), "NULL logits");
  expect_invalid(stepgraph_session_release(h.get(), 5), "release out of range");

  // NULL handles.
  EXPECT_EQ(stepgraph_session_prefill(nullptr, 0, prompt.data(), 4, 0),
            STEPGRAPH_ERROR_INVALID_VALUE);
  EXPECT_EQ(stepgraph_session_get_info(nullptr, &info), STEPGRAPH_ERROR_INVALID_VALUE);
  EXPECT_STRNE(stepgraph_session_error(nullptr), "");
  stepgraph_session_destroy(nullptr);
}

TEST(CSessionTest, FailedCreateLeavesAHandleWithTheReason) {
  stepgraph_session_options o = CpuOptions(1);
  {
    stepgraph_session* s = nullptr;
    EXPECT_EQ(stepgraph_session_create("/nonexistent/stepgraph/model", &o, &s),
              STEPGRAPH_ERROR_INVALID_VALUE);
    ASSERT_NE(s, nullptr);
    Handle h(s);
    EXPECT_NE(std::string(stepgraph_session_error(s)).find("/nonexistent/stepgraph/model"),
              std::string::npos)
        << stepgraph_session_error(s);
    stepgraph_session_info info{};
    EXPECT_EQ(stepgraph_session_get_info(s, &info), STEPGRAPH_ERROR_INVALID_VALUE);
    EXPECT_STRNE(stepgraph_session_error(s), "");
  }
  auto expect_refused = [](const stepgraph_session_options& opts, const char* path,
                           int32_t code, const char* what) {
    stepgraph_session* s = nullptr;
    EXPECT_EQ(stepgraph_session_create(path, &opts, &s), code) << what;
    ASSERT_NE(s, nullptr) << what;
    EXPECT_STRNE(stepgraph_session_error(s), "") << what;
    stepgraph_session_destroy(s);
  };
  expect_refused(o, "", STEPGRAPH_ERROR_INVALID_VALUE, "empty path");
  stepgraph_session_options bad = o;
  bad.struct_size = 8;
  expect_refused(bad, nullptr, STEPGRAPH_ERROR_INVALID_VALUE, "struct_size");
  bad = o;
  bad.backend = 9;
  expect_refused(bad, nullptr, STEPGRAPH_ERROR_INVALID_VALUE, "backend");
  bad = o;
  bad.max_slots = 0;
  expect_refused(bad, nullptr, STEPGRAPH_ERROR_INVALID_VALUE, "max_slots");
  bad = o;
  bad.max_seq = -1;
  expect_refused(bad, nullptr, STEPGRAPH_ERROR_INVALID_VALUE, "max_seq");
  bad = o;
  bad.cpu_threads = -2;
  expect_refused(bad, nullptr, STEPGRAPH_ERROR_INVALID_VALUE, "cpu_threads");
  bad = o;
  bad.sampling = STEPGRAPH_SAMPLING_SAMPLE;
  bad.temperature = -1.0f;
  expect_refused(bad, nullptr, STEPGRAPH_ERROR_INVALID_VALUE, "temperature");
  bad = o;
  bad.sampling = 5;
  expect_refused(bad, nullptr, STEPGRAPH_ERROR_INVALID_VALUE, "sampling");
  if (!sg::CudaDeviceFound()) {
    bad = o;
    bad.backend = STEPGRAPH_BACKEND_CUDA;
    expect_refused(bad, nullptr, STEPGRAPH_ERROR_NO_CUDA, "CUDA without a device");
  }
  EXPECT_EQ(stepgraph_session_create(nullptr, &o, nullptr), STEPGRAPH_ERROR_INVALID_VALUE);
}

// The same seed and prompt sample the same ids; another seed, other ids.
TEST(CSessionTest, SamplingFollowsTheSlotSeed) {
  stepgraph_session_options o = CpuOptions(99);
  o.sampling = STEPGRAPH_SAMPLING_SAMPLE;
  o.temperature = 5.0f;  // flat enough that two seeds part quickly
  Handle h = Create(o);
  ASSERT_NE(h, nullptr);
  const std::vector<int32_t> prompt = RandomIds(3, 1024, 5);
  auto run = [&](int32_t seed) {
    std::vector<int32_t> ids(12, -1);
    EXPECT_EQ(stepgraph_session_prefill(h.get(), 0, prompt.data(), 3, seed), STEPGRAPH_OK);
    EXPECT_EQ(stepgraph_session_generate(h.get(), 0, 12, ids.data()), STEPGRAPH_OK)
        << stepgraph_session_error(h.get());
    return ids;
  };
  const std::vector<int32_t> a = run(11), b = run(11), c = run(12);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

// A temperature so small that 1/T overflows float (1e-40 is a denormal) samples as greedy
// decoding does, on every seed, instead of ids from a distribution of NaNs; below
// STEPGRAPH_SESSION_MIN_TEMPERATURE the session decodes greedily.
TEST(CSessionTest, TinyTemperaturesDecodeGreedily) {
  const stepgraph_session_options greedy = CpuOptions(31);
  Handle g = Create(greedy);
  ASSERT_NE(g, nullptr);
  const std::vector<int32_t> prompt = RandomIds(4, 1024, 8);
  std::vector<int32_t> want(10, -1);
  ASSERT_EQ(stepgraph_session_prefill(g.get(), 0, prompt.data(), 4, 0), STEPGRAPH_OK);
  ASSERT_EQ(stepgraph_session_generate(g.get(), 0, 10, want.data()), STEPGRAPH_OK);
  for (float t : {1e-40f, 1e-30f, 1e-6f, 0.5f * STEPGRAPH_SESSION_MIN_TEMPERATURE}) {
    stepgraph_session_options o = CpuOptions(31);
    o.sampling = STEPGRAPH_SAMPLING_SAMPLE;
    o.temperature = t;
    Handle h = Create(o);
    ASSERT_NE(h, nullptr);
    for (int32_t seed : {0, 1, 77}) {
      std::vector<int32_t> ids(10, -1);
      ASSERT_EQ(stepgraph_session_prefill(h.get(), 0, prompt.data(), 4, seed), STEPGRAPH_OK);
      ASSERT_EQ(stepgraph_session_generate(h.get(), 0, 10, ids.data()), STEPGRAPH_OK)
          << "temperature " << t << ": " << stepgraph_session_error(h.get());
      EXPECT_EQ(ids, want) << "temperature " << t << ", seed " << seed;
    }
  }
}

// ---- per-call sampling (stepgraph_session_prefill_sampled) ----

TEST(CSessionTest, SamplingDefaultsAreNeutralAndGreedy) {
  stepgraph_sampling c;
  c.repetition_penalty = -3.0f;  // poison: init must set every field
  c.logit_bias_count = 99;
  ASSERT_EQ(stepgraph_sampling_init(&c), STEPGRAPH_OK);
  EXPECT_EQ(c.struct_size, static_cast<int64_t>(sizeof(c)));
  EXPECT_EQ(c.mode, STEPGRAPH_SAMPLING_GREEDY);
  EXPECT_EQ(c.temperature, 1.0f);
  EXPECT_EQ(c.top_k, 0);
  EXPECT_EQ(c.top_p, 1.0f);
  EXPECT_EQ(c.repetition_penalty, 1.0f);
  EXPECT_EQ(c.presence_penalty, 0.0f);
  EXPECT_EQ(c.frequency_penalty, 0.0f);
  EXPECT_EQ(c.min_p, 0.0f);
  EXPECT_EQ(c.logit_bias_count, 0);
  EXPECT_EQ(c.logit_bias_ids, nullptr);
  EXPECT_EQ(c.logit_bias_values, nullptr);
  EXPECT_EQ(stepgraph_sampling_init(nullptr), STEPGRAPH_ERROR_INVALID_VALUE);
}

// A per-call sampling with its penalties and biases (the arrays outlive the struct's use).
struct CallSampling {
  stepgraph_sampling c{};
  std::vector<int32_t> ids;
  std::vector<float> values;
  explicit CallSampling(const sg::Penalties& p, std::optional<sg::ops::Sample> sample = {}) {
    EXPECT_EQ(stepgraph_sampling_init(&c), STEPGRAPH_OK);
    if (sample.has_value()) {
      c.mode = STEPGRAPH_SAMPLING_SAMPLE;
      c.temperature = sample->temperature;
      c.top_k = sample->top_k;
      c.top_p = sample->top_p;
    }
    c.repetition_penalty = p.repetition;
    c.presence_penalty = p.presence;
    c.frequency_penalty = p.frequency;
    c.min_p = p.min_p;
    for (const auto& [id, bias] : p.logit_bias) {
      ids.push_back(id);
      values.push_back(bias);
    }
    c.logit_bias_count = static_cast<int32_t>(ids.size());
    c.logit_bias_ids = ids.empty() ? nullptr : ids.data();
    c.logit_bias_values = values.empty() ? nullptr : values.data();
  }
};

sg::Penalties StrongPenalties() {
  sg::Penalties p;
  p.repetition = 1.6f;
  p.presence = 0.5f;
  p.frequency = 0.7f;
  p.logit_bias = {{17, 2.5f}, {400, -100.0f}, {901, 1.25f}};
  return p;
}

// n ids of `slot` after a prefill_sampled (nullptr: the session's sampling); the slot is
// released after, so that it does not step along with later calls.
std::vector<int32_t> SampledIds(stepgraph_session* h, int64_t slot,
                                const std::vector<int32_t>& prompt, int32_t seed,
                                const stepgraph_sampling* sampling, int64_t n) {
  std::vector<int32_t> ids(static_cast<size_t>(n), -1);
  EXPECT_EQ(stepgraph_session_prefill_sampled(h, slot, prompt.data(),
                                              static_cast<int64_t>(prompt.size()), seed,
                                              sampling),
            STEPGRAPH_OK)
      << stepgraph_session_error(h);
  EXPECT_EQ(stepgraph_session_generate(h, slot, n, ids.data()), STEPGRAPH_OK)
      << stepgraph_session_error(h);
  EXPECT_EQ(stepgraph_session_release(h, slot), STEPGRAPH_OK);
  return ids;
}

// Greedy ids under per-call penalties are those of a C++ session given the same Penalties,
// next to a slot without them; and the penalties changed them.
TEST(CSessionTest, PerCallPenaltiesAreTheDecodeSessionsOnes) {
  Handle h = Create(CpuOptions(4321));
  ASSERT_NE(h, nullptr);
  sg::SessionOptions ref_opts;
  ref_opts.backend = sg::Backend::kCpu;
  ref_opts.max_slots = 2;
  ref_opts.max_seq = 32;
  ref_opts.weight_seed = 4321;
  ref_opts.penalties = true;
  auto ref = sg::DecodeSession::Create(ref_opts);
  ASSERT_TRUE(ref.ok()) << ref.status();

  const std::vector<int32_t> p0 = RandomIds(7, 1024, 21), p1 = RandomIds(4, 1024, 22);
  const sg::Penalties strong = StrongPenalties();
  const CallSampling call(strong);
  ASSERT_EQ(stepgraph_session_prefill_sampled(h.get(), 0, p0.data(), 7, 0, &call.c),
            STEPGRAPH_OK)
      << stepgraph_session_error(h.get());
  ASSERT_EQ(stepgraph_session_prefill_sampled(h.get(), 1, p1.data(), 4, 0, nullptr),
            STEPGRAPH_OK);
  const sg::PrefillRequest requests[] = {{0, p0, 0, sg::SlotSampling{std::nullopt, strong}},
                                         {1, p1, 0, std::nullopt}};
  ASSERT_TRUE((*ref)->Prefill(requests).ok());
  std::vector<int32_t> ids0(20, -1), ids1(20, -1);
  ASSERT_EQ(stepgraph_session_generate(h.get(), 0, 20, ids0.data()), STEPGRAPH_OK)
      << stepgraph_session_error(h.get());
  ASSERT_EQ(stepgraph_session_generate(h.get(), 1, 1, ids1.data()), STEPGRAPH_OK);
  auto want = (*ref)->Generate(20);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(ids0, (*want)[0]);
  // Slot 1 stepped along with slot 0: its 21st id is the reference's.
  auto tokens1 = (*ref)->Generate(1, 1);
  ASSERT_TRUE(tokens1.ok());
  EXPECT_EQ(ids1[0], (*tokens1)[0]);
  for (int32_t id : ids0) EXPECT_NE(id, 400) << "a -100 bias bans its id";

  // Without the penalties slot 0 says something else.
  ASSERT_EQ(stepgraph_session_release(h.get(), 1), STEPGRAPH_OK);
  EXPECT_NE(SampledIds(h.get(), 0, p0, 0, nullptr, 20), ids0);
}

// A +100 bias makes an id the choice of every greedy step.
TEST(CSessionTest, ALogitBiasForcesItsId) {
  Handle h = Create(CpuOptions(5));
  ASSERT_NE(h, nullptr);
  const std::vector<int32_t> prompt = RandomIds(5, 1024, 31);
  const std::vector<int32_t> plain = SampledIds(h.get(), 0, prompt, 0, nullptr, 8);
  const int32_t forced = plain[0] == 333 ? 334 : 333;
  sg::Penalties p;
  p.logit_bias = {{forced, 100.0f}};
  const CallSampling call(p);
  EXPECT_EQ(SampledIds(h.get(), 0, prompt, 0, &call.c, 8), std::vector<int32_t>(8, forced));
  // And of every draw at a high temperature.
  const CallSampling hot(p, sg::ops::Sample{2.0f, 0, 1.0f});
  EXPECT_EQ(SampledIds(h.get(), 0, prompt, 9, &hot.c, 8), std::vector<int32_t>(8, forced));
}

// A call that samples on a greedy session draws what a session whose steps sample so
// draws (chosen on the host against chosen in the step), penalties and min-p included;
// a call that is greedy on a sampling session decodes as a greedy session does.
TEST(CSessionTest, PerCallSamplingIsASessionThatSamplesSo) {
  const sg::ops::Sample warm{1.7f, 40, 0.95f};
  stepgraph_session_options sampled_opts = CpuOptions(77);
  sampled_opts.sampling = STEPGRAPH_SAMPLING_SAMPLE;
  sampled_opts.temperature = warm.temperature;
  sampled_opts.top_k = warm.top_k;
  sampled_opts.top_p = warm.top_p;
  Handle greedy = Create(CpuOptions(77));
  Handle sampled = Create(sampled_opts);
  ASSERT_NE(greedy, nullptr);
  ASSERT_NE(sampled, nullptr);
  const std::vector<int32_t> prompt = RandomIds(6, 1024, 41);

  const sg::Penalties neutral;
  const CallSampling draw(neutral, warm);
  const std::vector<int32_t> want = SampledIds(sampled.get(), 0, prompt, 13, nullptr, 16);
  EXPECT_EQ(SampledIds(greedy.get(), 0, prompt, 13, &draw.c, 16), want);
  EXPECT_NE(SampledIds(greedy.get(), 0, prompt, 13, nullptr, 16), want) << "it drew greedily";

  sg::Penalties penalised = StrongPenalties();
  penalised.min_p = 0.05f;
  const CallSampling both(penalised, warm);
  const std::vector<int32_t> on_device = SampledIds(sampled.get(), 1, prompt, 13, &both.c, 16);
  EXPECT_EQ(SampledIds(greedy.get(), 1, prompt, 13, &both.c, 16), on_device);
  EXPECT_NE(on_device, want) << "the penalties changed nothing";

  const CallSampling argmax(neutral);
  EXPECT_EQ(SampledIds(sampled.get(), 0, prompt, 13, &argmax.c, 16),
            SampledIds(greedy.get(), 0, prompt, 13, nullptr, 16));

  // Two calls on one session at two temperatures draw differently.
  const CallSampling cold(neutral, sg::ops::Sample{0.3f, 0, 1.0f});
  const CallSampling hot(neutral, sg::ops::Sample{8.0f, 0, 1.0f});
  EXPECT_NE(SampledIds(greedy.get(), 0, prompt, 5, &cold.c, 16),
            SampledIds(greedy.get(), 0, prompt, 5, &hot.c, 16));
}

// Each bad field is STEPGRAPH_ERROR_INVALID_VALUE naming it; counts are bounded before an
// array is read; the handle stays usable.
TEST(CSessionTest, BadSamplingFieldsAreRefusedByName) {
  Handle h = Create(CpuOptions(8));
  ASSERT_NE(h, nullptr);
  stepgraph_session_info info{};
  ASSERT_EQ(stepgraph_session_get_info(h.get(), &info), STEPGRAPH_OK);
  const std::vector<int32_t> prompt = RandomIds(3, info.vocab_size, 51);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const int32_t vocab = static_cast<int32_t>(info.vocab_size);
  int32_t one_id[1] = {5};
  float one_value[1] = {1.0f};
  int32_t twice[2] = {9, 9};
  float two_values[2] = {1.0f, 2.0f};

  auto expect_refused = [&](const stepgraph_sampling& c, const std::string& field,
                            const std::string& what) {
    EXPECT_EQ(stepgraph_session_prefill_sampled(h.get(), 0, prompt.data(), 3, 0, &c),
              STEPGRAPH_ERROR_INVALID_VALUE)
        << what;
    const std::string message = stepgraph_session_error(h.get());
    EXPECT_NE(message.find("sampling." + field), std::string::npos) << what << ": " << message;
  };
  stepgraph_sampling base;
  ASSERT_EQ(stepgraph_sampling_init(&base), STEPGRAPH_OK);
  const std::vector<std::pair<std::string, std::vector<float>>> floats = {
      {"temperature", {0.0f, -1.0f, nan, inf}},
      {"top_p", {0.0f, -0.5f, 1.5f, nan}},
      {"repetition_penalty", {0.0f, -1.0f, nan, inf}},
      {"presence_penalty", {2.5f, -2.5f, nan, inf}},
      {"frequency_penalty", {2.5f, -2.5f, nan, -inf}},
      {"min_p", {-0.1f, 1.1f, nan}}};
  for (const auto& [field, values] : floats) {
    for (float v : values) {
      stepgraph_sampling c = base;
      float* target = field == "temperature"          ? &c.temperature
                      : field == "top_p"              ? &c.top_p
                      : field == "repetition_penalty" ? &c.repetition_penalty
                      : field == "presence_penalty"   ? &c.presence_penalty
                      : field == "frequency_penalty"  ? &c.frequency_penalty
                                                      : &c.min_p;
      *target = v;
      // Checked in greedy mode too: a bad value is a bug whatever the mode.
      expect_refused(c, field, field + " = " + std::to_string(v));
      c.mode = STEPGRAPH_SAMPLING_SAMPLE;
      expect_refused(c, field, field + " = " + std::to_string(v) + ", sampling");
    }
  }
  stepgraph_sampling c = base;
  c.struct_size = 8;
  expect_refused(c, "struct_size", "struct_size");
  c = base;
  c.mode = 2;
  expect_refused(c, "mode", "mode 2");
  c = base;
  c.top_k = -1;
  expect_refused(c, "top_k", "top_k -1");
  for (int32_t count : {-1, STEPGRAPH_SAMPLING_MAX_LOGIT_BIAS + 1, 1 << 30}) {
    c = base;
    c.logit_bias_count = count;
    c.logit_bias_ids = one_id;  // one entry: a count above it must not be read
    c.logit_bias_values = one_value;
    expect_refused(c, "logit_bias_count", "count " + std::to_string(count));
  }
  c = base;
  c.logit_bias_count = 1;
  c.logit_bias_values = one_value;
  expect_refused(c, "logit_bias_ids", "NULL ids");
  c = base;
  c.logit_bias_count = 1;
  c.logit_bias_ids = one_id;
  expect_refused(c, "logit_bias_values", "NULL values");
  for (int32_t id : {-1, vocab, std::numeric_limits<int32_t>::max()}) {
    int32_t ids[1] = {id};
    c = base;
    c.logit_bias_count = 1;
    c.logit_bias_ids = ids;
    c.logit_bias_values = one_value;
    expect_refused(c, "logit_bias_ids[0]", "id " + std::to_string(id));
  }
  for (float v : {100.5f, -101.0f, nan, inf}) {
    float values[2] = {1.0f, v};
    int32_t ids[2] = {3, 4};
    c = base;
    c.logit_bias_count = 2;
    c.logit_bias_ids = ids;
    c.logit_bias_values = values;
    expect_refused(c, "logit_bias_values[1]", "bias " + std::to_string(v));
  }
  c = base;
  c.logit_bias_count = 2;
  c.logit_bias_ids = twice;
  c.logit_bias_values = two_values;
  expect_refused(c, "logit_bias_ids", "an id twice");

  // The edges are taken, and a success clears the message.
  c = base;
  c.mode = STEPGRAPH_SAMPLING_SAMPLE;
  c.top_p = 1.0f;
  c.repetition_penalty = 0.01f;
  c.presence_penalty = -2.0f;
  c.frequency_penalty = 2.0f;
  c.min_p = 1.0f;
  int32_t edge_ids[2] = {0, vocab - 1};
  float edge_values[2] = {-100.0f, 100.0f};
  c.logit_bias_count = 2;
  c.logit_bias_ids = edge_ids;
  c.logit_bias_values = edge_values;
  ASSERT_EQ(stepgraph_session_prefill_sampled(h.get(), 0, prompt.data(), 3, 0, &c), STEPGRAPH_OK)
      << stepgraph_session_error(h.get());
  EXPECT_STREQ(stepgraph_session_error(h.get()), "");
  // The prompt's own checks still apply, under the new function's name.
  EXPECT_EQ(stepgraph_session_prefill_sampled(h.get(), 0, nullptr, 3, 0, &base),
            STEPGRAPH_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(stepgraph_session_error(h.get())).find("prefill_sampled"),
            std::string::npos);
  EXPECT_EQ(stepgraph_session_prefill_sampled(nullptr, 0, prompt.data(), 3, 0, &base),
            STEPGRAPH_ERROR_INVALID_VALUE);
}

}  // namespace
