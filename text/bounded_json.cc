// Bounded JSON parsing and previews (see bounded_json.h).
#include "text/bounded_json.h"

#include <new>

#include "absl/strings/str_cat.h"

namespace sg {
namespace {

using Json = nlohmann::json;

// The parser's message quotes the token it stopped at, which may be the whole file (a
// number of a million digits): at most 200 bytes of it are kept.
std::string Cut(absl::string_view message) {
  if (message.size() <= 200) return std::string(message);
  return absl::StrCat(message.substr(0, 197), "...");
}

// A first pass over the text that builds nothing: it counts values and depth, and stops
// at the first one past a bound (or at a syntax error, which it words as the parser does).
class BoundsCheck : public nlohmann::json_sax<Json> {
 public:
  explicit BoundsCheck(const JsonLimits& limits) : limits_(limits) {}

  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override { return Value(); }
  bool string(string_t&) override { return Value(); }
  bool binary(binary_t&) override { return Value(); }
  bool start_object(std::size_t) override { return Open(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open(); }
  bool end_array() override { return Close(); }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& e) override {
    error_ = absl::StrCat("invalid JSON: ", Cut(e.what()));
    return false;
  }

  // Empty when the text is within bounds.
  const std::string& error() const { return error_; }

 private:
  bool Value() {
    if (++values_ <= limits_.max_values) return true;
    error_ = absl::StrCat("JSON with more than ", limits_.max_values,
                          " values (refused before it is built)");
    return false;
  }
  bool Open() {
    if (++depth_ > limits_.max_depth) {
      error_ = absl::StrCat("JSON with nesting deeper than ", limits_.max_depth,
                            " levels (refused before it is built)");
      return false;
    }
    return Value();
  }
  bool Close() {
    --depth_;
    return true;
  }

  const JsonLimits& limits_;
  int64_t values_ = 0;
  int depth_ = 0;
  std::string error_;
};

// Appends v's JSON to *out until it holds `budget` characters; `depth` guards the
// recursion for values that were not parsed with a bound.
void AppendPreview(const Json& v, size_t budget, int depth, std::string* out) {
  if (out->size() >= budget) return;
  if (depth > 16) {
    out->append("...");
    return;
  }
  switch (v.type()) {
    case Json::value_t::object: {
      out->push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end() && out->size() < budget; ++it) {
        if (!first) out->push_back(',');
        first = false;
        AppendPreview(Json(it.key().substr(0, budget)), budget, depth + 1, out);
        out->push_back(':');
        AppendPreview(it.value(), budget, depth + 1, out);
      }
      out->push_back('}');
      return;
    }
    case Json::value_t::array: {
      out->push_back('[');
      bool first = true;
      for (auto it = v.begin(); it != v.end() && out->size() < budget; ++it) {
        if (!first) out->push_back(',');
        first = false;
        AppendPreview(*it, budget, depth + 1, out);
      }
      out->push_back(']');
      return;
    }
    case Json::value_t::string: {
      const std::string& s = v.get_ref<const std::string&>();
      // Only the part that can be shown is escaped; a cut character becomes U+FFFD.
      const Json head = s.size() > budget ? Json(s.substr(0, budget)) : v;
      out->append(head.dump(-1, ' ', false, Json::error_handler_t::replace));
      return;
    }
    default:
      out->append(v.dump());  // a number, a boolean or null: a few characters
  }
}

}  // namespace

absl::Status ParseBoundedJson(absl::string_view text, const JsonLimits& limits,
                              absl::string_view source, Json* out) {
  *out = Json();
  try {
    // Bounds first, building nothing; then the value, which is known to fit them. The
    // text is read twice, which costs far less than building what a hostile file asks.
    BoundsCheck check(limits);
    if (!Json::sax_parse(text.begin(), text.end(), &check) || !check.error().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": ", check.error().empty() ? "invalid JSON" : check.error()));
    }
    *out = Json::parse(text.begin(), text.end());
    return absl::OkStatus();
  } catch (const Json::exception& e) {
    *out = Json();
    return absl::InvalidArgumentError(absl::StrCat(source, ": invalid JSON: ", Cut(e.what())));
  } catch (const std::bad_alloc&) {
    *out = Json();
    return absl::ResourceExhaustedError(absl::StrCat(source, ": out of memory parsing JSON"));
  }
}

std::string JsonPreview(const Json& v, size_t max_chars) {
  const size_t keep = max_chars > 3 ? max_chars - 3 : 0;
  std::string s;
  AppendPreview(v, max_chars + 1, 0, &s);
  if (s.size() > max_chars) s = s.substr(0, keep) + "...";
  return s;
}

}  // namespace sg
