// Chat templates: the model's own wrapping of a user turn, from `tokenizer.chat_template`.
// Templates are Jinja programs; instead of running Jinja, stepgraph recognises the common
// families (ChatML as in SmolLM2 and Qwen, Llama 3 / 3.1 / 3.2, Llama 2 / Mistral [INST]),
// reads from the template's string literals the parts that vary within a family (a default
// system prompt, the spacing around [INST], Llama 3.1's dated system turn), and renders one
// user turn with the generation prompt exactly as transformers'
// apply_chat_template(..., add_generation_prompt=True, tokenize=False) does.
// Anything else is refused with a message, never rendered approximately.
#ifndef STEPGRAPH_TEXT_CHAT_TEMPLATE_H_
#define STEPGRAPH_TEXT_CHAT_TEMPLATE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stepgraph/text/tokenizer.h"

namespace sg {

enum class ChatFamily { kChatMl, kLlama3, kInst };

class ChatTemplate {
 public:
  // `bos_token` and `eos_token` are the strings the template writes for bos_token and
  // eos_token (empty when the tokenizer has none). `date_string` is the date that Llama 3.1
  // and later templates write in their system turn ("02 Jan 2025"); empty: the template's
  // own default, which for templates that read the clock (strftime_now) is today's local
  // date, taken here once.
  static absl::StatusOr<ChatTemplate> Create(absl::string_view template_text,
                                             absl::string_view bos_token,
                                             absl::string_view eos_token,
                                             absl::string_view date_string = "");
  // From the tokenizer's spec.chat_template and its bos / eos tokens.
  static absl::StatusOr<ChatTemplate> ForTokenizer(const Tokenizer& tokenizer,
                                                   absl::string_view date_string = "");

  // One user turn and the generation prompt. The text carries its own special tokens (bos
  // included where the template writes it): encode it with EncodeOptions{.add_special =
  // false}, as apply_chat_template(tokenize=True) does.
  std::string RenderUserTurn(absl::string_view user_text) const;

  ChatFamily family() const { return family_; }
  absl::string_view family_name() const;
  // The token that ends the assistant's turn ("<|im_end|>", "<|eot_id|>", or eos for
  // [INST] templates): generation stops there.
  const std::string& end_of_turn() const { return end_of_turn_; }

 private:
  ChatFamily family_ = ChatFamily::kChatMl;
  std::string prefix_;       // before the user text
  std::string suffix_;       // after it, generation prompt included
  bool trim_user_ = false;   // the template strips the user text
  std::string end_of_turn_;
};

}  // namespace sg

#endif  // STEPGRAPH_TEXT_CHAT_TEMPLATE_H_
