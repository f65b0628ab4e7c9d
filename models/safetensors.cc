// Safetensors parsing and model folders. The header is untrusted input: every length and
// offset is checked with overflow-safe arithmetic against the bytes actually mapped
// before a span is formed, so a truncated or hostile file gives an error, never a read
// out of bounds.
#include "models/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/config.h"
#include "models/family_weights.h"
#include "base/small_file.h"
#include "nlohmann/json.hpp"
#include "stepgraph/base/half.h"
#include "stepgraph/base/status.h"
#include "text/bounded_json.h"

namespace sg {
namespace {

using Json = nlohmann::json;

// The reference writer caps headers at 100 MB; a larger length is corruption, and
// refusing it keeps a hostile file from making the parser allocate without bound.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

// Headers nest 3 deep (name, entry, shape); 2^22 values are 500k tensors. The index nests
// 2 deep and lists one file per tensor.
constexpr JsonLimits kHeaderJsonLimits = {.max_depth = 16, .max_values = int64_t{1} << 22};
constexpr JsonLimits kIndexJsonLimits = {.max_depth = 16, .max_values = int64_t{1} << 22};

// A value quoted in a message: its first 80 characters, however large it is.
std::string Render(const Json& v) { return JsonPreview(v, 80); }

// Storage dtypes stepgraph runs, by their safetensors names. Any other name is refused.
bool DTypeFromSafetensors(const std::string& name, DType* out) {
  if (name == "F32") *out = DType::kF32;
  else if (name == "BF16") *out = DType::kBF16;
  else if (name == "F16") *out = DType::kF16;
  else if (name == "I32") *out = DType::kI32;
  else return false;
  return true;
}

absl::string_view SafetensorsDTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI32:
      return "I32";
    default:
      return "?";  // the block formats are not safetensors dtypes
  }
}

// A non-negative JSON integer that fits int64, or false.
bool NonNegativeInt(const Json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < 0) return false;
    *out = i;
    return true;
  }
  return false;
}

absl::StatusOr<std::vector<SafetensorsTensor>> ParseChecked(absl::Span<const std::byte> file,
                                                            absl::string_view source) {
  auto error = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", parts...));
  };
  if (file.size() < 8) {
    return error("file is ", file.size(),
                 " bytes, shorter than the 8-byte header length of a safetensors file");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) {
    header_len = (header_len << 8) | static_cast<uint8_t>(file[static_cast<size_t>(i)]);
  }
  const uint64_t after_len = file.size() - 8;
  if (header_len > after_len) {
    return error("header length ", header_len, " is larger than the ", after_len,
                 " bytes that follow it");
  }
  if (header_len > kMaxHeaderBytes) {
    return error("header length ", header_len, " exceeds the limit of ", kMaxHeaderBytes,
                 " bytes");
  }
  const char* header_begin = reinterpret_cast<const char*>(file.data() + 8);
  Json header;
  SG_RETURN_IF_ERROR(ParseBoundedJson(absl::string_view(header_begin, header_len),
                                      kHeaderJsonLimits, source, &header));
  if (!header.is_object()) return error("header is not a JSON object");

  const std::byte* data = file.data() + 8 + header_len;
  const uint64_t data_size = after_len - header_len;

  std::vector<SafetensorsTensor> tensors;
  std::vector<std::pair<int64_t, int64_t>> ranges;  // parallel to tensors
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") continue;
    auto bad = [&](auto&&... parts) { return error("tensor '", name, "': ", parts...); };
    const Json& entry = it.value();
    if (!entry.is_object()) return bad("entry is not an object: ", Render(entry));

    auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end()) return bad("missing field 'dtype'");
    if (!dtype_it->is_string()) return bad("'dtype' is not a string: ", Render(*dtype_it));
    SafetensorsTensor t;
    t.name = name;
    const std::string dtype_name = dtype_it->get<std::string>();
    if (!DTypeFromSafetensors(dtype_name, &t.dtype)) {
      return bad("unsupported dtype ", dtype_name, " (stepgraph reads F32, BF16, F16 and I32)");
    }

    auto shape_it = entry.find("shape");
    if (shape_it == entry.end()) return bad("missing field 'shape'");
    if (!shape_it->is_array()) return bad("'shape' is not a list: ", Render(*shape_it));
    int64_t numel = 1;
    for (const Json& d : *shape_it) {
      int64_t dim = 0;
      if (!NonNegativeInt(d, &dim)) {
        return bad("shape ", Render(*shape_it), " has a negative or non-integer dimension");
      }
      t.shape.push_back(dim);
      if (dim != 0 && numel > std::numeric_limits<int64_t>::max() / dim) {
        return bad("shape ", Render(*shape_it), " has too many elements");
      }
      numel *= dim;
    }
    const int64_t elem = DTypeBytes(t.dtype);
    if (numel > std::numeric_limits<int64_t>::max() / elem) {
      return bad("shape ", Render(*shape_it), " has too many bytes");
    }
    const int64_t expected_bytes = numel * elem;

    auto offsets_it = entry.find("data_offsets");
    if (offsets_it == entry.end()) return bad("missing field 'data_offsets'");
    int64_t begin = 0, end = 0;
    if (!offsets_it->is_array() || offsets_it->size() != 2 ||
        !NonNegativeInt((*offsets_it)[0], &begin) || !NonNegativeInt((*offsets_it)[1], &end)) {
      return bad("'data_offsets' must be two non-negative integers, got ", Render(*offsets_it));
    }
    if (end < begin) return bad("data_offsets [", begin, ", ", end, "] end before they begin");
    if (static_cast<uint64_t>(end) > data_size) {
      return bad("data_offsets [", begin, ", ", end, "] run past the data section of ",
                 data_size, " bytes");
    }
    if (end - begin != expected_bytes) {
      return bad("data_offsets [", begin, ", ", end, "] hold ", end - begin, " bytes but ",
                 dtype_name, " ", Render(*shape_it), " needs ", expected_bytes);
    }
    t.data = absl::Span<const std::byte>(data + begin, static_cast<size_t>(end - begin));
    tensors.push_back(std::move(t));
    ranges.emplace_back(begin, end);
  }

  // Data order; then any two neighbours with bytes must not overlap.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  const size_t kNone = std::numeric_limits<size_t>::max();
  size_t last = kNone;  // the tensor with bytes that ends furthest so far
  for (size_t i : order) {
    if (ranges[i].first == ranges[i].second) continue;  // empty tensors hold no bytes
    if (last != kNone && ranges[i].first < ranges[last].second) {
      return error("tensors '", tensors[last].name, "' [", ranges[last].first, ", ",
                   ranges[last].second, ") and '", tensors[i].name, "' [", ranges[i].first, ", ",
                   ranges[i].second, ") overlap");
    }
    if (last == kNone || ranges[i].second > ranges[last].second) last = i;
  }
  std::vector<SafetensorsTensor> sorted;
  sorted.reserve(tensors.size());
  for (size_t i : order) sorted.push_back(std::move(tensors[i]));
  return sorted;
}

std::string JoinPath(const std::string& dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

// ---- SafetensorsTensor ----

int64_t SafetensorsTensor::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string SafetensorsTensor::ShapeString() const {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

// ---- parsing ----

absl::StatusOr<std::vector<SafetensorsTensor>> ParseSafetensors(absl::Span<const std::byte> file,
                                                                absl::string_view source) {
  try {
    return ParseChecked(file, source);
  } catch (const std::exception& e) {
    // Only allocation failure can get here; keep it from crossing the API.
    return absl::ResourceExhaustedError(absl::StrCat(source, ": ", e.what()));
  }
}

SafetensorsFile::SafetensorsFile(MappedFile file, std::vector<SafetensorsTensor> tensors)
    : file_(std::move(file)), tensors_(std::move(tensors)) {
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path,
                                                      const MapOptions& options) {
  SG_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path, options));
  // The first bytes parsing touches: the length, then the header it gives (checked against
  // the file's size by the parser).
  SG_RETURN_IF_ERROR(mapped.Prefault(0, 8));
  if (mapped.bytes().size() >= 8) {
    uint64_t header_len = 0;  // little-endian
    for (int i = 7; i >= 0; --i) {
      header_len = (header_len << 8) | static_cast<uint8_t>(mapped.bytes()[static_cast<size_t>(i)]);
    }
    SG_RETURN_IF_ERROR(mapped.Prefault(8, std::min<uint64_t>(header_len, kMaxHeaderBytes)));
  }
  SG_ASSIGN_OR_RETURN(std::vector<SafetensorsTensor> tensors,
                      ParseSafetensors(mapped.bytes(), path));
  // The spans point into the mapping, whose address a move does not change.
  return SafetensorsFile(std::move(mapped), std::move(tensors));
}

const SafetensorsTensor* SafetensorsFile::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---- ModelWeights ----

absl::Status ModelWeights::IndexFile(size_t file) {
  const SafetensorsFile& f = files_[file];
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const std::string& name = f.tensors()[i].name;
    auto [it, inserted] = index_.emplace(name, std::make_pair(file, i));
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is stored twice: in ",
                                                     files_[it->second.first].path(), " and in ",
                                                     f.path()));
    }
  }
  return absl::OkStatus();
}

ModelWeights::Entry ModelWeights::Find(absl::string_view name) const {
  if (auto d = derived_.find(name); d != derived_.end()) {
    return {d->second.first.get(), &files_[d->second.second]};
  }
  auto it = index_.find(name);
  if (it == index_.end()) return {nullptr, nullptr};
  const SafetensorsFile& f = files_[it->second.first];
  return {&f.tensors()[it->second.second], &f};
}

absl::Status ModelWeights::DeriveFamilyTensors() {
  auto derive = [&](std::string name, const SafetensorsTensor& from, std::vector<int64_t> shape,
                    absl::Span<const std::byte> data) {
    auto t = std::make_unique<SafetensorsTensor>();
    t->name = name;
    t->dtype = from.dtype;
    t->shape = std::move(shape);
    t->data = data;
    const size_t file = index_.at(from.name).first;
    derived_.insert_or_assign(std::move(name), std::make_pair(std::move(t), file));
  };
  for (const FusedWeight& f : FusedWeights(config_)) {
    const Entry e = Find(f.stored);
    if (e.tensor == nullptr) continue;  // the graph check names what is missing
    const std::string where = absl::StrCat(" (in ", e.file->path(), ")");
    if (e.tensor->shape.size() != 2 || e.tensor->shape[1] != f.cols) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", f.stored, "'", where,
                                                     " has shape ", e.tensor->ShapeString(),
                                                     ", not [rows, ", f.cols, "]"));
    }
    for (size_t p = 0; p < f.parts.size(); ++p) {
      absl::StatusOr<absl::Span<const std::byte>> part =
          FusedPart(f, p, e.tensor->dtype, e.tensor->data);
      if (!part.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(part.status().message(), where));
      }
      derive(f.parts[p].name, *e.tensor, {f.parts[p].rows, f.cols}, *part);
    }
    split_.insert(f.stored);
  }
  // Experts stored one matrix each are copied side by side into the [E, rows, cols] the
  // graph reads (GGUF files store them so and are read in place). The names are listed
  // only when the files hold at least as many tensors as they would be: a config that
  // claims more experts than its files store must not size the list (the graph check
  // then names what is missing).
  int64_t routed = 0;
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) routed += config_.MoeLayer(l);
  const bool may_be_per_expert =
      routed > 0 && static_cast<int64_t>(index_.size()) >= routed * 3 * config_.num_experts;
  for (const StackedWeight& s :
       may_be_per_expert ? StackedWeights(config_) : std::vector<StackedWeight>()) {
    std::vector<Entry> parts;
    for (const std::string& name : s.parts) {
      const Entry e = Find(name);
      if (e.tensor != nullptr) parts.push_back(e);
    }
    if (parts.empty()) continue;  // stored stacked, or missing: the graph check says
    const SafetensorsTensor& first = *parts[0].tensor;
    for (size_t p = 0; p < s.parts.size(); ++p) {
      const Entry e = p < parts.size() ? parts[p] : Entry{nullptr, nullptr};
      if (e.tensor == nullptr || e.tensor->name != s.parts[p]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "expert tensor '", s.parts[p], "' is missing (", parts.size(), " of the ",
            s.parts.size(), " experts of '", s.name, "' are stored)"));
      }
      if (e.tensor->dtype != first.dtype || e.tensor->shape.size() != 2 ||
          e.tensor->shape[0] != s.rows || e.tensor->shape[1] != s.cols) {
        return absl::InvalidArgumentError(absl::StrCat(
            "expert tensor '", s.parts[p], "' (in ", e.file->path(), ") is ",
            e.tensor->ShapeString(), " ", DTypeName(e.tensor->dtype), ", not [", s.rows, ", ",
            s.cols, "] ", DTypeName(first.dtype), " as the config and expert 0 say"));
      }
    }
    std::vector<std::byte> stacked;
    try {
      stacked.reserve(parts.size() * first.data.size());
      for (const Entry& e : parts) {
        stacked.insert(stacked.end(), e.tensor->data.begin(), e.tensor->data.end());
      }
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(
          absl::StrCat("no memory to stack the experts of '", s.name, "'"));
    }
    folded_.push_back(std::move(stacked));
    derive(s.name, first, {static_cast<int64_t>(parts.size()), s.rows, s.cols},
           folded_.back());
    for (const std::string& name : s.parts) split_.insert(name);
  }
  if (config_.norm_plus_one) {
    for (const SafetensorsFile& file : files_) {
      for (const SafetensorsTensor& t : file.tensors()) {
        if (!IsNormWeight(t.name) || !IsFloat(t.dtype)) continue;
        folded_.push_back(NormPlusOne(t.dtype, t.data, t.NumElements()));
        derive(t.name, t, t.shape, folded_.back());  // the bytes stay put when moved
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// The weight_map of an index file: tensor name -> shard file name.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ReadIndex(
    const std::string& path) {
  SG_ASSIGN_OR_RETURN(const std::string text,
                      ReadSmallFile(path, kMaxIndexFileBytes, "safetensors index"));
  Json index;
  SG_RETURN_IF_ERROR(ParseBoundedJson(text, kIndexJsonLimits, path, &index));
  if (!index.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected a JSON object"));
  }
  auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": missing 'weight_map' object (tensor name -> file)"));
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (auto it = map_it->begin(); it != map_it->end(); ++it) {
    if (!it->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": weight_map entry '", it.key(),
                                                     "' is not a file name: ", Render(*it)));
    }
    const std::string file = it->get<std::string>();
    // Shards live beside the index; anything else would let an index reach other files.
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": weight_map entry '", it.key(), "' names '", file,
          "', which is not a plain file name in the model folder"));
    }
    out.emplace_back(it.key(), file);
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": empty weight_map"));
  return out;
}

}  // namespace

absl::StatusOr<ModelWeights> ModelWeights::Open(const std::string& model_dir,
                                                const MapOptions& options) {
  try {
    ModelWeights w;
    w.dir_ = model_dir;
    SG_ASSIGN_OR_RETURN(w.config_, LoadLlamaConfig(JoinPath(model_dir, "config.json")));

    const std::string single = JoinPath(model_dir, "model.safetensors");
    const std::string index_path = JoinPath(model_dir, "model.safetensors.index.json");
    if (FileExists(single)) {
      SG_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(single, options));
      w.files_.push_back(std::move(f));
      SG_RETURN_IF_ERROR(w.IndexFile(0));
      SG_RETURN_IF_ERROR(w.DeriveFamilyTensors());
      return w;
    }
    if (!FileExists(index_path)) {
      return absl::NotFoundError(absl::StrCat("no weights in ", model_dir,
                                              ": neither model.safetensors nor "
                                              "model.safetensors.index.json exists"));
    }
    SG_ASSIGN_OR_RETURN(auto weight_map, ReadIndex(index_path));
    absl::flat_hash_map<std::string, size_t> file_by_name;
    for (const auto& [tensor, file] : weight_map) {
      if (file_by_name.contains(file)) continue;
      const std::string shard = JoinPath(model_dir, file);
      absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(shard, options);
      if (!f.ok()) {
        return absl::Status(f.status().code(),
                            absl::StrCat(index_path, " lists '", file, "' for tensor '", tensor,
                                         "': ", f.status().message()));
      }
      file_by_name.emplace(file, w.files_.size());
      w.files_.push_back(*std::move(f));
    }
    for (size_t i = 0; i < w.files_.size(); ++i) SG_RETURN_IF_ERROR(w.IndexFile(i));
    absl::flat_hash_map<absl::string_view, size_t> listed;
    for (const auto& [tensor, file] : weight_map) {
      const Entry e = w.Find(tensor);
      const SafetensorsFile& expected = w.files_[file_by_name.at(file)];
      if (e.tensor == nullptr || e.file != &expected) {
        return absl::InvalidArgumentError(absl::StrCat(
            index_path, ": tensor '", tensor, "' is listed in ", file, " but ",
            e.tensor == nullptr ? "no shard has it" : absl::StrCat("is in ", e.file->path())));
      }
      listed.emplace(tensor, 0);
    }
    for (const SafetensorsFile& f : w.files_) {
      for (const SafetensorsTensor& t : f.tensors()) {
        if (!listed.contains(t.name)) {
          return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' in ", f.path(),
                                                         " is not listed in ", index_path));
        }
      }
    }
    SG_RETURN_IF_ERROR(w.DeriveFamilyTensors());
    return w;
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(absl::StrCat(model_dir, ": ", e.what()));
  }
}

// ---- checks against the config ----

absl::Status CheckWeightsFitConfig(const ModelWeights& weights) {
  const LlamaConfig& c = weights.config();
  SG_ASSIGN_OR_RETURN(const int64_t config_bytes, c.WeightBytes());
  // Elements, not bytes: a dtype the config does not state is reported later by name.
  const int64_t needed = config_bytes / DTypeBytes(c.dtype);
  int64_t stored = 0;
  for (const SafetensorsFile& f : weights.files()) {
    for (const SafetensorsTensor& t : f.tensors()) {
      // Each tensor's bytes lie inside its mapped file, so the sum cannot overflow; it is
      // checked anyway.
      const int64_t elements = static_cast<int64_t>(t.data.size()) / DTypeBytes(t.dtype);
      if (!CheckedAdd(stored, elements, &stored)) {
        return absl::InvalidArgumentError(
            absl::StrCat(weights.dir(), ": the stored tensors' sizes overflow 64 bits"));
      }
    }
  }
  if (stored >= needed) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      JoinPath(weights.dir(), "config.json"), " describes ", needed,
      " weight elements (num_hidden_layers ", c.num_hidden_layers, ", hidden_size ",
      c.hidden_size, ", intermediate_size ", c.intermediate_size, ", vocab_size ",
      c.vocab_size, "), but the safetensors files hold only ", stored,
      ": the config does not describe these weights"));
}

absl::Status CheckWeightsFinite(const ModelWeights& weights) {
  for (const SafetensorsFile& f : weights.files()) {
    for (const SafetensorsTensor& t : f.tensors()) {
      if (!IsFloat(t.dtype)) continue;
      // All-ones exponent bits: an infinity or a NaN. Bit tests keep the scan at memory
      // speed on a model of gigabytes.
      const int64_t n = static_cast<int64_t>(t.data.size()) / DTypeBytes(t.dtype);
      const std::byte* p = t.data.data();
      int64_t bad = -1;
      if (t.dtype == DType::kF32) {
        for (int64_t i = 0; i < n && bad < 0; ++i) {
          uint32_t bits;
          std::memcpy(&bits, p + 4 * i, 4);
          if ((bits & 0x7f800000u) == 0x7f800000u) bad = i;
        }
      } else {
        const uint16_t mask = t.dtype == DType::kBF16 ? 0x7f80 : 0x7c00;
        for (int64_t i = 0; i < n && bad < 0; ++i) {
          uint16_t bits;
          std::memcpy(&bits, p + 2 * i, 2);
          if ((bits & mask) == mask) bad = i;
        }
      }
      if (bad >= 0) {
        return absl::DataLossError(absl::StrCat(
            "tensor '", t.name, "' in ", f.path(), " holds ",
            LoadElement(p, t.dtype, bad), " at element ", bad, " (of ", n,
            "): the weights are corrupt or overflowed when they were converted"));
      }
    }
  }
  return absl::OkStatus();
}

// ---- checks against a graph ----

namespace {

bool IsRotaryBuffer(absl::string_view name) {
  constexpr absl::string_view kSuffix = ".rotary_emb.inv_freq";
  return name.size() >= kSuffix.size() && name.substr(name.size() - kSuffix.size()) == kSuffix;
}

}  // namespace

absl::Status CheckWeightsAgainstGraph(const ModelWeights& weights, const Graph& graph) {
  absl::flat_hash_map<absl::string_view, int32_t> graph_weights;
  for (int32_t i = 0; i < graph.num_tensors(); ++i) {
    const Tensor& t = graph.tensors()[i];
    if (t.kind != TensorKind::kWeight) continue;
    graph_weights.emplace(t.name, i);
    const ModelWeights::Entry e = weights.Find(t.name);
    if (e.tensor == nullptr) {
      return absl::NotFoundError(absl::StrCat("tensor '", t.name, "' (", DTypeName(t.dtype), " ",
                                              t.shape.ToString(), ") is needed by the graph but ",
                                              "not stored in ", weights.dir()));
    }
    if (e.tensor->dtype != t.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "' in ", e.file->path(), " is ",
          SafetensorsDTypeName(e.tensor->dtype), " but the graph needs ", DTypeName(t.dtype),
          " (config dtype)"));
    }
    if (absl::Span<const int64_t>(e.tensor->shape) != t.shape.dims()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' in ", e.file->path(),
                                                     " has shape ", e.tensor->ShapeString(),
                                                     " but the graph needs ", t.shape.ToString()));
    }
  }

  const ModelWeights::Entry embed = weights.Find("model.embed_tokens.weight");
  std::vector<std::string> extra;
  std::string first_file;
  for (const SafetensorsFile& f : weights.files()) {
    for (const SafetensorsTensor& t : f.tensors()) {
      if (graph_weights.contains(t.name) || IsRotaryBuffer(t.name)) continue;
      // A fused matrix the graph reads as its parts (which it needs, as checked above).
      if (weights.IsSplit(t.name)) continue;
      if (t.name == "lm_head.weight" && weights.config().tie_word_embeddings &&
          embed.tensor != nullptr && t.shape == embed.tensor->shape) {
        continue;  // the stored copy of the tied embedding
      }
      if (extra.empty()) first_file = f.path();
      extra.push_back(t.name);
    }
  }
  if (!extra.empty()) {
    std::string more;
    if (extra.size() > 1) {
      more = absl::StrCat(" (and ", extra.size() - 1, " more: ",
                          absl::StrJoin(extra.begin() + 1,
                                        extra.begin() + std::min<size_t>(extra.size(), 6), ", "),
                          extra.size() > 6 ? ", ..." : "", ")");
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "extra tensor '", extra[0], "' in ", first_file,
        " is not used by the graph; the config does not describe this model", more));
  }
  return absl::OkStatus();
}

absl::Status BindMappedWeights(const ModelWeights& weights, const Graph& graph,
                               Bindings& bindings) {
  SG_RETURN_IF_ERROR(CheckWeightsAgainstGraph(weights, graph));
  for (int32_t i = 0; i < graph.num_tensors(); ++i) {
    const Tensor& t = graph.tensors()[i];
    if (t.kind != TensorKind::kWeight) continue;
    const ModelWeights::Entry e = weights.Find(t.name);
    const auto address = reinterpret_cast<uintptr_t>(e.tensor->data.data());
    if (address % static_cast<uintptr_t>(DTypeBytes(t.dtype)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "' in ", e.file->path(), " is not aligned to its ",
          DTypeBytes(t.dtype), "-byte elements and cannot be read in place"));
    }
    // Bindings take a mutable pointer for States and Inputs; Weights are never written,
    // and the mapping is read only, so a bug would fault rather than corrupt the file.
    SG_RETURN_IF_ERROR(bindings.Bind(graph.id(i),
                                     const_cast<std::byte*>(e.tensor->data.data()),
                                     static_cast<int64_t>(e.tensor->data.size())));
  }
  return absl::OkStatus();
}

}  // namespace sg
