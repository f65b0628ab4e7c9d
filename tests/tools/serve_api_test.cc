// `stepgraph serve`'s pieces without HTTP or a model: stop strings matched on text that
// comes in random pieces send exactly the text before the first stop string and nothing
// of it; the API key comparison; the error and response objects' shapes; the penalty
// fields of a request (with a small tokenizer of its own). The other request fields are
// checked end to end (tests/tools/serve_test.py's table).
#include "tools/serve_api.h"

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace sg::cli {
namespace {

// The text before the stop string that completes first (of those completing at the same
// character, the longest), read one character at a time; and whether one came.
std::pair<std::string, bool> Expected(const std::string& text,
                                      const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t start = std::string::npos;
    for (const std::string& s : stops) {
      if (s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0) {
        start = std::min(start, end - s.size());
      }
    }
    if (start != std::string::npos) return {text.substr(0, start), true};
  }
  return {text, false};
}

TEST(StopMatcherTest, RandomPiecesSendExactlyTheTextBeforeTheFirstStop) {
  std::mt19937 rng(29);
  const std::string alphabet = "ab c";
  auto random_string = [&](int lo, int hi) {
    std::string s(std::uniform_int_distribution<int>(lo, hi)(rng), ' ');
    for (char& c : s) c = alphabet[std::uniform_int_distribution<size_t>(0, 3)(rng)];
    return s;
  };
  int stopped_cases = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const std::string text = random_string(0, 40);
    std::vector<std::string> stops;
    for (int k = std::uniform_int_distribution<int>(1, 4)(rng); k > 0; --k) {
      stops.push_back(random_string(1, 5));
    }
    const auto [want, stops_at_all] = Expected(text, stops);
    StopMatcher m(stops);
    std::string sent;
    for (size_t at = 0; at < text.size();) {
      const size_t n = std::uniform_int_distribution<size_t>(1, 6)(rng);
      sent += m.Push(absl::string_view(text).substr(at, n));
      at += n;
      // Nothing sent is ever past the text that may be sent.
      ASSERT_EQ(want.compare(0, sent.size(), sent), 0)
          << "sent '" << sent << "' of '" << text << "', want '" << want << "', stops '"
          << absl::StrJoin(stops, "' '") << "'";
    }
    if (!m.stopped()) sent += m.Finish();
    EXPECT_EQ(sent, want) << "text '" << text << "' stops '" << stops[0] << "'";
    EXPECT_EQ(m.stopped(), stops_at_all);
    stopped_cases += stops_at_all;
  }
  EXPECT_GT(stopped_cases, 500);  // both outcomes are exercised
}

TEST(StopMatcherTest, HoldsBackOnlyWhatCouldBeginAStop) {
  StopMatcher m({"<end>"});
  EXPECT_EQ(m.Push("Hello <e"), "Hello ");
  EXPECT_EQ(m.Push("x"), "<ex");  // "<ex" begins no stop string: it goes out
  EXPECT_EQ(m.Push("done <en"), "done ");
  EXPECT_EQ(m.Push("d>more"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.Push("after"), "");
  EXPECT_EQ(m.Finish(), "");
}

TEST(StopMatcherTest, TheStopThatCompletesFirstEndsTheText) {
  // "bcacc" began first but "c" completed first: a server cannot wait to see.
  StopMatcher m({"bcacc", "c"});
  EXPECT_EQ(m.Push("ab"), "a");
  EXPECT_EQ(m.Push("cacc"), "b");  // "ab" in all
  EXPECT_TRUE(m.stopped());
  StopMatcher together({"c", "abc"});
  EXPECT_EQ(together.Push("xabcd"), "x");  // both complete at 'c': the longer wins
}

TEST(StopMatcherTest, TheEndReleasesTheHeldText) {
  StopMatcher m({"ab"});
  EXPECT_EQ(m.Push("xa"), "x");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.Finish(), "a");
}

TEST(ServeApiTest, KeysMatchOnlyWhenEqual) {
  EXPECT_TRUE(KeyMatches("secret-key", "secret-key"));
  EXPECT_FALSE(KeyMatches("secret-kez", "secret-key"));
  EXPECT_FALSE(KeyMatches("secret-ke", "secret-key"));
  EXPECT_FALSE(KeyMatches("secret-keyy", "secret-key"));
  EXPECT_FALSE(KeyMatches("", "secret-key"));
}

TEST(ServeApiTest, ErrorsAndResponsesHaveOpenAIsShape) {
  const nlohmann::json e = nlohmann::json::parse(ErrorJson({400, "bad 'n'", "n"}));
  EXPECT_EQ(e["error"]["message"], "bad 'n'");
  EXPECT_EQ(e["error"]["param"], "n");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(e["error"]["code"].is_null());
  EXPECT_TRUE(nlohmann::json::parse(ErrorJson({401, "no key"}))["error"]["param"].is_null());

  const ResponseHead chat{Endpoint::kChat, "chatcmpl-1", 7, "m"};
  const nlohmann::json whole = CompletionJson(chat, "Paris.", "stop", {12, 3});
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "Paris.");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(whole["usage"]["total_tokens"], 15);
  const nlohmann::json first = ChunkJson(chat, "", true, "", true);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["usage"].is_null());
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  const nlohmann::json last = ChunkJson(chat, "", false, "length", false);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(last.contains("usage"));
  EXPECT_FALSE(last["choices"][0]["delta"].contains("content"));
  const nlohmann::json usage = UsageChunkJson(chat, {5, 2});
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 2);

  const ResponseHead text{Endpoint::kCompletions, "cmpl-2", 7, "m"};
  EXPECT_EQ(CompletionJson(text, "x", "length", {1, 1})["object"], "text_completion");
  EXPECT_EQ(ChunkJson(text, "y", false, "", false)["choices"][0]["text"], "y");
}

// A model of 1000 ids whose tokenizer holds ChatML's two special tokens and one token per
// printable ASCII character (byte-level: space and newline as GPT-2 writes them), so that
// both endpoints render and encode their prompts.
class PenaltyFieldsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TokenizerSpec spec;
    spec.model = "gpt2";
    spec.pre = "default";
    spec.tokens = {"<|im_start|>", "<|im_end|>", "\u0120", "\u010a"};  // Ġ (space), Ċ (\n)
    for (char ch = 33; ch < 127; ++ch) spec.tokens.push_back(std::string(1, ch));
    spec.tokens.push_back("aa");
    spec.merges = {"a a"};
    spec.token_types.assign(spec.tokens.size(), 1);
    spec.token_types[0] = spec.token_types[1] = 3;
    spec.eos_id = 1;
    spec.chat_template =
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::Create(spec);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
    absl::StatusOr<Conversation> conv = Conversation::ForTokenizer(*tokenizer_, std::nullopt);
    ASSERT_TRUE(conv.ok()) << conv.status();
    conversation_ = *std::move(conv);
    model_.tokenizer = tokenizer_.get();
    model_.conversation = &*conversation_;
    model_.name = "m";
    model_.vocab_size = 1000;
    limits_.max_prompt_tokens = 64;
    limits_.max_tokens = 16;
    limits_.max_seq = 128;
  }

  // `fields` (a JSON object's members, "" for none) with the endpoint's prompt.
  std::variant<CompletionRequest, ApiError> Parse(Endpoint e, const std::string& fields) {
    const std::string prompt = e == Endpoint::kChat
                                   ? R"("messages": [{"role": "user", "content": "Hi"}])"
                                   : R"("prompt": [5, 6, 7])";
    const std::string body = absl::StrCat("{", prompt, fields.empty() ? "" : ", ", fields, "}");
    return ParseCompletionRequest(e, body, model_, limits_);
  }
  Penalties Accepted(Endpoint e, const std::string& fields) {
    auto r = Parse(e, fields);
    if (const ApiError* err = std::get_if<ApiError>(&r)) {
      ADD_FAILURE() << fields << ": " << err->message;
      return {};
    }
    return std::get<CompletionRequest>(r).sampling.penalties;
  }
  void ExpectRefused(const std::string& fields, const std::string& param,
                     const std::string& says) {
    for (const Endpoint e : {Endpoint::kChat, Endpoint::kCompletions}) {
      SCOPED_TRACE(fields);
      auto r = Parse(e, fields);
      const ApiError* err = std::get_if<ApiError>(&r);
      ASSERT_NE(err, nullptr) << "accepted";
      EXPECT_EQ(err->status, 400);
      EXPECT_EQ(err->param, param);
      EXPECT_TRUE(absl::StrContains(err->message, says)) << err->message;
    }
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<Conversation> conversation_;
  ServeModel model_;
  RequestLimits limits_;
};

TEST_F(PenaltyFieldsTest, AcceptedValuesReachTheRequestOnBothEndpoints) {
  for (const Endpoint e : {Endpoint::kChat, Endpoint::kCompletions}) {
    EXPECT_TRUE(Accepted(e, "").neutral()) << "no field, no penalty";
    const Penalties p = Accepted(
        e, R"("presence_penalty": 0.5, "frequency_penalty": -1.25, "repetition_penalty": 1.3,
              "min_p": 0.1, "logit_bias": {"17": 100, "999": -100, "0": 2.5})");
    EXPECT_FLOAT_EQ(p.presence, 0.5f);
    EXPECT_FLOAT_EQ(p.frequency, -1.25f);
    EXPECT_FLOAT_EQ(p.repetition, 1.3f);
    EXPECT_FLOAT_EQ(p.min_p, 0.1f);
    std::vector<std::pair<int32_t, float>> bias = p.logit_bias;
    std::sort(bias.begin(), bias.end());
    EXPECT_EQ(bias, (std::vector<std::pair<int32_t, float>>{{0, 2.5f}, {17, 100.0f},
                                                            {999, -100.0f}}));
    // The bounds themselves, and null or an empty object: nothing.
    const Penalties edges = Accepted(
        e, R"("presence_penalty": -2, "frequency_penalty": 2, "min_p": 1, "logit_bias": {})");
    EXPECT_FLOAT_EQ(edges.presence, -2.0f);
    EXPECT_FLOAT_EQ(edges.frequency, 2.0f);
    EXPECT_FLOAT_EQ(edges.min_p, 1.0f);
    EXPECT_TRUE(edges.logit_bias.empty());
    EXPECT_TRUE(Accepted(e, R"("presence_penalty": null, "logit_bias": null)").neutral());
  }
  // As many biases as the device takes.
  std::string many;
  for (int i = 0; i < ops::kMaxLogitBias; ++i) {
    absl::StrAppend(&many, i > 0 ? ", " : "", "\"", i * 7, "\": ", i - 30);
  }
  EXPECT_EQ(Accepted(Endpoint::kCompletions, "\"logit_bias\": {" + many + "}").logit_bias.size(),
            static_cast<size_t>(ops::kMaxLogitBias));
}

TEST_F(PenaltyFieldsTest, TheServersDefaultsHoldWhereARequestGivesNone) {
  limits_.penalties.presence = 0.75f;
  limits_.penalties.repetition = 1.1f;
  limits_.penalties.logit_bias = {{4, 3.0f}};
  const Penalties defaults = Accepted(Endpoint::kChat, "");
  EXPECT_FLOAT_EQ(defaults.presence, 0.75f);
  EXPECT_FLOAT_EQ(defaults.repetition, 1.1f);
  EXPECT_EQ(defaults.logit_bias, (std::vector<std::pair<int32_t, float>>{{4, 3.0f}}));
  const Penalties own =
      Accepted(Endpoint::kChat, R"("presence_penalty": 0, "logit_bias": {"9": -1})");
  EXPECT_FLOAT_EQ(own.presence, 0.0f);
  EXPECT_FLOAT_EQ(own.repetition, 1.1f) << "a field not given keeps the server's";
  EXPECT_EQ(own.logit_bias, (std::vector<std::pair<int32_t, float>>{{9, -1.0f}}));
}

TEST_F(PenaltyFieldsTest, BadValuesAreRefusedNamingTheField) {
  ExpectRefused(R"("presence_penalty": 2.01)", "presence_penalty",
                "'presence_penalty' must be in [-2, 2], got 2.01");
  ExpectRefused(R"("presence_penalty": -3)", "presence_penalty", "[-2, 2]");
  ExpectRefused(R"("presence_penalty": "0.5")", "presence_penalty", "must be a number");
  ExpectRefused(R"("frequency_penalty": 2.5)", "frequency_penalty",
                "'frequency_penalty' must be in [-2, 2]");
  ExpectRefused(R"("frequency_penalty": true)", "frequency_penalty", "must be a number");
  ExpectRefused(R"("repetition_penalty": 0)", "repetition_penalty",
                "'repetition_penalty' must be in (0,");
  ExpectRefused(R"("repetition_penalty": -1)", "repetition_penalty", "(0,");
  ExpectRefused(R"("repetition_penalty": 1e300)", "repetition_penalty", "got 1e+300");
  ExpectRefused(R"("min_p": 1.5)", "min_p", "'min_p' must be in [0, 1]");
  ExpectRefused(R"("min_p": -0.1)", "min_p", "[0, 1]");
  ExpectRefused(R"("logit_bias": [1, 2])", "logit_bias", "must be an object");
  ExpectRefused(R"("logit_bias": "x")", "logit_bias", "must be an object");
  ExpectRefused(R"("logit_bias": {"abc": 1})", "logit_bias",
                "'logit_bias' keys must be token ids in [0, 1000), got 'abc'");
  ExpectRefused(R"("logit_bias": {"-1": 1})", "logit_bias", "got '-1'");
  ExpectRefused(R"("logit_bias": {" 5": 1})", "logit_bias", "got ' 5'");
  ExpectRefused(R"("logit_bias": {"1000": 1})", "logit_bias", "[0, 1000), got '1000'");
  ExpectRefused(R"("logit_bias": {"99999999999": 1})", "logit_bias", "got '99999999999'");
  ExpectRefused(R"("logit_bias": {"5": 100.5})", "logit_bias",
                "'logit_bias' values must be in [-100, 100], got 100.5 (token 5)");
  ExpectRefused(R"("logit_bias": {"5": -101})", "logit_bias", "[-100, 100]");
  ExpectRefused(R"("logit_bias": {"5": "1"})", "logit_bias", "must be numbers, not a string");
  ExpectRefused(R"("logit_bias": {"5": null})", "logit_bias", "not null");
  ExpectRefused(R"("logit_bias": {"5": 1, "05": 2})", "logit_bias", "names token 5 twice");
  std::string many;
  for (int i = 0; i <= ops::kMaxLogitBias; ++i) {
    absl::StrAppend(&many, i > 0 ? ", " : "", "\"", i, "\": 1");
  }
  ExpectRefused("\"logit_bias\": {" + many + "}", "logit_bias",
                "'logit_bias' holds at most 64 token ids, got 65");
}

}  // namespace
}  // namespace sg::cli
