// DecodeSession: its making (Impl::Init, one named step after another) and its slot
// bookkeeping. The session keeps, per slot, the position of the id the next step feeds;
// the ids themselves travel on the device in the closed loop and reach the host through
// the id ring, which is drained only where the caller asks for ids or the live set
// changes. Where the steps run is the StepRunner's business.
#include "stepgraph/runtime/session.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/model_files.h"
#include "models/random_weights.h"
#include "runtime/rank_threads.h"
#include "runtime/runner_device.h"
#include "runtime/sharded_weights.h"
#include "stepgraph/capture/capture_policy.h"
#include "stepgraph/dispatch/collectives.h"
#include "stepgraph/graph/shard.h"
#include "stepgraph/dispatch/cpu_dispatch.h"
#include "stepgraph/runtime/measure.h"
#include "stepgraph/base/error_flags.h"
#include "stepgraph/base/half.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace {

// The step inputs of every bucket live in one block of i32: ids | pos | seeds, each `rows`
// (the largest bucket) long at a 256-byte-aligned offset; a bucket binds prefixes.
struct InputBlock {
  int64_t rows = 0;
  int64_t stride = 0;  // i32 elements from one array to the next
  explicit InputBlock(int64_t r) : rows(r), stride((r + 63) / 64 * 64) {}
  int64_t ints() const { return 3 * stride; }
  int64_t bytes() const { return ints() * static_cast<int64_t>(sizeof(int32_t)); }
  int64_t ids() const { return 0; }
  int64_t pos() const { return stride; }
  int64_t seeds() const { return 2 * stride; }

  // Every row padding (pos -1, id 0, seed 0).
  void Clear(int32_t* base) const {
    std::fill_n(base, ints(), 0);
    std::fill_n(base + pos(), rows, -1);
  }
};

// Binds "ids", "pos" and (when the graph samples) "seeds" of `graph` to prefixes of the
// block at `base`.
absl::Status BindInputBlock(const Graph& graph, const InputBlock& block, int32_t* base,
                            Bindings& bindings) {
  const int64_t bytes = block.rows * static_cast<int64_t>(sizeof(int32_t));
  SG_RETURN_IF_ERROR(bindings.Bind(kIdsInput, base + block.ids(), bytes));
  SG_RETURN_IF_ERROR(bindings.Bind(kPosInput, base + block.pos(), bytes));
  if (graph.FindTensor(kSeedsInput).ok()) {
    SG_RETURN_IF_ERROR(bindings.Bind(kSeedsInput, base + block.seeds(), bytes));
  }
  return absl::OkStatus();
}

// Binds a prefill step's "ids" and "pos" (rows long) and "seq_slots" (seqs long) to the
// prefill block at `base` (its third array holds the sequences' slots).
absl::Status BindPrefillBlock(const InputBlock& block, int32_t* base, int64_t rows, int64_t seqs,
                              Bindings& bindings) {
  SG_RETURN_IF_ERROR(bindings.Bind(kIdsInput, base + block.ids(), rows * 4));
  SG_RETURN_IF_ERROR(bindings.Bind(kPosInput, base + block.pos(), rows * 4));
  return bindings.Bind(kSeqSlotsInput, base + block.seeds(), seqs * 4);
}

// Host staging areas of prefill inputs in flight before the session waits for the device.
constexpr int64_t kPrefillStaging = 64;
// The smallest prefill step has at least this many rows per sequence.
constexpr int64_t kMinPrefillRows = 8;
// prefill_chunk is at most this (rows of one step).
constexpr int64_t kMaxPrefillChunk = 16384;

std::vector<float> ToFloats(const void* data, DType dtype, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = LoadElement(data, dtype, i);
  return out;
}

absl::Status CheckSampling(const ops::Sample& s) {
  if (!(s.temperature > 0.0f) || !std::isfinite(s.temperature)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session: sampling temperature must be > 0 (use greedy decoding for 0), got ",
        s.temperature));
  }
  if (s.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("session: sampling top_k must be >= 0 (0: no limit), got ", s.top_k));
  }
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("session: sampling top_p must be in (0, 1], got ", s.top_p));
  }
  return absl::OkStatus();
}

// Whether two ways of choosing ids are the same (both greedy, or the same parameters).
bool SameSampling(const std::optional<ops::Sample>& a, const std::optional<ops::Sample>& b) {
  if (!a.has_value() || !b.has_value()) return a.has_value() == b.has_value();
  return a->temperature == b->temperature && a->top_k == b->top_k && a->top_p == b->top_p;
}

// The row of ops::Penalize's parameters for `p`, choosing as `sample` does (greedy when
// empty: min-p cannot change the top id, so it is off).
void FillPenaltyRow(const Penalties& p, const std::optional<ops::Sample>& sample, float* row) {
  std::fill_n(row, ops::kPenaltyParams, 0.0f);
  row[ops::kPenaltyRepetition] = p.repetition;
  row[ops::kPenaltyPresence] = p.presence;
  row[ops::kPenaltyFrequency] = p.frequency;
  row[ops::kPenaltyMinPMargin] = p.min_p > 0.0f && sample.has_value()
                                     ? sample->temperature * std::log(p.min_p)
                                     : -std::numeric_limits<float>::infinity();
  row[ops::kPenaltyBiasCount] = static_cast<float>(p.logit_bias.size());
  for (size_t j = 0; j < p.logit_bias.size(); ++j) {
    row[ops::kPenaltyBiasFirst + 2 * j] = static_cast<float>(p.logit_bias[j].first);
    row[ops::kPenaltyBiasFirst + 2 * j + 1] = p.logit_bias[j].second;
  }
}

}  // namespace

absl::Status CheckPenalties(const Penalties& p, int64_t vocab_size) {
  if (!(p.repetition > 0.0f) || !std::isfinite(p.repetition)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "penalties: repetition must be finite and > 0 (1: off), got ", p.repetition));
  }
  const float kMax = Penalties::kMaxPenalty;
  if (!(p.presence >= -kMax && p.presence <= kMax)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "penalties: presence must be in [", -kMax, ", ", kMax, "] (0: off), got ", p.presence));
  }
  if (!(p.frequency >= -kMax && p.frequency <= kMax)) {
    return absl::InvalidArgumentError(absl::StrCat("penalties: frequency must be in [", -kMax,
                                                   ", ", kMax, "] (0: off), got ", p.frequency));
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("penalties: min_p must be in [0, 1] (0: off), got ", p.min_p));
  }
  if (p.logit_bias.size() > static_cast<size_t>(ops::kMaxLogitBias)) {
    return absl::InvalidArgumentError(absl::StrCat("penalties: at most ", ops::kMaxLogitBias,
                                                   " logit biases, got ", p.logit_bias.size()));
  }
  // Ids travel as floats: exact below 2^24.
  const int64_t ids = std::min<int64_t>(vocab_size, int64_t{1} << 24);
  for (size_t j = 0; j < p.logit_bias.size(); ++j) {
    const auto [id, bias] = p.logit_bias[j];
    if (id < 0 || id >= ids) {
      return absl::InvalidArgumentError(absl::StrCat("penalties: logit bias ", j, " is for id ",
                                                     id, ", outside the vocabulary [0, ", ids,
                                                     ")"));
    }
    if (!(bias >= -Penalties::kMaxBias && bias <= Penalties::kMaxBias)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "penalties: logit bias ", j, " (id ", id, ") must be in [", -Penalties::kMaxBias,
          ", ", Penalties::kMaxBias, "], got ", bias));
    }
    for (size_t k = 0; k < j; ++k) {
      if (p.logit_bias[k].first == id) {
        return absl::InvalidArgumentError(
            absl::StrCat("penalties: id ", id, " has two logit biases (", k, " and ", j, ")"));
      }
    }
  }
  return absl::OkStatus();
}

// Everything a session holds: the slots' bookkeeping, the runner and the buffers on its
// device. DecodeSession forwards to it.
class DecodeSession::Impl {
 public:
  // Loads the model, builds and plans every step and makes the buffers; see the steps
  // below, in the order Init takes them.
  // Rank `rank` of a group of `options.tensor_parallel` ranks meeting through `group`
  // (null for one rank).
  absl::Status Init(const SessionOptions& options, int rank = 0,
                    CollectiveGroup* group = nullptr);

  Backend backend() const { return backend_; }
  std::string Describe() const;
  const LlamaConfig& config() const { return config_; }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  int64_t max_slots() const { return buckets_.back(); }
  int64_t max_seq() const { return max_seq_; }
  const std::vector<int64_t>& buckets() const { return buckets_; }
  int64_t weight_bytes() const { return weight_bytes_; }
  int64_t kv_cache_bytes() const { return kv_cache_bytes_; }
  const ExecutionPlan* plan(int64_t bucket) const;
  bool eager() const { return !runner_->replays(); }
  StepRunner& runner() { return *runner_; }

  absl::Status Prefill(absl::Span<const PrefillRequest> requests);
  absl::Status Append(int64_t slot, absl::Span<const int32_t> tokens);
  int64_t prefill_steps() const { return prefill_steps_run_; }
  int64_t prefill_chunk() const { return prefill_chunk_; }
  absl::Status Release(int64_t slot);
  bool live(int64_t slot) const;
  absl::Status Hold(int64_t slot, bool held);
  absl::Status MoveSlot(int64_t from, int64_t to);
  bool held(int64_t slot) const { return live(slot) && slots_[slot].held; }
  int64_t position(int64_t slot) const;
  // One step; `node_ms` set: eager with per-node times.
  absl::Status Step(std::vector<double>* node_ms);
  absl::StatusOr<std::vector<std::vector<int32_t>>> Generate(int64_t n,
                                                             absl::Span<const int32_t> stop_ids);
  absl::StatusOr<std::vector<int32_t>> Generate(int64_t slot, int64_t n);
  // The live slots' inputs copied to the device when the live set changed (Step and the
  // device loop).
  absl::Status WriteInputsIfDirty();
  // Whether Generate runs on the device loop now (enabled, no slot picking on the host).
  bool DeviceLoopRuns() const;
  // Up to `n` steps on the device loop, `stopped` (per slot) kept across launches.
  absl::Status GenerateOnDevice(int64_t n, absl::Span<const int32_t> stop_ids,
                                std::vector<bool>& stopped);
  // Marks in `stopped` the stepping slots whose last `steps` drained ids hold one of
  // `stop_ids`; whether every stepping slot is marked.
  bool MarkStopped(int64_t steps, absl::Span<const int32_t> stop_ids,
                   std::vector<bool>& stopped) const;
  absl::StatusOr<std::vector<int32_t>> Tokens(int64_t slot);
  absl::StatusOr<std::vector<float>> Logits(int64_t slot);
  absl::StatusOr<std::vector<double>> TimedSteps(int64_t n);
  absl::StatusOr<std::vector<NodeTime>> ProfileStep();
  absl::StatusOr<std::vector<NodeTime>> ProfilePrefill(const PrefillRequest& request);

 private:
  struct Slot {
    bool live = false;
    int32_t pos = -1;     // position of `pending`
    int32_t pending = 0;  // the id the next step feeds (known to the host after a drain)
    int32_t seed = 0;
    std::vector<int32_t> tokens;  // drained ids since Prefill
    bool held = false;            // out of decode steps (Hold)
    // The slot chooses its ids on the host (its own sampling differs from the steps').
    bool host_pick = false;
    std::optional<ops::Sample> sample;  // how, when host_pick: greedy when empty
    Penalties penalties;
    // With penalties: the ids fed since Prefill (the prompt and every Append), which the
    // counts mark as the prompt's.
    std::vector<int32_t> context;
    size_t tokens_in_context = 0;  // of `tokens`, those already in `context`
  };
  // Whether the slot takes part in decode steps.
  static bool Steps(const Slot& s) { return s.live && !s.held; }
  // Prefill steps: (sequences B, rows per sequence T), runner step index after the decode
  // buckets.
  struct PrefillShape {
    int64_t seqs = 1;
    int64_t rows_per_seq = 1;
    int step = -1;
  };
  // A part of a prompt that a prefill step feeds: the request, the first prompt token to
  // feed and how many, and the position of the request's first prompt token (0, or where
  // Append goes on).
  struct PrefillPiece {
    const PrefillRequest* request = nullptr;
    int64_t begin = 0;
    int64_t count = 0;
    int64_t first_pos = 0;
  };

  // ---- Init, step by step.
  // Opens the model files (or takes the config of random weights).
  absl::Status LoadModel(const SessionOptions& options);
  // Checks the options and derives the backend, the sizes and the buckets.
  absl::Status ResolveOptions(const SessionOptions& options);
  // The runner: its device and dispatcher, which the passes ask what they may fuse.
  absl::Status MakeRunner(const SessionOptions& options);
  // Every step's graph: one per decode bucket (with the graph passes where they pay, making
  // only nodes the runner's dispatcher runs), then one per prefill shape. Sets
  // prefill_shapes_.
  absl::StatusOr<std::vector<Graph>> BuildGraphs(const SessionOptions& options);
  // This rank's graph of a step (the graph itself with one rank).
  absl::StatusOr<Graph> Shard(Graph graph) const {
    if (ranks_ == 1) return graph;
    return ShardGraph(graph, shard_plan_, ranks_);
  }
  // Refuses a KV cache (the buffer whose size the caller picks freely) larger than the
  // device's free memory, before asking for it.
  absl::Status CheckKvCacheFits(const Graph& largest);
  // The weights on the runner's device (or bound in place on the CPU): sets `bind`.
  absl::Status SetUpWeights(const Graph& largest, StepRunner::Binder* bind);
  // The KV cache (zeros), the step inputs and the prompt on the device, the host staging
  // areas and the id ring; every row of the inputs is padding.
  absl::Status AllocateBuffers();
  // Adds every graph to the runner, bound to the weights, the KV cache and its inputs.
  absl::Status AddSteps(std::vector<Graph> graphs, const StepRunner::Binder& bind_weights);
  // Prepares and captures every step and finds each decode step's outputs.
  absl::Status FinalizeSteps();

  // Feeds prompts token by token through the decode step (prefill_chunk = 0).
  // `first_pos` is the position of the prompt's first token (0, or where Append goes on).
  absl::Status PrefillByDecodeSteps(const PrefillRequest& request, int64_t first_pos = 0);
  // The single-sequence prefill step (index in prefill_shapes_) with the fewest rows that
  // hold `rows` tokens (at most a chunk).
  size_t PrefillShapeFor(int64_t rows) const;
  // The rows of a single-sequence step to split off a rest of `rows` tokens (less than a
  // chunk) before the step that covers the remainder: the longest step it fills, when the
  // step covering all of it would pad it by more than prefill_max_pad_rows_; 0 otherwise.
  int64_t PrefillSplitRows(int64_t rows) const;
  // Runs prefill step `shape` (index in prefill_shapes_) over `pieces`, one per sequence.
  absl::Status RunPrefillStep(size_t shape, absl::Span<const PrefillPiece> pieces);
  absl::Status CheckSlot(int64_t slot, absl::string_view what) const;
  absl::Status CheckCapacity(int64_t steps) const;
  // Moves the ids of the recorded steps into the slots' histories (waits for the device).
  absl::Status Drain();
  absl::Status CheckErrorFlags();
  // The highest slot that takes part in decode steps (live, not held), or -1.
  int64_t HighestSteppingSlot() const;
  // Host buffers of the slots that choose their ids on the host.
  absl::Status AllocateHostPicks();
  // After a step of `bucket` (recorded at ring row `ring_row`): the ids of the slots that
  // choose on the host, chosen from their logits, put in the ring and the next step's input.
  absl::Status PickOnHost(int64_t bucket, int64_t ring_row);
  // With penalties: writes `slot`'s penalty parameters and its counts (bit 0 for every id
  // of its context, nothing generated) to the device; waits for the copies.
  absl::Status WritePenaltyRows(int64_t slot);
  // With penalties, after the host chose `picked` for `slot` where the step chose `chosen`:
  // moves the step's count from one to the other.
  absl::Status RecountHostPick(int64_t slot, int32_t chosen, int32_t picked);

  Backend backend_ = Backend::kCpu;
  LlamaConfig config_;
  std::vector<int64_t> buckets_;
  int64_t max_seq_ = 0;
  int64_t ring_steps_ = 0;
  int64_t device_loop_steps_ = 0;
  int64_t weight_bytes_ = 0;
  uint64_t weight_seed_ = 0;
  int weight_threads_ = 0;

  // Host weights the CPU binds in place (a mapped folder or file); the GPU copies them,
  // then drops the mapping.
  std::unique_ptr<ModelFiles> model_;
  std::vector<int32_t> stop_ids_;
  std::unique_ptr<StepRunner> runner_;
  // Tensor parallel: this rank, the group's size and the group, how the model splits, and
  // the whole model's largest step (the files' shapes).
  int rank_ = 0;
  int ranks_ = 1;
  CollectiveGroup* group_ = nullptr;
  ShardPlan shard_plan_;
  std::optional<Graph> whole_largest_;
  int64_t kv_cache_bytes_ = 0;
  BufferLayout kv_layout_;
  std::byte* kv_ = nullptr;
  // On the runner's device: the step inputs (ids | pos | seeds of every row) and the
  // prompt being fed. On the host (pinned on CUDA): the staged inputs of a Prefill and of
  // a Step (two areas, each rewritten only after the device read it), the prompt staged,
  // and the ring of recorded ids.
  int32_t* inputs_ = nullptr;
  int32_t* prompt_ = nullptr;
  int32_t* staging_ = nullptr;
  int32_t* ring_ = nullptr;
  std::vector<TensorArg> next_, logits_;  // per bucket

  // Prefill steps. Their inputs (ids | pos | seq_slots) live in their own device block,
  // staged from a host ring of kPrefillStaging areas (the session waits for the device
  // when it wraps).
  std::vector<PrefillShape> prefill_shapes_;
  int64_t prefill_chunk_ = 0;
  int64_t prefill_max_pad_rows_ = 0;
  int32_t* prefill_inputs_ = nullptr;
  int32_t* prefill_staging_ = nullptr;
  int64_t prefill_staged_ = 0;  // areas of the ring used since the last wait
  // Set by ProfilePrefill: each prefill step runs eagerly, its (runner step, node times)
  // appended here.
  std::vector<std::pair<int, std::vector<double>>>* prefill_profile_ = nullptr;
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

  // How the steps choose ids (SessionOptions::sampling), and for slots that choose
  // otherwise: the CPU reference that chooses for them, their logits rows copied to the
  // host and their chosen ids (host memory the runner copies from).
  std::optional<ops::Sample> sampling_;
  std::unique_ptr<CpuDispatch> picker_;
  std::byte* host_logits_ = nullptr;
  int32_t* picked_ = nullptr;
  std::vector<TensorArg> pick_from_;  // per bucket: the logits the step chose from

  // SessionOptions::penalties. On the device: the parameters [slots, kPenaltyParams] f32
  // and the counts [slots, vocab] i32 the steps read; on the host: their staging (one
  // parameter row per slot, one counts row) and two counts being moved (RecountHostPick).
  bool penalties_ = false;
  float* penalty_params_ = nullptr;
  int32_t* token_counts_ = nullptr;
  float* params_staging_ = nullptr;
  int32_t* counts_staging_ = nullptr;
  int32_t* recount_ = nullptr;
};

absl::string_view BackendName(Backend b) {
  switch (b) {
    case Backend::kAuto:
      return "auto";
    case Backend::kCpu:
      return "cpu";
    case Backend::kCuda:
      return "cuda";
  }
  return "?";
}

absl::Status DecodeSession::Impl::Init(const SessionOptions& options, int rank,
                                       CollectiveGroup* group) {
  rank_ = rank;
  ranks_ = std::max(options.tensor_parallel, 1);
  group_ = group;
  SG_RETURN_IF_ERROR(LoadModel(options));
  SG_RETURN_IF_ERROR(ResolveOptions(options));
  if (ranks_ > 1) {
    SG_ASSIGN_OR_RETURN(shard_plan_, LlamaShardPlan(config_, ranks_));
  }
  SG_RETURN_IF_ERROR(MakeRunner(options));
  SG_ASSIGN_OR_RETURN(std::vector<Graph> graphs, BuildGraphs(options));
  // The largest decode step reads every weight and every KV cache (of this rank).
  const Graph& largest = graphs[buckets_.size() - 1];
  if (model_ != nullptr) SG_RETURN_IF_ERROR(model_->CheckAgainstGraph(*whole_largest_));
  SG_RETURN_IF_ERROR(CheckKvCacheFits(largest));
  StepRunner::Binder bind_weights;
  SG_RETURN_IF_ERROR(SetUpWeights(largest, &bind_weights));
  SG_RETURN_IF_ERROR(AllocateBuffers());
  SG_RETURN_IF_ERROR(AddSteps(std::move(graphs), bind_weights));
  SG_RETURN_IF_ERROR(FinalizeSteps());
  SG_RETURN_IF_ERROR(AllocateHostPicks());
  slots_.resize(static_cast<size_t>(max_slots()));
  // A slot yields at most max_seq ids per sequence; reserving them keeps Drain, and so
  // the step path, free of allocation.
  for (Slot& slot : slots_) {
    slot.tokens.reserve(static_cast<size_t>(max_seq_));
    if (penalties_) slot.context.reserve(static_cast<size_t>(max_seq_));
  }
  return runner_->Sync();
}

absl::Status DecodeSession::Impl::LoadModel(const SessionOptions& options) {
  weight_seed_ = options.weight_seed;
  weight_threads_ = options.weight_threads;
  if (options.model_path.empty()) {
    SG_RETURN_IF_ERROR(options.config.Validate());
    config_ = options.config;
    return absl::OkStatus();
  }
  SG_ASSIGN_OR_RETURN(ModelFiles model, ModelFiles::Open(options.model_path));
  // The ranks share the files: the first checks them.
  if (options.check_weights && rank_ == 0) SG_RETURN_IF_ERROR(model.CheckFinite());
  model_ = std::make_unique<ModelFiles>(std::move(model));
  config_ = model_->config();
  stop_ids_ = model_->stop_ids();
  return absl::OkStatus();
}

absl::Status DecodeSession::Impl::ResolveOptions(const SessionOptions& options) {
  backend_ = options.backend;
  if (backend_ == Backend::kAuto) backend_ = CudaDeviceFound() ? Backend::kCuda : Backend::kCpu;

  const int64_t max_pos = config_.max_position_embeddings;
  if (options.max_slots < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("session: max_slots must be >= 1, got ", options.max_slots));
  }
  max_seq_ = options.max_seq == 0 ? std::min<int64_t>(max_pos, 4096) : options.max_seq;
  if (max_seq_ < 1 || max_seq_ > max_pos) {
    return absl::InvalidArgumentError(
        absl::StrCat("session: max_seq must be in [1, max_position_embeddings = ", max_pos,
                     "] (0: min(max_position_embeddings, 4096)), got ", options.max_seq));
  }
  if (options.id_ring_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("session: id_ring_steps must be >= 1, got ", options.id_ring_steps));
  }
  ring_steps_ = options.id_ring_steps;
  if (options.device_loop_steps < 0 || options.device_loop_steps > options.id_ring_steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("session: device_loop_steps must be in [0, id_ring_steps = ",
                     options.id_ring_steps, "], got ", options.device_loop_steps));
  }
  device_loop_steps_ = options.device_loop_steps;
  if (absl::Status st = ValidateBuckets(options.buckets); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("session: buckets: ", st.message()));
  }
  for (int64_t b : options.buckets) {
    if (b < options.max_slots) buckets_.push_back(b);
  }
  buckets_.push_back(options.max_slots);
  if (options.sampling.has_value()) SG_RETURN_IF_ERROR(CheckSampling(*options.sampling));
  sampling_ = options.sampling;
  penalties_ = options.penalties;

  if (options.prefill_chunk < 0 || options.prefill_chunk > kMaxPrefillChunk) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session: prefill_chunk must be in [0, ", kMaxPrefillChunk,
        "] (0: prompts go through decode steps), got ", options.prefill_chunk));
  }
  prefill_chunk_ = std::min(options.prefill_chunk, max_seq_);
  if (options.prefill_max_pad_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session: prefill_max_pad_rows must be >= 0, got ", options.prefill_max_pad_rows));
  }
  prefill_max_pad_rows_ = options.prefill_max_pad_rows;
  return absl::OkStatus();
}

absl::Status DecodeSession::Impl::MakeRunner(const SessionOptions& options) {
  RunnerOptions ro;
  ro.device = backend_ == Backend::kCuda ? DeviceKind::kCuda : DeviceKind::kCpu;
  ro.eager = options.eager;
  ro.cuda = options.cuda;
  // A GGUF file's quantized matrices already meet x rounded to f16 (auto's matmuls), so its
  // prompts' attention takes the tensor cores in f16 too (docs/gguf.md).
  ro.cuda.prefill_attention = ResolvePrefillAttention(
      options.cuda, config_.HasBlockWeights() && config_.dtype == DType::kF32);
  ro.cpu_threads = options.cpu_threads;
  ro.cuda_device = ro.device == DeviceKind::kCuda ? rank_ : 0;
  ro.collectives = group_;
  ro.rank = rank_;
  SG_ASSIGN_OR_RETURN(runner_, StepRunner::Create(ro));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Graph>> DecodeSession::Impl::BuildGraphs(
    const SessionOptions& options) {
  // The passes make only nodes the runner's dispatcher runs.
  PassOptions passes = options.passes;
  passes.backend = &runner_->op_support();
  std::vector<Graph> graphs;
  for (int64_t bucket : buckets_) {
    LlamaGraphOptions g;
    g.batch = bucket;
    g.slots = max_slots();
    g.max_seq = max_seq_;
    g.sampling = options.sampling;
    g.penalties = options.penalties;
    g.closed_loop = true;
    SG_ASSIGN_OR_RETURN(Graph graph, BuildLlamaDecodeGraph(config_, g));
    // The whole model's largest step: what the files are checked against and the
    // weights are cut from.
    if (bucket == buckets_.back()) whole_largest_ = graph;
    SG_ASSIGN_OR_RETURN(graph, Shard(std::move(graph)));
    const int64_t fused_rows =
        backend_ == Backend::kCuda && config_.HasBlockWeights() &&
                options.cuda.block_mma_min_rows > 0
            ? std::max(options.passes_max_rows, options.passes_max_rows_block_formats)
            : options.passes_max_rows;
    if (bucket <= fused_rows) {
      SG_ASSIGN_OR_RETURN(graph, RunPasses(std::move(graph), passes));
    }
    graphs.push_back(std::move(graph));
  }
  // Prefill steps: rows per sequence chunk, chunk/2, chunk/4, ... (at least
  // kMinPrefillRows), each alone and, where shorter than the chunk, as many sequences as
  // fill a chunk's rows. Halving, so that a remainder pads its step by less than 2× (a
  // ladder of quarters padded a 129-token remainder of a 512 chunk to 512 rows); the
  // steps share one arena, so more of them cost a capture each, not memory.
  if (prefill_chunk_ > 0) {
    for (int64_t t = prefill_chunk_;; t /= 2) {
      prefill_shapes_.push_back({1, t, -1});
      const int64_t seqs = std::min(max_slots(), prefill_chunk_ / t);
      if (seqs > 1) prefill_shapes_.push_back({seqs, t, -1});
      if (t / 2 < kMinPrefillRows) break;
    }
  }
  for (const PrefillShape& shape : prefill_shapes_) {
    LlamaGraphOptions g;
    g.batch = shape.seqs;
    g.rows_per_seq = shape.rows_per_seq;
    g.seq_slots = true;
    g.slots = max_slots();
    g.max_seq = max_seq_;
    g.logits = false;
    SG_ASSIGN_OR_RETURN(Graph graph, BuildLlamaDecodeGraph(config_, g));
    SG_ASSIGN_OR_RETURN(graph, Shard(std::move(graph)));
    graphs.push_back(std::move(graph));
  }
  return graphs;
}

absl::Status DecodeSession::Impl::CheckKvCacheFits(const Graph& largest) {
  // The KV cache is the one buffer whose size the caller picks freely (max_seq × slots):
  // check it against the device before asking for it.
  kv_layout_ = LayoutBuffers(largest, TensorKind::kState);
  kv_cache_bytes_ = kv_layout_.total_bytes;
  SG_ASSIGN_OR_RETURN(const int64_t free_bytes, runner_->FreeBytes());
  if (kv_cache_bytes_ > free_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session: the KV cache for ", max_slots(), " slot(s) of max_seq = ", max_seq_,
        " needs ", kv_cache_bytes_, " bytes, but the ", DeviceKindName(runner_->device()),
        " device has ", free_bytes, " bytes free; ask for fewer positions (max_seq) or slots"));
  }
  return absl::OkStatus();
}

absl::Status DecodeSession::Impl::AllocateBuffers() {
  SG_ASSIGN_OR_RETURN(void* kv, runner_->AllocateZeroed(kv_cache_bytes_, "the KV cache"));
  kv_ = static_cast<std::byte*>(kv);
  // Step inputs start as all padding, so that nothing a capture might run writes a cache.
  const InputBlock block(max_slots());
  SG_ASSIGN_OR_RETURN(void* inputs, runner_->Allocate(block.bytes(), "the step inputs"));
  SG_ASSIGN_OR_RETURN(void* prompt, runner_->Allocate(max_seq_ * 4, "the prompt ids"));
  SG_ASSIGN_OR_RETURN(void* staging,
                      runner_->AllocateHost(2 * block.bytes() + max_seq_ * 4, "input staging"));
  SG_ASSIGN_OR_RETURN(void* ring, runner_->AllocateHost(ring_steps_ * max_slots() * 4,
                                                        "the id ring"));
  const InputBlock prefill_block(std::max<int64_t>(prefill_chunk_, 1));
  SG_ASSIGN_OR_RETURN(void* prefill_inputs,
                      runner_->Allocate(prefill_block.bytes(), "the prefill step inputs"));
  SG_ASSIGN_OR_RETURN(void* prefill_staging,
                      runner_->AllocateHost(kPrefillStaging * prefill_block.bytes(),
                                            "prefill input staging"));
  prefill_inputs_ = static_cast<int32_t*>(prefill_inputs);
  prefill_staging_ = static_cast<int32_t*>(prefill_staging);
  // All padding, like the decode inputs, for whatever a capture runs.
  prefill_block.Clear(prefill_staging_);
  SG_RETURN_IF_ERROR(runner_->Copy(prefill_inputs_, prefill_staging_, prefill_block.bytes()));
  inputs_ = static_cast<int32_t*>(inputs);
  prompt_ = static_cast<int32_t*>(prompt);
  staging_ = static_cast<int32_t*>(staging);
  ring_ = static_cast<int32_t*>(ring);
  block.Clear(staging_);
  SG_RETURN_IF_ERROR(runner_->Copy(inputs_, staging_, block.bytes()));
  if (!penalties_) return absl::OkStatus();
  // Every slot neutral until a Prefill writes its row.
  const int64_t params = max_slots() * ops::kPenaltyParams;
  SG_ASSIGN_OR_RETURN(void* device_params,
                      runner_->Allocate(params * 4, "the penalty parameters"));
  SG_ASSIGN_OR_RETURN(void* counts, runner_->AllocateZeroed(max_slots() * config_.vocab_size * 4,
                                                            "the token counts"));
  SG_ASSIGN_OR_RETURN(void* params_staging,
                      runner_->AllocateHost(params * 4, "penalty parameter staging"));
  SG_ASSIGN_OR_RETURN(void* counts_staging,
                      runner_->AllocateHost(config_.vocab_size * 4, "token count staging"));
  SG_ASSIGN_OR_RETURN(void* recount, runner_->AllocateHost(2 * 4, "token recount"));
  penalty_params_ = static_cast<float*>(device_params);
  token_counts_ = static_cast<int32_t*>(counts);
  params_staging_ = static_cast<float*>(params_staging);
  counts_staging_ = static_cast<int32_t*>(counts_staging);
  recount_ = static_cast<int32_t*>(recount);
  for (int64_t i = 0; i < max_slots(); ++i) {
    FillPenaltyRow(Penalties{}, std::nullopt, params_staging_ + i * ops::kPenaltyParams);
  }
  return runner_->Copy(penalty_params_, params_staging_, params * 4);
}

absl::Status DecodeSession::Impl::AddSteps(std::vector<Graph> graphs,
                                           const StepRunner::Binder& bind_weights) {
  const InputBlock block(max_slots());
  const InputBlock prefill_block(std::max<int64_t>(prefill_chunk_, 1));
  const size_t decode_graphs = buckets_.size();
  for (size_t i = 0; i < graphs.size(); ++i) {
    const bool prefill = i >= decode_graphs;
    auto bind = [&](const Graph& g, Bindings& b) -> absl::Status {
      SG_RETURN_IF_ERROR(bind_weights(g, b));
      SG_RETURN_IF_ERROR(BindLayout(g, TensorKind::kState, kv_layout_, kv_, b));
      if (!prefill) {
        SG_RETURN_IF_ERROR(BindInputBlock(g, block, inputs_, b));
        if (!penalties_) return absl::OkStatus();
        SG_RETURN_IF_ERROR(b.Bind(kPenaltyParamsInput, penalty_params_,
                                  max_slots() * ops::kPenaltyParams * 4));
        return b.Bind(kTokenCountsInput, token_counts_, max_slots() * config_.vocab_size * 4);
      }
      const PrefillShape& shape = prefill_shapes_[i - decode_graphs];
      return BindPrefillBlock(prefill_block, prefill_inputs_,
                              shape.seqs * shape.rows_per_seq, shape.seqs, b);
    };
    SG_ASSIGN_OR_RETURN(const int step, runner_->AddStep(std::move(graphs[i]), bind));
    if (prefill) prefill_shapes_[i - decode_graphs].step = step;
  }
  return absl::OkStatus();
}

absl::Status DecodeSession::Impl::FinalizeSteps() {
  // Captured now, while every row is padding, rather than on first use in mid-decode.
  SG_RETURN_IF_ERROR(runner_->Finalize());
  for (int i = 0; i < static_cast<int>(buckets_.size()); ++i) {
    SG_ASSIGN_OR_RETURN(TensorArg next, runner_->Output(i, kNextIdsOutput));
    SG_ASSIGN_OR_RETURN(TensorArg logits, runner_->Output(i, kLogitsOutput));
    next_.push_back(next);
    logits_.push_back(logits);
    if (device_loop_steps_ > 0) {
      if (ranks_ > 1 || runner_->device() != DeviceKind::kCuda || !runner_->replays()) {
        return absl::InvalidArgumentError(
            "session: device_loop_steps needs the CUDA backend with captured steps (not "
            "eager) and one rank");
      }
      SG_RETURN_IF_ERROR(runner_->AddLoop(i, kNextIdsOutput, device_loop_steps_));
    }
    if (penalties_) {
      SG_ASSIGN_OR_RETURN(TensorArg penalized, runner_->Output(i, kPenalizedLogitsOutput));
      pick_from_.push_back(penalized);
    } else {
      pick_from_.push_back(logits);
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeSession::Impl::SetUpWeights(const Graph& largest, StepRunner::Binder* bind) {
  const BufferLayout layout = LayoutBuffers(largest, TensorKind::kWeight);
  weight_bytes_ = layout.total_bytes;
  if (model_ != nullptr && runner_->device() == DeviceKind::kCpu && ranks_ == 1) {
    // The CPU reads the mapped files in place.
    const ModelFiles* model = model_.get();
    *bind = [model](const Graph& g, Bindings& b) { return model->BindInPlace(g, b); };
    return absl::OkStatus();
  }
  SG_ASSIGN_OR_RETURN(void* device_weights, runner_->Allocate(layout.total_bytes, "the weights"));
  auto* base = static_cast<std::byte*>(device_weights);
  if (model_ == nullptr && runner_->device() == DeviceKind::kCpu) {
    // Random weights drawn in place (seed + rank).
    SG_RETURN_IF_ERROR(FillRandomWeights(largest, layout, weight_seed_ + rank_,
                                         {base, static_cast<size_t>(layout.total_bytes)},
                                         weight_threads_));
  } else {
    WeightUpload upload{.graph = &largest, .layout = &layout, .whole = &*whole_largest_,
                        .plan = &shard_plan_, .rank = rank_, .ranks = ranks_,
                        .seed = weight_seed_, .threads = weight_threads_};
    const ModelFiles* model = model_.get();
    if (model != nullptr) upload.source = [model](const std::string& name) { return model->WeightData(name); };
    if (absl::Status s = UploadWeights(*runner_, upload, base); !s.ok()) {
      return model == nullptr ? s
                              : absl::Status(s.code(), absl::StrCat(model->path(), ": ", s.message()));
    }
    // The copies have read the mapping.
    model_.reset();
  }
  *bind = [layout, base](const Graph& g, Bindings& b) {
    return BindLayout(g, TensorKind::kWeight, layout, base, b);
  };
  return absl::OkStatus();
}

std::string DecodeSession::Impl::Describe() const {
  return absl::StrCat(runner_->Describe(),
                      ranks_ > 1 ? absl::StrCat(", tensor parallel over ", ranks_, " ranks") : "",
                      "; buckets ", absl::StrJoin(buckets_, ","), ", max_seq ", max_seq_);
}

const ExecutionPlan* DecodeSession::Impl::plan(int64_t bucket) const {
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (buckets_[i] == bucket) return &runner_->plan(static_cast<int>(i));
  }
  return nullptr;
}

bool DecodeSession::Impl::live(int64_t slot) const {
  return slot >= 0 && slot < max_slots() && slots_[slot].live;
}

int64_t DecodeSession::Impl::position(int64_t slot) const {
  return live(slot) ? slots_[slot].pos : -1;
}

absl::Status DecodeSession::Impl::CheckSlot(int64_t slot, absl::string_view what) const {
  if (slot >= 0 && slot < max_slots()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": slot ", slot,
                                                 " is out of range; the session has ",
                                                 max_slots(), " slot(s) (SessionOptions::max_slots)"));
}

int64_t DecodeSession::Impl::HighestSteppingSlot() const {
  for (int64_t s = max_slots() - 1; s >= 0; --s) {
    if (Steps(slots_[s])) return s;
  }
  return -1;
}

absl::Status DecodeSession::Impl::CheckCapacity(int64_t steps) const {
  for (int64_t s = 0; s < max_slots(); ++s) {
    const Slot& slot = slots_[s];
    if (!Steps(slot) || slot.pos + steps <= max_seq_) continue;
    return absl::OutOfRangeError(absl::StrCat(
        "slot ", s, " is at position ", slot.pos, ": its KV cache (max_seq = ", max_seq_,
        ") has room for ", max_seq_ - slot.pos, " more step(s), ", steps,
        " were asked for; make the session with a larger max_seq"));
  }
  return absl::OkStatus();
}

absl::Status DecodeSession::Impl::Prefill(absl::Span<const PrefillRequest> requests) {
  std::vector<bool> taken(static_cast<size_t>(max_slots()), false);
  for (const PrefillRequest& r : requests) {
    const int64_t slot = r.slot;
    SG_RETURN_IF_ERROR(CheckSlot(slot, "Prefill"));
    if (taken[slot]) {
      return absl::InvalidArgumentError(
          absl::StrCat("Prefill: slot ", slot, " is named by two requests"));
    }
    taken[slot] = true;
    const int64_t n = static_cast<int64_t>(r.prompt.size());
    if (n == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Prefill(slot ", slot, "): the prompt is empty; a sequence starts with at least one token"));
    }
    if (n > max_seq_) {
      return absl::OutOfRangeError(absl::StrCat("Prefill(slot ", slot, "): the prompt has ", n,
                                                " tokens, more than the KV cache holds (max_seq = ",
                                                max_seq_, ")"));
    }
    for (int64_t i = 0; i < n; ++i) {
      if (r.prompt[i] < 0 || r.prompt[i] >= config_.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("Prefill(slot ", slot, "): prompt token ", i, " is id ", r.prompt[i],
                         ", outside the vocabulary [0, ", config_.vocab_size, ")"));
      }
    }
    if (r.sampling.has_value()) {
      if (r.sampling->sample.has_value()) {
        if (absl::Status st = CheckSampling(*r.sampling->sample); !st.ok()) {
          return absl::InvalidArgumentError(absl::StrCat("Prefill(slot ", slot, "): ", st.message()));
        }
      }
      const Penalties& p = r.sampling->penalties;
      if (absl::Status st = CheckPenalties(p, config_.vocab_size); !st.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("Prefill(slot ", slot, "): ", st.message()));
      }
      if (!p.neutral() && !penalties_) {
        return absl::FailedPreconditionError(absl::StrCat(
            "Prefill(slot ", slot, "): penalties, min-p and logit bias need a session made "
            "with SessionOptions::penalties"));
      }
    }
  }
  SG_RETURN_IF_ERROR(Drain());
  for (const PrefillRequest& r : requests) {
    Slot& s = slots_[r.slot];
    s.live = false;
    s.tokens.clear();
  }
  inputs_dirty_ = true;
  last_bucket_ = -1;

  if (prefill_chunk_ == 0) {
    for (const PrefillRequest& r : requests) SG_RETURN_IF_ERROR(PrefillByDecodeSteps(r));
  } else {
    // Every prompt token but the last goes in; long prompts in whole chunks first, then
    // each remainder in the smallest step whose rows cover it, several sequences to a
    // step where one is made for that length.
    const int64_t chunk = prefill_chunk_;
    std::vector<int64_t> fed(requests.size(), 0);
    for (size_t i = 0; i < requests.size(); ++i) {
      const int64_t feed = static_cast<int64_t>(requests[i].prompt.size()) - 1;
      while (feed - fed[i] >= chunk) {
        const PrefillPiece piece{&requests[i], fed[i], chunk};
        SG_RETURN_IF_ERROR(RunPrefillStep(0, absl::MakeConstSpan(&piece, 1)));
        fed[i] += chunk;
      }
      // Then shorter steps it fills, while the step covering the rest would pad it by
      // more than prefill_max_pad_rows.
      for (int64_t rows; (rows = PrefillSplitRows(feed - fed[i])) > 0; fed[i] += rows) {
        const PrefillPiece piece{&requests[i], fed[i], rows};
        SG_RETURN_IF_ERROR(RunPrefillStep(PrefillShapeFor(rows), absl::MakeConstSpan(&piece, 1)));
      }
    }
    // Each remainder (shorter than a chunk) goes to the single-sequence step with the
    // fewest rows that cover it; prefill_shapes_ runs from the longest rows to the
    // shortest, a packed step (several sequences) right after the single one of its rows.
    std::vector<std::vector<PrefillPiece>> by_shape(prefill_shapes_.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      const int64_t left = static_cast<int64_t>(requests[i].prompt.size()) - 1 - fed[i];
      if (left <= 0) continue;
      by_shape[PrefillShapeFor(left)].push_back({&requests[i], fed[i], left});
    }
    for (size_t k = 0; k < prefill_shapes_.size(); ++k) {
      const std::vector<PrefillPiece>& pieces = by_shape[k];
      const bool packed = k + 1 < prefill_shapes_.size() && prefill_shapes_[k + 1].seqs > 1 &&
                          prefill_shapes_[k + 1].rows_per_seq == prefill_shapes_[k].rows_per_seq;
      const size_t per_step = packed ? static_cast<size_t>(prefill_shapes_[k + 1].seqs) : 1;
      for (size_t p = 0; p < pieces.size(); p += per_step) {
        const size_t n = std::min(pieces.size() - p, per_step);
        SG_RETURN_IF_ERROR(RunPrefillStep(n > 1 ? k + 1 : k, absl::MakeConstSpan(&pieces[p], n)));
      }
    }
  }
  for (const PrefillRequest& r : requests) {
    Slot& s = slots_[r.slot];
    const int64_t n = static_cast<int64_t>(r.prompt.size());
    s.live = true;
    s.held = false;
    s.pos = static_cast<int32_t>(n - 1);
    s.pending = r.prompt[n - 1];
    s.seed = r.seed;
    s.host_pick = r.sampling.has_value() && !SameSampling(r.sampling->sample, sampling_);
    s.sample = r.sampling.has_value() ? r.sampling->sample : sampling_;
    s.penalties = r.sampling.has_value() ? r.sampling->penalties : Penalties{};
    if (penalties_) {
      // After the prefill steps: prompts fed through decode steps were counted as chosen.
      s.context.assign(r.prompt.begin(), r.prompt.end());
      s.tokens_in_context = 0;
      SG_RETURN_IF_ERROR(WritePenaltyRows(r.slot));
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeSession::Impl::WritePenaltyRows(int64_t slot) {
  const Slot& s = slots_[slot];
  float* params = params_staging_ + slot * ops::kPenaltyParams;
  FillPenaltyRow(s.penalties, s.sample, params);
  const int64_t vocab = config_.vocab_size;
  // The staging row is rewritten only after the device read it.
  SG_RETURN_IF_ERROR(runner_->Sync());
  std::fill_n(counts_staging_, vocab, 0);
  for (int32_t id : s.context) counts_staging_[id] = 1;
  SG_RETURN_IF_ERROR(runner_->Copy(penalty_params_ + slot * ops::kPenaltyParams, params,
                                   ops::kPenaltyParams * 4));
  SG_RETURN_IF_ERROR(runner_->Copy(token_counts_ + slot * vocab, counts_staging_, vocab * 4));
  return runner_->Sync();
}

absl::Status DecodeSession::Impl::RecountHostPick(int64_t slot, int32_t chosen, int32_t picked) {
  int32_t* row = token_counts_ + slot * config_.vocab_size;
  SG_RETURN_IF_ERROR(runner_->Copy(recount_, row + chosen, 4));
  SG_RETURN_IF_ERROR(runner_->Copy(recount_ + 1, row + picked, 4));
  SG_RETURN_IF_ERROR(runner_->Sync());
  recount_[0] -= 2;
  recount_[1] += 2;
  SG_RETURN_IF_ERROR(runner_->Copy(row + chosen, recount_, 4));
  SG_RETURN_IF_ERROR(runner_->Copy(row + picked, recount_ + 1, 4));
  // recount_ is rewritten only after these copies read it.
  return runner_->Sync();
}

size_t DecodeSession::Impl::PrefillShapeFor(int64_t rows) const {
  size_t best = 0;
  for (size_t k = 0; k < prefill_shapes_.size(); ++k) {
    if (prefill_shapes_[k].seqs == 1 && prefill_shapes_[k].rows_per_seq >= rows) best = k;
  }
  return best;
}

int64_t DecodeSession::Impl::PrefillSplitRows(int64_t rows) const {
  if (rows <= 0) return 0;
  const int64_t cover = prefill_shapes_[PrefillShapeFor(rows)].rows_per_seq;
  if (cover - rows <= prefill_max_pad_rows_) return 0;
  int64_t fill = 0;  // the longest single-sequence step of at most `rows` rows
  for (const PrefillShape& shape : prefill_shapes_) {
    if (shape.seqs == 1 && shape.rows_per_seq <= rows) fill = std::max(fill, shape.rows_per_seq);
  }
  return fill;
}

absl::Status DecodeSession::Impl::Append(int64_t slot, absl::Span<const int32_t> tokens) {
  SG_RETURN_IF_ERROR(CheckSlot(slot, "Append"));
  if (!slots_[slot].live) {
    return absl::FailedPreconditionError(
        absl::StrCat("Append: slot ", slot, " is not live; Prefill it first"));
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) {
    return absl::InvalidArgumentError(absl::StrCat("Append(slot ", slot, "): no tokens"));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("Append(slot ", slot, "): token ", i, " is id ", tokens[i],
                       ", outside the vocabulary [0, ", config_.vocab_size, ")"));
    }
  }
  // The last appended token takes position pos + n and must fit, as a prompt's last does.
  const int64_t pos = slots_[slot].pos;
  if (n > max_seq_ - 1 - pos) {
    return absl::OutOfRangeError(absl::StrCat(
        "Append(slot ", slot, "): the slot is at position ", pos, "; ", n,
        " more tokens do not fit its KV cache (max_seq = ", max_seq_, ")"));
  }
  // The host learns the id the slot would feed next.
  SG_RETURN_IF_ERROR(Drain());
  Slot& s = slots_[slot];
  std::vector<int32_t> feed;
  feed.reserve(static_cast<size_t>(n) + 1);
  feed.push_back(s.pending);
  feed.insert(feed.end(), tokens.begin(), tokens.end());
  const PrefillRequest request{slot, feed, s.seed};
  inputs_dirty_ = true;
  last_bucket_ = -1;
  if (prefill_chunk_ == 0) {
    SG_RETURN_IF_ERROR(PrefillByDecodeSteps(request, pos));
  } else {
    // Whole chunks, shorter steps it fills (as Prefill), then the rest in the smallest step
    // that holds it.
    int64_t fed = 0;
    for (; n - fed >= prefill_chunk_; fed += prefill_chunk_) {
      const PrefillPiece piece{&request, fed, prefill_chunk_, pos};
      SG_RETURN_IF_ERROR(RunPrefillStep(0, absl::MakeConstSpan(&piece, 1)));
    }
    for (int64_t rows; (rows = PrefillSplitRows(n - fed)) > 0; fed += rows) {
      const PrefillPiece piece{&request, fed, rows, pos};
      SG_RETURN_IF_ERROR(RunPrefillStep(PrefillShapeFor(rows), absl::MakeConstSpan(&piece, 1)));
    }
    if (n > fed) {
      const PrefillPiece piece{&request, fed, n - fed, pos};
      SG_RETURN_IF_ERROR(RunPrefillStep(PrefillShapeFor(n - fed), absl::MakeConstSpan(&piece, 1)));
    }
  }
  s.pos = static_cast<int32_t>(pos + n);
  s.pending = tokens[n - 1];
  if (penalties_) {
    // The sequence so far is the next turn's prompt (the generated ids are drained).
    s.context.insert(s.context.end(), s.tokens.begin() + s.tokens_in_context, s.tokens.end());
    s.tokens_in_context = s.tokens.size();
    s.context.insert(s.context.end(), tokens.begin(), tokens.end());
    SG_RETURN_IF_ERROR(WritePenaltyRows(slot));
  }
  return absl::OkStatus();
}

absl::Status DecodeSession::Impl::RunPrefillStep(size_t shape_index,
                                                 absl::Span<const PrefillPiece> pieces) {
  const PrefillShape& shape = prefill_shapes_[shape_index];
  const InputBlock block(prefill_chunk_);
  // A staging area is rewritten only after the device read it: wait once per ring.
  if (prefill_staged_ == kPrefillStaging) {
    SG_RETURN_IF_ERROR(runner_->Sync());
    prefill_staged_ = 0;
  }
  int32_t* area = prefill_staging_ + prefill_staged_ * block.ints();
  ++prefill_staged_;
  block.Clear(area);
  const int64_t t = shape.rows_per_seq;
  for (size_t b = 0; b < pieces.size(); ++b) {
    const PrefillPiece& piece = pieces[b];
    area[block.seeds() + b] = static_cast<int32_t>(piece.request->slot);
    for (int64_t j = 0; j < piece.count; ++j) {
      const int64_t row = static_cast<int64_t>(b) * t + j;
      area[block.ids() + row] = piece.request->prompt[piece.begin + j];
      area[block.pos() + row] = static_cast<int32_t>(piece.first_pos + piece.begin + j);
    }
  }
  SG_RETURN_IF_ERROR(runner_->Copy(prefill_inputs_, area, block.bytes()));
  if (prefill_profile_ != nullptr) {
    SG_ASSIGN_OR_RETURN(std::vector<double> node_ms, ProfileNodes(*runner_, shape.step));
    prefill_profile_->push_back({shape.step, std::move(node_ms)});
  } else {
    SG_RETURN_IF_ERROR(runner_->Run(shape.step));
  }
  ++prefill_steps_run_;
  return absl::OkStatus();
}

absl::Status DecodeSession::Impl::PrefillByDecodeSteps(const PrefillRequest& request,
                                                       int64_t first_pos) {
  const int64_t slot = request.slot;
  const absl::Span<const int32_t> prompt = request.prompt;
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n < 2) return absl::OkStatus();
  // Every row but this slot's is padding while the prompt goes in; the closed loop
  // advances the slot's position, and each later prompt id is copied into its row on
  // the device from the prompt uploaded once. This runs only after a Drain, and every
  // staging area below is rewritten only after a Sync (the loop over requests waits).
  SG_RETURN_IF_ERROR(runner_->Sync());
  const InputBlock block(max_slots());
  int32_t* rows = staging_;
  block.Clear(rows);
  rows[block.ids() + slot] = prompt[0];
  rows[block.pos() + slot] = static_cast<int32_t>(first_pos);
  rows[block.seeds() + slot] = request.seed;
  SG_RETURN_IF_ERROR(runner_->Copy(inputs_, rows, block.bytes()));
  int32_t* staged_prompt = staging_ + 2 * block.ints();
  std::copy_n(prompt.data(), n, staged_prompt);
  SG_RETURN_IF_ERROR(runner_->Copy(prompt_, staged_prompt, n * 4));
  SG_ASSIGN_OR_RETURN(const int bucket, ChooseBucket(buckets_, slot + 1));
  for (int64_t t = 0; t + 1 < n; ++t) {
    if (t > 0) {
      SG_RETURN_IF_ERROR(runner_->Copy(inputs_ + block.ids() + slot, prompt_ + t, 4));
    }
    SG_RETURN_IF_ERROR(runner_->Run(bucket));
  }
  return absl::OkStatus();
}

absl::Status DecodeSession::Impl::Release(int64_t slot) {
  SG_RETURN_IF_ERROR(CheckSlot(slot, "Release"));
  SG_RETURN_IF_ERROR(Drain());
  slots_[slot].live = false;
  slots_[slot].held = false;
  slots_[slot].pos = -1;
  inputs_dirty_ = true;
  return absl::OkStatus();
}

absl::Status DecodeSession::Impl::Hold(int64_t slot, bool held) {
  const char* what = held ? "Hold" : "Resume";
  SG_RETURN_IF_ERROR(CheckSlot(slot, what));
  if (!slots_[slot].live) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": slot ", slot, " is not live; Prefill it first"));
  }
  if (slots_[slot].held == held) return absl::OkStatus();
  // The steps recorded so far included the slot or left it out as a whole.
  SG_RETURN_IF_ERROR(Drain());
  slots_[slot].held = held;
  inputs_dirty_ = true;
  return absl::OkStatus();
}

absl::Status DecodeSession::Impl::MoveSlot(int64_t from, int64_t to) {
  SG_RETURN_IF_ERROR(CheckSlot(from, "MoveSlot"));
  SG_RETURN_IF_ERROR(CheckSlot(to, "MoveSlot"));
  if (from == to || !slots_[from].live || slots_[to].live) {
    return absl::FailedPreconditionError(absl::StrCat(
        "MoveSlot(", from, ", ", to, "): needs a live slot and another that is not live"));
  }
  SG_RETURN_IF_ERROR(Drain());
  // Every state is a KV cache [slots, kv_heads, max_seq, head_dim]: each head of a slot
  // holds max_seq rows, of which the first pos are written.
  const int64_t heads = config_.num_key_value_heads / ranks_;  // this rank's
  const int64_t used = slots_[from].pos;
  for (const BufferLayout::Entry& e : kv_layout_.entries) {
    const int64_t per_head = e.bytes / (max_slots() * heads);
    const int64_t bytes = per_head / max_seq_ * used;
    for (int64_t h = 0; h < heads && bytes > 0; ++h) {
      std::byte* base = kv_ + e.offset + h * per_head;
      SG_RETURN_IF_ERROR(runner_->Copy(base + to * heads * per_head,
                                       base + from * heads * per_head, bytes));
    }
  }
  if (penalties_) {
    const int64_t vocab = config_.vocab_size;
    SG_RETURN_IF_ERROR(runner_->Copy(penalty_params_ + to * ops::kPenaltyParams,
                                     penalty_params_ + from * ops::kPenaltyParams,
                                     ops::kPenaltyParams * 4));
    SG_RETURN_IF_ERROR(
        runner_->Copy(token_counts_ + to * vocab, token_counts_ + from * vocab, vocab * 4));
  }
  std::swap(slots_[from], slots_[to]);  // the ids keep their reserved room
  Slot& freed = slots_[from];
  freed.live = false;
  freed.held = false;
  freed.pos = -1;
  freed.tokens.clear();
  inputs_dirty_ = true;
  last_bucket_ = -1;
  return absl::OkStatus();
}

absl::Status DecodeSession::Impl::Step(std::vector<double>* node_ms) {
  const int64_t highest = HighestSteppingSlot();
  if (highest < 0) {
    return absl::FailedPreconditionError("Step: no slot is live; Prefill one first");
  }
  SG_RETURN_IF_ERROR(CheckCapacity(1));
  if (pending_steps_ == ring_steps_) SG_RETURN_IF_ERROR(Drain());
  SG_ASSIGN_OR_RETURN(const int bucket, ChooseBucket(buckets_, highest + 1));
  SG_RETURN_IF_ERROR(WriteInputsIfDirty());
  if (node_ms != nullptr) {
    SG_ASSIGN_OR_RETURN(*node_ms, ProfileNodes(*runner_, bucket));
  } else {
    SG_RETURN_IF_ERROR(runner_->Run(bucket));
  }
  const TensorArg& next = next_[bucket];
  SG_RETURN_IF_ERROR(runner_->Copy(ring_ + pending_steps_ * max_slots(), next.data, next.bytes()));
  SG_RETURN_IF_ERROR(PickOnHost(bucket, pending_steps_));
  ++pending_steps_;
  ++steps_run_;
  for (Slot& s : slots_) {
    if (Steps(s)) ++s.pos;
  }
  last_bucket_ = bucket;
  return absl::OkStatus();
}

absl::Status DecodeSession::Impl::WriteInputsIfDirty() {
  if (!inputs_dirty_) return absl::OkStatus();
  // The live set changed, which drained: the host knows every live slot's next id.
  const InputBlock block(max_slots());
  int32_t* rows = staging_ + block.ints();
  block.Clear(rows);
  for (int64_t i = 0; i < max_slots(); ++i) {
    const Slot& s = slots_[i];
    if (!Steps(s)) continue;
    rows[block.ids() + i] = s.pending;
    rows[block.pos() + i] = s.pos;
    rows[block.seeds() + i] = s.seed;
  }
  SG_RETURN_IF_ERROR(runner_->Copy(inputs_, rows, block.bytes()));
  inputs_dirty_ = false;
  return absl::OkStatus();
}

bool DecodeSession::Impl::DeviceLoopRuns() const {
  if (device_loop_steps_ == 0) return false;
  for (const Slot& s : slots_) {
    if (Steps(s) && s.host_pick) return false;
  }
  return true;
}

absl::Status DecodeSession::Impl::GenerateOnDevice(int64_t n, absl::Span<const int32_t> stop_ids,
                                                   std::vector<bool>& stopped) {
  // The ring is empty and the host knows every slot's position before each launch (each
  // launch ends drained).
  SG_RETURN_IF_ERROR(Drain());
  std::vector<uint8_t> live;
  for (int64_t left = n; left > 0;) {
    const int64_t highest = HighestSteppingSlot();
    SG_ASSIGN_OR_RETURN(const int bucket, ChooseBucket(buckets_, highest + 1));
    SG_RETURN_IF_ERROR(WriteInputsIfDirty());
    const int64_t rows = buckets_[bucket];
    live.assign(static_cast<size_t>(rows), 0);
    for (int64_t i = 0; i < rows; ++i) live[i] = Steps(slots_[i]) && !stopped[i] ? 1 : 0;
    const int64_t limit = std::min(left, device_loop_steps_);
    SG_ASSIGN_OR_RETURN(const int64_t ran,
                        runner_->RunLoop(bucket, limit, stop_ids, live, ring_, max_slots()));
    pending_steps_ = ran;
    steps_run_ += ran;
    for (Slot& s : slots_) {
      if (Steps(s)) s.pos += static_cast<int32_t>(ran);
    }
    last_bucket_ = bucket;
    // The new ids of each stepping slot are the last `ran` of its tokens after the drain.
    SG_RETURN_IF_ERROR(Drain());
    left -= ran;
    if (!stop_ids.empty() && MarkStopped(ran, stop_ids, stopped)) break;
  }
  return absl::OkStatus();
}

bool DecodeSession::Impl::MarkStopped(int64_t steps, absl::Span<const int32_t> stop_ids,
                                      std::vector<bool>& stopped) const {
  bool all = true;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (!Steps(s)) continue;
    for (size_t k = s.tokens.size() - static_cast<size_t>(steps);
         k < s.tokens.size() && !stopped[i]; ++k) {
      stopped[i] = std::find(stop_ids.begin(), stop_ids.end(), s.tokens[k]) != stop_ids.end();
    }
    all = all && stopped[i];
  }
  return all;
}

absl::Status DecodeSession::Impl::Drain() {
  SG_RETURN_IF_ERROR(runner_->Sync());
  if (pending_steps_ == 0) return absl::OkStatus();
  for (int64_t k = 0; k < pending_steps_; ++k) {
    const int32_t* ids = ring_ + k * max_slots();
    for (int64_t i = 0; i < max_slots(); ++i) {
      if (Steps(slots_[i])) slots_[i].tokens.push_back(ids[i]);
    }
  }
  for (Slot& s : slots_) {
    if (Steps(s) && !s.tokens.empty()) s.pending = s.tokens.back();
  }
  pending_steps_ = 0;
  return absl::OkStatus();
}

absl::Status DecodeSession::Impl::AllocateHostPicks() {
  int64_t row_bytes = 0;
  for (const TensorArg& l : pick_from_) {
    row_bytes = std::max(row_bytes, l.shape.cols() * DTypeBytes(l.dtype));
  }
  SG_ASSIGN_OR_RETURN(void* logits,
                      runner_->AllocateHost(max_slots() * row_bytes, "logits chosen on the host"));
  SG_ASSIGN_OR_RETURN(void* picked,
                      runner_->AllocateHost(max_slots() * 4, "ids chosen on the host"));
  host_logits_ = static_cast<std::byte*>(logits);
  picked_ = static_cast<int32_t*>(picked);
  picker_ = std::make_unique<CpuDispatch>(CpuDispatch::Options{.threads = 1});
  return absl::OkStatus();
}

absl::Status DecodeSession::Impl::PickOnHost(int64_t bucket, int64_t ring_row) {
  bool any = false;
  for (const Slot& s : slots_) any = any || (Steps(s) && s.host_pick);
  if (!any) return absl::OkStatus();
  const TensorArg& l = pick_from_[bucket];
  const int64_t vocab = l.shape.cols();
  const int64_t row_bytes = vocab * DTypeBytes(l.dtype);
  for (int64_t i = 0; i < max_slots(); ++i) {
    if (!Steps(slots_[i]) || !slots_[i].host_pick) continue;
    SG_RETURN_IF_ERROR(runner_->Copy(host_logits_ + i * row_bytes,
                                     static_cast<const std::byte*>(l.data) + i * row_bytes,
                                     row_bytes));
  }
  // The logits and the step's ids in the ring are read here; the picked ids of the last
  // step were copied out by now.
  SG_RETURN_IF_ERROR(runner_->Sync());
  const InputBlock block(max_slots());
  int32_t* ring = ring_ + ring_row * max_slots();
  for (int64_t i = 0; i < max_slots(); ++i) {
    const Slot& s = slots_[i];
    if (!Steps(s) || !s.host_pick) continue;
    // The row as the step's own Argmax or Sample saw it: the position it fed, not yet
    // advanced on the host.
    int32_t seed = s.seed, pos = s.pos;
    const TensorArg inputs[] = {
        {.data = host_logits_ + i * row_bytes, .dtype = l.dtype, .shape = Shape{1, vocab}},
        {.data = &seed, .dtype = DType::kI32, .shape = Shape{1}},
        {.data = &pos, .dtype = DType::kI32, .shape = Shape{1}}};
    NodeArgs args;
    args.node_name = "host pick";
    args.inputs = inputs;
    args.output = {.data = picked_ + i, .dtype = DType::kI32, .shape = Shape{1}};
    if (s.sample.has_value()) {
      SG_RETURN_IF_ERROR(picker_->Run(*s.sample, args));
    } else {
      SG_RETURN_IF_ERROR(picker_->Run(ops::Argmax{}, args));
    }
    if (penalties_ && ring[i] != picked_[i]) {
      SG_RETURN_IF_ERROR(RecountHostPick(i, ring[i], picked_[i]));
    }
    ring[i] = picked_[i];
    SG_RETURN_IF_ERROR(runner_->Copy(inputs_ + block.ids() + i, picked_ + i, 4));
  }
  // A non-finite row raised the same flag in the step's own Argmax or Sample.
  picker_->TakeErrorFlags();
  return absl::OkStatus();
}

absl::Status DecodeSession::Impl::CheckErrorFlags() {
  SG_ASSIGN_OR_RETURN(uint32_t flags, runner_->TakeErrorFlags());
  // The flags gather every step since the last check: name them all, or the one.
  const int64_t first = steps_checked_ + 1, last = steps_run_;
  steps_checked_ = steps_run_;
  if (flags & kErrorNonFiniteLogits) {
    const std::string steps =
        first >= last ? absl::StrCat("decode step ", last)
                      : absl::StrCat("one of decode steps ", first, " to ", last);
    std::string where;
    for (int64_t i = 0; i < max_slots(); ++i) {
      if (!Steps(slots_[i])) continue;
      // Step `last` fed position pos - 1; step k fed pos - 1 - (last - k).
      const int64_t end = slots_[i].pos - 1, begin = end - (last - first);
      absl::StrAppend(&where, where.empty() ? "" : ", ", "slot ", i, " at position",
                      begin == end ? absl::StrCat(" ", end) : absl::StrCat("s ", begin, "-", end));
    }
    return absl::DataLossError(absl::StrCat(
        steps, " of this session (", where.empty() ? "no live slot" : where,
        ") produced logits holding NaN or infinity (device error flag kErrorNonFiniteLogits): "
        "the model's weights or activations are not finite; SessionOptions::check_weights "
        "scans the weights (block-format weights past f16's 65,504 overflow under "
        "CudaOptions::block_gemm_precision auto or f16: f32 computes them)"));
  }
  if (flags & kErrorTokenOutOfRange) {
    return absl::OutOfRangeError(absl::StrCat(
        "a step fed a token id outside the vocabulary [0, ", config_.vocab_size,
        "): the embedding wrote a zero row (device error flag kErrorTokenOutOfRange)"));
  }
  if (flags & kErrorPositionOutOfRange) {
    return absl::OutOfRangeError(absl::StrCat(
        "a step used a position at or beyond the KV cache's max_seq = ", max_seq_,
        " (device error flag kErrorPositionOutOfRange)"));
  }
  if (flags != 0) {
    return absl::InternalError(absl::StrCat("the device raised unknown error flags ", flags));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<int32_t>>> DecodeSession::Impl::Generate(
    int64_t n, absl::Span<const int32_t> stop_ids) {
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Generate: n must be >= 0, got ", n));
  }
  if (stop_ids.size() > StepRunner::kMaxLoopStopIds) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Generate: at most ", StepRunner::kMaxLoopStopIds, " stop ids, got ", stop_ids.size()));
  }
  if (HighestSteppingSlot() < 0) {
    return absl::FailedPreconditionError("Generate: no slot is live; Prefill one first");
  }
  SG_RETURN_IF_ERROR(CheckCapacity(n));
  std::vector<size_t> start(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    start[i] = slots_[i].tokens.size() +
               (Steps(slots_[i]) ? static_cast<size_t>(pending_steps_) : 0);
  }
  std::vector<bool> stopped(slots_.size(), false);
  if (n > 0 && DeviceLoopRuns()) {
    SG_RETURN_IF_ERROR(GenerateOnDevice(n, stop_ids, stopped));
  } else if (stop_ids.empty()) {
    for (int64_t i = 0; i < n; ++i) SG_RETURN_IF_ERROR(Step(nullptr));
  } else {
    // The host decides after every step, so it waits for each.
    for (int64_t i = 0; i < n; ++i) {
      SG_RETURN_IF_ERROR(Step(nullptr));
      SG_RETURN_IF_ERROR(Drain());
      if (MarkStopped(1, stop_ids, stopped)) break;
    }
  }
  SG_RETURN_IF_ERROR(Drain());
  SG_RETURN_IF_ERROR(CheckErrorFlags());
  std::vector<std::vector<int32_t>> out(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (Steps(slots_[i])) {
      out[i].assign(slots_[i].tokens.begin() + start[i], slots_[i].tokens.end());
    }
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> DecodeSession::Impl::Generate(int64_t slot, int64_t n) {
  SG_RETURN_IF_ERROR(CheckSlot(slot, "Generate"));
  if (!slots_[slot].live) {
    return absl::FailedPreconditionError(
        absl::StrCat("Generate: slot ", slot, " is not live; Prefill it first"));
  }
  SG_ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> all,
                      Generate(n, absl::Span<const int32_t>()));
  return std::move(all[slot]);
}

absl::StatusOr<std::vector<int32_t>> DecodeSession::Impl::Tokens(int64_t slot) {
  SG_RETURN_IF_ERROR(CheckSlot(slot, "Tokens"));
  SG_RETURN_IF_ERROR(Drain());
  return slots_[slot].tokens;
}

absl::StatusOr<std::vector<float>> DecodeSession::Impl::Logits(int64_t slot) {
  SG_RETURN_IF_ERROR(CheckSlot(slot, "Logits"));
  if (last_bucket_ < 0 || !Steps(slots_[slot])) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Logits: slot ", slot, " was not live in the last step (or no step ran since a Prefill)"));
  }
  SG_RETURN_IF_ERROR(Drain());
  const TensorArg& l = logits_[last_bucket_];
  const int64_t vocab = l.shape.cols();
  const int64_t row_bytes = vocab * DTypeBytes(l.dtype);
  std::vector<std::byte> host(static_cast<size_t>(row_bytes));
  SG_RETURN_IF_ERROR(
      runner_->Copy(host.data(), static_cast<const std::byte*>(l.data) + slot * row_bytes, row_bytes));
  SG_RETURN_IF_ERROR(runner_->Sync());
  return ToFloats(host.data(), l.dtype, vocab);
}

absl::StatusOr<std::vector<double>> DecodeSession::Impl::TimedSteps(int64_t n) {
  if (n < 1) {
    return absl::InvalidArgumentError(absl::StrCat("TimedSteps: n must be >= 1, got ", n));
  }
  if (HighestSteppingSlot() < 0) {
    return absl::FailedPreconditionError("TimedSteps: no slot is live; Prefill one first");
  }
  SG_RETURN_IF_ERROR(CheckCapacity(n));
  SG_RETURN_IF_ERROR(StartMarks(*runner_, n + 1));
  SG_RETURN_IF_ERROR(Mark(*runner_, 0));
  for (int64_t i = 0; i < n; ++i) {
    SG_RETURN_IF_ERROR(Step(nullptr));
    SG_RETURN_IF_ERROR(Mark(*runner_, i + 1));
  }
  SG_ASSIGN_OR_RETURN(std::vector<double> ms, MarkIntervalsMs(*runner_));
  SG_RETURN_IF_ERROR(Drain());
  SG_RETURN_IF_ERROR(CheckErrorFlags());
  return ms;
}

namespace {
// The nodes of `g` with the times ProfileNodes measured for them.
std::vector<NodeTime> NodeTimesOf(const Graph& g, const std::vector<double>& node_ms) {
  std::vector<NodeTime> out;
  out.reserve(node_ms.size());
  for (int32_t i = 0; i < g.num_nodes() && i < static_cast<int32_t>(node_ms.size()); ++i) {
    const Node& node = g.nodes()[i];
    out.push_back({i, node.name, std::string(OpName(node.op)), node_ms[i]});
  }
  return out;
}
}  // namespace

absl::StatusOr<std::vector<NodeTime>> DecodeSession::Impl::ProfileStep() {
  std::vector<double> node_ms;
  SG_RETURN_IF_ERROR(Step(&node_ms));
  SG_RETURN_IF_ERROR(Drain());
  SG_RETURN_IF_ERROR(CheckErrorFlags());
  return NodeTimesOf(runner_->plan(static_cast<int>(last_bucket_)).graph(), node_ms);
}

absl::StatusOr<std::vector<NodeTime>> DecodeSession::Impl::ProfilePrefill(
    const PrefillRequest& request) {
  std::vector<std::pair<int, std::vector<double>>> steps;
  prefill_profile_ = &steps;
  const absl::Status prefilled = Prefill(absl::MakeConstSpan(&request, 1));
  prefill_profile_ = nullptr;
  SG_RETURN_IF_ERROR(prefilled);
  SG_RETURN_IF_ERROR(CheckErrorFlags());
  // Per node name, in the order of first appearance: the prefill shapes' graphs come from
  // one builder, so a node of the last (shorter) step adds to its namesake of the first.
  std::vector<NodeTime> out;
  absl::flat_hash_map<std::string, size_t> index;
  for (const auto& [step, node_ms] : steps) {
    for (NodeTime& t : NodeTimesOf(runner_->plan(step).graph(), node_ms)) {
      const auto [at, added] = index.try_emplace(t.name, out.size());
      if (added) {
        out.push_back(std::move(t));
      } else {
        out[at->second].ms += t.ms;
      }
    }
  }
  return out;
}

// ---- DecodeSession: the public face, forwarding to Impl (to every rank's).

struct DecodeSession::Ranks {
  // Declared in the order they may be destroyed last: the threads end first, then the
  // ranks' sessions, then the group they met through.
  std::unique_ptr<CollectiveGroup> group;
  std::vector<std::unique_ptr<Impl>> others;  // ranks 1 .. N-1
  std::unique_ptr<RankThreads> threads;
};

namespace {

const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

}  // namespace

template <typename F>
auto DecodeSession::OnEveryRank(F f) -> decltype(f(std::declval<Impl&>())) {
  if (ranks_ == nullptr) return f(*impl_);
  using Result = decltype(f(std::declval<Impl&>()));
  std::optional<Result> first;
  const absl::Status status = ranks_->threads->ForEach([&](int r) -> absl::Status {
    if (r == 0) {
      first.emplace(f(*impl_));
      return StatusOf(*first);
    }
    return StatusOf(f(*ranks_->others[static_cast<size_t>(r - 1)]));
  });
  if (!status.ok()) return status;
  return *std::move(first);
}

DecodeSession::DecodeSession(std::unique_ptr<Impl> impl, std::unique_ptr<Ranks> ranks)
    : ranks_(std::move(ranks)), impl_(std::move(impl)) {}
DecodeSession::~DecodeSession() = default;

absl::StatusOr<std::unique_ptr<DecodeSession>> DecodeSession::Create(
    const SessionOptions& options) {
  const int n = options.tensor_parallel;
  if (n < 1 || n > ops::kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session: tensor_parallel must be in [1, ", ops::kMaxRanks, "], got ", n));
  }
  // Init of one rank: no allocation failure escapes (a model too large for this machine is
  // an error, not a crash).
  auto InitRank = [](Impl& impl, const SessionOptions& o, int rank,
                     CollectiveGroup* group) -> absl::Status {
    try {
      return impl.Init(o, rank, group);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(
          "session: out of host memory while loading the model and building its steps");
    }
  };
  if (n == 1) {
    auto impl = std::make_unique<Impl>();
    SG_RETURN_IF_ERROR(InitRank(*impl, options, 0, nullptr));
    return std::unique_ptr<DecodeSession>(new DecodeSession(std::move(impl), nullptr));
  }
  // Every rank's session is made at once: their captures record the collectives together.
  // The group outlives rank 0's runner on every path (declared first, destroyed last).
  auto ranks = std::make_unique<Ranks>();
  auto impl = std::make_unique<Impl>();
  const bool cuda = options.backend == Backend::kCuda ||
                    (options.backend == Backend::kAuto && CudaDeviceFound());
  if (cuda) {
    SG_ASSIGN_OR_RETURN(ranks->group, MakeCudaCollectives(n));
  } else {
    ranks->group = std::make_unique<HostCollectives>(n);
  }
  for (int r = 1; r < n; ++r) ranks->others.push_back(std::make_unique<Impl>());
  ranks->threads = std::make_unique<RankThreads>(n, ranks->group.get());
  SG_RETURN_IF_ERROR(ranks->threads->ForEach([&](int r) {
    return InitRank(r == 0 ? *impl : *ranks->others[static_cast<size_t>(r - 1)], options, r,
                    ranks->group.get());
  }));
  return std::unique_ptr<DecodeSession>(new DecodeSession(std::move(impl), std::move(ranks)));
}

// What every rank holds alike (the config, the buckets, the ids chosen) comes from rank 0;
// the sizes of weights and KV cache are rank 0's share.
Backend DecodeSession::backend() const { return impl_->backend(); }
std::string DecodeSession::Describe() const { return impl_->Describe(); }
const LlamaConfig& DecodeSession::config() const { return impl_->config(); }
const std::vector<int32_t>& DecodeSession::stop_ids() const { return impl_->stop_ids(); }
int64_t DecodeSession::max_slots() const { return impl_->max_slots(); }
int64_t DecodeSession::max_seq() const { return impl_->max_seq(); }
const std::vector<int64_t>& DecodeSession::buckets() const { return impl_->buckets(); }
int64_t DecodeSession::weight_bytes() const { return impl_->weight_bytes(); }
int64_t DecodeSession::kv_cache_bytes() const { return impl_->kv_cache_bytes(); }
const ExecutionPlan* DecodeSession::plan(int64_t bucket) const { return impl_->plan(bucket); }
bool DecodeSession::eager() const { return impl_->eager(); }
StepRunner& DecodeSession::runner() { return impl_->runner(); }

absl::Status DecodeSession::Prefill(int64_t slot, absl::Span<const int32_t> prompt,
                                    int32_t seed) {
  const PrefillRequest request{slot, prompt, seed};
  return OnEveryRank([&](Impl& i) { return i.Prefill(absl::MakeConstSpan(&request, 1)); });
}
absl::Status DecodeSession::Prefill(absl::Span<const PrefillRequest> requests) {
  return OnEveryRank([&](Impl& i) { return i.Prefill(requests); });
}
int64_t DecodeSession::prefill_steps() const { return impl_->prefill_steps(); }
int64_t DecodeSession::prefill_chunk() const { return impl_->prefill_chunk(); }
absl::Status DecodeSession::Append(int64_t slot, absl::Span<const int32_t> tokens) {
  return OnEveryRank([&](Impl& i) { return i.Append(slot, tokens); });
}
absl::Status DecodeSession::Release(int64_t slot) {
  return OnEveryRank([&](Impl& i) { return i.Release(slot); });
}
bool DecodeSession::live(int64_t slot) const { return impl_->live(slot); }
absl::Status DecodeSession::Hold(int64_t slot) {
  return OnEveryRank([&](Impl& i) { return i.Hold(slot, true); });
}
absl::Status DecodeSession::Resume(int64_t slot) {
  return OnEveryRank([&](Impl& i) { return i.Hold(slot, false); });
}
bool DecodeSession::held(int64_t slot) const { return impl_->held(slot); }
absl::Status DecodeSession::MoveSlot(int64_t from, int64_t to) {
  return OnEveryRank([&](Impl& i) { return i.MoveSlot(from, to); });
}
int64_t DecodeSession::position(int64_t slot) const { return impl_->position(slot); }
absl::Status DecodeSession::Step() {
  return OnEveryRank([&](Impl& i) { return i.Step(nullptr); });
}
absl::StatusOr<std::vector<std::vector<int32_t>>> DecodeSession::Generate(int64_t n) {
  return OnEveryRank([&](Impl& i) { return i.Generate(n, absl::Span<const int32_t>()); });
}
absl::StatusOr<std::vector<std::vector<int32_t>>> DecodeSession::Generate(
    int64_t n, absl::Span<const int32_t> stop_ids) {
  return OnEveryRank([&](Impl& i) { return i.Generate(n, stop_ids); });
}
absl::StatusOr<std::vector<int32_t>> DecodeSession::Generate(int64_t slot, int64_t n) {
  return OnEveryRank([&](Impl& i) { return i.Generate(slot, n); });
}
// Reading ids drains each rank's ring of recorded ids, so every rank reads.
absl::StatusOr<std::vector<int32_t>> DecodeSession::Tokens(int64_t slot) {
  return OnEveryRank([&](Impl& i) { return i.Tokens(slot); });
}
absl::StatusOr<std::vector<float>> DecodeSession::Logits(int64_t slot) {
  return OnEveryRank([&](Impl& i) { return i.Logits(slot); });
}
absl::StatusOr<std::vector<double>> DecodeSession::TimedSteps(int64_t n) {
  return OnEveryRank([&](Impl& i) { return i.TimedSteps(n); });
}
absl::StatusOr<std::vector<NodeTime>> DecodeSession::ProfileStep() {
  return OnEveryRank([&](Impl& i) { return i.ProfileStep(); });
}
absl::StatusOr<std::vector<NodeTime>> DecodeSession::ProfilePrefill(
    int64_t slot, absl::Span<const int32_t> prompt, int32_t seed) {
  const PrefillRequest request{slot, prompt, seed};
  return OnEveryRank([&](Impl& i) { return i.ProfilePrefill(request); });
}

}  // namespace sg
