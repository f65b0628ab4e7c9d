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
#ifndef STEPGRAPH_RUNTIME_SESSION_H_
#define STEPGRAPH_RUNTIME_SESSION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/graph/passes.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/runtime/step_runner.h"

namespace sg {

class ModelFiles;  // the loaded model folder or GGUF file (internal to the library)

enum class Backend : uint8_t {
  kAuto,  // CUDA when this build has it and a device is found, else the CPU reference
  kCpu,   // the f32 reference (CpuDispatch): slow, always available
  kCuda,  // CudaDispatch, each bucket's step captured as a CUDA graph and replayed
};
absl::string_view BackendName(Backend b);  // "auto", "cpu", "cuda"

struct SessionOptions {
  // The model: a Hugging Face folder (config.json + safetensors) or a GGUF file (see
  // ModelFiles::Open), or, when `model_path` is empty, `config` with weights drawn from
  // `weight_seed` (RandomWeights).
  std::string model_path;
  LlamaConfig config = TinyLlamaConfig();
  uint64_t weight_seed = 0;
  // Threads that fill random weights (0: one per core).
  int weight_threads = 0;
  // Scan a model folder's weights for NaN and infinity before anything runs (DataLoss
  // naming the first bad tensor). Reads every byte once; random weights are always finite.
  bool check_weights = false;

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
  // Prefill: the rows of the longest prefill step (a prompt goes in chunks of this many
  // tokens). Shorter prompts use steps of chunk/4, chunk/16, ... rows (down to 8), alone
  // or several sequences to a step, so a handful of graphs, each captured once, cover
  // every prompt. 0: feed prompts one token per decode step (slow; for comparison).
  int64_t prefill_chunk = 256;
  // Steps whose ids are buffered on the host side before the session waits to drain them
  // (a Generate of more steps than this waits once per this many steps).
  int64_t id_ring_steps = 4096;
  // Graph passes run on the graphs of buckets of at most passes_max_rows rows before they
  // are planned (stepgraph/graph/passes.h); larger buckets run the plain graph. The fused
  // matmul is made for one or two rows: on an H100 (Llama-3.2-1B shape, bf16) a batch of
  // 8 took 2.89 ms per step fused against 1.57 ms plain, a batch of 4 1.73 against 1.55,
  // while a batch of 2 took 1.23 fused against 1.34 plain.
  PassOptions passes = DefaultPassOptions();
  int64_t passes_max_rows = 2;
};

// Time of one node of a profiled step.
struct NodeTime {
  int32_t node = -1;
  std::string name;
  std::string op;
  double ms = 0;
};

// One sequence to start: its slot, its prompt and its sampling seed.
struct PrefillRequest {
  int64_t slot = 0;
  absl::Span<const int32_t> prompt;
  int32_t seed = 0;
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
  // The ids that end a sequence, as the model files state them (ModelFiles::stop_ids);
  // empty for random weights. The session never stops by itself: callers that want text
  // stop at these.
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  int64_t max_slots() const { return buckets_.back(); }
  int64_t max_seq() const { return max_seq_; }
  const std::vector<int64_t>& buckets() const { return buckets_; }
  // Weights and KV cache in bytes.
  int64_t weight_bytes() const { return weight_bytes_; }
  int64_t kv_cache_bytes() const { return kv_cache_bytes_; }
  // The plan of `bucket`; nullptr when it is not one of buckets().
  const ExecutionPlan* plan(int64_t bucket) const;
  // Whether steps run eagerly (the CPU always; CUDA when made with `eager`).
  bool eager() const { return !runner_->replays(); }
  // Where the steps run (for measurements such as the device's copy bandwidth).
  StepRunner& runner() { return *runner_; }

  // Starts a new sequence in `slot` (ending the one it held): writes the KV cache of every
  // prompt token but the last; the last is fed by the next Step, which yields the first
  // new id. With prefill_chunk > 0 the tokens go through prefill steps (many tokens per
  // step, in chunks); with 0 through the decode step, one token per step. `seed` is the
  // slot's sampling seed (with the same seed, prompt and model a slot draws the same ids
  // whichever slot it is in and whoever else is live). InvalidArgument for a slot outside
  // [0, max_slots), an empty prompt, a token id outside [0, vocab_size); OutOfRange for a
  // prompt longer than max_seq.
  absl::Status Prefill(int64_t slot, absl::Span<const int32_t> prompt, int32_t seed = 0);
  // Several sequences at once (distinct slots), packed several to a prefill step where
  // they are short. Everything is checked before anything runs.
  //
  // Prefill and decode do not share a step: a prefill step carries only prompts, and the
  // slots that are decoding keep their state and go on with the next Step. (A mixed step
  // would hold a decode row of one token next to prefill rows of many; it is not offered.)
  absl::Status Prefill(absl::Span<const PrefillRequest> requests);
  // Continues `slot`'s live sequence with `tokens` (a conversation's next turn) and feeds
  // nothing before them again: the KV cache gets the id the next Step would have fed and
  // every appended token but the last, at the positions that follow (in prefill steps as
  // Prefill does); the last is fed by the next Step. The slot keeps its seed, and Tokens
  // keeps the ids produced since the Prefill. FailedPrecondition for a slot that is not
  // live; InvalidArgument for no tokens or an id outside [0, vocab_size); OutOfRange, before
  // anything runs, when the tokens do not fit the slot's KV cache.
  absl::Status Append(int64_t slot, absl::Span<const int32_t> tokens);
  // Prefill steps run since the session was made (each is one replay or eager pass).
  int64_t prefill_steps() const { return prefill_steps_run_; }
  int64_t prefill_chunk() const { return prefill_chunk_; }
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
  // device's error flags (DataLoss naming the step(s) when logits held a NaN or an
  // infinity; OutOfRange saying whether a token id or a position was out of range: the
  // host checks both before feeding them, so this is a bug), and returns the
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
  // Feeds prompts token by token through the decode step (prefill_chunk = 0).
  // `first_pos` is the position of the prompt's first token (0, or where Append goes on).
  absl::Status PrefillByDecodeSteps(const PrefillRequest& request, int64_t first_pos = 0);
  // Runs prefill step `shape` (index in prefill_shapes_) over `seqs`: per sequence group,
  // the request, the first prompt token to feed and how many, and the position of the
  // request's first prompt token.
  struct PrefillPiece {
    const PrefillRequest* request = nullptr;
    int64_t begin = 0;
    int64_t count = 0;
    int64_t first_pos = 0;
  };
  // The single-sequence prefill step (index in prefill_shapes_) with the fewest rows that
  // hold `rows` tokens (at most a chunk).
  size_t PrefillShapeFor(int64_t rows) const;
  absl::Status RunPrefillStep(size_t shape, absl::Span<const PrefillPiece> pieces);
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

  // Host weights the CPU binds in place (a mapped folder or file); the GPU copies them,
  // then drops the mapping.
  std::unique_ptr<ModelFiles> model_;
  std::vector<int32_t> stop_ids_;
  std::unique_ptr<StepRunner> runner_;
  int64_t kv_cache_bytes_ = 0;
  // On the runner's device: the step inputs (ids | pos | seeds of every row) and the
  // prompt being fed. On the host (pinned on CUDA): the staged inputs of a Prefill and of
  // a Step (two areas, each rewritten only after the device read it), the prompt staged,
  // and the ring of recorded ids.
  int32_t* inputs_ = nullptr;
  int32_t* prompt_ = nullptr;
  int32_t* staging_ = nullptr;
  int32_t* ring_ = nullptr;
  std::vector<TensorArg> next_, logits_;  // per bucket

  // Prefill steps: (sequences B, rows per sequence T), runner step index after the decode
  // buckets. Their inputs (ids | pos | seq_slots) live in their own device block, staged
  // from a host ring of kPrefillStaging areas (the session waits for the device when it
  // wraps).
  struct PrefillShape {
    int64_t seqs = 1;
    int64_t rows_per_seq = 1;
    int step = -1;
  };
  std::vector<PrefillShape> prefill_shapes_;
  int64_t prefill_chunk_ = 0;
  int32_t* prefill_inputs_ = nullptr;
  int32_t* prefill_staging_ = nullptr;
  int64_t prefill_staged_ = 0;  // areas of the ring used since the last wait
  int64_t prefill_steps_run_ = 0;

  std::vector<Slot> slots_;
  // The live set changed since the step inputs were last written.
  bool inputs_dirty_ = true;
  // Steps recorded in the id ring and not drained; the live set is the same for all of
  // them, since every change of it drains first.
  int64_t pending_steps_ = 0;
  // Steps run by Step and Generate since the session began, and how many of them the last
  // check of the error flags covered: a raised flag is reported with the steps it may
  // come from.
  int64_t steps_run_ = 0;
  int64_t steps_checked_ = 0;
  // Bucket index of the last step; -1 when a Prefill ran since (its logits are gone).
  int64_t last_bucket_ = -1;
};

}  // namespace sg

#endif  // STEPGRAPH_RUNTIME_SESSION_H_
