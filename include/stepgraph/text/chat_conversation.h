// A conversation through a model's chat template, for a session that keeps its KV cache
// from turn to turn: the text that starts it (bos, a system turn, the first user turn and
// the generation prompt), and after each answer only the text that follows it (what closes
// the answer, the next user turn, the generation prompt). Each piece is the template's own
// rendering (ChatTemplate::Render) of a conversation, so any template the interpreter runs
// can be followed, provided it writes earlier turns the same way as the conversation
// grows; Create checks that, and refuses a template that does not.
//
// The answer stays as the model wrote it (transformers would re-render it: trimmed in the
// Llama 3 family, its reasoning dropped in Qwen3 and DeepSeek R1). A template that moves
// the system prompt to the latest user turn (Mistral v3) cannot be followed by a kept cache
// and is refused with a system prompt.
#ifndef STEPGRAPH_TEXT_CHAT_CONVERSATION_H_
#define STEPGRAPH_TEXT_CHAT_CONVERSATION_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stepgraph/text/chat_template.h"
#include "stepgraph/text/tokenizer.h"

namespace sg {

class ChatConversation {
 public:
  // As ChatTemplate::Create; `system`, when given, is the conversation's system message.
  // InvalidArgument for a template ChatTemplate refuses, a system message the template
  // refuses or has no lasting place for ("chat without --system"), or a template whose
  // earlier turns change as the conversation grows.
  static absl::StatusOr<ChatConversation> Create(absl::string_view template_text,
                                                 absl::string_view bos_token,
                                                 absl::string_view eos_token,
                                                 const std::optional<std::string>& system,
                                                 absl::string_view date_string = "");
  // From the tokenizer's chat template and its bos / eos tokens.
  static absl::StatusOr<ChatConversation> ForTokenizer(const Tokenizer& tokenizer,
                                                       const std::optional<std::string>& system);

  // The start of the conversation up to the first answer. Encode it, and Next's text,
  // with EncodeOptions{.add_special = false}: they carry their own special tokens. Empty
  // when the template refuses the text or it passes a bound (StartOrError says why).
  std::string Start(absl::string_view user) const;
  absl::StatusOr<std::string> StartOrError(absl::string_view user) const;
  // What follows an answer up to the next one: the end of the turn unless the model wrote
  // it (`answer_closed`: it stopped at end_of_turn()), then the next user turn. Empty on
  // an error, as Start (NextOrError says why).
  std::string Next(absl::string_view user, bool answer_closed) const;
  absl::StatusOr<std::string> NextOrError(absl::string_view user, bool answer_closed) const;

  const ChatTemplate& chat_template() const { return template_; }
  // The token that ends an answer.
  const std::string& end_of_turn() const { return template_.end_of_turn(); }

 private:
  explicit ChatConversation(ChatTemplate t) : template_(std::move(t)) {}
  // The messages before `user`: the system message, then (for a later turn) a user
  // message and an answer standing for those of the conversation.
  std::vector<ChatMessage> Before(bool later) const;

  ChatTemplate template_;
  std::optional<std::string> system_;
};

}  // namespace sg

#endif  // STEPGRAPH_TEXT_CHAT_CONVERSATION_H_
