// Loading model weights from safetensors files without copying them: each file is memory
// mapped read-only, its header is checked completely (sizes, offsets, overlaps, dtypes)
// before any tensor is exposed, and tensors are handed out as byte spans into the
// mapping. ModelWeights gathers a model folder (config.json plus one file or an indexed
// set of shards); CheckWeightsAgainstGraph matches it against a graph's Weight tensors.
#ifndef STEPGRAPH_MODELS_SAFETENSORS_H_
#define STEPGRAPH_MODELS_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "models/mapped_file.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/graph/bindings.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/types.h"

namespace sg {

// One tensor of a safetensors file; `data` lies inside the file's bytes.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // as stored: any rank, dims >= 0
  absl::Span<const std::byte> data;

  int64_t NumElements() const;
  std::string ShapeString() const;  // "[256,64]"
};

// Parses and checks a whole safetensors file held in `file`: the 8-byte little-endian
// header length, the JSON header, and for every tensor its dtype, shape and data offsets
// (inside the data section, end >= begin, length = elements x dtype size, no two tensors
// overlapping). "__metadata__" is skipped. Every error is InvalidArgument naming `source`
// and the tensor. Tensors are returned in the order of their data.
absl::StatusOr<std::vector<SafetensorsTensor>> ParseSafetensors(absl::Span<const std::byte> file,
                                                                absl::string_view source);

// A mapped and checked safetensors file. Move-only.
class SafetensorsFile {
 public:
  // Maps the file (or copies it, see MapOptions) and parses its header; in a mapping the
  // header's bytes are prefaulted first, so a file truncated under it is an error.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path,
                                              const MapOptions& options = {});

  const std::string& path() const { return file_.path(); }
  // In the order of their data in the file.
  absl::Span<const SafetensorsTensor> tensors() const { return tensors_; }
  // nullptr when the file has no tensor of that name.
  const SafetensorsTensor* Find(absl::string_view name) const;

 private:
  SafetensorsFile(MappedFile file, std::vector<SafetensorsTensor> tensors);

  MappedFile file_;
  std::vector<SafetensorsTensor> tensors_;
  absl::flat_hash_map<std::string, size_t> index_;
};

// A model folder: config.json and its weights, from model.safetensors or, when that is
// absent, from the shards that model.safetensors.index.json lists. Move-only.
class ModelWeights {
 public:
  // One tensor and the file that holds it.
  struct Entry {
    const SafetensorsTensor* tensor;
    const SafetensorsFile* file;
  };

  // Reads config.json (see LoadLlamaConfig) and maps the weights. For an index, every
  // listed file must exist, every name must be in the file the index names, and every
  // tensor of those files must be listed; a name may be stored only once.
  static absl::StatusOr<ModelWeights> Open(const std::string& model_dir,
                                           const MapOptions& options = {});

  const LlamaConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }
  const std::vector<SafetensorsFile>& files() const { return files_; }
  int64_t num_tensors() const { return static_cast<int64_t>(index_.size()); }

  // Entry of `name`; its tensor is nullptr when no file has it.
  Entry Find(absl::string_view name) const;

 private:
  ModelWeights() = default;
  // Adds every tensor of files_[file], refusing a name already present.
  absl::Status IndexFile(size_t file);

  LlamaConfig config_;
  std::string dir_;
  std::vector<SafetensorsFile> files_;
  // name -> (file index, tensor index in that file)
  absl::flat_hash_map<std::string, std::pair<size_t, size_t>> index_;
};

// The files hold at least as many weight elements as the config describes
// (LlamaConfig::WeightBytes). Cheap, and made before any graph is built from the config,
// so that a config asking for far more than its files (a billion layers) is refused at
// once, with both counts. The tensor-by-tensor check is CheckWeightsAgainstGraph.
absl::Status CheckWeightsFitConfig(const ModelWeights& weights);

// Every float weight of the files is finite: DataLoss naming the first tensor that holds
// a NaN or an infinity, with the element and its value. Reads every byte (memory speed),
// so it is optional (SessionOptions::check_weights).
absl::Status CheckWeightsFinite(const ModelWeights& weights);

// Every Weight tensor of `graph` is stored with the graph's dtype and shape, and every
// stored tensor is used by the graph. Two stored tensors are accepted and ignored: with
// tie_word_embeddings, an "lm_head.weight" shaped like the embedding (some writers store
// the tied copy), and "*.rotary_emb.inv_freq" buffers of old writers (derived from the
// config, which is what the graph uses). Errors name the tensor and the file.
absl::Status CheckWeightsAgainstGraph(const ModelWeights& weights, const Graph& graph);

// Binds every Weight tensor of `graph` to its bytes in the mapping, for dispatchers that
// read host memory (the CPU reference). Checks the weights against the graph first and
// refuses a tensor whose bytes are not aligned to its element size. The mapping is read
// only: nothing in a graph writes a Weight.
absl::Status BindMappedWeights(const ModelWeights& weights, const Graph& graph,
                               Bindings& bindings);

}  // namespace sg

#endif  // STEPGRAPH_MODELS_SAFETENSORS_H_
