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
#include <utility>
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
  // Decode steps apply each slot's Penalties (PrefillRequest::sampling) on the device and
  // count the ids each slot chooses (ops::Penalize and ops::CountIds between the logits and
  // the choice). Costs per step a pass over the logits and the counts ([slots, vocab] i32
  // on the device), and on the GPU the lm head's fused argmax. Without it a Prefill asking
  // for penalties other than neutral is FailedPrecondition.
  bool penalties = false;
  // Batch buckets: one graph each. Buckets at or above max_slots are replaced by max_slots.
  std::vector<int64_t> buckets = {1, 2, 4, 8, 16, 32};
  // Prefill: the rows of the longest prefill step (a prompt goes in chunks of this many
  // tokens). Shorter prompts use steps of chunk/2, chunk/4, ... rows (down to 8), alone
  // or several sequences to a step, so a handful of graphs, each captured once, cover
  // every prompt. 0: feed prompts one token per decode step (slow; for comparison).
  // 2,048 by default: each step reads every weight once (and dequantizes a GGUF file's
  // block matrices once), so longer steps amortise that: on an H200 (2026-12-02) the 1B
  // Q4_0 shape's prompt of 2,048 tokens took 17.6 ms in one step against 29.5 in steps of
  // 512, and 512 tokens the same 6.7 ms either way (docs/prefill.md).
  int64_t prefill_chunk = 2048;
  // A rest shorter than a chunk goes in the step that covers it when that pads it by at
  // most this many rows; otherwise the longest step it fills goes first and the rest
  // follows likewise (a 1,100-token prompt: steps of 1,024 and 128 rows rather than one of
  // 2,048). A padding row costs a row's products; a step costs a pass over the weights,
  // about as much as 256 to 500 rows of the 1B shape's (H200).
  int64_t prefill_max_pad_rows = 256;
  // Steps whose ids are buffered on the host side before the session waits to drain them
  // (a Generate of more steps than this waits once per this many steps).
  int64_t id_ring_steps = 4096;
  // CUDA, captured steps, one rank: Generate runs up to this many steps per launch as a
  // loop on the device (a conditional WHILE node around each bucket's captured step, the
  // ids copied into a ring on the device and read once per launch), when no live slot
  // chooses its ids on the host. 0 (the default): one graph launch per step. At most
  // id_ring_steps.
  int64_t device_loop_steps = 0;
  // Graph passes run on the graphs of buckets of at most passes_max_rows rows before they
  // are planned (stepgraph/graph/passes.h); larger buckets run the plain graph. The fused
  // matmul is made for one or two rows: on an H100 (Llama-3.2-1B shape, bf16) a batch of
  // 8 took 2.89 ms per step fused against 1.57 ms plain, a batch of 4 1.73 against 1.55,
  // while a batch of 2 took 1.23 fused against 1.34 plain.
  PassOptions passes = DefaultPassOptions();
  int64_t passes_max_rows = 2;
  // On CUDA, for a model whose matrices are in GGUF block formats, the passes run on
  // buckets of up to this many rows instead (when it is larger and
  // CudaOptions::block_mma_min_rows is not 0): from block_mma_min_rows rows the fused
  // matmul multiplies block weights on tensor cores, and the fused step holds about half
  // the launches of the plain one (H200, Q4_K_M mix of the 1B shape, f32 activations,
  // batch 16: 2.39 ms fused against 2.70 ms plain, both on tensor cores).
  int64_t passes_max_rows_block_formats = 64;
  // Tensor parallel (docs/parallel.md): the model sharded over this many ranks (GPUs
  // 0 .. N-1 on CUDA, threads on the CPU reference), each holding its share of every
  // layer's weights and of the KV cache; every call runs on every rank at once and answers
  // with rank 0's result. InvalidArgument naming the field when the model's heads do not
  // divide (LlamaShardPlan). Random weights are then drawn per rank (seed + rank), not the
  // whole model's values.
  int tensor_parallel = 1;
};

// Time of one node of a profiled step.
struct NodeTime {
  int32_t node = -1;
  std::string name;
  std::string op;
  double ms = 0;
};

// What a slot does to its logits before it chooses (ops::Penalize, on the device, in the
// decode step; SessionOptions::penalties). The prompt is what Prefill and Append fed; the
// generated ids are those chosen since the last Prefill or Append.
struct Penalties {
  // transformers' repetition_penalty over the prompt's and the generated ids: a logit l
  // becomes l / r where positive, l · r otherwise. > 0; 1: off.
  float repetition = 1.0f;
  // OpenAI's presence_penalty and frequency_penalty over the generated ids: l - (presence +
  // frequency · times generated). Finite, in [-kMaxPenalty, kMaxPenalty]; 0: off.
  float presence = 0.0f;
  float frequency = 0.0f;
  // Ids whose probability (after temperature) is below min_p times the top one's are never
  // chosen, as llama.cpp's and transformers' min-p. In [0, 1]; 0: off. Greedy slots
  // ignore it (the top id always passes).
  float min_p = 0.0f;
  // (id, bias) added to the id's logit, OpenAI's logit_bias: at most ops::kMaxLogitBias,
  // ids in [0, vocab_size), biases finite in [-kMaxBias, kMaxBias], an id at most once.
  std::vector<std::pair<int32_t, float>> logit_bias;

  static constexpr float kMaxPenalty = 2.0f;  // OpenAI's range
  static constexpr float kMaxBias = 100.0f;   // OpenAI's range
  // Whether nothing changes the logits.
  bool neutral() const {
    return repetition == 1.0f && presence == 0.0f && frequency == 0.0f && min_p == 0.0f &&
           logit_bias.empty();
  }
};
// InvalidArgument naming the field and the bound where `p` is out of range for a model of
// `vocab_size` ids.
absl::Status CheckPenalties(const Penalties& p, int64_t vocab_size);

// How one slot chooses its ids: greedy (Argmax) when `sample` is empty, otherwise drawn as
// ops::Sample does with these parameters and the slot's seed, in both cases from the logits
// after `penalties`.
struct SlotSampling {
  std::optional<ops::Sample> sample;
  Penalties penalties;
};

// One sequence to start: its slot, its prompt and its sampling seed.
struct PrefillRequest {
  int64_t slot = 0;
  absl::Span<const int32_t> prompt;
  int32_t seed = 0;
  // The slot's own way of choosing ids; empty: the steps' (SessionOptions::sampling).
  // Where its `sample` differs from the steps', the host chooses the slot's id after each
  // step from its logits (after the penalties), exactly as the CPU reference's Argmax or
  // Sample does, and writes it into the next step's input: such a step waits for the
  // device, and a draw sorts the vocabulary on the host. A server pays that only for
  // requests that ask for their own. Penalties always run on the device.
  std::optional<SlotSampling> sampling;
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
  Backend backend() const;
  std::string Describe() const;
  const LlamaConfig& config() const;
  // The ids that end a sequence, as the model files state them (ModelFiles::stop_ids);
  // empty for random weights. The session never stops by itself: callers that want text
  // stop at these.
  const std::vector<int32_t>& stop_ids() const;
  int64_t max_slots() const;
  int64_t max_seq() const;
  const std::vector<int64_t>& buckets() const;
  // Weights and KV cache in bytes.
  int64_t weight_bytes() const;
  int64_t kv_cache_bytes() const;
  // The plan of `bucket`; nullptr when it is not one of buckets().
  const ExecutionPlan* plan(int64_t bucket) const;
  // Whether steps run eagerly (the CPU always; CUDA when made with `eager`).
  bool eager() const;
  // Where the steps run (for measurements such as the device's copy bandwidth,
  // stepgraph/runtime/measure.h).
  StepRunner& runner();

  // Starts a new sequence in `slot` (ending the one it held): writes the KV cache of every
  // prompt token but the last; the last is fed by the next Step, which yields the first
  // new id. With prefill_chunk > 0 the tokens go through prefill steps (many tokens per
  // step, in chunks); with 0 through the decode step, one token per step. `seed` is the
  // slot's sampling seed (with the same seed, prompt and model a slot draws the same ids
  // whichever slot it is in and whoever else is live). InvalidArgument for a slot outside
  // [0, max_slots), an empty prompt, a token id outside [0, vocab_size); OutOfRange for a
  // prompt longer than max_seq; for penalties out of range (CheckPenalties);
  // FailedPrecondition for penalties other than neutral in a session made without
  // SessionOptions::penalties.
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
  // Prefill does); the last is fed by the next Step. The slot keeps its seed, its sampling
  // and its penalties, and Tokens keeps the ids produced since the Prefill. For the
  // penalties the sequence so far becomes the prompt: a next turn is penalised as a
  // request whose prompt is the whole conversation would be. FailedPrecondition for a slot that is not
  // live; InvalidArgument for no tokens or an id outside [0, vocab_size); OutOfRange, before
  // anything runs, when the tokens do not fit the slot's KV cache.
  absl::Status Append(int64_t slot, absl::Span<const int32_t> tokens);
  // Prefill steps run since the session was made (each is one replay or eager pass).
  int64_t prefill_steps() const;
  int64_t prefill_chunk() const;
  // Ends `slot`'s sequence: its row is padding from the next step on.
  absl::Status Release(int64_t slot);
  bool live(int64_t slot) const;
  // Keeps live `slot` out of decode steps until Resume: its row is padding (no KV write,
  // no new id, no advance) and does not count for the bucket, while Append still feeds it.
  // A server prefills a long prompt so, a chunk at a time between the other slots' steps:
  // Prefill of the first chunk, Hold, Append of each later chunk, Resume. Prefill and
  // Release end the hold. FailedPrecondition for a slot that is not live.
  absl::Status Hold(int64_t slot);
  absl::Status Resume(int64_t slot);
  bool held(int64_t slot) const;
  // Moves live slot `from`'s sequence (its KV cache, position, seed, sampling, ids and
  // hold) into slot `to`, which must not be live; `from` is free afterwards. What it
  // draws does not change (Sample's draws depend on the seed and the position, not the
  // slot). A server moves its highest slot down when the others left, so that the steps
  // run in a smaller bucket. Costs a copy of the positions the sequence holds.
  // InvalidArgument for slots out of range or equal; FailedPrecondition unless `from` is
  // live and `to` is not.
  absl::Status MoveSlot(int64_t from, int64_t to);
  // The position the slot's next fed token takes (prompt length - 1 after Prefill, + 1 per
  // step); -1 when the slot is not live.
  int64_t position(int64_t slot) const;

  // One decode step of every live slot (held ones aside). Enqueues only: its ids are read
  // by Tokens or Generate (a slot with its own sampling waits for the device, see
  // PrefillRequest::sampling). FailedPrecondition when no slot is live; OutOfRange, before
  // anything runs, when a live slot's KV cache is full.
  absl::Status Step();

  // `n` steps; every live slot advances. Waits for the device once at the end, checks the
  // device's error flags (DataLoss naming the step(s) when logits held a NaN or an
  // infinity; OutOfRange saying whether a token id or a position was out of range: the
  // host checks both before feeding them, so this is a bug), and returns the
  // `n` new ids of every slot (empty for slots not live). OutOfRange, before anything
  // runs, when a live slot has fewer than `n` free positions.
  absl::StatusOr<std::vector<std::vector<int32_t>>> Generate(int64_t n);
  // Up to `n` steps, fewer when after a step every slot that steps has produced one of
  // `stop_ids` (at most StepRunner::kMaxLoopStopIds) in this call: each slot's ids of the steps run, the stop id
  // and what the steps after it made included (the caller cuts). On the device loop
  // (SessionOptions::device_loop_steps) the device decides; otherwise the host, waiting
  // for the device after every step.
  absl::StatusOr<std::vector<std::vector<int32_t>>> Generate(int64_t n,
                                                             absl::Span<const int32_t> stop_ids);
  // The same as Generate(n), returning only `slot`'s ids (the slot must be live).
  absl::StatusOr<std::vector<int32_t>> Generate(int64_t slot, int64_t n);

  // Every id `slot` produced since its Prefill (waits for the device).
  absl::StatusOr<std::vector<int32_t>> Tokens(int64_t slot);

  // The logits of `slot`'s row in the last step, as f32 (waits for the device), as the
  // model made them (before the slot's penalties). FailedPrecondition when the slot was not
  // live in the last step.
  absl::StatusOr<std::vector<float>> Logits(int64_t slot);

  // `n` steps (as Step) with the time of each, in ms: CUDA events between steps on the
  // GPU (no wait between steps), the host clock on the CPU.
  absl::StatusOr<std::vector<double>> TimedSteps(int64_t n);

  // One step (as Step, and it advances like one) run eagerly with each node timed. On the
  // GPU the launches are queued behind a gate and released together, so each time is the
  // node's device time, not the host's launch overhead.
  absl::StatusOr<std::vector<NodeTime>> ProfileStep();

  // Prefill (as Prefill(slot, prompt, seed)) with every prefill step run eagerly and each
  // node timed (as ProfileStep): per node of the prefill steps' graphs, by name in the
  // order of first appearance, its time summed over the steps the prompt took, in ms.
  // Empty when the prompt takes no prefill step (prefill_chunk 0, or one token).
  absl::StatusOr<std::vector<NodeTime>> ProfilePrefill(int64_t slot,
                                                       absl::Span<const int32_t> prompt,
                                                       int32_t seed = 0);

 private:
  // The slots, the runner and the buffers on its device (runtime/session.cc).
  class Impl;
  // The ranks beyond the first of a tensor-parallel session: their Impls, the group they
  // meet through and their threads (runtime/session.cc). Null with one rank.
  struct Ranks;
  DecodeSession(std::unique_ptr<Impl> impl, std::unique_ptr<Ranks> ranks);

  // f(impl) on every rank at once (rank 0's own when there is one): rank 0's result, or
  // the first failure.
  template <typename F>
  auto OnEveryRank(F f) -> decltype(f(std::declval<Impl&>()));

  // Declared first, destroyed last: rank 0's runner meets the others through its group.
  std::unique_ptr<Ranks> ranks_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sg

#endif  // STEPGRAPH_RUNTIME_SESSION_H_
