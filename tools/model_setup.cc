// The model and session setup shared by the program's commands; see model_setup.h.
#include "tools/model_setup.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <thread>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/model_files.h"
#include "stepgraph/base/dtype.h"
#include "stepgraph/base/status.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/memory_plan.h"
#include "tools/console.h"

namespace sg::cli {

absl::StatusOr<LlamaConfig> ModelConfig(const Options& o) {
  if (!o.model.empty()) {
    absl::StatusOr<LlamaConfig> c = ModelFiles::ReadConfig(o.model);
    if (c.ok() && o.verbose && !c->metadata_keys.empty()) {
      std::fprintf(stderr, "stepgraph: config.json fields accepted as metadata (unused): %s\n",
                   absl::StrJoin(c->metadata_keys, ", ").c_str());
    }
    return c;
  }
  return PresetConfig(o.preset);
}

LlamaConfig PresetConfig(const std::string& preset) {
  if (preset == "llama-3.2-1b") return Llama32_1BConfig();
  if (preset == "llama-3.1-8b") return Llama31_8BConfig();
  if (preset == "llama-3.1-70b") return Llama31_70BConfig();
  return TinyLlamaConfig();
}

std::string ModelName(const Options& o) {
  if (!o.model.empty()) return o.model;
  return absl::StrCat(o.preset, " (random weights, seed ", o.weight_seed, ")");
}

std::string ModelHint(const Options& o, ModelPart part) {
  if (o.model.empty()) return HelpHint(o.command);
  std::error_code ec;
  if (std::filesystem::is_directory(o.model, ec)) {
    return part == ModelPart::kTokenizer
               ? "a model folder keeps its tokenizer and chat template in tokenizer.json and "
                 "tokenizer_config.json"
               : "a model folder needs config.json and its *.safetensors";
  }
  return part == ModelPart::kTokenizer
             ? "a GGUF file keeps its tokenizer and chat template in its tokenizer.* metadata"
             : "--model FILE takes a GGUF file of a Llama-family model (F32, F16, BF16, Q8_0, "
               "Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K weights); a folder takes "
               "config.json and *.safetensors";
}

int ModelFailure(const Options& o, const absl::Status& status, ModelPart part) {
  if (status.code() == absl::StatusCode::kResourceExhausted) {
    return Failure(status, "ask for less memory: a smaller --max-seq or --batch");
  }
  return Failure(status, ModelHint(o, part));
}

// On the GPU, for a model with block-format (GGUF) weights: how their matmuls meet x at
// prefill and at decode, which the times printed after depend on ("" otherwise).
std::string BlockPrecisions(const Options& o, const DecodeSession& s) {
  if (s.backend() != Backend::kCuda || s.buckets().empty()) return "";
  const ExecutionPlan* plan = s.plan(s.buckets().front());
  if (plan == nullptr || !s.config().HasBlockWeights()) return "";
  const BlockGemmPrecision gemm = o.cuda.block_gemm_precision;
  const std::vector<Node>& nodes = plan->graph().nodes();
  const bool experts = std::any_of(nodes.begin(), nodes.end(), [&](const Node& n) {
    return std::holds_alternative<ops::MoeMatMul>(n.op) && n.inputs.size() > 1 &&
           IsQuantized(plan->graph().tensor(n.inputs[1]).dtype);
  });
  return absl::StrCat(
      "; block-format matmuls' x: ", BlockGemmPrecisionName(gemm),
      gemm == BlockGemmPrecision::kAuto
          ? absl::StrCat(" (f16 from ", kBlockGemmAutoF16Rows, " rows, f32 below)")
          : std::string(),
      " on the tensor cores, ", BlockGemvPrecisionName(o.cuda.block_gemv_precision),
      " at one row",
      !experts                 ? ""
      : o.cuda.moe_block_mma ? "; prompts' experts on the tensor cores"
                             : "; prompts' experts by expert on the CUDA cores (--no-moe-mma)",
      // The session's own resolution of --prefill-attention for this model (block weights).
      s.config().dtype != DType::kF32 ? ""
      : ResolvePrefillAttention(o.cuda, true) == PrefillAttentionPrecision::kF16
          ? "; prompts' attention in f16 on the tensor cores"
          : "; prompts' attention in f32 on the CUDA cores");
}

std::string DescribePath(const Options& o, DecodeSession& s) {
  std::string path;
  if (s.backend() == Backend::kCpu) {
    // The CPU runs every step node by node, one step per token, always: only what it
    // computes with is worth saying.
    const int64_t threads =
        o.threads > 0 ? o.threads : static_cast<int64_t>(std::thread::hardware_concurrency());
    path = absl::StrCat("the CPU reference (f32 math, ", threads,
                        threads == 1 ? " thread)" : " threads)");
  } else {
    path = absl::StrCat(s.runner().Describe(), "; batch buckets ", absl::StrJoin(s.buckets(), ","));
  }
  const int64_t slots = s.max_slots();
  const int64_t ranks = std::max<int64_t>(o.tensor_parallel, 1);
  if (ranks > 1) {
    absl::StrAppend(&path, "; tensor parallel over ", ranks,
                    s.backend() == Backend::kCpu ? " ranks (threads)" : " GPUs",
                    ", each holding the weights and KV cache below");
  }
  absl::StrAppend(&path, "; prompts ",
                  s.prefill_chunk() > 0
                      ? absl::StrCat("in prefill steps of up to ", s.prefill_chunk(), " tokens")
                      : std::string("through decode steps, a token each"),
                  "; weights ", Bytes(s.weight_bytes()), ", KV cache ", s.max_seq(),
                  " positions x ", slots, slots == 1 ? " sequence (" : " sequences (",
                  Bytes(s.kv_cache_bytes()), ")", BlockPrecisions(o, s));
  return path;
}

absl::StatusOr<std::unique_ptr<DecodeSession>> MakeSession(const Options& o, int64_t slots,
                                                           int64_t max_seq,
                                                           std::optional<ops::Sample> sampling,
                                                           bool eager, bool penalties) {
  SessionOptions so;
  so.model_path = o.model;
  if (o.model.empty()) {
    so.config = PresetConfig(o.preset);
  }
  so.weight_seed = o.weight_seed;
  so.backend = o.cpu ? Backend::kCpu : Backend::kAuto;
  so.cpu_threads = static_cast<int>(o.threads);
  so.tensor_parallel = static_cast<int>(std::max<int64_t>(o.tensor_parallel, 1));
  so.max_slots = slots;
  so.max_seq = max_seq;
  so.sampling = sampling;
  so.eager = eager;
  so.penalties = penalties;
  so.cuda = o.cuda;
  so.prefill_chunk = o.prefill_chunk;
  so.device_loop_steps = o.device_loop;
  so.passes = o.passes;
  if (!o.cpu && !CudaDeviceFound()) {
    std::fprintf(stderr, "stepgraph: %s; running on the CPU reference (slow)\n",
                 BuiltWithCuda() ? "no CUDA device found" : "built without CUDA");
  }
  SG_ASSIGN_OR_RETURN(std::unique_ptr<DecodeSession> session, DecodeSession::Create(so));
  std::fprintf(stderr, "stepgraph: %s on %s\n", ModelName(o).c_str(),
               DescribePath(o, *session).c_str());
  return session;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> ModelTokenizer(const Options& o,
                                                          absl::string_view flag) {
  if (o.model.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        flag, " needs a model with a tokenizer (--model FOLDER or FILE.gguf); the built-in ",
        "model has none", o.command == kRun ? ": give --prompt-ids instead" : ""));
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadModelTokenizer(o.model);
  if (!tok.ok()) {
    return absl::Status(tok.status().code(), absl::StrCat(flag, ": ", tok.status().message()));
  }
  return tok;
}

namespace {

// How many tokens each piece of a prompt fed piece by piece holds: from the rows of the
// smallest prefill step, four times more after each piece that took under a second, up to
// a whole chunk. A slow model (a 1B model on the CPU reference) shows progress within
// seconds; a fast one soon runs whole chunks, the steps of the prompt fed at once.
class PieceSize {
 public:
  explicit PieceSize(const DecodeSession& s)
      : chunk_(s.prefill_chunk() > 0 ? s.prefill_chunk() : 64), size_(chunk_) {
    while (size_ / 4 >= 8) size_ /= 4;  // a step size of the session's (chunk / 2^i, ≥ 8)
  }
  size_t get() const { return static_cast<size_t>(size_); }
  void Took(double ms) {
    if (ms < 1000) size_ = std::min(4 * size_, chunk_);
  }

 private:
  int64_t chunk_;
  int64_t size_;
};

// Appends `tokens` a piece at a time, counting into `progress` from `done`.
absl::Status AppendInPieces(DecodeSession& s, int64_t slot, absl::Span<const int32_t> tokens,
                            PieceSize& piece, Progress& progress, int64_t done) {
  for (size_t at = 0; at < tokens.size();) {
    const absl::Span<const int32_t> part = tokens.subspan(at, piece.get());
    const Clock::time_point t0 = Clock::now();
    SG_RETURN_IF_ERROR(s.Append(slot, part));
    piece.Took(MsSince(t0));
    at += part.size();
    done += static_cast<int64_t>(part.size());
    progress.Update(done);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PrefillShowingProgress(DecodeSession& s, absl::Span<const PrefillRequest> requests) {
  PieceSize piece(s);
  const size_t head = piece.get() + 1;  // a Prefill of head tokens feeds one piece
  bool long_prompt = false;
  int64_t total = 0;
  for (const PrefillRequest& r : requests) {
    long_prompt |= r.prompt.size() > head;
    total += static_cast<int64_t>(r.prompt.size()) - 1;
  }
  if (s.backend() != Backend::kCpu || !long_prompt) return s.Prefill(requests);
  std::vector<PrefillRequest> heads(requests.begin(), requests.end());
  int64_t done = 0;
  for (PrefillRequest& r : heads) {
    r.prompt = r.prompt.subspan(0, head);
    done += static_cast<int64_t>(r.prompt.size()) - 1;
  }
  Progress progress("prefill", total, "tokens");
  const Clock::time_point t0 = Clock::now();
  SG_RETURN_IF_ERROR(s.Prefill(heads));
  piece.Took(MsSince(t0));
  progress.Update(done);
  for (const PrefillRequest& r : requests) {
    if (r.prompt.size() <= head) continue;
    const absl::Span<const int32_t> rest = r.prompt.subspan(head);
    SG_RETURN_IF_ERROR(AppendInPieces(s, r.slot, rest, piece, progress, done));
    done += static_cast<int64_t>(rest.size());
  }
  return absl::OkStatus();
}

absl::Status AppendShowingProgress(DecodeSession& s, int64_t slot,
                                   absl::Span<const int32_t> tokens) {
  if (s.backend() != Backend::kCpu) return s.Append(slot, tokens);
  PieceSize piece(s);
  Progress progress("prefill", static_cast<int64_t>(tokens.size()), "tokens");
  return AppendInPieces(s, slot, tokens, piece, progress, 0);
}

}  // namespace sg::cli
