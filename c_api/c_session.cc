// The C ABI of decode sessions (include/stepgraph/c_api/c_session.h) over DecodeSession, using
// only its public methods (Create, Prefill, Generate, Logits, Release, stop_ids), and over
// the model's Tokenizer and ChatTemplate for the text functions. Each function checks its
// arguments, runs the session call, turns its Status into a code and a message kept on the
// handle, and lets no exception out.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "stepgraph/text/chat_template.h"
#include "models/model_tokenizer.h"
#include "stepgraph/runtime/session.h"
#include "stepgraph/text/tokenizer.h"
#include "stepgraph/runtime/step_runner.h"
#include "stepgraph/base/penalty_params.h"
#include "stepgraph/base/status.h"
#include "stepgraph/c_api/c_session.h"

static_assert(STEPGRAPH_SAMPLING_MAX_LOGIT_BIAS == sg::ops::kMaxLogitBias);
static_assert(STEPGRAPH_SAMPLING_MAX_PENALTY == sg::Penalties::kMaxPenalty);
static_assert(STEPGRAPH_SAMPLING_MAX_BIAS == sg::Penalties::kMaxBias);

struct stepgraph_session {
  std::unique_ptr<sg::DecodeSession> session;  // null on a handle of a failed create
  std::string error;
  std::string model_path;  // empty: the built-in model

  // The tokenizer and the chat template, loaded by the first text call that needs them
  // (sessions that speak ids never pay for them). A failure is kept and given again by every
  // later call, so that loading is tried once.
  bool tokenizer_loaded = false;
  absl::Status tokenizer_status;
  std::unique_ptr<sg::Tokenizer> tokenizer;
  bool chat_loaded = false;
  absl::Status chat_status;
  std::optional<sg::ChatTemplate> chat;
  int32_t end_of_turn = -1;  // the chat template's end-of-turn id, -1 when it has none
};

namespace {

constexpr int32_t kOk = STEPGRAPH_OK;
constexpr int32_t kInvalid = STEPGRAPH_ERROR_INVALID_VALUE;

int32_t CodeOf(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return kOk;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kPermissionDenied:
      return kInvalid;
    case absl::StatusCode::kResourceExhausted:
      return STEPGRAPH_ERROR_OUT_OF_MEMORY;
    default:
      return STEPGRAPH_ERROR_LAUNCH_FAILED;
  }
}

// Records `s` on the handle and returns its code.
int32_t Finish(stepgraph_session* h, const absl::Status& s) {
  if (s.ok()) {
    h->error.clear();
  } else {
    h->error = std::string(s.message());
  }
  return CodeOf(s);
}

int32_t Fail(stepgraph_session* h, int32_t code, std::string message) {
  h->error = std::move(message);
  return code;
}

// Runs `body` (returning a code) on a usable handle, turning any exception into a code
// and a message.
template <typename Body>
int32_t Guarded(stepgraph_session* h, const char* what, Body&& body) noexcept {
  if (h == nullptr) return kInvalid;
  try {
    if (h->session == nullptr) {
      return Fail(h, kInvalid,
                  absl::StrCat(what, ": the handle holds no session (its create failed)"));
    }
    return body(*h->session);
  } catch (const std::bad_alloc&) {
    h->error = "out of memory";  // short: the buffer usually holds it already
    return STEPGRAPH_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    h->error = absl::StrCat(what, ": unexpected exception: ", e.what());
    return STEPGRAPH_ERROR_LAUNCH_FAILED;
  } catch (...) {
    h->error = absl::StrCat(what, ": unexpected exception");
    return STEPGRAPH_ERROR_LAUNCH_FAILED;
  }
}

stepgraph_session_options Defaults() {
  stepgraph_session_options o;
  std::memset(&o, 0, sizeof(o));
  o.struct_size = sizeof(o);
  o.max_slots = 1;
  o.max_seq = 0;
  o.weight_seed = 0;
  o.backend = STEPGRAPH_BACKEND_AUTO;
  o.sampling = STEPGRAPH_SAMPLING_GREEDY;
  o.temperature = 1.0f;
  o.top_k = 0;
  o.top_p = 1.0f;
  o.cpu_threads = 0;
  return o;
}

// Sampling at these values; greedy (empty) below the documented minimum temperature, the
// limit of sampling as T -> 0 (the Sample op does the same on every backend; argmax is
// cheaper).
std::optional<sg::ops::Sample> SampleOf(float temperature, int32_t top_k, float top_p) {
  if (temperature > 0.0f && temperature < STEPGRAPH_SESSION_MIN_TEMPERATURE) return std::nullopt;
  sg::ops::Sample s;
  s.temperature = temperature;
  s.top_k = top_k;
  s.top_p = top_p;
  return s;
}

// The C options as SessionOptions, or a message saying which field is wrong.
absl::Status ToOptions(const char* model_path, const stepgraph_session_options& o,
                       sg::SessionOptions* out) {
  if (o.struct_size != static_cast<int64_t>(sizeof(stepgraph_session_options))) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.struct_size is ", o.struct_size, ", this library's is ",
                     sizeof(stepgraph_session_options),
                     ": fill the options with stepgraph_session_options_init"));
  }
  if (model_path != nullptr) out->model_path = model_path;
  out->weight_seed = o.weight_seed;
  switch (o.backend) {
    case STEPGRAPH_BACKEND_AUTO:
      out->backend = sg::Backend::kAuto;
      break;
    case STEPGRAPH_BACKEND_CPU:
      out->backend = sg::Backend::kCpu;
      break;
    case STEPGRAPH_BACKEND_CUDA:
      out->backend = sg::Backend::kCuda;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("options.backend ", o.backend,
                                                     " is not a STEPGRAPH_BACKEND_* value"));
  }
  if (o.max_slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat("options.max_slots ", o.max_slots, " < 1"));
  }
  if (o.max_seq < 0) {
    return absl::InvalidArgumentError(absl::StrCat("options.max_seq ", o.max_seq, " < 0"));
  }
  if (o.cpu_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.cpu_threads ", o.cpu_threads, " < 0"));
  }
  out->cpu_threads = o.cpu_threads;
  out->max_slots = o.max_slots;
  out->max_seq = o.max_seq;
  switch (o.sampling) {
    case STEPGRAPH_SAMPLING_GREEDY:
      break;
    case STEPGRAPH_SAMPLING_SAMPLE:
      // The Sample op's own checks refuse bad values when the session builds its graph.
      out->sampling = SampleOf(o.temperature, o.top_k, o.top_p);
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("options.sampling ", o.sampling,
                                                     " is not a STEPGRAPH_SAMPLING_* value"));
  }
  // Per-call penalties must be there on every session (c_session.h says why).
  out->penalties = true;
  return absl::OkStatus();
}

stepgraph_sampling SamplingDefaults() {
  stepgraph_sampling o;
  std::memset(&o, 0, sizeof(o));  // the padding too: a copy compares equal
  o.struct_size = sizeof(o);
  o.mode = STEPGRAPH_SAMPLING_GREEDY;
  o.temperature = 1.0f;
  o.top_k = 0;
  o.top_p = 1.0f;
  o.repetition_penalty = 1.0f;
  o.presence_penalty = 0.0f;
  o.frequency_penalty = 0.0f;
  o.min_p = 0.0f;
  o.logit_bias_count = 0;
  o.logit_bias_ids = nullptr;
  o.logit_bias_values = nullptr;
  return o;
}

// The C sampling as SlotSampling, or InvalidArgument naming the field (sampling.<field>)
// that is wrong. The counts are bounded before an array is read; each penalty goes through
// CheckPenalties alone so that its message can be given the C field's name.
absl::Status ToSlotSampling(const stepgraph_sampling& c, int64_t vocab_size,
                            sg::SlotSampling* out) {
  if (c.struct_size != static_cast<int64_t>(sizeof(stepgraph_sampling))) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.struct_size is ", c.struct_size, ", this library's is ",
                     sizeof(stepgraph_sampling), ": fill it with stepgraph_sampling_init"));
  }
  if (c.mode != STEPGRAPH_SAMPLING_GREEDY && c.mode != STEPGRAPH_SAMPLING_SAMPLE) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.mode ", c.mode, " is not a STEPGRAPH_SAMPLING_* value"));
  }
  if (!(c.temperature > 0.0f) || !std::isfinite(c.temperature)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling.temperature must be finite and > 0 (below ", STEPGRAPH_SESSION_MIN_TEMPERATURE,
        " it decodes greedily), got ", c.temperature));
  }
  if (c.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_k must be >= 0 (0: no limit), got ", c.top_k));
  }
  if (!(c.top_p > 0.0f && c.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_p must be in (0, 1], got ", c.top_p));
  }
  sg::Penalties p;
  struct Scalar {
    const char* name;
    float value;
    float sg::Penalties::*field;
  };
  for (const Scalar& f : {Scalar{"repetition_penalty", c.repetition_penalty,
                                 &sg::Penalties::repetition},
                          Scalar{"presence_penalty", c.presence_penalty, &sg::Penalties::presence},
                          Scalar{"frequency_penalty", c.frequency_penalty,
                                 &sg::Penalties::frequency},
                          Scalar{"min_p", c.min_p, &sg::Penalties::min_p}}) {
    sg::Penalties one;
    one.*f.field = f.value;
    if (absl::Status st = sg::CheckPenalties(one, vocab_size); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("sampling.", f.name, ": ", st.message()));
    }
    p.*f.field = f.value;
  }
  if (c.logit_bias_count < 0 || c.logit_bias_count > STEPGRAPH_SAMPLING_MAX_LOGIT_BIAS) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.logit_bias_count must be in [0, ",
                     STEPGRAPH_SAMPLING_MAX_LOGIT_BIAS, "], got ", c.logit_bias_count));
  }
  if (c.logit_bias_count > 0 && c.logit_bias_ids == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling.logit_bias_ids is NULL with logit_bias_count ", c.logit_bias_count));
  }
  if (c.logit_bias_count > 0 && c.logit_bias_values == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling.logit_bias_values is NULL with logit_bias_count ", c.logit_bias_count));
  }
  p.logit_bias.reserve(static_cast<size_t>(c.logit_bias_count));
  for (int32_t i = 0; i < c.logit_bias_count; ++i) {
    const int32_t id = c.logit_bias_ids[i];
    const float bias = c.logit_bias_values[i];
    // One entry at a time, so that the message names the array the bad value is in.
    sg::Penalties one;
    one.logit_bias = {{id, 0.0f}};
    if (absl::Status st = sg::CheckPenalties(one, vocab_size); !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.logit_bias_ids[", i, "]: ", st.message()));
    }
    one.logit_bias = {{id, bias}};
    if (absl::Status st = sg::CheckPenalties(one, vocab_size); !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.logit_bias_values[", i, "]: ", st.message()));
    }
    p.logit_bias.emplace_back(id, bias);
  }
  // What is left to refuse is an id named twice.
  if (absl::Status st = sg::CheckPenalties(p, vocab_size); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.logit_bias_ids: ", st.message()));
  }
  out->penalties = std::move(p);
  out->sample.reset();
  if (c.mode == STEPGRAPH_SAMPLING_SAMPLE) {
    out->sample = SampleOf(c.temperature, c.top_k, c.top_p);
  }
  return absl::OkStatus();
}

int32_t BackendCode(sg::Backend b) {
  return b == sg::Backend::kCuda ? STEPGRAPH_BACKEND_CUDA : STEPGRAPH_BACKEND_CPU;
}

// ---- text ----

constexpr uint32_t kAllTextFlags = STEPGRAPH_TEXT_CHAT | STEPGRAPH_TEXT_NO_ADD_SPECIAL |
                                   STEPGRAPH_TEXT_LITERAL_SPECIAL | STEPGRAPH_TEXT_SKIP_SPECIAL;

// InvalidArgument naming the bits of `flags` that `what` does not take.
absl::Status CheckFlags(uint32_t flags, uint32_t allowed, absl::string_view what) {
  const uint32_t extra = flags & ~allowed;
  if (extra == 0) return absl::OkStatus();
  std::string names;
  for (const auto& [bit, name] :
       {std::pair<uint32_t, const char*>{STEPGRAPH_TEXT_CHAT, "STEPGRAPH_TEXT_CHAT"},
        {STEPGRAPH_TEXT_NO_ADD_SPECIAL, "STEPGRAPH_TEXT_NO_ADD_SPECIAL"},
        {STEPGRAPH_TEXT_LITERAL_SPECIAL, "STEPGRAPH_TEXT_LITERAL_SPECIAL"},
        {STEPGRAPH_TEXT_SKIP_SPECIAL, "STEPGRAPH_TEXT_SKIP_SPECIAL"}}) {
    if ((extra & bit) != 0) absl::StrAppend(&names, names.empty() ? "" : ", ", name);
  }
  if ((extra & ~kAllTextFlags) != 0) {
    absl::StrAppend(&names, names.empty() ? "" : ", ", "unknown bits 0x",
                    absl::Hex(extra & ~kAllTextFlags));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": flags ", names, " do not apply to this function"));
}

// The size-query convention of the text functions: `needed` items go to a buffer of
// `capacity`; a NULL buffer with capacity 0 only asks. Ok when the buffer takes them (or on
// a query), InvalidArgument otherwise.
absl::Status CheckRoom(const void* buffer, int64_t capacity, int64_t needed,
                       absl::string_view what, absl::string_view unit) {
  if (capacity < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": capacity ", capacity, " < 0"));
  }
  if (buffer == nullptr && capacity > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the buffer is NULL with capacity ", capacity,
                     " (a size query passes NULL with capacity 0)"));
  }
  if (buffer == nullptr || capacity >= needed) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": the buffer holds ", capacity, " ",
                                                 unit, ", ", needed, " are needed"));
}

// The handle's tokenizer, loaded on first use; NotFound for a model without one.
absl::StatusOr<const sg::Tokenizer*> TokenizerOf(stepgraph_session& h, absl::string_view what) {
  if (!h.tokenizer_loaded) {
    h.tokenizer_loaded = true;
    if (h.model_path.empty()) {
      h.tokenizer_status = absl::NotFoundError(
          "the built-in model has no tokenizer: it speaks token ids only (load a model folder "
          "with tokenizer.json, or a GGUF file, for text)");
    } else {
      absl::StatusOr<std::unique_ptr<sg::Tokenizer>> tok = sg::LoadModelTokenizer(h.model_path);
      if (tok.ok()) {
        h.tokenizer = *std::move(tok);
      } else {
        h.tokenizer_status = tok.status();
      }
    }
  }
  if (!h.tokenizer_status.ok()) {
    return absl::Status(h.tokenizer_status.code(),
                        absl::StrCat(what, ": ", h.tokenizer_status.message()));
  }
  return h.tokenizer.get();
}

// The handle's chat template (and its end-of-turn id), read on first use.
absl::StatusOr<const sg::ChatTemplate*> ChatOf(stepgraph_session& h, const sg::Tokenizer& tok,
                                               absl::string_view what) {
  if (!h.chat_loaded) {
    h.chat_loaded = true;
    absl::StatusOr<sg::ChatTemplate> chat = sg::ChatTemplate::ForTokenizer(tok);
    if (chat.ok()) {
      h.chat = *std::move(chat);
      if (!h.chat->end_of_turn().empty()) h.end_of_turn = tok.TokenId(h.chat->end_of_turn());
    } else {
      // A model without a template is a bad argument for STEPGRAPH_TEXT_CHAT, whatever the
      // template reader calls it.
      h.chat_status = absl::InvalidArgumentError(absl::StrCat(
          "STEPGRAPH_TEXT_CHAT: the model's chat template cannot be used: ",
          chat.status().message()));
    }
  }
  if (!h.chat_status.ok()) {
    return absl::Status(h.chat_status.code(), absl::StrCat(what, ": ", h.chat_status.message()));
  }
  return &*h.chat;
}

// Finish for the text functions: a missing tokenizer has its own code.
int32_t FinishText(stepgraph_session* h, const absl::Status& s) {
  if (s.code() == absl::StatusCode::kNotFound && h->tokenizer == nullptr && h->tokenizer_loaded) {
    h->error = std::string(s.message());
    return STEPGRAPH_ERROR_NO_TOKENIZER;
  }
  return Finish(h, s);
}

// Writes the size and, when the buffer takes them, the items.
template <typename T>
int32_t Deliver(stepgraph_session* h, const std::vector<T>& items, T* out, int64_t capacity,
                int64_t* count, absl::string_view what, absl::string_view unit) {
  const int64_t needed = static_cast<int64_t>(items.size());
  *count = needed;
  if (absl::Status room = CheckRoom(out, capacity, needed, what, unit); !room.ok()) {
    return Finish(h, room);
  }
  if (out != nullptr && needed > 0) std::memcpy(out, items.data(), items.size() * sizeof(T));
  return Finish(h, absl::OkStatus());
}

}  // namespace

extern "C" {

int32_t stepgraph_session_abi_version(void) noexcept { return STEPGRAPH_SESSION_API_VERSION; }

int32_t stepgraph_session_options_init(stepgraph_session_options* options) noexcept {
  if (options == nullptr) return kInvalid;
  *options = Defaults();
  return kOk;
}

int32_t stepgraph_sampling_init(stepgraph_sampling* sampling) noexcept {
  if (sampling == nullptr) return kInvalid;
  *sampling = SamplingDefaults();
  return kOk;
}

int32_t stepgraph_session_create(const char* model_path,
                                 const stepgraph_session_options* options,
                                 stepgraph_session** session) noexcept {
  if (session == nullptr) return kInvalid;
  *session = nullptr;
  stepgraph_session* h = new (std::nothrow) stepgraph_session;
  if (h == nullptr) return STEPGRAPH_ERROR_OUT_OF_MEMORY;
  *session = h;
  try {
    const stepgraph_session_options o = options != nullptr ? *options : Defaults();
    sg::SessionOptions opts;
    if (const absl::Status s = ToOptions(model_path, o, &opts); !s.ok()) return Finish(h, s);
    if (model_path != nullptr && model_path[0] == '\0') {
      return Fail(h, kInvalid, "model_path is empty: pass NULL for the built-in model");
    }
    // Asked first, so that this case gets its own code whatever the session would say.
    if (opts.backend == sg::Backend::kCuda && !sg::CudaDeviceFound()) {
      return Fail(h, STEPGRAPH_ERROR_NO_CUDA,
                  sg::BuiltWithCuda() ? "the CUDA backend was asked for and no device was found"
                                      : "the CUDA backend was asked for and this build of "
                                        "stepgraph has no CUDA");
    }
    absl::StatusOr<std::unique_ptr<sg::DecodeSession>> made = sg::DecodeSession::Create(opts);
    if (!made.ok()) return Finish(h, made.status());
    h->session = std::move(*made);
    h->model_path = opts.model_path;
    return Finish(h, absl::OkStatus());
  } catch (const std::bad_alloc&) {
    h->error = "out of memory";
    return STEPGRAPH_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    h->error = "stepgraph_session_create: unexpected exception";
    return STEPGRAPH_ERROR_LAUNCH_FAILED;
  }
}

void stepgraph_session_destroy(stepgraph_session* session) noexcept {
  try {
    delete session;
  } catch (...) {
    // A destructor that throws is a bug; the handle is gone either way.
  }
}

const char* stepgraph_session_error(const stepgraph_session* session) noexcept {
  if (session == nullptr) return "no session (NULL handle)";
  return session->error.c_str();
}

int32_t stepgraph_session_get_info(stepgraph_session* session,
                               stepgraph_session_info* info) noexcept {
  return Guarded(session, "stepgraph_session_get_info", [&](sg::DecodeSession& s) {
    if (info == nullptr) return Fail(session, kInvalid, "stepgraph_session_get_info: info is NULL");
    info->vocab_size = s.config().vocab_size;
    info->max_slots = s.max_slots();
    info->max_seq = s.max_seq();
    info->backend = BackendCode(s.backend());
    return Finish(session, absl::OkStatus());
  });
}

int32_t stepgraph_session_prefill(stepgraph_session* session, int64_t slot, const int32_t* ids,
                                  int64_t n, int32_t seed) noexcept {
  return stepgraph_session_prefill_sampled(session, slot, ids, n, seed, nullptr);
}

int32_t stepgraph_session_prefill_sampled(stepgraph_session* session, int64_t slot,
                                          const int32_t* ids, int64_t n, int32_t seed,
                                          const stepgraph_sampling* sampling) noexcept {
  // Named after the entry point the caller used.
  const char* what =
      sampling == nullptr ? "stepgraph_session_prefill" : "stepgraph_session_prefill_sampled";
  return Guarded(session, what, [&](sg::DecodeSession& s) {
    if (ids == nullptr || n < 1) {
      return Fail(session, kInvalid,
                  absl::StrCat(what, ": ids must be non-NULL with n >= 1 entries, got n = ", n));
    }
    if (n > s.max_seq()) {  // before the span is made: n bounds what is read
      return Fail(session, kInvalid,
                  absl::StrCat(what, ": a prompt of ", n, " ids is longer than max_seq ",
                               s.max_seq()));
    }
    sg::PrefillRequest request;
    request.slot = slot;
    request.prompt = absl::MakeConstSpan(ids, static_cast<size_t>(n));
    request.seed = seed;
    if (sampling != nullptr) {
      sg::SlotSampling own;
      if (absl::Status st = ToSlotSampling(*sampling, s.config().vocab_size, &own); !st.ok()) {
        return Fail(session, kInvalid, absl::StrCat(what, ": ", st.message()));
      }
      request.sampling = std::move(own);
    }
    return Finish(session, s.Prefill(absl::MakeConstSpan(&request, 1)));
  });
}

int32_t stepgraph_session_generate(stepgraph_session* session, int64_t slot, int64_t n,
                                   int32_t* ids) noexcept {
  return Guarded(session, "stepgraph_session_generate", [&](sg::DecodeSession& s) {
    if (ids == nullptr || n < 1) {
      return Fail(session, kInvalid,
                  absl::StrCat("stepgraph_session_generate: ids must be non-NULL with room "
                               "for n >= 1 ids, got n = ",
                               n));
    }
    absl::StatusOr<std::vector<int32_t>> out = s.Generate(slot, n);
    if (!out.ok()) return Finish(session, out.status());
    if (static_cast<int64_t>(out->size()) != n) {
      return Fail(session, STEPGRAPH_ERROR_LAUNCH_FAILED,
                  absl::StrCat("stepgraph_session_generate: the session returned ", out->size(),
                               " ids for ", n, " steps"));
    }
    std::memcpy(ids, out->data(), out->size() * sizeof(int32_t));
    return Finish(session, absl::OkStatus());
  });
}

int32_t stepgraph_session_logits(stepgraph_session* session, int64_t slot, float* logits,
                                 int64_t capacity) noexcept {
  return Guarded(session, "stepgraph_session_logits", [&](sg::DecodeSession& s) {
    const int64_t vocab = s.config().vocab_size;
    if (logits == nullptr || capacity < vocab) {
      return Fail(session, kInvalid,
                  absl::StrCat("stepgraph_session_logits: logits must be non-NULL with room "
                               "for vocab_size ",
                               vocab, " floats, got capacity ", capacity));
    }
    absl::StatusOr<std::vector<float>> out = s.Logits(slot);
    if (!out.ok()) return Finish(session, out.status());
    if (static_cast<int64_t>(out->size()) != vocab) {
      return Fail(session, STEPGRAPH_ERROR_LAUNCH_FAILED,
                  absl::StrCat("stepgraph_session_logits: the session returned ", out->size(),
                               " logits, the vocabulary has ", vocab));
    }
    std::memcpy(logits, out->data(), out->size() * sizeof(float));
    return Finish(session, absl::OkStatus());
  });
}

int32_t stepgraph_session_release(stepgraph_session* session, int64_t slot) noexcept {
  return Guarded(session, "stepgraph_session_release",
                 [&](sg::DecodeSession& s) { return Finish(session, s.Release(slot)); });
}

int32_t stepgraph_session_encode(stepgraph_session* session, const char* text,
                                 int64_t text_bytes, uint32_t flags, int32_t* ids,
                                 int64_t capacity, int64_t* count) noexcept {
  constexpr const char* kWhat = "stepgraph_session_encode";
  return Guarded(session, kWhat, [&](sg::DecodeSession&) {
    if (count == nullptr) return Fail(session, kInvalid, absl::StrCat(kWhat, ": count is NULL"));
    *count = 0;
    if (text_bytes < 0 || text_bytes > STEPGRAPH_SESSION_MAX_TEXT_BYTES ||
        (text == nullptr && text_bytes != 0)) {
      return Fail(session, kInvalid,
                  absl::StrCat(kWhat, ": text must hold text_bytes in [0, ",
                               STEPGRAPH_SESSION_MAX_TEXT_BYTES,
                               "] bytes (NULL only with 0), got ", text_bytes,
                               text == nullptr ? " with NULL" : ""));
    }
    if (absl::Status f = CheckFlags(flags,
                                    STEPGRAPH_TEXT_CHAT | STEPGRAPH_TEXT_NO_ADD_SPECIAL |
                                        STEPGRAPH_TEXT_LITERAL_SPECIAL,
                                    kWhat);
        !f.ok()) {
      return Finish(session, f);
    }
    const bool chat = (flags & STEPGRAPH_TEXT_CHAT) != 0;
    if (chat && (flags & STEPGRAPH_TEXT_LITERAL_SPECIAL) != 0) {
      return Fail(session, kInvalid,
                  absl::StrCat(kWhat, ": STEPGRAPH_TEXT_LITERAL_SPECIAL cannot go with "
                               "STEPGRAPH_TEXT_CHAT (the template is made of special tokens)"));
    }
    if (absl::Status room = CheckRoom(ids, capacity, 0, kWhat, "ids"); !room.ok()) {
      return Finish(session, room);
    }
    absl::StatusOr<const sg::Tokenizer*> tok = TokenizerOf(*session, kWhat);
    if (!tok.ok()) return FinishText(session, tok.status());
    const absl::string_view input = text_bytes == 0
                                        ? absl::string_view()
                                        : absl::string_view(text, static_cast<size_t>(text_bytes));
    absl::StatusOr<std::vector<int32_t>> out;
    if (chat) {
      absl::StatusOr<const sg::ChatTemplate*> tmpl = ChatOf(*session, **tok, kWhat);
      if (!tmpl.ok()) return Finish(session, tmpl.status());
      // The rendered turn carries its own special tokens (bos included where the template
      // writes it), as `stepgraph run --chat` encodes it.
      absl::StatusOr<std::string> turn = (*tmpl)->Render({{"user", std::string(input)}}, true);
      if (!turn.ok()) {
        return Fail(session, kInvalid, absl::StrCat(kWhat, ": ", turn.status().message()));
      }
      out = (*tok)->Encode(*turn, {.add_special = false});
    } else {
      out = (*tok)->Encode(input, {.add_special = (flags & STEPGRAPH_TEXT_NO_ADD_SPECIAL) == 0,
                                   .parse_special =
                                       (flags & STEPGRAPH_TEXT_LITERAL_SPECIAL) == 0});
    }
    if (!out.ok()) {
      return Fail(session, CodeOf(out.status()), absl::StrCat(kWhat, ": ", out.status().message()));
    }
    return Deliver(session, *out, ids, capacity, count, kWhat, "ids");
  });
}

int32_t stepgraph_session_encode_chat(stepgraph_session* session, const char* messages_json,
                                      int64_t json_bytes, int32_t* ids, int64_t capacity,
                                      int64_t* count) noexcept {
  constexpr const char* kWhat = "stepgraph_session_encode_chat";
  return Guarded(session, kWhat, [&](sg::DecodeSession&) {
    if (count == nullptr) return Fail(session, kInvalid, absl::StrCat(kWhat, ": count is NULL"));
    *count = 0;
    if (messages_json == nullptr || json_bytes < 0 ||
        json_bytes > STEPGRAPH_SESSION_MAX_TEXT_BYTES) {
      return Fail(session, kInvalid,
                  absl::StrCat(kWhat, ": messages_json must hold json_bytes in [0, ",
                               STEPGRAPH_SESSION_MAX_TEXT_BYTES, "] bytes, got ", json_bytes,
                               messages_json == nullptr ? " with NULL" : ""));
    }
    if (absl::Status room = CheckRoom(ids, capacity, 0, kWhat, "ids"); !room.ok()) {
      return Finish(session, room);
    }
    absl::StatusOr<const sg::Tokenizer*> tok = TokenizerOf(*session, kWhat);
    if (!tok.ok()) return FinishText(session, tok.status());
    absl::StatusOr<const sg::ChatTemplate*> tmpl = ChatOf(*session, **tok, kWhat);
    if (!tmpl.ok()) return Finish(session, tmpl.status());
    absl::StatusOr<std::vector<sg::ChatMessage>> messages = sg::ChatMessagesFromJson(
        absl::string_view(messages_json, static_cast<size_t>(json_bytes)),
        STEPGRAPH_SESSION_MAX_CHAT_MESSAGES);
    if (!messages.ok()) {
      return Finish(session, absl::Status(messages.status().code(),
                                          absl::StrCat(kWhat, ": ", messages.status().message())));
    }
    absl::StatusOr<std::string> text = (*tmpl)->Render(*messages, true);
    if (!text.ok()) {
      return Fail(session, kInvalid, absl::StrCat(kWhat, ": ", text.status().message()));
    }
    absl::StatusOr<std::vector<int32_t>> out = (*tok)->Encode(*text, {.add_special = false});
    if (!out.ok()) {
      return Fail(session, CodeOf(out.status()), absl::StrCat(kWhat, ": ", out.status().message()));
    }
    return Deliver(session, *out, ids, capacity, count, kWhat, "ids");
  });
}

int32_t stepgraph_session_decode(stepgraph_session* session, const int32_t* ids, int64_t n,
                                 uint32_t flags, char* text, int64_t capacity,
                                 int64_t* length) noexcept {
  constexpr const char* kWhat = "stepgraph_session_decode";
  return Guarded(session, kWhat, [&](sg::DecodeSession&) {
    if (length == nullptr) {
      return Fail(session, kInvalid, absl::StrCat(kWhat, ": length is NULL"));
    }
    *length = 0;
    if (n < 0 || n > STEPGRAPH_SESSION_MAX_DECODE_IDS || (ids == nullptr && n != 0)) {
      return Fail(session, kInvalid,
                  absl::StrCat(kWhat, ": ids must hold n in [0, ",
                               STEPGRAPH_SESSION_MAX_DECODE_IDS, "] ids (NULL only with 0), got ",
                               n, ids == nullptr ? " with NULL" : ""));
    }
    if (absl::Status f = CheckFlags(flags, STEPGRAPH_TEXT_SKIP_SPECIAL, kWhat); !f.ok()) {
      return Finish(session, f);
    }
    if (absl::Status room = CheckRoom(text, capacity, 0, kWhat, "bytes"); !room.ok()) {
      return Finish(session, room);
    }
    absl::StatusOr<const sg::Tokenizer*> tok = TokenizerOf(*session, kWhat);
    if (!tok.ok()) return FinishText(session, tok.status());
    absl::StatusOr<std::string> out = (*tok)->Decode(
        n == 0 ? absl::Span<const int32_t>() : absl::MakeConstSpan(ids, static_cast<size_t>(n)),
        {.skip_special = (flags & STEPGRAPH_TEXT_SKIP_SPECIAL) != 0});
    if (!out.ok()) {
      return Fail(session, CodeOf(out.status()), absl::StrCat(kWhat, ": ", out.status().message()));
    }
    const int64_t size = static_cast<int64_t>(out->size());
    *length = size;
    // The terminating NUL needs one more byte.
    if (absl::Status room = CheckRoom(text, capacity, size + 1, kWhat, "bytes"); !room.ok()) {
      return Finish(session, room);
    }
    if (text != nullptr) {
      std::memcpy(text, out->data(), out->size());
      text[size] = '\0';
    }
    return Finish(session, absl::OkStatus());
  });
}

int32_t stepgraph_session_stop_ids(stepgraph_session* session, uint32_t flags, int32_t* ids,
                                   int64_t capacity, int64_t* count) noexcept {
  constexpr const char* kWhat = "stepgraph_session_stop_ids";
  return Guarded(session, kWhat, [&](sg::DecodeSession& s) {
    if (count == nullptr) return Fail(session, kInvalid, absl::StrCat(kWhat, ": count is NULL"));
    *count = 0;
    if (absl::Status f = CheckFlags(flags, STEPGRAPH_TEXT_CHAT, kWhat); !f.ok()) {
      return Finish(session, f);
    }
    if (absl::Status room = CheckRoom(ids, capacity, 0, kWhat, "ids"); !room.ok()) {
      return Finish(session, room);
    }
    std::vector<int32_t> stop = s.stop_ids();
    if ((flags & STEPGRAPH_TEXT_CHAT) != 0) {
      absl::StatusOr<const sg::Tokenizer*> tok = TokenizerOf(*session, kWhat);
      if (!tok.ok()) return FinishText(session, tok.status());
      absl::StatusOr<const sg::ChatTemplate*> tmpl = ChatOf(*session, **tok, kWhat);
      if (!tmpl.ok()) return Finish(session, tmpl.status());
      const int32_t eot = session->end_of_turn;
      if (eot >= 0 && eot < s.config().vocab_size &&
          std::find(stop.begin(), stop.end(), eot) == stop.end()) {
        stop.push_back(eot);
      }
    }
    return Deliver(session, stop, ids, capacity, count, kWhat, "ids");
  });
}

}  // extern "C"
