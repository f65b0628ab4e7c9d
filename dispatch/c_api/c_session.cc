// The C ABI of decode sessions (include/stepgraph/c_session.h) over DecodeSession, using
// only its public methods (Create, Prefill, Generate, Logits, Release). Each function
// checks its arguments, runs the session call, turns its Status into a code and a message
// kept on the handle, and lets no exception out.
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "models/session.h"
#include "stepgraph/step_runner.h"
#include "stepgraph/c_session.h"

struct stepgraph_session {
  std::unique_ptr<sg::DecodeSession> session;  // null on a handle of a failed create
  std::string error;
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
    case STEPGRAPH_SAMPLING_SAMPLE: {
      // The Sample op's own checks refuse bad values when the session builds its graph.
      sg::ops::Sample s;
      s.temperature = o.temperature;
      s.top_k = o.top_k;
      s.top_p = o.top_p;
      out->sampling = s;
      break;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("options.sampling ", o.sampling,
                                                     " is not a STEPGRAPH_SAMPLING_* value"));
  }
  return absl::OkStatus();
}

int32_t BackendCode(sg::Backend b) {
  return b == sg::Backend::kCuda ? STEPGRAPH_BACKEND_CUDA : STEPGRAPH_BACKEND_CPU;
}

}  // namespace

extern "C" {

int32_t stepgraph_session_abi_version(void) noexcept { return STEPGRAPH_SESSION_API_VERSION; }

int32_t stepgraph_session_options_init(stepgraph_session_options* options) noexcept {
  if (options == nullptr) return kInvalid;
  *options = Defaults();
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
  return Guarded(session, "stepgraph_session_prefill", [&](sg::DecodeSession& s) {
    if (ids == nullptr || n < 1) {
      return Fail(session, kInvalid,
                  absl::StrCat("stepgraph_session_prefill: ids must be non-NULL with n >= 1 "
                               "entries, got n = ",
                               n));
    }
    if (n > s.max_seq()) {  // before the span is made: n bounds what is read
      return Fail(session, kInvalid,
                  absl::StrCat("stepgraph_session_prefill: a prompt of ", n,
                               " ids is longer than max_seq ", s.max_seq()));
    }
    return Finish(session, s.Prefill(slot, absl::MakeConstSpan(ids, static_cast<size_t>(n)),
                                     seed));
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

}  // extern "C"
