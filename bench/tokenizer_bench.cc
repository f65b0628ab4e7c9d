// Encoding speed of the tokenizer on ~4 KB of mixed text (the test corpus): with the
// per-piece BPE cache warm, and the first encoding by a freshly built tokenizer (cold).
// Hostile/*: 1 MiB prompts built against each path a prompt reaches (special tokens,
// the pre-tokenizer's patterns, NFC), each of which used to take from seconds to minutes;
// each must take time in proportion to the prompt (tests/text/hostile_text_test.cc
// asserts the work counts, this times them).
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "benchmark/benchmark.h"
#include "nlohmann/json.hpp"
#include "stepgraph/text/tokenizer.h"

namespace {

const std::string kDir = std::string(SG_FIXTURES_DIR) + "/tokenizer";

std::string Text() {
  std::ifstream f(kDir + "/corpus.json");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string text;
  for (const auto& s : nlohmann::json::parse(ss.str())) {
    text += s.get<std::string>() + "\n";
    if (text.size() >= 4096) break;
  }
  return text;
}

std::string Folder(const std::string& name) {
  if (name != "smollm2") return kDir + "/" + name;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string cache = xdg != nullptr && *xdg != '\0' ? std::string(xdg)
                                                           : std::string(home ? home : "") + "/.cache";
  return cache + "/stepgraph-test/smollm2-tokenizer";
}

void Encode(benchmark::State& state, const std::string& name, bool cold) {
  const std::string text = Text();
  auto tok = sg::Tokenizer::FromTokenizerJson(Folder(name));
  if (!tok.ok()) {
    state.SkipWithError(std::string(tok.status().message()).c_str());
    return;
  }
  std::unique_ptr<sg::Tokenizer> t = std::move(*tok);
  if (!t->Encode(text).ok()) state.SkipWithError("encode failed");
  const sg::TokenizerSpec spec = t->spec();
  size_t ids = 0;
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      t = std::move(*sg::Tokenizer::Create(spec));
      state.ResumeTiming();
    }
    auto got = t->Encode(text);
    ids = got->size();
    benchmark::DoNotOptimize(got);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["bytes"] = static_cast<double>(text.size());
  state.counters["ids"] = static_cast<double>(ids);
  // Pattern matches run and the match-limit units they were given (retries included).
  sg::EncodeWork work;
  (void)t->Encode(text, {.work = &work});
  state.counters["regex_matches"] = static_cast<double>(work.regex_matches);
  state.counters["regex_steps"] = static_cast<double>(work.regex_steps);
}

BENCHMARK_CAPTURE(Encode, bl_llama3_warm, std::string("bl_llama3"), false)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(Encode, bl_llama3_cold, std::string("bl_llama3"), true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(Encode, spm_metaspace_warm, std::string("spm_metaspace"), false)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(Encode, spm_metaspace_cold, std::string("spm_metaspace"), true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(Encode, smollm2_warm, std::string("smollm2"), false)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(Encode, smollm2_cold, std::string("smollm2"), true)->Unit(benchmark::kMicrosecond)->Iterations(20);

// ---- 1 MiB hostile prompts ------------------------------------------------------------------

constexpr size_t kPromptBytes = size_t{1} << 20;

std::string RepeatTo(const std::string& unit, size_t bytes) {
  std::string s;
  s.reserve(bytes + unit.size());
  while (s.size() + unit.size() <= bytes) s += unit;
  return s;
}

// A byte-level BPE over the 256 bytes (one merge) with the given pre-tokenizer patterns and
// control tokens.
std::unique_ptr<sg::Tokenizer> ByteTokenizer(std::vector<std::string> patterns,
                                             std::vector<std::string> control) {
  sg::TokenizerSpec spec;
  spec.model = "gpt2";
  spec.pre_patterns = std::move(patterns);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const uint32_t cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    spec.tokens.push_back(s);
  }
  spec.tokens.push_back("ab");
  spec.merges = {"a b"};
  spec.token_types.assign(spec.tokens.size(), 1);
  for (std::string& t : control) {
    spec.tokens.push_back(std::move(t));
    spec.token_types.push_back(3);
  }
  auto tok = sg::Tokenizer::Create(std::move(spec));
  return tok.ok() ? *std::move(tok) : nullptr;
}

// Encodes `text` with `tok`; `expect_refusal`: the tokenizer must refuse it (a pattern that
// backtracks catastrophically), and the time is the time to the refusal.
void EncodeHostile(benchmark::State& state, const sg::Tokenizer* tok, const std::string& text,
                   bool expect_refusal = false) {
  if (tok == nullptr) {
    state.SkipWithError("no tokenizer");
    return;
  }
  sg::EncodeWork work;
  for (auto _ : state) {
    work = {};
    auto ids = tok->Encode(text, {.work = &work});
    if (ids.ok() == expect_refusal) {
      state.SkipWithError(ids.ok() ? "encoded a text it should refuse"
                                   : std::string(ids.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(ids);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  const double bytes = static_cast<double>(text.size());
  state.counters["special_steps/B"] = static_cast<double>(work.special_steps) / bytes;
  state.counters["regex_steps/B"] = static_cast<double>(work.regex_steps) / bytes;
  state.counters["nfc_steps/B"] = static_cast<double>(work.nfc_steps) / bytes;
}

std::unique_ptr<sg::Tokenizer> Fixture(const std::string& name) {
  auto tok = sg::Tokenizer::FromTokenizerJson(Folder(name));
  return tok.ok() ? *std::move(tok) : nullptr;
}

// A 4096-byte control token against a prompt of its prefixes (13.9 s for 64 KiB before).
void BM_Hostile_LongSpecialToken(benchmark::State& state) {
  static const auto* tok = ByteTokenizer({"."}, {std::string(4095, 'a') + "b"}).release();
  EncodeHostile(state, tok, std::string(kPromptBytes, 'a'));
}
BENCHMARK(BM_Hostile_LongSpecialToken)->Unit(benchmark::kMillisecond);

// Prefixes of a real tokenizer's special tokens, over and over.
void BM_Hostile_SpecialTokenPrefixes(benchmark::State& state) {
  static const auto* tok = Fixture("bl_smollm").release();
  EncodeHostile(state, tok, RepeatTo("<|im_star", kPromptBytes));
}
BENCHMARK(BM_Hostile_SpecialTokenPrefixes)->Unit(benchmark::kMillisecond);

// Llama 3's pattern (\s*[\r\n]+ backtracks over a run of spaces) on runs that make it
// retry.
void BM_Hostile_Llama3PatternOnSpaces(benchmark::State& state) {
  static const auto* tok = Fixture("bl_llama3").release();
  EncodeHostile(state, tok, std::string(kPromptBytes, ' ') + "x");
}
BENCHMARK(BM_Hostile_Llama3PatternOnSpaces)->Unit(benchmark::kMillisecond);

void BM_Hostile_Llama3PatternOnMixedRuns(benchmark::State& state) {
  static const auto* tok = Fixture("bl_llama3").release();
  EncodeHostile(state, tok, RepeatTo("a\n  1!  \n\n 'S ", kPromptBytes));
}
BENCHMARK(BM_Hostile_Llama3PatternOnMixedRuns)->Unit(benchmark::kMillisecond);

// A pattern that backtracks exponentially on runs each under a single match's limit
// (minutes before): refused once the prompt's budget is spent.
void BM_Hostile_CatastrophicPatternRefused(benchmark::State& state) {
  static const auto* tok = ByteTokenizer({"(a+)+b|."}, {}).release();
  EncodeHostile(state, tok, RepeatTo(std::string(19, 'a') + "c", kPromptBytes),
                /*expect_refusal=*/true);
}
BENCHMARK(BM_Hostile_CatastrophicPatternRefused)->Unit(benchmark::kMillisecond);

// NFC of 'a' + U+0301 x N + U+0316 x N (N = 256k, more than a minute at 100k before).
void BM_Hostile_NfcMarkRun(benchmark::State& state) {
  static const auto* tok = Fixture("bl_qwen2").release();
  const size_t n = kPromptBytes / 4;
  std::string text = "a";
  for (size_t i = 0; i < n; ++i) text += "\xCC\x81";
  for (size_t i = 0; i < n; ++i) text += "\xCC\x96";
  EncodeHostile(state, tok, text);
}
BENCHMARK(BM_Hostile_NfcMarkRun)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
