// The tokenizer that comes with a model: a folder's tokenizer.json (with
// tokenizer_config.json beside it), or a GGUF file's tokenizer.* metadata. LoadModelTokenizer
// is public (stepgraph/text/tokenizer.h); reading a spec from a GGUF file stays inside.
#ifndef STEPGRAPH_MODELS_MODEL_TOKENIZER_H_
#define STEPGRAPH_MODELS_MODEL_TOKENIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "models/gguf.h"
#include "stepgraph/text/tokenizer.h"

namespace sg {

// The spec a GGUF file's tokenizer.ggml.* keys (and tokenizer.chat_template) describe,
// each key mapped onto the TokenizerSpec field of the same name. NotFound when the file
// has no tokenizer (no tokenizer.ggml.model); InvalidArgument naming a key of the wrong
// type.
absl::StatusOr<TokenizerSpec> TokenizerSpecFromGguf(const GgufFile& file);

}  // namespace sg

#endif  // STEPGRAPH_MODELS_MODEL_TOKENIZER_H_
