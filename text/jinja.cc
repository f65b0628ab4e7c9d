// The Jinja-subset interpreter: a lexer that applies Jinja's whitespace rules as
// transformers configures them, a recursive-descent parser bounded in depth, and a
// tree-walking renderer bounded in steps and output; see jinja.h.
#include "text/jinja.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "stepgraph/base/status.h"

namespace sg::jinja {

// ---------------------------------------------------------------------------------------
// Values.

struct Callable {
  enum class Kind { kMacro, kRange, kNamespace, kDict, kRaise, kStrftime };
  Kind kind;
  const void* macro = nullptr;  // the Stmt of a macro
};

const Value* Dict::Find(absl::string_view key) const {
  const auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

void Dict::Set(std::string key, Value value) {
  const auto it = index_.find(key);
  if (it != index_.end()) {
    entries_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(key, entries_.size());
  entries_.emplace_back(std::move(key), std::move(value));
}

Value::Value(std::string s)
    : kind_(Kind::kString), ptr_(std::make_shared<std::string>(std::move(s))) {}
Value::Value(List l) : kind_(Kind::kList) {
  int deepest = 0;
  for (const Value& e : l) deepest = std::max(deepest, e.depth());
  depth_ = static_cast<uint16_t>(std::min(deepest + 1, 0xFFFF));
  ptr_ = std::make_shared<List>(std::move(l));
}

Value::Value(Dict d) : kind_(Kind::kDict) {
  int deepest = 0;
  for (const auto& e : d.entries()) deepest = std::max(deepest, e.second.depth());
  depth_ = static_cast<uint16_t>(std::min(deepest + 1, 0xFFFF));
  ptr_ = std::make_shared<Dict>(std::move(d));
}

Value Value::Namespace(Dict d) {
  Value v(std::move(d));
  v.is_namespace_ = true;
  return v;
}

Value Value::Function(std::shared_ptr<const Callable> f) {
  Value v(Kind::kCallable);
  v.ptr_ = std::const_pointer_cast<Callable>(std::move(f));
  return v;
}

namespace {

absl::Status Error(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
}

// ---------------------------------------------------------------------------------------
// Unicode helpers: Python strings index, slice, strip and count by code point.

size_t CodePointLength(absl::string_view s, size_t i) {
  const auto b = static_cast<uint8_t>(s[i]);
  size_t n = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
  return i + n > s.size() ? 1 : n;
}

uint32_t CodePointAt(absl::string_view s, size_t i, size_t* len) {
  const size_t n = CodePointLength(s, i);
  const auto b0 = static_cast<uint8_t>(s[i]);
  uint32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  *len = n;
  return cp;
}

// The byte offset of every code point, and the size at the end.
std::vector<size_t> CodePointOffsets(absl::string_view s) {
  std::vector<size_t> at;
  for (size_t i = 0; i < s.size(); i += CodePointLength(s, i)) at.push_back(i);
  at.push_back(s.size());
  return at;
}

// Python's str.isspace(), which strip(), split() and Jinja's trim use.
bool IsPythonSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// strip / lstrip / rstrip: whitespace, or the code points of `chars`.
std::string Strip(absl::string_view s, const std::string* chars, bool left, bool right) {
  std::vector<uint32_t> set;  // sorted: n log m for n characters against m
  if (chars != nullptr) {
    size_t len;
    for (size_t i = 0; i < chars->size(); i += len) set.push_back(CodePointAt(*chars, i, &len));
    std::sort(set.begin(), set.end());
  }
  auto strips = [&](uint32_t cp) {
    return chars == nullptr ? IsPythonSpace(cp) : std::binary_search(set.begin(), set.end(), cp);
  };
  size_t b = 0, e = s.size(), len;
  if (left) {
    while (b < e && strips(CodePointAt(s, b, &len))) b += len;
  }
  if (right) {
    while (e > b) {
      size_t start = e - 1;
      while (start > b && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
      if (!strips(CodePointAt(s, start, &len)) || start + len != e) break;
      e = start;
    }
  }
  return std::string(s.substr(b, e - b));
}

// ---------------------------------------------------------------------------------------
// Formatting values as Python's str(), repr() and transformers' tojson write them.

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  // The shortest digits that read back as d, as Python's repr chooses them.
  const auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  const int exp = std::atoi(sci.c_str() + e + 1);
  std::string mant = sci.substr(0, e);
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = neg ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) absl::StrAppend(&out, ".", digits.substr(1));
    absl::StrAppend(&out, "e", exp < 0 ? "-" : "+", std::abs(exp) < 10 ? "0" : "", std::abs(exp));
  } else if (exp < 0) {
    absl::StrAppend(&out, "0.", std::string(-exp - 1, '0'), digits);
  } else {
    if (digits.size() <= static_cast<size_t>(exp) + 1) digits.append(exp + 1 - digits.size(), '0');
    out += digits.substr(0, exp + 1);
    absl::StrAppend(&out, ".",
                    digits.size() > static_cast<size_t>(exp) + 1 ? digits.substr(exp + 1) : "0");
  }
  return out;
}

// str() and repr() stop adding items once `out` passes `max` bytes: the caller's bound on
// what it makes then refuses the text, without it having been built whole.
void AppendRepr(const Value& v, size_t max, std::string* out);

void AppendStringRepr(const std::string& s, std::string* out) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  out->push_back(q);
  for (char c : s) {
    if (c == q || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (c == '\n') {
      out->append("\\n");
    } else if (c == '\r') {
      out->append("\\r");
    } else if (c == '\t') {
      out->append("\\t");
    } else if (static_cast<uint8_t>(c) < 0x20 || c == 0x7F) {
      static const char kHex[] = "0123456789abcdef";
      out->append("\\x");
      out->push_back(kHex[static_cast<uint8_t>(c) >> 4]);
      out->push_back(kHex[c & 15]);
    } else {
      out->push_back(c);
    }
  }
  out->push_back(q);
}

// str(v): what {{ v }} and ~ write.
void AppendStr(const Value& v, size_t max, std::string* out) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return;
    case Value::Kind::kString: out->append(v.as_string()); return;
    default: AppendRepr(v, max, out);
  }
}

void AppendRepr(const Value& v, size_t max, std::string* out) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return;
    case Value::Kind::kNone: out->append("None"); return;
    case Value::Kind::kBool: out->append(v.as_bool() ? "True" : "False"); return;
    case Value::Kind::kInt: absl::StrAppend(out, v.as_int()); return;
    case Value::Kind::kFloat: out->append(FloatRepr(v.as_float())); return;
    case Value::Kind::kString: AppendStringRepr(v.as_string(), out); return;
    case Value::Kind::kList: {
      out->push_back('[');
      bool first = true;
      for (const Value& e : v.as_list()) {
        if (out->size() > max) return;
        if (!first) out->append(", ");
        first = false;
        AppendRepr(e, max, out);
      }
      out->push_back(']');
      return;
    }
    case Value::Kind::kDict: {
      if (v.is_namespace()) out->append("<Namespace ");
      out->push_back('{');
      bool first = true;
      for (const auto& [k, e] : v.as_dict().entries()) {
        if (out->size() > max) return;
        if (!first) out->append(", ");
        first = false;
        AppendStringRepr(k, out);
        out->append(": ");
        AppendRepr(e, max, out);
      }
      out->push_back('}');
      if (v.is_namespace()) out->push_back('>');
      return;
    }
    case Value::Kind::kCallable: out->append("<function>"); return;
  }
}

std::string Str(const Value& v, size_t max) {
  std::string s;
  AppendStr(v, max, &s);
  return s;
}

void AppendJsonString(absl::string_view s, bool ensure_ascii, std::string* out) {
  static const char kHex[] = "0123456789abcdef";
  auto u = [&](uint32_t c) {
    out->append("\\u");
    for (int shift = 12; shift >= 0; shift -= 4) out->push_back(kHex[(c >> shift) & 15]);
  };
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    size_t len;
    const uint32_t cp = CodePointAt(s, i, &len);
    switch (cp) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      default:
        if (cp < 0x20) {
          u(cp);
        } else if (cp >= 0x80 && ensure_ascii) {
          if (cp >= 0x10000) {
            u(0xD800 + ((cp - 0x10000) >> 10));
            u(0xDC00 + ((cp - 0x10000) & 0x3FF));
          } else {
            u(cp);
          }
        } else {
          out->append(s.data() + i, len);
        }
    }
    i += len;
  }
  out->push_back('"');
}

struct JsonStyle {
  int indent = -1;                                    // none: one line
  absl::string_view item_sep = ", ", key_sep = ": ";  // point into the filter's arguments
  bool ensure_ascii = false;
  bool sort_keys = false;
};

absl::Status AppendJson(const Value& v, const JsonStyle& style, int level, int line, size_t max,
                        std::string* out) {
  if (out->size() > max) return Error(line, absl::StrCat("tojson passes ", max, " bytes"));
  auto newline = [&](int l) {
    if (style.indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(style.indent) * l, ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kUndefined: return Error(line, "tojson of an undefined value");
    case Value::Kind::kNone: out->append("null"); return absl::OkStatus();
    case Value::Kind::kBool: out->append(v.as_bool() ? "true" : "false"); return absl::OkStatus();
    case Value::Kind::kInt: absl::StrAppend(out, v.as_int()); return absl::OkStatus();
    case Value::Kind::kFloat: {
      const double d = v.as_float();
      out->append(std::isnan(d)   ? "NaN"
                  : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                                  : FloatRepr(d));
      return absl::OkStatus();
    }
    case Value::Kind::kString:
      AppendJsonString(v.as_string(), style.ensure_ascii, out);
      return absl::OkStatus();
    case Value::Kind::kList: {
      if (v.as_list().empty()) {
        out->append("[]");
        return absl::OkStatus();
      }
      out->push_back('[');
      bool first = true;
      for (const Value& e : v.as_list()) {
        if (!first) out->append(style.item_sep.data(), style.item_sep.size());
        first = false;
        newline(level + 1);
        SG_RETURN_IF_ERROR(AppendJson(e, style, level + 1, line, max, out));
      }
      newline(level);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      if (v.as_dict().size() == 0) {
        out->append("{}");
        return absl::OkStatus();
      }
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& e : v.as_dict().entries()) entries.push_back(&e);
      if (style.sort_keys) {
        std::sort(entries.begin(), entries.end(),
                  [](auto* a, auto* b) { return a->first < b->first; });
      }
      out->push_back('{');
      bool first = true;
      for (const auto* e : entries) {
        if (!first) out->append(style.item_sep.data(), style.item_sep.size());
        first = false;
        newline(level + 1);
        AppendJsonString(e->first, style.ensure_ascii, out);
        out->append(style.key_sep.data(), style.key_sep.size());
        SG_RETURN_IF_ERROR(AppendJson(e->second, style, level + 1, line, max, out));
      }
      newline(level);
      out->push_back('}');
      return absl::OkStatus();
    }
    case Value::Kind::kCallable: return Error(line, "tojson of a function");
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// Lexer: the template as a flat list of tokens, text and tag markers included.

enum class Tok {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok kind;
  std::string text;  // text, name, string value or operator
  int64_t i = 0;
  double f = 0;
  int line = 0;
};

bool IsNameStart(char c) { return absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsNameChar(char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

class Lexer {
 public:
  explicit Lexer(std::string source) : s_(std::move(source)) {}

  absl::StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    bool strip_next = false, trim_newline = false;
    while (pos <= s_.size()) {
      size_t open = pos;
      while (true) {
        open = s_.find('{', open);
        if (open == std::string::npos || open + 1 >= s_.size()) {
          open = std::string::npos;
          break;
        }
        const char k = s_[open + 1];
        if (k == '{' || k == '%' || k == '#') break;
        ++open;
      }
      const size_t text_end = open == std::string::npos ? s_.size() : open;
      std::string text = s_.substr(pos, text_end - pos);
      if (strip_next) {
        size_t b = 0;
        while (b < text.size() && IsSpace(text[b])) ++b;
        text.erase(0, b);
      } else if (trim_newline && !text.empty() && text[0] == '\n') {
        text.erase(0, 1);
      }
      strip_next = trim_newline = false;
      if (open == std::string::npos) {
        Emit(Tok::kText, std::move(text), pos);
        break;
      }
      const char kind = s_[open + 1];
      const char mod = open + 2 < s_.size() ? s_[open + 2] : '\0';
      if (mod == '-') {
        size_t e = text.size();
        while (e > 0 && IsSpace(text[e - 1])) --e;
        text.resize(e);
      } else if (kind != '{' && mod != '+') {
        // lstrip_blocks: a block or comment tag first on its line takes the line's indent.
        size_t k = open;
        while (k > pos && (s_[k - 1] == ' ' || s_[k - 1] == '\t')) --k;
        if (k == 0 || s_[k - 1] == '\n') text.resize(text.size() - std::min(text.size(), open - k));
      }
      Emit(Tok::kText, std::move(text), pos);
      size_t at = open + 2 + (mod == '-' || mod == '+' ? 1 : 0);
      if (kind == '#') {
        const size_t close = s_.find("#}", at);
        if (close == std::string::npos) return Error(LineAt(open), "unclosed comment");
        strip_next = close > at && s_[close - 1] == '-';
        trim_newline = !strip_next;
        pos = close + 2;
        continue;
      }
      SG_ASSIGN_OR_RETURN(at, Tag(kind == '{', open, at, &strip_next));
      trim_newline = kind == '%' && !strip_next;
      pos = at;
      if (kind == '%' && tokens_.size() >= 3 && tokens_[tokens_.size() - 2].kind == Tok::kName &&
          tokens_[tokens_.size() - 2].text == "raw" &&
          tokens_[tokens_.size() - 3].kind == Tok::kBlockBegin) {
        SG_ASSIGN_OR_RETURN(pos, Raw(pos, strip_next, &strip_next));
        trim_newline = !strip_next;
      }
    }
    tokens_.push_back(Token{Tok::kEof, "", 0, 0, LineAt(s_.size())});
    return std::move(tokens_);
  }

 private:
  int LineAt(size_t pos) {
    // Lines are counted forward only: positions asked for never decrease by much.
    if (pos < line_pos_) {
      line_pos_ = 0;
      line_ = 1;
    }
    for (; line_pos_ < pos && line_pos_ < s_.size(); ++line_pos_) line_ += s_[line_pos_] == '\n';
    return line_;
  }

  void Emit(Tok kind, std::string text, size_t pos) {
    if (kind == Tok::kText && text.empty()) return;
    tokens_.push_back(Token{kind, std::move(text), 0, 0, LineAt(pos)});
  }

  // The tokens of one {{ }} or {% %} tag from `at`; returns where the text after it starts.
  absl::StatusOr<size_t> Tag(bool var, size_t open, size_t at, bool* strip_next) {
    Emit(var ? Tok::kVarBegin : Tok::kBlockBegin, "", open);
    int balance = 0;
    while (true) {
      while (at < s_.size() && IsSpace(s_[at])) ++at;
      if (at >= s_.size()) return Error(LineAt(open), var ? "unclosed {{" : "unclosed {%");
      const char c = s_[at];
      const char end = var ? '}' : '%';
      const bool dash = c == '-' && s_.compare(at + 1, 2, std::string{end, '}'}) == 0;
      if ((balance == 0 || !var) &&
          (dash || (c == end && at + 1 < s_.size() && s_[at + 1] == '}'))) {
        *strip_next = dash;
        Emit(var ? Tok::kVarEnd : Tok::kBlockEnd, "", at);
        return at + (dash ? 3 : 2);
      }
      const int line = LineAt(at);
      if (IsNameStart(c)) {
        size_t e = at;
        while (e < s_.size() && IsNameChar(s_[e])) ++e;
        tokens_.push_back(Token{Tok::kName, s_.substr(at, e - at), 0, 0, line});
        at = e;
      } else if (absl::ascii_isdigit(static_cast<unsigned char>(c))) {
        SG_ASSIGN_OR_RETURN(at, Number(at, line));
      } else if (c == '\'' || c == '"') {
        SG_ASSIGN_OR_RETURN(at, String(at, line));
      } else {
        static const char* const kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                           "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                           "]",  "{",  "}",  ",",  ".",  ":",  "|"};
        const char* found = nullptr;
        for (const char* op : kOps) {
          if (s_.compare(at, std::strlen(op), op) == 0) {
            found = op;
            break;
          }
        }
        if (found == nullptr)
          return Error(line, absl::StrCat("unexpected character '", std::string(1, c), "'"));
        if (*found == '(' || *found == '[' || *found == '{') ++balance;
        if (*found == ')' || *found == ']' || *found == '}') --balance;
        tokens_.push_back(Token{Tok::kOp, found, 0, 0, line});
        at += std::strlen(found);
      }
    }
  }

  absl::StatusOr<size_t> Number(size_t at, int line) {
    size_t e = at;
    bool is_float = false;
    while (e < s_.size() &&
           (absl::ascii_isdigit(static_cast<unsigned char>(s_[e])) || s_[e] == '_'))
      ++e;
    if (e + 1 < s_.size() && s_[e] == '.' &&
        absl::ascii_isdigit(static_cast<unsigned char>(s_[e + 1]))) {
      is_float = true;
      for (++e; e < s_.size() && absl::ascii_isdigit(static_cast<unsigned char>(s_[e]));) ++e;
    }
    if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
      size_t k = e + 1;
      if (k < s_.size() && (s_[k] == '+' || s_[k] == '-')) ++k;
      if (k < s_.size() && absl::ascii_isdigit(static_cast<unsigned char>(s_[k]))) {
        is_float = true;
        for (e = k; e < s_.size() && absl::ascii_isdigit(static_cast<unsigned char>(s_[e]));) ++e;
      }
    }
    std::string digits;
    for (size_t k = at; k < e; ++k) {
      if (s_[k] != '_') digits.push_back(s_[k]);
    }
    Token t{is_float ? Tok::kFloat : Tok::kInt, digits, 0, 0, line};
    if (is_float) {
      t.f = std::strtod(digits.c_str(), nullptr);
    } else {
      const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), t.i);
      if (r.ec != std::errc())
        return Error(line, absl::StrCat("integer ", digits, " out of range"));
    }
    tokens_.push_back(std::move(t));
    return e;
  }

  absl::StatusOr<size_t> String(size_t at, int line) {
    const char q = s_[at];
    std::string v;
    size_t k = at + 1;
    for (; k < s_.size() && s_[k] != q; ++k) {
      if (s_[k] != '\\' || k + 1 >= s_.size()) {
        v.push_back(s_[k]);
        continue;
      }
      const char e = s_[++k];
      switch (e) {
        case 'n': v.push_back('\n'); break;
        case 't': v.push_back('\t'); break;
        case 'r': v.push_back('\r'); break;
        case 'b': v.push_back('\b'); break;
        case 'f': v.push_back('\f'); break;
        case 'v': v.push_back('\v'); break;
        case 'a': v.push_back('\a'); break;
        case '0': v.push_back('\0'); break;
        case '\\':
        case '\'':
        case '"': v.push_back(e); break;
        case '\n': break;  // a line continuation
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          if (k + n >= s_.size()) return Error(line, "truncated escape in a string");
          for (size_t d = 1; d <= n; ++d) {
            const char h = s_[k + d];
            if (!absl::ascii_isxdigit(static_cast<unsigned char>(h)))
              return Error(line, "bad escape in a string");
            cp = cp * 16 + (absl::ascii_isdigit(static_cast<unsigned char>(h))
                                ? h - '0'
                                : (h | 0x20) - 'a' + 10);
          }
          if (cp > 0x10FFFF) return Error(line, "escape beyond Unicode in a string");
          k += n;
          if (cp < 0x80) {
            v.push_back(static_cast<char>(cp));
          } else if (cp < 0x800) {
            v.push_back(static_cast<char>(0xC0 | (cp >> 6)));
            v.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
          } else if (cp < 0x10000) {
            v.push_back(static_cast<char>(0xE0 | (cp >> 12)));
            v.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
            v.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
          } else {
            v.push_back(static_cast<char>(0xF0 | (cp >> 18)));
            v.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
            v.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
            v.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
          }
          break;
        }
        default: v.push_back('\\'); v.push_back(e);
      }
    }
    if (k >= s_.size()) return Error(line, "unclosed string literal");
    tokens_.push_back(Token{Tok::kString, std::move(v), 0, 0, line});
    return k + 1;
  }

  // After {% raw %}: the text up to {% endraw %}, as it is.
  absl::StatusOr<size_t> Raw(size_t at, bool strip_first, bool* strip_next) {
    // Drop the {% raw %} tokens: the text is all that stays.
    tokens_.resize(tokens_.size() - 3);
    for (size_t k = s_.find("{%", at); k != std::string::npos; k = s_.find("{%", k + 2)) {
      size_t b = k + 2;
      const bool dash = b < s_.size() && s_[b] == '-';
      if (dash || (b < s_.size() && s_[b] == '+')) ++b;
      while (b < s_.size() && IsSpace(s_[b])) ++b;
      if (s_.compare(b, 6, "endraw") != 0) continue;
      b += 6;
      while (b < s_.size() && IsSpace(s_[b])) ++b;
      const bool close_dash = b < s_.size() && s_[b] == '-';
      if (close_dash) ++b;
      if (s_.compare(b, 2, "%}") != 0) continue;
      std::string text = s_.substr(at, k - at);
      if (strip_first) {
        size_t f = 0;
        while (f < text.size() && IsSpace(text[f])) ++f;
        text.erase(0, f);
      }
      if (dash) {
        while (!text.empty() && IsSpace(text.back())) text.pop_back();
      }
      Emit(Tok::kText, std::move(text), at);
      *strip_next = close_dash;
      return b + 2;
    }
    return Error(LineAt(at), "{% raw %} without {% endraw %}");
  }

  std::string s_;
  std::vector<Token> tokens_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

// ---------------------------------------------------------------------------------------
// The syntax tree.

enum class Ex {
  kLiteral,
  kName,
  kAttr,
  kIndex,
  kSlice,
  kNeg,
  kNot,
  kChain,
  kCompare,
  kAnd,
  kOr,
  kTernary,
  kList,
  kDict,
  kCall,
  kFilter,
  kTest
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  Ex kind;
  int line;
  Value value;                   // kLiteral
  std::string name;              // kName, kAttr, kFilter, kTest
  std::vector<ExprPtr> args;     // operands; args[0] is the object of a postfix, filter or test
  std::vector<std::string> ops;  // kChain, kCompare: the operator between args[i] and args[i+1]
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;  // kTest: `is not`
  int height = 1;
};

enum class St { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue, kBlock };

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  St kind;
  int line;
  std::string text;                                // kText
  ExprPtr expr;                                    // kOutput, kSet value, kFor iterable
  ExprPtr filter;                                  // kFor: `if` after the iterable
  std::vector<std::string> targets;                // kFor / kSet names; kMacro: its name
  std::string attr;                                // kSet / kSetBlock of `ns.attr`
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf
  Body body, else_body;             // kFor, kSetBlock, kMacro, kBlock; kIf / kFor else
  std::vector<std::string> params;  // kMacro
  std::vector<ExprPtr> defaults;    // kMacro: a default per parameter, or null
};

}  // namespace

struct Template::Program {
  Body body;
};

namespace {

// ---------------------------------------------------------------------------------------
// Parser.

class Parser {
 public:
  Parser(std::vector<Token> tokens, int max_depth) : t_(std::move(tokens)), max_depth_(max_depth) {}

  absl::StatusOr<Body> Run() {
    std::string end;
    SG_ASSIGN_OR_RETURN(Body body, ParseBody({}, &end));
    return body;
  }

 private:
  const Token& Peek(size_t ahead = 0) const { return t_[std::min(p_ + ahead, t_.size() - 1)]; }
  bool IsOp(absl::string_view op, size_t ahead = 0) const {
    return Peek(ahead).kind == Tok::kOp && Peek(ahead).text == op;
  }
  bool IsName(absl::string_view name, size_t ahead = 0) const {
    return Peek(ahead).kind == Tok::kName && Peek(ahead).text == name;
  }
  const Token& Next() { return t_[std::min(p_++, t_.size() - 1)]; }
  absl::Status Unexpected(absl::string_view wanted) const {
    const Token& t = Peek();
    std::string got = t.kind == Tok::kEof ? "the end of the template"
                      : t.kind == Tok::kVarEnd || t.kind == Tok::kBlockEnd ? "the end of the tag"
                      : t.kind == Tok::kString                             ? "a string"
                                               : absl::StrCat("'", t.text, "'");
    return Error(t.line, absl::StrCat("expected ", wanted, ", found ", got));
  }
  absl::Status Expect(absl::string_view op) {
    if (!IsOp(op)) return Unexpected(absl::StrCat("'", op, "'"));
    ++p_;
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() {
    if (Peek().kind != Tok::kBlockEnd) return Unexpected("%}");
    ++p_;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Peek().kind != Tok::kName) return Unexpected("a name");
    return Next().text;
  }

  // Bounds the parser's recursion, and so the renderer's: every nested construct passes here.
  struct DepthGuard {
    explicit DepthGuard(int* d) : depth(d) { ++*depth; }
    ~DepthGuard() { --*depth; }
    int* depth;
  };
  absl::Status CheckDepth(int line) const {
    if (depth_ > max_depth_) {
      return Error(line, absl::StrCat("nested more than ", max_depth_, " deep"));
    }
    return absl::OkStatus();
  }

  ExprPtr Make(Ex kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  // The node's height bounds the renderer's recursion where the parser loops (chains of
  // postfixes and filters).
  absl::StatusOr<ExprPtr> Seal(ExprPtr e) {
    int h = 0;
    for (const ExprPtr& a : e->args) {
      if (a) h = std::max(h, a->height);
    }
    for (const auto& kw : e->kwargs) h = std::max(h, kw.second->height);
    e->height = h + 1;
    if (e->height > max_depth_)
      return Error(e->line, absl::StrCat("expression nested more than ", max_depth_, " deep"));
    return e;
  }

  // Statements up to a block tag named in `ends`, which is consumed up to its name; its
  // name goes to `end`.
  absl::StatusOr<Body> ParseBody(std::initializer_list<absl::string_view> ends, std::string* end) {
    DepthGuard g(&depth_);
    SG_RETURN_IF_ERROR(CheckDepth(Peek().line));
    Body body;
    while (true) {
      const Token& t = Peek();
      if (t.kind == Tok::kEof) {
        if (ends.size() == 0) return body;
        return Error(t.line, absl::StrCat("missing {% ", *ends.begin(), " %}"));
      }
      if (t.kind == Tok::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = St::kText;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        ++p_;
        continue;
      }
      if (t.kind == Tok::kVarBegin) {
        ++p_;
        auto s = std::make_unique<Stmt>();
        s->kind = St::kOutput;
        s->line = t.line;
        SG_ASSIGN_OR_RETURN(s->expr, ParseTuple());
        if (Peek().kind != Tok::kVarEnd) return Unexpected("}}");
        ++p_;
        body.push_back(std::move(s));
        continue;
      }
      if (t.kind != Tok::kBlockBegin) return Unexpected("text or a tag");
      if (Peek(1).kind != Tok::kName) {
        ++p_;
        return Unexpected("a statement name");
      }
      const std::string& name = Peek(1).text;
      for (absl::string_view e : ends) {
        if (name == e) {
          p_ += 2;
          *end = name;
          return body;
        }
      }
      if (absl::StartsWith(name, "end") || name == "elif" || name == "else") {
        return Error(t.line, absl::StrCat("unexpected {% ", name, " %}"));
      }
      p_ += 2;
      SG_ASSIGN_OR_RETURN(std::unique_ptr<Stmt> s, ParseStatement(name, t.line));
      body.push_back(std::move(s));
    }
  }

  absl::StatusOr<std::unique_ptr<Stmt>> ParseStatement(const std::string& name, int line) {
    auto s = std::make_unique<Stmt>();
    s->line = line;
    std::string end;
    if (name == "if") {
      s->kind = St::kIf;
      SG_ASSIGN_OR_RETURN(ExprPtr cond, ParseTuple());
      while (true) {
        SG_RETURN_IF_ERROR(ExpectBlockEnd());
        SG_ASSIGN_OR_RETURN(Body b, ParseBody({"elif", "else", "endif"}, &end));
        s->branches.emplace_back(std::move(cond), std::move(b));
        if (end != "elif") break;
        SG_ASSIGN_OR_RETURN(cond, ParseTuple());
      }
      if (end == "else") {
        SG_RETURN_IF_ERROR(ExpectBlockEnd());
        SG_ASSIGN_OR_RETURN(s->else_body, ParseBody({"endif"}, &end));
      }
      SG_RETURN_IF_ERROR(ExpectBlockEnd());
    } else if (name == "for") {
      s->kind = St::kFor;
      do {
        SG_ASSIGN_OR_RETURN(std::string target, ExpectName());
        s->targets.push_back(std::move(target));
      } while (IsOp(",") && (++p_, true));
      if (!IsName("in")) return Unexpected("'in'");
      ++p_;
      SG_ASSIGN_OR_RETURN(s->expr, ParseTupleNoCondition());
      if (IsName("if")) {
        ++p_;
        SG_ASSIGN_OR_RETURN(s->filter, ParseTuple());
      }
      if (IsName("recursive")) return Error(line, "recursive for loops are not supported");
      SG_RETURN_IF_ERROR(ExpectBlockEnd());
      SG_ASSIGN_OR_RETURN(s->body, ParseBody({"else", "endfor"}, &end));
      if (end == "else") {
        SG_RETURN_IF_ERROR(ExpectBlockEnd());
        SG_ASSIGN_OR_RETURN(s->else_body, ParseBody({"endfor"}, &end));
      }
      SG_RETURN_IF_ERROR(ExpectBlockEnd());
    } else if (name == "set") {
      do {
        SG_ASSIGN_OR_RETURN(std::string target, ExpectName());
        s->targets.push_back(std::move(target));
      } while (IsOp(",") && (++p_, true));
      if (s->targets.size() == 1 && IsOp(".")) {
        ++p_;
        SG_ASSIGN_OR_RETURN(s->attr, ExpectName());
      }
      if (Peek().kind == Tok::kBlockEnd && s->targets.size() == 1) {
        ++p_;
        s->kind = St::kSetBlock;
        SG_ASSIGN_OR_RETURN(s->body, ParseBody({"endset"}, &end));
      } else {
        s->kind = St::kSet;
        SG_RETURN_IF_ERROR(Expect("="));
        SG_ASSIGN_OR_RETURN(s->expr, ParseTuple());
      }
      SG_RETURN_IF_ERROR(ExpectBlockEnd());
    } else if (name == "macro") {
      s->kind = St::kMacro;
      SG_ASSIGN_OR_RETURN(std::string macro_name, ExpectName());
      s->targets.push_back(std::move(macro_name));
      SG_RETURN_IF_ERROR(Expect("("));
      while (!IsOp(")")) {
        SG_ASSIGN_OR_RETURN(std::string param, ExpectName());
        s->params.push_back(std::move(param));
        ExprPtr def;
        if (IsOp("=")) {
          ++p_;
          SG_ASSIGN_OR_RETURN(def, ParseExpression());
        }
        s->defaults.push_back(std::move(def));
        if (!IsOp(",")) break;
        ++p_;
      }
      SG_RETURN_IF_ERROR(Expect(")"));
      SG_RETURN_IF_ERROR(ExpectBlockEnd());
      SG_ASSIGN_OR_RETURN(s->body, ParseBody({"endmacro"}, &end));
      if (Peek().kind == Tok::kName) ++p_;  // {% endmacro name %}
      SG_RETURN_IF_ERROR(ExpectBlockEnd());
    } else if (name == "break" || name == "continue") {
      s->kind = name == "break" ? St::kBreak : St::kContinue;
      SG_RETURN_IF_ERROR(ExpectBlockEnd());
    } else if (name == "generation") {
      // transformers' {% generation %}: marks the assistant's tokens, renders its body.
      s->kind = St::kBlock;
      SG_RETURN_IF_ERROR(ExpectBlockEnd());
      SG_ASSIGN_OR_RETURN(s->body, ParseBody({"endgeneration"}, &end));
      SG_RETURN_IF_ERROR(ExpectBlockEnd());
    } else {
      return Error(line, absl::StrCat("the statement '", name, "' is not supported"));
    }
    return s;
  }

  // An expression, or several separated by commas (a tuple, made a list).
  absl::StatusOr<ExprPtr> ParseTuple() { return ParseTupleImpl(true); }
  absl::StatusOr<ExprPtr> ParseTupleNoCondition() { return ParseTupleImpl(false); }
  absl::StatusOr<ExprPtr> ParseTupleImpl(bool with_condition) {
    const int line = Peek().line;
    SG_ASSIGN_OR_RETURN(ExprPtr first, with_condition ? ParseExpression() : ParseOr());
    if (!IsOp(",")) return first;
    ExprPtr list = Make(Ex::kList, line);
    list->args.push_back(std::move(first));
    while (IsOp(",")) {
      ++p_;
      if (Peek().kind == Tok::kVarEnd || Peek().kind == Tok::kBlockEnd || IsOp(")")) break;
      SG_ASSIGN_OR_RETURN(ExprPtr e, with_condition ? ParseExpression() : ParseOr());
      list->args.push_back(std::move(e));
    }
    return Seal(std::move(list));
  }

  // `a if cond else b`, Jinja's conditional expression.
  absl::StatusOr<ExprPtr> ParseExpression() {
    DepthGuard g(&depth_);
    SG_RETURN_IF_ERROR(CheckDepth(Peek().line));
    SG_ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
    while (IsName("if")) {
      const int line = Next().line;
      ExprPtr t = Make(Ex::kTernary, line);
      SG_ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
      ExprPtr other;
      if (IsName("else")) {
        ++p_;
        SG_ASSIGN_OR_RETURN(other, ParseExpression());
      } else {
        other = Make(Ex::kLiteral, line);  // undefined
      }
      t->args.push_back(std::move(cond));
      t->args.push_back(std::move(e));
      t->args.push_back(std::move(other));
      SG_ASSIGN_OR_RETURN(e, Seal(std::move(t)));
    }
    return e;
  }

  absl::StatusOr<ExprPtr> ParseOr() { return ParseLogic(Ex::kOr, "or"); }
  absl::StatusOr<ExprPtr> ParseAnd() { return ParseLogic(Ex::kAnd, "and"); }
  absl::StatusOr<ExprPtr> ParseLogic(Ex kind, absl::string_view word) {
    SG_ASSIGN_OR_RETURN(ExprPtr first, kind == Ex::kOr ? ParseAnd() : ParseNot());
    if (!IsName(word)) return first;
    ExprPtr e = Make(kind, first->line);
    e->args.push_back(std::move(first));
    while (IsName(word)) {
      ++p_;
      SG_ASSIGN_OR_RETURN(ExprPtr next, kind == Ex::kOr ? ParseAnd() : ParseNot());
      e->args.push_back(std::move(next));
    }
    return Seal(std::move(e));
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (!IsName("not")) return ParseCompare();
    DepthGuard g(&depth_);
    SG_RETURN_IF_ERROR(CheckDepth(Peek().line));
    ExprPtr e = Make(Ex::kNot, Next().line);
    SG_ASSIGN_OR_RETURN(ExprPtr x, ParseNot());
    e->args.push_back(std::move(x));
    return Seal(std::move(e));
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    SG_ASSIGN_OR_RETURN(ExprPtr first, ParseChain(0));
    ExprPtr e;
    while (true) {
      std::string op;
      if (Peek().kind == Tok::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" ||
           Peek().text == "<=" || Peek().text == ">" || Peek().text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        ++p_;
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        p_ += 2;
        op = "not in";
      } else {
        break;
      }
      if (!e) {
        e = Make(Ex::kCompare, first->line);
        e->args.push_back(std::move(first));
      }
      SG_ASSIGN_OR_RETURN(ExprPtr next, ParseChain(0));
      e->ops.push_back(std::move(op));
      e->args.push_back(std::move(next));
    }
    if (!e) return first;
    return Seal(std::move(e));
  }

  // Left-associative binary operators, by level: ~, then + -, then * / // %, then **.
  // A run of one level is one node, evaluated in a loop, so long sums stay shallow.
  absl::StatusOr<ExprPtr> ParseChain(int level) {
    static const std::vector<std::vector<absl::string_view>> kLevels = {
        {"~"}, {"+", "-"}, {"*", "/", "//", "%"}, {"**"}};
    if (level == static_cast<int>(kLevels.size())) return ParseUnary();
    SG_ASSIGN_OR_RETURN(ExprPtr first, ParseChain(level + 1));
    ExprPtr e;
    while (Peek().kind == Tok::kOp && std::find(kLevels[level].begin(), kLevels[level].end(),
                                                Peek().text) != kLevels[level].end()) {
      if (!e) {
        e = Make(Ex::kChain, first->line);
        e->args.push_back(std::move(first));
      }
      e->ops.push_back(Next().text);
      SG_ASSIGN_OR_RETURN(ExprPtr next, ParseChain(level + 1));
      e->args.push_back(std::move(next));
    }
    if (!e) return first;
    return Seal(std::move(e));
  }

  absl::StatusOr<ExprPtr> ParseUnary() {
    if (IsOp("-") || IsOp("+")) {
      DepthGuard g(&depth_);
      SG_RETURN_IF_ERROR(CheckDepth(Peek().line));
      const bool neg = Next().text == "-";
      SG_ASSIGN_OR_RETURN(ExprPtr x, ParseUnary());
      if (!neg) return x;
      ExprPtr e = Make(Ex::kNeg, x->line);
      e->args.push_back(std::move(x));
      return Seal(std::move(e));
    }
    SG_ASSIGN_OR_RETURN(ExprPtr e, ParsePrimary());
    return ParsePostfix(std::move(e));
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr e) {
    while (true) {
      const int line = Peek().line;
      if (IsOp(".")) {
        ++p_;
        ExprPtr a = Make(Ex::kAttr, line);
        if (Peek().kind == Tok::kInt) {
          a->kind = Ex::kIndex;
          ExprPtr key = Make(Ex::kLiteral, line);
          key->value = Value(Next().i);
          a->args.push_back(std::move(e));
          a->args.push_back(std::move(key));
        } else {
          SG_ASSIGN_OR_RETURN(a->name, ExpectName());
          a->args.push_back(std::move(e));
        }
        SG_ASSIGN_OR_RETURN(e, Seal(std::move(a)));
      } else if (IsOp("[")) {
        ++p_;
        SG_ASSIGN_OR_RETURN(e, ParseSubscript(std::move(e), line));
      } else if (IsOp("(")) {
        ++p_;
        ExprPtr c = Make(Ex::kCall, line);
        c->args.push_back(std::move(e));
        SG_RETURN_IF_ERROR(ParseArgs(c.get()));
        SG_ASSIGN_OR_RETURN(e, Seal(std::move(c)));
      } else if (IsOp("|")) {
        ++p_;
        ExprPtr f = Make(Ex::kFilter, line);
        SG_ASSIGN_OR_RETURN(f->name, ExpectName());
        f->args.push_back(std::move(e));
        if (IsOp("(")) {
          ++p_;
          SG_RETURN_IF_ERROR(ParseArgs(f.get()));
        }
        SG_ASSIGN_OR_RETURN(e, Seal(std::move(f)));
      } else if (IsName("is")) {
        ++p_;
        ExprPtr t = Make(Ex::kTest, line);
        if (IsName("not")) {
          ++p_;
          t->negated = true;
        }
        SG_ASSIGN_OR_RETURN(t->name, ExpectName());
        t->args.push_back(std::move(e));
        if (IsOp("(")) {
          ++p_;
          SG_RETURN_IF_ERROR(ParseArgs(t.get()));
        } else if (Peek().kind == Tok::kString || Peek().kind == Tok::kInt ||
                   Peek().kind == Tok::kFloat ||
                   (Peek().kind == Tok::kName && !IsName("and") && !IsName("or") &&
                    !IsName("else") && !IsName("if") && !IsName("in") && !IsName("not") &&
                    !IsName("is"))) {
          // `is equalto 'user'`: one argument without parentheses.
          SG_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          SG_ASSIGN_OR_RETURN(arg, ParsePostfixNoFilter(std::move(arg)));
          t->args.push_back(std::move(arg));
        }
        SG_ASSIGN_OR_RETURN(e, Seal(std::move(t)));
      } else {
        return e;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParsePostfixNoFilter(ExprPtr e) {
    while (IsOp(".") || IsOp("[")) {
      const int line = Peek().line;
      if (Next().text == "[") {
        SG_ASSIGN_OR_RETURN(e, ParseSubscript(std::move(e), line));
      } else {
        ExprPtr a = Make(Ex::kAttr, line);
        SG_ASSIGN_OR_RETURN(a->name, ExpectName());
        a->args.push_back(std::move(e));
        SG_ASSIGN_OR_RETURN(e, Seal(std::move(a)));
      }
    }
    return e;
  }

  // After '[': an index or a slice.
  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr object, int line) {
    ExprPtr parts[3];
    int n = 0;
    bool slice = false;
    while (true) {
      if (!IsOp(":") && !IsOp("]")) {
        SG_ASSIGN_OR_RETURN(parts[n], ParseExpression());
      }
      if (IsOp(":") && n < 2) {
        ++p_;
        slice = true;
        ++n;
        continue;
      }
      break;
    }
    SG_RETURN_IF_ERROR(Expect("]"));
    ExprPtr e = Make(slice ? Ex::kSlice : Ex::kIndex, line);
    e->args.push_back(std::move(object));
    if (!slice) {
      if (!parts[0]) return Error(line, "empty subscript");
      e->args.push_back(std::move(parts[0]));
    } else {
      for (ExprPtr& part : parts) e->args.push_back(std::move(part));  // null: omitted
    }
    return Seal(std::move(e));
  }

  // After '(': arguments up to ')', positional then name=value.
  absl::Status ParseArgs(Expr* call) {
    while (!IsOp(")")) {
      if (Peek().kind == Tok::kName && IsOp("=", 1)) {
        std::string name = Next().text;
        ++p_;
        SG_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression());
        call->kwargs.emplace_back(std::move(name), std::move(v));
      } else {
        if (!call->kwargs.empty())
          return Error(Peek().line, "a positional argument after a named one");
        SG_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression());
        call->args.push_back(std::move(v));
      }
      if (!IsOp(",")) break;
      ++p_;
    }
    return Expect(")");
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    DepthGuard g(&depth_);
    const Token& t = Peek();
    SG_RETURN_IF_ERROR(CheckDepth(t.line));
    const int line = t.line;
    switch (t.kind) {
      case Tok::kName: {
        ++p_;
        ExprPtr e = Make(Ex::kLiteral, line);
        if (t.text == "true" || t.text == "True") {
          e->value = Value(true);
        } else if (t.text == "false" || t.text == "False") {
          e->value = Value(false);
        } else if (t.text == "none" || t.text == "None") {
          e->value = Value::None();
        } else {
          e->kind = Ex::kName;
          e->name = t.text;
        }
        return e;
      }
      case Tok::kString: {
        std::string s;
        while (Peek().kind == Tok::kString) s += Next().text;  // adjacent literals join
        ExprPtr e = Make(Ex::kLiteral, line);
        e->value = Value(std::move(s));
        return e;
      }
      case Tok::kInt:
      case Tok::kFloat: {
        ExprPtr e = Make(Ex::kLiteral, line);
        e->value = t.kind == Tok::kInt ? Value(t.i) : Value(t.f);
        ++p_;
        return e;
      }
      case Tok::kOp:
        if (t.text == "(") {
          ++p_;
          if (IsOp(")")) {
            ++p_;
            return Seal(Make(Ex::kList, line));
          }
          SG_ASSIGN_OR_RETURN(ExprPtr e, ParseTuple());
          SG_RETURN_IF_ERROR(Expect(")"));
          return e;
        }
        if (t.text == "[") {
          ++p_;
          ExprPtr e = Make(Ex::kList, line);
          while (!IsOp("]")) {
            SG_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression());
            e->args.push_back(std::move(v));
            if (!IsOp(",")) break;
            ++p_;
          }
          SG_RETURN_IF_ERROR(Expect("]"));
          return Seal(std::move(e));
        }
        if (t.text == "{") {
          ++p_;
          ExprPtr e = Make(Ex::kDict, line);
          while (!IsOp("}")) {
            SG_ASSIGN_OR_RETURN(ExprPtr k, ParseExpression());
            SG_RETURN_IF_ERROR(Expect(":"));
            SG_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression());
            e->args.push_back(std::move(k));
            e->args.push_back(std::move(v));
            if (!IsOp(",")) break;
            ++p_;
          }
          SG_RETURN_IF_ERROR(Expect("}"));
          return Seal(std::move(e));
        }
        break;
      default: break;
    }
    return Unexpected("an expression");
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
  const int max_depth_;
};

// ---------------------------------------------------------------------------------------
// Renderer.

enum class Flow { kNormal, kBreak, kContinue };

using Scope = absl::flat_hash_map<std::string, Value>;

class Renderer {
 public:
  Renderer(const Limits& limits, const Environment& env, std::string* out)
      : limits_(limits), env_(env), out_(out) {}

  absl::Status Run(const Body& body, const Dict& variables) {
    scopes_.emplace_back();
    Scope& globals = scopes_.back();
    auto builtin = [&](const char* name, Callable::Kind kind) {
      auto f = std::make_shared<Callable>();
      f->kind = kind;
      globals[name] = Value::Function(std::move(f));
    };
    builtin("range", Callable::Kind::kRange);
    builtin("namespace", Callable::Kind::kNamespace);
    builtin("dict", Callable::Kind::kDict);
    builtin("raise_exception", Callable::Kind::kRaise);
    builtin("strftime_now", Callable::Kind::kStrftime);
    for (const auto& [k, v] : variables.entries()) globals[k] = v;
    Flow flow = Flow::kNormal;
    return Exec(body, &flow);
  }

 private:
  struct Depth {
    explicit Depth(int* d) : depth(d) { ++*depth; }
    ~Depth() { --*depth; }
    int* depth;
  };
  absl::Status Enter(int line) {
    if (++steps_ > limits_.max_steps)
      return Error(line, absl::StrCat("more than ", limits_.max_steps, " steps"));
    if (depth_ > 4 * limits_.max_depth) {
      return Error(line, absl::StrCat("rendering nested more than ", 4 * limits_.max_depth,
                                      " deep (macros calling themselves?)"));
    }
    return absl::OkStatus();
  }
  // Work in proportion to `bytes` made; and no single value beyond the output's bound.
  absl::Status Charge(size_t bytes, int line) {
    if (bytes > limits_.max_output_bytes) {
      return Error(line, absl::StrCat("a value of ", bytes, " bytes (at most ",
                                      limits_.max_output_bytes, ")"));
    }
    steps_ += static_cast<int64_t>(bytes / 16);
    if (steps_ > limits_.max_steps)
      return Error(line, absl::StrCat("more than ", limits_.max_steps, " steps"));
    return absl::OkStatus();
  }
  absl::Status ChargeItems(size_t n, int line) { return Charge(n * sizeof(Value), line); }
  // Checks a list being built against the bound without charging for it yet.
  absl::Status BoundItems(size_t n, int line) const {
    if (n * sizeof(Value) <= limits_.max_output_bytes) return absl::OkStatus();
    return Error(line, absl::StrCat("a list of ", n, " items (at most ",
                                    limits_.max_output_bytes / sizeof(Value), ")"));
  }

  absl::Status Write(absl::string_view s, int line) {
    if (out_->size() + s.size() > limits_.max_output_bytes) {
      return Error(line, absl::StrCat("the output passes ", limits_.max_output_bytes, " bytes"));
    }
    SG_RETURN_IF_ERROR(Charge(s.size(), line));
    out_->append(s.data(), s.size());
    return absl::OkStatus();
  }

  std::string S(const Value& v) const { return Str(v, limits_.max_output_bytes); }

  // Each scope looked in is a step, so that deep nesting cannot multiply the work a step
  // stands for.
  const Value* Lookup(const std::string& name) {
    for (size_t i = scopes_.size(); i-- > frame_;) {
      ++steps_;
      const auto it = scopes_[i].find(name);
      if (it != scopes_[i].end()) return &it->second;
    }
    const auto it = scopes_[0].find(name);
    return it == scopes_[0].end() ? nullptr : &it->second;
  }

  // --- statements ---

  absl::Status Exec(const Body& body, Flow* flow) {
    for (const auto& s : body) {
      SG_RETURN_IF_ERROR(ExecOne(*s, flow));
      if (*flow != Flow::kNormal) return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  absl::Status ExecOne(const Stmt& s, Flow* flow) {
    Depth d(&depth_);
    SG_RETURN_IF_ERROR(Enter(s.line));
    switch (s.kind) {
      case St::kText: return Write(s.text, s.line);
      case St::kOutput: {
        SG_ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        if (v.is_string()) return Write(v.as_string(), s.line);
        return Write(S(v), s.line);
      }
      case St::kIf:
        for (const auto& [cond, body] : s.branches) {
          SG_ASSIGN_OR_RETURN(Value c, Eval(*cond));
          if (Truthy(c)) return Exec(body, flow);
        }
        return Exec(s.else_body, flow);
      case St::kFor: return ExecFor(s, flow);
      case St::kSet: {
        SG_ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        return Assign(s, std::move(v));
      }
      case St::kSetBlock: {
        std::string captured;
        std::swap(captured, *out_);
        Flow inner = Flow::kNormal;
        const absl::Status st = Exec(s.body, &inner);
        std::swap(captured, *out_);
        SG_RETURN_IF_ERROR(st);
        return Assign(s, Value(std::move(captured)));
      }
      case St::kMacro: {
        auto f = std::make_shared<Callable>();
        f->kind = Callable::Kind::kMacro;
        f->macro = &s;
        scopes_.back()[s.targets[0]] = Value::Function(std::move(f));
        return absl::OkStatus();
      }
      case St::kBreak: *flow = Flow::kBreak; return absl::OkStatus();
      case St::kContinue: *flow = Flow::kContinue; return absl::OkStatus();
      case St::kBlock: return Exec(s.body, flow);
    }
    return absl::OkStatus();
  }

  absl::Status Assign(const Stmt& s, Value v) {
    if (!s.attr.empty()) {
      const Value* ns = Lookup(s.targets[0]);
      if (ns == nullptr || !ns->is_namespace()) {
        return Error(s.line, absl::StrCat("'", s.targets[0], "' is not a namespace: set ",
                                          s.targets[0], ".", s.attr, " needs one"));
      }
      SG_RETURN_IF_ERROR(NotNamespace(v, s.line));
      ns->mutable_namespace().Set(s.attr, std::move(v));
      return absl::OkStatus();
    }
    return Bind(s.targets, std::move(v), s.line);
  }

  absl::Status Bind(const std::vector<std::string>& targets, Value v, int line) {
    if (targets.size() == 1) {
      scopes_.back()[targets[0]] = std::move(v);
      return absl::OkStatus();
    }
    SG_ASSIGN_OR_RETURN(List items, Iterate(v, line));
    if (items.size() != targets.size()) {
      return Error(line,
                   absl::StrCat("cannot unpack ", items.size(), " values into ", targets.size()));
    }
    for (size_t i = 0; i < targets.size(); ++i) scopes_.back()[targets[i]] = std::move(items[i]);
    return absl::OkStatus();
  }

  absl::Status ExecFor(const Stmt& s, Flow* flow) {
    SG_ASSIGN_OR_RETURN(Value iterable, Eval(*s.expr));
    SG_ASSIGN_OR_RETURN(List items, Iterate(iterable, s.line));
    if (s.filter) {
      List kept;
      for (Value& item : items) {
        scopes_.emplace_back();
        absl::Status st = Bind(s.targets, item, s.line);
        absl::StatusOr<Value> keep = st.ok() ? Eval(*s.filter) : absl::StatusOr<Value>(st);
        scopes_.pop_back();
        if (!keep.ok()) return keep.status();
        if (Truthy(*keep)) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      SG_RETURN_IF_ERROR(Enter(s.line));
      Dict loop;
      loop.Set("index0", Value(i));
      loop.Set("index", Value(i + 1));
      loop.Set("revindex0", Value(n - 1 - i));
      loop.Set("revindex", Value(n - i));
      loop.Set("first", Value(i == 0));
      loop.Set("last", Value(i == n - 1));
      loop.Set("length", Value(n));
      if (i > 0) loop.Set("previtem", items[i - 1]);
      if (i + 1 < n) loop.Set("nextitem", items[i + 1]);
      loop.Set("depth", Value(1));
      loop.Set("depth0", Value(0));
      // Each pass has its own scope: what the body sets does not outlive the pass.
      scopes_.emplace_back();
      scopes_.back()["loop"] = Value(std::move(loop));
      Flow inner = Flow::kNormal;
      absl::Status st = Bind(s.targets, items[i], s.line);
      if (st.ok()) st = Exec(s.body, &inner);
      scopes_.pop_back();
      SG_RETURN_IF_ERROR(st);
      if (inner == Flow::kBreak) break;
    }
    if (n == 0) return Exec(s.else_body, flow);
    return absl::OkStatus();
  }

  // --- expressions ---

  static bool Truthy(const Value& v) {
    switch (v.kind()) {
      case Value::Kind::kUndefined:
      case Value::Kind::kNone: return false;
      case Value::Kind::kBool:
      case Value::Kind::kInt: return v.as_int() != 0;
      case Value::Kind::kFloat: return v.as_float() != 0;
      case Value::Kind::kString: return !v.as_string().empty();
      case Value::Kind::kList: return !v.as_list().empty();
      case Value::Kind::kDict: return v.is_namespace() || v.as_dict().size() > 0;
      case Value::Kind::kCallable: return true;
    }
    return false;
  }

  // "a string", "an int": for messages.
  static const char* TypeName(const Value& v) {
    switch (v.kind()) {
      case Value::Kind::kUndefined: return "an undefined value";
      case Value::Kind::kNone: return "none";
      case Value::Kind::kBool: return "a bool";
      case Value::Kind::kInt: return "an int";
      case Value::Kind::kFloat: return "a float";
      case Value::Kind::kString: return "a string";
      case Value::Kind::kList: return "a list";
      case Value::Kind::kDict: return v.is_namespace() ? "a namespace" : "a dict";
      case Value::Kind::kCallable: return "a function";
    }
    return "?";
  }

  // The items a for loop or a filter goes through: a list's, a dict's keys, a string's
  // characters; nothing for undefined, as Jinja's Undefined iterates empty.
  absl::StatusOr<List> Iterate(const Value& v, int line) {
    switch (v.kind()) {
      case Value::Kind::kUndefined: return List();
      case Value::Kind::kList: return v.as_list();
      case Value::Kind::kDict: {
        SG_RETURN_IF_ERROR(ChargeItems(v.as_dict().size(), line));
        List keys;
        for (const auto& e : v.as_dict().entries()) keys.emplace_back(e.first);
        return keys;
      }
      case Value::Kind::kString: {
        const std::string& s = v.as_string();
        SG_RETURN_IF_ERROR(ChargeItems(s.size(), line));
        List chars;
        for (size_t i = 0; i < s.size();) {
          const size_t len = CodePointLength(s, i);
          chars.emplace_back(s.substr(i, len));
          i += len;
        }
        return chars;
      }
      default: return Error(line, absl::StrCat(TypeName(v), " is not iterable"));
    }
  }

  // Python's ==. Each item compared is a step; past the budget it answers false, and the
  // caller's CheckSteps reports it.
  bool Equal(const Value& a, const Value& b) {
    if (++steps_ > limits_.max_steps) return false;
    if (a.is_number() || a.kind() == Value::Kind::kBool) {
      if (!(b.is_number() || b.kind() == Value::Kind::kBool)) return false;
      if (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat)
        return a.as_float() == b.as_float();
      return a.as_int() == b.as_int();
    }
    if (a.kind() != b.kind()) return false;
    switch (a.kind()) {
      case Value::Kind::kString: return a.as_string() == b.as_string();
      case Value::Kind::kList: {
        const List &x = a.as_list(), &y = b.as_list();
        if (x.size() != y.size()) return false;
        for (size_t i = 0; i < x.size(); ++i) {
          if (!Equal(x[i], y[i])) return false;
        }
        return true;
      }
      case Value::Kind::kDict: {
        if (a.is_namespace() || b.is_namespace()) return &a.as_dict() == &b.as_dict();
        if (a.as_dict().size() != b.as_dict().size()) return false;
        for (const auto& [k, v] : a.as_dict().entries()) {
          const Value* o = b.as_dict().Find(k);
          if (o == nullptr || !Equal(v, *o)) return false;
        }
        return true;
      }
      case Value::Kind::kCallable: return &a.as_callable() == &b.as_callable();
      default: return true;  // undefined, none
    }
  }

  // a < b as Python orders numbers, strings and lists; -2 when they do not compare.
  int Order(const Value& a, const Value& b) {
    if (++steps_ > limits_.max_steps) return 0;
    const bool an = a.is_number() || a.kind() == Value::Kind::kBool;
    const bool bn = b.is_number() || b.kind() == Value::Kind::kBool;
    if (an && bn) {
      if (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat) {
        return a.as_float() < b.as_float() ? -1 : a.as_float() > b.as_float() ? 1 : 0;
      }
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    }
    if (a.is_string() && b.is_string()) {
      const int c = a.as_string().compare(b.as_string());
      return c < 0 ? -1 : c > 0 ? 1 : 0;
    }
    if (a.is_list() && b.is_list()) {
      const List &x = a.as_list(), &y = b.as_list();
      for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
        if (Equal(x[i], y[i])) continue;
        return Order(x[i], y[i]);
      }
      return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
    }
    return -2;
  }

  absl::StatusOr<bool> Contains(const Value& container, const Value& item, int line) {
    switch (container.kind()) {
      case Value::Kind::kString:
        if (!item.is_string()) return Error(line, "'in <string>' needs a string on the left");
        SG_RETURN_IF_ERROR(Charge(container.as_string().size(), line));
        return absl::StrContains(container.as_string(), item.as_string());
      case Value::Kind::kList:
        SG_RETURN_IF_ERROR(ChargeItems(container.as_list().size(), line));
        for (const Value& e : container.as_list()) {
          if (Equal(e, item)) return true;
        }
        SG_RETURN_IF_ERROR(CheckSteps(line));
        return false;
      case Value::Kind::kDict:
        return item.is_string() && container.as_dict().Find(item.as_string()) != nullptr;
      case Value::Kind::kUndefined: return false;  // Jinja's Undefined holds nothing
      default: return Error(line, absl::StrCat("'in' ", TypeName(container)));
    }
  }

  // Values nest no deeper than this, so that comparing, printing and freeing them recurses
  // a bounded depth.
  static constexpr int kMaxValueDepth = 128;

  absl::StatusOr<Value> Eval(const Expr& e) {
    SG_ASSIGN_OR_RETURN(Value v, EvalNode(e));
    if (v.depth() > kMaxValueDepth) {
      return Error(e.line,
                   absl::StrCat("lists and dicts nested more than ", kMaxValueDepth, " deep"));
    }
    return v;
  }

  // A namespace is shared and changes; kept out of lists, dicts and other namespaces, it
  // can never hold itself.
  static absl::Status NotNamespace(const Value& v, int line) {
    if (v.is_namespace())
      return Error(line, "a namespace cannot be put in a list, dict or namespace");
    return absl::OkStatus();
  }

  absl::StatusOr<Value> EvalNode(const Expr& e) {
    Depth d(&depth_);
    SG_RETURN_IF_ERROR(Enter(e.line));
    switch (e.kind) {
      case Ex::kLiteral: return e.value;
      case Ex::kName: {
        const Value* v = Lookup(e.name);
        return v == nullptr ? Value() : *v;
      }
      case Ex::kAttr: {
        SG_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        return Attribute(obj, e.name, *e.args[0], e.line);
      }
      case Ex::kIndex: {
        SG_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        SG_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
        return Index(obj, key, *e.args[0], e.line);
      }
      case Ex::kSlice: return EvalSlice(e);
      case Ex::kNeg: {
        SG_ASSIGN_OR_RETURN(Value x, Eval(*e.args[0]));
        if (x.kind() == Value::Kind::kFloat) return Value(-x.as_float());
        if (x.kind() == Value::Kind::kInt || x.kind() == Value::Kind::kBool) {
          if (x.as_int() == INT64_MIN) return Error(e.line, "integer overflow");
          return Value(-x.as_int());
        }
        return Error(e.line, absl::StrCat("'-' of ", TypeName(x)));
      }
      case Ex::kNot: {
        SG_ASSIGN_OR_RETURN(Value x, Eval(*e.args[0]));
        return Value(!Truthy(x));
      }
      case Ex::kAnd:
      case Ex::kOr: {
        // Python returns the deciding operand, not a bool.
        Value v;
        for (const ExprPtr& a : e.args) {
          SG_ASSIGN_OR_RETURN(v, Eval(*a));
          if (Truthy(v) == (e.kind == Ex::kOr)) return v;
        }
        return v;
      }
      case Ex::kTernary: {
        SG_ASSIGN_OR_RETURN(Value c, Eval(*e.args[0]));
        return Eval(*e.args[Truthy(c) ? 1 : 2]);
      }
      case Ex::kChain: {
        SG_ASSIGN_OR_RETURN(Value acc, Eval(*e.args[0]));
        for (size_t i = 1; i < e.args.size(); ++i) {
          SG_ASSIGN_OR_RETURN(Value rhs, Eval(*e.args[i]));
          SG_ASSIGN_OR_RETURN(acc, Binary(e.ops[i - 1], acc, rhs, e.line));
        }
        return acc;
      }
      case Ex::kCompare: {
        SG_ASSIGN_OR_RETURN(Value lhs, Eval(*e.args[0]));
        for (size_t i = 1; i < e.args.size(); ++i) {
          SG_ASSIGN_OR_RETURN(Value rhs, Eval(*e.args[i]));
          SG_ASSIGN_OR_RETURN(bool holds, Compare(e.ops[i - 1], lhs, rhs, e.line));
          if (!holds) return Value(false);
          lhs = std::move(rhs);
        }
        return Value(true);
      }
      case Ex::kList: {
        SG_RETURN_IF_ERROR(ChargeItems(e.args.size(), e.line));
        List l;
        for (const ExprPtr& a : e.args) {
          SG_ASSIGN_OR_RETURN(Value v, Eval(*a));
          SG_RETURN_IF_ERROR(NotNamespace(v, e.line));
          l.push_back(std::move(v));
        }
        return Value(std::move(l));
      }
      case Ex::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          SG_ASSIGN_OR_RETURN(Value k, Eval(*e.args[i]));
          SG_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1]));
          if (!k.is_string())
            return Error(e.line, "dict keys other than strings are not supported");
          SG_RETURN_IF_ERROR(NotNamespace(v, e.line));
          d.Set(k.as_string(), std::move(v));
        }
        return Value(std::move(d));
      }
      case Ex::kCall: return EvalCall(e);
      case Ex::kFilter: return EvalFilter(e);
      case Ex::kTest: {
        SG_ASSIGN_OR_RETURN(bool r, EvalTest(e));
        return Value(r != e.negated);
      }
    }
    return Value();
  }

  absl::Status CheckSteps(int line) const {
    if (steps_ > limits_.max_steps)
      return Error(line, absl::StrCat("more than ", limits_.max_steps, " steps"));
    return absl::OkStatus();
  }

  absl::StatusOr<bool> Compare(const std::string& op, const Value& a, const Value& b, int line) {
    SG_ASSIGN_OR_RETURN(bool r, CompareUnchecked(op, a, b, line));
    SG_RETURN_IF_ERROR(CheckSteps(line));
    return r;
  }

  absl::StatusOr<bool> CompareUnchecked(const std::string& op, const Value& a, const Value& b,
                                        int line) {
    if (op == "==") return Equal(a, b);
    if (op == "!=") return !Equal(a, b);
    if (op == "in" || op == "not in") {
      SG_ASSIGN_OR_RETURN(bool in, Contains(b, a, line));
      return in == (op == "in");
    }
    const int c = Order(a, b);
    if (c == -2) {
      return Error(line,
                   absl::StrCat("'", op, "' between ", TypeName(a), " and ", TypeName(b)));
    }
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  absl::StatusOr<Value> Binary(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "~") {
      std::string s = S(a);
      const std::string t = S(b);
      SG_RETURN_IF_ERROR(Charge(s.size() + t.size(), line));
      s += t;
      return Value(std::move(s));
    }
    const bool an = a.is_number() || a.kind() == Value::Kind::kBool;
    const bool bn = b.is_number() || b.kind() == Value::Kind::kBool;
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        SG_RETURN_IF_ERROR(Charge(a.as_string().size() + b.as_string().size(), line));
        return Value(absl::StrCat(a.as_string(), b.as_string()));
      }
      if (a.is_list() && b.is_list()) {
        SG_RETURN_IF_ERROR(ChargeItems(a.as_list().size() + b.as_list().size(), line));
        List l = a.as_list();
        l.insert(l.end(), b.as_list().begin(), b.as_list().end());
        return Value(std::move(l));
      }
    }
    if (op == "*" && (a.is_string() || a.is_list() || b.is_string() || b.is_list()) && (an || bn)) {
      const Value& seq = an ? b : a;
      const int64_t times = std::max<int64_t>(0, (an ? a : b).as_int());
      if ((an ? a : b).kind() == Value::Kind::kFloat)
        return Error(line, "a sequence times a float");
      const size_t unit =
          seq.is_string() ? seq.as_string().size() : seq.as_list().size() * sizeof(Value);
      // An empty sequence repeated is empty, however many times: no loop over the count.
      if (unit == 0 || times == 0) return seq.is_string() ? Value(std::string()) : Value(List());
      if (static_cast<uint64_t>(times) > limits_.max_output_bytes / unit) {
        return Error(line, absl::StrCat("a repetition past ", limits_.max_output_bytes, " bytes"));
      }
      SG_RETURN_IF_ERROR(Charge(unit * static_cast<size_t>(times), line));
      if (seq.is_string()) {
        std::string s;
        for (int64_t i = 0; i < times; ++i) s += seq.as_string();
        return Value(std::move(s));
      }
      List l;
      for (int64_t i = 0; i < times; ++i)
        l.insert(l.end(), seq.as_list().begin(), seq.as_list().end());
      return Value(std::move(l));
    }
    if (!an || !bn) {
      return Error(line,
                   absl::StrCat("'", op, "' between ", TypeName(a), " and ", TypeName(b)));
    }
    const bool floats = a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat;
    if (op == "/") {
      if (b.as_float() == 0) return Error(line, "division by zero");
      return Value(a.as_float() / b.as_float());
    }
    if (floats) {
      const double x = a.as_float(), y = b.as_float();
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (op == "**") return Value(std::pow(x, y));
      if (y == 0) return Error(line, "division by zero");
      if (op == "//") return Value(std::floor(x / y));
      const double m = std::fmod(x, y);
      return Value(m != 0 && ((m < 0) != (y < 0)) ? m + y : m);
    }
    const int64_t x = a.as_int(), y = b.as_int();
    int64_t r = 0;
    if (op == "+" && !__builtin_add_overflow(x, y, &r)) return Value(r);
    if (op == "-" && !__builtin_sub_overflow(x, y, &r)) return Value(r);
    if (op == "*" && !__builtin_mul_overflow(x, y, &r)) return Value(r);
    if (op == "//" || op == "%") {
      if (y == 0) return Error(line, "division by zero");
      if (x == INT64_MIN && y == -1) return Error(line, "integer overflow");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value(op == "//" ? q : m);
    }
    if (op == "**") {
      if (y < 0) return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
      r = 1;
      for (int64_t i = 0; i < y; ++i) {
        if (__builtin_mul_overflow(r, x, &r)) return Error(line, "integer overflow");
        if (r == 0 || r == 1) break;
        SG_RETURN_IF_ERROR(Enter(line));
      }
      if (r == 1 && x == -1 && y % 2 == 1) r = -1;
      return Value(r);
    }
    return Error(line, "integer overflow");
  }

  absl::StatusOr<Value> Attribute(const Value& obj, const std::string& name, const Expr& of,
                                  int line) {
    if (obj.is_undefined()) return Undefined(of, line);
    if (obj.is_dict()) {
      const Value* v = obj.as_dict().Find(name);
      return v == nullptr ? Value() : *v;
    }
    return Value();
  }

  // Jinja's Undefined raises when looked into.
  absl::Status Undefined(const Expr& of, int line) {
    if (of.kind == Ex::kName) return Error(line, absl::StrCat("'", of.name, "' is undefined"));
    if (of.kind == Ex::kAttr) return Error(line, absl::StrCat("'", of.name, "' is undefined"));
    return Error(line, "a value is undefined");
  }

  absl::StatusOr<Value> Index(const Value& obj, const Value& key, const Expr& of, int line) {
    switch (obj.kind()) {
      case Value::Kind::kUndefined: return Undefined(of, line);
      case Value::Kind::kDict: {
        if (!key.is_string()) return Value();
        const Value* v = obj.as_dict().Find(key.as_string());
        return v == nullptr ? Value() : *v;
      }
      case Value::Kind::kList: {
        if (key.kind() != Value::Kind::kInt && key.kind() != Value::Kind::kBool) return Value();
        const auto n = static_cast<int64_t>(obj.as_list().size());
        int64_t i = key.as_int();
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value();
        return obj.as_list()[i];
      }
      case Value::Kind::kString: {
        if (key.kind() != Value::Kind::kInt) return Value();
        const std::string& s = obj.as_string();
        SG_RETURN_IF_ERROR(Charge(s.size(), line));
        const std::vector<size_t> at = CodePointOffsets(s);
        const auto n = static_cast<int64_t>(at.size() - 1);
        int64_t i = key.as_int();
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value();
        return Value(s.substr(at[i], at[i + 1] - at[i]));
      }
      default: return Value();
    }
  }

  absl::StatusOr<Value> EvalSlice(const Expr& e) {
    SG_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
    int64_t bounds[3];
    bool given[3];
    for (int k = 0; k < 3; ++k) {
      given[k] = e.args[k + 1] != nullptr;
      if (!given[k]) continue;
      SG_ASSIGN_OR_RETURN(Value v, Eval(*e.args[k + 1]));
      if (v.is_none()) {
        given[k] = false;
        continue;
      }
      if (v.kind() != Value::Kind::kInt) return Error(e.line, "slice bounds must be integers");
      bounds[k] = v.as_int();
    }
    const int64_t step = given[2] ? bounds[2] : 1;
    if (step == 0) return Error(e.line, "slice step cannot be zero");
    std::vector<size_t> at;
    int64_t n;
    if (obj.is_string()) {
      SG_RETURN_IF_ERROR(Charge(obj.as_string().size(), e.line));
      at = CodePointOffsets(obj.as_string());
      n = static_cast<int64_t>(at.size() - 1);
    } else if (obj.is_list()) {
      n = static_cast<int64_t>(obj.as_list().size());
      SG_RETURN_IF_ERROR(ChargeItems(obj.as_list().size(), e.line));
    } else if (obj.is_undefined()) {
      return Undefined(*e.args[0], e.line);
    } else {
      return Error(e.line, absl::StrCat("slice of ", TypeName(obj)));
    }
    // Python's slice.indices().
    auto adjust = [&](int k, int64_t dflt) {
      if (!given[k]) return dflt;
      int64_t v = bounds[k];
      if (v < 0) v = std::max<int64_t>(v + n, step < 0 ? -1 : 0);
      return std::min<int64_t>(v, step < 0 ? n - 1 : n);
    };
    const int64_t start = adjust(0, step < 0 ? n - 1 : 0);
    const int64_t stop = adjust(1, step < 0 ? -1 : n);
    std::vector<int64_t> picks;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) picks.push_back(i);
    if (obj.is_string()) {
      std::string s;
      for (int64_t i : picks) s.append(obj.as_string(), at[i], at[i + 1] - at[i]);
      return Value(std::move(s));
    }
    List l;
    for (int64_t i : picks) l.push_back(obj.as_list()[i]);
    return Value(std::move(l));
  }

  // --- calls ---

  struct Args {
    List pos;
    std::vector<std::pair<std::string, Value>> named;
    const Value* Get(size_t i, absl::string_view name) const {
      if (i < pos.size()) return &pos[i];
      for (const auto& [k, v] : named) {
        if (k == name) return &v;
      }
      return nullptr;
    }
  };

  // Arguments from args[first...] and kwargs.
  absl::StatusOr<Args> EvalArgs(const Expr& e, size_t first) {
    Args a;
    for (size_t i = first; i < e.args.size(); ++i) {
      SG_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
      a.pos.push_back(std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      SG_ASSIGN_OR_RETURN(Value v, Eval(*x));
      a.named.emplace_back(k, std::move(v));
    }
    return a;
  }

  absl::StatusOr<Value> EvalCall(const Expr& e) {
    const Expr& callee = *e.args[0];
    if (callee.kind == Ex::kAttr) {
      // A method: obj.name(...)
      SG_ASSIGN_OR_RETURN(Value obj, Eval(*callee.args[0]));
      if (obj.is_undefined()) return Undefined(*callee.args[0], e.line);
      if (!(obj.is_dict() && obj.as_dict().Find(callee.name) != nullptr)) {
        SG_ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1));
        return Method(obj, callee.name, args, e.line);
      }
    }
    SG_ASSIGN_OR_RETURN(Value f, Eval(callee));
    if (f.kind() != Value::Kind::kCallable) {
      return Error(
          e.line,
          absl::StrCat(callee.kind == Ex::kName ? absl::StrCat("'", callee.name, "'") : "the value",
                       f.is_undefined() ? " is undefined" : " is not a function"));
    }
    SG_ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1));
    const Callable& c = f.as_callable();
    switch (c.kind) {
      case Callable::Kind::kMacro:
        return CallMacro(*static_cast<const Stmt*>(c.macro), args, e.line);
      case Callable::Kind::kRange: {
        int64_t r[3] = {0, 0, 1};
        if (args.pos.empty() || args.pos.size() > 3)
          return Error(e.line, "range() takes 1 to 3 arguments");
        for (size_t i = 0; i < args.pos.size(); ++i) {
          if (args.pos[i].kind() != Value::Kind::kInt)
            return Error(e.line, "range() takes integers");
        }
        if (args.pos.size() == 1) {
          r[1] = args.pos[0].as_int();
        } else {
          r[0] = args.pos[0].as_int();
          r[1] = args.pos[1].as_int();
          if (args.pos.size() == 3) r[2] = args.pos[2].as_int();
        }
        if (r[2] == 0) return Error(e.line, "range() step cannot be zero");
        const double count =
            std::ceil((static_cast<double>(r[1]) - static_cast<double>(r[0])) / r[2]);
        if (count > static_cast<double>(limits_.max_output_bytes / sizeof(Value))) {
          return Error(e.line, absl::StrCat("range() of ", count, " numbers"));
        }
        const auto n = static_cast<size_t>(std::max(0.0, count));
        SG_RETURN_IF_ERROR(ChargeItems(n, e.line));
        List l;
        l.reserve(n);
        for (size_t i = 0; i < n; ++i) l.emplace_back(r[0] + static_cast<int64_t>(i) * r[2]);
        return Value(std::move(l));
      }
      case Callable::Kind::kNamespace:
      case Callable::Kind::kDict: {
        Dict d;
        if (!args.pos.empty()) {
          if (args.pos.size() > 1 || !args.pos[0].is_dict())
            return Error(e.line, "namespace() takes a dict or names");
          d = args.pos[0].as_dict();
        }
        for (auto& [k, v] : args.named) {
          SG_RETURN_IF_ERROR(NotNamespace(v, e.line));
          d.Set(k, v);
        }
        return c.kind == Callable::Kind::kNamespace ? Value::Namespace(std::move(d))
                                                    : Value(std::move(d));
      }
      case Callable::Kind::kRaise: {
        const std::string message = args.pos.empty() ? "" : S(args.pos[0]);
        return Error(e.line, absl::StrCat("the template raised: ", message));
      }
      case Callable::Kind::kStrftime: {
        if (args.pos.size() != 1 || !args.pos[0].is_string() ||
            args.pos[0].as_string().size() > 64) {
          return Error(e.line, "strftime_now() takes one format of at most 64 bytes");
        }
        std::tm when{};
        if (env_.now.has_value()) {
          when = *env_.now;
        } else {
          const std::time_t now = std::time(nullptr);
          if (localtime_r(&now, &when) == nullptr)
            return Error(e.line, "strftime_now(): no local time");
        }
        char buf[512];
        const size_t n = std::strftime(buf, sizeof(buf), args.pos[0].as_string().c_str(), &when);
        if (n == 0 && !args.pos[0].as_string().empty())
          return Error(e.line, "strftime_now(): bad format");
        return Value(std::string(buf, n));
      }
    }
    return Value();
  }

  absl::StatusOr<Value> CallMacro(const Stmt& m, const Args& args, int line) {
    if (args.pos.size() > m.params.size()) {
      return Error(
          line, absl::StrCat("macro '", m.targets[0], "' takes ", m.params.size(), " arguments"));
    }
    // The macro sees the globals and its arguments, not the caller's locals.
    const size_t saved_frame = frame_;
    scopes_.emplace_back();
    frame_ = scopes_.size() - 1;
    absl::Status st;
    for (size_t i = 0; i < m.params.size() && st.ok(); ++i) {
      const Value* v = args.Get(i, m.params[i]);
      if (v != nullptr) {
        scopes_.back()[m.params[i]] = *v;
      } else if (m.defaults[i]) {
        absl::StatusOr<Value> d = Eval(*m.defaults[i]);
        if (d.ok()) {
          scopes_[frame_][m.params[i]] = *std::move(d);
        } else {
          st = d.status();
        }
      }
    }
    std::string captured;
    std::swap(captured, *out_);
    Flow flow = Flow::kNormal;
    if (st.ok()) st = Exec(m.body, &flow);
    std::swap(captured, *out_);
    scopes_.pop_back();
    frame_ = saved_frame;
    SG_RETURN_IF_ERROR(st);
    return Value(std::move(captured));
  }

  absl::StatusOr<Value> Method(const Value& obj, const std::string& name, const Args& a, int line) {
    auto bad = [&]() {
      return Error(line, absl::StrCat(TypeName(obj), " has no method '", name, "' here"));
    };
    auto str_arg = [&](size_t i, absl::string_view n) -> const std::string* {
      const Value* v = a.Get(i, n);
      return v != nullptr && v->is_string() ? &v->as_string() : nullptr;
    };
    if (obj.is_string()) {
      const std::string& s = obj.as_string();
      SG_RETURN_IF_ERROR(Charge(s.size(), line));
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const Value* chars = a.Get(0, "chars");
        if (chars != nullptr && !chars->is_string() && !chars->is_none()) return bad();
        return Value(Strip(s,
                           chars != nullptr && chars->is_string() ? &chars->as_string() : nullptr,
                           name != "rstrip", name != "lstrip"));
      }
      if (name == "startswith" || name == "endswith") {
        const Value* p = a.Get(0, "prefix");
        if (p == nullptr) return bad();
        List options = p->is_list() ? p->as_list() : List{*p};
        for (const Value& o : options) {
          if (!o.is_string()) return bad();
          if (name == "startswith" ? absl::StartsWith(s, o.as_string())
                                   : absl::EndsWith(s, o.as_string())) {
            return Value(true);
          }
        }
        return Value(false);
      }
      if (name == "upper") return Value(absl::AsciiStrToUpper(s));
      if (name == "lower") return Value(absl::AsciiStrToLower(s));
      if (name == "title") return Value(Title(s));
      if (name == "capitalize") return Value(Capitalize(s));
      if (name == "replace") {
        const std::string *from = str_arg(0, "old"), *to = str_arg(1, "new");
        const Value* count = a.Get(2, "count");
        if (from == nullptr || to == nullptr) return bad();
        return Replace(s, *from, *to, count != nullptr ? count->as_int() : -1, line);
      }
      if (name == "split" || name == "rsplit") {
        const Value* sep = a.Get(0, "sep");
        const Value* max = a.Get(1, "maxsplit");
        if (sep != nullptr && !sep->is_string() && !sep->is_none()) return bad();
        return Split(s, sep != nullptr && sep->is_string() ? &sep->as_string() : nullptr,
                     max != nullptr ? max->as_int() : -1, name == "rsplit", line);
      }
      if (name == "find" || name == "count") {
        const std::string* sub = str_arg(0, "sub");
        if (sub == nullptr) return bad();
        if (name == "find") {
          const size_t at = s.find(*sub);
          if (at == std::string::npos) return Value(-1);
          return Value(static_cast<int64_t>(CodePointOffsets(s.substr(0, at)).size() - 1));
        }
        if (sub->empty()) return Value(static_cast<int64_t>(CodePointOffsets(s).size()));
        int64_t n = 0;
        for (size_t at = s.find(*sub); at != std::string::npos; at = s.find(*sub, at + sub->size()))
          ++n;
        return Value(n);
      }
      if (name == "join") {
        const Value* items = a.Get(0, "iterable");
        if (items == nullptr) return bad();
        return Join(*items, s, line);
      }
      return bad();
    }
    if (obj.is_dict() && !obj.is_namespace()) {
      const Dict& d = obj.as_dict();
      if (name == "items" || name == "keys" || name == "values") {
        SG_RETURN_IF_ERROR(ChargeItems(d.size() * 3, line));
        List l;
        for (const auto& [k, v] : d.entries()) {
          if (name == "items") {
            l.emplace_back(List{Value(k), v});
          } else {
            l.push_back(name == "keys" ? Value(k) : v);
          }
        }
        return Value(std::move(l));
      }
      if (name == "get") {
        const std::string* key = str_arg(0, "key");
        const Value* dflt = a.Get(1, "default");
        const Value* v = key != nullptr ? d.Find(*key) : nullptr;
        return v != nullptr ? *v : dflt != nullptr ? *dflt : Value::None();
      }
    }
    return bad();
  }

  static std::string Title(absl::string_view s) {
    std::string out(s);
    bool prev_cased = false;
    for (char& c : out) {
      const bool alpha = absl::ascii_isalpha(static_cast<unsigned char>(c));
      if (alpha) c = prev_cased ? absl::ascii_tolower(c) : absl::ascii_toupper(c);
      prev_cased = alpha;
    }
    return out;
  }
  static std::string Capitalize(absl::string_view s) {
    std::string out = absl::AsciiStrToLower(s);
    if (!out.empty()) out[0] = absl::ascii_toupper(out[0]);
    return out;
  }

  absl::StatusOr<Value> Replace(const std::string& s, const std::string& from,
                                const std::string& to, int64_t count, int line) {
    if (from.empty()) return Error(line, "replace() of an empty string is not supported");
    std::string out;
    size_t at = 0;
    for (int64_t n = 0; count < 0 || n < count; ++n) {
      const size_t hit = s.find(from, at);
      if (hit == std::string::npos) break;
      out.append(s, at, hit - at);
      out += to;
      at = hit + from.size();
      SG_RETURN_IF_ERROR(Charge(out.size() > s.size() ? to.size() : 0, line));
      if (out.size() > limits_.max_output_bytes) return Charge(out.size(), line);
    }
    out.append(s, at, std::string::npos);
    return Value(std::move(out));
  }

  absl::StatusOr<Value> Split(const std::string& s, const std::string* sep, int64_t max,
                              bool from_right, int line) {
    if (from_right && max >= 0) return Error(line, "rsplit() with maxsplit is not supported");
    List parts;
    if (sep == nullptr) {
      size_t i = 0, len;
      int64_t splits = 0;
      while (true) {
        while (i < s.size() && IsPythonSpace(CodePointAt(s, i, &len))) i += len;
        if (i >= s.size()) break;
        if (max >= 0 && splits == max) {
          // The rest, without its trailing whitespace.
          parts.emplace_back(Strip(s.substr(i), nullptr, false, true));
          break;
        }
        size_t e = i;
        while (e < s.size() && !IsPythonSpace(CodePointAt(s, e, &len))) e += len;
        parts.emplace_back(s.substr(i, e - i));
        SG_RETURN_IF_ERROR(BoundItems(parts.size(), line));
        ++splits;
        i = e;
      }
    } else {
      if (sep->empty()) return Error(line, "split() with an empty separator");
      size_t at = 0;
      for (int64_t n = 0; max < 0 || n < max; ++n) {
        const size_t hit = s.find(*sep, at);
        if (hit == std::string::npos) break;
        parts.emplace_back(s.substr(at, hit - at));
        SG_RETURN_IF_ERROR(BoundItems(parts.size(), line));
        at = hit + sep->size();
      }
      parts.emplace_back(s.substr(at));
    }
    SG_RETURN_IF_ERROR(ChargeItems(parts.size(), line));
    return Value(std::move(parts));
  }

  absl::StatusOr<Value> Join(const Value& items, absl::string_view sep, int line,
                             const std::string* attr = nullptr) {
    SG_ASSIGN_OR_RETURN(List l, Iterate(items, line));
    std::string out;
    for (size_t i = 0; i < l.size(); ++i) {
      if (i > 0) out.append(sep.data(), sep.size());
      const Value* v = &l[i];
      if (attr != nullptr) {
        v = l[i].is_dict() ? l[i].as_dict().Find(*attr) : nullptr;
        if (v == nullptr) continue;
      }
      AppendStr(*v, limits_.max_output_bytes, &out);
      SG_RETURN_IF_ERROR(Charge(out.size() > limits_.max_output_bytes ? out.size() : 0, line));
    }
    SG_RETURN_IF_ERROR(Charge(out.size(), line));
    return Value(std::move(out));
  }

  // --- filters ---

  absl::StatusOr<Value> EvalFilter(const Expr& e) {
    SG_ASSIGN_OR_RETURN(Value x, Eval(*e.args[0]));
    SG_ASSIGN_OR_RETURN(Args a, EvalArgs(e, 1));
    return Filter(e.name, x, a, e.line);
  }

  absl::StatusOr<Value> Filter(const std::string& name, const Value& x, const Args& a, int line) {
    auto bad = [&](absl::string_view why) {
      return Error(line, absl::StrCat("filter '", name, "': ", why));
    };
    if (x.is_string()) SG_RETURN_IF_ERROR(Charge(x.as_string().size(), line));
    if (name == "trim") {
      const std::string s = S(x);
      const Value* chars = a.Get(0, "chars");
      return Value(Strip(s, chars != nullptr && chars->is_string() ? &chars->as_string() : nullptr,
                         true, true));
    }
    if (name == "safe" || name == "e" || name == "escape") {
      if (name != "safe") return bad("HTML escaping is not supported");
      return x;
    }
    if (name == "string") return x.is_string() ? x : Value(S(x));
    if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
      const std::string s = S(x);
      return Value(name == "upper"   ? absl::AsciiStrToUpper(s)
                   : name == "lower" ? absl::AsciiStrToLower(s)
                   : name == "title" ? Title(s)
                                     : Capitalize(s));
    }
    if (name == "replace") {
      if (a.pos.size() < 2 || !a.pos[0].is_string() || !a.pos[1].is_string())
        return bad("needs two strings");
      return Replace(S(x), a.pos[0].as_string(), a.pos[1].as_string(),
                     a.pos.size() > 2 ? a.pos[2].as_int() : -1, line);
    }
    if (name == "length" || name == "count") {
      switch (x.kind()) {
        case Value::Kind::kString:
          return Value(static_cast<int64_t>(CodePointOffsets(x.as_string()).size() - 1));
        case Value::Kind::kList: return Value(static_cast<int64_t>(x.as_list().size()));
        case Value::Kind::kDict: return Value(static_cast<int64_t>(x.as_dict().size()));
        case Value::Kind::kUndefined: return Value(0);
        default: return bad(absl::StrCat(TypeName(x), " has no length"));
      }
    }
    if (name == "tojson") {
      JsonStyle style;
      if (const Value* indent = a.Get(1, "indent"); indent != nullptr && !indent->is_none()) {
        if (indent->kind() != Value::Kind::kInt || indent->as_int() < 0 || indent->as_int() > 16) {
          return bad("indent must be an integer from 0 to 16");
        }
        style.indent = static_cast<int>(indent->as_int());
        style.item_sep = ",";
      }
      if (const Value* v = a.Get(0, "ensure_ascii"); v != nullptr) style.ensure_ascii = Truthy(*v);
      if (const Value* v = a.Get(3, "sort_keys"); v != nullptr) style.sort_keys = Truthy(*v);
      if (const Value* v = a.Get(2, "separators"); v != nullptr && !v->is_none()) {
        if (!v->is_list() || v->as_list().size() != 2 || !v->as_list()[0].is_string() ||
            !v->as_list()[1].is_string()) {
          return bad("separators must be two strings");
        }
        style.item_sep = v->as_list()[0].as_string();
        style.key_sep = v->as_list()[1].as_string();
      }
      std::string out;
      SG_RETURN_IF_ERROR(Json(x, style, 0, line, &out));
      return Value(std::move(out));
    }
    if (name == "join") {
      const Value* sep = a.Get(0, "d");
      const Value* attr = a.Get(1, "attribute");
      return Join(x, sep != nullptr ? S(*sep) : "", line,
                  attr != nullptr && attr->is_string() ? &attr->as_string() : nullptr);
    }
    if (name == "first" || name == "last") {
      if (x.is_string()) {
        const std::vector<size_t> at = CodePointOffsets(x.as_string());
        if (at.size() == 1) return Value();
        const size_t i = name == "first" ? 0 : at.size() - 2;
        return Value(x.as_string().substr(at[i], at[i + 1] - at[i]));
      }
      SG_ASSIGN_OR_RETURN(List l, Iterate(x, line));
      if (l.empty()) return Value();
      return name == "first" ? l.front() : l.back();
    }
    if (name == "default" || name == "d") {
      const Value* dflt = a.Get(0, "default_value");
      const Value* boolean = a.Get(1, "boolean");
      const bool use = x.is_undefined() || (boolean != nullptr && Truthy(*boolean) && !Truthy(x));
      return use ? (dflt != nullptr ? *dflt : Value("")) : x;
    }
    if (name == "items") {
      if (x.is_undefined()) return Value(List());
      if (!x.is_dict()) return bad(absl::StrCat("not for ", TypeName(x)));
      return Method(x, "items", Args(), line);
    }
    if (name == "list") {
      SG_ASSIGN_OR_RETURN(List l, Iterate(x, line));
      return Value(std::move(l));
    }
    if (name == "reverse") {
      if (x.is_string()) {
        const std::vector<size_t> at = CodePointOffsets(x.as_string());
        std::string s;
        for (size_t i = at.size() - 1; i-- > 0;) s.append(x.as_string(), at[i], at[i + 1] - at[i]);
        return Value(std::move(s));
      }
      SG_ASSIGN_OR_RETURN(List l, Iterate(x, line));
      std::reverse(l.begin(), l.end());
      return Value(std::move(l));
    }
    if (name == "int") {
      const Value* dflt = a.Get(0, "default");
      switch (x.kind()) {
        case Value::Kind::kInt:
        case Value::Kind::kBool: return Value(x.as_int());
        case Value::Kind::kFloat:
          if (std::isfinite(x.as_float()) && std::fabs(x.as_float()) < 9.2e18) {
            return Value(static_cast<int64_t>(x.as_float()));
          }
          break;
        case Value::Kind::kString: {
          const std::string s = Strip(x.as_string(), nullptr, true, true);
          int64_t i = 0;
          const auto r =
              std::from_chars(s.data() + (!s.empty() && s[0] == '+'), s.data() + s.size(), i);
          if (r.ec == std::errc() && r.ptr == s.data() + s.size()) return Value(i);
          char* end = nullptr;
          const double d = std::strtod(s.c_str(), &end);
          if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(d) &&
              std::fabs(d) < 9.2e18) {
            return Value(static_cast<int64_t>(d));
          }
          break;
        }
        default: break;
      }
      return dflt != nullptr ? *dflt : Value(0);
    }
    if (name == "float") {
      if (x.is_number() || x.kind() == Value::Kind::kBool) return Value(x.as_float());
      if (x.is_string()) {
        const std::string s = Strip(x.as_string(), nullptr, true, true);
        char* end = nullptr;
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size()) return Value(d);
      }
      return Value(0.0);
    }
    if (name == "abs") {
      if (x.kind() == Value::Kind::kFloat) return Value(std::fabs(x.as_float()));
      if (x.kind() == Value::Kind::kInt && x.as_int() != INT64_MIN)
        return Value(x.as_int() < 0 ? -x.as_int() : x.as_int());
      return bad(absl::StrCat("not for ", TypeName(x)));
    }
    if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
      const bool by_attr = name == "selectattr" || name == "rejectattr";
      const bool keep_if = name == "selectattr" || name == "select";
      // Jinja goes through a false sequence (none) as an empty one here.
      SG_ASSIGN_OR_RETURN(List l, Truthy(x) ? Iterate(x, line) : List());
      if (by_attr && (a.pos.empty() || !a.pos[0].is_string()))
        return bad("needs an attribute name");
      const size_t test_at = by_attr ? 1 : 0;
      std::string test;
      if (a.pos.size() > test_at) {
        if (!a.pos[test_at].is_string()) return bad("the test must be a name");
        test = a.pos[test_at].as_string();
      }
      Args test_args;
      for (size_t i = test_at + 1; i < a.pos.size(); ++i) test_args.pos.push_back(a.pos[i]);
      List kept;
      for (const Value& item : l) {
        SG_RETURN_IF_ERROR(Enter(line));
        Value subject = item;
        if (by_attr) {
          SG_ASSIGN_OR_RETURN(subject, AttrPath(item, a.pos[0].as_string()));
        }
        bool pass;
        if (test.empty()) {
          pass = Truthy(subject);
        } else {
          SG_ASSIGN_OR_RETURN(pass, Test(test, subject, test_args, line));
        }
        if (pass == keep_if) kept.push_back(item);
      }
      return Value(std::move(kept));
    }
    if (name == "map") {
      SG_ASSIGN_OR_RETURN(List l, Truthy(x) ? Iterate(x, line) : List());
      const Value* attr = a.Get(99, "attribute");
      List mapped;
      if (attr != nullptr) {
        if (!attr->is_string()) return bad("attribute must be a name");
        const Value* dflt = a.Get(99, "default");
        for (const Value& item : l) {
          SG_RETURN_IF_ERROR(Enter(line));
          SG_ASSIGN_OR_RETURN(Value v, AttrPath(item, attr->as_string()));
          mapped.push_back(v.is_undefined() && dflt != nullptr ? *dflt : v);
        }
        return Value(std::move(mapped));
      }
      if (a.pos.empty() || !a.pos[0].is_string()) return bad("needs a filter name or attribute=");
      Args rest;
      for (size_t i = 1; i < a.pos.size(); ++i) rest.pos.push_back(a.pos[i]);
      for (const Value& item : l) {
        SG_RETURN_IF_ERROR(Enter(line));
        SG_ASSIGN_OR_RETURN(Value v, Filter(a.pos[0].as_string(), item, rest, line));
        mapped.push_back(std::move(v));
      }
      return Value(std::move(mapped));
    }
    return Error(line, absl::StrCat("the filter '", name, "' is not supported"));
  }

  // attribute="a.b": Jinja's dotted attribute path for map and selectattr.
  absl::StatusOr<Value> AttrPath(const Value& item, const std::string& path) {
    Value v = item;
    for (absl::string_view part : absl::StrSplit(path, '.')) {
      if (v.is_dict()) {
        const Value* next = v.as_dict().Find(part);
        v = next != nullptr ? *next : Value();
      } else if (v.is_list() && !part.empty() &&
                 absl::ascii_isdigit(static_cast<unsigned char>(part[0]))) {
        const size_t i = static_cast<size_t>(std::atoll(std::string(part).c_str()));
        v = i < v.as_list().size() ? v.as_list()[i] : Value();
      } else {
        v = Value();
      }
    }
    return v;
  }

  absl::Status Json(const Value& x, const JsonStyle& style, int level, int line, std::string* out) {
    // Values nest at most kMaxValueDepth deep (Eval checks); the size is charged after.
    SG_RETURN_IF_ERROR(AppendJson(x, style, level, line, limits_.max_output_bytes, out));
    return Charge(out->size(), line);
  }

  // --- tests ---

  absl::StatusOr<bool> EvalTest(const Expr& e) {
    if (e.name == "defined" || e.name == "undefined") {
      // Looking into an undefined value is an error elsewhere, but `x.y is defined` of an
      // undefined x is an error in Jinja too; only the value itself is asked about here.
      SG_ASSIGN_OR_RETURN(Value x, Eval(*e.args[0]));
      return x.is_undefined() == (e.name == "undefined");
    }
    SG_ASSIGN_OR_RETURN(Value x, Eval(*e.args[0]));
    SG_ASSIGN_OR_RETURN(Args a, EvalArgs(e, 1));
    return Test(e.name, x, a, e.line);
  }

  absl::StatusOr<bool> Test(const std::string& name, const Value& x, const Args& a, int line) {
    SG_ASSIGN_OR_RETURN(bool r, TestUnchecked(name, x, a, line));
    SG_RETURN_IF_ERROR(CheckSteps(line));
    return r;
  }

  absl::StatusOr<bool> TestUnchecked(const std::string& name, const Value& x, const Args& a,
                                     int line) {
    const Value* arg = a.pos.empty() ? nullptr : &a.pos[0];
    const Value::Kind k = x.kind();
    if (name == "defined") return !x.is_undefined();
    if (name == "undefined") return x.is_undefined();
    if (name == "none") return x.is_none();
    if (name == "string") return x.is_string();
    if (name == "mapping") return x.is_dict();
    if (name == "iterable") return x.is_list() || x.is_dict() || x.is_string();
    if (name == "sequence") return x.is_list() || x.is_dict() || x.is_string();
    if (name == "number") return x.is_number();
    if (name == "integer") return k == Value::Kind::kInt;
    if (name == "float") return k == Value::Kind::kFloat;
    if (name == "boolean") return k == Value::Kind::kBool;
    if (name == "true") return k == Value::Kind::kBool && x.as_bool();
    if (name == "false") return k == Value::Kind::kBool && !x.as_bool();
    if (name == "callable") return k == Value::Kind::kCallable;
    if (name == "odd" || name == "even") {
      if (k != Value::Kind::kInt) return Error(line, "'odd' and 'even' need an integer");
      return (x.as_int() % 2 != 0) == (name == "odd");
    }
    if (name == "lower" || name == "upper") {
      const std::string s = S(x);
      return s == (name == "lower" ? absl::AsciiStrToLower(s) : absl::AsciiStrToUpper(s));
    }
    if (arg == nullptr)
      return Error(line,
                   absl::StrCat("the test '", name, "' is not supported or needs an argument"));
    if (name == "equalto" || name == "eq" || name == "==" || name == "sameas")
      return Equal(x, *arg);
    if (name == "ne" || name == "!=") return !Equal(x, *arg);
    if (name == "in") return Contains(*arg, x, line);
    for (const char* op : {"lt", "le", "gt", "ge"}) {
      if (name == op) {
        const int c = Order(x, *arg);
        if (c == -2)
          return Error(line, absl::StrCat("'", name, "' between ", TypeName(x), " and ",
                                          TypeName(*arg)));
        return name == "lt" ? c < 0 : name == "le" ? c <= 0 : name == "gt" ? c > 0 : c >= 0;
      }
    }
    return Error(line, absl::StrCat("the test '", name, "' is not supported"));
  }

  const Limits& limits_;
  const Environment& env_;
  std::string* out_;
  std::vector<Scope> scopes_;
  size_t frame_ = 0;  // the innermost macro's first scope; 0 outside macros
  int64_t steps_ = 0;
  int depth_ = 0;
};

}  // namespace

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

absl::StatusOr<Template> Template::Parse(absl::string_view text, const Limits& limits) {
  if (text.size() > limits.max_template_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chat template of ", text.size(), " bytes (at most ", limits.max_template_bytes, ")"));
  }
  // Jinja reads every line ending as \n and drops one final newline.
  std::string source;
  source.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\r') {
      source.push_back('\n');
      if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
    } else {
      source.push_back(text[i]);
    }
  }
  if (!source.empty() && source.back() == '\n') source.pop_back();
  SG_ASSIGN_OR_RETURN(std::vector<Token> tokens, Lexer(std::move(source)).Run());
  SG_ASSIGN_OR_RETURN(Body body, Parser(std::move(tokens), limits.max_depth).Run());
  Template t;
  t.program_ = std::make_unique<Program>();
  t.program_->body = std::move(body);
  t.limits_ = limits;
  return t;
}

absl::StatusOr<std::string> Template::Render(const Dict& variables, const Environment& env) const {
  std::string out;
  Renderer r(limits_, env, &out);
  SG_RETURN_IF_ERROR(r.Run(program_->body, variables));
  return out;
}

}  // namespace sg::jinja
