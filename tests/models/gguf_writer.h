// A small GGUF writer for tests: files are described as metadata pairs and tensor infos,
// every field can be set to a hostile value, and Build() lays them out byte for byte as
// the format says (little-endian), so the reader is tested on files the tests control.
#ifndef STEPGRAPH_TESTS_MODELS_GGUF_WRITER_H_
#define STEPGRAPH_TESTS_MODELS_GGUF_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace sg::testing {

// Encoded values: the u32 type followed by the value, as a metadata pair stores it.
namespace gguf_value {

template <typename T>
std::string Raw(T v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(s.data(), &v, sizeof(T));
  return s;
}
inline std::string Str(const std::string& s) { return Raw<uint64_t>(s.size()) + s; }
inline std::string Typed(uint32_t type, const std::string& payload) {
  return Raw<uint32_t>(type) + payload;
}
inline std::string U8(uint8_t v) { return Typed(0, Raw(v)); }
inline std::string I8(int8_t v) { return Typed(1, Raw(v)); }
inline std::string U16(uint16_t v) { return Typed(2, Raw(v)); }
inline std::string I16(int16_t v) { return Typed(3, Raw(v)); }
inline std::string U32(uint32_t v) { return Typed(4, Raw(v)); }
inline std::string I32(int32_t v) { return Typed(5, Raw(v)); }
inline std::string F32(float v) { return Typed(6, Raw(v)); }
inline std::string Bool(bool v) { return Typed(7, Raw<uint8_t>(v ? 1 : 0)); }
inline std::string String(const std::string& s) { return Typed(8, Str(s)); }
inline std::string U64(uint64_t v) { return Typed(10, Raw(v)); }
inline std::string I64(int64_t v) { return Typed(11, Raw(v)); }
inline std::string F64(double v) { return Typed(12, Raw(v)); }
// An array of `element_type` whose elements are already encoded without their type.
inline std::string Array(uint32_t element_type, const std::vector<std::string>& elements,
                         std::optional<uint64_t> count = std::nullopt) {
  std::string s = Raw<uint32_t>(9) + Raw<uint32_t>(element_type) +
                  Raw<uint64_t>(count.value_or(elements.size()));
  for (const std::string& e : elements) s += e;
  return s;
}
inline std::string Strings(const std::vector<std::string>& v) {
  std::vector<std::string> e;
  for (const std::string& s : v) e.push_back(Str(s));
  return Array(8, e);
}
template <typename T>
std::string Numbers(uint32_t element_type, const std::vector<T>& v) {
  std::vector<std::string> e;
  for (T x : v) e.push_back(Raw(x));
  return Array(element_type, e);
}

}  // namespace gguf_value

// GGUF tensor type ids used by the tests.
enum GgufTestType : uint32_t {
  kGgufF32 = 0, kGgufF16 = 1, kGgufQ4_0 = 2, kGgufQ4_1 = 3, kGgufQ5_0 = 6, kGgufQ5_1 = 7,
  kGgufQ8_0 = 8, kGgufQ2_K = 10, kGgufQ4_K = 12, kGgufQ5_K = 13, kGgufQ6_K = 14, kGgufBF16 = 30,
};

// Bytes of a tensor of a supported type, from its dims (innermost first).
inline uint64_t GgufTestTensorBytes(uint32_t type, const std::vector<uint64_t>& dims) {
  uint64_t block = 1, bytes = 4;
  switch (type) {
    case kGgufF32: break;
    case kGgufF16: case kGgufBF16: bytes = 2; break;
    case kGgufQ8_0: block = 32; bytes = 34; break;
    case kGgufQ4_0: block = 32; bytes = 18; break;
    case kGgufQ4_1: block = 32; bytes = 20; break;
    case kGgufQ5_0: block = 32; bytes = 22; break;
    case kGgufQ5_1: block = 32; bytes = 24; break;
    case kGgufQ4_K: block = 256; bytes = 144; break;
    case kGgufQ5_K: block = 256; bytes = 176; break;
    case kGgufQ6_K: block = 256; bytes = 210; break;
    default: return 0;
  }
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  return n / block * bytes;
}

struct GgufTestTensor {
  std::string name;
  std::vector<uint64_t> dims;  // innermost first, as the file stores them
  uint32_t type = kGgufF32;
  std::optional<uint64_t> offset;  // default: packed after the previous one, aligned
  std::optional<uint64_t> bytes;   // default: GgufTestTensorBytes
  std::optional<uint32_t> n_dims;  // default: dims.size()
};

struct GgufTestFile {
  uint32_t version = 3;
  std::string magic = "GGUF";
  std::vector<std::pair<std::string, std::string>> metadata;  // key, encoded value
  std::vector<GgufTestTensor> tensors;
  uint64_t alignment = 32;  // how Build() lays out the data; say so with general.alignment
  std::optional<uint64_t> tensor_count, metadata_count;
  // Bytes of the data section; default: up to the end of the last tensor.
  std::optional<uint64_t> data_bytes;
  uint32_t seed = 1;

  void Add(const std::string& key, const std::string& value) { metadata.emplace_back(key, value); }

  // The file, and where its data section begins. Tensor data is random; the file ends at
  // the end of the last tensor's bytes (no trailing padding).
  std::string Build(uint64_t* data_start = nullptr) const {
    using gguf_value::Raw;
    // Appends one piece at a time (GCC 12 warns falsely on long chains of operator+).
    std::string s = magic;
    s += Raw(version);
    s += Raw<uint64_t>(tensor_count.value_or(tensors.size()));
    s += Raw<uint64_t>(metadata_count.value_or(metadata.size()));
    for (const auto& [k, v] : metadata) {
      s += gguf_value::Str(k);
      s += v;
    }
    std::vector<uint64_t> offsets, sizes;
    uint64_t next = 0;
    for (const GgufTestTensor& t : tensors) {
      s += gguf_value::Str(t.name);
      s += Raw<uint32_t>(t.n_dims.value_or(t.dims.size()));
      for (uint64_t d : t.dims) s += Raw(d);
      const uint64_t size = t.bytes.value_or(GgufTestTensorBytes(t.type, t.dims));
      const uint64_t offset = t.offset.value_or(next);
      s += Raw(t.type);
      s += Raw(offset);
      offsets.push_back(offset);
      sizes.push_back(size);
      next = (offset + size + alignment - 1) / alignment * alignment;
    }
    const uint64_t data = (s.size() + alignment - 1) / alignment * alignment;
    if (data_start != nullptr) *data_start = data;
    if (tensors.empty()) return s;
    uint64_t end = 0;
    for (size_t i = 0; i < offsets.size(); ++i) end = std::max(end, offsets[i] + sizes[i]);
    const uint64_t data_len = data_bytes.value_or(end);
    s.resize(data + data_len, '\0');
    std::mt19937 rng(seed);
    for (size_t i = 0; i < offsets.size(); ++i) {
      for (uint64_t j = 0; j < sizes[i] && offsets[i] + j < data_len; ++j) {
        s[data + offsets[i] + j] = static_cast<char>(rng());
      }
    }
    return s;
  }
};

}  // namespace sg::testing

#endif  // STEPGRAPH_TESTS_MODELS_GGUF_WRITER_H_
