// Chat templates: the model's own wrapping of a conversation, from
// `tokenizer.chat_template`. stepgraph runs the template itself with a Jinja-subset
// interpreter (text/jinja.h; docs/chat_templates.md lists the subset and its bounds) in the
// environment transformers' apply_chat_template gives it (messages, add_generation_prompt,
// bos_token, eos_token, date_string, raise_exception, strftime_now), so a model's template
// renders here byte for byte as it does there, whatever family it belongs to.
#ifndef STEPGRAPH_TEXT_CHAT_TEMPLATE_H_
#define STEPGRAPH_TEXT_CHAT_TEMPLATE_H_

#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "stepgraph/text/tokenizer.h"

namespace sg {

namespace jinja {
class Template;
}

// The convention a template ends an answer with: kChatMl (<|im_end|>), kLlama3
// (<|eot_id|>), kInst ([INST] templates ending answers with eos), or kOther (any other
// template: Gemma's <end_of_turn>, Phi's <|end|>, DeepSeek's eos...).
enum class ChatFamily { kChatMl, kLlama3, kInst, kOther };

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or what the template knows
  std::string content;
};

class ChatTemplate {
 public:
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // `bos_token` and `eos_token` are the strings the template writes for bos_token and
  // eos_token (empty: the tokenizer has none, and the template sees them undefined).
  // `date_string` ("02 Jan 2025") is given to the template as date_string, which Llama 3.1
  // and later write in their system turn; empty: undefined, so the template uses its own
  // default or strftime_now, which reads the local time taken here, once.
  // InvalidArgument for a template outside the subset, over a bound, or that does not
  // render a conversation of one user message.
  static absl::StatusOr<ChatTemplate> Create(absl::string_view template_text,
                                             absl::string_view bos_token,
                                             absl::string_view eos_token,
                                             absl::string_view date_string = "");
  // From the tokenizer's spec.chat_template and its bos / eos tokens; end_of_turn() is
  // checked to be one token of its vocabulary (else it is eos).
  static absl::StatusOr<ChatTemplate> ForTokenizer(const Tokenizer& tokenizer,
                                                   absl::string_view date_string = "");

  // The conversation as the template writes it, with the generation prompt (the opening of
  // the assistant's answer) when `add_generation_prompt`. The text carries its own special
  // tokens (bos included where the template writes it): encode it with
  // EncodeOptions{.add_special = false}, as apply_chat_template(tokenize=True) does.
  // InvalidArgument when the template refuses the conversation (raise_exception: roles
  // that do not alternate, a system message it does not take) or a bound is passed.
  absl::StatusOr<std::string> Render(absl::Span<const ChatMessage> messages,
                                     bool add_generation_prompt) const;

  // One user message and the generation prompt: Render({{"user", user_text}}, true). A
  // template that refuses the text, or a text past the output bound, gives an empty
  // string; Render says why.
  std::string RenderUserTurn(absl::string_view user_text) const;

  ChatFamily family() const { return family_; }
  absl::string_view family_name() const;
  // The token that ends the assistant's turn, where generation stops: what the template
  // writes right after an assistant message ("<|im_end|>", "<|eot_id|>",
  // "<end_of_turn>", "<|end|>"), or eos where that is eos or nothing special follows.
  const std::string& end_of_turn() const { return end_of_turn_; }

 private:
  ChatTemplate();
  std::unique_ptr<jinja::Template> template_;
  std::string bos_, eos_, date_;
  std::tm now_{};  // what strftime_now formats
  ChatFamily family_ = ChatFamily::kOther;
  std::string end_of_turn_;
};

// The messages of a JSON array of 1 to max_messages objects {"role": string, "content":
// string} with no other keys (what the C ABI's stepgraph_session_encode_chat takes), parsed
// with bounds set before anything is built. InvalidArgument naming the message and field.
absl::StatusOr<std::vector<ChatMessage>> ChatMessagesFromJson(absl::string_view json,
                                                              int64_t max_messages);

}  // namespace sg

#endif  // STEPGRAPH_TEXT_CHAT_TEMPLATE_H_
