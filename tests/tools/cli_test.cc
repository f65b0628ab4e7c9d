// The `stepgraph` program as a user meets it: help exits 0, every kind of bad argument
// exits 2 with one error line and a hint, a model folder that fails to load exits 1, and
// small CPU runs print the ids that a DecodeSession with the same options produces.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "stepgraph/runtime/session.h"
#include "tests/testing/util.h"
#include "tools/conversation.h"

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

// The program run with `args`; standard input is `input` (a file holding it) when given,
// else /dev/null, so that no run waits for a terminal or reads the test's own input.
Result RunProgram(const std::string& args, std::optional<std::string> input = std::nullopt) {
  const std::string out = TempPath("stdout"), err = TempPath("stderr"), in = TempPath("stdin");
  if (input.has_value()) std::ofstream(in, std::ios::binary) << *input;
  const std::string command = std::string("'") + SG_STEPGRAPH_BIN + "' " + args + " <'" +
                              (input.has_value() ? in : std::string("/dev/null")) + "' >'" +
                              out + "' 2>'" + err + "'";
  const int status = std::system(command.c_str());
  Result r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  std::remove(out.c_str());
  std::remove(err.c_str());
  std::remove(in.c_str());
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
                                std::optional<ops::Sample> sampling, int32_t seed,
                                const Penalties& penalties = {}) {
  SessionOptions o;
  o.backend = Backend::kCpu;
  o.max_seq = static_cast<int64_t>(prompt.size()) + n;
  o.sampling = sampling;
  o.penalties = !penalties.neutral();
  absl::StatusOr<std::unique_ptr<DecodeSession>> s = DecodeSession::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return {};
  const PrefillRequest r{0, prompt, seed, SlotSampling{sampling, penalties}};
  EXPECT_TRUE((*s)->Prefill(absl::MakeConstSpan(&r, 1)).ok());
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
    EXPECT_TRUE(absl::StrContains(r.out, "--model PATH")) << r.out;
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
      {"--model /nonexistent/stepgraph_model", "does not exist"},
      {"run --chat", "--chat wraps a text prompt"},
      {"run --prompt hi --prompt-ids 1", "cannot be used together"},
      {"tokenize --decode 1,x", "--decode: expected an integer"},
      {"run --text hi", "--text is not an option of 'run'"},
      {"--model-preset llama-9", "unknown preset 'llama-9'"},
      {"run --max-new-tokens 600", "max_position_embeddings (512)"},
      {"run --repeat-penalty 0", "--repeat-penalty: repetition must be finite and > 0"},
      {"chat --presence-penalty 3", "--presence-penalty: presence must be in [-2, 2]"},
      {"run --min-p x", "--min-p: expected a number, got 'x'"},
      {"run --logit-bias 7", "--logit-bias: expected ID=BIAS"},
      {"run --logit-bias 5000=1",
       "--logit-bias: the logit bias is for id 5000, outside the vocabulary [0, 1024)"},
      {"chat --logit-bias 3=1 --logit-bias 3=2", "--logit-bias: id 3 has two logit biases"},
      {"run --stop x", "--stop matches the answer's text"},
      {"chat --stop x", "--stop matches the answer's text"},
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
  EXPECT_TRUE(absl::StrContains(r.out, "time to first token")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "tokens/s, 1 steps")) << "one prefill step: " << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "timing: 6 tokens made; ")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.err, "on the CPU reference")) << r.err;
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

// The penalty flags reach the session: run prints the ids of a session given the same
// penalties (greedy and sampled), and a bias of 100 forces its id at every step.
TEST(CliTest, PenaltyFlagsGiveTheSessionsIds) {
  Penalties p;
  p.repetition = 1.5f;
  p.presence = 0.5f;
  p.frequency = 0.75f;
  p.logit_bias = {{11, 3.0f}, {5, -100.0f}};
  const std::string flags =
      " --repeat-penalty 1.5 --presence-penalty 0.5 --frequency-penalty 0.75 --logit-bias 11=3 "
      "--logit-bias=5=-100";
  const Result greedy = RunProgram("run --cpu --prompt-ids 3,1,4,1,5 --max-new-tokens 12" + flags);
  ASSERT_EQ(greedy.exit_code, 0) << greedy.err;
  const std::vector<int32_t> want = SessionIds({3, 1, 4, 1, 5}, 12, std::nullopt, 0, p);
  EXPECT_EQ(PrintedIds(greedy.out, "generated"), want) << greedy.out;
  EXPECT_NE(want, SessionIds({3, 1, 4, 1, 5}, 12, std::nullopt, 0)) << "the penalties count";

  p.min_p = 0.2f;
  const ops::Sample sample{1.2f, 0, 1.0f};
  const Result sampled = RunProgram(
      "run --cpu --prompt-ids 9,8,7 --max-new-tokens 8 --batch 2 --temperature 1.2 --seed 4 "
      "--min-p 0.2" + flags);
  ASSERT_EQ(sampled.exit_code, 0) << sampled.err;
  EXPECT_EQ(PrintedIds(sampled.out, "sequence 0"), SessionIds({9, 8, 7}, 8, sample, 4, p));
  EXPECT_EQ(PrintedIds(sampled.out, "sequence 1"), SessionIds({9, 8, 7}, 8, sample, 5, p));

  const Result forced =
      RunProgram("run --cpu --prompt-ids 3,1,4 --max-new-tokens 6 --logit-bias 77=100");
  ASSERT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_EQ(PrintedIds(forced.out, "generated"), std::vector<int32_t>(6, 77)) << forced.out;
}

// On a GPU (skipped without one) the penalties run in the replayed step and give the CPU
// reference's ids.
TEST(CliTest, GpuPenaltiesGiveTheCpuReferenceIds) {
  if (!CudaDeviceFound()) GTEST_SKIP() << "no CUDA device";
  const std::string args =
      "run --prompt-ids 3,1,4,1,5 --max-new-tokens 16 --batch 2 --repeat-penalty 1.5 "
      "--presence-penalty 0.5 --frequency-penalty 0.75 --logit-bias 11=3 --logit-bias 5=-100";
  const Result cpu = RunProgram(args + " --cpu");
  const Result gpu = RunProgram(args);
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  ASSERT_EQ(gpu.exit_code, 0) << gpu.err;
  EXPECT_EQ(PrintedIds(gpu.out, "sequence 0"), PrintedIds(cpu.out, "sequence 0"));
  EXPECT_EQ(PrintedIds(gpu.out, "sequence 1"), PrintedIds(cpu.out, "sequence 1"));
  EXPECT_EQ(PrintedIds(gpu.out, "sequence 0").size(), 16u) << gpu.out;
  EXPECT_TRUE(absl::StrContains(gpu.out, "replayed")) << gpu.out;
}

// --device-loop: the CPU reference refuses it by name; on a GPU the ids equal the CPU
// reference's (the loop stops on the device at the fixture's stop ids, if one comes).
TEST(CliTest, DeviceLoopRunGivesTheCpuReferenceIds) {
  const std::string args = "run --prompt-ids 3,1,4,1,5 --max-new-tokens 20 --batch 2";
  const Result cpu = RunProgram(args + " --cpu");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  const Result refused = RunProgram(args + " --cpu --device-loop 8");
  EXPECT_EQ(refused.exit_code, 1) << refused.out;
  EXPECT_TRUE(absl::StrContains(refused.err, "device_loop_steps needs the CUDA backend"))
      << refused.err;
  if (!CudaDeviceFound()) GTEST_SKIP() << "no CUDA device";
  const Result gpu = RunProgram(args + " --device-loop 8");
  ASSERT_EQ(gpu.exit_code, 0) << gpu.err;
  EXPECT_EQ(PrintedIds(gpu.out, "sequence 0"), PrintedIds(cpu.out, "sequence 0"));
  EXPECT_EQ(PrintedIds(gpu.out, "sequence 1"), PrintedIds(cpu.out, "sequence 1"));
}

// The sharded step on the CPU reference (ranks are threads), and a shape that does not
// divide refused by name.
TEST(CliTest, BenchOverTwoRanksOnTheCpu) {
  const Result r = RunProgram("bench --cpu --tp 2 --positions 4 --steps 2");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "tensor parallel: 2 ranks on cpu")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "8 AllReduce, 1 AllGather nodes a step")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "position 4: ")) << r.out;
  const Result bad = RunProgram("bench --cpu --tp 3");
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_TRUE(absl::StrContains(bad.err, "num_attention_heads (8) does not divide by 3")) << bad.err;
}

// run over two ranks of the CPU reference gives transformers' ids of the fixture.
TEST(CliTest, RunOverTwoRanksGivesTheFixturesIds) {
  const std::string dir = std::string(SG_FIXTURES_DIR) + "/f32_gqa";
  const Result r = RunProgram("run --cpu --tp 2 --model '" + dir +
                              "' --prompt-ids 103,193,251,174,120,168 --max-new-tokens 10");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(PrintedIds(r.out, "generated"),
            (std::vector<int32_t>{219, 198, 193, 48, 150, 76, 201, 172, 41, 182}))
      << r.out;
  EXPECT_TRUE(absl::StrContains(r.err, "tensor parallel over 2 ranks")) << r.err;
  const Result odd = RunProgram("run --cpu --tp 3 --model '" + dir + "' --prompt-ids 1,2");
  EXPECT_NE(odd.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(odd.err, "does not divide by 3")) << odd.err;
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
  // The default passes leave each layer's two RmsNorms (norm_into_matmul is off);
  // --passes all folds them too; --no-fuse prints the plain graph (17 nodes per layer).
  EXPECT_TRUE(absl::StrContains(r.out, "graph: batch 2, 34 nodes")) << r.out;
  // The graph is the one the backend `run` would use fuses: the GPU's where CUDA is built.
  EXPECT_TRUE(absl::StrContains(
      r.out, BuiltWithCuda() ? "as the cuda backend fuses it" : "as the cpu backend fuses it"))
      << r.out;
  const Result cpu = RunProgram("graph --batch 2 --cpu");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  EXPECT_TRUE(absl::StrContains(cpu.out, "graph: batch 2, 34 nodes")) << cpu.out;
  EXPECT_TRUE(absl::StrContains(cpu.out, "as the cpu backend fuses it")) << cpu.out;
  const Result all = RunProgram("graph --batch 2 --passes all");
  ASSERT_EQ(all.exit_code, 0) << all.err;
  EXPECT_TRUE(absl::StrContains(all.out, "graph: batch 2, 25 nodes")) << all.out;
  // Without the RoPE + cache-write epilogue each layer keeps its RopeKvWrite node.
  const Result rope_node = RunProgram("graph --batch 2 --passes -norm_into_matmul,"
                                      "-rope_kv_write_epilogue");
  ASSERT_EQ(rope_node.exit_code, 0) << rope_node.err;
  EXPECT_TRUE(absl::StrContains(rope_node.out, "graph: batch 2, 38 nodes")) << rope_node.out;
  const Result plain = RunProgram("graph --batch 2 --no-fuse");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_TRUE(absl::StrContains(plain.out, "graph: batch 2, 74 nodes")) << plain.out;
  const Result sharded = RunProgram("graph --batch 2 --cpu --tp 2");
  EXPECT_EQ(sharded.exit_code, 0) << sharded.err;
  EXPECT_TRUE(absl::StrContains(sharded.out, "the graph of each of 2 ranks")) << sharded.out;
  EXPECT_TRUE(absl::StrContains(sharded.out, "AllReduce x8")) << sharded.out;
  const Result bad = RunProgram("graph --passes nonsense");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_TRUE(absl::StrContains(r.out, "of intermediates")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "weights: ")) << r.out;
  const std::string text = ReadFile(dot);
  std::remove(dot.c_str());
  EXPECT_TRUE(absl::StartsWith(text, "digraph")) << text.substr(0, 80);
  EXPECT_TRUE(absl::StrContains(text, "lm_head")) << "the DOT lacks the lm_head node";
}

// A mixture of experts reads the chosen experts of a step, not all of them: graph says how
// much of the weights a step reads (Qwen3-MoE's fixture: 8 experts, 2 chosen a token).
TEST(CliTest, GraphSaysWhatAStepOfAMixtureReads) {
  const std::string dir = std::string(SG_FIXTURES_DIR) + "/family_qwen3_moe";
  const Result one = RunProgram("graph --cpu --model '" + dir + "'");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_TRUE(absl::StrContains(one.out, "KiB, a step reads ")) << one.out;
  // Llama-3.2-1B's lm head is its embedding table: a step reads every weight.
  const Result dense = RunProgram("graph --cpu --model-preset llama-3.2-1b");
  ASSERT_EQ(dense.exit_code, 0) << dense.err;
  EXPECT_FALSE(absl::StrContains(dense.out, "a step reads")) << dense.out;
}

// A model folder holding `config` (a config.json text) and, unless `with_weights` is
// false, the f32_gqa fixture's weights (linked, not copied).
std::string ModelFolder(const std::string& name, const std::string& config, bool with_weights) {
  const std::string dir = TempPath(name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << config;
  if (with_weights) {
    std::filesystem::create_symlink(std::string(SG_FIXTURES_DIR) + "/f32_gqa/model.safetensors",
                                    dir + "/model.safetensors");
  }
  return dir;
}

std::string FixtureConfig(const std::string& field, const std::string& value) {
  std::string text = ReadFile(std::string(SG_FIXTURES_DIR) + "/f32_gqa/config.json");
  const std::string key = "\"" + field + "\": ";
  const size_t at = text.find(key);
  EXPECT_NE(at, std::string::npos) << field;
  const size_t end = text.find_first_of(",\n", at);
  return text.substr(0, at + key.size()) + value + text.substr(end);
}

// A config asking for terabytes is refused, naming the field, its bound and why, before
// anything is sized from it; nothing prints wrapped sizes and exits 0.
TEST(CliTest, GraphOnAHugeConfigFailsWithAClearMessage) {
  const std::string dir =
      ModelFolder("huge_config", FixtureConfig("intermediate_size", "4000000000000"), false);
  const Result r = RunProgram("graph --model '" + dir + "'");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_TRUE(absl::StrContains(r.err, "intermediate_size = 4000000000000 is larger than 262144"))
      << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "real models have")) << r.err;
}

// A config of many more layers than its files hold is refused before any graph is built
// (within the layer bound, so only the files can tell), with both sizes.
TEST(CliTest, RunOnAConfigLargerThanItsWeightsFailsBeforeBuilding) {
  const std::string dir =
      ModelFolder("many_layers", FixtureConfig("num_hidden_layers", "1000"), true);
  const Result r = RunProgram("run --cpu --model '" + dir + "' --prompt-ids 1,2 --max-new-tokens 2");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "but the safetensors files hold only")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "num_hidden_layers 1000")) << r.err;
}

// A config.json that is a directory or a FIFO is named as such (a FIFO once hung the
// program forever), and an unreadable one says why.
TEST(CliTest, AConfigThatIsNotARegularFileIsNamed) {
  {
    const std::string dir = TempPath("config_dir");
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir + "/config.json");
    const Result r = RunProgram("graph --model '" + dir + "'");
    std::filesystem::remove_all(dir);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, "config.json is a directory, not a regular file")) << r.err;
  }
  {
    const std::string dir = TempPath("config_fifo");
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    ASSERT_EQ(::mkfifo((dir + "/config.json").c_str(), 0600), 0);
    const Result r = RunProgram("graph --model '" + dir + "'");
    std::filesystem::remove_all(dir);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, "config.json is a FIFO, not a regular file")) << r.err;
  }
}

// The KV cache is sized from the request (prompt + new tokens) unless --max-seq is given,
// so a model of a 67M-position context runs in little memory; a --max-seq whose cache
// cannot fit is refused up front with the bytes it needs and the bytes free.
TEST(CliTest, KvCacheIsSizedFromTheRequestAndARefusalSaysTheBytes) {
  const std::string dir =
      ModelFolder("long_context", FixtureConfig("max_position_embeddings", "67108864"), true);
  const Result ok = RunProgram("run --cpu --model '" + dir + "' --prompt-ids 1,2 --max-new-tokens 3");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(PrintedIds(ok.out, "generated").size(), 3u) << ok.out;
  // 2 layers x 2 (K, V) x 64 slots x 2 KV heads x 2^26 positions x 16 dims x 4 bytes.
  const Result refused =
      RunProgram("run --cpu --model '" + dir + "' --prompt-ids 1,2 --batch 64 --max-seq 67108864");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(refused.exit_code, 1) << refused.out << refused.err;
  EXPECT_TRUE(absl::StrContains(refused.err, "needs 2199023255552 bytes")) << refused.err;
  EXPECT_TRUE(absl::StrContains(refused.err, "bytes free")) << refused.err;
}

TEST(CliTest, TinyCpuBench) {
  const Result r = RunProgram("bench --cpu --steps 2 --positions 3,5 --profile");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "position 3: ")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "position 5: ")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "ms/token on the CPU reference")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "MatMul")) << "the profile names the ops: " << r.out;
  // The tiny model holds 512 positions: 128 is measured, 2048 does not fit.
  EXPECT_TRUE(absl::StrContains(r.out, "time to first token, 128-token prompt: ")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "2048-token prompt: skipped")) << r.out;
}

// Text through a GGUF file's tokenizer: ids of a text, and the text of those ids back.
TEST(CliTest, TokenizeEncodesAndDecodesWithTheModelsTokenizer) {
  const std::string model = std::string(SG_FIXTURES_DIR) + "/tokenizer/gguf_spm.gguf";
  const Result enc = RunProgram("tokenize --model '" + model + "' --text 'Hello world, again'");
  ASSERT_EQ(enc.exit_code, 0) << enc.err;
  std::string ids(absl::StripAsciiWhitespace(enc.out));
  ASSERT_FALSE(ids.empty());
  for (char c : ids) ASSERT_TRUE(absl::ascii_isdigit(c) || c == ',') << ids;
  const Result dec = RunProgram("tokenize --model '" + model + "' --decode " + ids);
  ASSERT_EQ(dec.exit_code, 0) << dec.err;
  EXPECT_TRUE(absl::StrContains(dec.out, "Hello world, again")) << dec.out;
  const Result bad = RunProgram("tokenize --model '" + model + "' --decode 99999999");
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_TRUE(absl::StrContains(bad.err, "outside the vocabulary")) << bad.err;
}

TEST(CliTest, TextPromptsNeedAModelWithATokenizer) {
  const Result r = RunProgram("run --cpu --prompt hello");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "needs a model with a tokenizer")) << r.err;
  const Result t = RunProgram("tokenize --text hello");
  EXPECT_EQ(t.exit_code, 1) << t.err;
  EXPECT_TRUE(absl::StrContains(t.err, "needs a model with a tokenizer")) << t.err;
}

// Fields of config.json that change nothing are accepted, and --verbose lists them.
TEST(CliTest, VerboseListsTheConfigMetadataFields) {
  const std::string dir = std::string(SG_FIXTURES_DIR) + "/f32_gqa";
  const Result r = RunProgram("graph --verbose --model '" + dir + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "fields accepted as metadata (unused): ")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "transformers_version")) << r.err;
  const Result quiet = RunProgram("graph --model '" + dir + "'");
  EXPECT_FALSE(absl::StrContains(quiet.err, "accepted as metadata")) << quiet.err;
}


// ---- the prompt from a file or standard input; the chat; honest output ----------------

std::string SmolLM2Path() { return testing::TestCacheDir() + "/SmolLM2-135M-Instruct.Q4_1.gguf"; }

bool HaveSmolLM2() { return std::filesystem::exists(SmolLM2Path()); }

// The lines of `text`, the last without its newline.
std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

// Comma-separated ids.
std::vector<int32_t> Ids(absl::string_view text) {
  std::vector<int32_t> ids;
  for (absl::string_view id : absl::StrSplit(text, ',')) {
    int32_t v = 0;
    EXPECT_TRUE(absl::SimpleAtoi(id, &v)) << "'" << id << "' in '" << text << "'";
    ids.push_back(v);
  }
  return ids;
}

// The numbers that follow `label` in `text`, in order ("the turn's " -> 37, 14).
std::vector<int64_t> NumbersAfter(const std::string& text, const std::string& label) {
  std::vector<int64_t> out;
  for (size_t at = text.find(label); at != std::string::npos; at = text.find(label, at + 1)) {
    int64_t v = 0;
    const size_t begin = at + label.size();
    const size_t end = text.find_first_not_of("0123456789", begin);
    EXPECT_TRUE(absl::SimpleAtoi(text.substr(begin, end - begin), &v)) << text.substr(at, 40);
    out.push_back(v);
  }
  return out;
}

// Without a model, the flags that need its tokenizer say so, and a pipe on standard input
// is not taken for a prompt (the built-in model runs its default ids).
TEST(CliTest, TextPromptSourcesNeedAModelWithATokenizer) {
  const Result dash = RunProgram("run --cpu --prompt -", "hello");
  EXPECT_EQ(dash.exit_code, 1) << dash.err;
  EXPECT_TRUE(absl::StrContains(dash.err, "needs a model with a tokenizer")) << dash.err;
  const Result piped = RunProgram("run --cpu --max-new-tokens 3", "hello");
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  EXPECT_EQ(PrintedIds(piped.out, "generated"), SessionIds({1, 2, 3, 4, 5, 6, 7, 8}, 3,
                                                           std::nullopt, 0));
  const Result missing = RunProgram("run --cpu --file /nonexistent/stepgraph_prompt.txt");
  EXPECT_EQ(missing.exit_code, 1) << missing.err;
  EXPECT_TRUE(absl::StrContains(missing.err, "--file: cannot open")) << missing.err;
}

// The same text from --prompt, --file, --prompt - and a pipe gives the same answer (the
// newline that ends a file or an echo is not part of the prompt); an empty one is refused.
TEST(CliTest, RunTakesThePromptFromAFileOrStandardInput) {
  if (!HaveSmolLM2()) GTEST_SKIP() << "SmolLM2 not fetched (tests/fixtures/fetch_smollm2.sh)";
  const std::string common =
      "run --cpu --model '" + SmolLM2Path() + "' --chat --max-new-tokens 6 --ignore-eos";
  const Result flag = RunProgram(common + " --prompt 'What is the capital of France?'");
  ASSERT_EQ(flag.exit_code, 0) << flag.err;
  EXPECT_TRUE(absl::StrContains(flag.out, "Paris")) << flag.out;
  EXPECT_TRUE(absl::StrContains(flag.err, "timing: 6 tokens made; ")) << flag.err;
  const std::string file = TempPath("prompt.txt");
  std::ofstream(file) << "What is the capital of France?\n";
  const Result from_file = RunProgram(common + " --file '" + file + "'");
  std::remove(file.c_str());
  const Result dash = RunProgram(common + " --prompt -", "What is the capital of France?\n");
  const Result piped = RunProgram(common, "What is the capital of France?");
  for (const Result* r : {&from_file, &dash, &piped}) {
    EXPECT_EQ(r->exit_code, 0) << r->err;
    EXPECT_EQ(r->out, flag.out);
  }
  const Result empty = RunProgram(common + " --prompt -", "");
  EXPECT_EQ(empty.exit_code, 2) << empty.err;
  EXPECT_TRUE(absl::StrContains(empty.err, "the prompt is empty")) << empty.err;
}

// The chat through standard input with the built-in model (token ids): the second turn
// goes on from the first (its answer is that of the whole history prefilled in a fresh
// session), it prefills only its own tokens, and /reset starts over.
TEST(CliChatTest, BuiltInModelKeepsTheConversationAcrossTurns) {
  const Result r = RunProgram("chat --cpu --max-new-tokens 6 --verbose",
                              "3,1,4,1,5\n9,2,6\n/stats\n/reset\n3,1,4,1,5\n/exit\n"
                              "1,2,3\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> answers = Lines(r.out);
  ASSERT_EQ(answers.size(), 3u) << "nothing after /exit is read: " << r.out;
  const std::vector<int32_t> first = Ids(answers[0]);
  EXPECT_EQ(first, SessionIds({3, 1, 4, 1, 5}, 6, std::nullopt, 0));
  std::vector<int32_t> history = {3, 1, 4, 1, 5};
  history.insert(history.end(), first.begin(), first.end());
  history.insert(history.end(), {9, 2, 6});
  EXPECT_EQ(Ids(answers[1]), SessionIds(history, 6, std::nullopt, 0));
  EXPECT_EQ(Ids(answers[2]), first) << "after /reset the conversation starts over";
  // --verbose after every answer, and /stats once more: the turns' own tokens only.
  EXPECT_EQ(NumbersAfter(r.err, "the turn's "), (std::vector<int64_t>{5, 3, 3, 5})) << r.err;
  EXPECT_EQ(NumbersAfter(r.err, "the conversation holds "),
            (std::vector<int64_t>{10, 19, 19, 10}))
      << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "6 tokens made (cut at --max-new-tokens)")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "stepgraph: a new conversation")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "on the CPU reference")) << r.err;
}

// On a GPU (skipped without one) the chat's turns, appended to the slot in prefill steps
// of the replayed graphs, give the CPU reference's answers, and the status line names the
// replayed graphs.
TEST(CliChatTest, GpuChatGivesTheCpuReferenceAnswers) {
  if (!CudaDeviceFound()) GTEST_SKIP() << "no CUDA device";
  const std::string turns = "3,1,4,1,5\n9,2,6\n/reset\n2,7,1,8\n";
  const Result cpu = RunProgram("chat --cpu --max-new-tokens 6", turns);
  const Result gpu = RunProgram("chat --max-new-tokens 6", turns);
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  ASSERT_EQ(gpu.exit_code, 0) << gpu.err;
  EXPECT_EQ(Lines(gpu.out).size(), 3u) << gpu.out;
  EXPECT_EQ(gpu.out, cpu.out);
  EXPECT_TRUE(absl::StrContains(gpu.err, "replayed CUDA graphs; batch buckets 1")) << gpu.err;
}

// The chat's penalties hold from turn to turn (Append keeps the slot's): a bias of 100
// forces its id in every answer.
TEST(CliChatTest, PenaltiesHoldAcrossTurns) {
  const Result r =
      RunProgram("chat --cpu --max-new-tokens 4 --logit-bias 42=100", "3,1,4\n9,2\n/reset\n5\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "42,42,42,42\n42,42,42,42\n42,42,42,42\n") << r.err;
}

TEST(CliChatTest, BadTurnsAreNotSentAndTheChatGoesOn) {
  // A turn that is not ids, an id outside the vocabulary, an unknown command, then a turn
  // that does not fit a 16-position cache after the first turn and answer hold 11.
  const Result r = RunProgram("chat --cpu --max-seq 16 --max-new-tokens 4",
                              "1,x\n5000\n/frob\n/stats\n1,2,3,4,5,6,7,8\n"
                              "1,2,3,4,5,6\n2,3\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "the turn is not sent: expected an integer")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "got '5000'")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "unknown command '/frob'")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "no answer yet")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "the turn (6 tokens) does not fit the KV cache: the "
                                       "conversation holds 11 of 16 positions"))
      << r.err;
  const std::vector<std::string> answers = Lines(r.out);
  ASSERT_EQ(answers.size(), 2u) << r.out;
  EXPECT_EQ(Ids(answers[0]).size(), 4u);
  // Positions 13, 14 and 15 are the last three.
  EXPECT_EQ(Ids(answers[1]).size(), 3u) << "the cache fills after three more tokens";
  EXPECT_TRUE(absl::StrContains(r.err, "the conversation fills the KV cache")) << r.err;
}

// The real model through its chat template: the first answer is run --chat's, the second
// turn prefills exactly the tokens of what follows the first answer (the template's next
// user turn, from Conversation::Next), and /reset gives the first answer again.
TEST(CliChatTest, SmolLM2ChatsThroughItsTemplateKeepingTheHistory) {
  if (!HaveSmolLM2()) GTEST_SKIP() << "SmolLM2 not fetched (tests/fixtures/fetch_smollm2.sh)";
  const std::string model = "--cpu --model '" + SmolLM2Path() + "'";
  const Result r = RunProgram("chat " + model + " --max-new-tokens 24",
                              "What is the capital of France?\n/stats\nAnd of Italy?\n/stats\n"
                              "/reset\nWhat is the capital of France?\n/stats\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> answers = Lines(r.out);
  ASSERT_EQ(answers.size(), 3u) << r.out;
  EXPECT_TRUE(absl::StrContains(answers[0], "Paris")) << answers[0];
  EXPECT_TRUE(absl::StrContains(answers[1], "Rome")) << answers[1];
  EXPECT_EQ(answers[2], answers[0]);
  const Result run = RunProgram("run " + model + " --chat --max-new-tokens 24 --prompt "
                                "'What is the capital of France?'");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, answers[0] + "\n");

  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadModelTokenizer(SmolLM2Path());
  ASSERT_TRUE(tok.ok()) << tok.status();
  absl::StatusOr<cli::Conversation> conv = cli::Conversation::ForTokenizer(**tok, std::nullopt);
  ASSERT_TRUE(conv.ok()) << conv.status();
  auto count = [&](const std::string& text) {
    absl::StatusOr<std::vector<int32_t>> ids = (*tok)->Encode(text, {.add_special = false});
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.ok() ? static_cast<int64_t>(ids->size()) : -1;
  };
  const bool closed = absl::StrContains(r.err, "(the model ended its turn)");
  const int64_t start = count(conv->Start("What is the capital of France?"));
  const int64_t next = count(conv->Next("And of Italy?", closed));
  EXPECT_EQ(NumbersAfter(r.err, "the turn's "), (std::vector<int64_t>{start, next, start}))
      << r.err;
  EXPECT_LT(next, start) << "the second turn prefills only itself";
}

// --stop with the real model: a stop string that begins in one generated token and ends in
// the next is not printed, and generation ends with the token that completes it (the
// timing line counts the tokens made). The generated ids come from a run of the same
// prompt as ids, each decoded alone.
TEST(CliTest, AStopStringAcrossTokensEndsTheTextUnprinted) {
  if (!HaveSmolLM2()) GTEST_SKIP() << "SmolLM2 not fetched (tests/fixtures/fetch_smollm2.sh)";
  const std::string model = "run --cpu --model '" + SmolLM2Path() + "' --ignore-eos";
  const std::string prompt = "Once upon a time";
  const Result whole = RunProgram(model + " --max-new-tokens 16 --prompt '" + prompt + "'");
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadModelTokenizer(SmolLM2Path());
  ASSERT_TRUE(tok.ok()) << tok.status();
  absl::StatusOr<std::vector<int32_t>> prompt_ids = (*tok)->Encode(prompt);
  ASSERT_TRUE(prompt_ids.ok()) << prompt_ids.status();
  const Result ids = RunProgram(model + " --max-new-tokens 16 --prompt-ids " +
                                absl::StrJoin(*prompt_ids, ","));
  ASSERT_EQ(ids.exit_code, 0) << ids.err;
  const std::vector<int32_t> generated = PrintedIds(ids.out, "generated");
  ASSERT_EQ(generated.size(), 16u) << ids.out;
  std::vector<std::string> pieces;
  std::string text;
  for (int32_t id : generated) {
    absl::StatusOr<std::string> piece = (*tok)->Decode({id}, {.skip_special = true});
    ASSERT_TRUE(piece.ok()) << piece.status();
    pieces.push_back(*piece);
    text += *piece;
  }
  ASSERT_EQ(text + "\n", whole.out) << "the same ids";
  // The first two tokens of at least two characters each whose boundary the stop string
  // straddles, where it does not appear earlier.
  std::string stop;
  size_t cut = 0, made = 0;
  for (size_t i = 0, at = 0; i + 1 < pieces.size(); at += pieces[i].size(), ++i) {
    const size_t end = at + pieces[i].size();  // where piece i+1 begins
    if (pieces[i].size() < 2 || pieces[i + 1].size() < 2) continue;
    const std::string s = pieces[i].substr(pieces[i].size() - 2) + pieces[i + 1].substr(0, 2);
    if (text.find(s) != end - 2) continue;
    stop = s;
    cut = end - 2;
    made = i + 2;
    break;
  }
  ASSERT_FALSE(stop.empty()) << "no two neighbouring tokens to cut across in '" << text << "'";
  const Result stopped = RunProgram(model + " --max-new-tokens 16 --prompt '" + prompt +
                                    "' --stop 'never there' --stop '" + stop + "'");
  ASSERT_EQ(stopped.exit_code, 0) << stopped.err;
  EXPECT_EQ(stopped.out, text.substr(0, cut) + "\n") << "stop '" << stop << "'";
  EXPECT_TRUE(absl::StrContains(stopped.err, "timing: " + std::to_string(made) + " tokens made"))
      << stopped.err;
}

// The chat's answer ends at a stop string, which is not printed, and the chat goes on.
TEST(CliChatTest, AStopStringEndsTheAnswerAndTheChatGoesOn) {
  if (!HaveSmolLM2()) GTEST_SKIP() << "SmolLM2 not fetched (tests/fixtures/fetch_smollm2.sh)";
  const std::string chat = "chat --cpu --model '" + SmolLM2Path() + "' --max-new-tokens 12";
  const std::string turns = "What is the capital of France?\nAnd of Italy?\n";
  const Result plain = RunProgram(chat, turns);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const std::vector<std::string> answers = Lines(plain.out);
  ASSERT_EQ(answers.size(), 2u) << plain.out;
  const size_t at = answers[0].find("aris");
  ASSERT_NE(at, std::string::npos) << answers[0];
  const Result r = RunProgram(chat + " --verbose --stop aris", turns);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> cut = Lines(r.out);
  ASSERT_EQ(cut.size(), 2u) << r.out;
  EXPECT_EQ(cut[0], answers[0].substr(0, at));
  EXPECT_TRUE(absl::StrContains(r.err, "(ended at a --stop string)")) << r.err;
  EXPECT_FALSE(cut[1].empty()) << "the next turn is answered";
}

// A GGUF file that fails to load gets a hint about GGUF files, not the one about model
// folders, and a folder the one about folders.
TEST(CliTest, AModelThatDoesNotLoadGetsTheHintOfWhatWasGiven) {
  const std::string path = TempPath("broken.gguf");
  std::ofstream(path) << "GGUF, but not one";
  const Result r = RunProgram("run --cpu --model '" + path + "'");
  std::remove(path.c_str());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "hint: --model FILE takes a GGUF file")) << r.err;
  EXPECT_FALSE(absl::StrContains(r.err, "needs config.json and its *.safetensors")) << r.err;

  const std::string dir = TempPath("empty_folder");
  std::filesystem::create_directories(dir);
  const Result folder = RunProgram("graph --model '" + dir + "'");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(folder.exit_code, 1) << folder.err;
  EXPECT_TRUE(absl::StrContains(folder.err, "hint: a model folder needs config.json and its "
                                            "*.safetensors"))
      << folder.err;
  EXPECT_FALSE(absl::StrContains(folder.err, "GGUF")) << folder.err;
}

// The GPU benchmark on a machine without one says so at once and asks for --cpu, instead
// of running the CPU reference for minutes.
TEST(CliTest, GpuBenchmarkWithoutAGpuAsksForCpu) {
  if (CudaDeviceFound()) GTEST_SKIP() << "a CUDA device is present";
  const Result r = RunProgram("bench --model-preset llama-3.2-1b");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(r.out.empty()) << "nothing ran: " << r.out;
  EXPECT_TRUE(absl::StartsWith(r.err, "stepgraph: error: bench measures the decode step on a "
                                      "GPU"))
      << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "\nhint: add --cpu to measure the CPU reference anyway\n"))
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 2) << r.err;
}

// On the CPU the status line says what runs there, not the GPU's eager/replayed words.
TEST(CliTest, TheStatusLineDescribesThePathTaken) {
  const Result r = RunProgram("run --cpu --prompt-ids 1,2 --max-new-tokens 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "on the CPU reference (f32 math, ")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "KV cache 4 positions x 1 sequence")) << r.err;
  EXPECT_FALSE(absl::StrContains(r.err, "eager")) << r.err;
  EXPECT_FALSE(absl::StrContains(r.err, "buckets")) << r.err;
  // --threads sets the reference's workers, and the line says how many; the ids are the
  // same with any number of them.
  const Result three = RunProgram("run --cpu --threads 3 --prompt-ids 1,2 --max-new-tokens 2");
  ASSERT_EQ(three.exit_code, 0) << three.err;
  EXPECT_TRUE(absl::StrContains(three.err, "on the CPU reference (f32 math, 3 threads)"))
      << three.err;
  const Result one = RunProgram("run --cpu -t 1 --prompt-ids 1,2 --max-new-tokens 2");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_TRUE(absl::StrContains(one.err, "(f32 math, 1 thread)")) << one.err;
  EXPECT_EQ(PrintedIds(one.out, "generated"), PrintedIds(three.out, "generated")) << one.out;
  EXPECT_FALSE(PrintedIds(one.out, "generated").empty()) << one.out;
  EXPECT_EQ(RunProgram("run --cpu --threads 0").exit_code, 2);
}

}  // namespace
}  // namespace sg
