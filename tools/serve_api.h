// The OpenAI API of `stepgraph serve`, without HTTP: a request body checked field by field
// and turned into prompt ids and generation parameters (or an OpenAI-shaped error naming
// the field) and the response objects (stop strings: tools/stop_matcher.h).
// Anything the server does not do (n > 1, logprobs, tools, ...) is refused, never ignored;
// a field it does not know is refused as OpenAI refuses one.
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
#include "tools/stop_matcher.h"

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
  // Each penalty a request does not give (the server's --repeat-penalty, ...; checked).
  Penalties penalties;
};

// The model's text side: its tokenizer, its chat template (without a system message;
// null when the model has none) and the ids that end a sequence.
struct ServeModel {
  const Tokenizer* tokenizer = nullptr;
  const Conversation* conversation = nullptr;
  std::string name;  // the model id the API reports
  std::vector<int32_t> stop_ids;
  int64_t vocab_size = 0;  // the model's logits: the ids logit_bias may name
};

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::vector<int32_t> prompt;
  int64_t max_tokens = 0;
  // Greedy when sampling.sample is empty. Penalties: OpenAI's presence_penalty,
  // frequency_penalty and logit_bias, and vLLM's repetition_penalty and min_p.
  SlotSampling sampling;
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
