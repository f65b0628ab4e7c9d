// The `stepgraph` program as a user meets it: help exits 0, every kind of bad argument
// exits 2 with one error line and a hint, a model folder that fails to load exits 1, and
// small CPU runs print the ids that a DecodeSession with the same options produces.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "models/session.h"

#ifndef SG_STEPGRAPH_BIN
#error "SG_STEPGRAPH_BIN must name the stepgraph program"
#endif

namespace sg {
namespace {

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (std::string("stepgraph_cli_test_") + std::to_string(getpid()) + "_" + name))
      .string();
}

Result RunProgram(const std::string& args) {
  const std::string out = TempPath("stdout"), err = TempPath("stderr");
  const std::string command =
      std::string("'") + SG_STEPGRAPH_BIN + "' " + args + " >'" + out + "' 2>'" + err + "'";
  const int status = std::system(command.c_str());
  Result r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  std::remove(out.c_str());
  std::remove(err.c_str());
  return r;
}

// The ids `stepgraph run` printed after "<label>: ".
std::vector<int32_t> PrintedIds(const std::string& out, const std::string& label) {
  std::vector<int32_t> ids;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (!absl::ConsumePrefix(&line, label + ": ")) continue;
    for (absl::string_view id : absl::StrSplit(line, ',')) {
      int32_t v = 0;
      EXPECT_TRUE(absl::SimpleAtoi(id, &v)) << "'" << id << "' in '" << line << "'";
      ids.push_back(v);
    }
  }
  return ids;
}

std::vector<int32_t> SessionIds(const std::vector<int32_t>& prompt, int64_t n,
                                std::optional<ops::Sample> sampling, int32_t seed) {
  SessionOptions o;
  o.backend = Backend::kCpu;
  o.max_seq = static_cast<int64_t>(prompt.size()) + n;
  o.sampling = sampling;
  absl::StatusOr<std::unique_ptr<DecodeSession>> s = DecodeSession::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return {};
  EXPECT_TRUE((*s)->Prefill(0, prompt, seed).ok());
  absl::StatusOr<std::vector<int32_t>> ids = (*s)->Generate(0, n);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

TEST(CliTest, HelpPrintsUsageAndExitsZero) {
  for (const char* args : {"--help", "-h", "help", "run --help", "graph --help", "bench -h"}) {
    SCOPED_TRACE(args);
    const Result r = RunProgram(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(absl::StrContains(r.out, "usage: stepgraph")) << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, "--model DIR")) << r.out;
    EXPECT_TRUE(r.err.empty()) << r.err;
  }
  EXPECT_TRUE(absl::StrContains(RunProgram("run --help").out, "--prompt-ids"));
  EXPECT_TRUE(absl::StrContains(RunProgram("graph --help").out, "--dot FILE"));
  EXPECT_TRUE(absl::StrContains(RunProgram("bench --help").out, "--positions"));
}

TEST(CliTest, BadArgumentsExitTwoWithOneErrorLineAndAHint) {
  struct Case {
    const char* args;
    const char* says;
  };
  const Case cases[] = {
      {"--frobnicate", "unknown flag '--frobnicate'"},
      {"frob", "unknown command 'frob'"},
      {"run --max-new-tokens abc", "--max-new-tokens: expected an integer"},
      {"run --max-new-tokens", "--max-new-tokens: missing value"},
      {"run --max-new-tokens -3", "got '-3'"},
      {"run --batch 0", "--batch"},
      {"run --prompt-ids 1,x,3", "--prompt-ids: expected an integer"},
      {"run --prompt-ids 5000", "id 5000 is outside the model's vocabulary [0, 1024)"},
      {"run --temperature -1", "--temperature"},
      {"run --top-p 0", "--top-p"},
      {"run --cpu=yes", "--cpu takes no value"},
      {"run --dot x.dot", "--dot is not an option of 'run'"},
      {"bench --steps 0", "--steps"},
      {"--model /nonexistent/stepgraph_model", "is not a directory"},
      {"--model-preset llama-9", "unknown preset 'llama-9'"},
      {"run --max-new-tokens 600", "max_position_embeddings (512)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    const Result r = RunProgram(c.args);
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_TRUE(absl::StartsWith(r.err, "stepgraph: error: ")) << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, c.says)) << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, "\nhint: ")) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 2) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

TEST(CliTest, AModelFolderThatDoesNotLoadExitsOne) {
  const std::string dir = TempPath("empty_model");
  std::filesystem::create_directories(dir);
  const Result r = RunProgram("run --cpu --model '" + dir + "'");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "stepgraph: error: ")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "config.json")) << r.err;
}

TEST(CliTest, TinyCpuRunPrintsTheSessionsIds) {
  const Result r = RunProgram("run --cpu --prompt-ids 3,1,4,1,5 --max-new-tokens 6");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<int32_t> want = SessionIds({3, 1, 4, 1, 5}, 6, std::nullopt, 0);
  ASSERT_EQ(want.size(), 6u);
  EXPECT_EQ(PrintedIds(r.out, "generated"), want) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "ms/token on the CPU reference")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.err, "cpu")) << r.err;
}

TEST(CliTest, SampledBatchRunUsesOneSeedPerSequence) {
  const Result r = RunProgram(
      "run --cpu --prompt-ids 9,8,7 --max-new-tokens 5 --batch 2 --temperature 0.8 --top-k 40 "
      "--top-p 0.9 --seed 11");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const ops::Sample sample{0.8f, 40, 0.9f};
  EXPECT_EQ(PrintedIds(r.out, "sequence 0"), SessionIds({9, 8, 7}, 5, sample, 11)) << r.out;
  EXPECT_EQ(PrintedIds(r.out, "sequence 1"), SessionIds({9, 8, 7}, 5, sample, 12)) << r.out;
}

TEST(CliTest, DefaultRunNeedsNoArguments) {
  const Result r = RunProgram("");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(PrintedIds(r.out, "generated").size(), 32u) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "timing: ")) << r.out;
  if (!CudaDeviceFound()) {
    EXPECT_TRUE(absl::StrContains(r.err, "running on the CPU reference")) << r.err;
  }
}

TEST(CliTest, GraphPrintsTheSummaryAndWritesDot) {
  const std::string dot = TempPath("graph.dot");
  const Result r = RunProgram("graph --batch 2 --dot '" + dot + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "graph: batch 2, 74 nodes")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "of intermediates")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "weights: ")) << r.out;
  const std::string text = ReadFile(dot);
  std::remove(dot.c_str());
  EXPECT_TRUE(absl::StartsWith(text, "digraph")) << text.substr(0, 80);
  EXPECT_TRUE(absl::StrContains(text, "lm_head")) << "the DOT lacks the lm_head node";
}

TEST(CliTest, TinyCpuBench) {
  const Result r = RunProgram("bench --cpu --steps 2 --positions 3,5 --profile");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "position 3: ")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "position 5: ")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "ms/token on the CPU reference")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "MatMul")) << "the profile names the ops: " << r.out;
}

}  // namespace
}  // namespace sg
