// Reading a Hugging Face config.json for LlamaForCausalLM into a LlamaConfig. Every field
// that changes what the model computes is understood or refused: an unsupported value or
// an unknown field is an error naming it, so that no model is silently run differently
// from the way it was trained.
#ifndef STEPGRAPH_MODELS_CONFIG_H_
#define STEPGRAPH_MODELS_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stepgraph/models/llama.h"

namespace sg {

// Parses the text of a config.json. `source` names it in error messages (usually the
// path). Accepts both the legacy RoPE fields ("rope_theta", "rope_scaling") and the
// "rope_parameters" object of newer writers. Errors are InvalidArgument naming the field,
// the value and `source`; the result has passed LlamaConfig::Validate().
absl::StatusOr<LlamaConfig> ParseLlamaConfig(absl::string_view json_text,
                                             absl::string_view source);

// Reads and parses the file at `path` (see ReadSmallFile: NotFound when it does not exist,
// InvalidArgument when it is not a regular file or larger than kMaxConfigFileBytes).
absl::StatusOr<LlamaConfig> LoadLlamaConfig(const std::string& path);

}  // namespace sg

#endif  // STEPGRAPH_MODELS_CONFIG_H_
