// The continuous-batching scheduler over one DecodeSession; see scheduler.h. Everything
// that touches the session runs on the scheduler's thread: Round() is one pass between two
// decode steps. The mutex guards only the queue, the flags and the counters that other
// threads read; a request's ids travel through its GenerationStream's own mutex.
#include "stepgraph/runtime/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "stepgraph/base/status.h"

namespace sg {

absl::string_view FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
    case FinishReason::kAborted:
      return "aborted";
  }
  return "?";
}

// ---- GenerationStream ----

FinishReason GenerationStream::Wait(std::vector<int32_t>* ids, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, deadline,
                 [&] { return !ready_.empty() || finish_ != FinishReason::kNone; });
  ids->insert(ids->end(), ready_.begin(), ready_.end());
  ready_.clear();
  return finish_;
}

void GenerationStream::Cancel() { cancelled_.store(true, std::memory_order_relaxed); }

absl::Status GenerationStream::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

void GenerationStream::Push(int32_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_.push_back(id);
  }
  cv_.notify_all();
}

void GenerationStream::Finish(FinishReason reason, absl::Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finish_ != FinishReason::kNone) return;
    finish_ = reason;
    status_ = std::move(status);
  }
  cv_.notify_all();
}

// ---- Scheduler ----

// A request in a slot (or waiting for one).
struct Scheduler::Active {
  GenerationRequest request;
  std::shared_ptr<GenerationStream> stream;
  int64_t fed = 0;        // prompt ids in the slot so far (0: not started)
  bool decoding = false;  // the whole prompt is in and the slot steps
  int64_t made = 0;       // ids given to the reader
  bool stopped = false;   // the last step made a stop id
};

Scheduler::Scheduler(DecodeSession* session, const SchedulerOptions& options)
    : session_(session), options_(options) {
  budget_ = options.prefill_budget > 0        ? options.prefill_budget
            : session->prefill_chunk() > 0 ? session->prefill_chunk()
                                           : 256;
  slots_.resize(static_cast<size_t>(session->max_slots()));
  stats_.max_slots = session->max_slots();
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Start(DecodeSession* session,
                                                            const SchedulerOptions& options) {
  if (session == nullptr) return absl::InvalidArgumentError("Scheduler: no session");
  if (options.max_queue < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Scheduler: max_queue must be >= 0, got ", options.max_queue));
  }
  if (options.prefill_budget < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Scheduler: prefill_budget must be >= 0 (0: the session's chunk), got ",
        options.prefill_budget));
  }
  std::unique_ptr<Scheduler> s(new Scheduler(session, options));
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

Scheduler::~Scheduler() { Stop(); }

absl::StatusOr<std::shared_ptr<GenerationStream>> Scheduler::Submit(GenerationRequest request) {
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  const int64_t vocab = session_->config().vocab_size;
  const int64_t max_seq = session_->max_seq();
  if (n == 0) return absl::InvalidArgumentError("prompt: no tokens");
  for (int64_t i = 0; i < n; ++i) {
    if (request.prompt[i] < 0 || request.prompt[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: token ", i, " is id ",
                                                     request.prompt[i],
                                                     ", outside the vocabulary [0, ", vocab, ")"));
    }
  }
  if (request.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens: must be >= 1, got ", request.max_tokens));
  }
  if (n > max_seq || request.max_tokens > max_seq - n + 1) {
    return absl::OutOfRangeError(absl::StrCat(
        "the prompt (", n, " tokens) and max_tokens (", request.max_tokens,
        ") need ", n + request.max_tokens - 1, " positions; the context holds ", max_seq));
  }
  auto active = std::make_unique<Active>();
  active->stream = std::make_shared<GenerationStream>(n);
  active->request = std::move(request);
  std::shared_ptr<GenerationStream> stream = active->stream;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!accepting_) {
      return absl::UnavailableError("the server is shutting down and takes no new requests");
    }
    // At most max_slots requests run and max_queue wait.
    if (in_flight_ >= stats_.max_slots + options_.max_queue) {
      ++stats_.refused;
      return absl::ResourceExhaustedError(absl::StrCat(
          "all ", stats_.max_slots, " slots are busy and ", in_flight_ - stats_.max_slots,
          " requests wait already (the queue holds ", options_.max_queue, ")"));
    }
    queue_.push_back(std::move(active));
    ++stats_.submitted;
    ++in_flight_;
    stats_.queued = static_cast<int64_t>(queue_.size());
  }
  wake_.notify_one();
  return stream;
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

bool Scheduler::Drain(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  accepting_ = false;
  return settled_.wait_until(lock, deadline, [&] { return in_flight_ == 0; });
}

void Scheduler::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    accepting_ = false;
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::Loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stopping_) break;
    }
    if (Round()) continue;
    std::unique_lock<std::mutex> lock(mu_);
    wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
  }
  // Stopping: every request still here ends, and every slot is released.
  std::deque<std::unique_ptr<Active>> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued.swap(queue_);
    stats_.queued = 0;
  }
  for (std::unique_ptr<Active>& a : queued) {
    a->stream->Finish(FinishReason::kAborted);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.finished[static_cast<int>(FinishReason::kAborted)];
    --in_flight_;
  }
  for (int64_t slot = 0; slot < static_cast<int64_t>(slots_.size()); ++slot) {
    if (slots_[slot] != nullptr) EndRequest(slot, FinishReason::kAborted);
  }
  settled_.notify_all();
}

void Scheduler::EndRequest(int64_t slot, FinishReason reason, absl::Status status) {
  std::unique_ptr<Active> a = std::move(slots_[slot]);
  // A failed release leaves the slot as it is; the next Prefill into it starts over.
  if (session_->live(slot)) session_->Release(slot).IgnoreError();
  prefilling_.erase(std::remove(prefilling_.begin(), prefilling_.end(), slot), prefilling_.end());
  {
    // The request leaves the counts before its reader learns that it ended: a client that
    // sends its next request on the answer must find the slot free, not a 503.
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.finished[static_cast<int>(reason)];
    --stats_.active;
    if (a->decoding) --stats_.decoding;
    --in_flight_;
  }
  a->stream->Finish(reason, std::move(status));
  settled_.notify_all();
}

void Scheduler::FailAll(const absl::Status& status) {
  for (int64_t slot = 0; slot < static_cast<int64_t>(slots_.size()); ++slot) {
    if (slots_[slot] != nullptr) EndRequest(slot, FinishReason::kError, status);
  }
}

bool Scheduler::Round() {
  // Cancelled requests leave first, so that their slots serve this round's arrivals.
  for (int64_t slot = 0; slot < static_cast<int64_t>(slots_.size()); ++slot) {
    if (slots_[slot] != nullptr && slots_[slot]->stream->cancelled()) {
      EndRequest(slot, FinishReason::kCancelled);
    }
  }
  // Arrivals into free slots, lowest first.
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t slot = 0; slot < static_cast<int64_t>(slots_.size()) && !queue_.empty();
         ++slot) {
      if (slots_[slot] != nullptr) continue;
      std::unique_ptr<Active> a = std::move(queue_.front());
      queue_.pop_front();
      if (a->stream->cancelled()) {
        a->stream->Finish(FinishReason::kCancelled);
        ++stats_.finished[static_cast<int>(FinishReason::kCancelled)];
        --in_flight_;
        settled_.notify_all();
        --slot;  // the slot is still free
        continue;
      }
      stats_.prompt_tokens += static_cast<int64_t>(a->request.prompt.size());
      ++stats_.active;
      slots_[slot] = std::move(a);
      prefilling_.push_back(slot);
    }
    stats_.queued = static_cast<int64_t>(queue_.size());
  }
  bool work = false;
  for (const std::unique_ptr<Active>& a : slots_) work = work || a != nullptr;
  if (!work) return false;

  if (absl::Status st = FeedPrompts(); !st.ok()) {
    FailAll(st);
    return true;
  }
  if (absl::Status st = Compact(); !st.ok()) {
    FailAll(st);
    return true;
  }
  if (absl::Status st = DecodeStep(); !st.ok()) FailAll(st);
  return true;
}

absl::Status Scheduler::FeedPrompts() {
  int64_t budget = budget_;
  std::vector<PrefillRequest> batch;  // whole prompts that start together
  std::vector<int64_t> batch_slots;
  for (size_t k = 0; k < prefilling_.size() && budget > 0; ++k) {
    const int64_t slot = prefilling_[k];
    Active& a = *slots_[slot];
    const std::vector<int32_t>& prompt = a.request.prompt;
    const int64_t n = static_cast<int64_t>(prompt.size());
    // A Prefill of m ids feeds m - 1 of them; each later Append of m ids feeds m.
    if (a.fed == 0 && n - 1 <= budget) {
      batch.push_back({slot, prompt, a.request.seed, a.request.sampling});
      batch_slots.push_back(slot);
      budget -= n - 1;
      continue;
    }
    if (a.fed == 0) {
      const int64_t head = budget + 1;
      const PrefillRequest r{slot, absl::MakeConstSpan(prompt).subspan(0, head),
                             a.request.seed, a.request.sampling};
      SG_RETURN_IF_ERROR(session_->Prefill(absl::MakeConstSpan(&r, 1)));
      SG_RETURN_IF_ERROR(session_->Hold(slot));
      a.fed = head;
      budget = 0;
    } else {
      const int64_t take = std::min(budget, n - a.fed);
      SG_RETURN_IF_ERROR(
          session_->Append(slot, absl::MakeConstSpan(prompt).subspan(a.fed, take)));
      a.fed += take;
      budget -= take;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.prefill_calls;
    }
    if (a.fed == n) {
      SG_RETURN_IF_ERROR(session_->Resume(slot));
      a.decoding = true;
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.decoding;
    }
  }
  if (!batch.empty()) {
    SG_RETURN_IF_ERROR(session_->Prefill(batch));
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.prefill_calls;
    for (int64_t slot : batch_slots) {
      Active& a = *slots_[slot];
      a.fed = static_cast<int64_t>(a.request.prompt.size());
      a.decoding = true;
      ++stats_.decoding;
    }
  }
  prefilling_.erase(std::remove_if(prefilling_.begin(), prefilling_.end(),
                                   [&](int64_t slot) { return slots_[slot]->decoding; }),
                    prefilling_.end());
  return absl::OkStatus();
}

absl::Status Scheduler::Compact() {
  const std::vector<int64_t>& buckets = session_->buckets();
  auto bucket_for = [&](int64_t rows) {
    for (int64_t b : buckets) {
      if (b >= rows) return b;
    }
    return buckets.back();
  };
  for (;;) {
    int64_t highest = -1, below = -1, free_slot = -1;
    for (int64_t slot = 0; slot < static_cast<int64_t>(slots_.size()); ++slot) {
      if (slots_[slot] == nullptr) {
        if (free_slot < 0) free_slot = slot;
      } else if (slots_[slot]->decoding) {
        below = highest;
        highest = slot;
      }
    }
    if (highest < 0 || free_slot < 0 || free_slot > highest) return absl::OkStatus();
    const int64_t after = std::max(below, free_slot);
    if (bucket_for(after + 1) >= bucket_for(highest + 1)) return absl::OkStatus();
    SG_RETURN_IF_ERROR(session_->MoveSlot(highest, free_slot));
    slots_[free_slot] = std::move(slots_[highest]);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.compactions;
  }
}

absl::Status Scheduler::DecodeStep() {
  int64_t highest = -1;
  for (int64_t slot = 0; slot < static_cast<int64_t>(slots_.size()); ++slot) {
    if (slots_[slot] != nullptr && slots_[slot]->decoding) highest = slot;
  }
  if (highest < 0) return absl::OkStatus();
  SG_ASSIGN_OR_RETURN(const std::vector<std::vector<int32_t>> ids, session_->Generate(1));
  int64_t made = 0;
  for (int64_t slot = 0; slot <= highest; ++slot) {
    Active* a = slots_[slot].get();
    if (a == nullptr || !a->decoding) continue;
    if (ids[slot].size() != 1) {
      return absl::InternalError(absl::StrCat("scheduler: slot ", slot, " made no id in a step"));
    }
    const int32_t id = ids[slot][0];
    const std::vector<int32_t>& stop = a->request.stop_ids;
    a->stopped = std::find(stop.begin(), stop.end(), id) != stop.end();
    if (a->stopped) continue;
    a->stream->Push(id);
    ++made;
    ++a->made;
  }
  {
    // The step's counts first: whoever sees a request end sees its ids counted.
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.decode_steps;
    stats_.generated_tokens += made;
    for (int64_t b : session_->buckets()) {
      if (b > highest) {
        stats_.last_bucket = b;
        break;
      }
    }
  }
  for (int64_t slot = 0; slot <= highest; ++slot) {
    const Active* a = slots_[slot].get();
    if (a == nullptr || !a->decoding) continue;
    if (a->stopped) {
      EndRequest(slot, FinishReason::kStop);
    } else if (a->made == a->request.max_tokens) {
      EndRequest(slot, FinishReason::kLength);
    }
  }
  return absl::OkStatus();
}

}  // namespace sg
