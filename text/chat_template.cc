// Recognising a chat template's family and rendering one user turn; see chat_template.h.
#include "stepgraph/text/chat_template.h"

#include <ctime>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace {

constexpr size_t kMaxTemplateBytes = size_t{1} << 20;

// The string literals inside the template's {{ }} and {% %} tags, unescaped as Jinja does;
// `spans` (optional) receives where each is in the template, quotes included.
using LiteralSpan = std::pair<size_t, size_t>;  // [begin, end) in the template's text
absl::StatusOr<std::vector<std::string>> StringLiterals(absl::string_view t,
                                                        std::vector<LiteralSpan>* spans = nullptr) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < t.size()) {
    const size_t open = t.find('{', i);
    if (open == absl::string_view::npos || open + 1 >= t.size()) break;
    const char kind = t[open + 1];
    if (kind == '#') {  // a comment
      const size_t close = t.find("#}", open + 2);
      if (close == absl::string_view::npos) return absl::InvalidArgumentError("chat template: unclosed {#");
      i = close + 2;
      continue;
    }
    if (kind != '{' && kind != '%') {
      i = open + 1;
      continue;
    }
    const char end = kind == '{' ? '}' : '%';
    size_t k = open + 2;
    bool closed = false;
    while (k < t.size()) {
      const char c = t[k];
      if (c == '\'' || c == '"') {
        std::string lit;
        size_t j = k + 1;
        for (; j < t.size() && t[j] != c; ++j) {
          if (t[j] == '\\' && j + 1 < t.size()) {
            const char e = t[++j];
            switch (e) {
              case 'n': lit.push_back('\n'); break;
              case 't': lit.push_back('\t'); break;
              case 'r': lit.push_back('\r'); break;
              case '\\': case '\'': case '"': lit.push_back(e); break;
              default: lit.push_back('\\'); lit.push_back(e);
            }
          } else {
            lit.push_back(t[j]);
          }
        }
        if (j >= t.size()) return absl::InvalidArgumentError("chat template: unclosed string literal");
        out.push_back(std::move(lit));
        if (spans != nullptr) spans->emplace_back(k, j + 1);
        k = j + 1;
        continue;
      }
      if (c == end && k + 1 < t.size() && t[k + 1] == '}') {
        closed = true;
        k += 2;
        break;
      }
      ++k;
    }
    if (!closed) return absl::InvalidArgumentError("chat template: unclosed tag");
    i = k;
  }
  return out;
}

// Python's str.strip(), which Jinja's trim and .strip() call.
bool IsPythonSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// The code point starting at s[i] and its length; invalid bytes count as themselves.
uint32_t CodePointAt(absl::string_view s, size_t i, size_t* len) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  size_t n = b0 < 0x80 ? 1 : b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : b0 >= 0xC0 ? 2 : 1;
  if (i + n > s.size()) n = 1;
  uint32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  *len = n;
  return cp;
}

absl::string_view PythonStrip(absl::string_view s) {
  size_t b = 0, len;
  while (b < s.size() && IsPythonSpace(CodePointAt(s, b, &len))) b += len;
  size_t e = s.size();
  while (e > b) {
    size_t start = e - 1;  // back to the first byte of the last character
    while (start > b && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
    if (!IsPythonSpace(CodePointAt(s, start, &len))) break;
    e = start;
  }
  return s.substr(b, e - b);
}

// Whether the template strips the message content (`content | trim`, `content.strip()`).
bool StripsContent(absl::string_view t) {
  for (size_t i = t.find("content"); i != absl::string_view::npos; i = t.find("content", i + 1)) {
    size_t k = i + 7;
    while (k < t.size() && (t[k] == '\'' || t[k] == '"' || t[k] == ']' || t[k] == ' ')) ++k;
    if (t.substr(k).substr(0, 8) == ".strip()") return true;
    if (k < t.size() && t[k] == '|') {
      ++k;
      while (k < t.size() && t[k] == ' ') ++k;
      if (t.substr(k).substr(0, 4) == "trim") return true;
    }
  }
  return false;
}

// "26 Jul 2024" from `set date_string = "26 Jul 2024"`, or empty.
std::string DefaultDate(absl::string_view t) {
  const size_t at = t.find("set date_string = ");
  if (at == absl::string_view::npos) return "";
  size_t k = at + 18;
  if (k >= t.size() || (t[k] != '"' && t[k] != '\'')) return "";
  const size_t end = t.find(t[k], k + 1);
  return end == absl::string_view::npos ? "" : std::string(t.substr(k + 1, end - k - 1));
}

// Today's local date as transformers' strftime_now("%d %b %Y") writes it (datetime.now()).
std::string Today() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  char buffer[32];
  if (localtime_r(&now, &local) == nullptr || std::strftime(buffer, sizeof(buffer), "%d %b %Y", &local) == 0) {
    return "";
  }
  return buffer;
}

// The system turn of a Llama 3.1-style template for a conversation without system message
// or tools: the header, the knowledge cutoff line, the date, and nothing else.
absl::StatusOr<std::string> DatedSystemTurn(absl::string_view t, const std::vector<std::string>& literals,
                                            absl::string_view date_string) {
  std::string knowledge;
  for (const std::string& l : literals) {
    if (absl::StartsWith(l, "Cutting Knowledge Date:")) knowledge = l;
  }
  if (knowledge.empty() || !absl::StrContains(t, R"("Today Date: " + date_string + "\n\n")") ||
      !absl::StrContains(t, R"("<|start_header_id|>system<|end_header_id|>\n\n")")) {
    return absl::InvalidArgumentError(
        "chat template: a Llama 3 template with a dated system turn in an unknown layout");
  }
  std::string date(date_string);
  if (date.empty()) date = absl::StrContains(t, "strftime_now") ? Today() : DefaultDate(t);
  if (date.empty()) {
    return absl::InvalidArgumentError("chat template: the template writes a date but none is known");
  }
  return absl::StrCat("<|start_header_id|>system<|end_header_id|>\n\n", knowledge, "Today Date: ", date,
                      "\n\n<|eot_id|>");
}

// Whether the template writes "[INST]", then the message's content, then "[/INST]": the
// first literal holding [INST] comes before the first literal holding [/INST] after it
// (in one literal, [INST] first), and "content" is read between the two. Templates that
// write them otherwise would render as something other than what stepgraph writes.
absl::Status CheckInstOrder(absl::string_view t, const std::vector<std::string>& literals,
                            const std::vector<LiteralSpan>& spans) {
  const auto refuse = [](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chat template: ", why,
        "; stepgraph renders [INST] templates only as \"[INST]\" + content + \"[/INST]\""));
  };
  size_t open = literals.size();
  for (size_t i = 0; i < literals.size() && open == literals.size(); ++i) {
    if (literals[i].find("[INST]") != std::string::npos) open = i;
  }
  if (open == literals.size()) return refuse("no literal writes [INST]");
  const std::string& first = literals[open];
  if (first.find("[/INST]") != std::string::npos) {
    return refuse(first.find("[/INST]") < first.find("[INST]")
                      ? "[/INST] is written before [INST]"
                      : "[INST] and [/INST] are written together, with no content between");
  }
  for (size_t i = 0; i < open; ++i) {
    if (literals[i].find("[/INST]") != std::string::npos) {
      return refuse("[/INST] is written before [INST]");
    }
  }
  for (size_t i = open + 1; i < literals.size(); ++i) {
    if (literals[i].find("[/INST]") == std::string::npos) continue;
    const size_t from = spans[open].second, to = spans[i].first;
    if (to <= from || t.substr(from, to - from).find("content") == absl::string_view::npos) {
      return refuse("the message's content is not written between [INST] and [/INST]");
    }
    return absl::OkStatus();
  }
  return refuse("no literal writes [/INST] after [INST]");
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Create(absl::string_view text, absl::string_view bos_token,
                                                  absl::string_view eos_token,
                                                  absl::string_view date_string) {
  if (text.empty()) return absl::InvalidArgumentError("the model has no chat template");
  if (text.size() > kMaxTemplateBytes) {
    return absl::InvalidArgumentError(absl::StrCat("chat template of ", text.size(),
                                                   " bytes (at most ", kMaxTemplateBytes, ")"));
  }
  std::vector<LiteralSpan> spans;
  SG_ASSIGN_OR_RETURN(std::vector<std::string> literals, StringLiterals(text, &spans));
  auto any_literal = [&](absl::string_view needle) {
    for (const std::string& l : literals) {
      if (absl::StrContains(l, needle)) return true;
    }
    return false;
  };
  const std::string bos = absl::StrContains(text, "bos_token") ? std::string(bos_token) : "";
  ChatTemplate ct;
  if (any_literal("<|im_start|>")) {
    ct.family_ = ChatFamily::kChatMl;
    // A system turn written whole in one literal is the default the template inserts when
    // the conversation has none (SmolLM2, Qwen2).
    for (const std::string& l : literals) {
      if (absl::StartsWith(l, "<|im_start|>system\n") && absl::EndsWith(l, "<|im_end|>\n") &&
          l.size() > 19 + 11 && l.find("<|im_start|>", 1) == std::string::npos) {
        ct.prefix_ = l;
        break;
      }
    }
    absl::StrAppend(&ct.prefix_, "<|im_start|>user\n");
    ct.suffix_ = "<|im_end|>\n<|im_start|>assistant\n";
    ct.end_of_turn_ = "<|im_end|>";
  } else if (any_literal("<|start_header_id|>")) {
    ct.family_ = ChatFamily::kLlama3;
    ct.prefix_ = bos;
    if (absl::StrContains(text, "Cutting Knowledge Date")) {
      // Llama 3.1 and later always write a system turn: the knowledge cutoff and a date.
      SG_ASSIGN_OR_RETURN(std::string system, DatedSystemTurn(text, literals, date_string));
      absl::StrAppend(&ct.prefix_, system);
    }
    absl::StrAppend(&ct.prefix_, "<|start_header_id|>user<|end_header_id|>\n\n");
    ct.suffix_ = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
    ct.trim_user_ = true;  // the Llama 3 template writes `message['content'] | trim`
    if (!StripsContent(text)) {
      return absl::InvalidArgumentError(
          "chat template: a Llama 3 template that does not trim the message is not supported");
    }
    ct.end_of_turn_ = "<|eot_id|>";
  } else if (any_literal("[INST]") && any_literal("[/INST]")) {
    if (absl::StrContains(text, "default_system") || absl::StrContains(text, "DEFAULT_SYSTEM")) {
      return absl::InvalidArgumentError(
          "chat template: an [INST] template with a default system prompt is not supported");
    }
    // Rendered as "[INST]" + content + "[/INST]": refused unless the template writes them
    // in that order, [INST] first, the message's content between, [/INST] after.
    SG_RETURN_IF_ERROR(CheckInstOrder(text, literals, spans));
    ct.family_ = ChatFamily::kInst;
    // The spacing varies ("[INST] " + text + " [/INST]" in Mistral v0.1 and Llama 2,
    // "[/INST]" without the space in v0.3): take it from the literals.
    std::string open, close;
    for (const std::string& l : literals) {
      const size_t o = l.find("[INST]");
      if (o != std::string::npos) {
        const std::string piece = l.substr(o, l.find("[/INST]") == std::string::npos ? std::string::npos
                                                                                     : l.find("[/INST]") - o);
        if (!open.empty() && open != piece) {
          return absl::InvalidArgumentError(absl::StrCat(
              "chat template: [INST] is written two ways (\"", open, "\", \"", piece, "\")"));
        }
        open = piece;
      }
      const size_t c = l.find("[/INST]");
      if (c != std::string::npos) {
        const size_t from = l.find("[INST]") == std::string::npos ? 0 : l.find("[INST]") + open.size();
        const std::string piece = l.substr(from, c + 7 - from);
        if (!close.empty() && close != piece) {
          return absl::InvalidArgumentError(absl::StrCat(
              "chat template: [/INST] is written two ways (\"", close, "\", \"", piece, "\")"));
        }
        close = piece;
      }
    }
    ct.prefix_ = absl::StrCat(bos, open);
    ct.suffix_ = close;
    ct.trim_user_ = StripsContent(text);
    ct.end_of_turn_ = std::string(eos_token);
    if (ct.end_of_turn_.empty()) {
      return absl::InvalidArgumentError("chat template: an [INST] template needs an eos token");
    }
  } else {
    return absl::InvalidArgumentError(
        "chat template not recognised: stepgraph renders the ChatML (<|im_start|>), Llama 3 "
        "(<|start_header_id|>) and Llama 2 / Mistral ([INST]) families");
  }
  return ct;
}

absl::StatusOr<ChatTemplate> ChatTemplate::ForTokenizer(const Tokenizer& tokenizer,
                                                        absl::string_view date_string) {
  const TokenizerSpec& spec = tokenizer.spec();
  auto name = [&](int32_t id) { return id >= 0 ? spec.tokens[id] : std::string(); };
  return Create(spec.chat_template, name(spec.bos_id), name(spec.eos_id), date_string);
}

std::string ChatTemplate::RenderUserTurn(absl::string_view user_text) const {
  return absl::StrCat(prefix_, trim_user_ ? PythonStrip(user_text) : user_text, suffix_);
}

absl::string_view ChatTemplate::family_name() const {
  switch (family_) {
    case ChatFamily::kChatMl: return "ChatML";
    case ChatFamily::kLlama3: return "Llama 3";
    case ChatFamily::kInst: return "[INST]";
  }
  return "?";
}

}  // namespace sg
