// DecodeSession's slot bookkeeping, which is the same on every backend, and the CPU
// reference backend. The session keeps, per slot, the position of the id the next step
// feeds; the ids themselves travel on the device in the closed loop and reach the host
// through the id ring, which is drained only where the caller asks for ids or the live
// set changes.
#include "models/session.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/session_backend.h"
#include "stepgraph/capture_policy.h"
#include "stepgraph/cpu_dispatch.h"
#include "stepgraph/error_flags.h"
#include "stepgraph/half.h"
#include "stepgraph/status.h"

namespace sg {

namespace internal {

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

std::vector<float> ToFloats(const void* data, DType dtype, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = LoadElement(data, dtype, i);
  return out;
}

namespace {

// The CPU reference: host buffers everywhere, Execute with CpuDispatch, nothing deferred,
// so Commit, Sync and the id ring are plain copies.
class CpuBackend final : public StepBackend {
 public:
  explicit CpuBackend(int64_t rows) : block_(rows) {}

  absl::Status Init(BackendSetup& setup) {
    rows_ = setup.buckets.back();
    max_seq_ = setup.max_seq;
    int64_t arena_bytes = 0;
    for (Graph& g : setup.graphs) {
      SG_ASSIGN_OR_RETURN(ExecutionPlan plan, ExecutionPlan::Create(std::move(g)));
      plans_.push_back(std::make_unique<ExecutionPlan>(std::move(plan)));
      arena_bytes = std::max(arena_bytes, plans_.back()->arena_bytes());
    }
    const Graph& largest = plans_.back()->graph();
    kv_layout_ = LayoutBuffers(largest, TensorKind::kState);
    SG_ASSIGN_OR_RETURN(kv_, AlignedHostBuffer::Allocate(kv_layout_.total_bytes, "the KV cache"));
    std::memset(kv_.data(), 0, static_cast<size_t>(kv_.size()));
    SG_ASSIGN_OR_RETURN(arena_, AlignedHostBuffer::Allocate(arena_bytes, "the step arena"));
    inputs_.assign(static_cast<size_t>(block_.ints()), 0);
    for (int64_t r = 0; r < block_.rows; ++r) inputs_[block_.pos() + r] = -1;
    rows_staging_[0].assign(inputs_.size(), 0);
    rows_staging_[1].assign(inputs_.size(), 0);
    prompt_staging_.assign(static_cast<size_t>(max_seq_), 0);
    prompt_.assign(static_cast<size_t>(max_seq_), 0);
    ring_.assign(static_cast<size_t>(setup.ring_steps * rows_), 0);

    for (const auto& plan : plans_) {
      const Graph& g = plan->graph();
      auto b = std::make_unique<Bindings>(g);
      if (setup.mapped != nullptr) {
        SG_RETURN_IF_ERROR(BindMappedWeights(*setup.mapped, g, *b));
      } else if (setup.random != nullptr) {
        SG_RETURN_IF_ERROR(setup.random->Bind(g, *b));
      } else {
        return absl::InternalError("session: the CPU backend was given no weights");
      }
      SG_RETURN_IF_ERROR(BindLayout(g, TensorKind::kState, kv_layout_, kv_.data(), *b));
      SG_RETURN_IF_ERROR(BindInputBlock(g, block_, inputs_.data(), *b));
      b->SetArena(arena_.data(), arena_.size());
      SG_RETURN_IF_ERROR(CheckBindings(*plan, *b));
      SG_RETURN_IF_ERROR(dispatch_.Prepare(*plan));
      SG_ASSIGN_OR_RETURN(TensorId next, g.FindOutput(kNextIdsOutput));
      SG_ASSIGN_OR_RETURN(TensorId logits, g.FindOutput(kLogitsOutput));
      next_.push_back(ResolveTensor(*plan, *b, next.index));
      logits_.push_back(ResolveTensor(*plan, *b, logits.index));
      bindings_.push_back(std::move(b));
    }
    return absl::OkStatus();
  }

  std::string Describe() const override { return "cpu (the f32 reference, CpuDispatch)"; }
  bool captured() const override { return false; }
  const ExecutionPlan& plan(int64_t i) const override { return *plans_[i]; }
  int64_t kv_cache_bytes() const override { return kv_layout_.total_bytes; }

  int32_t* staging(Staging area) override {
    switch (area) {
      case Staging::kPrefillRows:
        return rows_staging_[0].data();
      case Staging::kStepRows:
        return rows_staging_[1].data();
      case Staging::kPrompt:
        return prompt_staging_.data();
    }
    return nullptr;
  }
  absl::Status Commit(Staging area, int64_t count) override {
    if (area == Staging::kPrompt) {
      std::copy_n(prompt_staging_.begin(), count, prompt_.begin());
    } else {
      const int32_t* src = staging(area);
      std::copy_n(src, inputs_.size(), inputs_.begin());
    }
    return absl::OkStatus();
  }
  absl::Status FeedPromptToken(int64_t row, int64_t t) override {
    inputs_[block_.ids() + row] = prompt_[t];
    return absl::OkStatus();
  }
  absl::Status RunStep(int64_t i, bool eager, std::vector<double>* node_ms) override {
    if (node_ms == nullptr) return Execute(*plans_[i], *bindings_[i], dispatch_).status();
    using Clock = std::chrono::steady_clock;
    node_ms->assign(plans_[i]->graph().num_nodes(), 0.0);
    Clock::time_point last = Clock::now();
    ExecOptions options;
    options.after_node = [&](int32_t node) {
      const Clock::time_point now = Clock::now();
      (*node_ms)[node] = std::chrono::duration<double, std::milli>(now - last).count();
      last = now;
      return absl::OkStatus();
    };
    return Execute(*plans_[i], *bindings_[i], dispatch_, options).status();
  }
  absl::Status RecordIds(int64_t i, int64_t k) override {
    std::memcpy(ring_.data() + k * rows_, next_[i].data,
                static_cast<size_t>(next_[i].bytes()));
    return absl::OkStatus();
  }
  const int32_t* ring(int64_t k) const override { return ring_.data() + k * rows_; }
  absl::Status Sync() override { return absl::OkStatus(); }
  absl::StatusOr<uint32_t> TakeErrorFlags() override { return dispatch_.TakeErrorFlags(); }
  absl::StatusOr<std::vector<float>> ReadLogits(int64_t i, int64_t row) override {
    const TensorArg& l = logits_[i];
    const int64_t vocab = l.shape.cols();
    return ToFloats(static_cast<const std::byte*>(l.data) + row * vocab * DTypeBytes(l.dtype),
                    l.dtype, vocab);
  }

  absl::Status StartMarks(int64_t n) override {
    marks_.assign(static_cast<size_t>(n), {});
    return absl::OkStatus();
  }
  absl::Status Mark(int64_t i) override {
    marks_[i] = std::chrono::steady_clock::now();
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<double>> MarkIntervalsMs() override {
    std::vector<double> ms;
    for (size_t i = 1; i < marks_.size(); ++i) {
      ms.push_back(std::chrono::duration<double, std::milli>(marks_[i] - marks_[i - 1]).count());
    }
    return ms;
  }

 private:
  InputBlock block_;
  int64_t rows_ = 0;
  int64_t max_seq_ = 0;
  std::vector<std::unique_ptr<ExecutionPlan>> plans_;
  std::vector<std::unique_ptr<Bindings>> bindings_;
  std::vector<TensorArg> next_, logits_;
  BufferLayout kv_layout_;
  AlignedHostBuffer kv_, arena_;
  std::vector<int32_t> inputs_;
  std::vector<int32_t> rows_staging_[2];
  std::vector<int32_t> prompt_staging_, prompt_;
  std::vector<int32_t> ring_;
  CpuDispatch dispatch_;
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StepBackend>> MakeCpuBackend(BackendSetup setup) {
  auto backend = std::make_unique<CpuBackend>(setup.buckets.back());
  SG_RETURN_IF_ERROR(backend->Init(setup));
  return std::unique_ptr<StepBackend>(std::move(backend));
}

}  // namespace internal

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

bool BuiltWithCuda() {
#if STEPGRAPH_HAS_CUDA
  return true;
#else
  return false;
#endif
}

bool CudaBackendAvailable() {
#if STEPGRAPH_HAS_CUDA
  return internal::CudaDeviceFound();
#else
  return false;
#endif
}

#if !STEPGRAPH_HAS_CUDA
absl::StatusOr<double> MeasureDeviceCopyBandwidth(int64_t, int) {
  return absl::UnimplementedError("device copy bandwidth: this build of stepgraph has no CUDA");
}
#endif

namespace {

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

}  // namespace

DecodeSession::~DecodeSession() = default;

absl::StatusOr<std::unique_ptr<DecodeSession>> DecodeSession::Create(
    const SessionOptions& options) {
  std::unique_ptr<DecodeSession> s(new DecodeSession());
  if (!options.model_dir.empty()) {
    SG_ASSIGN_OR_RETURN(ModelWeights weights, ModelWeights::Open(options.model_dir));
    s->mapped_.emplace(std::move(weights));
    s->config_ = s->mapped_->config();
  } else {
    SG_RETURN_IF_ERROR(options.config.Validate());
    s->config_ = options.config;
  }

  Backend backend = options.backend;
  if (backend == Backend::kAuto) backend = CudaBackendAvailable() ? Backend::kCuda : Backend::kCpu;
  if (backend == Backend::kCuda && !BuiltWithCuda()) {
    return absl::FailedPreconditionError(
        "session: the CUDA backend was asked for, but this build of stepgraph has no CUDA "
        "(configure with -DSTEPGRAPH_WITH_CUDA=ON)");
  }
  if (backend == Backend::kCuda && !CudaBackendAvailable()) {
    return absl::FailedPreconditionError(
        "session: the CUDA backend was asked for, but no CUDA device is available");
  }
  s->backend_ = backend;

  const int64_t max_pos = s->config_.max_position_embeddings;
  if (options.max_slots < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("session: max_slots must be >= 1, got ", options.max_slots));
  }
  s->max_seq_ = options.max_seq == 0 ? std::min<int64_t>(max_pos, 4096) : options.max_seq;
  if (s->max_seq_ < 1 || s->max_seq_ > max_pos) {
    return absl::InvalidArgumentError(
        absl::StrCat("session: max_seq must be in [1, max_position_embeddings = ", max_pos,
                     "] (0: min(max_position_embeddings, 4096)), got ", options.max_seq));
  }
  if (options.id_ring_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("session: id_ring_steps must be >= 1, got ", options.id_ring_steps));
  }
  s->ring_steps_ = options.id_ring_steps;
  if (absl::Status st = ValidateBuckets(options.buckets); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("session: buckets: ", st.message()));
  }
  for (int64_t b : options.buckets) {
    if (b < options.max_slots) s->buckets_.push_back(b);
  }
  s->buckets_.push_back(options.max_slots);
  if (options.sampling.has_value()) SG_RETURN_IF_ERROR(CheckSampling(*options.sampling));

  internal::BackendSetup setup;
  setup.config = s->config_;
  setup.buckets = s->buckets_;
  setup.max_seq = s->max_seq_;
  setup.ring_steps = s->ring_steps_;
  setup.eager = options.eager;
  setup.weight_threads = options.weight_threads;
  setup.weight_seed = options.weight_seed;
  for (int64_t bucket : s->buckets_) {
    LlamaGraphOptions g;
    g.batch = bucket;
    g.slots = options.max_slots;
    g.max_seq = s->max_seq_;
    g.sampling = options.sampling;
    g.closed_loop = true;
    SG_ASSIGN_OR_RETURN(Graph graph, BuildLlamaDecodeGraph(s->config_, g));
    setup.graphs.push_back(std::move(graph));
  }
  if (s->mapped_.has_value()) {
    SG_RETURN_IF_ERROR(CheckWeightsAgainstGraph(*s->mapped_, setup.graphs.back()));
    setup.mapped = &*s->mapped_;
  }

  if (backend == Backend::kCuda) {
#if STEPGRAPH_HAS_CUDA
    SG_ASSIGN_OR_RETURN(s->impl_, internal::MakeCudaBackend(std::move(setup)));
    // The device has its own copy; the mapping is not needed any more.
    s->mapped_.reset();
#endif
  } else {
    if (!s->mapped_.has_value()) {
      SG_ASSIGN_OR_RETURN(RandomWeights random,
                          RandomWeights::Create(setup.graphs.back(), options.weight_seed,
                                                options.weight_threads));
      s->random_.emplace(std::move(random));
      setup.random = &*s->random_;
    }
    SG_ASSIGN_OR_RETURN(s->impl_, internal::MakeCpuBackend(std::move(setup)));
  }
  s->captured_ = s->impl_->captured();
  s->eager_ = !s->captured_;
  s->slots_.resize(static_cast<size_t>(options.max_slots));
  // A slot yields at most max_seq ids per sequence; reserving them keeps Drain, and so
  // the step path, free of allocation.
  for (Slot& slot : s->slots_) slot.tokens.reserve(static_cast<size_t>(s->max_seq_));
  return s;
}

std::string DecodeSession::Describe() const {
  return absl::StrCat(impl_->Describe(), eager_ ? ", eager" : ", replayed CUDA graphs",
                      "; buckets ", absl::StrJoin(buckets_, ","), ", max_seq ", max_seq_);
}

int64_t DecodeSession::kv_cache_bytes() const { return impl_->kv_cache_bytes(); }

const ExecutionPlan* DecodeSession::plan(int64_t bucket) const {
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (buckets_[i] == bucket) return &impl_->plan(static_cast<int64_t>(i));
  }
  return nullptr;
}

absl::Status DecodeSession::SetEager(bool eager) {
  if (!eager && !captured_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session: cannot replay captured steps: ",
        backend_ == Backend::kCpu ? "the CPU backend runs every step eagerly"
                                  : "this session was made eager (or STEPGRAPH_EAGER=1), "
                                    "so nothing was captured"));
  }
  eager_ = eager;
  return absl::OkStatus();
}

bool DecodeSession::live(int64_t slot) const {
  return slot >= 0 && slot < max_slots() && slots_[slot].live;
}

int64_t DecodeSession::position(int64_t slot) const {
  return live(slot) ? slots_[slot].pos : -1;
}

absl::Status DecodeSession::CheckSlot(int64_t slot, absl::string_view what) const {
  if (slot >= 0 && slot < max_slots()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": slot ", slot,
                                                 " is out of range; the session has ",
                                                 max_slots(), " slot(s) (SessionOptions::max_slots)"));
}

int64_t DecodeSession::HighestLiveSlot() const {
  for (int64_t s = max_slots() - 1; s >= 0; --s) {
    if (slots_[s].live) return s;
  }
  return -1;
}

int64_t DecodeSession::BucketFor(int64_t rows) const {
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (buckets_[i] >= rows) return static_cast<int64_t>(i);
  }
  return static_cast<int64_t>(buckets_.size()) - 1;  // rows <= max_slots always
}

absl::Status DecodeSession::CheckCapacity(int64_t steps) const {
  for (int64_t s = 0; s < max_slots(); ++s) {
    const Slot& slot = slots_[s];
    if (!slot.live || slot.pos + steps <= max_seq_) continue;
    return absl::OutOfRangeError(absl::StrCat(
        "slot ", s, " is at position ", slot.pos, ": its KV cache (max_seq = ", max_seq_,
        ") has room for ", max_seq_ - slot.pos, " more step(s), ", steps,
        " were asked for; make the session with a larger max_seq"));
  }
  return absl::OkStatus();
}

absl::Status DecodeSession::Prefill(int64_t slot, absl::Span<const int32_t> prompt,
                                    int32_t seed) {
  SG_RETURN_IF_ERROR(CheckSlot(slot, "Prefill"));
  const int64_t n = static_cast<int64_t>(prompt.size());
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
    if (prompt[i] < 0 || prompt[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("Prefill(slot ", slot, "): prompt token ", i, " is id ", prompt[i],
                       ", outside the vocabulary [0, ", config_.vocab_size, ")"));
    }
  }
  SG_RETURN_IF_ERROR(Drain());
  Slot& s = slots_[slot];
  s.live = false;
  s.tokens.clear();
  inputs_dirty_ = true;
  last_bucket_ = -1;
  if (n > 1) {
    // Every row but this slot's is padding while the prompt goes in; the closed loop
    // advances the slot's position, and each later prompt id is copied into its row on
    // the device from the prompt uploaded once.
    const internal::InputBlock block(max_slots());
    int32_t* rows = impl_->staging(internal::Staging::kPrefillRows);
    std::fill_n(rows, block.ints(), 0);
    std::fill_n(rows + block.pos(), block.rows, -1);
    rows[block.ids() + slot] = prompt[0];
    rows[block.pos() + slot] = 0;
    rows[block.seeds() + slot] = seed;
    SG_RETURN_IF_ERROR(impl_->Commit(internal::Staging::kPrefillRows, block.ints()));
    std::copy_n(prompt.data(), n, impl_->staging(internal::Staging::kPrompt));
    SG_RETURN_IF_ERROR(impl_->Commit(internal::Staging::kPrompt, n));
    const int64_t bucket = BucketFor(slot + 1);
    for (int64_t t = 0; t + 1 < n; ++t) {
      if (t > 0) SG_RETURN_IF_ERROR(impl_->FeedPromptToken(slot, t));
      SG_RETURN_IF_ERROR(impl_->RunStep(bucket, eager_, nullptr));
    }
  }
  s.live = true;
  s.pos = static_cast<int32_t>(n - 1);
  s.pending = prompt[n - 1];
  s.seed = seed;
  return absl::OkStatus();
}

absl::Status DecodeSession::Release(int64_t slot) {
  SG_RETURN_IF_ERROR(CheckSlot(slot, "Release"));
  SG_RETURN_IF_ERROR(Drain());
  slots_[slot].live = false;
  slots_[slot].pos = -1;
  inputs_dirty_ = true;
  return absl::OkStatus();
}

absl::Status DecodeSession::Step() { return StepImpl(nullptr); }

absl::Status DecodeSession::StepImpl(std::vector<double>* node_ms) {
  const int64_t highest = HighestLiveSlot();
  if (highest < 0) {
    return absl::FailedPreconditionError("Step: no slot is live; Prefill one first");
  }
  SG_RETURN_IF_ERROR(CheckCapacity(1));
  if (pending_steps_ == ring_steps_) SG_RETURN_IF_ERROR(Drain());
  const int64_t bucket = BucketFor(highest + 1);
  if (inputs_dirty_) {
    // The live set changed, which drained: the host knows every live slot's next id.
    const internal::InputBlock block(max_slots());
    int32_t* rows = impl_->staging(internal::Staging::kStepRows);
    std::fill_n(rows, block.ints(), 0);
    std::fill_n(rows + block.pos(), block.rows, -1);
    for (int64_t i = 0; i < max_slots(); ++i) {
      const Slot& s = slots_[i];
      if (!s.live) continue;
      rows[block.ids() + i] = s.pending;
      rows[block.pos() + i] = s.pos;
      rows[block.seeds() + i] = s.seed;
    }
    SG_RETURN_IF_ERROR(impl_->Commit(internal::Staging::kStepRows, block.ints()));
    inputs_dirty_ = false;
  }
  SG_RETURN_IF_ERROR(impl_->RunStep(bucket, eager_ || node_ms != nullptr, node_ms));
  SG_RETURN_IF_ERROR(impl_->RecordIds(bucket, pending_steps_));
  ++pending_steps_;
  for (Slot& s : slots_) {
    if (s.live) ++s.pos;
  }
  last_bucket_ = bucket;
  return absl::OkStatus();
}

absl::Status DecodeSession::Drain() {
  SG_RETURN_IF_ERROR(impl_->Sync());
  if (pending_steps_ == 0) return absl::OkStatus();
  for (int64_t k = 0; k < pending_steps_; ++k) {
    const int32_t* ids = impl_->ring(k);
    for (int64_t i = 0; i < max_slots(); ++i) {
      if (slots_[i].live) slots_[i].tokens.push_back(ids[i]);
    }
  }
  for (Slot& s : slots_) {
    if (s.live && !s.tokens.empty()) s.pending = s.tokens.back();
  }
  pending_steps_ = 0;
  return absl::OkStatus();
}

absl::Status DecodeSession::CheckErrorFlags() {
  SG_ASSIGN_OR_RETURN(uint32_t flags, impl_->TakeErrorFlags());
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

absl::StatusOr<std::vector<std::vector<int32_t>>> DecodeSession::Generate(int64_t n) {
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Generate: n must be >= 0, got ", n));
  }
  if (HighestLiveSlot() < 0) {
    return absl::FailedPreconditionError("Generate: no slot is live; Prefill one first");
  }
  SG_RETURN_IF_ERROR(CheckCapacity(n));
  std::vector<size_t> start(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    start[i] = slots_[i].tokens.size() + static_cast<size_t>(pending_steps_);
  }
  for (int64_t i = 0; i < n; ++i) SG_RETURN_IF_ERROR(StepImpl(nullptr));
  SG_RETURN_IF_ERROR(Drain());
  SG_RETURN_IF_ERROR(CheckErrorFlags());
  std::vector<std::vector<int32_t>> out(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].live) out[i].assign(slots_[i].tokens.begin() + start[i], slots_[i].tokens.end());
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> DecodeSession::Generate(int64_t slot, int64_t n) {
  SG_RETURN_IF_ERROR(CheckSlot(slot, "Generate"));
  if (!slots_[slot].live) {
    return absl::FailedPreconditionError(
        absl::StrCat("Generate: slot ", slot, " is not live; Prefill it first"));
  }
  SG_ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> all, Generate(n));
  return std::move(all[slot]);
}

absl::StatusOr<std::vector<int32_t>> DecodeSession::Tokens(int64_t slot) {
  SG_RETURN_IF_ERROR(CheckSlot(slot, "Tokens"));
  SG_RETURN_IF_ERROR(Drain());
  return slots_[slot].tokens;
}

absl::StatusOr<std::vector<float>> DecodeSession::Logits(int64_t slot) {
  SG_RETURN_IF_ERROR(CheckSlot(slot, "Logits"));
  if (last_bucket_ < 0 || !slots_[slot].live) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Logits: slot ", slot, " was not live in the last step (or no step ran since a Prefill)"));
  }
  SG_RETURN_IF_ERROR(Drain());
  return impl_->ReadLogits(last_bucket_, slot);
}

absl::StatusOr<std::vector<double>> DecodeSession::TimedSteps(int64_t n) {
  if (n < 1) {
    return absl::InvalidArgumentError(absl::StrCat("TimedSteps: n must be >= 1, got ", n));
  }
  if (HighestLiveSlot() < 0) {
    return absl::FailedPreconditionError("TimedSteps: no slot is live; Prefill one first");
  }
  SG_RETURN_IF_ERROR(CheckCapacity(n));
  SG_RETURN_IF_ERROR(impl_->StartMarks(n + 1));
  SG_RETURN_IF_ERROR(impl_->Mark(0));
  for (int64_t i = 0; i < n; ++i) {
    SG_RETURN_IF_ERROR(StepImpl(nullptr));
    SG_RETURN_IF_ERROR(impl_->Mark(i + 1));
  }
  SG_ASSIGN_OR_RETURN(std::vector<double> ms, impl_->MarkIntervalsMs());
  SG_RETURN_IF_ERROR(Drain());
  SG_RETURN_IF_ERROR(CheckErrorFlags());
  return ms;
}

absl::StatusOr<std::vector<NodeTime>> DecodeSession::ProfileStep() {
  std::vector<double> node_ms;
  SG_RETURN_IF_ERROR(StepImpl(&node_ms));
  SG_RETURN_IF_ERROR(Drain());
  SG_RETURN_IF_ERROR(CheckErrorFlags());
  const Graph& g = impl_->plan(last_bucket_).graph();
  std::vector<NodeTime> out;
  out.reserve(node_ms.size());
  for (int32_t i = 0; i < g.num_nodes() && i < static_cast<int32_t>(node_ms.size()); ++i) {
    const Node& node = g.nodes()[i];
    out.push_back({i, node.name, std::string(OpName(node.op)), node_ms[i]});
  }
  return out;
}

}  // namespace sg
