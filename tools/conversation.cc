// A conversation's turns around ChatTemplate's one user turn; see conversation.h.
#include "tools/conversation.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stepgraph/base/status.h"

namespace sg::cli {
namespace {

// Stands for the user's text while the template's own pieces are read around it: no
// template writes it, and Python's strip() keeps it whole.
constexpr char kUserMark[] = "\x01user\x02";
constexpr size_t kUserMarkSize = sizeof(kUserMark) - 1;

}  // namespace

absl::StatusOr<Conversation> Conversation::Create(absl::string_view template_text,
                                                  absl::string_view bos_token,
                                                  absl::string_view eos_token,
                                                  const std::optional<std::string>& system,
                                                  absl::string_view date_string) {
  SG_ASSIGN_OR_RETURN(ChatTemplate t,
                      ChatTemplate::Create(template_text, bos_token, eos_token, date_string));
  Conversation c(std::move(t));
  const std::string marked = c.template_.RenderUserTurn(kUserMark);
  const size_t at = marked.find(kUserMark);
  if (at == std::string::npos) {
    return absl::InternalError("chat template: the user's text is missing from its turn");
  }
  const std::string prefix = marked.substr(0, at);
  const size_t suffix = marked.size() - at - kUserMarkSize;
  c.default_prefix_ = at;
  c.start_ = prefix;
  // `text` as the template writes a message (trimmed where it trims the user's).
  auto as_written = [&](absl::string_view text) {
    const std::string r = c.template_.RenderUserTurn(text);
    return r.substr(at, r.size() - at - suffix);
  };
  auto ends_turn_header = [&](absl::string_view header) -> absl::Status {
    if (absl::EndsWith(prefix, header)) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("chat template: the ", c.template_.family_name(),
                                            " user turn does not open with '", header, "'"));
  };
  switch (c.template_.family()) {
    case ChatFamily::kChatMl:
      c.turn_ = std::string("<|im_start|>user\n");
      c.after_answer_ = std::string("\n");  // '<|im_end|>' + '\n' ends every message
      SG_RETURN_IF_ERROR(ends_turn_header(c.turn_));
      // A system message replaces the default system turn the template inserts.
      if (system.has_value()) {
        c.start_ = absl::StrCat("<|im_start|>system\n", *system, "<|im_end|>\n", c.turn_);
      }
      break;
    case ChatFamily::kLlama3: {
      c.turn_ = std::string("<|start_header_id|>user<|end_header_id|>\n\n");
      SG_RETURN_IF_ERROR(ends_turn_header(c.turn_));
      if (!system.has_value()) break;
      // Llama 3.1 and later always write a system turn (knowledge cutoff, date) and put
      // the system message at its end; Llama 3 writes one only for a system message.
      constexpr char kHeader[] = "<|start_header_id|>system<|end_header_id|>\n\n";
      const std::string message = as_written(*system);
      const size_t header = prefix.find(kHeader);
      if (header != std::string::npos) {
        const size_t end = prefix.find("<|eot_id|>", header);
        if (end == std::string::npos) {
          return absl::InternalError("chat template: the system turn has no <|eot_id|>");
        }
        c.start_ = absl::StrCat(prefix.substr(0, end), message, prefix.substr(end));
      } else {
        c.start_ = absl::StrCat(prefix.substr(0, prefix.size() - c.turn_.size()), kHeader,
                                message, "<|eot_id|>", c.turn_);
      }
      break;
    }
    case ChatFamily::kInst: {
      // Llama 2 writes bos before every user turn; Mistral once, at the start.
      const bool bos_each_turn = absl::StrContains(template_text, "bos_token + '[INST]") ||
                                 absl::StrContains(template_text, "bos_token + \"[INST]");
      c.turn_ = prefix;
      if (!bos_each_turn && !bos_token.empty() && absl::StartsWith(prefix, bos_token)) {
        c.turn_.erase(0, bos_token.size());
      }
      if (!system.has_value()) break;
      if (!absl::StrContains(template_text, "<<SYS>>")) {
        return absl::InvalidArgumentError(
            "chat template: this [INST] template keeps no system prompt at the start of a "
            "conversation (it refuses one, or moves it to the latest user turn, which a "
            "conversation kept in the KV cache cannot follow); chat without --system");
      }
      // Llama 2: the system block opens the first user message.
      c.system_in_user_ = absl::StrCat("<<SYS>>\n", *system, "\n<</SYS>>\n\n");
      break;
    }
  }
  return c;
}

absl::StatusOr<Conversation> Conversation::ForTokenizer(const Tokenizer& tokenizer,
                                                        const std::optional<std::string>& system) {
  const TokenizerSpec& spec = tokenizer.spec();
  auto name = [&](int32_t id) { return id >= 0 ? spec.tokens[id] : std::string(); };
  return Create(spec.chat_template, name(spec.bos_id), name(spec.eos_id), system);
}

std::string Conversation::UserAndPrompt(absl::string_view user) const {
  return template_.RenderUserTurn(user).substr(default_prefix_);
}

std::string Conversation::Start(absl::string_view user) const {
  if (!system_in_user_.empty()) {
    return template_.RenderUserTurn(absl::StrCat(system_in_user_, user));
  }
  return absl::StrCat(start_, UserAndPrompt(user));
}

std::string Conversation::Next(absl::string_view user, bool answer_closed) const {
  return absl::StrCat(answer_closed ? "" : end_of_turn(), after_answer_, turn_,
                      UserAndPrompt(user));
}

}  // namespace sg::cli
