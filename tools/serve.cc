// `stepgraph serve`: the OpenAI API over HTTP (cpp-httplib), with one Scheduler
// (stepgraph/runtime/scheduler.h) running the model for every request. HTTP threads only
// parse, queue and stream: each request is checked (serve_api.h), its ids submitted, and
// its answer decoded to text as the ids come, stop strings held back until they cannot
// match. A client that goes away is noticed at the reader's next wake (each step that
// makes one of its ids, at least once a second) by polling its connection, streamed or
// not, and its request cancelled; the slot is free before the next step.
// SIGTERM and SIGINT stop taking requests, let those in flight finish and exit.
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "stepgraph/runtime/scheduler.h"
#include "tools/commands.h"
#include "tools/console.h"
#include "tools/model_setup.h"
#include "tools/serve_api.h"

#if !STEPGRAPH_WITH_HTTP
namespace sg::cli {
int ServeCommand(const Options&) {
  return Failure(absl::UnimplementedError("this stepgraph was built without HTTP"),
                 "install libcpp-httplib-dev (tools/deps.sh does) and build again");
}
}  // namespace sg::cli
#else
#include "httplib.h"

namespace sg::cli {
namespace {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

// ---- metrics --------------------------------------------------------------------------

// A Prometheus histogram of seconds with fixed bucket bounds.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void Observe(double seconds, int64_t times = 1) {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t b = std::lower_bound(bounds_.begin(), bounds_.end(), seconds) - bounds_.begin();
    counts_[b] += times;
    sum_ += seconds * static_cast<double>(times);
    count_ += times;
  }
  void Write(absl::string_view name, absl::string_view help, std::string* out) const {
    std::lock_guard<std::mutex> lock(mu_);
    absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " histogram\n");
    int64_t cumulative = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
      cumulative += counts_[i];
      absl::StrAppend(out, name, "_bucket{le=\"", bounds_[i], "\"} ", cumulative, "\n");
    }
    absl::StrAppend(out, name, "_bucket{le=\"+Inf\"} ", count_, "\n", name, "_sum ", sum_, "\n",
                    name, "_count ", count_, "\n");
  }

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;
  double sum_ = 0;
  int64_t count_ = 0;
};

struct Metrics {
  Histogram ttft{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
  Histogram per_token{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}};
  std::mutex mu;
  std::map<std::pair<std::string, int>, int64_t> requests;  // (endpoint, status) -> count

  void Count(const std::string& endpoint, int status) {
    std::lock_guard<std::mutex> lock(mu);
    ++requests[{endpoint, status}];
  }

  std::string Text(const SchedulerStats& st) {
    std::string out;
    auto one = [&](absl::string_view name, absl::string_view type, absl::string_view help,
                   int64_t v) {
      absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name,
                      " ", v, "\n");
    };
    {
      std::lock_guard<std::mutex> lock(mu);
      absl::StrAppend(&out,
                      "# HELP stepgraph_requests_total HTTP requests answered, by endpoint "
                      "and status code.\n# TYPE stepgraph_requests_total counter\n");
      for (const auto& [key, n] : requests) {
        absl::StrAppend(&out, "stepgraph_requests_total{endpoint=\"", key.first, "\",code=\"",
                        key.second, "\"} ", n, "\n");
      }
    }
    one("stepgraph_prompt_tokens_total", "counter", "Prompt tokens of requests that got a slot.",
        st.prompt_tokens);
    one("stepgraph_generated_tokens_total", "counter", "Tokens generated and given to requests.",
        st.generated_tokens);
    one("stepgraph_queue_depth", "gauge", "Requests waiting for a slot.", st.queued);
    one("stepgraph_active_slots", "gauge", "Slots holding a request (prefilling or decoding).",
        st.active);
    one("stepgraph_decoding_slots", "gauge", "Slots in the decode steps.", st.decoding);
    one("stepgraph_slots", "gauge", "Slots of the session (--slots).", st.max_slots);
    one("stepgraph_requests_refused_total", "counter",
        "Requests answered 503 because every slot was busy and the queue full.", st.refused);
    one("stepgraph_decode_steps_total", "counter", "Decode steps run.", st.decode_steps);
    one("stepgraph_prefill_calls_total", "counter", "Prompt chunks fed.", st.prefill_calls);
    one("stepgraph_slot_moves_total", "counter",
        "Sequences moved to a lower slot so that steps run in a smaller bucket.", st.compactions);
    one("stepgraph_last_step_bucket", "gauge", "Rows of the last decode step's bucket.",
        st.last_bucket);
    absl::StrAppend(&out, "# HELP stepgraph_requests_finished_total Requests ended, by how "
                          "(cancelled: a stop string or a client gone).\n"
                          "# TYPE stepgraph_requests_finished_total counter\n");
    for (int r = 1; r < 6; ++r) {
      absl::StrAppend(&out, "stepgraph_requests_finished_total{reason=\"",
                      FinishReasonName(static_cast<FinishReason>(r)), "\"} ", st.finished[r],
                      "\n");
    }
    ttft.Write("stepgraph_time_to_first_token_seconds",
               "From a request's arrival to its first token.", &out);
    per_token.Write("stepgraph_time_per_output_token_seconds",
                    "Between two tokens of one request.", &out);
    return out;
  }
};

// ---- the server -----------------------------------------------------------------------

struct Server {
  const Options& options;
  Scheduler* scheduler = nullptr;
  ServeModel model;
  RequestLimits limits;
  Metrics metrics;
  std::atomic<bool> draining{false};
  std::atomic<uint64_t> next_id{1};
  std::mutex seed_mu;
  std::mt19937_64 seeds{std::random_device{}()};

  int32_t DrawSeed() {
    std::lock_guard<std::mutex> lock(seed_mu);
    return static_cast<int32_t>(static_cast<uint32_t>(seeds()));
  }
};

void Reply(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(ErrorJson(e), "application/json");
}

// The error of a refused Submit: 503 (with Retry-After) when busy or shutting down, 400
// for a request that does not fit.
ApiError SubmitError(const absl::Status& st) {
  switch (st.code()) {
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kUnavailable:
      return ApiError{503, std::string(st.message()), "", "server_busy"};
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return ApiError{400, std::string(st.message()), "max_tokens"};
    default:
      return ApiError{500, std::string(st.message()), "", "server_error"};
  }
}

// The port of a socket address (IPv4 or IPv6); -1 for another family.
int PortOf(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

// The request's connection: the socket whose two ends are the request's ports. httplib
// hands handlers no descriptor, and without one a client that went away is seen only when
// a write fails (two writes after it left, and never for an answer that is not streamed).
// The handler's thread owns the connection until it returns, so the descriptor stays its.
// -1 when none matches. One pass over the process's descriptors.
int ConnectionFd(const httplib::Request& req) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd < 0 || fd == dirfd(dir)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t n = sizeof(local), m = sizeof(peer);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &n) != 0 ||
        getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &m) != 0) {
      continue;
    }
    if (PortOf(local) == req.local_port && PortOf(peer) == req.remote_port) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

// True when the peer closed its side (or the connection failed): nothing it could still
// read would reach it. A client that only shut down its sending side counts as gone.
bool ClientGone(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

// The answer of one request as it is made: text decoded from the ids, stop strings held
// back, the tokens counted and the times observed.
class Answer {
 public:
  Answer(Server& server, const CompletionRequest& request, std::shared_ptr<GenerationStream> s,
         SteadyClock::time_point arrival, int connection)
      : server_(server),
        connection_(connection),
        stream_(std::move(s)),
        decoder_(*server.model.tokenizer, DecodeOptions{.skip_special = true}),
        matcher_(request.stop),
        last_(arrival),
        first_(true) {}
  ~Answer() {
    // Whatever ended the answer (its end, an error, a client gone), the request ends too.
    stream_->Cancel();
  }

  // Waits up to `wait` for more; appends the text that may be sent to `text`. True once
  // the answer is complete (finish_reason() says how, error() says what went wrong).
  bool Next(std::string* text, std::chrono::milliseconds wait) {
    ids_.clear();
    const FinishReason f = stream_->Wait(&ids_, SteadyClock::now() + wait);
    const SteadyClock::time_point now = SteadyClock::now();
    if (f == FinishReason::kNone && ClientGone(connection_)) {
      // Nobody reads the rest: the request ends, its slot free before the next step.
      stream_->Cancel();
      error_ = ApiError{499, "the client closed the connection", "", "client_closed"};
      return true;
    }
    if (!ids_.empty()) {
      const double seconds = std::chrono::duration<double>(now - last_).count();
      if (first_) {
        server_.metrics.ttft.Observe(seconds);
        if (ids_.size() > 1) {
          server_.metrics.per_token.Observe(0.0, static_cast<int64_t>(ids_.size()) - 1);
        }
      } else {
        server_.metrics.per_token.Observe(seconds / static_cast<double>(ids_.size()),
                                          static_cast<int64_t>(ids_.size()));
      }
      first_ = false;
      last_ = now;
    }
    for (int32_t id : ids_) {
      ++tokens_;
      absl::StatusOr<std::string> piece = decoder_.Push(id);
      if (!piece.ok()) {
        error_ = ApiError{500, std::string(piece.status().message()), "", "server_error"};
        return true;
      }
      *text += matcher_.Push(*piece);
      if (matcher_.stopped()) {
        // The request goes on no further; its slot is freed before the next step.
        stream_->Cancel();
        finish_ = "stop";
        return true;
      }
    }
    switch (f) {
      case FinishReason::kNone:
        return false;
      case FinishReason::kStop:
      case FinishReason::kLength:
        *text += matcher_.Push(decoder_.Finish());
        if (!matcher_.stopped()) *text += matcher_.Finish();
        finish_ = matcher_.stopped() || f == FinishReason::kStop ? "stop" : "length";
        return true;
      case FinishReason::kError:
        error_ = ApiError{500, std::string(stream_->status().message()), "", "server_error"};
        return true;
      case FinishReason::kCancelled:
      case FinishReason::kAborted:
        error_ = ApiError{503, "the server stopped before the answer was complete", "",
                          "server_shutdown"};
        return true;
    }
    return true;
  }

  const std::optional<ApiError>& error() const { return error_; }
  const std::string& finish_reason() const { return finish_; }
  Usage usage() const { return {stream_->prompt_tokens(), tokens_}; }
  void Cancel() { stream_->Cancel(); }

 private:
  Server& server_;
  const int connection_;  // the client's socket; -1: unknown (noticed at a failed write)
  std::shared_ptr<GenerationStream> stream_;
  TokenStreamDecoder decoder_;
  StopMatcher matcher_;
  std::vector<int32_t> ids_;
  SteadyClock::time_point last_;
  bool first_;
  int64_t tokens_ = 0;
  std::string finish_;
  std::optional<ApiError> error_;
};

std::string Sse(const json& j) {
  return absl::StrCat("data: ", j.dump(-1, ' ', false, json::error_handler_t::replace), "\n\n");
}

void HandleCompletion(Server& server, Endpoint endpoint, const httplib::Request& req,
                      httplib::Response& res) {
  const SteadyClock::time_point arrival = SteadyClock::now();
  const std::string name = endpoint == Endpoint::kChat ? "chat" : "completions";
  auto fail = [&](const ApiError& e) {
    Reply(res, e);
    if (e.status == 503) res.set_header("Retry-After", "1");
    server.metrics.Count(name, e.status);
    if (server.options.verbose) {
      std::fprintf(stderr, "stepgraph: %s %d %s\n", req.path.c_str(), e.status, e.message.c_str());
    }
  };
  if (static_cast<int64_t>(req.body.size()) > server.options.max_body_bytes) {
    return fail({413, absl::StrCat("the body has ", req.body.size(), " bytes, more than this "
                                   "server's limit of ", server.options.max_body_bytes,
                                   " (--max-body-bytes)")});
  }
  std::variant<CompletionRequest, ApiError> parsed =
      ParseCompletionRequest(endpoint, req.body, server.model, server.limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return fail(*e);
  CompletionRequest r = std::get<CompletionRequest>(std::move(parsed));
  if (server.draining.load()) {
    return fail({503, "the server is shutting down and takes no new requests", "",
                 "server_shutdown"});
  }
  GenerationRequest g;
  g.prompt = r.prompt;
  g.max_tokens = r.max_tokens;
  g.stop_ids = server.model.stop_ids;
  g.seed = r.seed.has_value() ? *r.seed : server.DrawSeed();
  g.sampling = r.sampling;
  absl::StatusOr<std::shared_ptr<GenerationStream>> stream =
      server.scheduler->Submit(std::move(g));
  if (!stream.ok()) return fail(SubmitError(stream.status()));

  ResponseHead head;
  head.endpoint = endpoint;
  head.id = absl::StrCat(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-",
                         server.next_id.fetch_add(1));
  head.created = static_cast<int64_t>(std::time(nullptr));
  head.model = server.model.name;
  auto answer =
      std::make_shared<Answer>(server, r, *std::move(stream), arrival, ConnectionFd(req));

  if (!r.stream) {
    std::string text;
    while (!answer->Next(&text, std::chrono::milliseconds(1000))) {
    }
    if (answer->error().has_value()) return fail(*answer->error());
    res.set_content(CompletionJson(head, text, answer->finish_reason(), answer->usage())
                        .dump(-1, ' ', false, json::error_handler_t::replace),
                    "application/json");
    server.metrics.Count(name, 200);
    return;
  }
  server.metrics.Count(name, 200);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [answer, head, include_usage = r.include_usage](size_t, httplib::DataSink& sink) {
        auto send = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
        if (!send(Sse(ChunkJson(head, "", true, "", include_usage)))) return false;
        for (;;) {
          std::string text;
          const bool done = answer->Next(&text, std::chrono::milliseconds(1000));
          if (done && answer->error().has_value()) {
            if (answer->error()->status == 499) return false;  // nobody to tell
            send(Sse(json::parse(ErrorJson(*answer->error()))));
            break;
          }
          // A comment line when nothing came: the write finds a client that went away.
          const std::string out =
              !text.empty() ? Sse(ChunkJson(head, text, false, "", include_usage))
              : done        ? std::string()
                            : std::string(": waiting\n\n");
          if (!out.empty() && !send(out)) return false;
          if (!done) continue;
          if (!send(Sse(ChunkJson(head, "", false, answer->finish_reason(), include_usage)))) {
            return false;
          }
          if (include_usage && !send(Sse(UsageChunkJson(head, answer->usage())))) return false;
          break;
        }
        send("data: [DONE]\n\n");
        sink.done();
        return true;
      },
      [answer](bool) { answer->Cancel(); });
}

bool Authorized(const Server& server, const httplib::Request& req, httplib::Response& res) {
  if (server.options.api_key.empty()) return true;
  const std::string auth = req.get_header_value("Authorization");
  constexpr absl::string_view kBearer = "Bearer ";
  const bool ok = absl::StartsWith(auth, kBearer) &&
                  KeyMatches(absl::string_view(auth).substr(kBearer.size()),
                             server.options.api_key);
  if (ok) return true;
  Reply(res, ApiError{401,
                      auth.empty() ? "no API key: send 'Authorization: Bearer KEY'"
                                   : "the API key is not this server's",
                      "", "invalid_request_error"});
  return false;
}

// SIGTERM and SIGINT, waited for by a thread of their own (every thread blocks them).
class ShutdownSignals {
 public:
  ShutdownSignals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
  }
  ~ShutdownSignals() {
    if (thread_.joinable()) {
      // Wakes the waiting thread when no signal came.
      pthread_kill(thread_.native_handle(), SIGTERM);
      thread_.join();
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  // Calls `on_signal` on the signal thread when one comes.
  void Start(std::function<void()> on_signal) {
    thread_ = std::thread([this, f = std::move(on_signal)] {
      int sig = 0;
      sigwait(&set_, &sig);
      if (!stopped_.load()) f();
    });
  }
  void Stopped() { stopped_.store(true); }

 private:
  sigset_t set_, old_;
  std::atomic<bool> stopped_{false};
  std::thread thread_;
};

}  // namespace

int ServeCommand(const Options& o) {
  // SIGTERM and SIGINT are blocked before any thread starts (the session's CPU threads
  // included: one that did not block them would die of them), so that only the signal
  // thread sees them.
  ShutdownSignals signals;
  if (o.model.empty()) {
    return UsageFailure("serve needs --model (a folder or a GGUF file with a tokenizer)", kServe);
  }
  absl::StatusOr<LlamaConfig> config = ModelConfig(o);
  if (!config.ok()) return ModelFailure(o, config.status());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = ModelTokenizer(o, "serve");
  if (!tokenizer.ok()) return ModelFailure(o, tokenizer.status(), ModelPart::kTokenizer);
  // A model without a chat template serves completions only.
  std::optional<Conversation> conversation;
  if (!(*tokenizer)->spec().chat_template.empty()) {
    absl::StatusOr<Conversation> c = Conversation::ForTokenizer(**tokenizer, std::nullopt);
    if (c.ok()) {
      conversation = *std::move(c);
    } else {
      std::fprintf(stderr, "stepgraph: the chat template is not followed (%s); serving "
                   "/v1/completions only\n", std::string(c.status().message()).c_str());
    }
  }
  const int64_t max_seq =
      o.max_seq > 0 ? o.max_seq : std::min<int64_t>(config->max_position_embeddings, 4096);
  if (absl::Status st = CheckPenaltyFlags(o.penalties, config->vocab_size); !st.ok()) {
    return UsageFailure(st.message(), kServe);
  }
  std::optional<ops::Sample> sampling;
  if (o.temperature > 0.0f) sampling = ops::Sample{o.temperature, o.top_k, o.top_p};
  // The steps apply penalties whatever the flags say: any request may ask for its own
  // (presence_penalty, logit_bias, ...), and a session has them or not from the start. The
  // cost, a pass over the logits per step and on the GPU the lm head's fused argmax, is
  // paid by every request.
  absl::StatusOr<std::unique_ptr<DecodeSession>> made =
      MakeSession(o, o.slots, max_seq, sampling, o.eager, /*penalties=*/true);
  if (!made.ok()) return ModelFailure(o, made.status());
  std::unique_ptr<DecodeSession> session = *std::move(made);

  Server server{.options = o};
  server.model.tokenizer = tokenizer->get();
  server.model.conversation = conversation.has_value() ? &*conversation : nullptr;
  // The model's id in the API: the file's or the folder's name.
  server.model.name = std::filesystem::path(o.model).filename().string();
  if (server.model.name.empty()) {
    server.model.name = std::filesystem::path(o.model).parent_path().filename().string();
  }
  server.model.name = std::string(absl::StripSuffix(server.model.name, ".gguf"));
  server.model.vocab_size = session->config().vocab_size;
  if (!o.ignore_eos) server.model.stop_ids = session->stop_ids();
  if (conversation.has_value() && !o.ignore_eos) {
    const int32_t eot = (*tokenizer)->TokenId(conversation->end_of_turn());
    if (eot >= 0 && std::find(server.model.stop_ids.begin(), server.model.stop_ids.end(), eot) ==
                        server.model.stop_ids.end()) {
      server.model.stop_ids.push_back(eot);
    }
  }
  server.limits.max_seq = session->max_seq();
  server.limits.max_prompt_tokens =
      o.max_prompt_tokens > 0 ? std::min(o.max_prompt_tokens, max_seq) : max_seq;
  server.limits.max_tokens = o.max_tokens > 0 ? std::min(o.max_tokens, max_seq) : max_seq;
  server.limits.temperature = o.temperature;
  server.limits.top_p = o.top_p;
  server.limits.top_k = o.top_k;
  server.limits.penalties = o.penalties;

  absl::StatusOr<std::unique_ptr<Scheduler>> scheduler =
      Scheduler::Start(session.get(), {.max_queue = o.max_queue});
  if (!scheduler.ok()) return Failure(scheduler.status(), HelpHint(kServe));
  server.scheduler = scheduler->get();

  httplib::Server http;
  const size_t threads = static_cast<size_t>(
      o.http_threads > 0 ? o.http_threads : o.slots + o.max_queue + 8);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(static_cast<size_t>(o.max_body_bytes));
  http.set_tcp_nodelay(true);
  http.set_read_timeout(30, 0);
  http.set_write_timeout(30, 0);
  http.set_error_handler([&](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = absl::StrCat("no route ", req.method, " ", req.path);
    if (res.status == 413) {
      message = absl::StrCat("the body is larger than this server's limit of ",
                             o.max_body_bytes, " bytes (--max-body-bytes)");
    } else if (res.status != 404) {
      message = absl::StrCat("HTTP ", res.status, " for ", req.method, " ", req.path);
    }
    res.set_content(ErrorJson(ApiError{res.status, message}), "application/json");
    server.metrics.Count("other", res.status);
  });
  http.set_exception_handler([&](const httplib::Request&, httplib::Response& res,
                                 std::exception_ptr) {
    Reply(res, ApiError{500, "internal error", "", "server_error"});
  });
  for (const auto& [path, endpoint] : {std::pair{"/v1/chat/completions", Endpoint::kChat},
                                       std::pair{"/v1/completions", Endpoint::kCompletions}}) {
    http.Post(path, [&, endpoint = endpoint](const httplib::Request& req, httplib::Response& res) {
      if (!Authorized(server, req, res)) {
        server.metrics.Count(endpoint == Endpoint::kChat ? "chat" : "completions", 401);
        return;
      }
      HandleCompletion(server, endpoint, req, res);
    });
  }
  http.Get("/v1/models", [&](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(server, req, res)) return;
    const json models = {{"object", "list"},
                         {"data", json::array({{{"id", server.model.name},
                                                {"object", "model"},
                                                {"created", 0},
                                                {"owned_by", "stepgraph"}}})}};
    res.set_content(models.dump(), "application/json");
  });
  http.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    const bool draining = server.draining.load();
    res.status = draining ? 503 : 200;
    res.set_content(json{{"status", draining ? "draining" : "ok"}}.dump(), "application/json");
  });
  http.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(server.metrics.Text(server.scheduler->stats()),
                    "text/plain; version=0.0.4");
  });

  int port = static_cast<int>(o.port);
  const bool bound = port == 0 ? (port = http.bind_to_any_port(o.host)) > 0
                               : http.bind_to_port(o.host, port);
  if (!bound) {
    return Failure(absl::UnavailableError(absl::StrCat("cannot listen on ", o.host, ":", o.port)),
                   "is another server on that port? --port picks another (0: any free one)");
  }
  signals.Start([&] {
    std::fprintf(stderr, "stepgraph: stopping: finishing the requests in flight (at most %" PRId64
                 " s)\n", o.drain_seconds);
    server.draining.store(true);
    const bool all = server.scheduler->Drain(SteadyClock::now() +
                                             std::chrono::seconds(o.drain_seconds));
    if (!all) std::fprintf(stderr, "stepgraph: requests still running are ended\n");
    server.scheduler->Stop();
    http.stop();
  });
  std::fprintf(stderr,
               "stepgraph: listening on http://%s:%d (%" PRId64 " slots, queue %" PRId64
               ", context %" PRId64 " tokens%s)\n",
               o.host.c_str(), port, o.slots, o.max_queue, server.limits.max_seq,
               o.api_key.empty() ? "" : ", API key required");
  std::fflush(stderr);
  const bool listened = http.listen_after_bind();
  signals.Stopped();
  server.scheduler->Stop();
  if (!listened && !server.draining.load()) {
    return Failure(absl::UnavailableError("the HTTP server stopped"), HelpHint(kServe));
  }
  std::fprintf(stderr, "stepgraph: stopped\n");
  return kExitOk;
}

}  // namespace sg::cli
#endif  // STEPGRAPH_WITH_HTTP
