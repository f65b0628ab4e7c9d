// A conversation through a model's chat template, for a session that keeps its KV cache
// from turn to turn: the text that starts it (bos, a system turn, the first user turn and
// the generation prompt), and after each answer only the text that follows it (what closes
// the answer, the next user turn, the generation prompt). ChatTemplate renders one user
// turn as transformers does; the turns around it are those of the template's family,
// checked against transformers' rendering of whole conversations in
// tests/tools/conversation_test.cc.
//
// The answer stays as the model wrote it (transformers would re-render it, trimmed in the
// Llama 3 family); a template that moves the system prompt to the latest user turn
// (Mistral v3) cannot be followed by a kept cache and is refused with --system.
#ifndef STEPGRAPH_TOOLS_CONVERSATION_H_
#define STEPGRAPH_TOOLS_CONVERSATION_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stepgraph/text/chat_template.h"
#include "stepgraph/text/tokenizer.h"

namespace sg::cli {

class Conversation {
 public:
  // As ChatTemplate::Create; `system` replaces the template's default system prompt, if
  // it has one. InvalidArgument for a template ChatTemplate refuses, or a system prompt
  // the template has no lasting place for.
  static absl::StatusOr<Conversation> Create(absl::string_view template_text,
                                             absl::string_view bos_token,
                                             absl::string_view eos_token,
                                             const std::optional<std::string>& system,
                                             absl::string_view date_string = "");
  // From the tokenizer's chat template and its bos / eos tokens.
  static absl::StatusOr<Conversation> ForTokenizer(const Tokenizer& tokenizer,
                                                   const std::optional<std::string>& system);

  // The start of the conversation up to the first answer. Encode it, and Next's text,
  // with EncodeOptions{.add_special = false}: they carry their own special tokens.
  std::string Start(absl::string_view user) const;
  // What follows an answer up to the next one: the end of the turn unless the model wrote
  // it (`answer_closed`: it stopped at end_of_turn()), then the next user turn.
  std::string Next(absl::string_view user, bool answer_closed) const;

  const ChatTemplate& chat_template() const { return template_; }
  // The token that ends an answer.
  const std::string& end_of_turn() const { return template_.end_of_turn(); }

 private:
  explicit Conversation(ChatTemplate t) : template_(std::move(t)) {}
  // The user's text as the template writes it (trimmed where it trims) with the
  // generation prompt: RenderUserTurn without the first turn's prefix.
  std::string UserAndPrompt(absl::string_view user) const;

  ChatTemplate template_;
  size_t default_prefix_ = 0;  // the size of RenderUserTurn's text before the user's
  std::string start_;          // before the first user text: bos, system turn, user header
  std::string turn_;           // before a later user text
  std::string after_answer_;   // between the end of an answer and the next turn
  std::string system_in_user_;  // [INST] with <<SYS>>: the system block before the first text
};

}  // namespace sg::cli

#endif  // STEPGRAPH_TOOLS_CONVERSATION_H_
