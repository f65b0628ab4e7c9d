// The tokenizer: special tokens found in the text first, then the pre-tokenizer's regex
// splits (PCRE2, Unicode classes and lookahead), then BPE over each piece, cached per piece.
// Every rule below follows what transformers' tokenizer (the tokenizers library under it)
// does with the same vocabulary, since that is the reference the ids are checked against.
#include "stepgraph/text/tokenizer.h"
#include "text/unicode_nfc.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <new>
#include <queue>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/unique_handle.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace {

constexpr int64_t kMaxTokens = int64_t{1} << 22;   // the largest vocabularies are ~260k
constexpr int64_t kMaxMerges = int64_t{1} << 22;
constexpr size_t kMaxTokenBytes = 4096;
constexpr size_t kMaxPatternBytes = 4096;
constexpr size_t kMaxPrePatterns = 16;
constexpr size_t kMaxTextBytes = size_t{1} << 30;
constexpr size_t kMaxCachedWordBytes = 256;  // longer pieces are rare and not worth keeping
constexpr size_t kMaxCacheEntries = 1 << 16;
constexpr char kSpaceMarker[] = "\xE2\x96\x81";  // ▁ U+2581, SentencePiece's space

// The pre-tokenizer patterns by the names GGUF files give them (tokenizer.ggml.pre).
// transformers builds the same splits for these names; any other name it leaves to the
// GPT-2 pattern, which is right only for the names listed with it.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr char kLlama3Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kQwen2Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kTekkenPattern[] =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kGpt4oPattern[] =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct PreName {
  const char* name;
  const char* pattern;
};
// "smollm": llama.cpp also splits digits one by one for it, but transformers (the parity
// reference) reads such a file with the GPT-2 pattern alone, and the ids differ on text like
// "\n\n0"; the ids follow transformers.
constexpr PreName kPreNames[] = {
    {"default", kGpt2Pattern},      {"gpt2", kGpt2Pattern},
    {"smollm", kGpt2Pattern},       {"llama3", kLlama3Pattern},
    {"llama-v3", kLlama3Pattern},   {"llama-bpe", kLlama3Pattern},
    {"falcon3", kLlama3Pattern},    {"smaug-bpe", kLlama3Pattern},
    {"dbrx", kLlama3Pattern},       {"pixtral", kLlama3Pattern},
    {"qwen2", kQwen2Pattern},       {"deepseek-r1-qwen", kQwen2Pattern},
    {"megrez", kQwen2Pattern},      {"tekken", kTekkenPattern},
    {"gpt-4o", kGpt4oPattern},      {"llama4", kGpt4oPattern},
};

// ---- UTF-8 --------------------------------------------------------------------------

// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 if it is invalid or
// cut short; *needed says how many bytes a valid prefix running into the end still needs.
int Utf8SequenceAt(absl::string_view s, size_t i, int* needed) {
  *needed = 0;
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return 1;
  int len;
  uint8_t lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (int k = 1; k < len; ++k) {
    if (i + k >= s.size()) {
      *needed = len - k;
      return 0;
    }
    const auto b = static_cast<uint8_t>(s[i + k]);
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return -k;  // invalid after k good bytes
  }
  return len;
}

uint32_t DecodeUtf8(absl::string_view s, size_t i, int len) {
  const auto b = [&](int k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[i + k])); };
  switch (len) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

// The index of the first byte that is not valid UTF-8, or npos.
size_t FirstInvalidUtf8(absl::string_view s) {
  int needed;
  for (size_t i = 0; i < s.size();) {
    const int len = Utf8SequenceAt(s, i, &needed);
    if (len <= 0) return i;
    i += len;
  }
  return absl::string_view::npos;
}

// Code points of a valid UTF-8 string, as (offset, length) pairs.
void Utf8Chars(absl::string_view s, std::vector<std::pair<uint32_t, uint32_t>>* chars) {
  chars->clear();
  int needed;
  for (size_t i = 0; i < s.size();) {
    const int len = std::max(1, Utf8SequenceAt(s, i, &needed));
    chars->emplace_back(static_cast<uint32_t>(i), static_cast<uint32_t>(len));
    i += len;
  }
}

// ---- GPT-2's byte ↔ character table ---------------------------------------------------
// Byte-level BPE spells every byte as a printable character so that vocabularies stay text:
// printable Latin-1 bytes stand for themselves, the other 68 take U+0100 onwards in order.
struct ByteLevelTable {
  std::array<std::string, 256> byte_to_utf8;
  absl::flat_hash_map<uint32_t, uint8_t> char_to_byte;

  ByteLevelTable() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      const uint32_t cp = printable ? b : next++;
      AppendUtf8(cp, &byte_to_utf8[b]);
      char_to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};

const ByteLevelTable& ByteLevel() {
  static const ByteLevelTable* table = new ByteLevelTable();
  return *table;
}

// The byte-level spelling of raw text.
std::string ToByteLevel(absl::string_view text) {
  const ByteLevelTable& t = ByteLevel();
  std::string out;
  out.reserve(text.size() * 2);
  for (char c : text) out += t.byte_to_utf8[static_cast<uint8_t>(c)];
  return out;
}

// The bytes a byte-level spelling stands for; false if a character is outside the table
// (such tokens, added ones like "<think> x", stand for their own UTF-8).
bool FromByteLevel(absl::string_view spelled, std::string* bytes) {
  const ByteLevelTable& t = ByteLevel();
  std::string out;
  int needed;
  for (size_t i = 0; i < spelled.size();) {
    const int len = Utf8SequenceAt(spelled, i, &needed);
    if (len <= 0) return false;
    auto it = t.char_to_byte.find(DecodeUtf8(spelled, i, len));
    if (it == t.char_to_byte.end()) return false;
    out.push_back(static_cast<char>(it->second));
    i += len;
  }
  *bytes = std::move(out);
  return true;
}

// "<0xNN>" → NN, or -1.
int ByteTokenValue(absl::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = token[k];
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return -1;
    v = v * 16 + d;
  }
  return v;
}

// ---- PCRE2 ----------------------------------------------------------------------------

using UniqueCode = UniqueHandle<pcre2_code*, pcre2_code_free, "pcre2_code_free">;
using UniqueMatchData =
    UniqueHandle<pcre2_match_data*, pcre2_match_data_free, "pcre2_match_data_free">;
using UniqueMatchContext =
    UniqueHandle<pcre2_match_context*, pcre2_match_context_free, "pcre2_match_context_free">;
using UniqueJitStack =
    UniqueHandle<pcre2_jit_stack*, pcre2_jit_stack_free, "pcre2_jit_stack_free">;

std::string PcreErrorText(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) return absl::StrCat("error ", code);
  return reinterpret_cast<const char*>(buffer);
}

// A pattern quoted in a message: at most 100 bytes of it.
std::string QuotedPattern(absl::string_view p) {
  if (p.size() <= 100) return absl::StrCat("\"", p, "\"");
  size_t cut = 100;
  while (cut > 0 && (static_cast<uint8_t>(p[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat("\"", p.substr(0, cut), "...\"");
}

// A compiled pre-tokenizer pattern and its text, for messages.
struct Pattern {
  UniqueCode code;
  std::string text;
};

absl::StatusOr<Pattern> CompilePattern(absl::string_view pattern) {
  if (pattern.size() > kMaxPatternBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer: pre-tokenizer pattern of ", pattern.size(), " bytes (at most ",
        kMaxPatternBytes, " allowed)"));
  }
  int error = 0;
  PCRE2_SIZE offset = 0;
  // UTF: patterns and text are UTF-8; UCP: \s, \w, \d and [[:classes:]] follow Unicode.
  // MULTILINE: ^ and $ match at every line, as in the Ruby syntax of Oniguruma, which the
  // reference compiles tokenizer.json's patterns with.
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &offset,
                                   nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer: pre-tokenizer pattern ", QuotedPattern(pattern),
        " does not compile at offset ", offset, ": ", PcreErrorText(error)));
  }
  // JIT is an optimisation only: a build of PCRE2 without it still matches.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return Pattern{UniqueCode(code), std::string(pattern)};
}

// Bounds on the work of the pre-tokenizer's patterns, in PCRE2's match-limit units (about
// one per backtracking step). A pattern from a tokenizer.json may backtrack exponentially
// ((a+)+b) or polynomially on the right text; instead of trusting it, each Encode gets a
// budget proportional to its text, and every match is charged what it was allowed.
// A match first runs with kFirstMatchLimit and, when that is not enough, again with twice
// the limit, so one that needs w units is charged less than 4w + kFirstMatchLimit. Real
// patterns take one match of under 32 units per piece (tokenizer_bench's counters: about
// 7 units a byte on text, 32 on a pattern that splits every byte, no retry on the test
// corpus), so the budget is at least four times what they need, and a pattern that
// backtracks catastrophically is stopped after work linear in the text (about 0.3 s of
// CPU per MiB).
constexpr uint32_t kFirstMatchLimit = 32;
constexpr int64_t kRegexBudgetBase = int64_t{1} << 20;
constexpr int64_t kRegexBudgetPerByte = 128;
// The interpreter's backtracking memory, where the JIT is not available (KiB).
constexpr uint32_t kHeapLimitKiB = 64 * 1024;

// One Encode call's matching state (PCRE2 match data is not shareable between threads).
struct Matcher {
  UniqueMatchData data;
  UniqueMatchContext context;
  UniqueJitStack jit_stack;
  int64_t budget = 0;         // match-limit units left for this Encode
  size_t text_bytes = 0;      // what the budget was given for, for messages
  int64_t regex_matches = 0;  // counted for EncodeWork
  int64_t regex_steps = 0;
  int64_t nfc_steps = 0;
};

absl::StatusOr<Matcher> MakeMatcher(size_t text_bytes, size_t num_patterns) {
  Matcher m;
  m.data.reset(pcre2_match_data_create(1, nullptr));
  m.context.reset(pcre2_match_context_create(nullptr));
  // Long runs of one class (10k spaces) need more backtracking stack than JIT's default 32 KiB.
  m.jit_stack.reset(pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr));
  if (!m.data || !m.context) return absl::ResourceExhaustedError("tokenizer: out of memory for PCRE2");
  if (m.jit_stack) pcre2_jit_stack_assign(m.context.get(), nullptr, m.jit_stack.get());
  pcre2_set_heap_limit(m.context.get(), kHeapLimitKiB);
  m.text_bytes = text_bytes;
  m.budget = kRegexBudgetBase + kRegexBudgetPerByte * static_cast<int64_t>(text_bytes) *
                                    static_cast<int64_t>(std::max<size_t>(1, num_patterns));
  return m;
}

// The first match of `p` in `piece` at or after `start`: true with [*begin, *end), false
// when there is none; InvalidArgument naming the pattern when its budget or memory runs
// out (see kFirstMatchLimit).
absl::StatusOr<bool> FindMatch(const Pattern& p, Matcher& m, absl::string_view piece,
                               size_t start, size_t* begin, size_t* end) {
  uint32_t limit = kFirstMatchLimit;
  for (;;) {
    const uint32_t allowed = static_cast<uint32_t>(std::min<int64_t>(limit, m.budget));
    pcre2_set_match_limit(m.context.get(), allowed);
    const int rc = pcre2_match(p.code.get(), reinterpret_cast<PCRE2_SPTR>(piece.data()),
                               piece.size(), start, PCRE2_NO_UTF_CHECK, m.data.get(),
                               m.context.get());
    ++m.regex_matches;
    m.regex_steps += allowed;
    m.budget -= allowed;
    if (rc >= 0) {
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data.get());
      *begin = ov[0];
      *end = ov[1];
      return true;
    }
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc == PCRE2_ERROR_MATCHLIMIT && allowed == limit && m.budget > 0 &&
        limit <= (uint32_t{1} << 30)) {
      limit *= 2;
      continue;
    }
    if (rc == PCRE2_ERROR_MATCHLIMIT) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer: pre-tokenizer pattern ", QuotedPattern(p.text),
          " backtracks catastrophically on this text: splitting its ", m.text_bytes,
          " bytes needs more than the ", m.regex_steps,
          " match steps allowed for them (the limit grows with the text)"));
    }
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_HEAPLIMIT ||
        rc == PCRE2_ERROR_DEPTHLIMIT) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer: pre-tokenizer pattern ", QuotedPattern(p.text),
          " needs more backtracking memory than allowed on this text (", PcreErrorText(rc),
          ")"));
    }
    return absl::InternalError(absl::StrCat("tokenizer: pre-tokenizer pattern ",
                                            QuotedPattern(p.text),
                                            " failed to match: ", PcreErrorText(rc)));
  }
}

// Splits `piece` into the matches of `p` and the text between them, in order, as the
// reference's Split with the Isolated behaviour does over Oniguruma's find_iter: each match
// and each stretch between matches is a piece; a match may be empty (a* or $ match
// nothing) and still splits there, except where the previous match ended; empty pieces
// are dropped.
absl::Status SplitIsolated(const Pattern& p, Matcher& m, absl::string_view piece,
                           std::vector<absl::string_view>* out) {
  const size_t n = piece.size();
  size_t search = 0, prev = 0;
  size_t last_match_end = absl::string_view::npos;
  while (search <= n) {
    size_t b = 0, e = 0;
    SG_ASSIGN_OR_RETURN(const bool found, FindMatch(p, m, piece, search, &b, &e));
    if (!found) break;
    if (b == e && e == last_match_end) {
      // Not the same empty match twice: search again one character on.
      if (search >= n) break;
      int needed;
      search += static_cast<size_t>(std::max(1, Utf8SequenceAt(piece, search, &needed)));
      continue;
    }
    search = last_match_end = e;
    if (b > prev) out->push_back(piece.substr(prev, b - prev));
    if (e > b) out->push_back(piece.substr(b, e - b));
    prev = e;
  }
  if (prev < n) out->push_back(piece.substr(prev));
  return absl::OkStatus();
}

// ---- special tokens written in the text -------------------------------------------------

// The tokens matched whole in text (control tokens when special tokens are parsed,
// user-defined ones always): at each position, the longest of each kind that starts there.
// Trying a trie at every position costs up to the longest token per position (a 4 KiB
// token against a prompt of its prefixes: 4096 steps a byte). Instead, an Aho-Corasick
// automaton over the reversed tokens reads the text from right to left: after reading
// text[i] its state is the longest reversed token prefix that the text from i spells
// backwards, and the longest token starting at i is the longest output of that state.
// Every position costs O(1) amortised steps.
class SpecialTokens {
 public:
  struct Match {
    int32_t len = 0;  // 0: none
    int32_t id = -1;
  };

  // A later token of the same spelling and kind replaces an earlier one.
  void Add(absl::string_view token, int32_t id, bool control) {
    int32_t node = 0;
    for (size_t k = token.size(); k-- > 0;) {
      const uint64_t key = Key(node, static_cast<uint8_t>(token[k]));
      auto it = edges_.find(key);
      if (it == edges_.end()) {
        nodes_.push_back(Node{});
        it = edges_.emplace(key, static_cast<int32_t>(nodes_.size() - 1)).first;
      }
      node = it->second;
    }
    (control ? nodes_[node].control : nodes_[node].user) = {static_cast<int32_t>(token.size()), id};
    max_len_ = std::max(max_len_, token.size());
  }

  // Failure links and each state's longest outputs, breadth first (a state's failure is
  // shallower, so it is done before the state).
  void Build() {
    std::vector<std::vector<std::pair<uint8_t, int32_t>>> children(nodes_.size());
    for (const auto& [key, child] : edges_) {
      children[key >> 8].emplace_back(static_cast<uint8_t>(key & 0xFF), child);
    }
    std::vector<int32_t> queue = {0};
    for (size_t q = 0; q < queue.size(); ++q) {
      const int32_t u = queue[q];
      for (const auto& [byte, v] : children[u]) {
        int32_t f = 0;
        if (u != 0) {
          f = nodes_[u].fail;
          int64_t ignored = 0;
          f = Step(f, byte, &ignored);
        }
        Node& node = nodes_[v];
        node.fail = f;
        if (node.control.len == 0) node.control = nodes_[f].control;
        if (node.user.len == 0) node.user = nodes_[f].user;
        queue.push_back(v);
      }
    }
  }

  bool empty() const { return nodes_.size() == 1; }
  size_t max_len() const { return max_len_; }

  // The state after reading `byte` in state `node`; *steps counts the transitions taken.
  int32_t Step(int32_t node, uint8_t byte, int64_t* steps) const {
    for (;;) {
      ++*steps;
      auto it = edges_.find(Key(node, byte));
      if (it != edges_.end()) return it->second;
      if (node == 0) return 0;
      node = nodes_[node].fail;
    }
  }
  const Match& control(int32_t state) const { return nodes_[state].control; }
  const Match& user(int32_t state) const { return nodes_[state].user; }

 private:
  struct Node {
    int32_t fail = 0;
    Match control, user;  // the longest output of each kind
  };
  static uint64_t Key(int32_t node, uint8_t byte) {
    return (static_cast<uint64_t>(node) << 8) | byte;
  }

  std::vector<Node> nodes_ = {Node{}};
  absl::flat_hash_map<uint64_t, int32_t> edges_;
  size_t max_len_ = 0;
};

// The longest special tokens starting at each position of one text, read in windows so
// that memory stays bounded whatever the text's size: a window's states come from a scan
// that starts max_len bytes after it, enough for the automaton to be in step.
class SpecialTokenScan {
 public:
  SpecialTokenScan(const SpecialTokens& tokens, absl::string_view text)
      : tokens_(tokens), text_(text),
        window_(std::max<size_t>(size_t{1} << 16, 4 * tokens.max_len())) {}

  // The token at text[i] (positions asked in increasing order), or len 0. A user-defined
  // token is taken over a control one only when longer, as the two tries did.
  SpecialTokens::Match At(size_t i, bool parse_special) {
    if (i < begin_ || i >= begin_ + states_.size()) Scan(i);
    const int32_t state = states_[i - begin_];
    SpecialTokens::Match m = parse_special ? tokens_.control(state) : SpecialTokens::Match{};
    const SpecialTokens::Match& u = tokens_.user(state);
    if (u.len > m.len) m = u;
    return m;
  }
  int64_t steps() const { return steps_; }

 private:
  void Scan(size_t from) {
    begin_ = from;
    const size_t to = std::min(text_.size(), from + window_);
    const size_t start = std::min(text_.size(), to + tokens_.max_len());
    states_.assign(to - from, 0);
    int32_t state = 0;
    for (size_t j = start; j-- > from;) {
      state = tokens_.Step(state, static_cast<uint8_t>(text_[j]), &steps_);
      if (j < to) states_[j - from] = state;
    }
  }

  const SpecialTokens& tokens_;
  absl::string_view text_;
  size_t window_;
  size_t begin_ = 0;
  std::vector<int32_t> states_;
  int64_t steps_ = 0;
};

struct MergeInfo {
  int32_t rank;
  int32_t new_id;
};

}  // namespace

// ---- the tokenizer ------------------------------------------------------------------------

struct Tokenizer::Impl {
  TokenizerSpec spec;
  bool byte_level = false;
  absl::flat_hash_map<std::string, int32_t> vocab;  // BPE spelling → id
  absl::flat_hash_map<std::pair<int32_t, int32_t>, MergeInfo> merges;
  std::vector<Pattern> patterns;
  std::vector<std::string> token_bytes;  // what each id decodes to
  std::vector<uint8_t> control;          // skipped by skip_special
  SpecialTokens special;                 // matched in text: control and user-defined
  std::array<int32_t, 256> byte_tokens;  // <0xNN> ids for byte fallback, -1 if missing
  bool strip_leading_space = false;

  mutable std::mutex cache_mu;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache;

  absl::Status Bpe(absl::string_view word, std::vector<int32_t>* out) const;
  absl::Status EncodeSegment(absl::string_view text, bool at_start, Matcher& m,
                             std::vector<int32_t>* out) const;
};

namespace {

// Merges of a SentencePiece vocabulary that lists none, as transformers derives them: every
// split of a token into two tokens of the vocabulary, best score first, then by the pieces'
// lengths (longer left piece first), ties kept in the order of the vocabulary.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> MergesFromScores(
    const TokenizerSpec& spec) {
  absl::flat_hash_map<absl::string_view, int32_t> index;  // last id of each spelling
  absl::flat_hash_map<absl::string_view, std::pair<int32_t, float>> score;  // first position, last score
  std::vector<absl::string_view> order;
  for (size_t i = 0; i < spec.tokens.size(); ++i) {
    const absl::string_view t = spec.tokens[i];
    index[t] = static_cast<int32_t>(i);
    auto [it, inserted] = score.try_emplace(t, static_cast<int32_t>(order.size()), spec.scores[i]);
    if (inserted) order.push_back(t); else it->second.second = spec.scores[i];
  }
  struct Candidate {
    absl::string_view left, right;
    float score;
    int32_t left_chars, right_chars;
  };
  std::vector<Candidate> all;
  std::vector<std::pair<uint32_t, uint32_t>> chars;
  for (absl::string_view t : order) {
    Utf8Chars(t, &chars);
    const float s = score[t].second;
    const size_t first = all.size();
    for (size_t k = 1; k < chars.size(); ++k) {
      const absl::string_view l = t.substr(0, chars[k].first), r = t.substr(chars[k].first);
      if (index.contains(l) && index.contains(r)) {
        if (static_cast<int64_t>(all.size()) >= kMaxMerges) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tokenizer: the scores imply more than ", kMaxMerges, " merges"));
        }
        all.push_back({l, r, s, static_cast<int32_t>(k), static_cast<int32_t>(chars.size() - k)});
      }
    }
    std::stable_sort(all.begin() + first, all.end(), [&](const Candidate& a, const Candidate& b) {
      return std::make_pair(index[a.left], index[a.right]) < std::make_pair(index[b.left], index[b.right]);
    });
  }
  std::stable_sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    return std::make_tuple(a.score, a.left_chars, a.right_chars) >
           std::make_tuple(b.score, b.left_chars, b.right_chars);
  });
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(all.size());
  for (const Candidate& c : all) merges.emplace_back(std::string(c.left), std::string(c.right));
  return merges;
}

absl::Status CheckId(int32_t id, const char* what, size_t n) {
  if (id < -1 || id >= static_cast<int64_t>(n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: ", what, " ", id, " is outside the vocabulary of ", n, " tokens"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer::Impl>> BuildImpl(TokenizerSpec spec) {
  auto impl = std::make_unique<Tokenizer::Impl>();
  const size_t n = spec.tokens.size();
  if (spec.model != "gpt2" && spec.model != "llama") {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer: model \"", spec.model,
        "\" is not supported (\"gpt2\": byte-level BPE, \"llama\": SentencePiece-style BPE)"));
  }
  impl->byte_level = spec.model == "gpt2";
  if (n == 0 || static_cast<int64_t>(n) > kMaxTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: ", n, " tokens (1 to ", kMaxTokens, " allowed)"));
  }
  if (!spec.scores.empty() && spec.scores.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: ", spec.scores.size(),
                                                   " scores for ", n, " tokens"));
  }
  if (!spec.token_types.empty() && spec.token_types.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: ", spec.token_types.size(),
                                                   " token types for ", n, " tokens"));
  }
  if (static_cast<int64_t>(spec.merges.size()) > kMaxMerges) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: ", spec.merges.size(), " merges (at most ", kMaxMerges, ")"));
  }
  SG_RETURN_IF_ERROR(CheckId(spec.bos_id, "bos id", n));
  SG_RETURN_IF_ERROR(CheckId(spec.eos_id, "eos id", n));
  SG_RETURN_IF_ERROR(CheckId(spec.eot_id, "eot id", n));
  SG_RETURN_IF_ERROR(CheckId(spec.unk_id, "unk id", n));
  SG_RETURN_IF_ERROR(CheckId(spec.pad_id, "pad id", n));
  if (spec.add_bos && spec.bos_id < 0) {
    return absl::InvalidArgumentError("tokenizer: add_bos is set but there is no bos id");
  }
  if (spec.add_eos && spec.eos_id < 0) {
    return absl::InvalidArgumentError("tokenizer: add_eos is set but there is no eos id");
  }
  for (size_t i = 0; i < n; ++i) {
    const std::string& t = spec.tokens[i];
    if (t.size() > kMaxTokenBytes) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer: token ", i, " is ", t.size(),
                                                     " bytes long (at most ", kMaxTokenBytes, ")"));
    }
    if (FirstInvalidUtf8(t) != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer: token ", i, " is not valid UTF-8"));
    }
    if (!spec.token_types.empty() && (spec.token_types[i] < 0 || spec.token_types[i] > 6)) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer: token ", i, " has type ",
                                                     spec.token_types[i], " (0 to 6 known)"));
    }
  }

  // Pre-tokenizer patterns.
  std::vector<std::string> patterns = spec.pre_patterns;
  if (patterns.empty() && impl->byte_level) {
    for (const PreName& p : kPreNames) {
      if (spec.pre == p.name) patterns.push_back(p.pattern);
    }
    if (patterns.empty()) {
      std::vector<std::string> names;
      for (const PreName& p : kPreNames) names.push_back(p.name);
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer: pre-tokenizer \"", spec.pre, "\" is not supported (known: ",
          absl::StrJoin(names, ", "), ")"));
    }
  }
  if (patterns.size() > kMaxPrePatterns) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: ", patterns.size(), " pre-tokenizer patterns (at most ",
                     kMaxPrePatterns, ")"));
  }
  for (const std::string& p : patterns) {
    SG_ASSIGN_OR_RETURN(auto code, CompilePattern(p));
    impl->patterns.push_back(std::move(code));
  }

  // The vocabulary as BPE spells it. Later duplicates win, as in transformers' dict.
  impl->vocab.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& t = spec.tokens[i];
    std::string bytes;
    if (impl->byte_level && !FromByteLevel(t, &bytes)) {
      impl->vocab[ToByteLevel(t)] = static_cast<int32_t>(i);
    } else {
      impl->vocab[t] = static_cast<int32_t>(i);
    }
  }

  // Merges.
  std::vector<std::pair<std::string, std::string>> merge_pairs;
  if (!spec.merges.empty()) {
    merge_pairs.reserve(spec.merges.size());
    for (size_t r = 0; r < spec.merges.size(); ++r) {
      const std::string& m = spec.merges[r];
      const size_t space = m.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 >= m.size() ||
          m.find(' ', space + 1) != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tokenizer: merge ", r, " \"", m.substr(0, 64), "\" is not two tokens split by one space"));
      }
      merge_pairs.emplace_back(m.substr(0, space), m.substr(space + 1));
    }
  } else if (impl->byte_level) {
    return absl::InvalidArgumentError("tokenizer: a byte-level BPE (\"gpt2\") needs merges");
  } else if (spec.scores.empty()) {
    return absl::InvalidArgumentError(
        "tokenizer: a SentencePiece-style BPE (\"llama\") needs merges or scores");
  } else {
    SG_ASSIGN_OR_RETURN(merge_pairs, MergesFromScores(spec));
  }
  impl->merges.reserve(merge_pairs.size());
  for (size_t r = 0; r < merge_pairs.size(); ++r) {
    const auto& [a, b] = merge_pairs[r];
    auto ia = impl->vocab.find(a), ib = impl->vocab.find(b), iab = impl->vocab.find(a + b);
    if (ia == impl->vocab.end() || ib == impl->vocab.end() || iab == impl->vocab.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer: merge ", r, " \"", a.substr(0, 64), " ", b.substr(0, 64),
          "\" names a token that is not in the vocabulary"));
    }
    // A repeated pair keeps its last rank, as a map built from the list does.
    impl->merges[{ia->second, ib->second}] = MergeInfo{static_cast<int32_t>(r), iab->second};
  }

  // What each id decodes to, which ids are control tokens, and which are matched in text.
  auto type_of = [&](size_t i) {
    return spec.token_types.empty() ? TokenType::kNormal : static_cast<TokenType>(spec.token_types[i]);
  };
  impl->byte_tokens.fill(-1);
  impl->token_bytes.resize(n);
  impl->control.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const std::string& t = spec.tokens[i];
    const TokenType type = type_of(i);
    const int byte = ByteTokenValue(t);
    if (impl->byte_level) {
      if (!FromByteLevel(t, &impl->token_bytes[i])) impl->token_bytes[i] = t;
    } else if (byte >= 0 && (type == TokenType::kByte || (spec.token_types.empty() && spec.byte_fallback))) {
      impl->token_bytes[i] = std::string(1, static_cast<char>(byte));
      if (impl->byte_tokens[byte] < 0) impl->byte_tokens[byte] = static_cast<int32_t>(i);
    } else {
      std::string& out = impl->token_bytes[i];
      for (size_t k = 0; k < t.size();) {
        if (t.compare(k, 3, kSpaceMarker) == 0) {
          out.push_back(' ');
          k += 3;
        } else {
          out.push_back(t[k++]);
        }
      }
    }
    const bool named = static_cast<int32_t>(i) == spec.bos_id || static_cast<int32_t>(i) == spec.eos_id ||
                       static_cast<int32_t>(i) == spec.eot_id || static_cast<int32_t>(i) == spec.unk_id ||
                       static_cast<int32_t>(i) == spec.pad_id;
    if (type == TokenType::kControl || named) {
      impl->control[i] = 1;
      if (!t.empty()) impl->special.Add(t, static_cast<int32_t>(i), /*control=*/true);
    } else if (type == TokenType::kUserDefined && !t.empty()) {
      impl->special.Add(t, static_cast<int32_t>(i), /*control=*/false);
    }
  }
  if (!impl->byte_level && spec.byte_fallback) {
    // Byte fallback is taken only when all 256 byte tokens exist.
    for (int b = 0; b < 256; ++b) {
      if (impl->byte_tokens[b] < 0) {
        auto it = impl->vocab.find(absl::StrFormat("<0x%02X>", b));
        if (it != impl->vocab.end()) impl->byte_tokens[b] = it->second;
      }
    }
  }
  impl->special.Build();
  impl->strip_leading_space = !impl->byte_level && (spec.add_space_prefix || spec.space_prefix_every_piece);
  impl->spec = std::move(spec);
  return impl;
}

}  // namespace

// BPE of one pre-token, as the reference merges: start from characters, then repeatedly merge
// the adjacent pair of best (lowest) rank, leftmost first, until no pair has a merge.
absl::Status Tokenizer::Impl::Bpe(absl::string_view word, std::vector<int32_t>* out) const {
  if (spec.ignore_merges) {
    auto it = vocab.find(word);
    if (it != vocab.end()) {
      out->push_back(it->second);
      return absl::OkStatus();
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache.find(word);
    if (it != cache.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return absl::OkStatus();
    }
  }
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  auto push = [&](int32_t id) {
    sym.push_back({id, static_cast<int32_t>(sym.size()) - 1, static_cast<int32_t>(sym.size()) + 1, true});
  };
  int32_t pending_unk = -1;  // unknown characters in a row fuse into one <unk> when asked
  const bool fuse_unk = !byte_level;
  int needed;
  for (size_t i = 0; i < word.size();) {
    const int len = std::max(1, Utf8SequenceAt(word, i, &needed));
    const absl::string_view ch = word.substr(i, len);
    i += len;
    auto it = vocab.find(ch);
    if (it != vocab.end()) {
      if (pending_unk >= 0) push(pending_unk), pending_unk = -1;
      push(it->second);
      continue;
    }
    if (!byte_level && spec.byte_fallback) {
      bool all = true;
      for (char c : ch) all = all && byte_tokens[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        if (pending_unk >= 0) push(pending_unk), pending_unk = -1;
        for (char c : ch) push(byte_tokens[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (spec.unk_id >= 0) {
      if (pending_unk >= 0 && !fuse_unk) push(pending_unk);
      pending_unk = spec.unk_id;
    }
    // Without an unknown token the character is dropped, as the reference does.
  }
  if (pending_unk >= 0) push(pending_unk);
  if (!sym.empty()) sym.back().next = -1;

  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = sym[left].next;
    if (right < 0) return;
    auto it = merges.find(std::make_pair(sym[left].id, sym[right].id));
    if (it != merges.end()) queue.push({it->second.rank, left, it->second.new_id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) consider(i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = sym[c.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = sym[left.next];
    auto it = merges.find(std::make_pair(left.id, right.id));
    if (it == merges.end() || it->second.new_id != c.new_id || it->second.rank != c.rank) continue;
    left.id = c.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = c.pos;
    consider(left.prev);
    consider(c.pos);
  }
  std::vector<int32_t> ids;
  for (int32_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) ids.push_back(sym[i].id);
  out->insert(out->end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu);
    if (cache.size() >= kMaxCacheEntries) cache.clear();
    cache.emplace(word, std::move(ids));
  }
  return absl::OkStatus();
}

// Text between special tokens. `at_start`: whether it begins the whole input (SentencePiece
// puts its space marker only there).
absl::Status Tokenizer::Impl::EncodeSegment(absl::string_view text, bool at_start, Matcher& m,
                                            std::vector<int32_t>* out) const {
  if (text.empty()) return absl::OkStatus();
  std::string nfc;
  if (spec.normalize_nfc) {
    nfc = NormalizeNfc(text, &m.nfc_steps);
    text = nfc;
  }
  std::string normalized;
  absl::string_view whole = text;
  if (!byte_level) {
    // Spaces become ▁; the marker goes in front as the spec says.
    if (spec.space_prefix_every_piece) normalized = kSpaceMarker;
    for (char c : text) {
      if (c == ' ') normalized += kSpaceMarker; else normalized.push_back(c);
    }
    if (!spec.space_prefix_every_piece && spec.add_space_prefix && at_start &&
        normalized.compare(0, 3, kSpaceMarker) != 0) {
      normalized.insert(0, kSpaceMarker);
    }
    whole = normalized;
  }
  std::vector<absl::string_view> pieces = {whole}, next;
  for (const Pattern& pattern : patterns) {
    next.clear();
    for (absl::string_view p : pieces) SG_RETURN_IF_ERROR(SplitIsolated(pattern, m, p, &next));
    pieces.swap(next);
  }
  for (absl::string_view p : pieces) {
    if (byte_level) {
      SG_RETURN_IF_ERROR(Bpe(ToByteLevel(p), out));
    } else {
      SG_RETURN_IF_ERROR(Bpe(p, out));
    }
  }
  return absl::OkStatus();
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(TokenizerSpec spec) {
  try {
    SG_ASSIGN_OR_RETURN(auto impl, BuildImpl(std::move(spec)));
    return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("tokenizer: out of memory building the tables");
  }
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text,
                                                       const EncodeOptions& options) const {
  if (text.size() > kMaxTextBytes) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: text of ", text.size(),
                                                   " bytes (at most ", kMaxTextBytes, ")"));
  }
  if (const size_t bad = FirstInvalidUtf8(text); bad != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: text is not valid UTF-8 at byte ", bad));
  }
  try {
    const Impl& im = *impl_;
    SG_ASSIGN_OR_RETURN(Matcher m, MakeMatcher(text.size(), im.patterns.size()));
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 2);
    if (options.add_special && im.spec.add_bos) ids.push_back(im.spec.bos_id);
    SpecialTokenScan scan(im.special, text);
    const auto encode = [&]() -> absl::Status {
      size_t segment = 0;
      for (size_t i = 0; i < text.size() && !im.special.empty();) {
        const SpecialTokens::Match token = scan.At(i, options.parse_special);
        if (token.len == 0) {
          ++i;
          continue;
        }
        SG_RETURN_IF_ERROR(
            im.EncodeSegment(text.substr(segment, i - segment), segment == 0, m, &ids));
        ids.push_back(token.id);
        i += static_cast<size_t>(token.len);
        segment = i;
      }
      return im.EncodeSegment(text.substr(segment), segment == 0, m, &ids);
    };
    const absl::Status encoded = encode();
    // Counted whether or not the text was refused: a refusal's cost is bounded too.
    if (options.work != nullptr) {
      options.work->special_steps += scan.steps();
      options.work->regex_matches += m.regex_matches;
      options.work->regex_steps += m.regex_steps;
      options.work->nfc_steps += m.nfc_steps;
    }
    SG_RETURN_IF_ERROR(encoded);
    if (options.add_special && im.spec.add_eos) ids.push_back(im.spec.eos_id);
    return ids;
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("tokenizer: out of memory encoding text");
  }
}

absl::Status Tokenizer::AppendTokenBytes(int32_t id, const DecodeOptions& options,
                                         std::string* bytes) const {
  if (id < 0 || id >= vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: token id ", id,
                                                   " is outside the vocabulary of ", vocab_size()));
  }
  if (options.skip_special && impl_->control[id]) return absl::OkStatus();
  bytes->append(impl_->token_bytes[id]);
  return absl::OkStatus();
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              const DecodeOptions& options) const {
  try {
    std::string bytes;
    for (int32_t id : ids) SG_RETURN_IF_ERROR(AppendTokenBytes(id, options, &bytes));
    // SentencePiece's leading ▁ is not part of the text.
    if (impl_->strip_leading_space && !bytes.empty() && bytes[0] == ' ') bytes.erase(0, 1);
    return Utf8Lossy(bytes);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("tokenizer: out of memory decoding ids");
  }
}

const TokenizerSpec& Tokenizer::spec() const { return impl_->spec; }
int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->spec.tokens.size()); }
bool Tokenizer::IsControl(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->control[id] != 0;
}
bool Tokenizer::strips_leading_space() const { return impl_->strip_leading_space; }

int32_t Tokenizer::TokenId(absl::string_view token) const {
  const auto& tokens = impl_->spec.tokens;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == token) return static_cast<int32_t>(i);
  }
  return -1;
}

// ---- decoding -----------------------------------------------------------------------------

std::string Utf8Lossy(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  int needed;
  for (size_t i = 0; i < bytes.size();) {
    const int len = Utf8SequenceAt(bytes, i, &needed);
    if (len > 0) {
      out.append(bytes.data() + i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for the maximal invalid subpart
      i += len < 0 ? -len : (needed > 0 ? bytes.size() - i : 1);
    }
  }
  return out;
}

TokenStreamDecoder::TokenStreamDecoder(const Tokenizer& tokenizer, DecodeOptions options)
    : tokenizer_(tokenizer), options_(options) {}

absl::StatusOr<std::string> TokenStreamDecoder::Push(int32_t id) {
  const size_t before = pending_.size();
  SG_RETURN_IF_ERROR(tokenizer_.AppendTokenBytes(id, options_, &pending_));
  if (!started_ && pending_.size() > before) {
    started_ = true;
    if (tokenizer_.strips_leading_space() && pending_[0] == ' ') pending_.erase(0, 1);
  }
  // Hold back a character still missing bytes; everything before it is final.
  size_t keep = pending_.size();
  for (size_t back = 1; back <= 3 && back <= pending_.size(); ++back) {
    const size_t i = pending_.size() - back;
    int needed;
    const int len = Utf8SequenceAt(pending_, i, &needed);
    if (len == 0 && needed > 0) {
      keep = i;
      break;
    }
    if (static_cast<uint8_t>(pending_[i]) >= 0xC0 || static_cast<uint8_t>(pending_[i]) < 0x80) break;
  }
  std::string out = Utf8Lossy(absl::string_view(pending_).substr(0, keep));
  pending_.erase(0, keep);
  return out;
}

std::string TokenStreamDecoder::Finish() {
  std::string out = Utf8Lossy(pending_);
  pending_.clear();
  started_ = false;
  return out;
}

}  // namespace sg
