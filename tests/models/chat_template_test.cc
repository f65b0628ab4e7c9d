// Chat templates rendered for one user turn, against transformers' apply_chat_template on
// the same template strings (tests/fixtures/tokenizer/chat/, made by
// make_tokenizer_fixtures.py), and the refusal of templates outside the known families.
#include "models/chat_template.h"

#include <fstream>
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
    for (const Json& c : e.at("cases")) {
      EXPECT_EQ(ct->RenderUserTurn(c.at("user").get<std::string>()), c.at("text").get<std::string>());
    }
  }
}

TEST(ChatTemplate, SmolLM2InsertsItsDefaultSystemPrompt) {
  auto ct = ChatTemplate::Create(ReadText(kChatDir + "/smollm2.jinja"), "<|im_start|>", "<|im_end|>");
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(ct->RenderUserTurn("Hi"),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, RefusesUnknownFamilies) {
  for (const char* name : {"refused_gemma", "refused_llama31"}) {
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
