// GGUF parsing. Layout (all little-endian): "GGUF", u32 version, u64 tensor count, u64
// metadata count; the metadata (string key, u32 type, value); the tensor infos (string
// name, u32 dims, u64 dims innermost first, u32 type, u64 offset); padding to the
// alignment; the data section. A string is a u64 length and that many bytes. Every read
// goes through Cursor, which checks the bytes left first, so a truncated or hostile
// header gives an error naming the offset, never a read out of bounds.
#include "models/gguf.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "stepgraph/base/status.h"

namespace sg {

static_assert(std::endian::native == std::endian::little,
              "GGUF values are read in place as little-endian");

namespace {

constexpr uint32_t kMinVersion = 2;  // version 1 had 32-bit counts and lengths
constexpr uint32_t kMaxVersion = 3;
constexpr int64_t kDefaultAlignment = 32;
constexpr int64_t kMaxAlignment = int64_t{1} << 20;
constexpr int kMaxDims = 4;  // GGUF's own bound, and Shape::kMaxRank
// The smallest metadata pair (empty key, type, one byte) and tensor info (empty name, one
// dim, type, offset): a count larger than the bytes left divided by these cannot be real.
constexpr uint64_t kMinPairBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;
static_assert(Shape::kMaxRank >= kMaxDims);

// Tensor types by their GGUF ids; `dtype` only for the ones stepgraph runs.
struct GgufTypeInfo {
  uint32_t id;
  absl::string_view name;
  bool supported;
  DType dtype;
};
constexpr GgufTypeInfo kTensorTypes[] = {
    {0, "F32", true, DType::kF32},      {1, "F16", true, DType::kF16},
    {2, "Q4_0", true, DType::kQ4_0},    {3, "Q4_1", true, DType::kQ4_1},
    {6, "Q5_0", true, DType::kQ5_0},    {7, "Q5_1", true, DType::kQ5_1},
    {8, "Q8_0", true, DType::kQ8_0},    {9, "Q8_1", false, {}},
    {10, "Q2_K", false, {}},            {11, "Q3_K", false, {}},
    {12, "Q4_K", true, DType::kQ4_K},   {13, "Q5_K", true, DType::kQ5_K},
    {14, "Q6_K", true, DType::kQ6_K},   {15, "Q8_K", false, {}},
    {16, "IQ2_XXS", false, {}},         {17, "IQ2_XS", false, {}},
    {18, "IQ3_XXS", false, {}},         {19, "IQ1_S", false, {}},
    {20, "IQ4_NL", false, {}},          {21, "IQ3_S", false, {}},
    {22, "IQ2_S", false, {}},           {23, "IQ4_XS", false, {}},
    {24, "I8", false, {}},              {25, "I16", false, {}},
    {26, "I32", false, {}},             {27, "I64", false, {}},
    {28, "F64", false, {}},             {29, "IQ1_M", false, {}},
    {30, "BF16", true, DType::kBF16},   {34, "TQ1_0", false, {}},
    {35, "TQ2_0", false, {}},           {39, "MXFP4", false, {}},
};

const GgufTypeInfo* FindTensorType(uint32_t id) {
  for (const GgufTypeInfo& t : kTensorTypes) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

constexpr absl::string_view kSupportedTypes =
    "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K";

// Bytes of one element of a fixed-size value type; 0 for string and array.
int64_t FixedSize(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kU16:
    case GgufValueType::kI16:
      return 2;
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kF32:
      return 4;
    case GgufValueType::kU64:
    case GgufValueType::kI64:
    case GgufValueType::kF64:
      return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      return 0;
  }
  return 0;
}

bool KnownValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kF64); }

bool IsInteger(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kU16:
    case GgufValueType::kI16:
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kU64:
    case GgufValueType::kI64:
      return true;
    default:
      return false;
  }
}

template <typename T>
T Load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Element `i` of an integer value or array; false for a u64 above INT64_MAX.
bool LoadInt(GgufValueType t, const std::byte* base, int64_t i, int64_t* out) {
  switch (t) {
    case GgufValueType::kU8: *out = Load<uint8_t>(base + i); return true;
    case GgufValueType::kI8: *out = Load<int8_t>(base + i); return true;
    case GgufValueType::kU16: *out = Load<uint16_t>(base + 2 * i); return true;
    case GgufValueType::kI16: *out = Load<int16_t>(base + 2 * i); return true;
    case GgufValueType::kU32: *out = Load<uint32_t>(base + 4 * i); return true;
    case GgufValueType::kI32: *out = Load<int32_t>(base + 4 * i); return true;
    case GgufValueType::kI64: *out = Load<int64_t>(base + 8 * i); return true;
    case GgufValueType::kU64: {
      const uint64_t u = Load<uint64_t>(base + 8 * i);
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
      *out = static_cast<int64_t>(u);
      return true;
    }
    default:
      return false;
  }
}

absl::string_view KindOf(GgufValueType type, GgufValueType element) {
  return type == GgufValueType::kArray ? "array" : GgufValueTypeName(element);
}

// Shortens a name taken from the file for a message; names are not trusted to be short.
std::string Quote(absl::string_view s) {
  std::string out(s.substr(0, 80));
  if (s.size() > 80) out += "...";
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return absl::StrCat("'", out, "'");
}

}  // namespace

absl::string_view GgufValueTypeName(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8: return "u8";
    case GgufValueType::kI8: return "i8";
    case GgufValueType::kU16: return "u16";
    case GgufValueType::kI16: return "i16";
    case GgufValueType::kU32: return "u32";
    case GgufValueType::kI32: return "i32";
    case GgufValueType::kF32: return "f32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kU64: return "u64";
    case GgufValueType::kI64: return "i64";
    case GgufValueType::kF64: return "f64";
  }
  return "?";
}

absl::string_view GgufTensorTypeName(uint32_t type) {
  const GgufTypeInfo* t = FindTensorType(type);
  return t == nullptr ? absl::string_view() : t->name;
}

// ---- GgufValue ----

namespace {

absl::Status WrongType(absl::string_view key, absl::string_view want, GgufValueType type,
                       GgufValueType element) {
  std::string have = type == GgufValueType::kArray
                         ? absl::StrCat("an array of ", GgufValueTypeName(element))
                         : absl::StrCat("a ", GgufValueTypeName(type));
  return absl::InvalidArgumentError(
      absl::StrCat("key ", Quote(key), ": expected ", want, ", got ", have));
}

}  // namespace

absl::StatusOr<int64_t> GgufValue::Int() const {
  if (is_array() || !IsInteger(type_)) return WrongType(key_, "an integer", type_, element_type_);
  int64_t v = 0;
  if (!LoadInt(type_, bytes_.data(), 0, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("key ", Quote(key_), ": u64 value ", Load<uint64_t>(bytes_.data()),
                     " is too large"));
  }
  return v;
}

absl::StatusOr<double> GgufValue::Float() const {
  if (type_ == GgufValueType::kF32) return static_cast<double>(Load<float>(bytes_.data()));
  if (type_ == GgufValueType::kF64) return Load<double>(bytes_.data());
  return WrongType(key_, "a float (f32 or f64)", type_, element_type_);
}

absl::StatusOr<bool> GgufValue::Bool() const {
  if (type_ != GgufValueType::kBool) return WrongType(key_, "a bool", type_, element_type_);
  return bytes_[0] != std::byte{0};
}

absl::StatusOr<absl::string_view> GgufValue::String() const {
  if (type_ != GgufValueType::kString) return WrongType(key_, "a string", type_, element_type_);
  return absl::string_view(reinterpret_cast<const char*>(bytes_.data()), bytes_.size());
}

absl::StatusOr<absl::Span<const absl::string_view>> GgufValue::StringArray() const {
  if (!is_array() || element_type_ != GgufValueType::kString) {
    return WrongType(key_, "an array of string", type_, element_type_);
  }
  return absl::Span<const absl::string_view>(strings_);
}

absl::StatusOr<std::vector<int64_t>> GgufValue::IntArray() const {
  if (!is_array() || !IsInteger(element_type_)) {
    return WrongType(key_, "an array of integers", type_, element_type_);
  }
  std::vector<int64_t> out(static_cast<size_t>(count_));
  for (int64_t i = 0; i < count_; ++i) {
    if (!LoadInt(element_type_, bytes_.data(), i, &out[static_cast<size_t>(i)])) {
      return absl::InvalidArgumentError(
          absl::StrCat("key ", Quote(key_), ": element ", i, " is a u64 too large for i64"));
    }
  }
  return out;
}

absl::StatusOr<std::vector<float>> GgufValue::FloatArray() const {
  const bool f32 = element_type_ == GgufValueType::kF32;
  if (!is_array() || (!f32 && element_type_ != GgufValueType::kF64)) {
    return WrongType(key_, "an array of f32 or f64", type_, element_type_);
  }
  std::vector<float> out(static_cast<size_t>(count_));
  for (int64_t i = 0; i < count_; ++i) {
    out[static_cast<size_t>(i)] = f32 ? Load<float>(bytes_.data() + 4 * i)
                                      : static_cast<float>(Load<double>(bytes_.data() + 8 * i));
  }
  return out;
}

std::string GgufValue::ToString() const {
  if (is_array()) return absl::StrCat("[", GgufValueTypeName(element_type_), " x ", count_, "]");
  if (IsInteger(type_)) {
    int64_t v = 0;
    if (LoadInt(type_, bytes_.data(), 0, &v)) return absl::StrCat(v);
    return absl::StrCat(Load<uint64_t>(bytes_.data()));
  }
  switch (type_) {
    case GgufValueType::kF32: return absl::StrCat(Load<float>(bytes_.data()));
    case GgufValueType::kF64: return absl::StrCat(Load<double>(bytes_.data()));
    case GgufValueType::kBool: return bytes_[0] != std::byte{0} ? "true" : "false";
    case GgufValueType::kString: {
      std::string q = Quote(*String());
      q.front() = q.back() = '"';
      return q;
    }
    default: return "?";
  }
}

// ---- parsing ----

// Reads the header of one file into a GgufFile (a friend of both classes).
class GgufParser {
 public:
  GgufParser(absl::Span<const std::byte> bytes, const GgufLimits& limits, GgufFile& out)
      : bytes_(bytes), limits_(limits), out_(out) {}

  absl::Status Run();

 private:
  uint64_t left() const { return bytes_.size() - pos_; }

  template <typename... Parts>
  absl::Status Error(const Parts&... parts) const {
    return absl::InvalidArgumentError(absl::StrCat(out_.source_, ": ", parts...));
  }

  // `n` bytes at the cursor, which then moves past them.
  absl::Status Take(uint64_t n, absl::string_view what, absl::Span<const std::byte>* out) {
    if (n > left()) {
      return Error("truncated at byte ", pos_, ": ", context_, what, " needs ", n, " bytes, ",
                   left(), " left");
    }
    *out = bytes_.subspan(pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }
  template <typename T>
  absl::Status Read(absl::string_view what, T* out) {
    absl::Span<const std::byte> b;
    SG_RETURN_IF_ERROR(Take(sizeof(T), what, &b));
    *out = Load<T>(b.data());
    return absl::OkStatus();
  }
  absl::Status ReadString(absl::string_view what, absl::string_view* out) {
    const uint64_t at = pos_;
    uint64_t len = 0;
    SG_RETURN_IF_ERROR(Read(what, &len));
    if (len > static_cast<uint64_t>(limits_.max_string_bytes)) {
      return Error("byte ", at, ": ", context_, what, " of ", len,
                   " bytes exceeds the limit of ", limits_.max_string_bytes);
    }
    absl::Span<const std::byte> b;
    SG_RETURN_IF_ERROR(Take(len, what, &b));
    *out = absl::string_view(reinterpret_cast<const char*>(b.data()), b.size());
    return absl::OkStatus();
  }

  absl::Status ReadValue(GgufValue& v);
  absl::Status ReadTensorInfo(GgufTensor& t);
  absl::Status CheckBools(const GgufValue& v) const;

  absl::Span<const std::byte> bytes_;
  const GgufLimits& limits_;
  GgufFile& out_;
  uint64_t pos_ = 0;
  // What is being read, for messages: "key 'x': ", "tensor 'y': " or empty.
  std::string context_;
};

absl::Status GgufParser::CheckBools(const GgufValue& v) const {
  for (std::byte b : v.bytes_) {
    if (b != std::byte{0} && b != std::byte{1}) {
      return Error("key ", Quote(v.key_), ": bool byte ", static_cast<int>(b),
                   " is neither 0 nor 1");
    }
  }
  return absl::OkStatus();
}

absl::Status GgufParser::ReadValue(GgufValue& v) {
  constexpr absl::string_view what = "value";
  uint32_t raw_type = 0;
  SG_RETURN_IF_ERROR(Read("value type", &raw_type));
  if (!KnownValueType(raw_type)) {
    return Error("key ", Quote(v.key_), ": unknown value type ", raw_type);
  }
  v.type_ = v.element_type_ = static_cast<GgufValueType>(raw_type);
  if (v.type_ == GgufValueType::kString) {
    absl::string_view s;
    SG_RETURN_IF_ERROR(ReadString(what, &s));
    v.bytes_ = absl::Span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size());
    return absl::OkStatus();
  }
  if (v.type_ != GgufValueType::kArray) {
    SG_RETURN_IF_ERROR(Take(FixedSize(v.type_), what, &v.bytes_));
    return v.type_ == GgufValueType::kBool ? CheckBools(v) : absl::OkStatus();
  }

  uint32_t raw_element = 0;
  SG_RETURN_IF_ERROR(Read("array element type", &raw_element));
  if (!KnownValueType(raw_element)) {
    return Error("key ", Quote(v.key_), ": unknown array element type ", raw_element);
  }
  v.element_type_ = static_cast<GgufValueType>(raw_element);
  if (v.element_type_ == GgufValueType::kArray) {
    return Error("key ", Quote(v.key_), ": arrays of arrays are not supported");
  }
  const uint64_t at = pos_;
  uint64_t count = 0;
  SG_RETURN_IF_ERROR(Read("array length", &count));
  if (count > static_cast<uint64_t>(limits_.max_array_elements)) {
    return Error("byte ", at, ": key ", Quote(v.key_), ": array of ", count,
                 " elements exceeds the limit of ", limits_.max_array_elements);
  }
  v.count_ = static_cast<int64_t>(count);
  if (v.element_type_ != GgufValueType::kString) {
    // The default limit keeps this far from overflow; a caller may raise it.
    int64_t n = 0;
    if (!CheckedMul(v.count_, FixedSize(v.element_type_), &n)) {
      return Error("key ", Quote(v.key_), ": array size overflows");
    }
    SG_RETURN_IF_ERROR(Take(static_cast<uint64_t>(n), what, &v.bytes_));
    return v.element_type_ == GgufValueType::kBool ? CheckBools(v) : absl::OkStatus();
  }
  // Every string takes at least its 8-byte length: refuse a count the file cannot hold
  // before reserving for it.
  if (count > left() / 8) {
    return Error("truncated at byte ", pos_, ": key ", Quote(v.key_), " says ", count,
                 " strings but only ", left(), " bytes are left");
  }
  v.strings_.reserve(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) {
    absl::string_view s;
    SG_RETURN_IF_ERROR(ReadString("string element", &s));
    v.strings_.push_back(s);
  }
  return absl::OkStatus();
}

absl::Status GgufParser::ReadTensorInfo(GgufTensor& t) {
  SG_RETURN_IF_ERROR(ReadString("tensor name", &t.name));
  if (t.name.empty()) return Error("byte ", pos_, ": a tensor has an empty name");
  const std::string who = absl::StrCat("tensor ", Quote(t.name));
  context_ = absl::StrCat(who, ": ");
  uint32_t n_dims = 0;
  SG_RETURN_IF_ERROR(Read("dims count", &n_dims));
  if (n_dims < 1 || n_dims > kMaxDims) {
    return Error(who, ": ", n_dims, " dims (1 to ", kMaxDims, " are allowed)");
  }
  int64_t dims[kMaxDims];  // row-major: reversed from the file
  int64_t elements = 1;
  for (uint32_t i = 0; i < n_dims; ++i) {
    uint64_t d = 0;
    SG_RETURN_IF_ERROR(Read("dim", &d));
    if (d == 0) return Error(who, ": dim ", i, " is 0");
    if (d > static_cast<uint64_t>(Shape::kMaxElements) ||
        !CheckedMul(elements, static_cast<int64_t>(d), &elements) ||
        elements > Shape::kMaxElements) {
      return Error(who, ": dims overflow the limit of 2^48 elements at dim ", i, " (", d, ")");
    }
    dims[n_dims - 1 - i] = static_cast<int64_t>(d);
  }
  t.shape = Shape(absl::Span<const int64_t>(dims, n_dims));
  if (!t.shape.valid()) return Error(who, ": invalid shape: ", t.shape.Invalidity());

  SG_RETURN_IF_ERROR(Read("type", &t.type));
  const GgufTypeInfo* type = FindTensorType(t.type);
  if (type == nullptr) return Error(who, ": unknown tensor type ", t.type);
  if (!type->supported) {
    return Error(who, ": type ", type->name, " is not supported (stepgraph reads ",
                 kSupportedTypes, ")");
  }
  t.dtype = type->dtype;
  if (DTypeRowBytes(t.dtype, t.shape.cols()) < 0) {
    return Error(who, " (", type->name, ", ", t.shape.ToString(), "): rows of ",
                 t.shape.cols(), " elements are not a whole number of ",
                 DTypeBlockElems(t.dtype), "-element blocks");
  }
  uint64_t offset = 0;
  SG_RETURN_IF_ERROR(Read("offset", &offset));
  if (offset % static_cast<uint64_t>(out_.alignment_) != 0) {
    return Error(who, ": offset ", offset, " is not a multiple of the alignment ",
                 out_.alignment_);
  }
  if (offset > bytes_.size()) {
    return Error(who, ": offset ", offset, " is past the end of the ", bytes_.size(),
                 "-byte file");
  }
  t.offset = static_cast<int64_t>(offset);
  return absl::OkStatus();
}

absl::Status GgufParser::Run() {
  absl::Span<const std::byte> magic;
  SG_RETURN_IF_ERROR(Take(4, "the magic \"GGUF\"", &magic));
  if (std::memcmp(magic.data(), "GGUF", 4) != 0) {
    return Error("not a GGUF file (the first 4 bytes are not \"GGUF\")");
  }
  uint32_t version = 0;
  SG_RETURN_IF_ERROR(Read("version", &version));
  if (version < kMinVersion || version > kMaxVersion) {
    const uint32_t swapped = __builtin_bswap32(version);
    if (swapped >= kMinVersion && swapped <= kMaxVersion) {
      return Error("big-endian GGUF files are not supported");
    }
    return Error("GGUF version ", version, " is not supported (stepgraph reads versions ",
                 kMinVersion, " and ", kMaxVersion, ")");
  }
  out_.version_ = version;
  uint64_t n_tensors = 0, n_metadata = 0;
  SG_RETURN_IF_ERROR(Read("tensor count", &n_tensors));
  SG_RETURN_IF_ERROR(Read("metadata count", &n_metadata));
  if (n_tensors > static_cast<uint64_t>(limits_.max_tensors)) {
    return Error("tensor count ", n_tensors, " exceeds the limit of ", limits_.max_tensors);
  }
  if (n_metadata > static_cast<uint64_t>(limits_.max_metadata)) {
    return Error("metadata count ", n_metadata, " exceeds the limit of ", limits_.max_metadata);
  }
  // Both counts must fit in what is left before anything is reserved for them.
  if (n_metadata > left() / kMinPairBytes ||
      n_tensors > (left() - n_metadata * kMinPairBytes) / kMinTensorInfoBytes) {
    return Error("truncated: ", n_metadata, " metadata pairs and ", n_tensors,
                 " tensor infos cannot fit in the ", left(), " bytes after the header");
  }

  out_.metadata_.reserve(static_cast<size_t>(n_metadata));
  for (uint64_t i = 0; i < n_metadata; ++i) {
    GgufValue v;
    context_ = absl::StrCat("metadata pair ", i, ": ");
    SG_RETURN_IF_ERROR(ReadString("key", &v.key_));
    if (v.key_.empty()) return Error("metadata pair ", i, " has an empty key");
    context_ = absl::StrCat("key ", Quote(v.key_), ": ");
    SG_RETURN_IF_ERROR(ReadValue(v));
    if (!out_.key_index_.emplace(v.key_, out_.metadata_.size()).second) {
      return Error("key ", Quote(v.key_), " appears twice");
    }
    out_.metadata_.push_back(std::move(v));
  }

  if (const GgufValue* a = out_.Find("general.alignment")) {
    if (a->type() != GgufValueType::kU32) {
      return Error("general.alignment must be a u32, got ", KindOf(a->type(), a->element_type()));
    }
    const int64_t alignment = *a->Int();
    if (alignment < 1 || alignment > kMaxAlignment || (alignment & (alignment - 1)) != 0) {
      return Error("general.alignment ", alignment, " is not a power of two from 1 to ",
                   kMaxAlignment);
    }
    out_.alignment_ = alignment;
  } else {
    out_.alignment_ = kDefaultAlignment;
  }

  out_.tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    context_ = absl::StrCat("tensor info ", i, ": ");
    SG_RETURN_IF_ERROR(ReadTensorInfo(t));
    if (!out_.tensor_index_.emplace(t.name, out_.tensors_.size()).second) {
      return Error("tensor ", Quote(t.name), " appears twice");
    }
    out_.tensors_.push_back(t);
  }

  // The data section starts at the next multiple of the alignment (pos_ is at most the
  // file size and the alignment at most 2^20, so this cannot overflow).
  context_.clear();
  const uint64_t a = static_cast<uint64_t>(out_.alignment_);
  const uint64_t data = (pos_ + a - 1) / a * a;
  out_.data_offset_ = static_cast<int64_t>(data);
  if (out_.tensors_.empty()) return absl::OkStatus();
  if (data > bytes_.size()) {
    return Error("truncated: the data section would start at byte ", data, ", past the end of the ",
                 bytes_.size(), "-byte file");
  }
  const uint64_t data_size = bytes_.size() - data;
  for (GgufTensor& t : out_.tensors_) {
    const int64_t n = TensorBytes(t.dtype, t.shape);  // >= 0: shape and blocks were checked
    const uint64_t offset = static_cast<uint64_t>(t.offset);
    if (offset > data_size || static_cast<uint64_t>(n) > data_size - offset) {
      return Error("tensor ", Quote(t.name), " (", GgufTensorTypeName(t.type), ", ",
                   t.shape.ToString(), ", ", n, " bytes at offset ", t.offset,
                   ") runs past the end of the ", data_size, "-byte data section");
    }
    t.data = bytes_.subspan(data + offset, static_cast<size_t>(n));
  }
  std::vector<const GgufTensor*> order;
  order.reserve(out_.tensors_.size());
  for (const GgufTensor& t : out_.tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const GgufTensor* x, const GgufTensor* y) { return x->offset < y->offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const GgufTensor& prev = *order[i - 1];
    const GgufTensor& t = *order[i];
    if (t.offset < prev.offset + static_cast<int64_t>(prev.data.size())) {
      return Error("tensors ", Quote(prev.name), " [", prev.offset, ", ",
                   prev.offset + static_cast<int64_t>(prev.data.size()), ") and ", Quote(t.name),
                   " [", t.offset, ", ", t.offset + static_cast<int64_t>(t.data.size()),
                   ") overlap");
    }
  }
  return absl::OkStatus();
}

// ---- GgufFile ----

absl::StatusOr<GgufFile> GgufFile::Parse(absl::Span<const std::byte> bytes,
                                         absl::string_view source, const GgufLimits& limits) {
  try {
    GgufFile f;
    f.source_ = std::string(source);
    SG_RETURN_IF_ERROR(GgufParser(bytes, limits, f).Run());
    return f;
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(source, ": out of memory while reading the GGUF header"));
  }
}

absl::StatusOr<GgufFile> GgufFile::Open(const std::string& path, const GgufLimits& limits) {
  SG_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path));
  SG_ASSIGN_OR_RETURN(GgufFile f, Parse(mapped.bytes(), path, limits));
  // The views point into the mapping, whose address a move does not change.
  f.file_ = std::move(mapped);
  return f;
}

const GgufValue* GgufFile::Find(absl::string_view key) const {
  auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second];
}

const GgufTensor* GgufFile::FindTensor(absl::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::Status GgufFile::Wrap(const absl::Status& s) const {
  return absl::Status(s.code(), absl::StrCat(source_, ": ", s.message()));
}

absl::StatusOr<const GgufValue*> GgufFile::Require(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) {
    return absl::NotFoundError(absl::StrCat(source_, ": key ", Quote(key), " is missing"));
  }
  return v;
}

template <typename T>
absl::StatusOr<T> GgufFile::Get(absl::string_view key,
                                absl::StatusOr<T> (GgufValue::*read)() const) const {
  SG_ASSIGN_OR_RETURN(const GgufValue* v, Require(key));
  absl::StatusOr<T> r = (v->*read)();
  if (!r.ok()) return Wrap(r.status());
  return r;
}

absl::StatusOr<int64_t> GgufFile::GetInt(absl::string_view key) const {
  return Get(key, &GgufValue::Int);
}
absl::StatusOr<double> GgufFile::GetFloat(absl::string_view key) const {
  return Get(key, &GgufValue::Float);
}
absl::StatusOr<bool> GgufFile::GetBool(absl::string_view key) const {
  return Get(key, &GgufValue::Bool);
}
absl::StatusOr<absl::string_view> GgufFile::GetString(absl::string_view key) const {
  return Get(key, &GgufValue::String);
}
absl::StatusOr<absl::Span<const absl::string_view>> GgufFile::GetStringArray(
    absl::string_view key) const {
  return Get(key, &GgufValue::StringArray);
}
absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(absl::string_view key) const {
  return Get(key, &GgufValue::IntArray);
}
absl::StatusOr<std::vector<float>> GgufFile::GetFloatArray(absl::string_view key) const {
  return Get(key, &GgufValue::FloatArray);
}

}  // namespace sg
