// Llama models from GGUF files: the LlamaConfig from the file's `llama.*` keys, and the
// tensors under the Hugging Face names the decode graph uses, each with its own dtype (a
// GGUF model mixes them: F32 norms, quantized matrices). Like config.json, every key that
// changes what the model computes is understood or refused, so that no file is silently
// run differently from the way it was made.
//
// Dtypes: a file is computed in F16 or BF16 when every matrix is stored so, else in F32
// (quantized files included); float tensors stored otherwise (llama.cpp's converter keeps
// norms and biases in F32) are rounded to that dtype once, at load (docs/gguf.md).
//
// RoPE: the usual converter permutes the rows of Q and K within each head so that the
// interleaved pairing (2i, 2i+1) on them equals Hugging Face's (i, i + d/2) pairing on the
// original weights. The config therefore says rope_interleaved, and the weights are used
// as stored.
#ifndef STEPGRAPH_MODELS_GGUF_MODEL_H_
#define STEPGRAPH_MODELS_GGUF_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "models/gguf.h"
#include "stepgraph/models/llama.h"
#include "stepgraph/graph/bindings.h"
#include "stepgraph/graph/graph.h"
#include "stepgraph/graph/types.h"

namespace sg {

// The LlamaConfig a GGUF file describes. general.architecture must be "llama", "qwen2",
// "qwen3", "phi3", "gemma" or "gemma2" (docs/models.md). dtype (the
// activations and KV cache) is F16 or BF16 when every matrix is stored in that dtype, else
// F32; rope_interleaved is true. Refused with InvalidArgument naming the key: other
// architectures, missing required keys, values out of range, per-layer arrays, RoPE
// scaling other than none, partial rotary dims, mixtures of experts, sliding windows,
// and any other `llama.*` key stepgraph does not know.
absl::StatusOr<LlamaConfig> LlamaConfigFromGguf(const GgufFile& file);

// The graph's name for a GGUF tensor name ("blk.3.attn_q.weight" ->
// "model.layers.3.self_attn.q_proj.weight"), or InvalidArgument for a name stepgraph does
// not map. Block numbers must be plain decimals (no sign or leading zeros).
absl::StatusOr<std::string> HfNameFromGguf(absl::string_view gguf_name);
// The same for a model of `config`'s family, whose files name some tensors otherwise
// (Qwen3's q/k norms, Phi-3's fused q/k/v and gate/up, Gemma 2's four norms).
absl::StatusOr<std::string> HfNameFromGguf(absl::string_view gguf_name,
                                           const LlamaConfig& config);

// One weight of a GGUF model, under its graph name.
struct GgufWeight {
  std::string name;       // the graph's (Hugging Face) name
  absl::string_view gguf_name;
  DType dtype = DType::kF32;         // as the graph reads it
  DType stored_dtype = DType::kF32;  // as the file stores it
  Shape shape;            // as the graph declares it: [out, in] for matrices
  // Inside the mapped file, or, for a float tensor stored in another dtype than the
  // config's, its values rounded to that dtype at load (held by the GgufModel).
  absl::Span<const std::byte> data;
};

// A mapped GGUF Llama model: the file, its config and its weights. Move-only.
class GgufModel {
 public:
  // Opens, parses and checks the file (see FromFile).
  static absl::StatusOr<GgufModel> Open(const std::string& path, const GgufLimits& limits = {});
  // Reads the config, then matches the tensors against it before anything is built:
  // every weight the config implies is present with the shape the graph needs, no other
  // tensor is stored, and their total bytes are those the file holds.
  static absl::StatusOr<GgufModel> FromFile(GgufFile file);

  GgufModel(GgufModel&&) = default;
  GgufModel& operator=(GgufModel&&) = default;

  const GgufFile& file() const { return file_; }
  const LlamaConfig& config() const { return config_; }
  // In the order the graph builds them (embedding, layers, final norm, lm head).
  absl::Span<const GgufWeight> weights() const { return weights_; }
  // nullptr when the model has no weight of that graph name.
  const GgufWeight* Find(absl::string_view name) const;
  // The dtype of each weight by graph name, for building the graph.
  absl::flat_hash_map<std::string, DType> WeightDTypes() const;
  // Sum of the weights' bytes, as the graph reads them.
  int64_t weight_bytes() const { return weight_bytes_; }

 private:
  GgufModel() = default;

  GgufFile file_;
  LlamaConfig config_;
  std::vector<GgufWeight> weights_;
  // Float tensors rounded to config_.dtype at load (GgufWeight::data points into them).
  std::vector<std::vector<std::byte>> converted_;
  absl::flat_hash_map<std::string, size_t> index_;
  int64_t weight_bytes_ = 0;
};

// Binds every Weight of `graph` to its bytes in the mapping (for dispatchers that read
// host memory), after checking that the model stores it with the graph's dtype and
// shape and that every stored weight is used. Plain-type tensors must be aligned to their
// element size to be read in place.
absl::Status BindGgufWeights(const GgufModel& model, const Graph& graph, Bindings& bindings);

}  // namespace sg

#endif  // STEPGRAPH_MODELS_GGUF_MODEL_H_
