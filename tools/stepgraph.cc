// The `stepgraph` program: decode with a Llama model end to end (run), show the decode
// step's graph (graph), and measure decode speed against the memory-bandwidth floor
// (bench). With no --model it uses a small built-in model with deterministic random
// weights, so every command runs anywhere; without a GPU it runs the CPU reference.
//
// Exit status: 0 done (or --help), 1 a runtime error (a model that fails to load, a device
// error), 2 a usage error (unknown flag, bad value); errors are one line plus a hint.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "runtime/timing.h"
#include "models/config.h"
#include "stepgraph/text/chat_template.h"
#include "stepgraph/models/llama.h"
#include "models/model_files.h"
#include "models/model_tokenizer.h"
#include "stepgraph/text/tokenizer.h"
#include "stepgraph/runtime/session.h"
#include "stepgraph/graph/builder.h"
#include "stepgraph/dispatch/cuda_options.h"
#include "stepgraph/base/half.h"
#include "stepgraph/runtime/measure.h"
#include "stepgraph/runtime/step_runner.h"
#include "stepgraph/graph/passes.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitRuntime = 1;
constexpr int kExitUsage = 2;

enum Command : unsigned { kRun = 1, kGraph = 2, kBench = 4, kTokenize = 8 };
constexpr unsigned kAll = kRun | kGraph | kBench | kTokenize;

const char* CommandName(Command c) {
  switch (c) {
    case kRun:
      return "run";
    case kGraph:
      return "graph";
    case kBench:
      return "bench";
    case kTokenize:
      return "tokenize";
  }
  return "run";
}

struct Args {
  Command command = kRun;
  bool help = false;
  std::string model;  // a folder or a GGUF file; empty: the preset
  std::string preset = "tiny";
  uint64_t weight_seed = 0;
  bool cpu = false;
  bool verbose = false;
  bool eager = false;
  CudaOptions cuda;
  PassOptions passes = DefaultPassOptions();
  int64_t max_seq = 0;
  int64_t prefill_chunk = 256;
  // run
  std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  bool prompt_ids_given = false;
  std::optional<std::string> prompt_text;  // --prompt: encoded with the model's tokenizer
  bool chat = false;
  bool ignore_eos = false;
  // tokenize
  std::optional<std::string> text;
  std::optional<std::vector<int32_t>> decode;
  int64_t max_new_tokens = 32;
  int64_t batch = 1;
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  int32_t seed = 0;
  // graph
  std::string dot;
  // bench
  int64_t steps = 64;
  std::vector<int64_t> positions = {100, 1000};
  bool profile = false;
  std::vector<int64_t> ttft_lengths = {128, 512, 2048};
};

constexpr char kOverview[] =
    R"(usage: stepgraph [run|graph|bench|tokenize] [options]

Runs a Llama model's decode step as a graph of kernels, captured once as a CUDA graph
and replayed. With no --model a small built-in model (random weights) is used, so every
command runs anywhere; without a GPU the CPU reference runs instead (and says so).

commands:
  run      generate tokens from a prompt (the default command)
  graph    print the decode step's graph summary; write it as Graphviz DOT
  bench    decode speed: ms/token eager vs replayed, and vs the memory-bandwidth floor
  tokenize the ids of a text with the model's tokenizer, or the text of ids

'stepgraph <command> --help' lists the command's options.
)";

constexpr char kModelOptions[] =
    R"(model options:
  --model PATH           a Hugging Face Llama folder (config.json + *.safetensors) or a
                         GGUF file (float or quantized weights)
  --model-preset NAME    random weights in a known shape: tiny (default), llama-3.2-1b
  --weight-seed S        seed of the random weights (default 0)
  --cpu                  run on the CPU reference even where a GPU is available
  --eager                GPU: launch every node each step instead of replaying a graph
                         (also STEPGRAPH_EAGER=1)
  --matmul POLICY        GPU matmul path: auto (default), cublaslt, gemv (also
                         STEPGRAPH_MATMUL)
  --no-pdl               GPU: launch kernels without programmatic dependent launch (also
                         STEPGRAPH_PDL=0)
  --kernel-cache DIR     GPU: folder of the kernels compiled for the plan (NVRTC), or none
                         for memory only (default $XDG_CACHE_HOME/stepgraph/kernels, else
                         ~/.cache/stepgraph/kernels)
  --compiled-norm        GPU: RmsNorm through a kernel compiled for the model's hidden size
  --passes LIST          graph passes: default (every pass but norm_into_matmul, the
                         fastest measured), all, none, names to run, or -name,... to
                         skip from all (see stepgraph/graph/passes.h)
  --no-fuse              the same as --passes none: run the plain graph
  --max-seq N            KV cache length per sequence (default: what the command needs)
  --verbose              also list the config.json fields accepted as metadata
  -h, --help             this help
)";

constexpr char kRunHelp[] =
    R"(usage: stepgraph run [options]

Feeds the prompt, generates tokens, prints them (text as it is generated for --prompt,
ids for --prompt-ids) and the decode speed in ms/token and tokens/s (on a GPU of the
replayed step, or with --eager of launches per node). With --prompt, generation stops
at the model's end-of-sequence (or, with --chat, end-of-turn) token.

run options:
  --prompt TEXT          the prompt as text (needs a model with a tokenizer)
  --chat                 wrap --prompt as one user turn in the model's chat template
  --ignore-eos           generate --max-new-tokens tokens even past end-of-sequence
  --prompt-ids 1,2,3     prompt token ids (default 1,2,3,4,5,6,7,8)
  --max-new-tokens N     tokens to generate per sequence (default 32)
  --batch B              decode B copies of the prompt together (default 1)
  --temperature T        sample at temperature T (default 0: greedy)
  --top-k K              sample among the K most likely ids only (default 0: all)
  --top-p P              sample from the smallest set of mass >= P (default 1)
  --seed S               sampling seed of sequence 0; sequence i uses S + i (default 0)
  --prefill-chunk N      prompt tokens per prefill step (default 256; 0: one token per
                         decode step)

Also reports prefill tokens/s and the time to first token (prefill of every prompt plus
the first decode step).
)";

constexpr char kGraphHelp[] =
    R"(usage: stepgraph graph [options]

Prints the decode step's graph: nodes, launches, arena bytes against the sum of the
intermediates, weight and KV cache bytes. Needs no weights (only config.json).

graph options:
  --batch B              rows (sequences) of the step (default 1)
  --dot FILE             write the graph as Graphviz DOT to FILE
)";

constexpr char kTokenizeHelp[] =
    R"(usage: stepgraph tokenize --model PATH [--text TEXT | --decode 1,2,3]

Prints the ids of the text on standard input (or of --text) as one line of comma-separated
ids, with the tokenizer of the model (a folder's tokenizer.json or a GGUF file's
metadata), special tokens added as the model adds them; --decode prints the text of ids.

tokenize options:
  --text TEXT            the text to encode instead of standard input
  --decode 1,2,3         print the text of these ids
)";

constexpr char kBenchHelp[] =
    R"(usage: stepgraph bench [options]

Decode speed at given context positions: ms/token eager and replayed (GPU), medians of
CUDA-event times per step, and the ratio to a floor of reading every weight once at the
device-to-device copy bandwidth measured in the same run.

bench options:
  --steps N              timed steps per measurement (default 64)
  --positions P1,P2,...  context positions to measure at (default 100,1000)
  --batch B              sequences per step (default 1)
  --profile              also time every node of an eager step (device time per node)
  --prefill-chunk N      prompt tokens per prefill step (default 256)
  --ttft-lengths L1,...  prompt lengths whose time to first token is measured (default
                         128,512,2048; each must fit --max-seq when given)
)";

void PrintHelp(std::optional<Command> command) {
  if (!command.has_value()) {
    std::fputs(kOverview, stdout);
    std::fputs("\n", stdout);
    std::fputs(kModelOptions, stdout);
    return;
  }
  switch (*command) {
    case kRun:
      std::fputs(kRunHelp, stdout);
      break;
    case kGraph:
      std::fputs(kGraphHelp, stdout);
      break;
    case kBench:
      std::fputs(kBenchHelp, stdout);
      break;
    case kTokenize:
      std::fputs(kTokenizeHelp, stdout);
      break;
  }
  std::fputs("\n", stdout);
  std::fputs(kModelOptions, stdout);
}

absl::StatusOr<int64_t> ParseInt(absl::string_view flag, absl::string_view text, int64_t min,
                                 int64_t max = INT64_MAX) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(text, &v) || v < min || v > max) {
    return absl::InvalidArgumentError(
        max == INT64_MAX
            ? absl::StrCat(flag, ": expected an integer >= ", min, ", got '", text, "'")
            : absl::StrCat(flag, ": expected an integer in [", min, ", ", max, "], got '", text,
                           "'"));
  }
  return v;
}

absl::StatusOr<float> ParseFloat(absl::string_view flag, absl::string_view text, float lo,
                                 float hi, bool lo_open) {
  float v = 0;
  const bool ok = absl::SimpleAtof(text, &v) && std::isfinite(v) &&
                  (lo_open ? v > lo : v >= lo) && v <= hi;
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": expected a number in ",
                                                   lo_open ? "(" : "[", lo, ", ", hi,
                                                   "], got '", text, "'"));
  }
  return v;
}

absl::StatusOr<std::vector<int64_t>> ParseList(absl::string_view flag, absl::string_view text,
                                               int64_t min, int64_t max) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    SG_ASSIGN_OR_RETURN(int64_t v, ParseInt(flag, part, min, max));
    out.push_back(v);
  }
  return out;
}

struct FlagSpec {
  const char* name;
  bool takes_value;
  unsigned commands;
};

constexpr FlagSpec kFlags[] = {
    {"--model", true, kAll},          {"--model-preset", true, kAll},
    {"--weight-seed", true, kAll},    {"--cpu", false, kAll},
    {"--eager", false, kAll},         {"--max-seq", true, kAll},
    {"--help", false, kAll},          {"-h", false, kAll},
    {"--verbose", false, kAll},
    {"--prompt-ids", true, kRun},     {"--max-new-tokens", true, kRun},
    {"--batch", true, kAll},          {"--temperature", true, kRun},
    {"--top-k", true, kRun},          {"--top-p", true, kRun},
    {"--seed", true, kRun},           {"--dot", true, kGraph},
    {"--steps", true, kBench},        {"--positions", true, kBench},
    {"--profile", false, kBench},     {"--matmul", true, kAll},
    {"--no-pdl", false, kAll},        {"--kernel-cache", true, kAll},
    {"--compiled-norm", false, kAll},
    {"--prompt", true, kRun},         {"--chat", false, kRun},
    {"--ignore-eos", false, kRun},    {"--text", true, kTokenize},
    {"--decode", true, kTokenize},
    {"--prefill-chunk", true, kRun | kBench},  {"--ttft-lengths", true, kBench},
    {"--passes", true, kAll},         {"--no-fuse", false, kAll},
};

absl::Status ApplyFlag(absl::string_view name, absl::string_view value, Args& a) {
  if (name == "--model") {
    std::error_code ec;
    if (!std::filesystem::exists(std::string(value), ec)) {
      return absl::InvalidArgumentError(absl::StrCat("--model: '", value, "' does not exist"));
    }
    a.model = std::string(value);
  } else if (name == "--model-preset") {
    if (value != "tiny" && value != "llama-3.2-1b") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--model-preset: unknown preset '", value, "' (known: tiny, llama-3.2-1b)"));
    }
    a.preset = std::string(value);
  } else if (name == "--weight-seed") {
    SG_ASSIGN_OR_RETURN(int64_t v, ParseInt(name, value, 0));
    a.weight_seed = static_cast<uint64_t>(v);
  } else if (name == "--cpu") {
    a.cpu = true;
  } else if (name == "--verbose") {
    a.verbose = true;
  } else if (name == "--eager") {
    a.eager = true;
  } else if (name == "--matmul") {
    absl::StatusOr<MatmulPolicy> p = ParseMatmulPolicy(value);
    if (!p.ok()) return absl::InvalidArgumentError(absl::StrCat("--matmul: ", p.status().message()));
    a.cuda.matmul = *p;
  } else if (name == "--no-pdl") {
    a.cuda.programmatic_launch = false;
  } else if (name == "--kernel-cache") {
    if (value.empty()) return absl::InvalidArgumentError("--kernel-cache: give a folder, or none");
    a.cuda.kernel_cache_folder = value == "none" ? std::string() : std::string(value);
  } else if (name == "--compiled-norm") {
    a.cuda.compiled_norm = true;
  } else if (name == "--passes") {
    absl::StatusOr<PassOptions> p = ParsePassList(value);
    if (!p.ok()) return absl::InvalidArgumentError(absl::StrCat("--passes: ", p.status().message()));
    a.passes = *std::move(p);
  } else if (name == "--no-fuse") {
    a.passes.enabled = false;
  } else if (name == "--max-seq") {
    SG_ASSIGN_OR_RETURN(a.max_seq, ParseInt(name, value, 1, INT32_MAX));
  } else if (name == "--help" || name == "-h") {
    a.help = true;
  } else if (name == "--prompt-ids") {
    SG_ASSIGN_OR_RETURN(std::vector<int64_t> ids, ParseList(name, value, 0, INT32_MAX));
    a.prompt.assign(ids.begin(), ids.end());
    a.prompt_ids_given = true;
  } else if (name == "--prompt") {
    if (value.empty()) return absl::InvalidArgumentError("--prompt: expected a text");
    a.prompt_text = std::string(value);
  } else if (name == "--chat") {
    a.chat = true;
  } else if (name == "--ignore-eos") {
    a.ignore_eos = true;
  } else if (name == "--text") {
    a.text = std::string(value);
  } else if (name == "--decode") {
    SG_ASSIGN_OR_RETURN(std::vector<int64_t> ids, ParseList(name, value, 0, INT32_MAX));
    a.decode = std::vector<int32_t>(ids.begin(), ids.end());
  } else if (name == "--max-new-tokens") {
    SG_ASSIGN_OR_RETURN(a.max_new_tokens, ParseInt(name, value, 0, INT32_MAX));
  } else if (name == "--batch") {
    SG_ASSIGN_OR_RETURN(a.batch, ParseInt(name, value, 1, 1024));
  } else if (name == "--temperature") {
    SG_ASSIGN_OR_RETURN(a.temperature, ParseFloat(name, value, 0.0f, 100.0f, false));
  } else if (name == "--top-k") {
    SG_ASSIGN_OR_RETURN(int64_t k, ParseInt(name, value, 0, INT32_MAX));
    a.top_k = static_cast<int32_t>(k);
  } else if (name == "--top-p") {
    SG_ASSIGN_OR_RETURN(a.top_p, ParseFloat(name, value, 0.0f, 1.0f, true));
  } else if (name == "--seed") {
    SG_ASSIGN_OR_RETURN(int64_t s, ParseInt(name, value, INT32_MIN, INT32_MAX));
    a.seed = static_cast<int32_t>(s);
  } else if (name == "--dot") {
    if (value.empty()) return absl::InvalidArgumentError("--dot: expected a file name");
    a.dot = std::string(value);
  } else if (name == "--steps") {
    SG_ASSIGN_OR_RETURN(a.steps, ParseInt(name, value, 1, 1 << 20));
  } else if (name == "--positions") {
    SG_ASSIGN_OR_RETURN(a.positions, ParseList(name, value, 0, INT32_MAX));
  } else if (name == "--profile") {
    a.profile = true;
  } else if (name == "--prefill-chunk") {
    SG_ASSIGN_OR_RETURN(a.prefill_chunk, ParseInt(name, value, 0, 16384));
  } else if (name == "--ttft-lengths") {
    SG_ASSIGN_OR_RETURN(a.ttft_lengths, ParseList(name, value, 1, INT32_MAX));
  }
  return absl::OkStatus();
}

// Hand-parsed: "--flag value" and "--flag=value"; the first word may name the command.
// `named` is set to the command when the first word names one (for the hint of an error).
// The environment variables stepgraph knows, mapped onto the options here and nowhere
// else (the library reads no environment). Flags given later override them.
absl::Status ApplyEnvironment(Args& a) {
  auto get = [](const char* name) -> absl::string_view {
    const char* v = std::getenv(name);
    return v == nullptr ? absl::string_view() : absl::string_view(v);
  };
  if (absl::string_view v = get("STEPGRAPH_EAGER"); !v.empty() && v != "0") a.eager = true;
  // Kernels compiled for the plan are kept where the user's caches are.
  if (absl::string_view xdg = get("XDG_CACHE_HOME"); !xdg.empty()) {
    a.cuda.kernel_cache_folder = absl::StrCat(xdg, "/stepgraph/kernels");
  } else if (absl::string_view home = get("HOME"); !home.empty()) {
    a.cuda.kernel_cache_folder = absl::StrCat(home, "/.cache/stepgraph/kernels");
  }
  if (absl::string_view v = get("STEPGRAPH_PDL"); v == "0") a.cuda.programmatic_launch = false;
  if (absl::string_view v = get("STEPGRAPH_MATMUL"); !v.empty()) {
    absl::StatusOr<MatmulPolicy> p = ParseMatmulPolicy(v);
    if (!p.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("environment variable STEPGRAPH_MATMUL: ", p.status().message()));
    }
    a.cuda.matmul = *p;
  }
  return absl::OkStatus();
}

absl::StatusOr<Args> ParseArgs(int argc, char** argv, std::optional<Command>& named) {
  Args a;
  SG_RETURN_IF_ERROR(ApplyEnvironment(a));
  int i = 1;
  if (i < argc && argv[i][0] != '-') {
    const absl::string_view word = argv[i];
    if (word == "run") {
      a.command = kRun;
    } else if (word == "graph") {
      a.command = kGraph;
    } else if (word == "bench") {
      a.command = kBench;
    } else if (word == "tokenize") {
      a.command = kTokenize;
    } else if (word == "help") {
      a.help = true;
      return a;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown command '", word, "' (commands: run, graph, bench, tokenize)"));
    }
    ++i;
  }
  if (i > 1) named = a.command;
  for (; i < argc; ++i) {
    absl::string_view arg = argv[i];
    std::optional<absl::string_view> inline_value;
    if (const size_t eq = arg.find('='); absl::StartsWith(arg, "--") && eq != arg.npos) {
      inline_value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    const FlagSpec* spec = nullptr;
    for (const FlagSpec& f : kFlags) {
      if (arg == f.name) spec = &f;
    }
    if (spec == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          arg[0] == '-' ? "unknown flag '" : "unexpected argument '", arg, "'"));
    }
    if ((spec->commands & a.command) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(arg, " is not an option of '",
                                                     CommandName(a.command), "'"));
    }
    absl::string_view value;
    if (spec->takes_value) {
      if (inline_value.has_value()) {
        value = *inline_value;
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat(arg, ": missing value"));
      }
    } else if (inline_value.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(arg, " takes no value"));
    }
    SG_RETURN_IF_ERROR(ApplyFlag(arg, value, a));
  }
  if (!a.model.empty() && a.preset != "tiny") {
    return absl::InvalidArgumentError("--model and --model-preset cannot be used together");
  }
  if (a.prompt_text.has_value() && a.prompt_ids_given) {
    return absl::InvalidArgumentError("--prompt and --prompt-ids cannot be used together");
  }
  if (a.chat && !a.prompt_text.has_value()) {
    return absl::InvalidArgumentError("--chat wraps a text prompt: give --prompt");
  }
  if (a.text.has_value() && a.decode.has_value()) {
    return absl::InvalidArgumentError("--text and --decode cannot be used together");
  }
  return a;
}

int UsageFailure(absl::string_view message, std::optional<Command> command) {
  std::fprintf(stderr, "stepgraph: error: %s\n", std::string(message).c_str());
  std::fprintf(stderr, "hint: run 'stepgraph%s --help' for usage\n",
               command.has_value() ? absl::StrCat(" ", CommandName(*command)).c_str() : "");
  return kExitUsage;
}

int RuntimeFailure(const absl::Status& status) {
  std::fprintf(stderr, "stepgraph: error: %s\n", std::string(status.message()).c_str());
  std::fprintf(stderr, "hint: see 'stepgraph --help'; a model folder needs config.json and "
                       "its *.safetensors\n");
  return kExitRuntime;
}

// The model's config without loading any weight.
absl::StatusOr<LlamaConfig> ModelConfig(const Args& a) {
  if (!a.model.empty()) {
    absl::StatusOr<LlamaConfig> c = ModelFiles::ReadConfig(a.model);
    if (c.ok() && a.verbose && !c->metadata_keys.empty()) {
      std::fprintf(stderr, "stepgraph: config.json fields accepted as metadata (unused): %s\n",
                   absl::StrJoin(c->metadata_keys, ", ").c_str());
    }
    return c;
  }
  return a.preset == "llama-3.2-1b" ? Llama32_1BConfig() : TinyLlamaConfig();
}

std::string ModelName(const Args& a) {
  if (!a.model.empty()) return a.model;
  return absl::StrCat(a.preset, " (random weights, seed ", a.weight_seed, ")");
}

std::string Bytes(int64_t b) {
  const double v = static_cast<double>(b);
  if (v >= 1 << 30) return absl::StrFormat("%.2f GiB", v / (1 << 30));
  if (v >= 1 << 20) return absl::StrFormat("%.1f MiB", v / (1 << 20));
  if (v >= 1 << 10) return absl::StrFormat("%.1f KiB", v / (1 << 10));
  return absl::StrCat(b, " B");
}

using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Progress on stderr for runs long enough to need it: updated in place on a terminal,
// a line every few seconds otherwise.
class Progress {
 public:
  Progress(std::string what, int64_t total)
      : what_(std::move(what)), total_(total), tty_(isatty(STDERR_FILENO) != 0) {}
  void Update(int64_t done) {
    const double ms = MsSince(start_);
    if (ms < 1000 || MsSince(last_) < (tty_ ? 100 : 5000)) return;
    last_ = Clock::now();
    shown_ = true;
    std::fprintf(stderr, tty_ ? "\r%s %lld/%lld" : "%s %lld/%lld\n", what_.c_str(),
                 static_cast<long long>(done), static_cast<long long>(total_));
    std::fflush(stderr);
  }
  void Done() {
    if (shown_ && tty_) std::fputs("\n", stderr);
  }

 private:
  std::string what_;
  int64_t total_;
  bool tty_;
  bool shown_ = false;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_ = start_;
};

absl::StatusOr<std::unique_ptr<DecodeSession>> MakeSession(const Args& a, int64_t slots,
                                                           int64_t max_seq,
                                                           std::optional<ops::Sample> sampling,
                                                           bool eager) {
  SessionOptions o;
  o.model_path = a.model;
  if (a.model.empty()) {
    o.config = a.preset == "llama-3.2-1b" ? Llama32_1BConfig() : TinyLlamaConfig();
  }
  o.weight_seed = a.weight_seed;
  o.backend = a.cpu ? Backend::kCpu : Backend::kAuto;
  o.max_slots = slots;
  o.max_seq = max_seq;
  o.sampling = sampling;
  o.eager = eager;
  o.cuda = a.cuda;
  o.prefill_chunk = a.prefill_chunk;
  o.passes = a.passes;
  if (!a.cpu && !CudaDeviceFound()) {
    std::fprintf(stderr, "stepgraph: %s; running on the CPU reference (slow)\n",
                 BuiltWithCuda() ? "no CUDA device found" : "built without CUDA");
  }
  SG_ASSIGN_OR_RETURN(std::unique_ptr<DecodeSession> session, DecodeSession::Create(o));
  std::fprintf(stderr, "stepgraph: %s on %s\n", ModelName(a).c_str(),
               session->Describe().c_str());
  return session;
}

absl::Status PrefillAll(DecodeSession& s, const std::vector<int32_t>& prompt, int64_t batch,
                        int32_t seed) {
  std::vector<PrefillRequest> requests;
  for (int64_t b = 0; b < batch; ++b) {
    // Sequence b's seed is seed + b, wrapping around (every i32 is a valid seed).
    const int32_t seed_b =
        static_cast<int32_t>(static_cast<uint32_t>(seed) + static_cast<uint32_t>(b));
    requests.push_back({b, prompt, seed_b});
  }
  return s.Prefill(requests);
}

// The model's tokenizer for --prompt and tokenize; a clear error when there is none.
absl::StatusOr<std::unique_ptr<Tokenizer>> ModelTokenizer(const Args& a, absl::string_view flag) {
  if (a.model.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        flag, " needs a model with a tokenizer (--model FOLDER or FILE.gguf); the built-in ",
        "model has none: give --prompt-ids instead"));
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadModelTokenizer(a.model);
  if (!tok.ok()) {
    return absl::Status(tok.status().code(),
                        absl::StrCat(flag, ": ", tok.status().message()));
  }
  return tok;
}

// What --prompt becomes: its ids and, for --chat, the end-of-turn id to stop at.
struct TextPrompt {
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<int32_t> ids;
  int32_t end_of_turn = -1;
};

absl::StatusOr<TextPrompt> EncodePrompt(const Args& a) {
  TextPrompt p;
  SG_ASSIGN_OR_RETURN(p.tokenizer, ModelTokenizer(a, "--prompt"));
  if (a.chat) {
    SG_ASSIGN_OR_RETURN(ChatTemplate chat, ChatTemplate::ForTokenizer(*p.tokenizer));
    // The rendered turn carries its own special tokens.
    SG_ASSIGN_OR_RETURN(p.ids, p.tokenizer->Encode(chat.RenderUserTurn(*a.prompt_text),
                                                   {.add_special = false}));
    if (!chat.end_of_turn().empty()) p.end_of_turn = p.tokenizer->TokenId(chat.end_of_turn());
  } else {
    SG_ASSIGN_OR_RETURN(p.ids, p.tokenizer->Encode(*a.prompt_text));
  }
  if (p.ids.empty()) return absl::InvalidArgumentError("--prompt: the text encodes to no ids");
  return p;
}

int Run(const Args& a) {
  absl::StatusOr<LlamaConfig> config = ModelConfig(a);
  if (!config.ok()) return RuntimeFailure(config.status());
  std::vector<int32_t> prompt = a.prompt;
  std::optional<TextPrompt> text;
  if (a.prompt_text.has_value()) {
    absl::StatusOr<TextPrompt> encoded = EncodePrompt(a);
    if (!encoded.ok()) return RuntimeFailure(encoded.status());
    text = *std::move(encoded);
    prompt = text->ids;
  }
  for (int32_t id : prompt) {
    if (id >= config->vocab_size) {
      return UsageFailure(absl::StrCat(text ? "--prompt: the tokenizer gave id " : "--prompt-ids: id ",
                                       id, " is outside the model's vocabulary [0, ",
                                       config->vocab_size, ")"),
                          kRun);
    }
  }
  const int64_t need = static_cast<int64_t>(prompt.size()) + a.max_new_tokens;
  if (a.max_seq == 0 && need > config->max_position_embeddings) {
    return UsageFailure(absl::StrCat("the prompt (", prompt.size(), " ids) plus --max-new-tokens (",
                                     a.max_new_tokens, ") exceed the model's ",
                                     "max_position_embeddings (", config->max_position_embeddings,
                                     ")"),
                        kRun);
  }
  std::optional<ops::Sample> sampling;
  if (a.temperature > 0.0f) sampling = ops::Sample{a.temperature, a.top_k, a.top_p};

  absl::StatusOr<std::unique_ptr<DecodeSession>> made =
      MakeSession(a, a.batch, a.max_seq > 0 ? a.max_seq : need, sampling, a.eager);
  if (!made.ok()) return RuntimeFailure(made.status());
  DecodeSession& s = **made;

  // Text generation ends at the model's end of sequence (and the chat's end of turn).
  std::vector<int32_t> stop;
  if (text.has_value() && !a.ignore_eos) {
    stop = s.stop_ids();
    if (text->end_of_turn >= 0) stop.push_back(text->end_of_turn);
  }
  auto is_stop = [&](int32_t id) { return std::find(stop.begin(), stop.end(), id) != stop.end(); };

  // Time to first token: every prompt's prefill steps, then the first decode step (which
  // feeds each prompt's last token and yields the first new id).
  const Clock::time_point start = Clock::now();
  if (absl::Status st = PrefillAll(s, prompt, a.batch, a.seed); !st.ok()) {
    return RuntimeFailure(st);
  }
  absl::StatusOr<std::vector<int32_t>> ready = s.Tokens(0);  // waits for the prefill
  if (!ready.ok()) return RuntimeFailure(ready.status());
  const double prefill_ms = MsSince(start);

  // Generation in chunks: the session waits for the device once per chunk, and the text
  // of sequence 0 is printed as its chunk arrives.
  std::vector<std::vector<int32_t>> ids(static_cast<size_t>(a.batch));
  std::vector<bool> ended(static_cast<size_t>(a.batch), false);
  std::optional<TokenStreamDecoder> stream;
  if (text.has_value() && a.batch == 1) stream.emplace(*text->tokenizer, DecodeOptions{.skip_special = true});
  const int64_t chunk = s.backend() == Backend::kCpu ? 1 : (stream.has_value() ? 8 : 64);
  Progress progress("generated", a.max_new_tokens);
  int64_t steps = 0;
  double ttft_ms = 0;
  Clock::time_point t0 = Clock::now();
  while (steps < a.max_new_tokens) {
    // The first step alone, for the time to first token; then chunks.
    const int64_t k = steps == 0 ? 1 : std::min(chunk, a.max_new_tokens - steps);
    absl::StatusOr<std::vector<std::vector<int32_t>>> got = s.Generate(k);
    if (!got.ok()) return RuntimeFailure(got.status());
    if (steps == 0) {
      ttft_ms = MsSince(start);
      t0 = Clock::now();
    }
    steps += k;
    for (int64_t b = 0; b < a.batch; ++b) {
      for (int32_t id : (*got)[b]) {
        if (ended[b]) break;
        if (is_stop(id)) {
          ended[b] = true;
          break;
        }
        ids[b].push_back(id);
        if (b == 0 && stream.has_value()) {
          absl::StatusOr<std::string> piece = stream->Push(id);
          if (!piece.ok()) return RuntimeFailure(piece.status());
          std::fputs(piece->c_str(), stdout);
          std::fflush(stdout);
        }
      }
    }
    if (!stream.has_value()) progress.Update(steps);
    if (!stop.empty() && std::all_of(ended.begin(), ended.end(), [](bool e) { return e; })) break;
  }
  if (!stream.has_value()) progress.Done();
  const double gen_ms = MsSince(t0);

  if (stream.has_value()) {
    std::printf("%s\n", stream->Finish().c_str());
    std::fflush(stdout);
  } else {
    for (int64_t b = 0; b < a.batch; ++b) {
      std::string shown = absl::StrJoin(ids[b], ",");
      if (text.has_value()) {
        absl::StatusOr<std::string> decoded = text->tokenizer->Decode(ids[b], {.skip_special = true});
        if (!decoded.ok()) return RuntimeFailure(decoded.status());
        shown = *decoded;
      }
      if (a.batch == 1) {
        std::printf("generated: %s\n", shown.c_str());
      } else {
        std::printf("sequence %lld: %s\n", static_cast<long long>(b), shown.c_str());
      }
    }
  }
  const int64_t n = std::max<int64_t>(steps - 1, 0);  // steps after the first
  const double ms_per_step = n > 0 ? gen_ms / static_cast<double>(n) : 0;
  const double tokens_per_s = gen_ms > 0 ? 1e3 * static_cast<double>(n * a.batch) / gen_ms : 0;
  // Tokens the prefill steps fed: all but each prompt's last.
  const double prefill_tokens =
      static_cast<double>(prompt.size() - 1) * static_cast<double>(a.batch);
  const std::string prefill = absl::StrFormat(
      "prefill %zu tokens x %lld in %.1f ms (%.0f tokens/s, %lld steps); time to first "
      "token %.1f ms",
      prompt.size(), static_cast<long long>(a.batch), prefill_ms,
      prefill_ms > 0 ? 1e3 * prefill_tokens / prefill_ms : 0.0,
      static_cast<long long>(s.prefill_steps()), ttft_ms);
  // The timing goes to stderr when text is printed, so that stdout holds only the text.
  FILE* timing_out = text.has_value() ? stderr : stdout;
  if (s.backend() == Backend::kCpu) {
    std::fprintf(timing_out, "timing: %.3f ms/token on the CPU reference (%.1f tokens/s); %s\n",
                 ms_per_step, tokens_per_s, prefill.c_str());
    return kExitOk;
  }
  std::fprintf(timing_out, "timing: %s %.3f ms/token (%.1f tokens/s); %s\n",
               s.eager() ? "eager" : "replayed", ms_per_step, tokens_per_s, prefill.c_str());
  return kExitOk;
}

// Reads all of standard input (the text to tokenize).
absl::StatusOr<std::string> ReadStdin() {
  std::string text;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), stdin)) > 0) {
    if (text.size() + n > (size_t{64} << 20)) {
      return absl::InvalidArgumentError("tokenize: standard input holds more than 64 MiB");
    }
    text.append(buf, n);
  }
  if (std::ferror(stdin)) return absl::DataLossError("tokenize: cannot read standard input");
  return text;
}

int TokenizeCommand(const Args& a) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = ModelTokenizer(a, "tokenize");
  if (!tok.ok()) return RuntimeFailure(tok.status());
  if (a.decode.has_value()) {
    for (int32_t id : *a.decode) {
      if (id >= (*tok)->vocab_size()) {
        return UsageFailure(absl::StrCat("--decode: id ", id, " is outside the vocabulary [0, ",
                                         (*tok)->vocab_size(), ")"),
                            kTokenize);
      }
    }
    absl::StatusOr<std::string> decoded = (*tok)->Decode(*a.decode);
    if (!decoded.ok()) return RuntimeFailure(decoded.status());
    std::printf("%s\n", decoded->c_str());
    return kExitOk;
  }
  absl::StatusOr<std::string> input = a.text.has_value() ? absl::StatusOr<std::string>(*a.text) : ReadStdin();
  if (!input.ok()) return RuntimeFailure(input.status());
  absl::StatusOr<std::vector<int32_t>> ids = (*tok)->Encode(*input);
  if (!ids.ok()) return RuntimeFailure(ids.status());
  std::printf("%s\n", absl::StrJoin(*ids, ",").c_str());
  return kExitOk;
}

int GraphCommand(const Args& a) {
  absl::StatusOr<LlamaConfig> config = ModelConfig(a);
  if (!config.ok()) return RuntimeFailure(config.status());
  LlamaGraphOptions g;
  g.batch = a.batch;
  g.max_seq = a.max_seq > 0 ? a.max_seq : std::min<int64_t>(config->max_position_embeddings, 4096);
  g.closed_loop = true;
  absl::StatusOr<Graph> graph = BuildLlamaDecodeGraph(*config, g);
  if (graph.ok()) graph = RunPasses(*std::move(graph), a.passes);
  if (!graph.ok()) return RuntimeFailure(graph.status());
  absl::StatusOr<ExecutionPlan> plan = ExecutionPlan::Create(*graph);
  if (!plan.ok()) return RuntimeFailure(plan.status());

  std::map<std::string, int> ops;
  for (const Node& node : graph->nodes()) ++ops[std::string(OpName(node.op))];
  std::vector<std::string> op_counts;
  for (const auto& [op, count] : ops) op_counts.push_back(absl::StrCat(op, " x", count));
  int64_t kv_bytes = 0;
  for (const Tensor& t : graph->tensors()) {
    if (t.kind == TensorKind::kState && !CheckedAdd(kv_bytes, t.bytes(), &kv_bytes)) {
      return RuntimeFailure(absl::InvalidArgumentError("the KV cache's size overflows 64 bits"));
    }
  }
  const LlamaConfig& c = *config;
  const absl::StatusOr<int64_t> weight_bytes = c.WeightBytes();
  if (!weight_bytes.ok()) return RuntimeFailure(weight_bytes.status());
  std::printf("model: %s: hidden %lld, %lld layers, %lld heads (%lld KV), head_dim %lld, vocab %lld, %s\n",
              ModelName(a).c_str(), static_cast<long long>(c.hidden_size),
              static_cast<long long>(c.num_hidden_layers),
              static_cast<long long>(c.num_attention_heads),
              static_cast<long long>(c.num_key_value_heads), static_cast<long long>(c.head_dim),
              static_cast<long long>(c.vocab_size), std::string(DTypeName(c.dtype)).c_str());
  std::printf("graph: batch %lld, %d nodes, %d tensors; %d launches per eager step, 1 graph "
              "launch per replayed step\n",
              static_cast<long long>(a.batch), graph->num_nodes(), graph->num_tensors(),
              graph->num_nodes());
  std::printf("ops: %s\n", absl::StrJoin(op_counts, ", ").c_str());
  const MemoryPlan& m = plan->memory();
  std::printf("arena: %s for %s of intermediates (%.1fx reuse)\n", Bytes(m.arena_bytes).c_str(),
              Bytes(m.intermediate_bytes).c_str(),
              m.arena_bytes > 0 ? static_cast<double>(m.intermediate_bytes) / m.arena_bytes : 0.0);
  std::printf("weights: %s; KV cache: %s (%lld positions x %lld sequence(s))\n",
              Bytes(*weight_bytes).c_str(), Bytes(kv_bytes).c_str(),
              static_cast<long long>(g.max_seq), static_cast<long long>(a.batch));
  if (!a.dot.empty()) {
    std::ofstream out(a.dot);
    out << graph->ToDot();
    out.close();
    if (!out) {
      return RuntimeFailure(absl::UnavailableError(absl::StrCat("cannot write ", a.dot)));
    }
    std::printf("dot: wrote %s\n", a.dot.c_str());
  }
  return kExitOk;
}

// A prompt of `n` ids, the same on every run.
std::vector<int32_t> BenchPrompt(int64_t n, int64_t vocab, int64_t sequence) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  uint64_t x = 0x2545F4914F6CDD1Dull + static_cast<uint64_t>(sequence);
  for (int32_t& id : p) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab));
  }
  return p;
}

void PrintProfile(const std::vector<std::vector<NodeTime>>& runs, double replayed_ms) {
  if (runs.empty()) return;
  const size_t nodes = runs[0].size();
  std::map<std::string, std::pair<int, double>> by_op;
  std::vector<std::pair<double, size_t>> by_node;
  double total = 0;
  for (size_t i = 0; i < nodes; ++i) {
    std::vector<double> t;
    for (const auto& r : runs) t.push_back(r[i].ms);
    const double ms = Median(t);
    total += ms;
    auto& op = by_op[runs[0][i].op];
    ++op.first;
    op.second += ms;
    by_node.push_back({ms, i});
  }
  std::printf("profile: one eager step, device time per node (median of %zu): %.3f ms in all",
              runs.size(), total);
  if (replayed_ms > 0) std::printf(" (the replayed step takes %.3f ms)", replayed_ms);
  std::printf("\n  %-12s %6s %10s %7s\n", "op", "nodes", "ms", "share");
  std::vector<std::pair<double, std::string>> ops;
  for (const auto& [op, v] : by_op) ops.push_back({v.second, op});
  std::sort(ops.rbegin(), ops.rend());
  for (const auto& [ms, op] : ops) {
    std::printf("  %-12s %6d %10.4f %6.1f%%\n", op.c_str(), by_op[op].first, ms,
                total > 0 ? 100 * ms / total : 0.0);
  }
  std::sort(by_node.rbegin(), by_node.rend());
  std::printf("  slowest nodes:\n");
  for (size_t k = 0; k < std::min<size_t>(10, by_node.size()); ++k) {
    const NodeTime& n = runs[0][by_node[k].second];
    std::printf("    %8.4f ms  %-10s %s\n", by_node[k].first, n.op.c_str(), n.name.c_str());
  }
}

// Time to first token for a prompt of each length on slot 0 (every other slot released):
// prefill steps, then the first decode step, host clock to the id (median of 5 after a
// warm-up), with prefill tokens/s and, given the matmul rate, TFLOP/s.
absl::Status MeasureTtft(const Args& a, DecodeSession& s, double matmul_tflops) {
  for (int64_t b = 1; b < s.max_slots(); ++b) SG_RETURN_IF_ERROR(s.Release(b));
  for (const int64_t len : a.ttft_lengths) {
    if (len + 1 > s.max_seq()) {
      std::printf("time to first token, %lld-token prompt: skipped (max_seq %lld)\n",
                  static_cast<long long>(len), static_cast<long long>(s.max_seq()));
      continue;
    }
    const std::vector<int32_t> prompt = BenchPrompt(len, s.config().vocab_size, 0);
    std::vector<double> prefill_ms, ttft_ms;
    for (int r = 0; r < 6; ++r) {
      SG_RETURN_IF_ERROR(s.runner().Sync());
      const Clock::time_point t0 = Clock::now();
      SG_RETURN_IF_ERROR(s.Prefill(0, prompt));
      SG_RETURN_IF_ERROR(s.Tokens(0).status());  // waits for the prefill steps
      const double p = MsSince(t0);
      SG_RETURN_IF_ERROR(s.Generate(0, 1).status());
      const double t = MsSince(t0);
      if (r == 0) continue;  // warm-up
      prefill_ms.push_back(p);
      ttft_ms.push_back(t);
    }
    const double p = Median(prefill_ms), t = Median(ttft_ms);
    std::string rate;
    if (matmul_tflops > 0) {
      const double tflops = PrefillFlops(s.config(), len - 1) / (p * 1e-3) * 1e-12;
      rate = absl::StrFormat(", %.1f TFLOP/s = %.3f of the bf16 matmul rate %.1f TFLOP/s",
                             tflops, tflops / matmul_tflops, matmul_tflops);
    }
    std::printf("time to first token, %lld-token prompt: %.3f ms (prefill %.3f ms, %.0f "
                "tokens/s, chunk %lld%s)\n",
                static_cast<long long>(len), t, p, 1e3 * static_cast<double>(len - 1) / p,
                static_cast<long long>(s.prefill_chunk()), rate.c_str());
  }
  std::fflush(stdout);
  return absl::OkStatus();
}

int Bench(const Args& a) {
  absl::StatusOr<LlamaConfig> config = ModelConfig(a);
  if (!config.ok()) return RuntimeFailure(config.status());
  const int64_t max_pos = *std::max_element(a.positions.begin(), a.positions.end());
  // Warm-up, eager, replayed and profiled steps all advance the position; the time to
  // first token needs its longest prompt and one step.
  int64_t need = max_pos + 1 + 4 + 2 * a.steps + 8;
  if (a.max_seq == 0) {
    for (int64_t len : a.ttft_lengths) {
      if (len + 1 <= config->max_position_embeddings) need = std::max(need, len + 1);
    }
  }
  const int64_t max_seq = a.max_seq > 0 ? a.max_seq : need;
  if (max_seq < need || need > config->max_position_embeddings) {
    return UsageFailure(absl::StrCat("positions up to ", max_pos, " with --steps ", a.steps,
                                     " need a KV cache of ", need, " positions; the ",
                                     max_seq < need ? "--max-seq given" : "model", " allows ",
                                     max_seq < need ? max_seq : config->max_position_embeddings),
                        kBench);
  }
  absl::StatusOr<std::unique_ptr<DecodeSession>> made =
      MakeSession(a, a.batch, max_seq, std::nullopt, a.eager);
  if (!made.ok()) return RuntimeFailure(made.status());
  std::unique_ptr<DecodeSession> session = *std::move(made);
  const bool gpu = session->backend() == Backend::kCuda;

  double copy_bw = 0;
  if (gpu) {
    absl::StatusOr<double> bw = CopyBandwidth(session->runner(), int64_t{1} << 29, 10);
    if (!bw.ok()) return RuntimeFailure(bw.status());
    copy_bw = *bw;
    std::printf("device-to-device copy: %.1f GB/s (read + write); weights %s: floor %.4f ms/step\n",
                copy_bw * 1e-9, Bytes(session->weight_bytes()).c_str(),
                1e3 * static_cast<double>(session->weight_bytes()) / copy_bw);
  }
  const double floor_ms = gpu ? 1e3 * static_cast<double>(session->weight_bytes()) / copy_bw : 0;

  // Median ms per step of `a.steps` steps at context position `pos` (every slot prefilled
  // with a prompt of pos + 1 ids).
  auto measure = [&](DecodeSession& s, int64_t pos) -> absl::StatusOr<double> {
    std::fprintf(stderr, "stepgraph: prefilling %lld x %lld tokens\n",
                 static_cast<long long>(a.batch), static_cast<long long>(pos + 1));
    for (int64_t b = 0; b < a.batch; ++b) {
      SG_RETURN_IF_ERROR(s.Prefill(b, BenchPrompt(pos + 1, s.config().vocab_size, b)));
    }
    SG_RETURN_IF_ERROR(s.Generate(4).status());
    SG_ASSIGN_OR_RETURN(std::vector<double> t, s.TimedSteps(a.steps));
    return Median(t);
  };

  std::vector<double> first(a.positions.size(), 0.0), eager(a.positions.size(), 0.0);
  for (size_t i = 0; i < a.positions.size(); ++i) {
    absl::StatusOr<double> ms = measure(*session, a.positions[i]);
    if (!ms.ok()) return RuntimeFailure(ms.status());
    first[i] = *ms;
    if (a.profile && i == 0) {
      std::vector<std::vector<NodeTime>> runs;
      for (int r = 0; r < 5 && session->position(0) + 1 < session->max_seq(); ++r) {
        absl::StatusOr<std::vector<NodeTime>> p = session->ProfileStep();
        if (!p.ok()) return RuntimeFailure(p.status());
        runs.push_back(*std::move(p));
      }
      PrintProfile(runs, session->eager() ? 0.0 : first[0]);
    }
  }
  double matmul_tflops = 0;
  if (gpu) {
    absl::StatusOr<double> rate = MeasureMatmulTflops({.device = DeviceKind::kCuda, .cuda = a.cuda});
    if (!rate.ok()) return RuntimeFailure(rate.status());
    matmul_tflops = *rate;
  }
  if (absl::Status st = MeasureTtft(a, *session, matmul_tflops); !st.ok()) {
    return RuntimeFailure(st);
  }
  const bool replayed = !session->eager();
  if (gpu && replayed) {
    // The same steps launched node by node, from a second session made eager (the first is
    // released first, so that both never hold the weights at once).
    session.reset();
    absl::StatusOr<std::unique_ptr<DecodeSession>> e =
        MakeSession(a, a.batch, max_seq, std::nullopt, /*eager=*/true);
    if (!e.ok()) return RuntimeFailure(e.status());
    for (size_t i = 0; i < a.positions.size(); ++i) {
      absl::StatusOr<double> ms = measure(**e, a.positions[i]);
      if (!ms.ok()) return RuntimeFailure(ms.status());
      eager[i] = *ms;
    }
  }
  const double tokens = static_cast<double>(a.batch);
  for (size_t i = 0; i < a.positions.size(); ++i) {
    const long long pos = static_cast<long long>(a.positions[i]);
    if (!gpu) {
      std::printf("position %lld: %.3f ms/token on the CPU reference (%.1f tokens/s)\n", pos,
                  first[i], 1e3 * tokens / first[i]);
    } else if (replayed) {
      std::printf("position %lld: replayed %.4f ms/step (%.1f tokens/s), eager %.4f ms/step "
                  "(%.2fx); floor/replayed %.3f\n",
                  pos, first[i], 1e3 * tokens / first[i], eager[i], eager[i] / first[i],
                  floor_ms / first[i]);
    } else {
      std::printf("position %lld: eager %.4f ms/step (%.1f tokens/s); floor/eager %.3f\n", pos,
                  first[i], 1e3 * tokens / first[i], floor_ms / first[i]);
    }
  }
  std::fflush(stdout);
  return kExitOk;
}

int Main(int argc, char** argv) {
  std::optional<Command> named;
  absl::StatusOr<Args> args = ParseArgs(argc, argv, named);
  if (!args.ok()) return UsageFailure(args.status().message(), named);
  if (args->help) {
    PrintHelp(named);
    return kExitOk;
  }
  switch (args->command) {
    case kRun:
      return Run(*args);
    case kGraph:
      return GraphCommand(*args);
    case kBench:
      return Bench(*args);
    case kTokenize:
      return TokenizeCommand(*args);
  }
  return kExitOk;
}

}  // namespace
}  // namespace sg

int main(int argc, char** argv) {
  // The library reports allocation failure as ResourceExhausted; this catches what the
  // program's own containers might throw, so that no run ends in an abort.
  try {
    return sg::Main(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "stepgraph: error: out of memory\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stepgraph: error: %s\n", e.what());
  }
  return 1;
}
