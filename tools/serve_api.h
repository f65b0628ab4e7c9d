// The OpenAI API of `stepgraph serve`, without HTTP: a request body checked field by field
// and turned into prompt ids and generation parameters (or an OpenAI-shaped error naming
// the field), stop strings matched on the text as it streams, and the response objects.
// Anything the server does not do (n > 1, logprobs, tools, penalties, ...) is refused, never
// ignored; a field it does not know is refused as OpenAI refuses one.
#ifndef STEPGRAPH_TOOLS_SERVE_API_H_
#define STEPGRAPH_TOOLS_SERVE_API_H_

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "stepgraph/runtime/session.h"
#include "stepgraph/text/tokenizer.h"
#include "tools/conversation.h"

namespace sg::cli {

// An OpenAI error object: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // the field at fault; empty: null
  std::string type = "invalid_request_error";
};
std::string ErrorJson(const ApiError& e);

enum class Endpoint { kChat, kCompletions };

// What the server allows one request (each a flag of `stepgraph serve`).
struct RequestLimits {
  int64_t max_prompt_tokens = 0;  // ids after the chat template
  int64_t max_tokens = 0;         // the most a request may ask for, and the default
  int64_t max_seq = 0;            // prompt + max_tokens - 1 positions must fit
  // Sampling when a request says nothing (the server's --temperature, --top-p, --top-k).
  float temperature = 0.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
};
inline constexpr int kMaxStopStrings = 4;
inline constexpr size_t kMaxStopBytes = 256;

// The model's text side: its tokenizer, its chat template (without a system message;
// null when the model has none) and the ids that end a sequence.
struct ServeModel {
  const Tokenizer* tokenizer = nullptr;
  const Conversation* conversation = nullptr;
  std::string name;  // the model id the API reports
  std::vector<int32_t> stop_ids;
};

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::vector<int32_t> prompt;
  int64_t max_tokens = 0;
  SlotSampling sampling;           // greedy when sampling.sample is empty
  std::optional<int32_t> seed;     // empty: the server draws one
  std::vector<std::string> stop;   // at most kMaxStopStrings, none empty
  bool stream = false;
  bool include_usage = false;      // stream_options.include_usage
};

// Checks `body` against the endpoint's fields and the limits and renders its prompt.
std::variant<CompletionRequest, ApiError> ParseCompletionRequest(Endpoint endpoint,
                                                                 absl::string_view body,
                                                                 const ServeModel& model,
                                                                 const RequestLimits& limits);

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

// The response objects (OpenAI's shapes). `id` is "chatcmpl-N" or "cmpl-N".
struct ResponseHead {
  Endpoint endpoint = Endpoint::kChat;
  std::string id;
  int64_t created = 0;
  std::string model;
};
struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};
nlohmann::json UsageJson(const Usage& u);
// A whole answer: finish_reason "stop" or "length".
nlohmann::json CompletionJson(const ResponseHead& h, const std::string& text,
                              absl::string_view finish_reason, const Usage& usage);
// One streamed chunk: `text` (the chat's first chunk also carries the role), or the last
// with finish_reason; include_usage adds "usage": null as OpenAI does.
nlohmann::json ChunkJson(const ResponseHead& h, const std::string& text, bool first,
                         absl::string_view finish_reason, bool include_usage);
// The chunk after the last when stream_options.include_usage: no choices, the usage.
nlohmann::json UsageChunkJson(const ResponseHead& h, const Usage& usage);

// Compares a given API key with the server's in time that depends only on their lengths.
bool KeyMatches(absl::string_view given, absl::string_view key);

}  // namespace sg::cli

#endif  // STEPGRAPH_TOOLS_SERVE_API_H_
