// A model's chat template, run by the Jinja-subset interpreter; see chat_template.h.
#include "stepgraph/text/chat_template.h"

#include <ctime>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stepgraph/base/status.h"
#include "text/bounded_json.h"
#include "text/jinja.h"

namespace sg {
namespace {

// Stands for an answer while the template's text around it is read: no template writes it.
constexpr char kAnswerMark[] =
    "\x01"
    "answer"
    "\x02";

bool IsAsciiSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// The token that opens `text` if it is written like a special token: "<...>" with no
// space inside ("<|im_end|>", "<end_of_turn>", "<｜end▁of▁sentence｜>"); else empty.
std::string LeadingSpecialToken(absl::string_view text) {
  if (text.empty() || text[0] != '<') return "";
  for (size_t i = 1; i < text.size() && i < 64; ++i) {
    if (IsAsciiSpace(text[i]) || text[i] == '<') return "";
    if (text[i] == '>') return i > 1 ? std::string(text.substr(0, i + 1)) : "";
  }
  return "";
}

}  // namespace

ChatTemplate::ChatTemplate() = default;
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

absl::StatusOr<ChatTemplate> ChatTemplate::Create(absl::string_view text,
                                                  absl::string_view bos_token,
                                                  absl::string_view eos_token,
                                                  absl::string_view date_string) {
  if (text.empty()) return absl::InvalidArgumentError("the model has no chat template");
  SG_ASSIGN_OR_RETURN(jinja::Template parsed, jinja::Template::Parse(text));
  ChatTemplate ct;
  ct.template_ = std::make_unique<jinja::Template>(std::move(parsed));
  ct.bos_ = std::string(bos_token);
  ct.eos_ = std::string(eos_token);
  ct.date_ = std::string(date_string);
  // The clock is read once, so that every rendering of a conversation writes one date.
  const std::time_t now = std::time(nullptr);
  if (localtime_r(&now, &ct.now_) == nullptr) ct.now_ = std::tm{};

  absl::StatusOr<std::string> one = ct.Render({{"user", "Hi"}}, true);
  if (!one.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template: a conversation of one user message does not render: ",
                     one.status().message()));
  }

  // The end of an answer: what the template writes right after one.
  absl::StatusOr<std::string> answered =
      ct.Render({{"user", "Hi"}, {"assistant", kAnswerMark}}, false);
  std::string after;
  if (answered.ok()) {
    const size_t at = answered->find(kAnswerMark);
    if (at != std::string::npos) after = answered->substr(at + sizeof(kAnswerMark) - 1);
  }
  size_t skip = 0;
  while (skip < after.size() && IsAsciiSpace(after[skip])) ++skip;
  const absl::string_view rest = absl::string_view(after).substr(skip);
  if (!ct.eos_.empty() && absl::StartsWith(rest, ct.eos_)) {
    ct.end_of_turn_ = ct.eos_;
  } else {
    ct.end_of_turn_ = LeadingSpecialToken(rest);
    if (ct.end_of_turn_.empty()) ct.end_of_turn_ = ct.eos_;
  }
  if (ct.end_of_turn_.empty()) {
    return absl::InvalidArgumentError(
        "chat template: nothing special ends an answer and there is no eos token to stop at");
  }
  if (ct.end_of_turn_ == "<|im_end|>") {
    ct.family_ = ChatFamily::kChatMl;
  } else if (ct.end_of_turn_ == "<|eot_id|>") {
    ct.family_ = ChatFamily::kLlama3;
  } else if (ct.end_of_turn_ == ct.eos_ && absl::StrContains(*one, "[INST]")) {
    ct.family_ = ChatFamily::kInst;
  }
  return ct;
}

absl::StatusOr<ChatTemplate> ChatTemplate::ForTokenizer(const Tokenizer& tokenizer,
                                                        absl::string_view date_string) {
  const TokenizerSpec& spec = tokenizer.spec();
  auto name = [&](int32_t id) { return id >= 0 ? spec.tokens[id] : std::string(); };
  SG_ASSIGN_OR_RETURN(ChatTemplate ct, Create(spec.chat_template, name(spec.bos_id),
                                              name(spec.eos_id), date_string));
  // Generation stops at one token: a written end that is not one falls back to eos.
  if (tokenizer.TokenId(ct.end_of_turn_) < 0 && !ct.eos_.empty()) {
    ct.end_of_turn_ = ct.eos_;
    ct.family_ = ChatFamily::kOther;
  }
  return ct;
}

absl::StatusOr<std::string> ChatTemplate::Render(absl::Span<const ChatMessage> messages,
                                                 bool add_generation_prompt) const {
  jinja::List list;
  list.reserve(messages.size());
  for (const ChatMessage& m : messages) {
    jinja::Dict d;
    d.Set("role", jinja::Value(m.role));
    d.Set("content", jinja::Value(m.content));
    list.emplace_back(std::move(d));
  }
  jinja::Dict vars;
  vars.Set("messages", jinja::Value(std::move(list)));
  vars.Set("add_generation_prompt", jinja::Value(add_generation_prompt));
  // As transformers: no tools and no documents are none, not undefined.
  vars.Set("tools", jinja::Value::None());
  vars.Set("documents", jinja::Value::None());
  if (!bos_.empty()) vars.Set("bos_token", jinja::Value(bos_));
  if (!eos_.empty()) vars.Set("eos_token", jinja::Value(eos_));
  if (!date_.empty()) vars.Set("date_string", jinja::Value(date_));
  jinja::Environment env;
  env.now = now_;
  return template_->Render(vars, env);
}

std::string ChatTemplate::RenderUserTurn(absl::string_view user_text) const {
  absl::StatusOr<std::string> text = Render({{"user", std::string(user_text)}}, true);
  return text.ok() ? *std::move(text) : std::string();
}

absl::string_view ChatTemplate::family_name() const {
  switch (family_) {
    case ChatFamily::kChatMl: return "ChatML";
    case ChatFamily::kLlama3: return "Llama 3";
    case ChatFamily::kInst: return "[INST]";
    case ChatFamily::kOther: return "other";
  }
  return "?";
}

absl::StatusOr<std::vector<ChatMessage>> ChatMessagesFromJson(absl::string_view json,
                                                              int64_t max_messages) {
  nlohmann::json parsed;
  // An array of objects of two strings: three values a message, nested two deep.
  SG_RETURN_IF_ERROR(ParseBoundedJson(json, {.max_depth = 2, .max_values = 3 * max_messages + 1},
                                      "messages_json", &parsed));
  if (!parsed.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("messages_json must be an array of messages, got ", JsonPreview(parsed)));
  }
  if (parsed.empty()) return absl::InvalidArgumentError("messages_json holds no messages");
  if (static_cast<int64_t>(parsed.size()) > max_messages) {
    return absl::InvalidArgumentError(
        absl::StrCat(parsed.size(), " messages, at most ", max_messages));
  }
  std::vector<ChatMessage> messages;
  messages.reserve(parsed.size());
  for (size_t i = 0; i < parsed.size(); ++i) {
    const nlohmann::json& m = parsed[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " must be an object {\"role\", \"content\"}, got ", JsonPreview(m)));
    }
    for (const auto& [key, value] : m.items()) {
      if (key != "role" && key != "content") {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".", JsonPreview(nlohmann::json(key), 40),
                         " is not taken (role and content only)"));
      }
    }
    for (const char* field : {"role", "content"}) {
      if (!m.contains(field) || !m[field].is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".", field, " must be a string",
                         m.contains(field) ? ", got " : " (missing)",
                         m.contains(field) ? JsonPreview(m[field]) : std::string()));
      }
    }
    messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return messages;
}

}  // namespace sg
