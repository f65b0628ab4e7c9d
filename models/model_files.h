// A model on disk, whichever format holds it: a Hugging Face folder (config.json and
// safetensors, ModelWeights) or a GGUF file (GgufModel). The session, the program and the
// C ABI open a model through this one type and never ask which format it is: it gives the
// config, checks and binds the weights against a graph, hands out each weight's bytes for
// a copy to the device, and says which ids end a generation.
#ifndef STEPGRAPH_MODELS_MODEL_FILES_H_
#define STEPGRAPH_MODELS_MODEL_FILES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "models/gguf_model.h"
#include "stepgraph/models/llama.h"
#include "models/safetensors.h"
#include "stepgraph/graph/bindings.h"
#include "stepgraph/graph/graph.h"

namespace sg {

enum class ModelFormat : uint8_t { kSafetensorsFolder, kGguf };
absl::string_view ModelFormatName(ModelFormat f);  // "safetensors folder", "GGUF file"

struct ModelOpenOptions {
  // Copy the weight files into memory instead of mapping them, so that a file truncated
  // or rewritten while the model is open cannot end the process with SIGBUS (see
  // mapped_file.h); costs the files' size in resident memory and a read at load.
  bool copy_weights = false;
};

class ModelFiles {
 public:
  // A directory is a Hugging Face folder; a regular file is read as GGUF (its magic is
  // checked). NotFound when `path` does not exist; every error names the path.
  static absl::StatusOr<ModelFiles> Open(const std::string& path,
                                         const ModelOpenOptions& options = {});

  // The config alone: a folder's config.json (its weights are not opened), or a GGUF
  // file's metadata.
  static absl::StatusOr<LlamaConfig> ReadConfig(const std::string& path);

  ModelFiles(ModelFiles&&) = default;
  ModelFiles& operator=(ModelFiles&&) = default;

  ModelFormat format() const { return format_; }
  const std::string& path() const { return path_; }
  const LlamaConfig& config() const { return config_; }
  // The GGUF file, when the model is one (its metadata holds the tokenizer).
  const GgufFile* gguf() const { return gguf_.has_value() ? &gguf_->file() : nullptr; }

  // Every Weight of `graph` is stored with the graph's dtype and shape, and every stored
  // weight is used (errors name the tensor and the file).
  absl::Status CheckAgainstGraph(const Graph& graph) const;
  // Binds every Weight of `graph` to its bytes in the mapping (for the CPU reference, which
  // reads them in place), checking each one's size and alignment. The graph may use a
  // subset of the weights (a prefill step has no lm head); CheckAgainstGraph checks the
  // whole model against the full graph.
  absl::Status BindInPlace(const Graph& graph, Bindings& bindings) const;
  // The stored bytes of the weight the graph calls `name`; NotFound naming it otherwise.
  absl::StatusOr<absl::Span<const std::byte>> WeightData(absl::string_view name) const;

  // Every weight holds finite values: DataLoss naming the first tensor with a NaN or an
  // infinity (quantized blocks are dequantized row by row to check). Reads every byte.
  absl::Status CheckFinite() const;

  // The ids that end a sequence: for a folder, generation_config.json's eos_token_id (an
  // id or a list), else config.json's; for GGUF, tokenizer.ggml.eos_token_id and
  // eot_token_id. Ids outside the vocabulary are dropped; empty when none is stated.
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }

 private:
  ModelFiles() = default;

  ModelFormat format_ = ModelFormat::kSafetensorsFolder;
  std::string path_;
  LlamaConfig config_;
  std::optional<ModelWeights> folder_;
  // The bytes of a GGUF file read with copy_weights; declared before gguf_, whose views
  // point into them, so that they outlive it.
  std::optional<MappedFile> gguf_copy_;
  std::optional<GgufModel> gguf_;
  std::vector<int32_t> stop_ids_;
};

}  // namespace sg

#endif  // STEPGRAPH_MODELS_MODEL_FILES_H_
