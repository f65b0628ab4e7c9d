// Chat templates rendered for one user turn, against transformers' apply_chat_template on
// the same template strings (tests/fixtures/tokenizer/chat/, made by
// make_tokenizer_fixtures.py), and the refusal of templates outside the known families.
#include "stepgraph/text/chat_template.h"

#include <cctype>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace sg {
namespace {

using Json = nlohmann::json;

const std::string kChatDir = std::string(SG_FIXTURES_DIR) + "/tokenizer/chat";

std::string ReadText(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(ChatTemplate, RendersLikeTransformers) {
  const Json expected = Json::parse(ReadText(kChatDir + "/expected.json"));
  const std::map<std::string, std::pair<ChatFamily, std::string>> families = {
      {"smollm2", {ChatFamily::kChatMl, "<|im_end|>"}},
      {"qwen2", {ChatFamily::kChatMl, "<|im_end|>"}},
      {"chatml_plain", {ChatFamily::kChatMl, "<|im_end|>"}},
      {"llama3", {ChatFamily::kLlama3, "<|eot_id|>"}},
      {"llama2", {ChatFamily::kInst, "</s>"}},
      {"mistral", {ChatFamily::kInst, "</s>"}},
      {"mistral_v3", {ChatFamily::kInst, "</s>"}},
      {"llama31", {ChatFamily::kLlama3, "<|eot_id|>"}},
      {"llama32", {ChatFamily::kLlama3, "<|eot_id|>"}},
  };
  ASSERT_EQ(expected.size(), families.size());
  for (const auto& [name, want] : families) {
    SCOPED_TRACE(name);
    const Json& e = expected.at(name);
    auto ct = ChatTemplate::Create(ReadText(kChatDir + "/" + name + ".jinja"),
                                   e.at("bos_token").get<std::string>(),
                                   e.at("eos_token").get<std::string>());
    ASSERT_TRUE(ct.ok()) << ct.status();
    EXPECT_EQ(ct->family(), want.first);
    EXPECT_EQ(ct->end_of_turn(), want.second);
    // Templates reading the clock have no fixed rendering without a date.
    EXPECT_EQ(e.at("cases").empty(), e.at("uses_clock").get<bool>());
    for (const Json& c : e.at("cases")) {
      EXPECT_EQ(ct->RenderUserTurn(c.at("user").get<std::string>()), c.at("text").get<std::string>());
    }
    // The same with the date given, as apply_chat_template(..., date_string=...) renders.
    auto dated = ChatTemplate::Create(ReadText(kChatDir + "/" + name + ".jinja"),
                                      e.at("bos_token").get<std::string>(),
                                      e.at("eos_token").get<std::string>(),
                                      e.at("date_string").get<std::string>());
    ASSERT_TRUE(dated.ok()) << dated.status();
    ASSERT_EQ(e.at("dated_cases").size(), e.at("cases").empty() ? 5u : e.at("cases").size());
    size_t i = 0;
    for (const Json& c : e.at("dated_cases")) {
      EXPECT_EQ(dated->RenderUserTurn(c.at("user").get<std::string>()), c.at("text").get<std::string>())
          << "dated case " << i++;
    }
  }
}

TEST(ChatTemplate, ClockTemplatesWriteTodaysDate) {
  auto ct = ChatTemplate::Create(ReadText(kChatDir + "/llama32.jinja"), "<|begin_of_text|>", "<|eot_id|>");
  ASSERT_TRUE(ct.ok()) << ct.status();
  const std::string text = ct->RenderUserTurn("hi");
  const size_t at = text.find("Today Date: ");
  ASSERT_NE(at, std::string::npos) << text;
  // "%d %b %Y": two digits, a space, three letters, a space, four digits.
  const std::string date = text.substr(at + 12, 11);
  EXPECT_TRUE(std::isdigit(date[0]) && std::isdigit(date[1]) && date[2] == ' ' && std::isupper(date[3]) &&
              std::islower(date[4]) && date[6] == ' ' && std::isdigit(date[7]) && std::isdigit(date[10]))
      << date;
  EXPECT_EQ(text.find("26 Jul 2024"), std::string::npos);
}

TEST(ChatTemplate, SmolLM2InsertsItsDefaultSystemPrompt) {
  auto ct = ChatTemplate::Create(ReadText(kChatDir + "/smollm2.jinja"), "<|im_start|>", "<|im_end|>");
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(ct->RenderUserTurn("Hi"),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, RefusesUnknownFamilies) {
  for (const char* name : {"refused_gemma", "refused_phi3"}) {
    auto ct = ChatTemplate::Create(ReadText(kChatDir + "/" + name + ".jinja"), "<s>", "</s>");
    ASSERT_FALSE(ct.ok()) << name;
    EXPECT_EQ(ct.status().code(), absl::StatusCode::kInvalidArgument);
  }
  auto gemma = ChatTemplate::Create(ReadText(kChatDir + "/refused_gemma.jinja"), "<s>", "</s>");
  EXPECT_NE(gemma.status().message().find("not recognised"), std::string::npos) << gemma.status();
  EXPECT_FALSE(ChatTemplate::Create("", "<s>", "</s>").ok());
  EXPECT_FALSE(ChatTemplate::Create("{{ '<|im_start|>", "", "").ok());  // unclosed literal
  EXPECT_FALSE(ChatTemplate::Create("{% for m in messages %}", "", "").ok());
}

// A Llama 3.1-style template is rendered only when its system turn has the known layout and
// a date can be known; otherwise it is refused rather than rendered differently.
TEST(ChatTemplate, RefusesDatedSystemTurnsItCannotRender) {
  const std::string llama31 = ReadText(kChatDir + "/llama31.jinja");
  std::string moved = llama31;
  const size_t at = moved.find(R"("Today Date: " + date_string + "\n\n")");
  ASSERT_NE(at, std::string::npos);
  moved.replace(at, 14, R"("Date today: ")");
  auto ct = ChatTemplate::Create(moved, "<|begin_of_text|>", "<|eot_id|>");
  ASSERT_FALSE(ct.ok());
  EXPECT_NE(ct.status().message().find("unknown layout"), std::string::npos) << ct.status();

  std::string undated = llama31;
  const size_t set = undated.find(R"(set date_string = "26 Jul 2024")");
  ASSERT_NE(set, std::string::npos);
  undated.replace(set, 31, "set date_string = none");
  ct = ChatTemplate::Create(undated, "<|begin_of_text|>", "<|eot_id|>");
  ASSERT_FALSE(ct.ok());
  EXPECT_NE(ct.status().message().find("none is known"), std::string::npos) << ct.status();
  // Given a date, the same template renders it.
  ct = ChatTemplate::Create(undated, "<|begin_of_text|>", "<|eot_id|>", "03 Mar 2031");
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_NE(ct->RenderUserTurn("hi").find("Today Date: 03 Mar 2031\n\n<|eot_id|>"), std::string::npos);
}

TEST(ChatTemplate, ForTokenizerUsesTheSpec) {
  TokenizerSpec spec;
  spec.model = "gpt2";
  spec.pre = "default";
  spec.tokens = {"<|im_start|>", "<|im_end|>", "a"};
  spec.token_types = {3, 3, 1};
  spec.merges = {};
  spec.bos_id = 0;
  spec.eos_id = 1;
  spec.merges = {};
  spec.chat_template = ReadText(kChatDir + "/chatml_plain.jinja");
  // A byte-level vocabulary needs merges; one that merges nothing is fine here.
  spec.tokens.push_back("aa");
  spec.token_types.push_back(1);
  spec.merges = {"a a"};
  auto tok = Tokenizer::Create(spec);
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto ct = ChatTemplate::ForTokenizer(**tok);
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(ct->RenderUserTurn("x"), "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
}

}  // namespace
}  // namespace sg
