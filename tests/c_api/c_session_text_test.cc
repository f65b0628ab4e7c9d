// The text functions of the session C ABI (stepgraph_session_encode / _decode / _stop_ids):
// their ids and text are those of the C++ Tokenizer and ChatTemplate that `stepgraph run`
// uses, and transformers' on the fixtures; every bad argument is a code with a message; a
// model without a tokenizer has its own code. The tokenizer cases run on a small model
// folder made here (a fixture model with a fixture tokenizer beside it), so they need no
// download; the real SmolLM2 file (tests/fixtures/fetch_smollm2.sh) adds its own cases and
// they skip without it.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "stepgraph/text/chat_template.h"
#include "models/model_tokenizer.h"
#include "stepgraph/text/tokenizer.h"
#include "nlohmann/json.hpp"
#include "stepgraph/c_api/c_session.h"
#include "tests/testing/json_file.h"
#include "tests/testing/util.h"

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const std::string kFixtures = SG_FIXTURES_DIR;

struct Destroy {
  void operator()(stepgraph_session* s) const { stepgraph_session_destroy(s); }
};
using Handle = std::unique_ptr<stepgraph_session, Destroy>;

using sg::testing::ReadJsonFile;

Handle Open(const char* path, int64_t max_seq = 64) {
  stepgraph_session_options o;
  EXPECT_EQ(stepgraph_session_options_init(&o), STEPGRAPH_OK);
  o.backend = STEPGRAPH_BACKEND_CPU;
  o.max_seq = max_seq;
  stepgraph_session* s = nullptr;
  const int32_t rc = stepgraph_session_create(path, &o, &s);
  EXPECT_EQ(rc, STEPGRAPH_OK) << (s ? stepgraph_session_error(s) : "no handle");
  if (rc != STEPGRAPH_OK) {
    stepgraph_session_destroy(s);
    return nullptr;
  }
  return Handle(s);
}

// Encodes through the C ABI, asking for the size first (the size-query convention).
std::vector<int32_t> Encode(stepgraph_session* s, const std::string& text, uint32_t flags = 0) {
  int64_t count = -1;
  EXPECT_EQ(stepgraph_session_encode(s, text.data(), static_cast<int64_t>(text.size()), flags,
                                     nullptr, 0, &count),
            STEPGRAPH_OK)
      << stepgraph_session_error(s);
  std::vector<int32_t> ids(static_cast<size_t>(count) + 1, -7);  // one poisoned spare
  int64_t written = -1;
  EXPECT_EQ(stepgraph_session_encode(s, text.data(), static_cast<int64_t>(text.size()), flags,
                                     ids.data(), static_cast<int64_t>(ids.size()), &written),
            STEPGRAPH_OK)
      << stepgraph_session_error(s);
  EXPECT_EQ(written, count);
  EXPECT_EQ(ids.back(), -7) << "wrote past *count";
  ids.resize(static_cast<size_t>(count));
  return ids;
}

std::string Decode(stepgraph_session* s, const std::vector<int32_t>& ids, uint32_t flags = 0) {
  int64_t length = -1;
  EXPECT_EQ(stepgraph_session_decode(s, ids.data(), static_cast<int64_t>(ids.size()), flags,
                                     nullptr, 0, &length),
            STEPGRAPH_OK)
      << stepgraph_session_error(s);
  std::string text(static_cast<size_t>(length) + 2, '#');  // NUL, then a poisoned spare
  int64_t written = -1;
  EXPECT_EQ(stepgraph_session_decode(s, ids.data(), static_cast<int64_t>(ids.size()), flags,
                                     text.data(), static_cast<int64_t>(text.size()), &written),
            STEPGRAPH_OK)
      << stepgraph_session_error(s);
  EXPECT_EQ(written, length);
  EXPECT_EQ(text[static_cast<size_t>(length)], '\0');
  EXPECT_EQ(text.back(), '#') << "wrote past the terminator";
  text.resize(static_cast<size_t>(length));
  return text;
}

std::vector<int32_t> StopIds(stepgraph_session* s, uint32_t flags) {
  int64_t count = -1;
  EXPECT_EQ(stepgraph_session_stop_ids(s, flags, nullptr, 0, &count), STEPGRAPH_OK)
      << stepgraph_session_error(s);
  std::vector<int32_t> ids(static_cast<size_t>(count));
  EXPECT_EQ(stepgraph_session_stop_ids(s, flags, ids.data(), count, &count), STEPGRAPH_OK)
      << stepgraph_session_error(s);
  return ids;
}

// A model folder with a tokenizer: the f32_gqa fixture model (vocabulary 256) and the
// bl_smollm fixture tokenizer (a byte-level BPE of 700 tokens trained like SmolLM's, ChatML
// specials at 0..2) with SmolLM2's chat template beside it.
class TextFolder : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "/sg_c_session_text_" +
                           std::to_string(::getpid()));
    fs::create_directories(*dir_);
    const auto copy = [](const std::string& from, const std::string& to) {
      fs::copy_file(kFixtures + "/" + from, *dir_ + "/" + to,
                    fs::copy_options::overwrite_existing);
    };
    for (const char* f : {"config.json", "generation_config.json", "model.safetensors"}) {
      copy(std::string("f32_gqa/") + f, f);
    }
    copy("tokenizer/bl_smollm/tokenizer.json", "tokenizer.json");
    copy("tokenizer/bl_smollm/tokenizer_config.json", "tokenizer_config.json");
    copy("tokenizer/chat/smollm2.jinja", "chat_template.jinja");
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
    dir_ = nullptr;
  }
  static std::string* dir_;
};
std::string* TextFolder::dir_ = nullptr;

TEST_F(TextFolder, EncodeAndDecodeAreTheTokenizersAndTransformers) {
  Handle h = Open(dir_->c_str());
  ASSERT_NE(h, nullptr);
  const std::vector<std::string> corpus = ReadJsonFile(kFixtures + "/tokenizer/corpus.json");
  const Json expected = ReadJsonFile(kFixtures + "/tokenizer/bl_smollm/expected.json");
  auto tok = sg::Tokenizer::FromTokenizerJson(*dir_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  ASSERT_EQ(corpus.size(), expected.at("ids").size());
  int round_trips = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::vector<int32_t> ids = Encode(h.get(), corpus[i]);
    EXPECT_EQ(ids, expected.at("ids")[i].get<std::vector<int32_t>>()) << "#" << i;
    const std::string key = std::to_string(i);
    const std::string text = Decode(h.get(), ids);
    const Json& different = expected.at("decoded_where_different");
    EXPECT_EQ(text, different.contains(key) ? different[key].get<std::string>() : corpus[i])
        << "#" << i;
    const std::string skipped = Decode(h.get(), ids, STEPGRAPH_TEXT_SKIP_SPECIAL);
    auto want = (*tok)->Decode(ids, {.skip_special = true});
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(skipped, *want) << "#" << i;
    round_trips += text == corpus[i];
  }
  EXPECT_GE(round_trips, 300);
  EXPECT_STREQ(stepgraph_session_error(h.get()), "");

  // The flags reach the tokenizer: a special token in the text is one id, or text.
  const std::vector<int32_t> parsed = Encode(h.get(), "a<|im_end|>b");
  const std::vector<int32_t> literal =
      Encode(h.get(), "a<|im_end|>b", STEPGRAPH_TEXT_LITERAL_SPECIAL);
  EXPECT_EQ(parsed, *(*tok)->Encode("a<|im_end|>b"));
  EXPECT_EQ(literal, *(*tok)->Encode("a<|im_end|>b", {.parse_special = false}));
  EXPECT_NE(parsed, literal);
  EXPECT_EQ(Encode(h.get(), "Hello", STEPGRAPH_TEXT_NO_ADD_SPECIAL),
            *(*tok)->Encode("Hello", {.add_special = false}));
  // A NUL byte inside the text is text.
  const std::string with_nul("a\0b", 3);
  EXPECT_EQ(Decode(h.get(), Encode(h.get(), with_nul)), with_nul);
}

TEST_F(TextFolder, ChatTurnIsTheTemplatesAndStopsAtItsEndOfTurn) {
  Handle h = Open(dir_->c_str());
  ASSERT_NE(h, nullptr);
  auto tok = sg::LoadModelTokenizer(*dir_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto chat = sg::ChatTemplate::ForTokenizer(**tok);
  ASSERT_TRUE(chat.ok()) << chat.status();
  const Json cases =
      ReadJsonFile(kFixtures + "/tokenizer/chat/expected.json").at("smollm2").at("cases");
  ASSERT_FALSE(cases.empty());
  for (const Json& c : cases) {
    const std::string user = c.at("user");
    const std::vector<int32_t> ids = Encode(h.get(), user, STEPGRAPH_TEXT_CHAT);
    // `stepgraph run --chat`'s ids, and transformers' rendering of the turn.
    EXPECT_EQ(ids, *(*tok)->Encode(chat->RenderUserTurn(user), {.add_special = false})) << user;
    EXPECT_EQ(Decode(h.get(), ids), c.at("text").get<std::string>()) << user;
  }
  // f32_gqa's files state no eos; the template ends a turn at <|im_end|> (id 2).
  EXPECT_EQ(StopIds(h.get(), 0), std::vector<int32_t>{});
  EXPECT_EQ(StopIds(h.get(), STEPGRAPH_TEXT_CHAT), std::vector<int32_t>{2});
}

// encode_chat renders whole conversations as transformers' apply_chat_template does (the
// multi-turn cases of the template fixtures, generation prompt added), and refuses
// malformed message lists and what the template itself refuses, writing nothing.
TEST_F(TextFolder, ConversationsAreRenderedAsTransformersRendersThem) {
  Handle h = Open(dir_->c_str());
  ASSERT_NE(h, nullptr);
  stepgraph_session* s = h.get();
  const Json templates = ReadJsonFile(kFixtures + "/chat_templates/expected.json").at("templates");
  int checked = 0;
  for (const Json& c : templates.at("tokenizer/chat/smollm2.jinja").at("cases")) {
    if (!c.at("add_generation_prompt").get<bool>()) continue;
    const std::string json = c.at("messages").dump();
    int64_t count = -1;
    ASSERT_EQ(stepgraph_session_encode_chat(s, json.data(), static_cast<int64_t>(json.size()),
                                            nullptr, 0, &count),
              STEPGRAPH_OK)
        << stepgraph_session_error(s) << "\n" << json;
    std::vector<int32_t> ids(static_cast<size_t>(count) + 1, -7);  // one poisoned spare
    int64_t written = -1;
    ASSERT_EQ(stepgraph_session_encode_chat(s, json.data(), static_cast<int64_t>(json.size()),
                                            ids.data(), static_cast<int64_t>(ids.size()),
                                            &written),
              STEPGRAPH_OK);
    EXPECT_EQ(written, count);
    EXPECT_EQ(ids.back(), -7) << "wrote past *count";
    ids.resize(static_cast<size_t>(count));
    EXPECT_EQ(Decode(s, ids), c.at("text").get<std::string>()) << json;
    checked += c.at("messages").size() > 1;
  }
  EXPECT_GE(checked, 2) << "the fixture's conversations of several messages";
  // One user message is the STEPGRAPH_TEXT_CHAT turn.
  const std::string one = R"([{"role": "user", "content": "Hello there"}])";
  std::vector<int32_t> ids(256, -7);
  int64_t count = -1;
  ASSERT_EQ(stepgraph_session_encode_chat(s, one.data(), static_cast<int64_t>(one.size()),
                                          ids.data(), 256, &count),
            STEPGRAPH_OK);
  ids.resize(static_cast<size_t>(count));
  EXPECT_EQ(ids, Encode(s, "Hello there", STEPGRAPH_TEXT_CHAT));

  const std::pair<std::string, std::string> bad[] = {
      {"", "messages_json"},
      {"[]", "no messages"},
      {"{\"role\": \"user\"}", "array"},
      {"[1]", "messages[0] must be an object"},
      {R"([{"role": "user"}])", "messages[0].content must be a string (missing)"},
      {R"([{"role": "user", "content": 5}])", "messages[0].content must be a string, got 5"},
      {R"([{"role": 1, "content": "x"}])", "messages[0].role must be a string"},
      {R"([{"role": "user", "content": "x", "name": "a"}])", "\"name\" is not taken"},
      {R"([[[[{"role": "user"}]]]])", "deep"},
      {"[{\"role\": \"user\", \"content\": \"\xff\"}]", "messages_json"},
  };
  for (const auto& [json, says] : bad) {
    std::vector<int32_t> out(8, -7);
    count = -1;
    EXPECT_EQ(stepgraph_session_encode_chat(s, json.data(), static_cast<int64_t>(json.size()),
                                            out.data(), 8, &count),
              STEPGRAPH_ERROR_INVALID_VALUE)
        << json;
    EXPECT_NE(std::string(stepgraph_session_error(s)).find(says), std::string::npos)
        << json << " -> " << stepgraph_session_error(s);
    EXPECT_EQ(count, 0);
    EXPECT_EQ(out, std::vector<int32_t>(8, -7)) << json;
  }
  EXPECT_EQ(stepgraph_session_encode_chat(s, nullptr, 4, ids.data(), 8, &count),
            STEPGRAPH_ERROR_INVALID_VALUE);
  EXPECT_EQ(stepgraph_session_encode_chat(s, one.data(), -1, ids.data(), 8, &count),
            STEPGRAPH_ERROR_INVALID_VALUE);
  EXPECT_EQ(stepgraph_session_encode_chat(s, one.data(), static_cast<int64_t>(one.size()),
                                          ids.data(), 8, nullptr),
            STEPGRAPH_ERROR_INVALID_VALUE);
}

TEST_F(TextFolder, BadArgumentsAreCodesWithMessagesAndWriteNothing) {
  Handle h = Open(dir_->c_str());
  ASSERT_NE(h, nullptr);
  stepgraph_session* s = h.get();
  auto expect_invalid = [&](int32_t rc, const char* what) {
    EXPECT_EQ(rc, STEPGRAPH_ERROR_INVALID_VALUE) << what;
    EXPECT_STRNE(stepgraph_session_error(s), "") << what;
  };
  const std::string text = "Hello world, hello tokens";
  const int64_t n = static_cast<int64_t>(text.size());
  const std::vector<int32_t> want = Encode(s, text);
  ASSERT_GE(want.size(), 3u);
  std::vector<int32_t> ids(want.size(), -7);
  int64_t count = -1;

  // Too small a buffer: the size needed comes back, nothing is written.
  expect_invalid(stepgraph_session_encode(s, text.data(), n, 0, ids.data(),
                                          static_cast<int64_t>(want.size()) - 1, &count),
                 "capacity one short");
  EXPECT_EQ(count, static_cast<int64_t>(want.size()));
  EXPECT_EQ(ids, std::vector<int32_t>(want.size(), -7));
  EXPECT_NE(std::string(stepgraph_session_error(s)).find(std::to_string(want.size())),
            std::string::npos)
      << stepgraph_session_error(s);
  // Exactly enough works, and a success clears the message.
  ASSERT_EQ(stepgraph_session_encode(s, text.data(), n, 0, ids.data(),
                                     static_cast<int64_t>(ids.size()), &count),
            STEPGRAPH_OK);
  EXPECT_EQ(ids, want);
  EXPECT_STREQ(stepgraph_session_error(s), "");

  expect_invalid(stepgraph_session_encode(s, text.data(), n, 0, ids.data(), 8, nullptr),
                 "NULL count");
  expect_invalid(stepgraph_session_encode(s, nullptr, 4, 0, ids.data(), 8, &count),
                 "NULL text with bytes");
  expect_invalid(stepgraph_session_encode(s, text.data(), -1, 0, ids.data(), 8, &count),
                 "negative text_bytes");
  expect_invalid(stepgraph_session_encode(s, text.data(), STEPGRAPH_SESSION_MAX_TEXT_BYTES + 1,
                                          0, ids.data(), 8, &count),
                 "text_bytes over the limit");
  expect_invalid(stepgraph_session_encode(s, text.data(), n, 0, ids.data(), -1, &count),
                 "negative capacity");
  expect_invalid(stepgraph_session_encode(s, text.data(), n, 0, nullptr, 8, &count),
                 "NULL ids with capacity");
  expect_invalid(stepgraph_session_encode(s, text.data(), n, STEPGRAPH_TEXT_SKIP_SPECIAL,
                                          ids.data(), 8, &count),
                 "a decode flag on encode");
  expect_invalid(stepgraph_session_encode(s, text.data(), n, 0x100, ids.data(), 8, &count),
                 "an unknown flag");
  expect_invalid(stepgraph_session_encode(s, text.data(), n,
                                          STEPGRAPH_TEXT_CHAT | STEPGRAPH_TEXT_LITERAL_SPECIAL,
                                          ids.data(), 8, &count),
                 "chat with literal specials");
  for (const std::string& bad : {std::string("ab\xff"), std::string("\xe2\x82"),
                                 std::string("\xc0\xaf"), std::string("x\xed\xa0\x80y")}) {
    count = -1;
    expect_invalid(stepgraph_session_encode(s, bad.data(), static_cast<int64_t>(bad.size()), 0,
                                            ids.data(), 8, &count),
                   "invalid UTF-8");
    EXPECT_NE(std::string(stepgraph_session_error(s)).find("UTF-8"), std::string::npos);
    EXPECT_EQ(count, 0);
  }
  // The empty text, NULL or not.
  EXPECT_EQ(stepgraph_session_encode(s, nullptr, 0, 0, nullptr, 0, &count), STEPGRAPH_OK);
  EXPECT_EQ(count, 0);

  // Decode.
  const std::string decoded = Decode(s, want);
  ASSERT_EQ(decoded, text);
  std::string buf(decoded.size() + 1, '#');
  int64_t length = -1;
  expect_invalid(stepgraph_session_decode(s, want.data(), static_cast<int64_t>(want.size()), 0,
                                          buf.data(), static_cast<int64_t>(decoded.size()),
                                          &length),
                 "no room for the NUL");
  EXPECT_EQ(length, static_cast<int64_t>(decoded.size()));
  EXPECT_EQ(buf, std::string(decoded.size() + 1, '#'));
  expect_invalid(stepgraph_session_decode(s, want.data(), 3, 0, buf.data(), 8, nullptr),
                 "NULL length");
  expect_invalid(stepgraph_session_decode(s, nullptr, 3, 0, buf.data(), 8, &length),
                 "NULL ids with n");
  expect_invalid(stepgraph_session_decode(s, want.data(), -1, 0, buf.data(), 8, &length),
                 "negative n");
  expect_invalid(stepgraph_session_decode(s, want.data(), 3, STEPGRAPH_TEXT_CHAT, buf.data(), 8,
                                          &length),
                 "an encode flag on decode");
  expect_invalid(stepgraph_session_decode(s, want.data(), 3, 0, nullptr, 8, &length),
                 "NULL text with capacity");
  auto tok = sg::Tokenizer::FromTokenizerJson(*dir_);
  ASSERT_TRUE(tok.ok());
  for (int32_t bad_id : {(*tok)->vocab_size(), -1, INT32_MAX}) {
    const int32_t bad[3] = {want[0], bad_id, want[1]};
    expect_invalid(stepgraph_session_decode(s, bad, 3, 0, buf.data(),
                                            static_cast<int64_t>(buf.size()), &length),
                   "an id outside the vocabulary");
    EXPECT_NE(std::string(stepgraph_session_error(s)).find(std::to_string(bad_id)),
              std::string::npos)
        << stepgraph_session_error(s);
  }
  EXPECT_EQ(stepgraph_session_decode(s, nullptr, 0, 0, buf.data(), 1, &length), STEPGRAPH_OK);
  EXPECT_EQ(length, 0);
  EXPECT_EQ(buf[0], '\0');

  // Stop ids.
  int32_t stop[4] = {-7, -7, -7, -7};
  expect_invalid(stepgraph_session_stop_ids(s, STEPGRAPH_TEXT_CHAT, stop, 0, &count),
                 "stop ids: no room");
  EXPECT_EQ(count, 1);
  EXPECT_EQ(stop[0], -7);
  expect_invalid(stepgraph_session_stop_ids(s, 0, stop, 4, nullptr), "stop ids: NULL count");
  expect_invalid(stepgraph_session_stop_ids(s, STEPGRAPH_TEXT_SKIP_SPECIAL, stop, 4, &count),
                 "stop ids: a decode flag");

  // NULL handle.
  EXPECT_EQ(stepgraph_session_encode(nullptr, text.data(), n, 0, ids.data(), 8, &count),
            STEPGRAPH_ERROR_INVALID_VALUE);
  EXPECT_EQ(stepgraph_session_decode(nullptr, want.data(), 1, 0, buf.data(), 8, &length),
            STEPGRAPH_ERROR_INVALID_VALUE);
  EXPECT_EQ(stepgraph_session_stop_ids(nullptr, 0, stop, 4, &count),
            STEPGRAPH_ERROR_INVALID_VALUE);
}

TEST(CSessionTextTest, AModelWithoutATokenizerHasItsOwnCode) {
  const std::string ids_only = kFixtures + "/f32_gqa";  // config and weights, no tokenizer
  for (const char* path : {static_cast<const char*>(nullptr), ids_only.c_str()}) {
    Handle h = Open(path);
    ASSERT_NE(h, nullptr);
    stepgraph_session* s = h.get();
    const std::string where = path == nullptr ? "built-in" : "tokenizer.json";
    int32_t ids[8];
    int64_t count = -1;
    EXPECT_EQ(stepgraph_session_encode(s, "hi", 2, 0, ids, 8, &count),
              STEPGRAPH_ERROR_NO_TOKENIZER);
    EXPECT_NE(std::string(stepgraph_session_error(s)).find(where), std::string::npos)
        << stepgraph_session_error(s);
    EXPECT_EQ(count, 0);
    char text[8];
    int64_t length = -1;
    const int32_t one[1] = {1};
    EXPECT_EQ(stepgraph_session_decode(s, one, 1, 0, text, 8, &length),
              STEPGRAPH_ERROR_NO_TOKENIZER);
    EXPECT_STRNE(stepgraph_session_error(s), "");
    EXPECT_EQ(stepgraph_session_stop_ids(s, STEPGRAPH_TEXT_CHAT, ids, 8, &count),
              STEPGRAPH_ERROR_NO_TOKENIZER);
    // Arguments are checked first, as everywhere in the ABI.
    EXPECT_EQ(stepgraph_session_encode(s, "hi", 2, 0, ids, 8, nullptr),
              STEPGRAPH_ERROR_INVALID_VALUE);
    // Ids still run, and the stop ids the files state need no tokenizer.
    EXPECT_EQ(stepgraph_session_stop_ids(s, 0, ids, 8, &count), STEPGRAPH_OK);
    EXPECT_EQ(count, 0);
    const int32_t prompt[3] = {5, 6, 7};
    EXPECT_EQ(stepgraph_session_prefill(s, 0, prompt, 3, 0), STEPGRAPH_OK);
    EXPECT_EQ(stepgraph_session_generate(s, 0, 2, ids), STEPGRAPH_OK);
  }
}

// ---- the real SmolLM2-135M-Instruct (tests/fixtures/fetch_smollm2.sh) ------------------

std::string SmolLM2Path() {
  return sg::testing::TestCacheDir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

#define SKIP_WITHOUT_SMOLLM2()                                                           \
  if (!fs::is_regular_file(SmolLM2Path())) {                                             \
    GTEST_SKIP() << SmolLM2Path() << " is absent: run tests/fixtures/fetch_smollm2.sh"; \
  }

TEST(CSessionTextTest, SmolLM2TextIsTransformers) {
  SKIP_WITHOUT_SMOLLM2();
  Handle h = Open(SmolLM2Path().c_str());
  ASSERT_NE(h, nullptr);
  // The corpus, against transformers' tokenizer of the same file.
  const std::vector<std::string> corpus = ReadJsonFile(kFixtures + "/tokenizer/corpus.json");
  const Json expected = ReadJsonFile(kFixtures + "/tokenizer/smollm2.expected.json");
  for (size_t i = 0; i < corpus.size(); ++i) {
    EXPECT_EQ(Encode(h.get(), corpus[i]), expected.at("ids")[i].get<std::vector<int32_t>>())
        << "#" << i;
  }
  // The prompts of the generation fixture (one a chat turn), and the text of its greedy ids.
  const Json gen = ReadJsonFile(kFixtures + "/smollm2/expected.json");
  for (const Json& c : gen.at("cases")) {
    const bool chat = c.at("chat");
    EXPECT_EQ(Encode(h.get(), c.at("text"), chat ? STEPGRAPH_TEXT_CHAT : 0),
              c.at("prompt_ids").get<std::vector<int32_t>>());
    EXPECT_EQ(Decode(h.get(), c.at("generated"), STEPGRAPH_TEXT_SKIP_SPECIAL),
              c.at("generated_text").get<std::string>());
  }
  // The file's eos (<|im_end|>, 2), which is also the chat's end of turn.
  auto tok = sg::LoadModelTokenizer(SmolLM2Path());
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(StopIds(h.get(), 0), std::vector<int32_t>{(*tok)->TokenId("<|im_end|>")});
  EXPECT_EQ(StopIds(h.get(), STEPGRAPH_TEXT_CHAT), StopIds(h.get(), 0));
}

}  // namespace
