// The `stepgraph` program's options. Every flag is defined once, in one table: its name,
// its value, the commands that take it, its help and how it sets the options. From that
// table come the parser (errors name the flag and the bad value), each command's --help,
// and the mapping of environment variables onto options, which happens here and nowhere
// else (the library reads no environment).
#ifndef STEPGRAPH_TOOLS_OPTIONS_H_
#define STEPGRAPH_TOOLS_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "stepgraph/dispatch/cuda_options.h"
#include "stepgraph/graph/passes.h"
#include "stepgraph/runtime/session.h"

namespace sg::cli {

// A bit each, so that a flag names the commands that take it as a mask.
enum Command : unsigned {
  kRun = 1,
  kChat = 2,
  kGraph = 4,
  kBench = 8,
  kTokenize = 16,
  kServe = 32,
};
constexpr unsigned kAllCommands = kRun | kChat | kGraph | kBench | kTokenize | kServe;
absl::string_view CommandName(Command c);  // "run", "chat", ...

struct Options {
  Command command = kRun;
  bool help = false;

  // The model and where it runs (every command).
  std::string model;  // a folder or a GGUF file; empty: the preset
  std::string preset = "tiny";
  uint64_t weight_seed = 0;
  bool cpu = false;
  int64_t threads = 0;  // the CPU reference's threads; 0: one per core
  bool verbose = false;
  bool eager = false;
  CudaOptions cuda;
  PassOptions passes = DefaultPassOptions();
  int64_t max_seq = 0;  // 0: what the command needs
  int64_t prefill_chunk = 2048;
  // SessionOptions::device_loop_steps (run): decode steps per launch on the device; 0: one
  // launch per step.
  int64_t device_loop = 0;

  // run
  std::vector<int32_t> prompt_ids = {1, 2, 3, 4, 5, 6, 7, 8};
  bool prompt_ids_given = false;
  std::optional<std::string> prompt_text;  // --prompt; "-" reads standard input
  std::optional<std::string> prompt_file;  // --file
  bool chat = false;
  bool ignore_eos = false;
  int64_t max_new_tokens = 32;
  int64_t batch = 1;
  float temperature = 0.0f;  // run and chat
  int32_t top_k = 0;
  float top_p = 1.0f;
  int32_t seed = 0;
  // run, chat and serve (the defaults of requests); neutral: sessions without penalties.
  Penalties penalties;
  std::vector<std::string> stop;  // run and chat: at most kMaxStopStrings

  // chat
  std::optional<std::string> system;
  int64_t answer_tokens = 0;  // the most tokens per answer; 0: until the end of the turn

  // tokenize
  std::optional<std::string> text;
  std::optional<std::vector<int32_t>> decode;

  // graph
  std::string dot;

  // serve (its limits are answered with HTTP errors: 413, 400, 503)
  std::string host = "127.0.0.1";
  int64_t port = 8080;  // 0: any free port (the line that says where it listens tells)
  int64_t slots = 16;
  std::string api_key;  // empty: no key asked for
  int64_t max_queue = 64;
  int64_t max_body_bytes = int64_t{1} << 20;
  int64_t max_prompt_tokens = 0;  // 0: the context (--max-seq)
  int64_t max_tokens = 0;         // 0: the context
  int64_t http_threads = 0;       // 0: slots + max_queue + 8
  int64_t drain_seconds = 30;

  // bench
  int64_t steps = 64;
  int64_t tensor_parallel = 0;  // ranks; 0: one device through a session
  std::vector<int64_t> positions = {100, 1000};
  bool profile = false;
  std::vector<int64_t> ttft_lengths = {128, 512, 2048};
};

// How an environment variable sets a switch.
enum class EnvRule : uint8_t {
  kNone,
  kSetUnlessZero,  // any value but empty or "0" sets the switch (STEPGRAPH_EAGER=1)
  kSetIfZero,      // "0" sets the switch (STEPGRAPH_PDL=0 is --no-pdl)
  kValue,          // the value is the flag's value (STEPGRAPH_MATMUL=gemv)
};

// One flag of one or more commands. A name may be defined again for other commands, with
// help and an effect of its own there (--max-new-tokens of run and of chat).
struct Flag {
  const char* name;         // "--max-new-tokens"
  const char* short_name;   // "-h", or nullptr
  const char* value;        // "N" for the help; nullptr: a switch, which takes no value
  unsigned commands;        // the Command bits that take it
  bool model_section;       // listed under "model options" rather than the command's own
  const char* help;         // one paragraph; wrapped when printed
  const char* env;          // the environment variable that also sets it, or nullptr
  EnvRule env_rule;
  // Sets the options from the value ("" for a switch). Errors say what was wrong with the
  // value without naming the flag: the parser names the flag or the variable.
  absl::Status (*apply)(absl::string_view value, Options& options);
};

// Every flag definition, in the order the help lists them.
absl::Span<const Flag> Flags();

// The environment as the program sees it: std::getenv, a map in tests.
using Environment = std::function<const char*(const char*)>;

// The command line (without the program's name): an optional command word ("run" when
// none; "help" asks for the overview), then flags as "--flag value" or "--flag=value".
// Environment variables are applied first, so flags override them. InvalidArgument naming
// the flag or the variable and what was wrong; `named` is set to the command when the
// first word names one (for the hint of an error).
absl::StatusOr<Options> ParseArgs(absl::Span<const char* const> args, const Environment& env,
                                  std::optional<Command>* named);

// The help of `command` (usage, what it does, its options and the model options), or the
// overview of every command when none is named.
std::string HelpText(std::optional<Command> command);

// Why run's --stop was refused: it matches text, and the prompt is ids.
inline constexpr char kStopNeedsText[] =
    "--stop matches the answer's text: give --prompt TEXT, --file PATH or the text on standard "
    "input, with a --model that has a tokenizer";

// The penalty flags' values (--repeat-penalty, ..., --logit-bias) checked by CheckPenalties
// for a model of `vocab_size` ids, InvalidArgument naming the flag at fault. The parser
// checks all but the logit biases' ids, which need the model.
absl::Status CheckPenaltyFlags(const Penalties& penalties, int64_t vocab_size);

// Value parsers, each error saying what was expected and what was given.
absl::StatusOr<int64_t> ParseInt(absl::string_view text, int64_t min, int64_t max = INT64_MAX);
absl::StatusOr<float> ParseFloat(absl::string_view text, float lo, float hi, bool lo_open);
absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view text, int64_t min,
                                                  int64_t max);

}  // namespace sg::cli

#endif  // STEPGRAPH_TOOLS_OPTIONS_H_
