// libFuzzer harness for the tokenizer. The first byte picks what the rest is:
//   even: text, encoded with a trained byte-level BPE tokenizer (tests/fixtures), then
//         decoded whole and streamed: never crash, every streamed piece whole UTF-8, the
//         stream adding up to the whole decoding;
//   odd:  a GGUF file whose tokenizer.* metadata becomes a tokenizer (TokenizerSpecFromGguf,
//         Tokenizer::Create), which then encodes a fixed text: an error or a tokenizer,
//         never a crash, leak or hang.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "models/gguf.h"
#include "models/model_tokenizer.h"
#include "stepgraph/text/tokenizer.h"

namespace {

const sg::Tokenizer* TrainedTokenizer() {
  static const sg::Tokenizer* tok = [] {
    auto t = sg::Tokenizer::FromTokenizerJson(std::string(SG_FIXTURES_DIR) +
                                              "/tokenizer/bl_smollm");
    if (!t.ok()) std::abort();  // the fixture is part of the repository
    return t->release();
  }();
  return tok;
}

void Text(absl::string_view text) {
  const sg::Tokenizer& tok = *TrainedTokenizer();
  absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(text);
  if (!ids.ok()) return;
  for (int32_t id : *ids) {
    if (id < 0 || id >= tok.vocab_size()) std::abort();
  }
  absl::StatusOr<std::string> whole = tok.Decode(*ids);
  if (!whole.ok()) std::abort();  // ids it made itself always decode
  sg::TokenStreamDecoder stream(tok);
  std::string streamed;
  for (int32_t id : *ids) {
    absl::StatusOr<std::string> piece = stream.Push(id);
    if (!piece.ok() || sg::Utf8Lossy(*piece) != *piece) std::abort();
    streamed += *piece;
  }
  streamed += stream.Finish();
  if (streamed != *whole) std::abort();
}

void Gguf(absl::Span<const std::byte> bytes) {
  absl::StatusOr<sg::GgufFile> file = sg::GgufFile::Parse(bytes, "fuzz.gguf");
  if (!file.ok()) return;
  absl::StatusOr<sg::TokenizerSpec> spec = sg::TokenizerSpecFromGguf(*file);
  if (!spec.ok()) return;
  absl::StatusOr<std::unique_ptr<sg::Tokenizer>> tok = sg::Tokenizer::Create(*std::move(spec));
  if (!tok.ok()) return;
  absl::StatusOr<std::vector<int32_t>> ids = (*tok)->Encode("Hello, world! 123 héllo 世界");
  if (ids.ok()) (void)(*tok)->Decode(*ids);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool gguf = (data[0] & 1) != 0;
  ++data;
  --size;
  if (gguf) {
    Gguf({reinterpret_cast<const std::byte*>(data), size});
  } else {
    Text({reinterpret_cast<const char*>(data), size});
  }
  return 0;
}
