#include "models/model_files.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "models/config.h"
#include "base/small_file.h"
#include "stepgraph/base/half.h"
#include "stepgraph/base/quant.h"
#include "nlohmann/json.hpp"
#include "stepgraph/base/status.h"
#include "text/bounded_json.h"

namespace sg {
namespace {

using Json = nlohmann::json;

// The "eos_token_id" of a JSON file (an id or a list of ids): nullopt when the file or the
// key is absent. Malformed files are errors naming the file.
absl::StatusOr<std::optional<std::vector<int32_t>>> EosIdsFromJson(const std::string& path) {
  absl::StatusOr<std::string> text = ReadSmallFile(path, kMaxConfigFileBytes, "config file");
  if (absl::IsNotFound(text.status())) return std::optional<std::vector<int32_t>>();
  if (!text.ok()) return text.status();
  Json root;
  SG_RETURN_IF_ERROR(ParseBoundedJson(*text, {.max_depth = 32, .max_values = int64_t{1} << 20},
                                      path, &root));
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  if (!root.contains("eos_token_id") || root["eos_token_id"].is_null()) {
    return std::optional<std::vector<int32_t>>();
  }
  const Json& eos = root["eos_token_id"];
  std::vector<int32_t> ids;
  auto add = [&](const Json& v) -> absl::Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": eos_token_id must be an id or a list of ids, got ",
                       JsonPreview(v, 80)));
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    return absl::OkStatus();
  };
  if (eos.is_array()) {
    if (eos.size() > 64) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": more than 64 eos_token_id values"));
    }
    for (const Json& v : eos) SG_RETURN_IF_ERROR(add(v));
  } else {
    SG_RETURN_IF_ERROR(add(eos));
  }
  return std::optional<std::vector<int32_t>>(std::move(ids));
}

std::vector<int32_t> InVocabulary(const std::vector<int32_t>& ids, int64_t vocab) {
  std::vector<int32_t> out;
  for (int32_t id : ids) {
    if (id >= 0 && id < vocab && std::find(out.begin(), out.end(), id) == out.end()) {
      out.push_back(id);
    }
  }
  return out;
}

}  // namespace

absl::string_view ModelFormatName(ModelFormat f) {
  return f == ModelFormat::kGguf ? "GGUF file" : "safetensors folder";
}

absl::StatusOr<LlamaConfig> ModelFiles::ReadConfig(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return LoadLlamaConfig(path + "/config.json");
  }
  SG_ASSIGN_OR_RETURN(ModelFiles m, Open(path));
  return m.config_;
}

absl::StatusOr<ModelFiles> ModelFiles::Open(const std::string& path,
                                            const ModelOpenOptions& options) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat("model ", path, " does not exist"));
    return absl::InvalidArgumentError(
        absl::StrCat("cannot stat model ", path, ": ", std::strerror(err)));
  }
  ModelFiles m;
  m.path_ = path;
  std::vector<int32_t> stop;
  if (S_ISDIR(st.st_mode)) {
    m.format_ = ModelFormat::kSafetensorsFolder;
    SG_ASSIGN_OR_RETURN(ModelWeights w,
                        ModelWeights::Open(path, {.copy = options.copy_weights}));
    // Before any graph is built from the config: the files hold what it describes.
    SG_RETURN_IF_ERROR(CheckWeightsFitConfig(w));
    m.folder_.emplace(std::move(w));
    m.config_ = m.folder_->config();
    SG_ASSIGN_OR_RETURN(auto gen, EosIdsFromJson(path + "/generation_config.json"));
    if (!gen.has_value()) {
      SG_ASSIGN_OR_RETURN(gen, EosIdsFromJson(path + "/config.json"));
    }
    if (gen.has_value()) stop = *gen;
  } else if (S_ISREG(st.st_mode)) {
    m.format_ = ModelFormat::kGguf;
    if (options.copy_weights) {
      // The copy's address stays put when it moves, so the file's views stay valid.
      SG_ASSIGN_OR_RETURN(MappedFile copy, MappedFile::Open(path, {.copy = true}));
      m.gguf_copy_.emplace(std::move(copy));
      SG_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Parse(m.gguf_copy_->bytes(), path));
      SG_ASSIGN_OR_RETURN(GgufModel g, GgufModel::FromFile(std::move(file)));
      m.gguf_.emplace(std::move(g));
    } else {
      SG_ASSIGN_OR_RETURN(GgufModel g, GgufModel::Open(path));
      m.gguf_.emplace(std::move(g));
    }
    m.config_ = m.gguf_->config();
    // Each weight keeps the dtype it is stored in (F32 norms, quantized matrices).
    m.config_.weight_dtypes = m.gguf_->WeightDTypes();
    for (absl::string_view key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
      if (m.gguf_->file().Find(key) == nullptr) continue;
      SG_ASSIGN_OR_RETURN(const int64_t id, m.gguf_->file().GetInt(key));
      if (id >= 0 && id <= INT32_MAX) stop.push_back(static_cast<int32_t>(id));
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", path, " is neither a folder nor a regular file (a GGUF model is a file)"));
  }
  m.stop_ids_ = InVocabulary(stop, m.config_.vocab_size);
  return m;
}

absl::Status ModelFiles::CheckAgainstGraph(const Graph& graph) const {
  if (folder_.has_value()) return CheckWeightsAgainstGraph(*folder_, graph);
  // Binding to a scratch set runs the same checks as binding for real.
  Bindings scratch(graph);
  return BindGgufWeights(*gguf_, graph, scratch);
}

absl::Status ModelFiles::BindInPlace(const Graph& graph, Bindings& bindings) const {
  for (int32_t i = 0; i < graph.num_tensors(); ++i) {
    const Tensor& t = graph.tensors()[i];
    if (t.kind != TensorKind::kWeight) continue;
    SG_ASSIGN_OR_RETURN(absl::Span<const std::byte> data, WeightData(t.name));
    // Plain types are read as elements in place; block types byte by byte.
    const int64_t align = IsQuantized(t.dtype) ? 1 : DTypeBytes(t.dtype);
    if (static_cast<int64_t>(data.size()) != t.bytes() ||
        reinterpret_cast<uintptr_t>(data.data()) % static_cast<uintptr_t>(align) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weight '", t.name, "' in ", path_, " does not have the ", t.bytes(), " bytes (",
          DTypeName(t.dtype), ", aligned to ", align, ") the step needs"));
    }
    // Weights are never written; the mapping is read only.
    SG_RETURN_IF_ERROR(bindings.Bind(graph.id(i), const_cast<std::byte*>(data.data()), t.bytes()));
  }
  return absl::OkStatus();
}

absl::Status ModelFiles::CheckFinite() const {
  if (folder_.has_value()) return CheckWeightsFinite(*folder_);
  std::vector<float> row;
  for (const GgufWeight& w : gguf_->weights()) {
    const int64_t cols = w.shape.cols();
    const int64_t rows = w.shape.rows();
    const int64_t row_bytes = IsQuantized(w.dtype) ? DTypeRowBytes(w.dtype, cols)
                                                   : cols * DTypeBytes(w.dtype);
    row.resize(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      const std::byte* src = w.data.data() + r * row_bytes;
      if (IsQuantized(w.dtype)) {
        if (!DequantizeRow(w.dtype, src, row.data(), cols)) {
          return absl::InvalidArgumentError(absl::StrCat("cannot dequantize ", w.gguf_name));
        }
      } else {
        for (int64_t c = 0; c < cols; ++c) row[c] = LoadElement(src, w.dtype, c);
      }
      for (int64_t c = 0; c < cols; ++c) {
        if (!std::isfinite(row[c])) {
          return absl::DataLossError(absl::StrCat(
              path_, ": weight ", w.gguf_name, " (", w.name, ") holds ", row[c],
              " at element ", r * cols + c));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<const std::byte>> ModelFiles::WeightData(absl::string_view name) const {
  if (folder_.has_value()) {
    const ModelWeights::Entry e = folder_->Find(name);
    if (e.tensor == nullptr) {
      return absl::NotFoundError(absl::StrCat("weight '", name, "' is not in ", path_));
    }
    return e.tensor->data;
  }
  const GgufWeight* w = gguf_->Find(name);
  if (w == nullptr) {
    return absl::NotFoundError(absl::StrCat("weight '", name, "' is not in ", path_));
  }
  return w->data;
}

}  // namespace sg
