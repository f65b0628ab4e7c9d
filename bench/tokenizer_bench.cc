// Encoding speed of the tokenizer on ~4 KB of mixed text (the test corpus): with the
// per-piece BPE cache warm, and the first encoding by a freshly built tokenizer (cold).
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "benchmark/benchmark.h"
#include "stepgraph/text/tokenizer.h"
#include "nlohmann/json.hpp"

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
}

BENCHMARK_CAPTURE(Encode, bl_llama3_warm, std::string("bl_llama3"), false)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(Encode, bl_llama3_cold, std::string("bl_llama3"), true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(Encode, spm_metaspace_warm, std::string("spm_metaspace"), false)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(Encode, spm_metaspace_cold, std::string("spm_metaspace"), true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(Encode, smollm2_warm, std::string("smollm2"), false)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(Encode, smollm2_cold, std::string("smollm2"), true)->Unit(benchmark::kMicrosecond)->Iterations(20);

}  // namespace

BENCHMARK_MAIN();
