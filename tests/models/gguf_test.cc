// The GGUF reader on files the tests write byte by byte (tests/models/gguf_writer.h): good
// files of both versions with every value type read back, and every kind of bad file
// (truncated anywhere, hostile counts and lengths, bad magic, version, alignment, tensors
// misplaced or mistyped) refused with an error naming the file and what was wrong.
#include "models/gguf.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/models/gguf_writer.h"

namespace sg {
namespace {

namespace fs = std::filesystem;
namespace v = testing::gguf_value;
using testing::GgufTestFile;
using testing::GgufTestTensor;

absl::Span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

absl::StatusOr<GgufFile> ParseString(const std::string& s, const GgufLimits& limits = {}) {
  return GgufFile::Parse(Bytes(s), "test.gguf", limits);
}

// The status of parsing `s`, which must be an InvalidArgument naming the source and
// containing `needle`.
void ExpectRefused(const std::string& s, const std::string& needle,
                   const GgufLimits& limits = {}) {
  absl::StatusOr<GgufFile> f = ParseString(s, limits);
  ASSERT_FALSE(f.ok()) << "accepted a file that should fail with '" << needle << "'";
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  EXPECT_NE(f.status().message().find("test.gguf"), absl::string_view::npos) << f.status();
  EXPECT_NE(f.status().message().find(needle), absl::string_view::npos)
      << "message: " << f.status().message() << "\nexpected to contain: " << needle;
}

// A small valid file: a few metadata pairs and two tensors of different types.
GgufTestFile SmallFile() {
  GgufTestFile f;
  f.Add("general.architecture", v::String("llama"));
  f.Add("general.alignment", v::U32(32));
  f.Add("tokenizer.ggml.tokens", v::Strings({"a", "bc", ""}));
  f.Add("x.scores", v::Numbers<float>(6, {0.5f, -1.0f}));
  f.tensors.push_back({"w", {64, 3}, testing::kGgufQ8_0});
  f.tensors.push_back({"norm", {5}, testing::kGgufF32});
  return f;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "sg_gguf_test_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  std::string Write(const std::string& name, const std::string& bytes) const {
    const std::string p = (fs::path(path_) / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

// ---- good files ----

class GgufVersionTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GgufVersionTest, EveryValueTypeRoundTrips) {
  GgufTestFile f;
  f.version = GetParam();
  f.Add("u8", v::U8(200));
  f.Add("i8", v::I8(-100));
  f.Add("u16", v::U16(60000));
  f.Add("i16", v::I16(-30000));
  f.Add("u32", v::U32(4000000000u));
  f.Add("i32", v::I32(-2000000000));
  f.Add("f32", v::F32(1.25e-5f));
  f.Add("bool_t", v::Bool(true));
  f.Add("bool_f", v::Bool(false));
  f.Add("string", v::String("h\xC3\xA9llo"));
  f.Add("empty_string", v::String(""));
  f.Add("u64", v::U64(uint64_t{1} << 60));
  f.Add("i64", v::I64(-(int64_t{1} << 60)));
  f.Add("f64", v::F64(-3.5e200));
  f.Add("a_u8", v::Numbers<uint8_t>(0, {1, 255}));
  f.Add("a_i8", v::Numbers<int8_t>(1, {-1, 7}));
  f.Add("a_u16", v::Numbers<uint16_t>(2, {65535}));
  f.Add("a_i16", v::Numbers<int16_t>(3, {-5, 5, -32768}));
  f.Add("a_u32", v::Numbers<uint32_t>(4, {4294967295u, 0}));
  f.Add("a_i32", v::Numbers<int32_t>(5, {-1, 2, 3}));
  f.Add("a_f32", v::Numbers<float>(6, {0.5f, -2.0f}));
  f.Add("a_bool", v::Numbers<uint8_t>(7, {1, 0, 1}));
  f.Add("a_string", v::Strings({"x", "", "\xE4\xB8\xAD", std::string("n\0ul", 4)}));
  f.Add("a_u64", v::Numbers<uint64_t>(10, {uint64_t{1} << 62}));
  f.Add("a_i64", v::Numbers<int64_t>(11, {-(int64_t{1} << 62), 9}));
  f.Add("a_f64", v::Numbers<double>(12, {1e-30, 2.5}));
  f.Add("a_empty", v::Numbers<float>(6, {}));
  const std::string bytes = f.Build();
  absl::StatusOr<GgufFile> g = ParseString(bytes);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->version(), GetParam());
  EXPECT_EQ(g->alignment(), 32);
  ASSERT_EQ(g->metadata().size(), f.metadata.size());
  EXPECT_EQ(g->metadata()[3].key(), "i16");
  EXPECT_TRUE(g->tensors().empty());

  EXPECT_EQ(*g->GetInt("u8"), 200);
  EXPECT_EQ(*g->GetInt("i8"), -100);
  EXPECT_EQ(*g->GetInt("u16"), 60000);
  EXPECT_EQ(*g->GetInt("i16"), -30000);
  EXPECT_EQ(*g->GetInt("u32"), 4000000000);
  EXPECT_EQ(*g->GetInt("i32"), -2000000000);
  EXPECT_EQ(*g->GetFloat("f32"), static_cast<double>(1.25e-5f));
  EXPECT_TRUE(*g->GetBool("bool_t"));
  EXPECT_FALSE(*g->GetBool("bool_f"));
  EXPECT_EQ(*g->GetString("string"), "h\xC3\xA9llo");
  EXPECT_EQ(*g->GetString("empty_string"), "");
  EXPECT_EQ(*g->GetInt("u64"), int64_t{1} << 60);
  EXPECT_EQ(*g->GetInt("i64"), -(int64_t{1} << 60));
  EXPECT_EQ(*g->GetFloat("f64"), -3.5e200);
  EXPECT_EQ(*g->GetIntArray("a_u8"), (std::vector<int64_t>{1, 255}));
  EXPECT_EQ(*g->GetIntArray("a_i8"), (std::vector<int64_t>{-1, 7}));
  EXPECT_EQ(*g->GetIntArray("a_u16"), (std::vector<int64_t>{65535}));
  EXPECT_EQ(*g->GetIntArray("a_i16"), (std::vector<int64_t>{-5, 5, -32768}));
  EXPECT_EQ(*g->GetIntArray("a_u32"), (std::vector<int64_t>{4294967295, 0}));
  EXPECT_EQ(*g->GetIntArray("a_i32"), (std::vector<int64_t>{-1, 2, 3}));
  EXPECT_EQ(*g->GetFloatArray("a_f32"), (std::vector<float>{0.5f, -2.0f}));
  const GgufValue* bools = g->Find("a_bool");
  ASSERT_NE(bools, nullptr);
  EXPECT_EQ(bools->element_type(), GgufValueType::kBool);
  EXPECT_EQ(bools->size(), 3);
  const auto strings = *g->GetStringArray("a_string");
  ASSERT_EQ(strings.size(), 4u);
  EXPECT_EQ(strings[0], "x");
  EXPECT_EQ(strings[1], "");
  EXPECT_EQ(strings[2], "\xE4\xB8\xAD");
  EXPECT_EQ(strings[3], std::string("n\0ul", 4));
  EXPECT_EQ(*g->GetIntArray("a_u64"), (std::vector<int64_t>{int64_t{1} << 62}));
  EXPECT_EQ(*g->GetIntArray("a_i64"), (std::vector<int64_t>{-(int64_t{1} << 62), 9}));
  EXPECT_EQ(*g->GetFloatArray("a_f64"), (std::vector<float>{1e-30f, 2.5f}));
  EXPECT_TRUE(g->GetFloatArray("a_empty")->empty());

  // Types as stored, and renderings for listings.
  EXPECT_EQ(g->Find("u16")->type(), GgufValueType::kU16);
  EXPECT_EQ(g->Find("a_string")->type(), GgufValueType::kArray);
  EXPECT_EQ(g->Find("a_string")->ToString(), "[string x 4]");
  EXPECT_EQ(g->Find("i8")->ToString(), "-100");
  EXPECT_EQ(g->Find("string")->ToString(), "\"h\xC3\xA9llo\"");
  EXPECT_EQ(g->Find("bool_t")->ToString(), "true");
}

INSTANTIATE_TEST_SUITE_P(Versions, GgufVersionTest, ::testing::Values(2u, 3u));

TEST(GgufTest, TypedGettersNameTheKeyAndBothTypes) {
  GgufTestFile f;
  f.Add("name", v::String("x"));
  f.Add("count", v::U32(3));
  f.Add("big", v::U64(std::numeric_limits<uint64_t>::max()));
  f.Add("list", v::Numbers<int32_t>(5, {1}));
  f.Add("big_list", v::Numbers<uint64_t>(10, {std::numeric_limits<uint64_t>::max()}));
  const std::string bytes = f.Build();
  absl::StatusOr<GgufFile> g = ParseString(bytes);
  ASSERT_TRUE(g.ok()) << g.status();
  auto expect = [](const absl::Status& s, absl::StatusCode code, const std::string& text) {
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_NE(s.message().find(text), absl::string_view::npos) << s.message();
    EXPECT_NE(s.message().find("test.gguf"), absl::string_view::npos) << s.message();
  };
  expect(g->GetInt("name").status(), absl::StatusCode::kInvalidArgument,
         "key 'name': expected an integer, got a string");
  expect(g->GetString("count").status(), absl::StatusCode::kInvalidArgument,
         "key 'count': expected a string, got a u32");
  expect(g->GetFloat("count").status(), absl::StatusCode::kInvalidArgument, "expected a float");
  expect(g->GetBool("count").status(), absl::StatusCode::kInvalidArgument, "expected a bool");
  expect(g->GetInt("list").status(), absl::StatusCode::kInvalidArgument,
         "got an array of i32");
  expect(g->GetIntArray("count").status(), absl::StatusCode::kInvalidArgument,
         "expected an array of integers, got a u32");
  expect(g->GetStringArray("list").status(), absl::StatusCode::kInvalidArgument,
         "expected an array of string");
  expect(g->GetFloatArray("list").status(), absl::StatusCode::kInvalidArgument,
         "expected an array of f32");
  expect(g->GetInt("big").status(), absl::StatusCode::kInvalidArgument, "too large");
  expect(g->GetIntArray("big_list").status(), absl::StatusCode::kInvalidArgument, "too large");
  expect(g->GetInt("absent").status(), absl::StatusCode::kNotFound, "key 'absent' is missing");
  EXPECT_EQ(g->Find("absent"), nullptr);
}

TEST(GgufTest, TensorsAreViewsWithRowMajorShapesAndTheirDTypes) {
  struct Case {
    uint32_t type;
    DType dtype;
    uint64_t cols;
  };
  const Case cases[] = {
      {testing::kGgufF32, DType::kF32, 3},     {testing::kGgufF16, DType::kF16, 5},
      {testing::kGgufBF16, DType::kBF16, 7},   {testing::kGgufQ8_0, DType::kQ8_0, 64},
      {testing::kGgufQ4_0, DType::kQ4_0, 32},  {testing::kGgufQ4_1, DType::kQ4_1, 96},
      {testing::kGgufQ5_0, DType::kQ5_0, 32},  {testing::kGgufQ5_1, DType::kQ5_1, 64},
      {testing::kGgufQ4_K, DType::kQ4_K, 256}, {testing::kGgufQ5_K, DType::kQ5_K, 512},
      {testing::kGgufQ6_K, DType::kQ6_K, 256},
  };
  for (uint32_t version : {2u, 3u}) {
    GgufTestFile f;
    f.version = version;
    f.alignment = 64;
    f.Add("general.alignment", v::U32(64));
    int i = 0;
    for (const Case& c : cases) {
      f.tensors.push_back({absl::StrCat("t", i++), {c.cols, 3, 2}, c.type});
    }
    f.tensors.push_back({"vector", {6}, testing::kGgufF32});
    f.tensors.push_back({"four_d", {2, 3, 4, 5}, testing::kGgufF16});
    uint64_t data = 0;
    const std::string bytes = f.Build(&data);
    absl::StatusOr<GgufFile> g = ParseString(bytes);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->alignment(), 64);
    EXPECT_EQ(g->data_offset(), static_cast<int64_t>(data));
    ASSERT_EQ(g->tensors().size(), f.tensors.size());
    for (size_t k = 0; k < std::size(cases); ++k) {
      const GgufTensor* t = g->FindTensor(absl::StrCat("t", k));
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(t->dtype, cases[k].dtype) << k;
      EXPECT_EQ(t->type, cases[k].type);
      EXPECT_EQ(t->shape, Shape({2, 3, static_cast<int64_t>(cases[k].cols)}));
      EXPECT_EQ(t->offset % 64, 0);
      ASSERT_EQ(static_cast<int64_t>(t->data.size()), TensorBytes(t->dtype, t->shape));
      // The view is the file's bytes at the data section plus the offset.
      EXPECT_EQ(reinterpret_cast<const char*>(t->data.data()),
                bytes.data() + data + t->offset);
    }
    EXPECT_EQ(g->FindTensor("vector")->shape, Shape({6}));
    EXPECT_EQ(g->FindTensor("four_d")->shape, Shape({5, 4, 3, 2}));
    EXPECT_EQ(g->FindTensor("missing"), nullptr);
    EXPECT_EQ(g->tensors()[0].name, "t0");  // file order
  }
}

TEST(GgufTest, EmptyFileOfNoTensorsNeedsNoDataSection) {
  GgufTestFile f;
  f.Add("k", v::U8(1));
  const std::string bytes = f.Build();
  ASSERT_NE(bytes.size() % 32, 0u);
  absl::StatusOr<GgufFile> g = ParseString(bytes);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(g->tensors().empty());
}

TEST(GgufTest, OpenMapsRegularFilesAndNamesThePathOnErrors) {
  TempDir dir;
  const std::string bytes = SmallFile().Build();
  const std::string path = dir.Write("small.gguf", bytes);
  absl::StatusOr<GgufFile> g = GgufFile::Open(path);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->source(), path);
  ASSERT_EQ(g->tensors().size(), 2u);
  const GgufTensor* w = g->FindTensor("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(std::memcmp(w->data.data(), bytes.data() + g->data_offset(), w->data.size()), 0);
  // The views survive a move of the file.
  GgufFile moved = *std::move(g);
  EXPECT_EQ(*moved.GetString("general.architecture"), "llama");
  EXPECT_EQ(moved.FindTensor("norm")->shape, Shape({5}));

  absl::StatusOr<GgufFile> missing = GgufFile::Open(dir / "absent.gguf");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("absent.gguf"), absl::string_view::npos);
  EXPECT_NE(missing.status().message().find("No such file"), absl::string_view::npos)
      << missing.status();

  absl::StatusOr<GgufFile> folder = GgufFile::Open(dir / "");
  EXPECT_EQ(folder.status().code(), absl::StatusCode::kInvalidArgument) << folder.status();
  EXPECT_NE(folder.status().message().find("not a regular file"), absl::string_view::npos);

  // A FIFO would block a plain open; it must be refused at once.
  const std::string fifo = dir / "fifo.gguf";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<GgufFile> pipe = GgufFile::Open(fifo);
  EXPECT_EQ(pipe.status().code(), absl::StatusCode::kInvalidArgument) << pipe.status();

  const std::string bad = dir.Write("bad.gguf", "GGUF");
  absl::StatusOr<GgufFile> truncated = GgufFile::Open(bad);
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(truncated.status().message().find(bad), absl::string_view::npos);
}

// ---- bad files ----

TEST(GgufTest, TruncatedAtEveryByteIsRefused) {
  GgufTestFile f = SmallFile();
  f.Add("a_i16", v::Numbers<int16_t>(3, {1, 2, 3}));
  f.Add("flag", v::Bool(true));
  const std::string bytes = f.Build();
  ASSERT_TRUE(ParseString(bytes).ok()) << ParseString(bytes).status();
  for (size_t n = 0; n < bytes.size(); ++n) {
    absl::StatusOr<GgufFile> g = ParseString(bytes.substr(0, n));
    ASSERT_FALSE(g.ok()) << "a file cut to " << n << " of " << bytes.size() << " bytes parsed";
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
    const absl::string_view m = g.status().message();
    EXPECT_TRUE(m.find("truncated") != m.npos || m.find("past the end") != m.npos ||
                m.find("cannot fit") != m.npos)
        << "cut at " << n << ": " << m;
  }
}

TEST(GgufTest, BadMagicAndVersionsAreRefused) {
  GgufTestFile f = SmallFile();
  f.magic = "GGML";
  ExpectRefused(f.Build(), "not a GGUF file");
  f = SmallFile();
  f.version = 1;
  ExpectRefused(f.Build(), "GGUF version 1 is not supported");
  f.version = 4;
  ExpectRefused(f.Build(), "GGUF version 4 is not supported");
  f.version = 0x03000000;  // a version 3 file written big-endian
  ExpectRefused(f.Build(), "big-endian");
}

TEST(GgufTest, HugeCountsAreRefusedBeforeAllocation) {
  GgufTestFile f = SmallFile();
  f.tensor_count = std::numeric_limits<uint64_t>::max();
  ExpectRefused(f.Build(), "tensor count 18446744073709551615 exceeds the limit");
  f = SmallFile();
  f.metadata_count = uint64_t{1} << 40;
  ExpectRefused(f.Build(), "metadata count 1099511627776 exceeds the limit");
  // Within the limits but more than the bytes left could hold.
  f = SmallFile();
  f.tensor_count = 100000;
  ExpectRefused(f.Build(), "cannot fit");
  f = SmallFile();
  f.metadata_count = 60000;
  ExpectRefused(f.Build(), "cannot fit");
  // Lower limits are honoured.
  GgufLimits limits;
  limits.max_tensors = 1;
  ExpectRefused(SmallFile().Build(), "tensor count 2 exceeds the limit of 1", limits);
  limits = {};
  limits.max_metadata = 3;
  ExpectRefused(SmallFile().Build(), "metadata count 4 exceeds the limit of 3", limits);
}

TEST(GgufTest, HugeStringsAndArraysAreRefusedBeforeAllocation) {
  using v::Raw;
  // A key whose length is 2^64 - 1.
  ExpectRefused(std::string("GGUF") + Raw<uint32_t>(3) + Raw<uint64_t>(0) + Raw<uint64_t>(1) +
                    Raw<uint64_t>(std::numeric_limits<uint64_t>::max()) + std::string(16, 'x'),
                "exceeds the limit");
  GgufTestFile f;
  // A string value longer than the file.
  f = GgufTestFile();
  f.Add("s", v::Typed(8, Raw<uint64_t>(1000) + "abc"));
  f.Add("pad", v::U64(0));
  ExpectRefused(f.Build(), "truncated");
  // Over the string limit even though the bytes are there.
  GgufLimits limits;
  limits.max_string_bytes = 4;
  f = GgufTestFile();
  f.Add("s", v::String("hello"));
  ExpectRefused(f.Build(), "exceeds the limit of 4", limits);
  // Arrays: a count of 2^62 u8, 2^24 strings in a few bytes, and over a lower limit.
  f = GgufTestFile();
  f.Add("a", v::Array(0, {"\x01"}, uint64_t{1} << 62));
  ExpectRefused(f.Build(), "elements exceeds the limit");
  f = GgufTestFile();
  f.Add("a", v::Array(8, {v::Str("x")}, uint64_t{1} << 24));
  f.Add("pad", v::U64(0));
  ExpectRefused(f.Build(), "strings but only");
  f = GgufTestFile();
  f.Add("a", v::Array(6, {Raw(1.0f), Raw(2.0f)}, 1000));
  ExpectRefused(f.Build(), "truncated");
  limits = {};
  limits.max_array_elements = 2;
  f = GgufTestFile();
  f.Add("a", v::Numbers<int32_t>(5, {1, 2, 3}));
  ExpectRefused(f.Build(), "array of 3 elements exceeds the limit of 2", limits);
}

TEST(GgufTest, BadValuesAreRefused) {
  GgufTestFile f;
  f.Add("t", v::Typed(13, "xxxx"));
  ExpectRefused(f.Build(), "key 't': unknown value type 13");
  f = GgufTestFile();
  f.Add("t", v::Array(99, {}));
  ExpectRefused(f.Build(), "unknown array element type 99");
  f = GgufTestFile();
  f.Add("nested", v::Array(9, {v::Raw<uint32_t>(0) + v::Raw<uint64_t>(0)}));
  ExpectRefused(f.Build(), "arrays of arrays are not supported");
  f = GgufTestFile();
  f.Add("b", v::Typed(7, "\x02"));
  ExpectRefused(f.Build(), "bool byte 2 is neither 0 nor 1");
  f = GgufTestFile();
  f.Add("b", v::Array(7, {"\x01", "\x05"}));
  ExpectRefused(f.Build(), "bool byte 5");
  f = GgufTestFile();
  f.Add("k", v::U8(1));
  f.Add("k", v::U8(2));
  ExpectRefused(f.Build(), "key 'k' appears twice");
  f = GgufTestFile();
  f.Add("", v::U8(1));
  ExpectRefused(f.Build(), "empty key");
}

TEST(GgufTest, BadAlignmentIsRefused) {
  for (uint32_t a : {0u, 3u, 48u, 1u << 21}) {
    GgufTestFile f = SmallFile();
    f.metadata[1].second = v::U32(a);
    ExpectRefused(f.Build(), "is not a power of two");
  }
  GgufTestFile f = SmallFile();
  f.metadata[1].second = v::U64(32);
  ExpectRefused(f.Build(), "general.alignment must be a u32, got u64");
  f.metadata[1].second = v::String("32");
  ExpectRefused(f.Build(), "general.alignment must be a u32, got string");
}

TEST(GgufTest, MisplacedTensorsAreRefused) {
  // Misaligned.
  GgufTestFile f = SmallFile();
  f.tensors[1].offset = 4;
  f.data_bytes = 4096;
  ExpectRefused(f.Build(), "tensor 'norm': offset 4 is not a multiple of the alignment 32");
  // Overlapping.
  f = SmallFile();
  f.tensors[1].offset = 0;
  ExpectRefused(f.Build(), "overlap");
  // Out of range: past the file, and running past the data section.
  f = SmallFile();
  f.tensors[1].offset = uint64_t{1} << 62;
  f.data_bytes = 256;
  ExpectRefused(f.Build(), "past the end");
  f = SmallFile();
  f.tensors[1].offset = 224;
  f.data_bytes = 240;
  ExpectRefused(f.Build(), "runs past the end of the 240-byte data section");
  // A data section that would start past the end of the file.
  f = SmallFile();
  f.tensors.clear();
  f.tensors.push_back({"x", {1}, testing::kGgufF32, 0, 4});
  std::string cut = f.Build();
  uint64_t data = 0;
  f.Build(&data);
  cut.resize(data - 1);
  ExpectRefused(cut, "data section would start at byte");
}

TEST(GgufTest, BadTensorInfosAreRefused) {
  auto with = [](GgufTestTensor t) {
    GgufTestFile f = SmallFile();
    f.tensors.push_back(std::move(t));
    f.data_bytes = 1 << 16;
    return f.Build();
  };
  ExpectRefused(with({"u", {32}, 99}), "tensor 'u': unknown tensor type 99");
  ExpectRefused(with({"q2", {256}, testing::kGgufQ2_K}), "type Q2_K is not supported");
  ExpectRefused(with({"iq", {256}, 16}), "type IQ2_XXS is not supported");
  ExpectRefused(with({"z", {4, 0}, testing::kGgufF32}), "tensor 'z': dim 1 is 0");
  ExpectRefused(with({"big", {uint64_t{1} << 40, uint64_t{1} << 40}, testing::kGgufF32}),
                "dims overflow");
  ExpectRefused(with({"big1", {uint64_t{1} << 49}, testing::kGgufF32}), "dims overflow");
  ExpectRefused(with({"wrap", {uint64_t{1} << 32, uint64_t{1} << 32}, testing::kGgufF32}),
                "dims overflow");
  ExpectRefused(with({"max", {std::numeric_limits<uint64_t>::max()}, testing::kGgufF32}),
                "dims overflow");
  GgufTestTensor no_dims{"n0", {}, testing::kGgufF32};
  ExpectRefused(with(no_dims), "tensor 'n0': 0 dims");
  ExpectRefused(with({"n5", {1, 1, 1, 1, 1}, testing::kGgufF32}), "tensor 'n5': 5 dims");
  GgufTestTensor lying{"lie", {2}, testing::kGgufF32};
  lying.n_dims = 1000;
  ExpectRefused(with(lying), "1000 dims");
  ExpectRefused(with({"q", {48, 2}, testing::kGgufQ4_0}),
                "rows of 48 elements are not a whole number of 32-element blocks");
  ExpectRefused(with({"k", {128}, testing::kGgufQ4_K}), "256-element blocks");
  ExpectRefused(with({"w", {32}, testing::kGgufF32}), "tensor 'w' appears twice");
  ExpectRefused(with({"", {32}, testing::kGgufF32}), "empty name");
}

// Random corruption of a valid file: whatever each byte becomes, the reader gives a
// result or an error (the fuzz harness does this at scale; this keeps a cheap version in
// every test run).
TEST(GgufTest, RandomByteFlipsNeverCrash) {
  const std::string good = SmallFile().Build();
  std::mt19937 rng(7);
  int refused = 0;
  for (int i = 0; i < 4000; ++i) {
    std::string s = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) s[rng() % s.size()] = static_cast<char>(rng());
    absl::StatusOr<GgufFile> g = ParseString(s);
    if (!g.ok()) {
      ++refused;
      continue;
    }
    for (const GgufTensor& t : g->tensors()) {
      ASSERT_GE(reinterpret_cast<const char*>(t.data.data()), s.data());
      ASSERT_LE(reinterpret_cast<const char*>(t.data.data() + t.data.size()), s.data() + s.size());
    }
  }
  EXPECT_GT(refused, 1000);
}

}  // namespace
}  // namespace sg
