// Stop strings matched on streamed text; see stop_matcher.h.
#include "tools/stop_matcher.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "stepgraph/text/tokenizer.h"

namespace sg::cli {

absl::Status CheckStopString(absl::string_view stop) {
  if (stop.empty() || stop.size() > kMaxStopBytes) {
    return absl::InvalidArgumentError(absl::StrCat("each stop string must hold 1 to ",
                                                   kMaxStopBytes, " bytes, got ", stop.size()));
  }
  if (Utf8Lossy(stop) != stop) {
    return absl::InvalidArgumentError("a stop string is not valid UTF-8");
  }
  return absl::OkStatus();
}

std::string StopMatcher::Push(absl::string_view text) {
  if (stopped_) return "";
  held_.append(text.data(), text.size());
  // The stop string that completes first ends the text where it begins (of two that
  // complete together, the longer): a server stops the moment one is complete, before it
  // could know of a longer one that began earlier and would have completed later.
  size_t first = std::string::npos, first_end = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (at == std::string::npos) continue;
    const size_t end = at + s.size();
    if (end < first_end || (end == first_end && at < first)) {
      first = at;
      first_end = end;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest end of the text that begins some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > hold; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopMatcher::Finish() {
  std::string out;
  if (!stopped_) out.swap(held_);
  held_.clear();
  return out;
}

}  // namespace sg::cli
