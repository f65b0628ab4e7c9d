// libFuzzer harness for a Hugging Face tokenizer folder and its chat template together:
// the input is tokenizer.json, tokenizer_config.json, chat_template.jinja and a text,
// separated by NUL bytes (absent parts are absent files). The folder becomes a tokenizer
// (Tokenizer::SpecFromTokenizerJsonText, Tokenizer::Create), its chat template is
// recognised (ChatTemplate::ForTokenizer), and the text is encoded plainly and as a user
// turn, then decoded: an error or a result, never a crash, leak or hang, and every id in
// the vocabulary. Seeds (corpus/tokenizer_json, from make_corpus.py) carry the shapes that
// used to crash or hang: deep nesting, patterns that match empty or backtrack, long
// special tokens against their prefixes, long runs of combining marks.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "stepgraph/text/chat_template.h"
#include "stepgraph/text/tokenizer.h"

namespace {

// The next NUL-separated part of *rest, or nullopt when nothing is left.
std::optional<absl::string_view> NextPart(absl::string_view* rest, bool* more) {
  if (!*more) return std::nullopt;
  const size_t nul = rest->find('\0');
  const absl::string_view part = rest->substr(0, nul);
  if (nul == absl::string_view::npos) {
    *more = false;
    *rest = absl::string_view();
  } else {
    rest->remove_prefix(nul + 1);
  }
  return part;
}

void CheckIds(const sg::Tokenizer& tok, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.vocab_size()) std::abort();
  }
  // Ids the tokenizer made always decode.
  if (!tok.Decode(ids).ok() || !tok.Decode(ids, {.skip_special = true}).ok()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view rest(reinterpret_cast<const char*>(data), size);
  bool more = true;
  const std::optional<absl::string_view> json = NextPart(&rest, &more);
  const std::optional<absl::string_view> config = NextPart(&rest, &more);
  const std::optional<absl::string_view> jinja = NextPart(&rest, &more);
  const absl::string_view text = NextPart(&rest, &more).value_or("");
  if (!json.has_value()) return 0;
  absl::StatusOr<sg::TokenizerSpec> spec =
      sg::Tokenizer::SpecFromTokenizerJsonText(*json, config, jinja, "fuzz");
  if (!spec.ok()) return 0;
  absl::StatusOr<std::unique_ptr<sg::Tokenizer>> tok = sg::Tokenizer::Create(*std::move(spec));
  if (!tok.ok()) return 0;
  for (bool parse_special : {true, false}) {
    absl::StatusOr<std::vector<int32_t>> ids =
        (*tok)->Encode(text, {.parse_special = parse_special});
    if (ids.ok()) CheckIds(**tok, *ids);
  }
  absl::StatusOr<sg::ChatTemplate> chat = sg::ChatTemplate::ForTokenizer(**tok, "26 Jul 2024");
  if (chat.ok()) {
    absl::StatusOr<std::vector<int32_t>> ids =
        (*tok)->Encode(chat->RenderUserTurn(text), {.add_special = false});
    if (ids.ok()) CheckIds(**tok, *ids);
  }
  return 0;
}
