// Stop strings: generation that ends where a given text appears in the decoded answer,
// matched across token boundaries and kept out of what is printed or sent. `stepgraph
// serve` (a request's "stop"), `run` and `chat` (--stop) share it.
#ifndef STEPGRAPH_TOOLS_STOP_MATCHER_H_
#define STEPGRAPH_TOOLS_STOP_MATCHER_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace sg::cli {

// OpenAI's limit on the stop strings of a request; each holds at most kMaxStopBytes.
inline constexpr int kMaxStopStrings = 4;
inline constexpr size_t kMaxStopBytes = 256;

// InvalidArgument, without naming where the string came from, unless `stop` holds 1 to
// kMaxStopBytes bytes of valid UTF-8.
absl::Status CheckStopString(absl::string_view stop);

// Stop strings matched across token boundaries on the decoded text. Push returns the text
// that can be sent: the longest end of the text so far that could still begin a stop
// string is held back, and once a stop string is complete (the first to complete; of two
// completing at the same character, the longer) nothing from its start on is ever
// returned. In time linear in the text times the stop strings' total length.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // The text that follows `text` safely; sets stopped() when a stop string completed.
  std::string Push(absl::string_view text);
  // The held text, at the end of the sequence (no stop string can complete any more).
  std::string Finish();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace sg::cli

#endif  // STEPGRAPH_TOOLS_STOP_MATCHER_H_
