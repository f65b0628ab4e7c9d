// Hostile model files on the JSON side and around the mapping: nesting deep enough to
// overflow any recursion in config.json, the safetensors header, the index and
// generation_config.json; a GGUF token type that only fits 64 bits; a model file truncated
// while it is mapped. Each gets an error naming the file, never a crash.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/config.h"
#include "models/gguf.h"
#include "models/mapped_file.h"
#include "models/model_files.h"
#include "models/model_tokenizer.h"
#include "models/safetensors.h"
#include "tests/models/gguf_writer.h"

namespace sg {
namespace {

namespace fs = std::filesystem;

const std::string kFixtures = SG_FIXTURES_DIR;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "sg_hostile_files_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path_ + "/" + name, std::ios::binary) << bytes;
    return path_ + "/" + name;
  }
  // A copy of a fixture folder's files.
  void CopyFrom(const std::string& folder) const {
    for (const auto& e : fs::directory_iterator(folder)) {
      fs::copy_file(e.path(), fs::path(path_) / e.path().filename(),
                    fs::copy_options::overwrite_existing);
    }
  }

 private:
  std::string path_;
};

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

::testing::AssertionResult Says(const absl::Status& s, absl::string_view words) {
  if (absl::string_view(s.message()).find(words) != absl::string_view::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "the message does not say \"" << words << "\": " << s;
}

// Arrays nested `depth` deep: far past any stack that recursion over them would need.
std::string Deep(size_t depth) {
  return std::string(depth, '[') + "1" + std::string(depth, ']');
}
constexpr size_t kDeep = 200000;

const char kConfigFields[] =
    R"("hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,)"
    R"( "num_attention_heads": 2, "vocab_size": 10)";

TEST(HostileJson, DeepConfigValuesAreRefusedByDepth) {
  // An unknown key, a value of the wrong type and a nested object each used to be
  // serialised whole for the message.
  for (const std::string& extra : {absl::StrCat(R"("unknown": )", Deep(kDeep)),
                                   absl::StrCat(R"("rope_scaling": )", Deep(kDeep)),
                                   absl::StrCat(R"("rms_norm_eps": )", Deep(kDeep))}) {
    const std::string text = absl::StrCat("{", kConfigFields, ", ", extra, "}");
    auto c = ParseLlamaConfig(text, "config.json");
    ASSERT_FALSE(c.ok()) << extra.substr(0, 20);
    EXPECT_TRUE(Says(c.status(), "config.json: JSON with nesting deeper than"));
  }
  // Values that are large but shallow are quoted shortly, and so is a token the parser
  // stops at (a number of a million digits).
  std::string big = "[7";
  for (int i = 0; i < 200000; ++i) big += ",7";
  big += "]";
  auto c = ParseLlamaConfig(absl::StrCat("{", kConfigFields, R"(, "unknown": )", big, "}"),
                            "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(Says(c.status(), "unknown field"));
  EXPECT_LT(c.status().message().size(), 400u);
  c = ParseLlamaConfig(absl::StrCat("{", kConfigFields, R"(, "unknown": )",
                                    std::string(1 << 20, '7'), "}"),
                       "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(Says(c.status(), "config.json: invalid JSON"));
  EXPECT_LT(c.status().message().size(), 400u);
}

std::string SafetensorsWithHeader(const std::string& header) {
  std::string s(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(s.data(), &n, 8);
  return s + header;
}

TEST(HostileJson, DeepSafetensorsHeaderIsRefusedByDepth) {
  for (const std::string& header :
       {absl::StrCat(R"({"t": )", Deep(kDeep), "}"),
        absl::StrCat(R"({"t": {"dtype": "F32", "shape": )", Deep(kDeep), "}}"),
        absl::StrCat(R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": )", Deep(kDeep),
                     "}}")}) {
    const std::string file = SafetensorsWithHeader(header);
    auto parsed = ParseSafetensors(
        {reinterpret_cast<const std::byte*>(file.data()), file.size()}, "deep.safetensors");
    ASSERT_FALSE(parsed.ok());
    EXPECT_TRUE(Says(parsed.status(), "deep.safetensors: JSON with nesting deeper than"));
  }
}

TEST(HostileJson, DeepIndexAndGenerationConfigAreRefusedByDepth) {
  {
    TempDir dir;
    dir.CopyFrom(kFixtures + "/f32_sharded");
    std::string index = ReadAll(dir.path() + "/model.safetensors.index.json");
    const size_t at = index.find("\"weight_map\"");
    ASSERT_NE(at, std::string::npos);
    index.insert(at, absl::StrCat(R"("x": )", Deep(kDeep), ", "));
    dir.Write("model.safetensors.index.json", index);
    auto m = ModelFiles::Open(dir.path());
    ASSERT_FALSE(m.ok());
    EXPECT_TRUE(Says(m.status(), "model.safetensors.index.json: JSON with nesting deeper than"));
  }
  {
    TempDir dir;
    dir.CopyFrom(kFixtures + "/f32_gqa");
    dir.Write("generation_config.json", absl::StrCat(R"({"eos_token_id": )", Deep(kDeep), "}"));
    auto m = ModelFiles::Open(dir.path());
    ASSERT_FALSE(m.ok());
    EXPECT_TRUE(Says(m.status(), "generation_config.json: JSON with nesting deeper than"));
  }
  {
    // A list of lists of ids: refused with a short quote of the value.
    TempDir dir;
    dir.CopyFrom(kFixtures + "/f32_gqa");
    std::string ids = "1";
    for (int i = 0; i < 100000; ++i) ids += ",1";
    dir.Write("generation_config.json", absl::StrCat(R"({"eos_token_id": [[)", ids, "]]}"));
    auto m = ModelFiles::Open(dir.path());
    ASSERT_FALSE(m.ok());
    EXPECT_TRUE(Says(m.status(), "eos_token_id must be an id or a list of ids"));
    EXPECT_LT(m.status().message().size(), 400u);
  }
}

// ---- GGUF token types ----------------------------------------------------------------------

TEST(HostileGguf, TokenTypeIsCheckedInSixtyFourBits) {
  using namespace testing::gguf_value;
  testing::GgufTestFile f;
  f.Add("tokenizer.ggml.model", String("gpt2"));
  f.Add("tokenizer.ggml.tokens", Strings({"a", "b", "ab"}));
  f.Add("tokenizer.ggml.merges", Strings({"a b"}));
  // 2^32 + 3: narrowed to 32 bits it would read as 3, a control token.
  f.Add("tokenizer.ggml.token_type", Numbers<int64_t>(11, {1, 1, (int64_t{1} << 32) + 3}));
  const std::string bytes = f.Build();
  auto file = GgufFile::Parse({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()},
                              "t.gguf");
  ASSERT_TRUE(file.ok()) << file.status();
  auto spec = TokenizerSpecFromGguf(*file);
  ASSERT_FALSE(spec.ok()) << "token type 4294967299 read as " << spec->token_types[2];
  EXPECT_TRUE(Says(spec.status(), "4294967299"));
  EXPECT_TRUE(Says(spec.status(), "token 2"));
}

// ---- a file truncated while it is mapped ---------------------------------------------------

TEST(HostileMapping, CopyModeSurvivesTruncationOfTheFile) {
  TempDir dir;
  dir.CopyFrom(kFixtures + "/f32_gqa");
  const std::string weights = dir.path() + "/model.safetensors";
  const std::string original = ReadAll(weights);
  auto model = ModelFiles::Open(dir.path(), {.copy_weights = true});
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ(::truncate(weights.c_str(), 16), 0);
  // Every weight's bytes are still there and still what the file held.
  auto reference = ModelWeights::Open(kFixtures + "/f32_gqa");
  ASSERT_TRUE(reference.ok()) << reference.status();
  int64_t checked = 0;
  for (const SafetensorsTensor& t : reference->files()[0].tensors()) {
    auto data = model->WeightData(t.name);
    ASSERT_TRUE(data.ok()) << data.status();
    ASSERT_EQ(data->size(), t.data.size());
    EXPECT_EQ(std::memcmp(data->data(), t.data.data(), t.data.size()), 0) << t.name;
    checked += static_cast<int64_t>(t.data.size());
  }
  EXPECT_GT(checked, static_cast<int64_t>(original.size()) / 2);
}

TEST(HostileMapping, PrefaultReportsATruncatedMapping) {
  TempDir dir;
  const std::string path = dir.Write("blob", std::string(1 << 16, 'x'));
  auto mapped = MappedFile::Open(path);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_TRUE(mapped->Prefault(0, 1 << 16).ok());
  ASSERT_EQ(::truncate(path.c_str(), 100), 0);
  const absl::Status s = mapped->Prefault(0, 1 << 16);
  ASSERT_FALSE(s.ok()) << "reading past the new end of the file would have raised SIGBUS";
  EXPECT_TRUE(Says(s, "blob"));
  EXPECT_TRUE(Says(s, "truncated"));
}

// What the mapping does without the copy, as mapped_file.h documents: a read past the new
// end of a truncated file raises SIGBUS.
TEST(HostileMappingDeathTest, MapModeFaultsOnReadsPastATruncation) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir dir;
  const std::string path = dir.Write("blob", std::string(1 << 16, 'x'));
  auto mapped = MappedFile::Open(path);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  ASSERT_EQ(::truncate(path.c_str(), 100), 0);
  EXPECT_DEATH(
      {
        volatile const std::byte* p = mapped->bytes().data();
        std::fprintf(stderr, "%d\n", static_cast<int>(p[(1 << 16) - 1]));
      },
      "");
}

}  // namespace
}  // namespace sg
