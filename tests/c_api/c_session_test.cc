// The session C ABI (include/stepgraph/c_api/c_session.h) on the built-in model and the CPU
// backend: its ids and logits are the C++ DecodeSession's, every bad argument or state is a
// code with a message on the handle, and a failed create leaves a handle holding the reason.
#include "stepgraph/c_api/c_session.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
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

}  // namespace
