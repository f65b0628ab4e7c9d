// Chat templates rendered by stepgraph's interpreter against transformers'
// apply_chat_template, byte for byte: the real templates of tests/fixtures/chat_templates/
// and tests/fixtures/tokenizer/chat/, each with several conversations
// (tests/fixtures/chat_templates/expected.json, made by
// tests/text/make_chat_template_fixtures.py). A conversation the template refuses there
// (raise_exception) is refused here too.
#include "stepgraph/text/chat_template.h"

#include <cctype>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "stepgraph/text/chat_conversation.h"

namespace sg {
namespace {

using Json = nlohmann::json;

const std::string kFixtures = std::string(SG_FIXTURES_DIR);

std::string ReadText(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Json Expected() { return Json::parse(ReadText(kFixtures + "/chat_templates/expected.json")); }

std::vector<ChatMessage> Messages(const Json& j) {
  std::vector<ChatMessage> m;
  for (const Json& x : j)
    m.push_back({x.at("role").get<std::string>(), x.at("content").get<std::string>()});
  return m;
}

absl::StatusOr<ChatTemplate> Load(const Json& fixture, const std::string& path, const Json& t) {
  return ChatTemplate::Create(
      ReadText(kFixtures + "/" + path), t.at("bos_token").get<std::string>(),
      t.at("eos_token").get<std::string>(), fixture.at("date_string").get<std::string>());
}

TEST(ChatTemplate, RendersEveryFixtureLikeTransformers) {
  const Json fixture = Expected();
  ASSERT_GE(fixture.at("templates").size(), 23u);
  int rendered = 0, refused = 0;
  for (const auto& [path, t] : fixture.at("templates").items()) {
    SCOPED_TRACE(path);
    absl::StatusOr<ChatTemplate> ct = Load(fixture, path, t);
    ASSERT_TRUE(ct.ok()) << ct.status();
    int i = 0;
    for (const Json& c : t.at("cases")) {
      SCOPED_TRACE(i++);
      absl::StatusOr<std::string> text =
          ct->Render(Messages(c.at("messages")), c.at("add_generation_prompt").get<bool>());
      if (c.contains("error")) {
        ASSERT_FALSE(text.ok()) << *text;
        EXPECT_TRUE(absl::StrContains(text.status().message(), c.at("error").get<std::string>()))
            << text.status();
        ++refused;
        continue;
      }
      ASSERT_TRUE(text.ok()) << text.status();
      EXPECT_EQ(*text, c.at("text").get<std::string>());
      ++rendered;
    }
  }
  EXPECT_GE(rendered, 190);
  EXPECT_GE(refused, 8);
}

// The end of an answer as each template writes it, and the family it implies.
TEST(ChatTemplate, EndOfTurnIsWhatTheTemplateWritesAfterAnAnswer) {
  const Json fixture = Expected();
  const std::map<std::string, std::pair<ChatFamily, std::string>> want = {
      {"chat_templates/qwen25.jinja", {ChatFamily::kChatMl, "<|im_end|>"}},
      {"chat_templates/qwen3.jinja", {ChatFamily::kChatMl, "<|im_end|>"}},
      {"chat_templates/mistral_nemo.jinja", {ChatFamily::kInst, "</s>"}},
      {"chat_templates/phi35.jinja", {ChatFamily::kOther, "<|end|>"}},
      {"chat_templates/phi4.jinja", {ChatFamily::kChatMl, "<|im_end|>"}},
      {"chat_templates/gemma2.jinja", {ChatFamily::kOther, "<end_of_turn>"}},
      {"chat_templates/llama31.jinja", {ChatFamily::kLlama3, "<|eot_id|>"}},
      {"chat_templates/llama32.jinja", {ChatFamily::kLlama3, "<|eot_id|>"}},
      {"chat_templates/deepseek_r1_qwen.jinja", {ChatFamily::kOther, "<｜end▁of▁sentence｜>"}},
      {"tokenizer/chat/smollm2.jinja", {ChatFamily::kChatMl, "<|im_end|>"}},
      {"tokenizer/chat/llama2.jinja", {ChatFamily::kInst, "</s>"}},
      {"tokenizer/chat/mistral.jinja", {ChatFamily::kInst, "</s>"}},
      {"tokenizer/chat/refused_gemma.jinja", {ChatFamily::kOther, "<end_of_turn>"}},
  };
  for (const auto& [path, w] : want) {
    SCOPED_TRACE(path);
    absl::StatusOr<ChatTemplate> ct = Load(fixture, path, fixture.at("templates").at(path));
    ASSERT_TRUE(ct.ok()) << ct.status();
    EXPECT_EQ(ct->family(), w.first) << ct->family_name();
    EXPECT_EQ(ct->end_of_turn(), w.second);
  }
}

TEST(ChatTemplate, RenderUserTurnIsOneUserMessage) {
  const Json fixture = Expected();
  const Json& t = fixture.at("templates").at("tokenizer/chat/smollm2.jinja");
  absl::StatusOr<ChatTemplate> ct = Load(fixture, "tokenizer/chat/smollm2.jinja", t);
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(ct->RenderUserTurn("Hi"),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(ct->RenderUserTurn("What is the capital of France?"),
            t.at("cases")[0].at("text").get<std::string>());
}

// Without a date, a template that reads the clock writes today's local date.
TEST(ChatTemplate, ClockTemplatesWriteTodaysDate) {
  auto ct = ChatTemplate::Create(ReadText(kFixtures + "/tokenizer/chat/llama32.jinja"),
                                 "<|begin_of_text|>", "<|eot_id|>");
  ASSERT_TRUE(ct.ok()) << ct.status();
  const std::string text = ct->RenderUserTurn("hi");
  const size_t at = text.find("Today Date: ");
  ASSERT_NE(at, std::string::npos) << text;
  const std::string date = text.substr(at + 12, 11);  // "%d %b %Y"
  EXPECT_TRUE(std::isdigit(date[0]) && std::isdigit(date[1]) && date[2] == ' ' &&
              std::isupper(date[3]) && std::islower(date[4]) && date[6] == ' ' &&
              std::isdigit(date[7]) && std::isdigit(date[10]))
      << date;
  EXPECT_EQ(text.find("26 Jul 2024"), std::string::npos);
}

// A template of no known family renders as written; before, such templates were refused.
TEST(ChatTemplate, RendersATemplateOfItsOwn) {
  auto ct = ChatTemplate::Create(
      "{%- for m in messages %}<<{{ m.role | upper }}>>{{ m.content | trim }}<|END|>\n"
      "{%- endfor %}{% if add_generation_prompt %}<<ASSISTANT>>{% endif %}",
      "", "</s>");
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(ct->RenderUserTurn("  hello "), "<<USER>>hello<|END|><<ASSISTANT>>");
  EXPECT_EQ(ct->end_of_turn(), "<|END|>");
  EXPECT_EQ(ct->family(), ChatFamily::kOther);
}

TEST(ChatTemplate, RefusesWhatItCannotRender) {
  EXPECT_FALSE(ChatTemplate::Create("", "<s>", "</s>").ok());
  for (const char* bad :
       {"{{ '<|im_start|>", "{% for message in messages %}", "{% if x %}{% endfor %}",
        "{{ raise_exception('no') }}", "{% call foo() %}{% endcall %}"}) {
    auto ct = ChatTemplate::Create(bad, "", "</s>");
    ASSERT_FALSE(ct.ok()) << bad;
    EXPECT_EQ(ct.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(ct.status().message(), "chat template")) << ct.status();
  }
  // A conversation the template refuses: an error naming why, and no text.
  auto gemma =
      ChatTemplate::Create(ReadText(kFixtures + "/chat_templates/gemma2.jinja"), "<bos>", "<eos>");
  ASSERT_TRUE(gemma.ok()) << gemma.status();
  auto text = gemma->Render({{"system", "s"}, {"user", "u"}}, true);
  ASSERT_FALSE(text.ok());
  EXPECT_TRUE(absl::StrContains(text.status().message(), "System role not supported"))
      << text.status();
}

TEST(ChatTemplate, ForTokenizerUsesTheSpec) {
  TokenizerSpec spec;
  spec.model = "gpt2";
  spec.pre = "default";
  spec.tokens = {"<|im_start|>", "<|im_end|>", "a", "aa"};
  spec.token_types = {3, 3, 1, 1};
  spec.merges = {"a a"};
  spec.bos_id = 0;
  spec.eos_id = 1;
  spec.chat_template = ReadText(kFixtures + "/tokenizer/chat/chatml_plain.jinja");
  auto tok = Tokenizer::Create(spec);
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto ct = ChatTemplate::ForTokenizer(**tok);
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(ct->RenderUserTurn("x"), "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(ct->end_of_turn(), "<|im_end|>");
  // An end of turn that is no token of the vocabulary falls back to eos.
  spec.chat_template =
      "{% for m in messages %}{{ m.content }}<|end|>{% endfor %}{% if add_generation_prompt %}>{% "
      "endif %}";
  tok = Tokenizer::Create(spec);
  ASSERT_TRUE(tok.ok()) << tok.status();
  ct = ChatTemplate::ForTokenizer(**tok);
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(ct->end_of_turn(), "<|im_end|>");
}

// For every fixture template a kept conversation accepts, its pieces add up to the
// template's rendering of the whole conversation (which the first test ties to
// transformers'): Start(u1) + answer + end of turn + Next(u2) == Render(u1, a1, u2). Only
// the generation prompts of DeepSeek R1 and QwQ open the answer with more ("<think>\n")
// than the template keeps of an earlier answer; [INST] templates write a space before it.
TEST(ChatConversation, PiecesAddUpToTheWholeConversation) {
  const Json fixture = Expected();
  int followed = 0;
  for (const auto& [path, t] : fixture.at("templates").items()) {
    for (const bool with_system : {false, true}) {
      SCOPED_TRACE(path + (with_system ? " with a system message" : ""));
      const std::optional<std::string> system =
          with_system ? std::optional<std::string>("Be brief.") : std::nullopt;
      auto conv = ChatConversation::Create(ReadText(kFixtures + "/" + path),
                                           t.at("bos_token").get<std::string>(),
                                           t.at("eos_token").get<std::string>(), system,
                                           fixture.at("date_string").get<std::string>());
      if (!conv.ok() && path == "tokenizer/chat/refused_gemma.jinja") {
        // Gemma 1 prompts "<start_of_turn>model" but writes an earlier answer as
        // "<start_of_turn>assistant": a kept cache would differ from the conversation.
        EXPECT_TRUE(absl::StrContains(conv.status().message(), "written differently"))
            << conv.status();
        continue;
      }
      if (!conv.ok()) {
        // Otherwise only a system message may be refused, and then with the way out named.
        ASSERT_TRUE(with_system) << conv.status();
        EXPECT_TRUE(absl::StrContains(conv.status().message(), "chat without --system"))
            << conv.status();
        continue;
      }
      ++followed;
      const std::string answer = "Paris.";
      std::vector<ChatMessage> m;
      if (system.has_value()) m.push_back({"system", *system});
      m.push_back({"user", "Capital of France?"});
      const std::string start = conv->Start("Capital of France?");
      EXPECT_EQ(start, *conv->chat_template().Render(m, true));
      m.push_back({"assistant", answer});
      m.push_back({"user", "And Italy?"});
      const std::string whole = *conv->chat_template().Render(m, true);
      const std::string next = conv->Next("And Italy?", true);
      size_t common = 0;
      while (common < start.size() && common < whole.size() && start[common] == whole[common])
        ++common;
      const std::string opening = start.substr(common);
      if (absl::StrContains(path, "deepseek_r1") || absl::StrContains(path, "qwq")) {
        EXPECT_TRUE(absl::StartsWith(opening, "<think>\n")) << start;
      } else {
        EXPECT_EQ(opening, "") << start;
      }
      while (common < whole.size() && whole[common] == ' ') ++common;  // ' ' + the answer
      ASSERT_TRUE(absl::StartsWith(whole.substr(common), answer)) << whole;
      ASSERT_TRUE(absl::EndsWith(whole, next)) << whole;
      ASSERT_GE(whole.size(), common + answer.size() + next.size());
      const std::string between =
          whole.substr(common + answer.size(), whole.size() - common - answer.size() - next.size());
      EXPECT_TRUE(absl::EndsWith(between, conv->end_of_turn())) << between;
      EXPECT_LE(between.size(), conv->end_of_turn().size() + 1) << between;
      EXPECT_EQ(conv->Next("And Italy?", false), conv->end_of_turn() + next);
    }
  }
  EXPECT_GE(followed, 30);
}

}  // namespace
}  // namespace sg
