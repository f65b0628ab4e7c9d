// A Jinja interpreter for the subset that chat templates use, with the environment that
// transformers' apply_chat_template renders them in (trim_blocks, lstrip_blocks, loop
// controls, its tojson, raise_exception and strftime_now), so that a model's own template
// renders here byte for byte as it does there. docs/chat_templates.md lists the subset.
//
// Templates come from model files, so they are hostile input: the template's size, the
// nesting of its syntax, the work done while rendering (steps) and the output's size are
// all bounded, and running past a bound is an error Status that names it. Parsing is
// linear in the template's size and rendering does at most `max_steps` units of work,
// each a constant or a bounded number of bytes.
#ifndef STEPGRAPH_TEXT_JINJA_H_
#define STEPGRAPH_TEXT_JINJA_H_

#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sg::jinja {

struct Limits {
  size_t max_template_bytes = size_t{1} << 20;
  int max_depth = 96;              // nesting of expressions and blocks, and of macro calls
  int64_t max_steps = 20'000'000;  // nodes evaluated plus bytes built / 64
  size_t max_output_bytes = size_t{8} << 20;  // also the largest string or list a value holds
};

class Value;
using List = std::vector<Value>;

// A Python dict with string keys, in insertion order.
class Dict {
 public:
  const Value* Find(absl::string_view key) const;
  void Set(std::string key, Value value);
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }
  size_t size() const;  // defined below, where Value is complete

 private:
  std::vector<std::pair<std::string, Value>> entries_;
  absl::flat_hash_map<std::string, size_t> index_;
};

struct Callable;  // a macro or a built-in function, made only by the interpreter

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

  Value() = default;  // undefined
  static Value None() { return Value(Kind::kNone); }
  Value(bool b) : kind_(Kind::kBool), int_(b) {}         // NOLINT: literals read naturally
  Value(int64_t i) : kind_(Kind::kInt), int_(i) {}       // NOLINT
  Value(int i) : kind_(Kind::kInt), int_(i) {}           // NOLINT
  Value(double d) : kind_(Kind::kFloat) { float_ = d; }  // NOLINT
  Value(std::string s);                                  // NOLINT
  Value(const char* s) : Value(std::string(s)) {}        // NOLINT
  Value(absl::string_view s) : Value(std::string(s)) {}  // NOLINT
  Value(List l);                                         // NOLINT
  Value(Dict d);                                         // NOLINT
  static Value Namespace(Dict d);  // namespace(): a dict whose attributes `set` may change
  static Value Function(std::shared_ptr<const Callable> f);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_namespace() const { return kind_ == Kind::kDict && is_namespace_; }
  // How deeply lists and dicts nest in it: 0 for a scalar.
  int depth() const { return depth_; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }
  double as_float() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& as_string() const { return *static_cast<const std::string*>(ptr_.get()); }
  const List& as_list() const { return *static_cast<const List*>(ptr_.get()); }
  const Dict& as_dict() const { return *static_cast<const Dict*>(ptr_.get()); }
  // Namespaces are shared references, as in Jinja: `set ns.x` changes every copy.
  Dict& mutable_namespace() const { return *static_cast<Dict*>(ptr_.get()); }
  const Callable& as_callable() const { return *static_cast<const Callable*>(ptr_.get()); }

 private:
  explicit Value(Kind k) : kind_(k) {}
  Kind kind_ = Kind::kUndefined;
  bool is_namespace_ = false;
  uint16_t depth_ = 0;  // saturates
  union {
    int64_t int_ = 0;
    double float_;
  };
  // The string, list, dict or callable, shared and (namespaces aside) immutable once made,
  // so that copying a value is cheap.
  std::shared_ptr<void> ptr_;
};

inline size_t Dict::size() const { return entries_.size(); }

// What a render may read besides the variables.
struct Environment {
  // The time strftime_now formats; unset: the local time when it is called.
  std::optional<std::tm> now;
};

class Template {
 public:
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Parses `text`: InvalidArgument naming the line for a syntax error, a construct outside
  // the subset, or a bound passed.
  static absl::StatusOr<Template> Parse(absl::string_view text, const Limits& limits = {});

  // Renders with `variables` as the template's globals. An error raised by the template
  // (raise_exception), an operation Python would refuse, or a bound passed is an
  // InvalidArgument naming the line.
  absl::StatusOr<std::string> Render(const Dict& variables, const Environment& env = {}) const;

  struct Program;  // the parsed template

 private:
  Template() = default;
  std::unique_ptr<Program> program_;
  Limits limits_;
};

}  // namespace sg::jinja

#endif  // STEPGRAPH_TEXT_JINJA_H_
