// The model the options name and the session that runs it, as every command needs them:
// the config without any weight, a name for it, its tokenizer, a session made with a status
// line saying which path runs, hints that fit what --model names, and prompts fed with
// progress where they take long.
#ifndef STEPGRAPH_TOOLS_MODEL_SETUP_H_
#define STEPGRAPH_TOOLS_MODEL_SETUP_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/runtime/session.h"
#include "stepgraph/text/tokenizer.h"
#include "tools/options.h"

namespace sg::cli {

// The model's config without loading any weight (--verbose also lists the config.json
// fields kept as metadata).
absl::StatusOr<LlamaConfig> ModelConfig(const Options& o);
// The shape of a --model-preset name (options.cc checks the names): tiny, llama-3.2-1b,
// llama-3.1-8b, llama-3.1-70b.
LlamaConfig PresetConfig(const std::string& preset);
// The path given, or "tiny (random weights, seed 0)".
std::string ModelName(const Options& o);

// What a model failed to give.
enum class ModelPart { kWeights, kTokenizer };
// The hint for an error loading `part` of what --model names: a folder's files, a GGUF
// file's formats, or the command's help for the built-in model.
std::string ModelHint(const Options& o, ModelPart part = ModelPart::kWeights);
// Failure() with the hint that fits `status`: memory for ResourceExhausted, else the
// model's.
int ModelFailure(const Options& o, const absl::Status& status,
                 ModelPart part = ModelPart::kWeights);

// A session of `slots` sequences of `max_seq` positions, on the GPU unless --cpu or none
// is found (which is said on stderr), then a status line on stderr naming the model and
// the path its steps take. `penalties`: its steps apply per-slot penalties
// (SessionOptions::penalties).
absl::StatusOr<std::unique_ptr<DecodeSession>> MakeSession(const Options& o, int64_t slots,
                                                           int64_t max_seq,
                                                           std::optional<ops::Sample> sampling,
                                                           bool eager, bool penalties = false);
// "the CPU reference (f32 math, 8 threads), one step per token; prompts in prefill steps
// of up to 256 tokens; ..." or the CUDA device and whether graphs are replayed.
std::string DescribePath(const Options& o, DecodeSession& s);

// The model's tokenizer for `flag` (--prompt, tokenize, chat); a clear error when the
// model has none.
absl::StatusOr<std::unique_ptr<Tokenizer>> ModelTokenizer(const Options& o,
                                                          absl::string_view flag);

// DecodeSession::Prefill and Append that show progress with an estimate where they take
// long: on the CPU reference a long prompt goes in pieces (the first by Prefill, the rest
// by Append), from the smallest prefill step up to whole chunks, with progress on stderr
// once it has run a couple of seconds. On a GPU, where a chunk takes milliseconds,
// everything goes at once.
absl::Status PrefillShowingProgress(DecodeSession& s, absl::Span<const PrefillRequest> requests);
absl::Status AppendShowingProgress(DecodeSession& s, int64_t slot,
                                   absl::Span<const int32_t> tokens);

}  // namespace sg::cli

#endif  // STEPGRAPH_TOOLS_MODEL_SETUP_H_
