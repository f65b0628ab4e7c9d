// Hostile text: tokenizer.json files, prompts and templates built to crash, hang or blow up
// the tokenizer, each answered with a clear error in bounded time and memory, or with the
// reference's ids. The complexity cases assert the work Encode counts (EncodeWork), never
// a time; bench/tokenizer_bench.cc times the same paths on 1 MiB prompts. References:
// tests/text/split_regex.json and nfc_reference.json, made by make_text_fixtures.py with
// the tokenizers library that transformers runs.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "stepgraph/text/chat_template.h"
#include "stepgraph/text/tokenizer.h"
#include "tests/testing/json_file.h"
#include "text/bounded_json.h"
#include "text/unicode_nfc.h"

namespace sg {
namespace {

using Json = nlohmann::json;

// Whether the status's message holds `words`.
::testing::AssertionResult Says(const absl::Status& s, absl::string_view words) {
  if (absl::string_view(s.message()).find(words) != absl::string_view::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "the message does not say \"" << words << "\": " << s;
}

const std::string kTextDir = std::string(SG_FIXTURES_DIR) + "/../text";

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/sg_hostile_text.XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ + "/" + name, std::ios::binary) << text;
    return path_ + "/" + name;
  }

 private:
  std::string path_;
};

std::string Repeat(absl::string_view s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t i = 0; i < n; ++i) out.append(s.data(), s.size());
  return out;
}

// GPT-2's spelling of the 256 bytes: printable Latin-1 as itself, the rest from U+0100.
std::vector<std::string> ByteSpellings() {
  std::vector<std::string> out(256);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    AppendUtf8(printable ? b : next++, &out[b]);
  }
  return out;
}

// A byte-level BPE over the 256 byte characters and one merge ("a b"), with one Split
// pattern.
Json ByteTokenizerJson(const std::string& pattern) {
  Json vocab = Json::object();
  const std::vector<std::string> bytes = ByteSpellings();
  for (uint32_t b = 0; b < 256; ++b) vocab[bytes[b]] = b;
  vocab["ab"] = 256;
  Json split = {{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"},
                {"invert", false}};
  Json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", Json::array({"a b"})}}},
          {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}}},
          {"decoder", {{"type", "ByteLevel"}}}};
}

// ---- 1, 2: nesting -------------------------------------------------------------------------

// `depth` arrays around a 1: deep enough to overflow the stack of anything that recurses.
std::string DeepArray(size_t depth) { return Repeat("[", depth) + "1" + Repeat("]", depth); }

TEST(HostileTokenizerJson, DeepSequenceNestingIsRefusedByDepth) {
  // {"type":"Sequence","normalizers":[{"type":"Sequence","normalizers":[ ... ]}]}
  constexpr size_t kDepth = 40000;
  std::string normalizer;
  normalizer.reserve(kDepth * 48);
  normalizer += Repeat(R"({"type":"Sequence","normalizers":[)", kDepth);
  normalizer += R"({"type":"NFC"})";
  normalizer += Repeat("]}", kDepth);
  Json base = ByteTokenizerJson(".");
  std::string text = base.dump();
  text.insert(1, absl::StrCat(R"("normalizer":)", normalizer, ","));
  TempDir dir;
  dir.Write("tokenizer.json", text);
  auto tok = Tokenizer::FromTokenizerJson(dir.path());
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Says(tok.status(), "nesting deeper than"));
  EXPECT_TRUE(Says(tok.status(), "tokenizer.json"));
}

TEST(HostileTokenizerJson, DeepValuesAnywhereAreRefused) {
  TempDir dir;
  Json base = ByteTokenizerJson(".");
  for (const char* key : {"added_tokens", "post_processor", "decoder", "truncation"}) {
    std::string text = base.dump();
    text.insert(1, absl::StrCat("\"", key, "\":", DeepArray(100000), ","));
    dir.Write("tokenizer.json", text);
    auto tok = Tokenizer::FromTokenizerJson(dir.path());
    ASSERT_FALSE(tok.ok()) << key;
    EXPECT_TRUE(Says(tok.status(), "nesting deeper than")) << key;
  }
  // tokenizer_config.json too.
  dir.Write("tokenizer.json", base.dump());
  dir.Write("tokenizer_config.json", absl::StrCat(R"({"chat_template":)", DeepArray(100000), "}"));
  auto tok = Tokenizer::FromTokenizerJson(dir.path());
  ASSERT_FALSE(tok.ok());
  EXPECT_TRUE(Says(tok.status(), "tokenizer_config.json"));
  EXPECT_TRUE(Says(tok.status(), "nesting deeper than"));
}

// ---- 9: size and element counts -----------------------------------------------------------

TEST(HostileTokenizerJson, FileLargerThanTheCapIsRefusedUnread) {
  TempDir dir;
  const std::string path = dir.path() + "/tokenizer.json";
  {
    std::ofstream(path) << "{";
  }
  // Sparse: no disk and no memory; refused by its size alone.
  ASSERT_EQ(::truncate(path.c_str(), (int64_t{64} << 20) + 1), 0);
  auto tok = Tokenizer::FromTokenizerJson(dir.path());
  ASSERT_FALSE(tok.ok());
  EXPECT_TRUE(Says(tok.status(), "more than the"));
}

TEST(HostileTokenizerJson, MillionsOfEmptyObjectsAreRefusedBeforeTheyAreBuilt) {
  // 5M values in 15 MB: built, they would take half a gigabyte.
  std::string text = "{\"x\":[";
  text.reserve(16 << 20);
  for (int i = 0; i < 5000000; ++i) text += i ? ",{}" : "{}";
  text += "]}";
  TempDir dir;
  dir.Write("tokenizer.json", text);
  auto tok = Tokenizer::FromTokenizerJson(dir.path());
  ASSERT_FALSE(tok.ok());
  EXPECT_TRUE(Says(tok.status(), "more than"));
  EXPECT_TRUE(Says(tok.status(), "values"));
}

// ---- 15: ids that are not integers --------------------------------------------------------

TEST(HostileTokenizerJson, VocabIdsMustBeIntegersInRange) {
  TempDir dir;
  for (const char* id : {"1e30", "-1e30", "2.5", "1e400", "\"7\"", "9223372036854775807",
                         "18446744073709551615", "-1"}) {
    Json base = ByteTokenizerJson(".");
    std::string text = base.dump();
    text.insert(text.find("\"vocab\":{") + 9, absl::StrCat("\"zz\":", id, ","));
    dir.Write("tokenizer.json", text);
    auto tok = Tokenizer::FromTokenizerJson(dir.path());
    ASSERT_FALSE(tok.ok()) << id;
    // 1e400 does not even parse as a JSON number; the others name the token.
    EXPECT_TRUE(Says(tok.status(), std::string(id) == "1e400" ? "number overflow" : "\"zz\""))
        << id;
  }
  // The same for an added token's id and the Strip decoder's counts.
  Json base = ByteTokenizerJson(".");
  base["added_tokens"] = Json::array({{{"id", 1e30}, {"content", "<x>"}}});
  dir.Write("tokenizer.json", base.dump());
  auto added = Tokenizer::FromTokenizerJson(dir.path());
  ASSERT_FALSE(added.ok());
  EXPECT_TRUE(Says(added.status(), "added token"));
}

// ---- 3: Split patterns that match empty, as transformers splits --------------------------

TEST(HostileTokenizerJson, SplitPatternsMatchingEmptySplitAsTransformers) {
  const Json fixture = testing::ReadJsonFile(kTextDir + "/split_regex.json");
  const std::string base = fixture.at("tokenizer").dump();
  ASSERT_GE(fixture.at("cases").size(), 100u);
  TempDir dir;
  std::string loaded_pattern;
  std::unique_ptr<Tokenizer> tok;
  for (const Json& c : fixture.at("cases")) {
    const std::string pattern = c.at("pattern").get<std::string>();
    const std::string text = c.at("text").get<std::string>();
    if (pattern != loaded_pattern) {
      Json j = Json::parse(base);
      j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = pattern;
      dir.Write("tokenizer.json", j.dump());
      auto made = Tokenizer::FromTokenizerJson(dir.path());
      ASSERT_TRUE(made.ok()) << pattern << ": " << made.status();
      tok = *std::move(made);
      loaded_pattern = pattern;
    }
    auto ids = tok->Encode(text, {.add_special = false});
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, c.at("ids").get<std::vector<int32_t>>())
        << "pattern /" << pattern << "/ on \"" << absl::CEscape(text) << "\": transformers splits "
        << c.at("pieces").dump();
  }
}

// ---- 6: special tokens found in linear time -------------------------------------------------

TokenizerSpec SpecWithSpecialTokens(const std::vector<std::string>& control,
                                    const std::vector<std::string>& user) {
  TokenizerSpec spec;
  spec.model = "gpt2";
  spec.pre_patterns = {"."};
  spec.tokens = ByteSpellings();  // one id per byte
  spec.token_types.assign(256, 1);
  spec.tokens.push_back("!!");  // a merge, since a byte-level BPE needs one
  spec.token_types.push_back(1);
  spec.merges = {"! !"};
  for (const std::string& t : control) {
    spec.tokens.push_back(t);
    spec.token_types.push_back(3);
  }
  for (const std::string& t : user) {
    spec.tokens.push_back(t);
    spec.token_types.push_back(4);
  }
  return spec;
}

TEST(HostileSpecialTokens, LongControlTokenAgainstItsPrefixesIsLinear) {
  // A 4096-byte control token and prompts made of its prefixes: every position starts a
  // partial match as long as the token.
  const std::string token = Repeat("a", 4095) + "b";
  auto tok = Tokenizer::Create(SpecWithSpecialTokens({token}, {}));
  ASSERT_TRUE(tok.ok()) << tok.status();
  const int32_t token_id = (*tok)->TokenId(token);
  for (size_t n : {size_t{1} << 15, size_t{1} << 16}) {
    const std::string text = Repeat("a", n);
    EncodeWork work;
    auto ids = (*tok)->Encode(text, {.work = &work});
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(ids->size(), n);
    EXPECT_LE(work.special_steps, 4 * static_cast<int64_t>(n) + 2 * 4096)
        << "special-token matching is not linear in the text";
  }
  // Found where it is, among its prefixes.
  const std::string text = Repeat("a", 5000) + token + "ab";
  auto ids = (*tok)->Encode(text);
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), 5000u + 1 + 2);
  EXPECT_EQ((*ids)[5000], token_id);
}

// The rule the automaton must keep: at each position the longest control token (when
// parsed) or user-defined token, a user-defined one only when strictly longer; after a
// token, matching resumes after it.
std::vector<std::pair<size_t, int32_t>> NaiveMatches(const std::string& text,
                                                     const std::vector<std::string>& control,
                                                     const std::vector<std::string>& user,
                                                     int32_t first_id, bool parse_special) {
  std::vector<std::pair<size_t, int32_t>> out;
  for (size_t i = 0; i < text.size();) {
    size_t best = 0;
    int32_t id = -1;
    if (parse_special) {
      for (size_t k = 0; k < control.size(); ++k) {
        if (control[k].size() > best && text.compare(i, control[k].size(), control[k]) == 0) {
          best = control[k].size();
          id = first_id + static_cast<int32_t>(k);
        }
      }
    }
    for (size_t k = 0; k < user.size(); ++k) {
      if (user[k].size() > best && text.compare(i, user[k].size(), user[k]) == 0) {
        best = user[k].size();
        id = first_id + static_cast<int32_t>(control.size() + k);
      }
    }
    if (best == 0) {
      ++i;
    } else {
      out.emplace_back(i, id);
      i += best;
    }
  }
  return out;
}

TEST(HostileSpecialTokens, MatchesTheNaiveLeftmostLongestRule) {
  std::mt19937 rng(42);
  // Two bytes at least: a one-byte special token would also be the spelling of a byte.
  auto random_string = [&](size_t max_len) {
    std::string s(2 + rng() % (max_len - 1), 'a');
    for (char& c : s) c = "abc"[rng() % 3];
    return s;
  };
  for (int round = 0; round < 60; ++round) {
    std::vector<std::string> control, user;
    const int nc = 1 + rng() % 5, nu = rng() % 4;
    for (int k = 0; k < nc; ++k) control.push_back(random_string(6));
    for (int k = 0; k < nu; ++k) user.push_back(random_string(6));
    auto tok = Tokenizer::Create(SpecWithSpecialTokens(control, user));
    ASSERT_TRUE(tok.ok()) << tok.status();
    // Later duplicates take the spelling, as in the vocabulary; compare by spelling.
    for (bool parse_special : {true, false}) {
      // Now and then a text that spans several of the automaton's 64 KiB windows.
      std::string text = random_string(200);
      while (round % 20 == 0 && text.size() < 150000) text += random_string(200);
      auto ids = (*tok)->Encode(text, {.parse_special = parse_special});
      ASSERT_TRUE(ids.ok());
      std::vector<std::string> got, want;
      for (int32_t id : *ids) {
        if (id >= 257) got.push_back((*tok)->spec().tokens[id]);
      }
      for (const auto& [at, id] : NaiveMatches(text, control, user, 257, parse_special)) {
        want.push_back((*tok)->spec().tokens[id]);
      }
      EXPECT_TRUE(got == want) << "text of " << text.size() << " bytes: " << got.size()
                               << " special tokens found, " << want.size() << " expected";
    }
  }
}

// ---- 7: catastrophic backtracking ---------------------------------------------------------

TEST(HostileRegex, CatastrophicBacktrackingFailsFastNamingThePattern) {
  TempDir dir;
  dir.Write("tokenizer.json", ByteTokenizerJson("(a+)+b|.").dump());
  auto tok = Tokenizer::FromTokenizerJson(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status();
  // One run past any single match's limit, and short runs each of which is under it: the
  // budget is for the whole text, so the short runs add up to the same refusal.
  for (const std::string& text : {Repeat("a", 46 * 1024), Repeat(Repeat("a", 19) + "c", 2400)}) {
    EncodeWork work;
    auto ids = (*tok)->Encode(text, {.work = &work});
    ASSERT_FALSE(ids.ok());
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Says(ids.status(), "(a+)+b|."));
    EXPECT_TRUE(Says(ids.status(), "backtrack"));
    // The whole budget is spent, and no more.
    EXPECT_GE(work.regex_steps, int64_t{1} << 20);
    EXPECT_LE(work.regex_steps, (int64_t{1} << 20) + 128 * static_cast<int64_t>(text.size()));
  }
  // Text the pattern handles is still split.
  auto fine = (*tok)->Encode("aab");
  ASSERT_TRUE(fine.ok()) << fine.status();
}

TEST(HostileRegex, RealPatternsStayLinearOnLongRuns) {
  // The built-in patterns on runs that make a backtracking matcher retry (Llama 3's
  // \s*[\r\n]+ backtracks over a run of spaces): the matches run and the steps they take
  // grow with the text, doubling it at most doubles them.
  for (const char* pre : {"gpt2", "llama3", "qwen2", "tekken", "gpt-4o"}) {
    TokenizerSpec spec = SpecWithSpecialTokens({}, {});
    spec.pre_patterns = {};
    spec.pre = pre;
    auto tok = Tokenizer::Create(spec);
    ASSERT_TRUE(tok.ok()) << tok.status();
    for (const char* unit : {" ", "a", "1", "!", " a", "\n", "a\n ", " \n", "A", "'s"}) {
      int64_t matches[2], steps[2];
      for (int k = 0; k < 2; ++k) {
        const std::string text = Repeat(unit, (size_t{1} << 14) << k) + "x";
        EncodeWork work;
        auto ids = (*tok)->Encode(text, {.work = &work});
        ASSERT_TRUE(ids.ok()) << ids.status();
        matches[k] = work.regex_matches;
        steps[k] = work.regex_steps;
      }
      const std::string where = absl::StrCat(pre, ", unit \"", absl::CEscape(unit), "\"");
      EXPECT_LE(matches[1], 2 * matches[0] + 4) << where;
      EXPECT_LE(steps[1], 2 * steps[0] + 4096) << where;
    }
  }
}

// ---- 8, 13: NFC ------------------------------------------------------------------------------

TEST(HostileNfc, ReorderingLongRunsOfMarksIsNLogN) {
  for (size_t n : {size_t{1} << 14, size_t{1} << 16}) {
    const std::string text = "a" + Repeat("\xCC\x81", n) + Repeat("\xCC\x96", n);  // 230, 220
    int64_t work = 0;
    const std::string nfc = NormalizeNfc(text, &work);
    // U+0316 (class 220) sorts before U+0301 (230); the first U+0301 then composes with
    // the a (U+00E1), the others stay.
    const std::string want = "\xC3\xA1" + Repeat("\xCC\x96", n) + Repeat("\xCC\x81", n - 1);
    EXPECT_TRUE(nfc == want) << "NFC of " << n << " + " << n << " marks is not the sorted run";
    const double bound = 4.0 * (2 * n) * std::log2(2.0 * n) + 64;
    EXPECT_LE(static_cast<double>(work), bound) << "canonical reordering is not n log n";
  }
}

TEST(HostileNfc, MatchesTheReferenceOnEveryCombiningClass) {
  const Json fixture = testing::ReadJsonFile(kTextDir + "/nfc_reference.json");
  ASSERT_GE(fixture.at("cases").size(), 1000u);
  int failures = 0;
  for (const Json& c : fixture.at("cases")) {
    const std::string in = c.at(0).get<std::string>(), want = c.at(1).get<std::string>();
    const std::string got = NormalizeNfc(in);
    if (got != want && ++failures <= 10) {
      ADD_FAILURE() << "NFC of \"" << absl::CEscape(in) << "\": got \"" << absl::CEscape(got)
                    << "\", the reference gives \"" << absl::CEscape(want) << "\"";
    }
  }
  EXPECT_EQ(failures, 0);
}

// ---- 14: chat templates the recogniser cannot render faithfully ----------------------------

TEST(HostileChatTemplate, InstTagsOutOfOrderAreRefused) {
  for (const char* t : {
           "{{ bos_token }}{% for message in messages %}{{ '[/INST]' + message['content'] + "
           "'[INST]' }}{% endfor %}",
           "{% for message in messages %}{{ '[/INST] [INST]' + message['content'] }}{% endfor %}",
           "{% for message in messages %}{{ '[INST] [/INST]' + message['content'] }}{% endfor %}",
       }) {
    auto ct = ChatTemplate::Create(t, "<s>", "</s>");
    EXPECT_FALSE(ct.ok()) << t << " renders as \""
                          << (ct.ok() ? ct->RenderUserTurn("hi") : std::string()) << "\"";
    if (!ct.ok()) {
      EXPECT_TRUE(Says(ct.status(), "[INST]"));
    }
  }
  // The usual order still renders.
  auto ok = ChatTemplate::Create(
      "{% for message in messages %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
      "{% endfor %}",
      "<s>", "</s>");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->RenderUserTurn("hi"), "[INST] hi [/INST]");
}

// ---- the JSON bounds themselves --------------------------------------------------------------

TEST(BoundedJson, DepthAndCountBoundsAndPreviews) {
  Json v;
  EXPECT_TRUE(ParseBoundedJson(DeepArray(64), {.max_depth = 64}, "x", &v).ok());
  const absl::Status deep = ParseBoundedJson(DeepArray(65), {.max_depth = 64}, "x", &v);
  EXPECT_TRUE(Says(deep, "x: JSON with nesting deeper than 64"));
  EXPECT_TRUE(ParseBoundedJson("[1,2,3]", {.max_values = 4}, "x", &v).ok());
  EXPECT_FALSE(ParseBoundedJson("[1,2,3,4]", {.max_values = 4}, "x", &v).ok());
  const absl::Status bad = ParseBoundedJson("{\"a\": tru}", {}, "f.json", &v);
  EXPECT_TRUE(Says(bad, "f.json: invalid JSON"));

  // A preview is short whatever the value's size, and cut values end in "...".
  Json big = Json::array();
  for (int i = 0; i < 100000; ++i) big.push_back(std::string(100, 'x'));
  EXPECT_LE(JsonPreview(big).size(), 80u);
  EXPECT_EQ(JsonPreview(big).substr(77), "...");
  EXPECT_EQ(JsonPreview(Json::parse(R"({"a":[1,true,null],"b":"c"})")),
            R"({"a":[1,true,null],"b":"c"})");
  EXPECT_EQ(JsonPreview(Json(std::string(1 << 20, 'y'))).size(), 80u);
}

}  // namespace
}  // namespace sg
