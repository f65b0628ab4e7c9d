// DecodeSession: a Llama model decoding several sequences at once, end to end. It builds
// the decode-step graphs (one per batch bucket) and hands them to a StepRunner, which owns
// where they run (the CPU reference, or the GPU where every bucket's step is captured once
// as a CUDA graph and replayed) and the memory of the weights (mapped from a model folder
// or drawn at random from a seed), the KV cache and the step inputs. The session itself
// keeps the slots' bookkeeping and knows nothing of CUDA.
//
// Slots. The session holds `max_slots` sequences; slot i is row i of every step and KV
// cache slot i. A step runs the smallest bucket that covers the highest live slot; rows
// that are not live carry pos = -1 (padding: no KV write, zero attention, no advance).
//
// The closed loop. Each step ends by copying its chosen ids into its own "ids" input and
// advancing "pos", so consecutive steps need nothing from the host: on the GPU a Step is
// one graph replay plus one asynchronous copy of the new ids into pinned host memory. The
// host writes the step inputs only after the live set changed (Prefill, Release), and
// waits for the device only where the caller asks for ids (Generate, Tokens, Logits).
#ifndef STEPGRAPH_MODELS_SESSION_H_
#define STEPGRAPH_MODELS_SESSION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "models/llama.h"
#include "models/random_weights.h"
#include "models/safetensors.h"
#include "stepgraph/plan.h"
#include "stepgraph/step_runner.h"

namespace sg {

enum class Backend : uint8_t {
  kAuto,  // CUDA when this build has it and a device is found, else the CPU reference
  kCpu,   // the f32 reference (CpuDispatch): slow, always available
  kCuda,  // CudaDispatch, each bucket's step captured as a CUDA graph and replayed
};
absl::string_view BackendName(Backend b);  // "auto", "cpu", "cuda"

struct SessionOptions {
  // The model: a Hugging Face folder (config.json + safetensors, see ModelWeights::Open),
  // or, when `model_dir` is empty, `config` with weights drawn from `weight_seed`
  // (RandomWeights).
  std::string model_dir;
  LlamaConfig config = TinyLlamaConfig();
  uint64_t weight_seed = 0;
  // Threads that fill random weights (0: one per core).
  int weight_threads = 0;

  Backend backend = Backend::kAuto;
  // CUDA: run every step eagerly (one launch per node) instead of replaying captured
  // graphs. The CPU backend is always eager.
  bool eager = false;
  // The CUDA dispatcher's switches, and the CPU reference's threads (0: one per core).
  CudaOptions cuda;
  int cpu_threads = 0;

  // Sequences decoded together (KV cache slots).
  int64_t max_slots = 1;
  // KV cache length per slot: the most positions (prompt + generated) a sequence may use.
  // 0: min(max_position_embeddings, 4096).
  int64_t max_seq = 0;
  // Greedy (argmax) when empty; otherwise sampled, with a per-slot seed (see Prefill).
  std::optional<ops::Sample> sampling;
  // Batch buckets: one graph each. Buckets at or above max_slots are replaced by max_slots.
  std::vector<int64_t> buckets = {1, 2, 4, 8, 16, 32};
  // Steps whose ids are buffered on the host side before the session waits to drain them
  // (a Generate of more steps than this waits once per this many steps).
  int64_t id_ring_steps = 4096;
};

// Time of one node of a profiled step.
struct NodeTime {
  int32_t node = -1;
  std::string name;
  std::string op;
  double ms = 0;
};

class DecodeSession {
 public:
  // Loads or draws the weights, builds and plans every bucket's graph, allocates the KV
  // cache and the step buffers on the runner's device and, on CUDA, captures every
  // bucket's step. Errors name what was wrong: InvalidArgument for options, NotFound for a
  // missing model folder, FailedPrecondition for backend = kCuda where CUDA cannot run,
  // ResourceExhausted (with the bytes needed and free) for a KV cache that does not fit.
  static absl::StatusOr<std::unique_ptr<DecodeSession>> Create(const SessionOptions& options);
  ~DecodeSession();
  DecodeSession(const DecodeSession&) = delete;
  DecodeSession& operator=(const DecodeSession&) = delete;

  // The backend that runs (never kAuto), and a line describing it.
  Backend backend() const { return backend_; }
  std::string Describe() const;
  const LlamaConfig& config() const { return config_; }
  int64_t max_slots() const { return buckets_.back(); }
  int64_t max_seq() const { return max_seq_; }
  const std::vector<int64_t>& buckets() const { return buckets_; }
  // Weights and KV cache in bytes.
  int64_t weight_bytes() const { return weight_bytes_; }
  int64_t kv_cache_bytes() const { return kv_layout_.total_bytes; }
  // The plan of `bucket`; nullptr when it is not one of buckets().
  const ExecutionPlan* plan(int64_t bucket) const;
  // Whether steps run eagerly (the CPU always; CUDA when made with `eager`).
  bool eager() const { return !runner_->replays(); }
  // Where the steps run (for measurements such as the device's copy bandwidth).
  StepRunner& runner() { return *runner_; }

  // Starts a new sequence in `slot` (ending the one it held): feeds every prompt token but
  // the last through the decode graph, one step per token, with the other rows padded. The
  // last prompt token is fed by the next Step, which yields the first new id. `seed` is the
  // slot's sampling seed (with the same seed, prompt and model a slot draws the same ids
  // whichever slot it is in and whoever else is live). InvalidArgument for a slot outside
  // [0, max_slots), an empty prompt, a token id outside [0, vocab_size); OutOfRange for a
  // prompt longer than max_seq.
  absl::Status Prefill(int64_t slot, absl::Span<const int32_t> prompt, int32_t seed = 0);
  // Ends `slot`'s sequence: its row is padding from the next step on.
  absl::Status Release(int64_t slot);
  bool live(int64_t slot) const;
  // The position the slot's next fed token takes (prompt length - 1 after Prefill, + 1 per
  // step); -1 when the slot is not live.
  int64_t position(int64_t slot) const;

  // One decode step of every live slot. Enqueues only: its ids are read by Tokens or
  // Generate. FailedPrecondition when no slot is live; OutOfRange, before anything runs,
  // when a live slot's KV cache is full.
  absl::Status Step();

  // `n` steps; every live slot advances. Waits for the device once at the end, checks the
  // device's error flags (OutOfRange saying whether a token id or a position was out of
  // range: the host checks both before feeding them, so this is a bug), and returns the
  // `n` new ids of every slot (empty for slots not live). OutOfRange, before anything
  // runs, when a live slot has fewer than `n` free positions.
  absl::StatusOr<std::vector<std::vector<int32_t>>> Generate(int64_t n);
  // The same, returning only `slot`'s ids (the slot must be live).
  absl::StatusOr<std::vector<int32_t>> Generate(int64_t slot, int64_t n);

  // Every id `slot` produced since its Prefill (waits for the device).
  absl::StatusOr<std::vector<int32_t>> Tokens(int64_t slot);

  // The logits of `slot`'s row in the last step, as f32 (waits for the device).
  // FailedPrecondition when the slot was not live in the last step.
  absl::StatusOr<std::vector<float>> Logits(int64_t slot);

  // `n` steps (as Step) with the time of each, in ms: CUDA events between steps on the
  // GPU (no wait between steps), the host clock on the CPU.
  absl::StatusOr<std::vector<double>> TimedSteps(int64_t n);

  // One step (as Step, and it advances like one) run eagerly with each node timed. On the
  // GPU the launches are queued behind a gate and released together, so each time is the
  // node's device time, not the host's launch overhead.
  absl::StatusOr<std::vector<NodeTime>> ProfileStep();

 private:
  struct Slot {
    bool live = false;
    int32_t pos = -1;     // position of `pending`
    int32_t pending = 0;  // the id the next step feeds (known to the host after a drain)
    int32_t seed = 0;
    std::vector<int32_t> tokens;  // drained ids since Prefill
  };

  DecodeSession() = default;

  absl::Status Init(const SessionOptions& options);
  absl::Status SetUpWeights(const Graph& largest, StepRunner::Binder* bind_weights);
  absl::Status CheckSlot(int64_t slot, absl::string_view what) const;
  absl::Status CheckCapacity(int64_t steps) const;
  // One step; `node_ms` set: eager with per-node times.
  absl::Status StepImpl(std::vector<double>* node_ms);
  // Moves the ids of the recorded steps into the slots' histories (waits for the device).
  absl::Status Drain();
  absl::Status CheckErrorFlags();
  // Index in buckets_ of the smallest bucket with at least `rows` rows.
  int64_t BucketFor(int64_t rows) const;
  int64_t HighestLiveSlot() const;

  Backend backend_ = Backend::kCpu;
  LlamaConfig config_;
  std::vector<int64_t> buckets_;
  int64_t max_seq_ = 0;
  int64_t ring_steps_ = 0;
  int64_t weight_bytes_ = 0;
  uint64_t weight_seed_ = 0;
  int weight_threads_ = 0;

  // Host weights the CPU binds in place (a mapped folder); the GPU copies them.
  std::optional<ModelWeights> mapped_;
  std::unique_ptr<StepRunner> runner_;
  BufferLayout kv_layout_;
  // On the runner's device: the step inputs (ids | pos | seeds of every row) and the
  // prompt being fed. On the host (pinned on CUDA): the staged inputs of a Prefill and of
  // a Step (two areas, each rewritten only after the device read it), the prompt staged,
  // and the ring of recorded ids.
  int32_t* inputs_ = nullptr;
  int32_t* prompt_ = nullptr;
  int32_t* staging_ = nullptr;
  int32_t* ring_ = nullptr;
  std::vector<TensorArg> next_, logits_;  // per bucket

  std::vector<Slot> slots_;
  // The live set changed since the step inputs were last written.
  bool inputs_dirty_ = true;
  // Steps recorded in the id ring and not drained; the live set is the same for all of
  // them, since every change of it drains first.
  int64_t pending_steps_ = 0;
  // Bucket index of the last step; -1 when a Prefill ran since (its logits are gone).
  int64_t last_bucket_ = -1;
};

}  // namespace sg

#endif  // STEPGRAPH_MODELS_SESSION_H_
