// Scheduler: continuous batching over one DecodeSession, for a server. One thread of its
// own owns the session; any other thread submits requests (prompt ids in) and reads each
// request's ids from its GenerationStream as they are made. Between two decode steps the
// scheduler ends what finished or was cancelled (its slot is free for the next step), takes
// waiting requests into free slots (lowest slot first, so that the session's bucket, chosen
// by the highest slot that steps, stays the smallest that holds them) and feeds at most one
// chunk of prompt tokens (SchedulerOptions::prefill_budget): short prompts together in one
// Prefill, a long one a chunk at a time while its slot is held out of the steps
// (DecodeSession::Hold). So a running stream waits at most one chunk between two ids.
//
// Requests beyond the free slots wait in a bounded queue; Submit refuses more
// (ResourceExhausted), so that a server answers 503 instead of stalling. The scheduler knows
// no text: a reader that stops on text (a stop string) or loses its client calls Cancel,
// and the slot is free before the next step.
#ifndef STEPGRAPH_RUNTIME_SCHEDULER_H_
#define STEPGRAPH_RUNTIME_SCHEDULER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stepgraph/runtime/session.h"

namespace sg {

struct GenerationRequest {
  std::vector<int32_t> prompt;  // at least one id, each in the vocabulary
  // Ids to make at most (>= 1); prompt + max_tokens - 1 positions must fit the session's
  // max_seq (the last id made is never fed).
  int64_t max_tokens = 16;
  // The sequence ends at the first of these ids, which is not given to the reader.
  std::vector<int32_t> stop_ids;
  int32_t seed = 0;
  // Empty: the session's sampling (SessionOptions::sampling); see PrefillRequest::sampling.
  std::optional<SlotSampling> sampling;
};

enum class FinishReason : uint8_t {
  kNone,       // still running (or waiting)
  kStop,       // a stop id came
  kLength,     // max_tokens ids were made
  kCancelled,  // the reader cancelled it
  kError,      // the session failed; GenerationStream::status says how
  kAborted,    // the scheduler stopped before it ended
};
absl::string_view FinishReasonName(FinishReason r);  // "stop", "length", ...

// One request's ids, from the scheduler thread to its reader.
class GenerationStream {
 public:
  using Clock = std::chrono::steady_clock;

  // Waits until there are new ids or the request ended, or until `deadline`; appends the
  // new ids to `ids` and returns how the request ended (kNone while it runs).
  FinishReason Wait(std::vector<int32_t>* ids, Clock::time_point deadline);
  // Asks the scheduler to end the request; its slot is free before the next step. Safe
  // from any thread, any number of times; the request ends with kCancelled unless it had
  // ended already.
  void Cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }
  // The error of kError (OK otherwise). Valid once Wait returned kError.
  absl::Status status() const;
  int64_t prompt_tokens() const { return prompt_tokens_; }

  explicit GenerationStream(int64_t prompt_tokens) : prompt_tokens_(prompt_tokens) {}

 private:
  friend class Scheduler;
  void Push(int32_t id);
  void Finish(FinishReason reason, absl::Status status = absl::OkStatus());

  const int64_t prompt_tokens_;
  std::atomic<bool> cancelled_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> ready_;  // made and not yet read
  FinishReason finish_ = FinishReason::kNone;
  absl::Status status_;
};

struct SchedulerOptions {
  // Requests that may wait for a slot; Submit refuses more (ResourceExhausted).
  int64_t max_queue = 64;
  // Prompt tokens fed between two decode steps; 0: the session's prefill_chunk (or 256
  // where prompts go through decode steps).
  int64_t prefill_budget = 0;
};

struct SchedulerStats {
  int64_t queued = 0;     // waiting for a slot
  int64_t active = 0;     // in a slot: prefilling or decoding
  int64_t decoding = 0;   // in the decode steps
  int64_t max_slots = 0;
  int64_t submitted = 0;  // accepted by Submit
  int64_t refused = 0;    // refused by Submit because the queue was full
  int64_t finished[6] = {};  // by FinishReason
  int64_t prompt_tokens = 0;     // of requests taken into a slot
  int64_t generated_tokens = 0;  // ids given to readers
  int64_t decode_steps = 0;
  int64_t prefill_calls = 0;  // Prefill and Append calls (each one chunk at most)
  int64_t last_bucket = 0;    // rows of the last decode step
  int64_t compactions = 0;
};

class Scheduler {
 public:
  // Starts the scheduler's thread over `session`, which it owns from now on (nothing else
  // may use it until the scheduler is destroyed). InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Start(DecodeSession* session,
                                                          const SchedulerOptions& options);
  // Stop(), then joins the thread.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. InvalidArgument for an empty prompt, an id outside the vocabulary or
  // max_tokens < 1; OutOfRange when the prompt and max_tokens do not fit max_seq;
  // ResourceExhausted when max_queue requests wait already; Unavailable once Drain or Stop
  // began. Every message names the field and the limit.
  absl::StatusOr<std::shared_ptr<GenerationStream>> Submit(GenerationRequest request);

  SchedulerStats stats() const;
  const DecodeSession& session() const { return *session_; }

  // Refuses new requests from now on and waits until every request accepted so far ended,
  // or until `deadline`; true when all ended.
  bool Drain(std::chrono::steady_clock::time_point deadline);
  // Ends every request still queued or running (kAborted) and stops the thread.
  void Stop();

 private:
  struct Active;
  Scheduler(DecodeSession* session, const SchedulerOptions& options);
  void Loop();
  // One round: ends, admits, prefills, then one decode step. False when there is nothing
  // to do and the thread should wait.
  bool Round();
  void EndRequest(int64_t slot, FinishReason reason, absl::Status status = absl::OkStatus());
  absl::Status FeedPrompts();
  absl::Status DecodeStep();
  // Moves the highest decoding slot to the lowest free one where that lets the steps run
  // in a smaller bucket.
  absl::Status Compact();
  void FailAll(const absl::Status& status);

  DecodeSession* session_;
  SchedulerOptions options_;
  int64_t budget_ = 0;

  mutable std::mutex mu_;
  std::condition_variable wake_;     // work came, or Stop
  std::condition_variable settled_;  // a request ended (Drain waits on it)
  std::deque<std::unique_ptr<Active>> queue_;
  bool accepting_ = true;
  bool stopping_ = false;
  int64_t in_flight_ = 0;  // accepted and not ended
  SchedulerStats stats_;

  // The scheduler thread's own.
  std::vector<std::unique_ptr<Active>> slots_;
  std::deque<int64_t> prefilling_;  // slots whose prompt is not all fed, in arrival order
  std::thread thread_;
};

}  // namespace sg

#endif  // STEPGRAPH_RUNTIME_SCHEDULER_H_
