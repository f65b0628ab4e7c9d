// Text ↔ token ids for the two BPE families that Llama-style models ship: byte-level BPE
// (GGUF `tokenizer.ggml.model` = "gpt2": GPT-2, Llama 3, Qwen2, SmolLM) and SentencePiece-
// style BPE with scores and byte fallback ("llama": Llama 2, Mistral, TinyLlama). The
// behaviour to match is Hugging Face transformers' tokenizer for the same files: its ids for
// every text, and its decoding of them.
//
// A TokenizerSpec is spelled in GGUF's terms (the `tokenizer.ggml.*` keys) so that a GGUF
// file maps onto it key by key; FromTokenizerJson fills the same spec from a Hugging Face
// folder, using the few fields below that GGUF has no key for.
#ifndef STEPGRAPH_TEXT_TOKENIZER_H_
#define STEPGRAPH_TEXT_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace sg {

// GGUF `tokenizer.ggml.token_type` values.
enum class TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // special: <s>, <|im_end|>; matched whole in text, skipped on request
  kUserDefined = 4,  // added but not special: matched whole in text, always decoded
  kUnused = 5,
  kByte = 6,         // <0xNN> of SentencePiece byte fallback
};

struct TokenizerSpec {
  // tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece-style BPE).
  std::string model;
  // tokenizer.ggml.pre, for "gpt2": which pre-tokenizer split the merges were learned on
  // ("default", "gpt2", "smollm", "llama-bpe", "llama3", "qwen2", ...; see the .cc for all).
  // Ignored when pre_patterns is set.
  std::string pre;
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens; index = id
  std::vector<float> scores;         // tokenizer.ggml.scores (may be empty for "gpt2")
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type (TokenType; empty = normal)
  // tokenizer.ggml.merges, "left right", best first. Required for "gpt2"; for "llama" files
  // without merges they are derived from the scores as transformers does.
  std::vector<std::string> merges;
  int32_t bos_id = -1;  // tokenizer.ggml.bos_token_id (-1: none)
  int32_t eos_id = -1;  // tokenizer.ggml.eos_token_id
  int32_t eot_id = -1;  // tokenizer.ggml.eot_token_id
  int32_t unk_id = -1;  // tokenizer.ggml.unknown_token_id
  int32_t pad_id = -1;  // tokenizer.ggml.padding_token_id
  bool add_bos = false;  // tokenizer.ggml.add_bos_token
  bool add_eos = false;  // tokenizer.ggml.add_eos_token
  // tokenizer.ggml.add_space_prefix ("llama"): the text gets a leading ▁ when it does not
  // start with a space (as transformers' Metaspace with prepend_scheme "first").
  bool add_space_prefix = true;
  std::string chat_template;  // tokenizer.chat_template (may be empty)

  // ---- Not in GGUF: set by FromTokenizerJson from what tokenizer.json says. ----
  // Regexes applied in order, each splitting every piece into matches and the text between
  // them (the "isolated" split). Empty: the patterns that `pre` names.
  std::vector<std::string> pre_patterns;
  // "llama" only: a ▁ is put before every piece between special tokens, even one that
  // already starts with a space (the older Prepend + Replace normalizer of Llama 2's files).
  bool space_prefix_every_piece = false;
  // A pre-token that is itself in the vocabulary is taken whole (Llama 3's files).
  bool ignore_merges = false;
  // "llama" only: characters missing from the vocabulary become <0xNN> tokens.
  bool byte_fallback = true;
  // Text between special tokens is put in Unicode NFC first (Qwen2's files ask for it).
  bool normalize_nfc = false;
};

// The work one Encode does, counted for tests of its complexity and for benchmarks: each
// count grows at most in proportion to the text (NFC: n log n), whatever the text is.
struct EncodeWork {
  int64_t special_steps = 0;  // automaton steps finding special tokens written in the text
  int64_t regex_matches = 0;  // pre-tokenizer pattern matches run
  int64_t regex_steps = 0;    // PCRE2 match-limit units those matches were allowed
  int64_t nfc_steps = 0;      // code points decomposed, compared and composed by NFC
};

struct EncodeOptions {
  bool add_special = true;    // add bos / eos where the spec asks for them
  bool parse_special = true;  // control tokens written in the text become their ids
  EncodeWork* work = nullptr;  // when set, Encode adds its work to it
};

struct DecodeOptions {
  bool skip_special = false;  // leave out control tokens (bos, eos, <|im_end|>, ...)
};

class Tokenizer {
 public:
  // Validates the spec (sizes, ids in range, merges naming tokens of the vocabulary, bounded
  // lengths, a known model and pre-tokenizer) and builds the tables.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(TokenizerSpec spec);

  // A Hugging Face tokenizer folder: `path` is the folder or its tokenizer.json; the
  // tokenizer_config.json (and chat_template.jinja) beside it are read when present.
  // tokenizer.json may be at most 64 MiB, hold at most 2^22 JSON values and nest at most
  // 64 deep; its config and template 16 MiB. Files past a bound are refused before
  // anything is built from them.
  static absl::StatusOr<TokenizerSpec> SpecFromTokenizerJson(const std::string& path);
  // The same from the files' contents (nullopt: the file is absent); `source` stands for
  // the folder in messages.
  static absl::StatusOr<TokenizerSpec> SpecFromTokenizerJsonText(
      absl::string_view tokenizer_json, std::optional<absl::string_view> tokenizer_config,
      std::optional<absl::string_view> chat_template, absl::string_view source);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromTokenizerJson(const std::string& path);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Text must be UTF-8. Thread-safe. Time and memory grow linearly with the text (n log n
  // for NFC), whatever it holds: special tokens are found in one pass, and the
  // pre-tokenizer's patterns get a budget of 2^20 + 128 match steps a byte each; a pattern
  // that needs more (one from a tokenizer.json that backtracks catastrophically, such as
  // (a+)+b) is InvalidArgument naming the pattern.
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              const EncodeOptions& options = {}) const;
  // Invalid UTF-8 in the decoded bytes becomes U+FFFD. Thread-safe.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     const DecodeOptions& options = {}) const;

  const TokenizerSpec& spec() const;
  int32_t vocab_size() const;
  bool IsControl(int32_t id) const;  // skipped by DecodeOptions::skip_special
  // The id of a token written exactly so (e.g. "<|im_end|>"), or -1.
  int32_t TokenId(absl::string_view token) const;

  // Appends the bytes one token stands for (nothing for a skipped control token), before
  // the UTF-8 of the whole sequence is checked; used by TokenStreamDecoder.
  absl::Status AppendTokenBytes(int32_t id, const DecodeOptions& options,
                                std::string* bytes) const;
  // Whether decoding drops one leading space (SentencePiece's marker before the text).
  bool strips_leading_space() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Turns ids into text as they are generated. Each Push returns only whole UTF-8 characters;
// the bytes of a character split over tokens wait for the rest. The concatenation of every
// Push and the final Finish equals Tokenizer::Decode of all the ids.
class TokenStreamDecoder {
 public:
  explicit TokenStreamDecoder(const Tokenizer& tokenizer, DecodeOptions options = {});
  absl::StatusOr<std::string> Push(int32_t id);
  // The bytes still held (an unfinished character) as U+FFFD; the decoder starts over.
  std::string Finish();

 private:
  const Tokenizer& tokenizer_;
  DecodeOptions options_;
  std::string pending_;  // bytes not yet returned
  bool started_ = false;  // whether any byte was produced (for the leading-space strip)
};

// Bytes → text, each invalid sequence replaced by U+FFFD (one per maximal invalid subpart,
// as WHATWG and Rust's from_utf8_lossy do).
std::string Utf8Lossy(absl::string_view bytes);

// The tokenizer of the model at `path`: a folder with tokenizer.json, or a GGUF file.
// NotFound, saying where it looked, when the model has none.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadModelTokenizer(const std::string& path);

}  // namespace sg

#endif  // STEPGRAPH_TEXT_TOKENIZER_H_
