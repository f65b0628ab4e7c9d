// `stepgraph serve`'s pieces without HTTP or a model: stop strings matched on text that
// comes in random pieces send exactly the text before the first stop string and nothing
// of it; the API key comparison; the error and response objects' shapes. The requests
// themselves are checked end to end (tests/tools/serve_test.py's table).
#include "tools/serve_api.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

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

}  // namespace
}  // namespace sg::cli
