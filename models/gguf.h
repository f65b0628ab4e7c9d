// Reading GGUF files (versions 2 and 3, little-endian) without copying them: the file is
// memory mapped read-only, the header (metadata and tensor infos) is checked completely
// before anything is exposed, and strings, arrays and tensor data are handed out as views
// into the mapping. The header is untrusted: every count and length is checked against
// the bytes left and against GgufLimits before anything is allocated for it.
#ifndef STEPGRAPH_MODELS_GGUF_H_
#define STEPGRAPH_MODELS_GGUF_H_

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
#include "stepgraph/graph/types.h"

namespace sg {

// The metadata value types, with the file's numbering.
enum class GgufValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// "u8", "i8", ..., "f64", "bool", "string", "array".
absl::string_view GgufValueTypeName(GgufValueType t);

// The name of a GGUF tensor type id ("Q4_K", "IQ2_XS", ...), or "" for an id GGUF does
// not define.
absl::string_view GgufTensorTypeName(uint32_t type);

// Bounds on what a header may ask for, beyond fitting in the file. The defaults are far
// above any real model (a 256k-token vocabulary is 2^18 strings; models have thousands
// of tensors and tens of metadata keys).
struct GgufLimits {
  int64_t max_tensors = int64_t{1} << 18;
  int64_t max_metadata = int64_t{1} << 16;        // key/value pairs
  int64_t max_string_bytes = int64_t{1} << 24;    // one key, string value or tensor name
  int64_t max_array_elements = int64_t{1} << 24;  // one array value
};

// One metadata value. Strings, string arrays and numeric arrays view the file's bytes.
class GgufValue {
 public:
  absl::string_view key() const { return key_; }
  GgufValueType type() const { return type_; }
  bool is_array() const { return type_ == GgufValueType::kArray; }
  // The elements' type for an array, type() otherwise.
  GgufValueType element_type() const { return element_type_; }
  // Elements of an array; 1 otherwise.
  int64_t size() const { return count_; }

  // Typed reads. InvalidArgument naming the key, the expected and the stored type when
  // the value is not of that kind (a scalar is not an array of one, nor the reverse).
  // Int: any integer type; a u64 above INT64_MAX is refused.
  absl::StatusOr<int64_t> Int() const;
  // Float: f32 or f64.
  absl::StatusOr<double> Float() const;
  absl::StatusOr<bool> Bool() const;
  absl::StatusOr<absl::string_view> String() const;
  absl::StatusOr<absl::Span<const absl::string_view>> StringArray() const;
  absl::StatusOr<std::vector<int64_t>> IntArray() const;
  // f32 elements (f64 elements narrowed).
  absl::StatusOr<std::vector<float>> FloatArray() const;

  // A short rendering for messages and listings: `42`, `"llama"`, `[string x 49152]`.
  std::string ToString() const;

 private:
  friend class GgufParser;

  absl::string_view key_;
  GgufValueType type_ = GgufValueType::kU8;
  GgufValueType element_type_ = GgufValueType::kU8;
  int64_t count_ = 1;
  // Scalars and numeric arrays: the little-endian element bytes; strings: the text.
  absl::Span<const std::byte> bytes_;
  std::vector<absl::string_view> strings_;  // arrays of strings
};

// One tensor; `data` lies inside the file's data section.
struct GgufTensor {
  absl::string_view name;
  uint32_t type = 0;  // the file's type id
  DType dtype = DType::kF32;
  // Row-major, outermost first: GGUF lists dims innermost first, so a [rows, cols]
  // matrix is stored as (cols, rows) and its rows are `cols` elements long.
  Shape shape;
  int64_t offset = 0;  // from the start of the data section
  absl::Span<const std::byte> data;
};

// A parsed and checked GGUF file. Move-only; views stay valid across moves.
class GgufFile {
 public:
  // Maps `path` (a regular file; errors carry the errno text and the path) and parses it.
  static absl::StatusOr<GgufFile> Open(const std::string& path, const GgufLimits& limits = {});
  // Parses bytes the caller keeps alive for the life of the result. `source` names them in
  // messages. Every error is InvalidArgument naming `source`, the byte offset or the
  // key/tensor, and what was wrong (ResourceExhausted if allocation fails).
  static absl::StatusOr<GgufFile> Parse(absl::Span<const std::byte> bytes,
                                        absl::string_view source, const GgufLimits& limits = {});

  GgufFile(GgufFile&&) = default;
  GgufFile& operator=(GgufFile&&) = default;

  const std::string& source() const { return source_; }
  uint32_t version() const { return version_; }
  int64_t alignment() const { return alignment_; }
  // Where the data section starts in the file.
  int64_t data_offset() const { return data_offset_; }

  // In file order.
  absl::Span<const GgufValue> metadata() const { return metadata_; }
  // nullptr when the key is absent.
  const GgufValue* Find(absl::string_view key) const;

  // The typed reads of GgufValue for `key`, with `source` in the message; NotFound naming
  // the key when it is absent.
  absl::StatusOr<int64_t> GetInt(absl::string_view key) const;
  absl::StatusOr<double> GetFloat(absl::string_view key) const;
  absl::StatusOr<bool> GetBool(absl::string_view key) const;
  absl::StatusOr<absl::string_view> GetString(absl::string_view key) const;
  absl::StatusOr<absl::Span<const absl::string_view>> GetStringArray(absl::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(absl::string_view key) const;
  absl::StatusOr<std::vector<float>> GetFloatArray(absl::string_view key) const;

  // In the order of the file's tensor infos.
  absl::Span<const GgufTensor> tensors() const { return tensors_; }
  // nullptr when the file has no tensor of that name.
  const GgufTensor* FindTensor(absl::string_view name) const;

 private:
  friend class GgufParser;
  friend class GgufModel;  // holds one, filled after its checks
  GgufFile() = default;

  // Adds source_ to a value's error.
  absl::Status Wrap(const absl::Status& s) const;
  absl::StatusOr<const GgufValue*> Require(absl::string_view key) const;
  template <typename T>
  absl::StatusOr<T> Get(absl::string_view key, absl::StatusOr<T> (GgufValue::*read)() const) const;

  MappedFile file_;  // empty for Parse()
  std::string source_;
  uint32_t version_ = 0;
  int64_t alignment_ = 32;
  int64_t data_offset_ = 0;
  std::vector<GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
  absl::flat_hash_map<absl::string_view, size_t> key_index_;
  absl::flat_hash_map<absl::string_view, size_t> tensor_index_;
};

}  // namespace sg

#endif  // STEPGRAPH_MODELS_GGUF_H_
