// The chat's turns against transformers: for each chat template of the tokenizer fixtures,
// apply_chat_template of whole conversations (one, two and three user turns, with and
// without a system message; tests/tools/fixtures/conversations.json, made by
// make_chat_fixtures.py) must be the first turn as Conversation::Start renders it, then
// each answer as the template writes it (ending with the end of turn), then the next turn
// as Conversation::Next renders it. That is what a KV cache kept across turns holds.
#include "tools/conversation.h"

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace sg::cli {
namespace {

using Json = nlohmann::json;

Json Fixture() {
  std::ifstream f(std::string(SG_TOOLS_FIXTURES_DIR) + "/conversations.json");
  std::stringstream s;
  s << f.rdbuf();
  return Json::parse(s.str());
}

std::string Template(const std::string& name) {
  std::ifstream f(std::string(SG_FIXTURES_DIR) + "/tokenizer/chat/" + name + ".jinja");
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Templates whose system message cannot stay at the start of a kept conversation.
const std::set<std::string> kNoLastingSystem = {"mistral", "mistral_v3"};

TEST(ConversationTest, TurnsAddUpToTransformersConversations) {
  const Json fixture = Fixture();
  const std::string date = fixture.at("date_string");
  const Json& users = fixture.at("users");
  const Json& answers = fixture.at("answers");
  ASSERT_EQ(fixture.at("templates").size(), 9u);
  for (const auto& [name, t] : fixture.at("templates").items()) {
    for (const Json& c : t.at("cases")) {
      const std::optional<std::string> system =
          c.at("system").is_null() ? std::nullopt
                                   : std::optional<std::string>(c.at("system").get<std::string>());
      SCOPED_TRACE(name + (system.has_value() ? " with a system message" : ""));
      absl::StatusOr<Conversation> conv =
          Conversation::Create(Template(name), t.at("bos_token").get<std::string>(),
                               t.at("eos_token").get<std::string>(), system, date);
      if (system.has_value() && kNoLastingSystem.count(name) > 0) {
        ASSERT_FALSE(conv.ok());
        EXPECT_TRUE(absl::StrContains(conv.status().message(), "chat without --system"))
            << conv.status();
        continue;
      }
      ASSERT_TRUE(conv.ok()) << conv.status();
      const Json& renders = c.at("renders");
      std::string text = conv->Start(users[0].get<std::string>());
      EXPECT_EQ(text, renders[0].get<std::string>());
      for (size_t turn = 1; turn < renders.size(); ++turn) {
        SCOPED_TRACE(turn);
        const std::string& whole = renders[turn].get_ref<const std::string&>();
        const std::string next = conv->Next(users[turn].get<std::string>(), true);
        ASSERT_TRUE(absl::StartsWith(whole, text)) << whole;
        ASSERT_TRUE(absl::EndsWith(whole, next)) << "next turn:\n" << next << "\nwhole:\n" << whole;
        ASSERT_GE(whole.size(), text.size() + next.size());
        // Between them: the answer as the template writes it, closed by the end of turn.
        const std::string written =
            whole.substr(text.size(), whole.size() - text.size() - next.size());
        const std::string answer = answers[turn - 1];
        EXPECT_TRUE(absl::StrContains(written, answer)) << written;
        EXPECT_TRUE(absl::EndsWith(written, conv->end_of_turn())) << written;
        EXPECT_LE(written.size(), answer.size() + conv->end_of_turn().size() + 2) << written;
        // An answer cut short gets its end of turn from the next turn.
        EXPECT_EQ(conv->Next(users[turn].get<std::string>(), false), conv->end_of_turn() + next);
        text = whole;
      }
    }
  }
}

// Templates outside the old families are followed (Gemma 2's here); one that refuses a
// conversation is refused with its own reason.
TEST(ConversationTest, TemplatesOfAnyFamilyAreFollowed) {
  std::ifstream f(std::string(SG_FIXTURES_DIR) + "/chat_templates/gemma2.jinja");
  std::stringstream gemma2;
  gemma2 << f.rdbuf();
  const absl::StatusOr<Conversation> gemma =
      Conversation::Create(gemma2.str(), "<bos>", "<eos>", std::nullopt);
  ASSERT_TRUE(gemma.ok()) << gemma.status();
  EXPECT_EQ(gemma->Start("Hi"),
            "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(gemma->Next("More", true),
            "\n<start_of_turn>user\nMore<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(gemma->end_of_turn(), "<end_of_turn>");
  const absl::StatusOr<Conversation> refusing = Conversation::Create(
      "{{ raise_exception('no conversations here') }}", "<s>", "</s>", std::nullopt);
  ASSERT_FALSE(refusing.ok());
  EXPECT_TRUE(absl::StrContains(refusing.status().message(), "no conversations here"))
      << refusing.status();
  const absl::StatusOr<Conversation> none =
      Conversation::Create("", "<s>", "</s>", std::nullopt);
  EXPECT_FALSE(none.ok());
}

}  // namespace
}  // namespace sg::cli
