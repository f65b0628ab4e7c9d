// The program's options parser: every kind of bad argument is refused with an error that
// names the flag and the bad value, the environment maps onto options (and flags override
// it), and each command's --help lists every flag that command takes.
#include "tools/options.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "stepgraph/dispatch/cuda_options.h"

namespace sg::cli {
namespace {

// Parses `args` with the environment `env` (nothing else set).
absl::StatusOr<Options> Parse(std::vector<const char*> args,
                              std::map<std::string, std::string> env = {},
                              std::optional<Command>* named = nullptr) {
  std::optional<Command> ignored;
  return ParseArgs(
      args,
      [env](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      named != nullptr ? named : &ignored);
}

void ExpectRefused(std::vector<const char*> args, const std::string& says) {
  std::string line;
  for (const char* a : args) line += std::string(a) + " ";
  SCOPED_TRACE(line);
  const absl::StatusOr<Options> o = Parse(args);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(o.status().message(), says)) << o.status().message();
}

TEST(OptionsTest, UnknownFlagsAndCommandsAreNamed) {
  ExpectRefused({"--frobnicate"}, "unknown flag '--frobnicate'");
  ExpectRefused({"run", "--frobnicate=3"}, "unknown flag '--frobnicate'");
  ExpectRefused({"frob"}, "unknown command 'frob'");
  ExpectRefused({"run", "stray"}, "unexpected argument 'stray'");
  // A flag of another command is named with the command that does not take it.
  ExpectRefused({"run", "--dot", "x.dot"}, "--dot is not an option of 'run'");
  ExpectRefused({"chat", "--prompt-ids", "1"}, "--prompt-ids is not an option of 'chat'");
  ExpectRefused({"tokenize", "--batch", "2"}, "--batch is not an option of 'tokenize'");
}

TEST(OptionsTest, MissingValuesAndValuesOfSwitchesAreRefused) {
  ExpectRefused({"run", "--max-new-tokens"}, "--max-new-tokens: missing value");
  ExpectRefused({"chat", "--system"}, "--system: missing value");
  ExpectRefused({"run", "--cpu=yes"}, "--cpu takes no value");
  ExpectRefused({"--help=1"}, "--help takes no value");
}

TEST(OptionsTest, BadNumbersNameTheFlagTheRangeAndTheValue) {
  ExpectRefused({"run", "--max-new-tokens", "abc"},
                "--max-new-tokens: expected an integer in [0, 2147483647], got 'abc'");
  ExpectRefused({"run", "--max-new-tokens=-3"}, "got '-3'");
  ExpectRefused({"chat", "--max-new-tokens", "0"}, "--max-new-tokens: expected an integer in [1,");
  ExpectRefused({"run", "--batch", "0"}, "--batch: expected an integer in [1, 1024], got '0'");
  ExpectRefused({"run", "--temperature", "-1"}, "--temperature: expected a number in [0, 100]");
  ExpectRefused({"run", "--temperature", "nan"}, "got 'nan'");
  ExpectRefused({"run", "--top-p", "0"}, "--top-p: expected a number in (0, 1], got '0'");
  ExpectRefused({"run", "--prompt-ids", "1,x,3"}, "--prompt-ids: expected an integer");
  ExpectRefused({"run", "--prompt-ids", "1,,3"}, "got ''");
  ExpectRefused({"bench", "--positions", "100,-1"}, "--positions: expected an integer");
  ExpectRefused({"--weight-seed", "1e3"}, "--weight-seed: expected an integer >= 0, got '1e3'");
  ExpectRefused({"--max-seq", "99999999999"}, "--max-seq: expected an integer in [1,");
  ExpectRefused({"--model-preset", "llama-9"}, "--model-preset: unknown preset 'llama-9'");
  ExpectRefused({"--matmul", "fast"}, "--matmul: ");
  ExpectRefused({"--passes", "nonsense"}, "--passes: ");
  ExpectRefused({"--model", "/nonexistent/stepgraph_model"},
                "--model: '/nonexistent/stepgraph_model' does not exist");
}

TEST(OptionsTest, FlagsThatExcludeEachOtherAreRefused) {
  ExpectRefused({"run", "--prompt", "hi", "--prompt-ids", "1"}, "cannot be used together");
  ExpectRefused({"run", "--file", "p.txt", "--prompt-ids", "1"}, "cannot be used together");
  ExpectRefused({"run", "--prompt", "hi", "--file", "p.txt"}, "cannot be used together");
  ExpectRefused({"run", "--chat"}, "--chat wraps a text prompt");
  ExpectRefused({"chat", "--system", "be brief"}, "--system needs a --model");
  ExpectRefused({"tokenize", "--text", "a", "--decode", "1"}, "cannot be used together");
}

TEST(OptionsTest, ValuesAreParsedForTheCommandNamed) {
  std::optional<Command> named;
  absl::StatusOr<Options> o =
      Parse({"chat", "--max-new-tokens=12", "--temperature", "0.5", "--top-k", "40", "--seed",
             "-7", "--max-seq", "300"},
            {}, &named);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(named, kChat);
  EXPECT_EQ(o->command, kChat);
  EXPECT_EQ(o->answer_tokens, 12);
  EXPECT_EQ(o->max_new_tokens, 32) << "run's limit is not chat's";
  EXPECT_FLOAT_EQ(o->temperature, 0.5f);
  EXPECT_EQ(o->top_k, 40);
  EXPECT_EQ(o->seed, -7);
  EXPECT_EQ(o->max_seq, 300);

  o = Parse({"--prompt-ids", "5,6", "--batch", "3"}, {}, &named);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->command, kRun) << "run is the default command";
  EXPECT_EQ(o->prompt_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(o->batch, 3);
  o = Parse({"bench", "--positions", "3,5", "--ttft-lengths=8"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->positions, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(o->ttft_lengths, (std::vector<int64_t>{8}));
  o = Parse({"help"});
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE(o->help);
}

// The penalty flags and --stop: values reach the options (logit biases and stop strings
// repeat), and each bad value is refused with CheckPenalties' reason said of the flag.
TEST(OptionsTest, PenaltiesAndStopStringsAreParsedAndChecked) {
  absl::StatusOr<Options> o = Parse(
      {"run", "--repeat-penalty", "1.3", "--presence-penalty=-0.5", "--frequency-penalty", "2",
       "--min-p", "0.05", "--logit-bias", "17=-100", "--logit-bias=3=2.5", "--stop", "\n\n",
       "--stop", "User:", "--prompt", "hi"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FLOAT_EQ(o->penalties.repetition, 1.3f);
  EXPECT_FLOAT_EQ(o->penalties.presence, -0.5f);
  EXPECT_FLOAT_EQ(o->penalties.frequency, 2.0f);
  EXPECT_FLOAT_EQ(o->penalties.min_p, 0.05f);
  EXPECT_EQ(o->penalties.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{17, -100.0f}, {3, 2.5f}}));
  EXPECT_EQ(o->stop, (std::vector<std::string>{"\n\n", "User:"}));
  EXPECT_FALSE(o->penalties.neutral());
  o = Parse({"chat", "--repeat-penalty", "1", "--min-p", "0"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->penalties.neutral()) << "the neutral values ask for no penalties";
  o = Parse({"serve", "--presence-penalty", "0.25", "--logit-bias", "5=1"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FLOAT_EQ(o->penalties.presence, 0.25f);

  ExpectRefused({"run", "--repeat-penalty", "0"},
                "--repeat-penalty: repetition must be finite and > 0 (1: off), got 0");
  ExpectRefused({"run", "--repeat-penalty", "inf"}, "--repeat-penalty: repetition must be");
  ExpectRefused({"run", "--repeat-penalty", "x"}, "--repeat-penalty: expected a number, got 'x'");
  ExpectRefused({"chat", "--presence-penalty", "2.5"},
                "--presence-penalty: presence must be in [-2, 2] (0: off), got 2.5");
  ExpectRefused({"run", "--frequency-penalty", "-3"}, "--frequency-penalty: frequency must be");
  ExpectRefused({"run", "--frequency-penalty", "nan"}, "--frequency-penalty: ");
  ExpectRefused({"run", "--min-p", "1.5"}, "--min-p: min_p must be in [0, 1]");
  ExpectRefused({"serve", "--min-p", "-0.1"}, "--min-p: min_p must be in [0, 1]");
  ExpectRefused({"run", "--logit-bias", "17"}, "--logit-bias: expected ID=BIAS");
  ExpectRefused({"run", "--logit-bias", "x=1"}, "--logit-bias: expected an integer");
  ExpectRefused({"run", "--logit-bias", "-1=1"}, "--logit-bias: expected an integer in [0,");
  ExpectRefused({"run", "--logit-bias", "5=abc"}, "--logit-bias: expected a number, got 'abc'");
  ExpectRefused({"run", "--logit-bias", "5=101"},
                "--logit-bias: the logit bias (id 5) must be in [-100, 100], got 101");
  ExpectRefused({"run", "--logit-bias", "5=1", "--logit-bias", "5=2"},
                "--logit-bias: id 5 has two logit biases");
  std::vector<std::string> many;
  for (int i = 0; i <= ops::kMaxLogitBias; ++i) {
    many.push_back("--logit-bias=" + std::to_string(i) + "=1");
  }
  std::vector<const char*> args = {"run"};
  for (const std::string& a : many) args.push_back(a.c_str());
  ExpectRefused(args, "--logit-bias: at most 64 logit biases, got 65");
  args.pop_back();
  EXPECT_TRUE(Parse(args).ok()) << "64 are taken";

  ExpectRefused({"run", "--stop", ""}, "--stop: each stop string must hold 1 to 256 bytes, got 0");
  ExpectRefused({"run", "--stop", "\xff"}, "--stop: a stop string is not valid UTF-8");
  ExpectRefused({"run", "--prompt", "x", "--stop", "a", "--stop", "b", "--stop", "c", "--stop",
                 "d", "--stop", "e"},
                "--stop: at most 4 stop strings");
  ExpectRefused({"serve", "--stop", "a"}, "--stop is not an option of 'serve'");
  // --stop matches text: the built-in model's ids have none.
  ExpectRefused({"run", "--stop", "a"}, "--stop matches the answer's text");
  ExpectRefused({"run", "--prompt-ids", "1,2", "--stop", "a"}, "--stop matches the answer's text");
  ExpectRefused({"chat", "--stop", "a"}, "--stop matches the answer's text");
}

// With the model's vocabulary the logit biases' ids are checked too, the error naming the
// flag.
TEST(OptionsTest, PenaltyFlagsAreCheckedAgainstTheVocabulary) {
  Penalties p;
  EXPECT_TRUE(CheckPenaltyFlags(p, 1024).ok());
  p.logit_bias = {{3, 1.0f}, {1023, -1.0f}};
  EXPECT_TRUE(CheckPenaltyFlags(p, 1024).ok());
  p.logit_bias.push_back({1024, 5.0f});
  absl::Status st = CheckPenaltyFlags(p, 1024);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "--logit-bias: the logit bias is for id 1024, outside the vocabulary "
                          "[0, 1024)");
  p.logit_bias.clear();
  p.min_p = 2.0f;
  st = CheckPenaltyFlags(p, 1024);
  EXPECT_TRUE(absl::StartsWith(st.message(), "--min-p: ")) << st.message();
}

TEST(OptionsTest, TensorParallelFlagsAndPresets) {
  absl::StatusOr<Options> o = Parse({"bench", "--tp", "4", "--one-shot-bytes", "0",
                                     "--model-preset", "llama-3.1-70b"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->tensor_parallel, 4);
  EXPECT_EQ(o->cuda.one_shot_all_reduce_bytes, 0);
  EXPECT_EQ(o->preset, "llama-3.1-70b");
  o = Parse({"bench", "--tensor-parallel", "2", "--model-preset", "llama-3.1-8b"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->tensor_parallel, 2);
  EXPECT_EQ(Parse({"bench"})->tensor_parallel, 0) << "one device through a session";
  ExpectRefused({"bench", "--tp", "0"}, "--tp");
  ExpectRefused({"bench", "--tp", "65"}, "--tp");
  EXPECT_EQ(Parse({"serve", "--tp", "2"})->tensor_parallel, 2);
  ExpectRefused({"tokenize", "--tp", "2"}, "--tp is not an option of 'tokenize'");
  // The MoE kernels' walk (CudaOptions::moe_by_expert_pairs).
  EXPECT_EQ(Parse({"bench"})->cuda.moe_by_expert_pairs, 2);
  EXPECT_EQ(Parse({"bench", "--moe-by-expert", "0"})->cuda.moe_by_expert_pairs, 0);
  EXPECT_TRUE(Parse({"bench"})->cuda.moe_block_mma);
  EXPECT_FALSE(Parse({"bench", "--no-moe-mma"})->cuda.moe_block_mma);
  EXPECT_TRUE(Parse({"bench", "--no-moe-mma", "--moe-mma"})->cuda.moe_block_mma)
      << "the last of the two flags wins";
  ExpectRefused({"bench", "--moe-by-expert", "-1"}, "--moe-by-expert");
  // Decode attention's merge within thread block clusters (CudaOptions::attention_clusters).
  EXPECT_TRUE(Parse({"bench"})->cuda.attention_clusters);
  EXPECT_FALSE(Parse({"run", "--no-attention-clusters"})->cuda.attention_clusters);
  ExpectRefused({"bench", "--model-preset", "llama-3.1-405b"}, "unknown preset 'llama-3.1-405b'");
}

TEST(OptionsTest, BlockFormatPathFlags) {
  absl::StatusOr<Options> o = Parse({"bench"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->cuda.block_gemm_min_rows, CudaOptions::kBlockGemmAuto);
  o = Parse({"bench", "--block-gemm-rows", "64", "--block-mma-rows", "8"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->cuda.block_gemm_min_rows, 64);
  EXPECT_EQ(o->cuda.block_mma_min_rows, 8);
  o = Parse({"bench", "--block-gemm-rows", "0", "--block-gemm-rows", "auto"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->cuda.block_gemm_min_rows, CudaOptions::kBlockGemmAuto);
  ExpectRefused({"bench", "--block-gemm-rows", "-1"}, "--block-gemm-rows");
  ExpectRefused({"bench", "--block-gemm-rows", "many"}, "--block-gemm-rows");
}

TEST(OptionsTest, DeviceLoopFlag) {
  EXPECT_EQ(Parse({"run"})->device_loop, 0);
  EXPECT_EQ(Parse({"run", "--device-loop", "64"})->device_loop, 64);
  ExpectRefused({"run", "--device-loop", "-1"}, "--device-loop");
  ExpectRefused({"run", "--device-loop", "5000"}, "--device-loop");
  ExpectRefused({"tokenize", "--device-loop", "8"}, "--device-loop is not an option of 'tokenize'");
}

// The block GEMM's rows as the dispatcher resolves them: from 32 rows where it runs on
// tensor cores (auto's f16 among them); never where exact f32 x stays on the tensor-core
// kernel.
TEST(OptionsTest, BlockGemmRowsResolve) {
  CudaOptions c;
  EXPECT_EQ(BlockGemmMinRows(c, DType::kF32), 32);
  EXPECT_EQ(BlockGemmMinRows(c, DType::kBF16), 32);
  EXPECT_EQ(BlockGemmMinRows(c, DType::kF16), 32);
  c.block_gemm_precision = BlockGemmPrecision::kBf16;
  EXPECT_EQ(BlockGemmMinRows(c, DType::kF32), 32);
  c.block_gemm_precision = BlockGemmPrecision::kBf16x2;  // the kernel's x in two parts
  EXPECT_EQ(BlockGemmMinRows(c, DType::kF32), 0);
  c.block_gemm_precision = BlockGemmPrecision::kF16x2;  // two scaled f16 parts
  EXPECT_EQ(BlockGemmMinRows(c, DType::kF32), 0);
  c.block_gemm_precision = BlockGemmPrecision::kInt8;  // x as int8 on the same kernel
  EXPECT_EQ(BlockGemmMinRows(c, DType::kF32), 0);
  c.block_gemm_precision = BlockGemmPrecision::kF32;  // exact: the tensor-core kernel
  EXPECT_EQ(BlockGemmMinRows(c, DType::kF32), 0);
  c.block_mma_min_rows = 0;  // no tensor-core kernel: the GEMM beats the CUDA-core one
  EXPECT_EQ(BlockGemmMinRows(c, DType::kF32), 32);
  c.block_gemm_min_rows = 7;
  EXPECT_EQ(BlockGemmMinRows(c, DType::kF32), 7);
  c.block_gemm_min_rows = 0;
  EXPECT_EQ(BlockGemmMinRows(c, DType::kBF16), 0);
}

TEST(OptionsTest, PrefillAttentionFlag) {
  EXPECT_EQ(Parse({"run"})->cuda.prefill_attention, PrefillAttentionPrecision::kAuto);
  EXPECT_EQ(Parse({"bench", "--prefill-attention", "f32"})->cuda.prefill_attention,
            PrefillAttentionPrecision::kF32);
  EXPECT_EQ(Parse({"serve", "--prefill-attention", "f16"})->cuda.prefill_attention,
            PrefillAttentionPrecision::kF16);
  ExpectRefused({"run", "--prefill-attention", "bf16"}, "must be auto, f32 or f16, got 'bf16'");
}

// The session's choice for a prompt's attention: f16 only for block-format matrices with
// f32 activations whose matmuls already round x (auto's f16, bf16, tf32, int8), f32 for
// every other model and where the matmuls keep f32's precision; an explicit choice stays.
TEST(OptionsTest, PrefillAttentionResolves) {
  using P = PrefillAttentionPrecision;
  CudaOptions c;
  EXPECT_EQ(ResolvePrefillAttention(c, true), P::kF16);
  EXPECT_EQ(ResolvePrefillAttention(c, false), P::kF32);
  for (BlockGemmPrecision p : {BlockGemmPrecision::kF16, BlockGemmPrecision::kBf16,
                               BlockGemmPrecision::kTf32, BlockGemmPrecision::kInt8,
                               BlockGemmPrecision::kBf16x2}) {
    c.block_gemm_precision = p;
    EXPECT_EQ(ResolvePrefillAttention(c, true), P::kF16) << BlockGemmPrecisionName(p);
    EXPECT_EQ(ResolvePrefillAttention(c, false), P::kF32) << BlockGemmPrecisionName(p);
  }
  for (BlockGemmPrecision p : {BlockGemmPrecision::kF32, BlockGemmPrecision::kF16x2}) {
    c.block_gemm_precision = p;
    EXPECT_EQ(ResolvePrefillAttention(c, true), P::kF32) << BlockGemmPrecisionName(p);
  }
  c.prefill_attention = P::kF16;
  EXPECT_EQ(ResolvePrefillAttention(c, false), P::kF16);
  c.prefill_attention = P::kF32;
  c.block_gemm_precision = BlockGemmPrecision::kAuto;
  EXPECT_EQ(ResolvePrefillAttention(c, true), P::kF32);
}

TEST(OptionsTest, TheEnvironmentMapsOntoOptionsAndFlagsOverrideIt) {
  absl::StatusOr<Options> o = Parse({"run"}, {{"STEPGRAPH_EAGER", "1"},
                                              {"STEPGRAPH_PDL", "0"},
                                              {"STEPGRAPH_MATMUL", "gemv"},
                                              {"XDG_CACHE_HOME", "/xdg"},
                                              {"HOME", "/home/u"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->eager);
  EXPECT_FALSE(o->cuda.programmatic_launch);
  EXPECT_EQ(o->cuda.matmul, MatmulPolicy::kGemv);
  EXPECT_EQ(o->cuda.kernel_cache_folder, "/xdg/stepgraph/kernels");

  o = Parse({"run", "--matmul", "cublaslt", "--kernel-cache", "none"},
            {{"STEPGRAPH_EAGER", "0"}, {"STEPGRAPH_PDL", "1"}, {"STEPGRAPH_MATMUL", "gemv"},
             {"HOME", "/home/u"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->eager) << "STEPGRAPH_EAGER=0 leaves the replayed step";
  EXPECT_TRUE(o->cuda.programmatic_launch) << "only STEPGRAPH_PDL=0 switches PDL off";
  EXPECT_EQ(o->cuda.matmul, MatmulPolicy::kCublasLt) << "the flag overrides the variable";
  EXPECT_EQ(o->cuda.kernel_cache_folder, "");

  o = Parse({"graph"}, {{"HOME", "/home/u"}});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->cuda.kernel_cache_folder, "/home/u/.cache/stepgraph/kernels");

  o = Parse({"run"}, {{"STEPGRAPH_MATMUL", "fast"}});
  ASSERT_FALSE(o.ok());
  EXPECT_TRUE(absl::StrContains(o.status().message(), "environment variable STEPGRAPH_MATMUL: "))
      << o.status().message();
}

// Each command's help comes from the flag table: it lists every flag the command takes
// (with its value and, where one sets it too, its environment variable), and no other.
TEST(OptionsTest, HelpListsEveryFlagOfTheCommand) {
  for (const Command c : {kRun, kChat, kGraph, kBench, kTokenize, kServe}) {
    SCOPED_TRACE(std::string(CommandName(c)));
    const std::string help = HelpText(c);
    EXPECT_TRUE(absl::StartsWith(help, "usage: stepgraph " + std::string(CommandName(c))))
        << help;
    for (const Flag& f : Flags()) {
      std::string shown = f.name;
      if (f.value != nullptr) shown += std::string(" ") + f.value;
      const bool listed = absl::StrContains(help, "  " + shown) ||
                          absl::StrContains(help, std::string(", ") + shown);
      if (f.commands & c) {
        EXPECT_TRUE(listed) << shown;
        if (f.env != nullptr) {
          EXPECT_TRUE(absl::StrContains(help, f.env)) << f.env;
        }
      } else if (f.value != nullptr) {
        bool elsewhere = false;  // the same name defined for this command too
        for (const Flag& g : Flags()) {
          elsewhere |= g.name == std::string(f.name) && (g.commands & c);
        }
        if (!elsewhere) {
          EXPECT_FALSE(listed) << shown << " is not an option of this command";
        }
      }
    }
    for (absl::string_view line : absl::StrSplit(help, '\n')) {
      EXPECT_LE(line.size(), 92u) << line;
    }
  }
  const std::string overview = HelpText(std::nullopt);
  for (const Command c : {kRun, kChat, kGraph, kBench, kTokenize, kServe}) {
    EXPECT_TRUE(absl::StrContains(overview, "  " + std::string(CommandName(c)) + " "));
  }
  EXPECT_TRUE(absl::StrContains(overview, "--model PATH"));
}

}  // namespace
}  // namespace sg::cli
