// JSON from files a user hands stepgraph (config.json, generation_config.json, the
// safetensors header and index, tokenizer.json and its config), parsed with bounds set
// before anything is built: a nesting depth, so that nothing that walks the value
// (copies, comparisons, serialisation, the readers' own recursion) can run out of stack,
// and a count of values, so that a file of `{}` cannot turn a few bytes each into tens of
// bytes of memory each without limit. Error messages quote a value through JsonPreview,
// which never serialises more than it shows.
#ifndef STEPGRAPH_TEXT_BOUNDED_JSON_H_
#define STEPGRAPH_TEXT_BOUNDED_JSON_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace sg {

struct JsonLimits {
  // Objects and arrays inside one another; the files above nest 2 to 8 deep.
  int max_depth = 64;
  // Objects, arrays, strings, numbers, booleans and nulls together (keys not counted).
  int64_t max_values = int64_t{1} << 20;
};

// Parses `text` into *out. InvalidArgument "<source>: ..." for text that is not JSON (with
// the parser's position), nesting deeper than limits.max_depth, or more than
// limits.max_values values: a first pass that builds nothing checks the bounds, so a value
// is built only for text within them. ResourceExhausted when memory runs out.
absl::Status ParseBoundedJson(absl::string_view text, const JsonLimits& limits,
                              absl::string_view source, nlohmann::json* out);

// At most `max_chars` characters of `v` as compact JSON, ending in "..." when cut; the
// work is bounded by max_chars, not by the size of `v`.
std::string JsonPreview(const nlohmann::json& v, size_t max_chars = 80);

}  // namespace sg

#endif  // STEPGRAPH_TEXT_BOUNDED_JSON_H_
