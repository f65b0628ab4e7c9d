// Safetensors files and model folders. Every file here is written byte by byte by the
// test into a fresh temp folder, so each malformed case is exactly the bytes it claims to
// be; every bad file must give an error naming the file (and the tensor where there is
// one), never a crash or a read past the mapping.
#include "models/safetensors.h"

#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/config.h"
#include "stepgraph/models/llama.h"
#include "nlohmann/json.hpp"

namespace sg {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "sg_safetensors_test_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct StoredTensor {
  std::string name;
  std::string dtype;  // safetensors name: "F32", "BF16", ...
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

int64_t ElementBytes(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  if (dtype == "F64" || dtype == "I64") return 8;
  return 1;
}

// A tensor of random bytes (never all zero) sized for its dtype and shape.
StoredTensor RandomTensor(std::string name, std::string dtype, std::vector<int64_t> shape,
                          uint64_t seed) {
  int64_t n = ElementBytes(dtype);
  for (int64_t d : shape) n *= d;
  std::mt19937_64 rng(seed);
  std::vector<std::byte> bytes(static_cast<size_t>(n));
  for (std::byte& b : bytes) b = static_cast<std::byte>(1 + rng() % 255);
  return {std::move(name), std::move(dtype), std::move(shape), std::move(bytes)};
}

// Header of `tensors` laid out back to back in the given order.
Json LayoutHeader(const std::vector<StoredTensor>& tensors) {
  Json h = Json::object();
  h["__metadata__"] = {{"format", "pt"}};
  int64_t offset = 0;
  for (const StoredTensor& t : tensors) {
    const int64_t size = static_cast<int64_t>(t.bytes.size());
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + size}}};
    offset += size;
  }
  return h;
}

std::vector<std::byte> Concat(const std::vector<StoredTensor>& tensors) {
  std::vector<std::byte> data;
  for (const StoredTensor& t : tensors) data.insert(data.end(), t.bytes.begin(), t.bytes.end());
  return data;
}

// 8-byte little-endian header length (the true one unless overridden), the header text
// padded with spaces to a multiple of 8 as real writers do, then the data.
std::vector<std::byte> FileBytes(const std::string& header_text, const std::vector<std::byte>& data,
                                 std::optional<uint64_t> header_len = std::nullopt) {
  std::string text = header_text;
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  const uint64_t len = header_len.value_or(text.size());
  std::vector<std::byte> out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>((len >> (8 * i)) & 0xff));
  for (char c : text) out.push_back(static_cast<std::byte>(c));
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void WriteBytes(const std::string& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (std::byte b : bytes) out.put(static_cast<char>(b));
}

void WriteTensors(const std::string& path, const std::vector<StoredTensor>& tensors) {
  WriteBytes(path, FileBytes(LayoutHeader(tensors).dump(), Concat(tensors)));
}

// Opening `bytes` as a file fails with InvalidArgument naming the file and each fragment.
void ExpectBadFile(const std::vector<std::byte>& bytes,
                   std::initializer_list<std::string> fragments) {
  TempDir dir;
  const std::string path = dir / "bad.safetensors";
  WriteBytes(path, bytes);
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
  ASSERT_FALSE(f.ok()) << "opened a bad file";
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  const std::string msg(f.status().message());
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  for (const std::string& s : fragments) {
    EXPECT_NE(msg.find(s), std::string::npos) << "'" << s << "' not in: " << msg;
  }
}

// A header with one tensor entry `entry` and `data_bytes` bytes of data.
std::vector<std::byte> OneEntry(const Json& entry, size_t data_bytes) {
  Json h = {{"w", entry}};
  return FileBytes(h.dump(), std::vector<std::byte>(data_bytes, std::byte{7}));
}

// ---- single files ----

TEST(SafetensorsTest, ReadsEveryDTypeInPlace) {
  TempDir dir;
  const std::vector<StoredTensor> tensors = {
      RandomTensor("a.f32", "F32", {3, 5}, 1),   RandomTensor("b.bf16", "BF16", {7}, 2),
      RandomTensor("c.f16", "F16", {2, 2, 3}, 3), RandomTensor("d.i32", "I32", {4}, 4),
      RandomTensor("e.scalar", "F32", {}, 5),     RandomTensor("f.empty", "F32", {0, 4}, 6),
  };
  const std::string path = dir / "model.safetensors";
  WriteTensors(path, tensors);

  absl::StatusOr<SafetensorsFile> opened = SafetensorsFile::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status();
  // A move keeps the mapping where it is, so the spans stay valid.
  SafetensorsFile f = *std::move(opened);
  EXPECT_EQ(f.path(), path);
  ASSERT_EQ(f.tensors().size(), tensors.size());
  const DType want_dtype[] = {DType::kF32, DType::kBF16, DType::kF16,
                              DType::kI32, DType::kF32,  DType::kF32};
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsTensor* t = f.Find(tensors[i].name);
    ASSERT_NE(t, nullptr) << tensors[i].name;
    EXPECT_EQ(t->dtype, want_dtype[i]) << t->name;
    EXPECT_EQ(t->shape, tensors[i].shape) << t->name;
    ASSERT_EQ(t->data.size(), tensors[i].bytes.size()) << t->name;
    if (!t->data.empty()) {
      EXPECT_EQ(std::memcmp(t->data.data(), tensors[i].bytes.data(), t->data.size()), 0)
          << t->name;
    }
    // Tensors come back in the order of their data.
    EXPECT_EQ(f.tensors()[i].name, tensors[i].name);
  }
  EXPECT_EQ(f.Find("e.scalar")->NumElements(), 1);
  EXPECT_EQ(f.Find("f.empty")->NumElements(), 0);
  EXPECT_EQ(f.Find("a.f32")->ShapeString(), "[3,5]");
  EXPECT_EQ(f.Find("__metadata__"), nullptr);
  EXPECT_EQ(f.Find("absent"), nullptr);
}

TEST(SafetensorsTest, ReportsFileOrderWhateverTheHeaderOrder) {
  // The header lists names alphabetically; data order is the reverse.
  const std::vector<StoredTensor> tensors = {RandomTensor("z", "F32", {2}, 1),
                                             RandomTensor("a", "F32", {3}, 2)};
  const std::vector<std::byte> file = FileBytes(LayoutHeader(tensors).dump(), Concat(tensors));
  absl::StatusOr<std::vector<SafetensorsTensor>> parsed = ParseSafetensors(file, "mem");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)[0].name, "z");
  EXPECT_EQ((*parsed)[1].name, "a");
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  TempDir dir;
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(dir / "absent.safetensors");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound) << f.status();
  EXPECT_NE(f.status().message().find("absent.safetensors"), std::string::npos);
  absl::StatusOr<SafetensorsFile> d = SafetensorsFile::Open(dir.path());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << d.status();
}

TEST(SafetensorsTest, TooShortForTheHeaderLength) {
  ExpectBadFile({}, {"0 bytes", "shorter than the 8-byte"});
  ExpectBadFile(std::vector<std::byte>(5, std::byte{1}), {"5 bytes"});
}

TEST(SafetensorsTest, HeaderLengthLargerThanTheFile) {
  const std::string header = Json{{"w", {{"dtype", "F32"}, {"shape", {1}},
                                         {"data_offsets", {0, 4}}}}}.dump();
  std::vector<std::byte> bytes = FileBytes(header, std::vector<std::byte>(4), 1000);
  ExpectBadFile(bytes, {"header length 1000", "larger than"});
  // A length near 2^64 must not wrap around in the bounds check.
  bytes = FileBytes(header, std::vector<std::byte>(4), ~uint64_t{0} - 3);
  ExpectBadFile(bytes, {"larger than"});
  // One byte short: the header's last byte is missing.
  const std::vector<std::byte> full = FileBytes(header, {});
  ExpectBadFile(std::vector<std::byte>(full.begin(), full.end() - 1), {"larger than"});
}

TEST(SafetensorsTest, InvalidHeaderJson) {
  ExpectBadFile(FileBytes("{\"w\": {\"dtype\": \"F32\",", {}), {"invalid JSON"});
  ExpectBadFile(FileBytes("", {}), {"invalid JSON"});
  ExpectBadFile(FileBytes("[1, 2, 3]", {}), {"not a JSON object"});
}

TEST(SafetensorsTest, MissingOrMalformedFields) {
  ExpectBadFile(OneEntry({{"shape", {1}}, {"data_offsets", {0, 4}}}, 4), {"'w'", "'dtype'"});
  ExpectBadFile(OneEntry({{"dtype", "F32"}, {"data_offsets", {0, 4}}}, 4), {"'w'", "'shape'"});
  ExpectBadFile(OneEntry({{"dtype", "F32"}, {"shape", {1}}}, 4), {"'w'", "'data_offsets'"});
  ExpectBadFile(OneEntry(Json::array({1, 2}), 4), {"'w'", "not an object"});
  ExpectBadFile(OneEntry({{"dtype", 32}, {"shape", {1}}, {"data_offsets", {0, 4}}}, 4),
                {"'w'", "'dtype' is not a string"});
  ExpectBadFile(OneEntry({{"dtype", "F32"}, {"shape", 1}, {"data_offsets", {0, 4}}}, 4),
                {"'w'", "'shape' is not a list"});
  ExpectBadFile(OneEntry({{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4, 8}}}, 8),
                {"'w'", "data_offsets"});
  ExpectBadFile(OneEntry({{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {-4, 0}}}, 4),
                {"'w'", "non-negative"});
  ExpectBadFile(OneEntry({{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", "0-4"}}, 4),
                {"'w'", "data_offsets"});
}

TEST(SafetensorsTest, UnsupportedDTypesNameTheTensor) {
  for (const char* dtype : {"F64", "I64", "U8", "BOOL", "F8_E4M3", "F8_E5M2", "I8", "WHAT"}) {
    SCOPED_TRACE(dtype);
    ExpectBadFile(OneEntry({{"dtype", dtype}, {"shape", {2}}, {"data_offsets", {0, 16}}}, 16),
                  {"'w'", "unsupported dtype", dtype});
  }
}

TEST(SafetensorsTest, BadShapes) {
  ExpectBadFile(OneEntry({{"dtype", "F32"}, {"shape", {2, -1}}, {"data_offsets", {0, 8}}}, 8),
                {"'w'", "negative"});
  ExpectBadFile(OneEntry({{"dtype", "F32"}, {"shape", {2.5}}, {"data_offsets", {0, 8}}}, 8),
                {"'w'", "non-integer"});
  // 2^62 · 2^62 elements overflow int64; so do 2^62 f32 elements' bytes.
  const int64_t big = int64_t{1} << 62;
  ExpectBadFile(OneEntry({{"dtype", "F32"}, {"shape", {big, big}}, {"data_offsets", {0, 8}}}, 8),
                {"'w'", "too many"});
  ExpectBadFile(OneEntry({{"dtype", "F32"}, {"shape", {big}}, {"data_offsets", {0, 8}}}, 8),
                {"'w'", "too many bytes"});
}

TEST(SafetensorsTest, OffsetsOutOfRange) {
  // 16 bytes of data; the tensor claims [8, 24).
  ExpectBadFile(OneEntry({{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {8, 24}}}, 16),
                {"'w'", "[8, 24]", "run past the data section of 16 bytes"});
  // Offsets near 2^63 must not wrap.
  const int64_t huge = std::numeric_limits<int64_t>::max();
  ExpectBadFile(OneEntry({{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {huge - 4, huge}}}, 4),
                {"'w'", "run past"});
  // Beyond int64 altogether.
  ExpectBadFile(
      OneEntry({{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, ~uint64_t{0}}}}, 4),
      {"'w'", "data_offsets"});
}

TEST(SafetensorsTest, EndBeforeBegin) {
  ExpectBadFile(OneEntry({{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {8, 4}}}, 16),
                {"'w'", "[8, 4]", "end before"});
}

TEST(SafetensorsTest, ByteLengthMustMatchTheShape) {
  ExpectBadFile(OneEntry({{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 16}}}, 16),
                {"'w'", "hold 16 bytes", "needs 12"});
  ExpectBadFile(OneEntry({{"dtype", "BF16"}, {"shape", {2, 4}}, {"data_offsets", {0, 8}}}, 16),
                {"'w'", "hold 8 bytes", "needs 16"});
}

TEST(SafetensorsTest, OverlappingTensors) {
  const Json h = {{"a", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}}},
                  {"b", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {12, 20}}}}};
  ExpectBadFile(FileBytes(h.dump(), std::vector<std::byte>(24)), {"'a'", "'b'", "overlap"});
  // One range inside another, listed after a disjoint one.
  const Json inside = {{"a", {{"dtype", "F32"}, {"shape", {8}}, {"data_offsets", {0, 32}}}},
                       {"b", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {36, 40}}}},
                       {"c", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {8, 12}}}}};
  ExpectBadFile(FileBytes(inside.dump(), std::vector<std::byte>(40)), {"'a'", "'c'", "overlap"});
  // The same range twice.
  const Json twice = {{"a", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
                      {"b", {{"dtype", "I32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}}};
  ExpectBadFile(FileBytes(twice.dump(), std::vector<std::byte>(8)), {"overlap"});
}

TEST(SafetensorsTest, CorruptedBytesNeverEscapeTheFile) {
  // Random corruptions of a valid file's length and header: whatever parses must still
  // describe bytes inside the file, with lengths that fit the shapes.
  const std::vector<StoredTensor> tensors = {RandomTensor("a", "F32", {3, 4}, 1),
                                             RandomTensor("b", "BF16", {5}, 2),
                                             RandomTensor("c", "I32", {2, 2}, 3)};
  const std::vector<std::byte> valid = FileBytes(LayoutHeader(tensors).dump(), Concat(tensors));
  const size_t header_end = valid.size() - Concat(tensors).size();
  std::mt19937_64 rng(12345);
  int parsed = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::byte> bytes = valid;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) {
      bytes[rng() % header_end] = static_cast<std::byte>(rng() % 256);
    }
    if (rng() % 4 == 0) bytes.resize(rng() % bytes.size());
    absl::StatusOr<std::vector<SafetensorsTensor>> r = ParseSafetensors(bytes, "fuzz");
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
      continue;
    }
    ++parsed;
    for (const SafetensorsTensor& t : *r) {
      EXPECT_GE(t.data.data(), bytes.data() + 8) << t.name;
      EXPECT_LE(t.data.data() + t.data.size(), bytes.data() + bytes.size()) << t.name;
      EXPECT_EQ(static_cast<int64_t>(t.data.size()), t.NumElements() * DTypeBytes(t.dtype));
    }
  }
  // Most corruptions break the JSON; some must still parse for the bounds checks to matter.
  EXPECT_GT(parsed, 0);
}

// ---- model folders ----

// A small Llama config and its graph's weights, stored like a real model folder.
Json TinyConfigJson(bool tied) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", 8},
          {"intermediate_size", 12},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"head_dim", 4},
          {"vocab_size", 16},
          {"max_position_embeddings", 32},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},
          {"tie_word_embeddings", tied},
          {"torch_dtype", "float32"}};
}

Graph TinyGraph(bool tied) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(TinyConfigJson(tied).dump(), "tiny");
  EXPECT_TRUE(c.ok()) << c.status();
  absl::StatusOr<Graph> g = BuildLlamaDecodeGraph(*c, LlamaGraphOptions{});
  EXPECT_TRUE(g.ok()) << g.status();
  return *std::move(g);
}

// Every Weight of the graph as a random F32 tensor.
std::vector<StoredTensor> GraphWeights(const Graph& graph) {
  std::vector<StoredTensor> out;
  for (const Tensor& t : graph.tensors()) {
    if (t.kind != TensorKind::kWeight) continue;
    out.push_back(RandomTensor(t.name, "F32", {t.shape.dims().begin(), t.shape.dims().end()},
                               out.size() + 1));
  }
  return out;
}

void WriteConfig(const TempDir& dir, const Json& config) {
  std::ofstream(dir / "config.json") << config.dump(2);
}

StoredTensor* FindStored(std::vector<StoredTensor>& ts, const std::string& name) {
  for (StoredTensor& t : ts) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

void ExpectError(const absl::Status& s, absl::StatusCode code,
                 std::initializer_list<std::string> fragments) {
  ASSERT_FALSE(s.ok()) << "accepted although it should not";
  EXPECT_EQ(s.code(), code) << s;
  for (const std::string& f : fragments) {
    EXPECT_NE(s.message().find(f), absl::string_view::npos) << "'" << f << "' not in: " << s;
  }
}

TEST(ModelWeightsTest, SingleFileMatchesTheGraph) {
  TempDir dir;
  const Graph graph = TinyGraph(false);
  const std::vector<StoredTensor> stored = GraphWeights(graph);
  WriteConfig(dir, TinyConfigJson(false));
  WriteTensors(dir / "model.safetensors", stored);

  absl::StatusOr<ModelWeights> w = ModelWeights::Open(dir.path());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->config().hidden_size, 8);
  EXPECT_EQ(w->num_tensors(), static_cast<int64_t>(stored.size()));
  const ModelWeights::Entry e = w->Find("model.layers.1.mlp.down_proj.weight");
  ASSERT_NE(e.tensor, nullptr);
  EXPECT_EQ(e.file->path(), dir / "model.safetensors");
  EXPECT_EQ(e.tensor->shape, (std::vector<int64_t>{8, 12}));
  EXPECT_EQ(w->Find("nope").tensor, nullptr);
  EXPECT_TRUE(CheckWeightsAgainstGraph(*w, graph).ok()) << CheckWeightsAgainstGraph(*w, graph);

  // Binding points the graph's weights at the mapped bytes themselves.
  Bindings bindings(graph);
  ASSERT_TRUE(BindMappedWeights(*w, graph, bindings).ok());
  const int32_t embed = graph.FindTensor("model.embed_tokens.weight")->index;
  EXPECT_EQ(bindings.buffer(embed).data, w->Find("model.embed_tokens.weight").tensor->data.data());
  EXPECT_EQ(bindings.buffer(embed).bytes, 16 * 8 * 4);
}

TEST(ModelWeightsTest, MissingTensor) {
  TempDir dir;
  const Graph graph = TinyGraph(false);
  std::vector<StoredTensor> stored = GraphWeights(graph);
  stored.erase(stored.begin() + 3);
  const std::string missing = GraphWeights(graph)[3].name;
  WriteConfig(dir, TinyConfigJson(false));
  WriteTensors(dir / "model.safetensors", stored);
  absl::StatusOr<ModelWeights> w = ModelWeights::Open(dir.path());
  ASSERT_TRUE(w.ok()) << w.status();
  ExpectError(CheckWeightsAgainstGraph(*w, graph), absl::StatusCode::kNotFound,
              {missing, dir.path()});
  Bindings bindings(graph);
  EXPECT_FALSE(BindMappedWeights(*w, graph, bindings).ok());
}

TEST(ModelWeightsTest, WrongDTypeOrShape) {
  const Graph graph = TinyGraph(false);
  {
    TempDir dir;
    std::vector<StoredTensor> stored = GraphWeights(graph);
    *FindStored(stored, "model.norm.weight") = RandomTensor("model.norm.weight", "BF16", {8}, 9);
    WriteConfig(dir, TinyConfigJson(false));
    WriteTensors(dir / "model.safetensors", stored);
    absl::StatusOr<ModelWeights> w = ModelWeights::Open(dir.path());
    ASSERT_TRUE(w.ok()) << w.status();
    ExpectError(CheckWeightsAgainstGraph(*w, graph), absl::StatusCode::kInvalidArgument,
                {"model.norm.weight", "model.safetensors", "BF16", "f32"});
  }
  {
    TempDir dir;
    std::vector<StoredTensor> stored = GraphWeights(graph);
    *FindStored(stored, "model.layers.0.self_attn.k_proj.weight") =
        RandomTensor("model.layers.0.self_attn.k_proj.weight", "F32", {8, 8}, 9);
    WriteConfig(dir, TinyConfigJson(false));
    WriteTensors(dir / "model.safetensors", stored);
    absl::StatusOr<ModelWeights> w = ModelWeights::Open(dir.path());
    ASSERT_TRUE(w.ok()) << w.status();
    ExpectError(CheckWeightsAgainstGraph(*w, graph), absl::StatusCode::kInvalidArgument,
                {"k_proj.weight", "[8,8]", "[4,8]"});
  }
}

TEST(ModelWeightsTest, ExtraTensorIsRefused) {
  TempDir dir;
  const Graph graph = TinyGraph(false);
  std::vector<StoredTensor> stored = GraphWeights(graph);
  stored.push_back(RandomTensor("model.layers.0.self_attn.q_proj.bias", "F32", {8}, 77));
  WriteConfig(dir, TinyConfigJson(false));
  WriteTensors(dir / "model.safetensors", stored);
  absl::StatusOr<ModelWeights> w = ModelWeights::Open(dir.path());
  ASSERT_TRUE(w.ok()) << w.status();
  ExpectError(CheckWeightsAgainstGraph(*w, graph), absl::StatusCode::kInvalidArgument,
              {"extra tensor", "q_proj.bias", "model.safetensors"});
}

TEST(ModelWeightsTest, TiedEmbeddingsAcceptAStoredHead) {
  const Graph graph = TinyGraph(true);
  ASSERT_FALSE(graph.FindTensor("lm_head.weight").ok());
  {
    TempDir dir;  // without the copy
    WriteConfig(dir, TinyConfigJson(true));
    WriteTensors(dir / "model.safetensors", GraphWeights(graph));
    absl::StatusOr<ModelWeights> w = ModelWeights::Open(dir.path());
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE(CheckWeightsAgainstGraph(*w, graph).ok());
  }
  {
    TempDir dir;  // with a copy shaped like the embedding, and an old rotary buffer
    std::vector<StoredTensor> stored = GraphWeights(graph);
    stored.push_back(RandomTensor("lm_head.weight", "F32", {16, 8}, 50));
    stored.push_back(RandomTensor("model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {2}, 51));
    WriteConfig(dir, TinyConfigJson(true));
    WriteTensors(dir / "model.safetensors", stored);
    absl::StatusOr<ModelWeights> w = ModelWeights::Open(dir.path());
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE(CheckWeightsAgainstGraph(*w, graph).ok()) << CheckWeightsAgainstGraph(*w, graph);
  }
  {
    TempDir dir;  // a head of another shape is not the tied copy
    std::vector<StoredTensor> stored = GraphWeights(graph);
    stored.push_back(RandomTensor("lm_head.weight", "F32", {15, 8}, 50));
    WriteConfig(dir, TinyConfigJson(true));
    WriteTensors(dir / "model.safetensors", stored);
    absl::StatusOr<ModelWeights> w = ModelWeights::Open(dir.path());
    ASSERT_TRUE(w.ok()) << w.status();
    ExpectError(CheckWeightsAgainstGraph(*w, graph), absl::StatusCode::kInvalidArgument,
                {"extra tensor", "lm_head.weight"});
  }
  {
    TempDir dir;  // untied: a stored head is required and used
    const Graph untied = TinyGraph(false);
    std::vector<StoredTensor> stored = GraphWeights(untied);
    WriteConfig(dir, TinyConfigJson(false));
    stored.erase(stored.end() - 1);  // the graph declares lm_head last
    WriteTensors(dir / "model.safetensors", stored);
    absl::StatusOr<ModelWeights> w = ModelWeights::Open(dir.path());
    ASSERT_TRUE(w.ok()) << w.status();
    ExpectError(CheckWeightsAgainstGraph(*w, untied), absl::StatusCode::kNotFound,
                {"lm_head.weight"});
  }
}

TEST(ModelWeightsTest, ConfigAndFileErrorsPropagate) {
  {
    TempDir dir;  // no weights at all
    WriteConfig(dir, TinyConfigJson(false));
    ExpectError(ModelWeights::Open(dir.path()).status(), absl::StatusCode::kNotFound,
                {"model.safetensors", dir.path()});
  }
  {
    TempDir dir;  // no config
    WriteTensors(dir / "model.safetensors", GraphWeights(TinyGraph(false)));
    ExpectError(ModelWeights::Open(dir.path()).status(), absl::StatusCode::kNotFound,
                {"config.json"});
  }
  {
    TempDir dir;  // a bad config
    Json c = TinyConfigJson(false);
    c["hidden_act"] = "relu";
    WriteConfig(dir, c);
    WriteTensors(dir / "model.safetensors", GraphWeights(TinyGraph(false)));
    ExpectError(ModelWeights::Open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
                {"config.json", "hidden_act", "relu"});
  }
  {
    TempDir dir;  // a truncated weights file
    WriteConfig(dir, TinyConfigJson(false));
    const std::vector<StoredTensor> stored = GraphWeights(TinyGraph(false));
    std::vector<std::byte> bytes = FileBytes(LayoutHeader(stored).dump(), Concat(stored));
    bytes.erase(bytes.end() - 100, bytes.end());
    WriteBytes(dir / "model.safetensors", bytes);
    ExpectError(ModelWeights::Open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
                {"model.safetensors", "run past the data section"});
  }
}

// ---- sharded folders ----

struct Shards {
  std::vector<StoredTensor> first, second;
  Json weight_map = Json::object();
};

// The graph's weights split in two files and the index that lists them.
Shards SplitWeights(const Graph& graph) {
  Shards s;
  std::vector<StoredTensor> all = GraphWeights(graph);
  for (size_t i = 0; i < all.size(); ++i) {
    const bool first = i < all.size() / 2;
    s.weight_map[all[i].name] =
        first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    (first ? s.first : s.second).push_back(std::move(all[i]));
  }
  return s;
}

void WriteShards(const TempDir& dir, const Shards& s) {
  WriteConfig(dir, TinyConfigJson(false));
  WriteTensors(dir / "model-00001-of-00002.safetensors", s.first);
  WriteTensors(dir / "model-00002-of-00002.safetensors", s.second);
  Json index = {{"metadata", {{"total_size", 1234}}}, {"weight_map", s.weight_map}};
  std::ofstream(dir / "model.safetensors.index.json") << index.dump(2);
}

TEST(ModelWeightsTest, ShardedFolder) {
  TempDir dir;
  const Graph graph = TinyGraph(false);
  const Shards s = SplitWeights(graph);
  WriteShards(dir, s);
  absl::StatusOr<ModelWeights> w = ModelWeights::Open(dir.path());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->files().size(), 2u);
  EXPECT_EQ(w->num_tensors(), static_cast<int64_t>(s.first.size() + s.second.size()));
  EXPECT_EQ(w->Find(s.first[0].name).file->path(), dir / "model-00001-of-00002.safetensors");
  const ModelWeights::Entry last = w->Find(s.second.back().name);
  ASSERT_NE(last.tensor, nullptr);
  EXPECT_EQ(last.file->path(), dir / "model-00002-of-00002.safetensors");
  EXPECT_EQ(std::memcmp(last.tensor->data.data(), s.second.back().bytes.data(),
                        s.second.back().bytes.size()),
            0);
  EXPECT_TRUE(CheckWeightsAgainstGraph(*w, graph).ok()) << CheckWeightsAgainstGraph(*w, graph);
}

TEST(ModelWeightsTest, ShardedFolderErrors) {
  const Graph graph = TinyGraph(false);
  {
    TempDir dir;  // a listed shard does not exist
    Shards s = SplitWeights(graph);
    s.weight_map[s.second[0].name] = "model-00003-of-00002.safetensors";
    WriteShards(dir, s);
    ExpectError(ModelWeights::Open(dir.path()).status(), absl::StatusCode::kNotFound,
                {"model-00003-of-00002.safetensors", s.second[0].name});
  }
  {
    TempDir dir;  // the index names the wrong shard for a tensor
    Shards s = SplitWeights(graph);
    s.weight_map[s.second[0].name] = "model-00001-of-00002.safetensors";
    WriteShards(dir, s);
    ExpectError(ModelWeights::Open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
                {s.second[0].name, "model-00001-of-00002.safetensors",
                 "model-00002-of-00002.safetensors"});
  }
  {
    TempDir dir;  // the index lists a tensor no shard has
    Shards s = SplitWeights(graph);
    s.weight_map["model.ghost.weight"] = "model-00001-of-00002.safetensors";
    WriteShards(dir, s);
    ExpectError(ModelWeights::Open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
                {"model.ghost.weight", "no shard has it"});
  }
  {
    TempDir dir;  // a shard holds a tensor the index does not list
    Shards s = SplitWeights(graph);
    s.weight_map.erase(s.first[1].name);
    WriteShards(dir, s);
    ExpectError(ModelWeights::Open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
                {s.first[1].name, "not listed"});
  }
  {
    TempDir dir;  // the same tensor stored in both shards
    Shards s = SplitWeights(graph);
    s.second.push_back(s.first[0]);
    WriteShards(dir, s);
    ExpectError(ModelWeights::Open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
                {s.first[0].name, "stored twice"});
  }
  {
    TempDir dir;  // an index that reaches outside the folder
    Shards s = SplitWeights(graph);
    s.weight_map[s.first[0].name] = "../model-00001-of-00002.safetensors";
    WriteShards(dir, s);
    ExpectError(ModelWeights::Open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
                {"not a plain file name"});
  }
  {
    TempDir dir;  // malformed index files
    WriteShards(dir, SplitWeights(graph));
    std::ofstream(dir / "model.safetensors.index.json") << "{\"weight_map\": ";
    ExpectError(ModelWeights::Open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
                {"index.json", "invalid JSON"});
    std::ofstream(dir / "model.safetensors.index.json") << "{\"metadata\": {}}";
    ExpectError(ModelWeights::Open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
                {"weight_map"});
    std::ofstream(dir / "model.safetensors.index.json") << "{\"weight_map\": {\"a\": 3}}";
    ExpectError(ModelWeights::Open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
                {"'a'", "not a file name"});
  }
  {
    TempDir dir;  // a bad shard names itself and the index
    Shards s = SplitWeights(graph);
    WriteShards(dir, s);
    WriteBytes(dir / "model-00002-of-00002.safetensors", std::vector<std::byte>(3));
    ExpectError(ModelWeights::Open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
                {"model-00002-of-00002.safetensors", "3 bytes", "index.json"});
  }
}

// ---- checks against the config and of the values ----

// Finite f32 values in place of the random bytes (which may spell NaN or infinity).
void MakeFinite(std::vector<StoredTensor>& stored) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (StoredTensor& t : stored) {
    for (size_t i = 0; i + 4 <= t.bytes.size(); i += 4) {
      const float v = u(rng);
      std::memcpy(t.bytes.data() + i, &v, 4);
    }
  }
}

TEST(ModelWeightsTest, ConfigLargerThanTheFilesIsRefusedBeforeAnyGraph) {
  TempDir dir;
  const Graph graph = TinyGraph(false);
  WriteTensors(dir / "model.safetensors", GraphWeights(graph));
  Json config = TinyConfigJson(false);
  WriteConfig(dir, config);
  {
    absl::StatusOr<ModelWeights> w = ModelWeights::Open(dir.path());
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE(CheckWeightsFitConfig(*w).ok()) << CheckWeightsFitConfig(*w);
  }
  config["num_hidden_layers"] = 1000;  // within the bound: only the files can tell
  WriteConfig(dir, config);
  absl::StatusOr<ModelWeights> w = ModelWeights::Open(dir.path());
  ASSERT_TRUE(w.ok()) << w.status();
  ExpectError(CheckWeightsFitConfig(*w), absl::StatusCode::kInvalidArgument,
              {"config.json", "num_hidden_layers 1000", "but the safetensors files hold only"});
}

TEST(ModelWeightsTest, NonFiniteWeightIsNamed) {
  const Graph graph = TinyGraph(false);
  std::vector<StoredTensor> stored = GraphWeights(graph);
  MakeFinite(stored);
  {
    TempDir dir;
    WriteConfig(dir, TinyConfigJson(false));
    WriteTensors(dir / "model.safetensors", stored);
    absl::StatusOr<ModelWeights> w = ModelWeights::Open(dir.path());
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE(CheckWeightsFinite(*w).ok()) << CheckWeightsFinite(*w);
  }
  StoredTensor* norm = FindStored(stored, "model.layers.1.post_attention_layernorm.weight");
  ASSERT_NE(norm, nullptr);
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(norm->bytes.data() + 4 * 5, &inf, 4);
  TempDir dir;
  WriteConfig(dir, TinyConfigJson(false));
  WriteTensors(dir / "model.safetensors", stored);
  absl::StatusOr<ModelWeights> w = ModelWeights::Open(dir.path());
  ASSERT_TRUE(w.ok()) << w.status();
  const absl::Status st = CheckWeightsFinite(*w);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  for (const char* says : {"model.layers.1.post_attention_layernorm.weight", "inf",
                           "element 5 (of 8)"}) {
    EXPECT_NE(st.message().find(says), std::string::npos) << says << " in " << st;
  }
}

}  // namespace
}  // namespace sg
