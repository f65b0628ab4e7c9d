// The OpenAI API's requests and responses for `stepgraph serve`; see serve_api.h.
#include "tools/serve_api.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sg::cli {
namespace {

using json = nlohmann::json;

// JSON nested deeper than this is refused before it is parsed (the parser's work and the
// value's destruction follow the depth).
constexpr int kMaxJsonDepth = 32;

ApiError Bad(absl::string_view param, absl::string_view message, int status = 400) {
  return ApiError{status, std::string(message), std::string(param)};
}

// The deepest nesting of arrays and objects in `text`, outside strings: one pass.
int JsonDepth(absl::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

const char* TypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number";
    default:
      return "something else";
  }
}

ApiError WrongType(absl::string_view param, absl::string_view expected, const json& v) {
  return Bad(param, absl::StrCat("'", param, "' must be ", expected, ", not ", TypeName(v)));
}

// The fields each endpoint knows; any other is refused. Those the server does not do are
// refused where they ask for something (see Unsupported).
constexpr const char* kChatFields[] = {
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "top_k", "seed", "stop", "n", "stream", "stream_options", "user", "logprobs",
    "top_logprobs", "tools", "tool_choice", "functions", "function_call", "response_format",
    "parallel_tool_calls", "presence_penalty", "frequency_penalty", "logit_bias",
    "repetition_penalty", "min_p"};
constexpr const char* kCompletionFields[] = {
    "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n",
    "stream", "stream_options", "user", "logprobs", "echo", "best_of", "suffix",
    "presence_penalty", "frequency_penalty", "logit_bias", "repetition_penalty", "min_p"};

// A known field the server does not do, when the value asks for it (null, false, 0, an
// empty list or the default asks for nothing).
std::optional<ApiError> Unsupported(const std::string& key, const json& v) {
  auto refuse = [&](absl::string_view what) {
    return Bad(key, absl::StrCat("'", key, "' is not supported by this server: ", what));
  };
  if (v.is_null()) return std::nullopt;
  if (key == "n" || key == "best_of") {
    if (!v.is_number_integer()) return WrongType(key, "an integer", v);
    if (v.get<int64_t>() != 1) return refuse("one choice per request (1)");
  } else if (key == "logprobs") {
    if ((v.is_boolean() && !v.get<bool>()) || (v.is_number_integer() && v.get<int64_t>() == 0)) {
      return std::nullopt;
    }
    return refuse("no log probabilities are returned");
  } else if (key == "top_logprobs") {
    return refuse("no log probabilities are returned");
  } else if (key == "echo") {
    if (!v.is_boolean()) return WrongType(key, "a boolean", v);
    if (v.get<bool>()) return refuse("the prompt is not echoed");
  } else if (key == "tools" || key == "functions") {
    if (!v.is_array()) return WrongType(key, "an array", v);
    if (!v.empty()) return refuse("no tool or function calls");
  } else if (key == "tool_choice" || key == "function_call") {
    if (!(v.is_string() && v.get<std::string>() == "none")) return refuse("no tool calls");
  } else if (key == "parallel_tool_calls") {
    if (!v.is_boolean()) return WrongType(key, "a boolean", v);
  } else if (key == "response_format") {
    if (!v.is_object() || !v.contains("type") || v["type"] != "text" || v.size() != 1) {
      return refuse("answers are plain text ({\"type\": \"text\"})");
    }
  } else if (key == "suffix") {
    return refuse("no insertion after a suffix");
  } else if (key == "user" || key == "model") {
    if (!v.is_string()) return WrongType(key, "a string", v);
  }
  return std::nullopt;
}

// A number field in [lo, hi] (lo excluded when lo_open).
std::variant<std::optional<double>, ApiError> Number(const json& body, const char* key, double lo,
                                                     double hi, bool lo_open) {
  if (!body.contains(key) || body[key].is_null()) return std::optional<double>();
  const json& v = body[key];
  if (!v.is_number()) return WrongType(key, "a number", v);
  const double x = v.get<double>();
  if (!std::isfinite(x) || (lo_open ? x <= lo : x < lo) || x > hi) {
    return Bad(key, absl::StrCat("'", key, "' must be in ", lo_open ? "(" : "[", lo, ", ", hi,
                                 "], got ", v.dump()));
  }
  return std::optional<double>(x);
}

std::variant<std::optional<int64_t>, ApiError> Integer(const json& body, const char* key,
                                                       int64_t lo, int64_t hi) {
  if (!body.contains(key) || body[key].is_null()) return std::optional<int64_t>();
  const json& v = body[key];
  if (!v.is_number_integer()) return WrongType(key, "an integer", v);
  const bool negative = v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0;
  if (!negative && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return Bad(key, absl::StrCat("'", key, "' must be at most ", hi, ", got ", v.dump()));
  }
  const int64_t x = negative ? v.get<int64_t>() : static_cast<int64_t>(v.get<uint64_t>());
  if (x < lo) return Bad(key, absl::StrCat("'", key, "' must be at least ", lo, ", got ", x));
  return std::optional<int64_t>(x);
}

// A message's content: a string, or text parts [{"type": "text", "text": ...}].
std::variant<std::string, ApiError> MessageText(const json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return WrongType(param, "a string or an array of text parts", content);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string where = absl::StrCat(param, "[", i, "]");
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return Bad(where, absl::StrCat("'", where, "' must be an object with a \"type\""));
    }
    if (part["type"] != "text") {
      return Bad(where, absl::StrCat("'", where, "' is a ", part["type"].get<std::string>(),
                                     " part; only text parts are supported"));
    }
    if (!part.contains("text") || !part["text"].is_string() || part.size() != 2) {
      return Bad(where, absl::StrCat("'", where, "' must hold \"type\" and a string \"text\""));
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

// The chat's prompt text: the messages through the model's chat template. A system (or
// developer) message may come first; then user and assistant turns alternate, starting and
// ending with the user's.
std::variant<std::string, ApiError> RenderMessages(const json& messages, const ServeModel& model) {
  if (model.conversation == nullptr) {
    return Bad("messages", "this model has no chat template; use /v1/completions");
  }
  if (!messages.is_array()) return WrongType("messages", "an array", messages);
  if (messages.empty()) return Bad("messages", "'messages' must hold at least one message");
  std::optional<std::string> system;
  std::vector<std::string> turns;  // user, assistant, user, ...
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return WrongType(where, "an object", m);
    for (const auto& [key, value] : m.items()) {
      if (key != "role" && key != "content") {
        return Bad(absl::StrCat(where, ".", key),
                   absl::StrCat("'", where, ".", key,
                                "' is not supported (role and content only)"));
      }
    }
    if (!m.contains("role") || !m["role"].is_string()) {
      return Bad(where + ".role", absl::StrCat("'", where, ".role' must be a string"));
    }
    if (!m.contains("content")) {
      return Bad(where + ".content", absl::StrCat("'", where, ".content' is missing"));
    }
    const std::string role = m["role"].get<std::string>();
    auto text = MessageText(m["content"], where + ".content");
    if (auto* e = std::get_if<ApiError>(&text)) return *e;
    std::string content = std::get<std::string>(std::move(text));
    if (role == "system" || role == "developer") {
      if (i != 0) {
        return Bad(where + ".role", "a system message may only come first");
      }
      system = std::move(content);
      continue;
    }
    const bool user_turn = turns.size() % 2 == 0;
    if (role != "user" && role != "assistant") {
      return Bad(where + ".role", absl::StrCat("'", where, ".role' is '", role,
                                               "'; supported: system, user, assistant"));
    }
    if ((role == "user") != user_turn) {
      return Bad(where + ".role",
                 absl::StrCat("'", where, ".role' is '", role, "' where a ",
                              user_turn ? "user" : "assistant",
                              " message belongs: user and assistant messages alternate, "
                              "starting and ending with the user's"));
    }
    turns.push_back(std::move(content));
  }
  if (turns.size() % 2 == 0) {
    return Bad("messages", "the last message must be the user's");
  }
  const Conversation* conv = model.conversation;
  std::optional<Conversation> own;
  if (system.has_value()) {
    absl::StatusOr<Conversation> made = Conversation::ForTokenizer(*model.tokenizer, system);
    if (!made.ok()) return Bad("messages[0]", made.status().message());
    own = *std::move(made);
    conv = &*own;
  }
  std::string text = conv->Start(turns[0]);
  for (size_t i = 1; i + 1 < turns.size(); i += 2) {
    absl::StrAppend(&text, turns[i], conv->Next(turns[i + 1], /*answer_closed=*/false));
  }
  return text;
}

// The completions prompt: a string, an array of one string, or an array of token ids.
std::variant<std::vector<int32_t>, ApiError> CompletionPrompt(const json& prompt,
                                                              const ServeModel& model) {
  const json* text = &prompt;
  if (prompt.is_array() && !prompt.empty() && prompt[0].is_number_integer()) {
    std::vector<int32_t> ids;
    const int64_t vocab = model.tokenizer->vocab_size();
    for (size_t i = 0; i < prompt.size(); ++i) {
      const json& v = prompt[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab) {
        return Bad("prompt", absl::StrCat("'prompt[", i, "]' must be a token id in [0, ", vocab,
                                          "), got ", v.dump()));
      }
      ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    return ids;
  }
  if (prompt.is_array()) {
    if (prompt.size() != 1) {
      return Bad("prompt", "one prompt per request: a string, [string] or [token ids]");
    }
    text = &prompt[0];
  }
  if (!text->is_string()) return WrongType("prompt", "a string or an array of token ids", *text);
  absl::StatusOr<std::vector<int32_t>> ids = model.tokenizer->Encode(text->get<std::string>());
  if (!ids.ok()) return Bad("prompt", ids.status().message());
  return *std::move(ids);
}

// OpenAI's logit_bias: an object mapping token ids (as strings) to biases in
// [-kMaxBias, kMaxBias], at most ops::kMaxLogitBias of them, each id once.
using LogitBiases = std::vector<std::pair<int32_t, float>>;
std::variant<std::optional<LogitBiases>, ApiError> LogitBias(const json& body,
                                                             int64_t vocab_size) {
  if (!body.contains("logit_bias") || body["logit_bias"].is_null()) {
    return std::optional<LogitBiases>();
  }
  const json& v = body["logit_bias"];
  if (!v.is_object()) return WrongType("logit_bias", "an object of token ids to numbers", v);
  if (v.size() > static_cast<size_t>(ops::kMaxLogitBias)) {
    return Bad("logit_bias", absl::StrCat("'logit_bias' holds at most ", ops::kMaxLogitBias,
                                          " token ids, got ", v.size()));
  }
  LogitBiases out;
  for (const auto& [key, value] : v.items()) {
    int64_t id = -1;
    if (key.empty() || key.size() > 10 ||
        !std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) ||
        !absl::SimpleAtoi(key, &id) || id >= vocab_size) {
      return Bad("logit_bias", absl::StrCat("'logit_bias' keys must be token ids in [0, ",
                                            vocab_size, "), got '", key, "'"));
    }
    if (!value.is_number()) {
      return Bad("logit_bias", absl::StrCat("'logit_bias' values must be numbers, not ",
                                            TypeName(value), " (token ", id, ")"));
    }
    const double bias = value.get<double>();
    if (!(bias >= -Penalties::kMaxBias && bias <= Penalties::kMaxBias)) {
      return Bad("logit_bias", absl::StrCat("'logit_bias' values must be in [",
                                            -Penalties::kMaxBias, ", ", Penalties::kMaxBias,
                                            "], got ", value.dump(), " (token ", id, ")"));
    }
    for (const auto& [seen, b] : out) {
      if (seen == id) {
        return Bad("logit_bias", absl::StrCat("'logit_bias' names token ", id, " twice"));
      }
    }
    out.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
  }
  return std::optional<LogitBiases>(std::move(out));
}

std::variant<std::vector<std::string>, ApiError> StopStrings(const json& body) {
  std::vector<std::string> stop;
  if (!body.contains("stop") || body["stop"].is_null()) return stop;
  const json& v = body["stop"];
  if (v.is_string()) {
    stop.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    if (v.size() > static_cast<size_t>(kMaxStopStrings)) {
      return Bad("stop", absl::StrCat("'stop' holds at most ", kMaxStopStrings,
                                      " strings, got ", v.size()));
    }
    for (const json& s : v) {
      if (!s.is_string()) return WrongType("stop", "a string or an array of strings", s);
      stop.push_back(s.get<std::string>());
    }
  } else {
    return WrongType("stop", "a string or an array of strings", v);
  }
  for (const std::string& s : stop) {
    if (absl::Status st = CheckStopString(s); !st.ok()) return Bad("stop", st.message());
  }
  return stop;
}

}  // namespace

std::string ErrorJson(const ApiError& e) {
  json error = {{"message", e.message},
                {"type", e.type},
                {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                {"code", nullptr}};
  return json{{"error", error}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::variant<CompletionRequest, ApiError> ParseCompletionRequest(Endpoint endpoint,
                                                                 absl::string_view body_text,
                                                                 const ServeModel& model,
                                                                 const RequestLimits& limits) {
  if (JsonDepth(body_text) > kMaxJsonDepth) {
    return Bad("", absl::StrCat("the body nests deeper than ", kMaxJsonDepth, " levels"));
  }
  const json body = json::parse(body_text.begin(), body_text.end(), nullptr, false);
  if (body.is_discarded()) return Bad("", "the body is not valid JSON");
  if (!body.is_object()) return Bad("", "the body must be a JSON object");
  const bool chat = endpoint == Endpoint::kChat;
  for (const auto& [key, value] : body.items()) {
    const auto& known =
        chat ? absl::MakeConstSpan(kChatFields) : absl::MakeConstSpan(kCompletionFields);
    if (std::find_if(known.begin(), known.end(), [&](const char* k) { return key == k; }) ==
        known.end()) {
      return Bad(key, absl::StrCat("unrecognized request argument supplied: ", key));
    }
    if (std::optional<ApiError> e = Unsupported(key, value)) return *e;
  }
  CompletionRequest r;
  r.endpoint = endpoint;

  // The prompt.
  if (chat) {
    if (!body.contains("messages")) return Bad("messages", "'messages' is required");
    auto text = RenderMessages(body["messages"], model);
    if (auto* e = std::get_if<ApiError>(&text)) return *e;
    absl::StatusOr<std::vector<int32_t>> ids =
        model.tokenizer->Encode(std::get<std::string>(text), {.add_special = false});
    if (!ids.ok()) return Bad("messages", ids.status().message());
    r.prompt = *std::move(ids);
  } else {
    if (!body.contains("prompt")) return Bad("prompt", "'prompt' is required");
    auto ids = CompletionPrompt(body["prompt"], model);
    if (auto* e = std::get_if<ApiError>(&ids)) return *e;
    r.prompt = std::get<std::vector<int32_t>>(std::move(ids));
  }
  const char* prompt_field = chat ? "messages" : "prompt";
  const int64_t n = static_cast<int64_t>(r.prompt.size());
  if (n == 0) return Bad(prompt_field, "the prompt encodes to no tokens");
  if (n > limits.max_prompt_tokens) {
    return Bad(prompt_field, absl::StrCat("the prompt has ", n, " tokens, more than this server's "
                                          "limit of ", limits.max_prompt_tokens,
                                          " (--max-prompt-tokens)"));
  }
  const int64_t room = limits.max_seq - n + 1;  // ids the context has room for
  if (room < 1) {
    return Bad(prompt_field, absl::StrCat("the prompt has ", n, " tokens; the context holds ",
                                          limits.max_seq, " (--max-seq)"));
  }

  // Generation parameters.
  const char* tokens_key = chat && body.contains("max_completion_tokens") &&
                                   !body["max_completion_tokens"].is_null()
                               ? "max_completion_tokens"
                               : "max_tokens";
  auto max_tokens = Integer(body, tokens_key, 1, std::numeric_limits<int32_t>::max());
  if (auto* e = std::get_if<ApiError>(&max_tokens)) return *e;
  if (const auto& m = std::get<std::optional<int64_t>>(max_tokens); m.has_value()) {
    if (*m > limits.max_tokens) {
      return Bad(tokens_key, absl::StrCat("'", tokens_key, "' is ", *m, ", more than this server's "
                                          "limit of ", limits.max_tokens, " (--max-tokens)"));
    }
    if (*m > room) {
      return Bad(tokens_key, absl::StrCat("the prompt (", n, " tokens) and '", tokens_key, "' (",
                                          *m, ") do not fit the context of ", limits.max_seq,
                                          " tokens (--max-seq)"));
    }
    r.max_tokens = *m;
  } else {
    // OpenAI's completions default to 16; a chat answers until its end, here up to the
    // server's limit and the context.
    r.max_tokens =
        std::min(chat ? limits.max_tokens : std::min<int64_t>(16, limits.max_tokens), room);
  }
  auto temperature = Number(body, "temperature", 0.0, 2.0, false);
  if (auto* e = std::get_if<ApiError>(&temperature)) return *e;
  auto top_p = Number(body, "top_p", 0.0, 1.0, true);
  if (auto* e = std::get_if<ApiError>(&top_p)) return *e;
  auto top_k = Integer(body, "top_k", 0, std::numeric_limits<int32_t>::max());
  if (auto* e = std::get_if<ApiError>(&top_k)) return *e;
  auto seed = Integer(body, "seed", std::numeric_limits<int64_t>::min(),
                      std::numeric_limits<int64_t>::max());
  if (auto* e = std::get_if<ApiError>(&seed)) return *e;
  const float t = static_cast<float>(
      std::get<std::optional<double>>(temperature).value_or(limits.temperature));
  if (t > 0.0f) {
    r.sampling.sample = ops::Sample{
        t, static_cast<int32_t>(std::get<std::optional<int64_t>>(top_k).value_or(limits.top_k)),
        static_cast<float>(std::get<std::optional<double>>(top_p).value_or(limits.top_p))};
  }
  // Penalties, each the server's default where the request gives none.
  Penalties& penalties = r.sampling.penalties;
  penalties = limits.penalties;
  const double max_penalty = Penalties::kMaxPenalty;
  const struct {
    const char* key;
    float Penalties::*field;
    double lo, hi;
    bool lo_open;
  } penalty_fields[] = {
      {"presence_penalty", &Penalties::presence, -max_penalty, max_penalty, false},
      {"frequency_penalty", &Penalties::frequency, -max_penalty, max_penalty, false},
      {"repetition_penalty", &Penalties::repetition, 0.0, std::numeric_limits<float>::max(),
       true},
      {"min_p", &Penalties::min_p, 0.0, 1.0, false},
  };
  for (const auto& f : penalty_fields) {
    auto value = Number(body, f.key, f.lo, f.hi, f.lo_open);
    if (auto* e = std::get_if<ApiError>(&value)) return *e;
    if (const auto& x = std::get<std::optional<double>>(value)) {
      penalties.*f.field = static_cast<float>(*x);
    }
  }
  auto bias = LogitBias(body, model.vocab_size);
  if (auto* e = std::get_if<ApiError>(&bias)) return *e;
  if (auto& b = std::get<std::optional<LogitBiases>>(bias)) penalties.logit_bias = std::move(*b);
  // What the session checks again; every field was checked above, so a refusal here is of
  // the logit biases (ids past what the device's floats hold exactly).
  if (absl::Status st = CheckPenalties(penalties, model.vocab_size); !st.ok()) {
    return Bad("logit_bias", st.message());
  }
  if (const auto& s = std::get<std::optional<int64_t>>(seed); s.has_value()) {
    // Any 64-bit seed is taken; the session's seeds are 32 bits.
    r.seed = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(*s)));
  }
  auto stop = StopStrings(body);
  if (auto* e = std::get_if<ApiError>(&stop)) return *e;
  r.stop = std::get<std::vector<std::string>>(std::move(stop));

  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) return WrongType("stream", "a boolean", body["stream"]);
    r.stream = body["stream"].get<bool>();
  }
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const json& so = body["stream_options"];
    if (!so.is_object()) return WrongType("stream_options", "an object", so);
    if (!r.stream) return Bad("stream_options", "'stream_options' is only allowed with stream");
    for (const auto& [key, value] : so.items()) {
      if (key != "include_usage") {
        return Bad("stream_options." + key,
                   absl::StrCat("unrecognized stream option: ", key, " (include_usage only)"));
      }
      if (!value.is_boolean()) return WrongType("stream_options.include_usage", "a boolean", value);
      r.include_usage = value.get<bool>();
    }
  }
  return r;
}

json UsageJson(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

namespace {

json Head(const ResponseHead& h, bool chunk) {
  const bool chat = h.endpoint == Endpoint::kChat;
  return {{"id", h.id},
          {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                          : "text_completion"},
          {"created", h.created},
          {"model", h.model}};
}

json Reason(absl::string_view finish_reason) {
  return finish_reason.empty() ? json(nullptr) : json(std::string(finish_reason));
}

}  // namespace

json CompletionJson(const ResponseHead& h, const std::string& text, absl::string_view finish_reason,
                    const Usage& usage) {
  json out = Head(h, false);
  json choice = {{"index", 0}, {"finish_reason", Reason(finish_reason)}, {"logprobs", nullptr}};
  if (h.endpoint == Endpoint::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  out["choices"] = json::array({choice});
  out["usage"] = UsageJson(usage);
  return out;
}

json ChunkJson(const ResponseHead& h, const std::string& text, bool first,
               absl::string_view finish_reason, bool include_usage) {
  json out = Head(h, true);
  json choice = {{"index", 0}, {"finish_reason", Reason(finish_reason)}, {"logprobs", nullptr}};
  if (h.endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (first && finish_reason.empty())) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  out["choices"] = json::array({choice});
  if (include_usage) out["usage"] = nullptr;
  return out;
}

json UsageChunkJson(const ResponseHead& h, const Usage& usage) {
  json out = Head(h, true);
  out["choices"] = json::array();
  out["usage"] = UsageJson(usage);
  return out;
}

bool KeyMatches(absl::string_view given, absl::string_view key) {
  // Every byte of the key is compared whatever came before; only the lengths show.
  unsigned diff = given.size() == key.size() ? 0u : 1u;
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= g ^ static_cast<unsigned char>(key[i]);
  }
  return diff == 0;
}

}  // namespace sg::cli
