// A conversation's turns, each rendered by the model's chat template; see
// chat_conversation.h.
#include "stepgraph/text/chat_conversation.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace {

// Stand for an earlier user message and answer while the text after them is read: no
// template writes them, and Python's strip() keeps them whole.
constexpr char kUserMark[] =
    "\x01"
    "user"
    "\x02";
constexpr char kAnswerMark[] =
    "\x01"
    "answer"
    "\x02";
constexpr size_t kAnswerMarkSize = sizeof(kAnswerMark) - 1;
// The most bytes between an answer and the next turn besides the end of turn.
constexpr size_t kMaxAnswerClose = 64;

bool IsAsciiSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

}  // namespace

std::vector<ChatMessage> ChatConversation::Before(bool later) const {
  std::vector<ChatMessage> m;
  if (system_.has_value()) m.push_back({"system", *system_});
  if (later) {
    m.push_back({"user", kUserMark});
    m.push_back({"assistant", kAnswerMark});
  }
  return m;
}

absl::StatusOr<ChatConversation> ChatConversation::Create(absl::string_view template_text,
                                                          absl::string_view bos_token,
                                                          absl::string_view eos_token,
                                                          const std::optional<std::string>& system,
                                                          absl::string_view date_string) {
  SG_ASSIGN_OR_RETURN(ChatTemplate t,
                      ChatTemplate::Create(template_text, bos_token, eos_token, date_string));
  ChatConversation c(std::move(t));
  c.system_ = system;
  const auto no_system = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chat template: ", why,
        "; a conversation kept in the KV cache cannot follow it: chat without --system"));
  };
  // The kept cache holds Start(u1), the answer, Next(u2): the template's rendering of the
  // whole conversation must be exactly that.
  absl::StatusOr<std::string> start = c.StartOrError(kUserMark);
  if (!start.ok()) {
    if (system.has_value()) return no_system(start.status().message());
    return start.status();
  }
  std::vector<ChatMessage> two = c.Before(true);
  two.push_back({"user", "Next"});
  absl::StatusOr<std::string> whole = c.template_.Render(two, true);
  if (!whole.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template: a conversation of two user turns does not render: ",
                     whole.status().message()));
  }
  // The whole conversation is the first turn, then the answer: the first turn's generation
  // prompt may open the answer with more than the template keeps of an earlier one
  // (DeepSeek R1 prompts with "<think>\n" and keeps no reasoning), which the answer the
  // model writes there stands for; the user's text must come before it.
  size_t common = 0;
  while (common < start->size() && common < whole->size() && (*start)[common] == (*whole)[common]) {
    ++common;
  }
  // Spacing before the answer (Llama 2's ' ' + content) is the model's to write.
  const size_t answer_at = whole->find(kAnswerMark);
  size_t spaced = common;
  while (spaced < whole->size() && IsAsciiSpace((*whole)[spaced])) ++spaced;
  const bool follows = answer_at == spaced &&
                       absl::StrContains(absl::string_view(*start).substr(0, common), kUserMark);
  if (!follows) {
    if (system.has_value()) {
      // The system message is the cause only if the template is followed without one.
      absl::StatusOr<ChatConversation> plain =
          Create(template_text, bos_token, eos_token, std::nullopt, date_string);
      if (!plain.ok()) return plain.status();
      return no_system("the system message moves as the conversation grows");
    }
    return absl::InvalidArgumentError(
        "chat template: earlier turns are written differently as the conversation grows, which a "
        "conversation kept in the KV cache cannot follow");
  }
  const absl::string_view rest = absl::string_view(*whole).substr(answer_at + kAnswerMarkSize);
  SG_ASSIGN_OR_RETURN(std::string next, c.NextOrError("Next", true));
  if (!absl::EndsWith(rest, next) || next.size() + kMaxAnswerClose < rest.size()) {
    return absl::InternalError("chat template: the next turn is not where it was looked for");
  }
  return c;
}

absl::StatusOr<ChatConversation> ChatConversation::ForTokenizer(
    const Tokenizer& tokenizer, const std::optional<std::string>& system) {
  const TokenizerSpec& spec = tokenizer.spec();
  auto name = [&](int32_t id) { return id >= 0 ? spec.tokens[id] : std::string(); };
  SG_ASSIGN_OR_RETURN(ChatConversation c,
                      Create(spec.chat_template, name(spec.bos_id), name(spec.eos_id), system));
  // The end of turn as ChatTemplate::ForTokenizer checks it against the vocabulary.
  SG_ASSIGN_OR_RETURN(c.template_, ChatTemplate::ForTokenizer(tokenizer));
  // An end of turn that fell back to eos must still close an answer in the template.
  SG_RETURN_IF_ERROR(c.NextOrError("Next", true).status());
  return c;
}

absl::StatusOr<std::string> ChatConversation::StartOrError(absl::string_view user) const {
  std::vector<ChatMessage> m = Before(false);
  m.push_back({"user", std::string(user)});
  return template_.Render(m, true);
}

absl::StatusOr<std::string> ChatConversation::NextOrError(absl::string_view user,
                                                          bool answer_closed) const {
  std::vector<ChatMessage> m = Before(true);
  m.push_back({"user", std::string(user)});
  SG_ASSIGN_OR_RETURN(std::string whole, template_.Render(m, true));
  const size_t at = whole.find(kAnswerMark);
  if (at == std::string::npos) {
    return absl::InvalidArgumentError("chat template: the answer is missing from the conversation");
  }
  // What closes the answer: spacing the template writes (kept by the model's own text or
  // not at all), then the end of turn, which the model wrote if it stopped there.
  size_t end = at + kAnswerMarkSize;
  while (end < whole.size() && IsAsciiSpace(whole[end])) ++end;
  const std::string& eot = template_.end_of_turn();
  if (whole.compare(end, eot.size(), eot) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template: an answer is not closed by ", eot, " in the conversation"));
  }
  end += eot.size();
  return absl::StrCat(answer_closed ? "" : eot, absl::string_view(whole).substr(end));
}

std::string ChatConversation::Start(absl::string_view user) const {
  absl::StatusOr<std::string> s = StartOrError(user);
  return s.ok() ? *std::move(s) : std::string();
}

std::string ChatConversation::Next(absl::string_view user, bool answer_closed) const {
  absl::StatusOr<std::string> s = NextOrError(user, answer_closed);
  return s.ok() ? *std::move(s) : std::string();
}

}  // namespace sg
