// The program's flag table, its parser, the help generated from the table and the
// environment variables it maps onto options; see options.h.
#include "tools/options.h"

#include <cmath>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "stepgraph/base/status.h"
#include "tools/stop_matcher.h"

namespace sg::cli {
namespace {

// ---- values -------------------------------------------------------------------------

absl::Status SetInt(absl::string_view text, int64_t min, int64_t max, int64_t& out) {
  SG_ASSIGN_OR_RETURN(out, ParseInt(text, min, max));
  return absl::OkStatus();
}

absl::Status SetInt32(absl::string_view text, int64_t min, int64_t max, int32_t& out) {
  SG_ASSIGN_OR_RETURN(const int64_t v, ParseInt(text, min, max));
  out = static_cast<int32_t>(v);
  return absl::OkStatus();
}

absl::Status SetIds(absl::string_view text, std::vector<int32_t>& out) {
  SG_ASSIGN_OR_RETURN(const std::vector<int64_t> ids, ParseIntList(text, 0, INT32_MAX));
  out.assign(ids.begin(), ids.end());
  return absl::OkStatus();
}

// A switch of the options' own: sets `Field`.
template <bool Options::*Field>
absl::Status SetSwitch(absl::string_view, Options& o) {
  o.*Field = true;
  return absl::OkStatus();
}

absl::Status NonEmpty(absl::string_view text, absl::string_view what) {
  if (!text.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("expected ", what));
}

// A number; its range is checked where it is used (CheckPenalties for the penalties).
absl::StatusOr<float> Number(absl::string_view text) {
  float v = 0;
  if (absl::SimpleAtof(text, &v)) return v;
  return absl::InvalidArgumentError(absl::StrCat("expected a number, got '", text, "'"));
}

// Each penalty flag with the part of Penalties it sets, so that CheckPenalties' message
// about that part is said of the flag.
struct PenaltyFlag {
  const char* name;
  void (*copy)(const Penalties& from, Penalties& to);
};
constexpr PenaltyFlag kPenaltyFlags[] = {
    {"--repeat-penalty", [](const Penalties& f, Penalties& t) { t.repetition = f.repetition; }},
    {"--presence-penalty", [](const Penalties& f, Penalties& t) { t.presence = f.presence; }},
    {"--frequency-penalty", [](const Penalties& f, Penalties& t) { t.frequency = f.frequency; }},
    {"--min-p", [](const Penalties& f, Penalties& t) { t.min_p = f.min_p; }},
    {"--logit-bias", [](const Penalties& f, Penalties& t) { t.logit_bias = f.logit_bias; }},
};

// CheckPenalties of what `flag` sets of `p`, the rest neutral; the message without its
// "penalties: " (the flag's name goes before it), nor the index of a logit bias (the
// message names its id).
absl::Status CheckPenaltyFlag(const PenaltyFlag& flag, const Penalties& p, int64_t vocab_size) {
  Penalties alone;
  flag.copy(p, alone);
  absl::Status st = CheckPenalties(alone, vocab_size);
  if (st.ok()) return st;
  absl::string_view message = st.message();
  absl::ConsumePrefix(&message, "penalties: ");
  if (absl::ConsumePrefix(&message, "logit bias ")) {
    while (!message.empty() && absl::ascii_isdigit(message[0])) message.remove_prefix(1);
    return absl::Status(st.code(), absl::StrCat("the logit bias", message));
  }
  return absl::Status(st.code(), message);
}

// What the parser checks of a penalty flag's value: everything but the logit biases'
// ids, which need the model's vocabulary.
absl::Status CheckPenaltyFlagValue(absl::string_view name, const Penalties& p) {
  for (const PenaltyFlag& f : kPenaltyFlags) {
    if (f.name == name) return CheckPenaltyFlag(f, p, INT64_MAX);
  }
  return absl::InternalError(absl::StrCat(name, " is not a penalty flag"));
}

// Sets a float of the penalties.
template <float Penalties::*Field>
absl::Status SetPenalty(absl::string_view name, absl::string_view text, Options& o) {
  SG_ASSIGN_OR_RETURN(o.penalties.*Field, Number(text));
  return CheckPenaltyFlagValue(name, o.penalties);
}

// ---- the commands -------------------------------------------------------------------

struct CommandSpec {
  Command command;
  const char* summary;  // one line of the overview
  const char* about;    // the usage line and what the command does
};

constexpr CommandSpec kCommands[] = {
    {kRun, "generate tokens from a prompt (the default command)",
     R"(usage: stepgraph run [options]

Feeds the prompt, generates tokens, prints them (text as it is generated for a text
prompt, ids for --prompt-ids) and a last line with the tokens made, ms/token and tokens/s
(on a GPU of the replayed step, or with --eager of launches per node). A text prompt comes
from --prompt, --file, or standard input (--prompt -, or a pipe or file there when no
prompt is given); generation stops at the model's end-of-sequence (or, with --chat,
end-of-turn) token. Also reports prefill tokens/s and the time to first token (prefill of
every prompt plus the first decode step).
)"},
    {kChat, "a conversation with the model through its chat template",
     R"(usage: stepgraph chat --model PATH [--system TEXT] [options]

A conversation through the model's chat template: each line read is a user turn (a line
ending in \ goes on on the next), and the answer is printed as it is made. The KV cache
keeps the conversation, so a turn prefills only its own tokens. Lines starting with / are
commands: /reset starts a new conversation, /stats prints the speed of the last answer,
/exit (or the end of the input) leaves. Ctrl-C stops the answer being written and keeps
the conversation. Without --model the built-in model talks in token ids ("1,2,3").
)"},
    {kGraph, "print the decode step's graph summary; write it as Graphviz DOT",
     R"(usage: stepgraph graph [options]

Prints the decode step's graph: nodes, launches, arena bytes against the sum of the
intermediates, weight and KV cache bytes. Needs no weights (only config.json).
)"},
    {kBench, "decode speed: ms/token eager vs replayed, and vs the memory-bandwidth floor",
     R"(usage: stepgraph bench [options]

Decode speed at given context positions: ms/token eager and replayed (GPU), medians of
CUDA-event times per step, and the ratio to a floor of reading every weight a step reads
once (of an untied embedding table the rows of its ids, of a mixture of experts the
experts its tokens can choose) at the device-to-device copy bandwidth measured in the same
run. A GPU benchmark: without a GPU it runs only with --cpu (the CPU reference, minutes for
a 1B model).
)"},
    {kServe, "an OpenAI-compatible HTTP server with continuous batching",
     R"(usage: stepgraph serve --model PATH [--host 127.0.0.1] [--port 8080] [--slots N]
                       [--max-seq N] [--api-key KEY]

Serves the model over HTTP with the OpenAI API: POST /v1/chat/completions (messages
through the model's chat template) and /v1/completions, streamed (server-sent events) or
not; GET /v1/models, /health and /metrics (Prometheus text). One scheduler runs the model
for every request: requests join and leave the decode batch between steps, and a new
prompt is fed a chunk (--prefill-chunk) at a time between the running requests' steps.
Requests beyond the --slots running wait in a queue of --max-queue; beyond that the answer
is 503 with Retry-After. SIGTERM (or Ctrl-C) stops taking requests, lets those in flight
finish (at most --drain-seconds) and exits. Sampling: a request's temperature, top_p,
top_k, seed, presence_penalty, frequency_penalty, logit_bias, repetition_penalty and
min_p, else the server's flags (default greedy, no penalties).
)"},
    {kTokenize, "the ids of a text with the model's tokenizer, or the text of ids",
     R"(usage: stepgraph tokenize --model PATH [--text TEXT | --decode 1,2,3]

Prints the ids of the text on standard input (or of --text) as one line of comma-separated
ids, with the tokenizer of the model (a folder's tokenizer.json or a GGUF file's
metadata), special tokens added as the model adds them; --decode prints the text of ids.
)"},
};

constexpr char kOverview[] =
    R"(usage: stepgraph [run|chat|graph|bench|tokenize|serve] [options]

Runs a Llama model's decode step as a graph of kernels, captured once as a CUDA graph
and replayed. With no --model a small built-in model (random weights) is used, so every
command runs anywhere; without a GPU the CPU reference runs instead (and says so).
)";

// The help of --logit-bias and --stop says these.
static_assert(ops::kMaxLogitBias == 64 && kMaxStopStrings == 4, "say the new limits in help");

// ---- the flags ----------------------------------------------------------------------

using S = absl::string_view;
using O = Options;
constexpr unsigned kAll = kAllCommands;
constexpr unsigned kSampling = kRun | kChat | kServe;

const Flag kFlags[] = {
    // The command's own options first, then the model's.
    {"--prompt", nullptr, "TEXT", kRun, false,
     "the prompt as text (needs a model with a tokenizer); - reads it from standard input",
     nullptr, EnvRule::kNone,
     [](S v, O& o) {
       SG_RETURN_IF_ERROR(NonEmpty(v, "a text, or - for standard input"));
       o.prompt_text = std::string(v);
       return absl::OkStatus();
     }},
    {"--file", nullptr, "PATH", kRun, false, "the prompt as text, read from a file", nullptr,
     EnvRule::kNone,
     [](S v, O& o) {
       SG_RETURN_IF_ERROR(NonEmpty(v, "a file name"));
       o.prompt_file = std::string(v);
       return absl::OkStatus();
     }},
    {"--chat", nullptr, nullptr, kRun, false,
     "wrap the text prompt as one user turn in the model's chat template", nullptr,
     EnvRule::kNone,
     &SetSwitch<&Options::chat>},
    {"--system", nullptr, "TEXT", kChat, false,
     "the system prompt (default: the chat template's own, where it has one)", nullptr,
     EnvRule::kNone,
     [](S v, O& o) {
       o.system = std::string(v);
       return absl::OkStatus();
     }},
    {"--device-loop", nullptr, "N", kRun, true,
     "GPU: up to N decode steps per launch, looped on the device and stopped there at a stop "
     "id (docs/device_loop.md: on an H200 as fast as one launch per step at batch 1, 2% "
     "faster at 4); default 0: one launch per step",
     nullptr, EnvRule::kNone, [](S v, O& o) { return SetInt(v, 0, 4096, o.device_loop); }},
    {"--ignore-eos", nullptr, nullptr, kRun, false,
     "generate --max-new-tokens tokens even past end-of-sequence", nullptr, EnvRule::kNone,
     &SetSwitch<&Options::ignore_eos>},
    {"--ignore-eos", nullptr, nullptr, kServe, false,
     "answer max_tokens tokens even past end-of-sequence (benchmarks: equal lengths)", nullptr,
     EnvRule::kNone, &SetSwitch<&Options::ignore_eos>},
    {"--prompt-ids", nullptr, "1,2,3", kRun, false, "prompt token ids (default 1,2,3,4,5,6,7,8)",
     nullptr, EnvRule::kNone,
     [](S v, O& o) {
       SG_RETURN_IF_ERROR(SetIds(v, o.prompt_ids));
       o.prompt_ids_given = true;
       return absl::OkStatus();
     }},
    {"--max-new-tokens", nullptr, "N", kRun, false, "tokens to generate per sequence (default 32)",
     nullptr, EnvRule::kNone, [](S v, O& o) { return SetInt(v, 0, INT32_MAX, o.max_new_tokens); }},
    {"--max-new-tokens", nullptr, "N", kChat, false,
     "the most tokens of one answer (default: until the end of the turn or a full KV cache)",
     nullptr, EnvRule::kNone, [](S v, O& o) { return SetInt(v, 1, INT32_MAX, o.answer_tokens); }},
    {"--batch", nullptr, "B", kRun, false, "decode B copies of the prompt together (default 1)",
     nullptr, EnvRule::kNone, [](S v, O& o) { return SetInt(v, 1, 1024, o.batch); }},
    {"--batch", nullptr, "B", kGraph, false, "rows (sequences) of the step (default 1)", nullptr,
     EnvRule::kNone, [](S v, O& o) { return SetInt(v, 1, 1024, o.batch); }},
    {"--batch", nullptr, "B", kBench, false, "sequences per step (default 1)", nullptr,
     EnvRule::kNone, [](S v, O& o) { return SetInt(v, 1, 1024, o.batch); }},
    {"--temperature", nullptr, "T", kSampling, false, "sample at temperature T (default 0: greedy)",
     nullptr, EnvRule::kNone,
     [](S v, O& o) {
       SG_ASSIGN_OR_RETURN(o.temperature, ParseFloat(v, 0.0f, 100.0f, false));
       return absl::OkStatus();
     }},
    {"--top-k", nullptr, "K", kSampling, false,
     "sample among the K most likely ids only (default 0: all)", nullptr, EnvRule::kNone,
     [](S v, O& o) { return SetInt32(v, 0, INT32_MAX, o.top_k); }},
    {"--top-p", nullptr, "P", kSampling, false,
     "sample from the smallest set of mass >= P (default 1)", nullptr, EnvRule::kNone,
     [](S v, O& o) {
       SG_ASSIGN_OR_RETURN(o.top_p, ParseFloat(v, 0.0f, 1.0f, true));
       return absl::OkStatus();
     }},
    {"--repeat-penalty", nullptr, "F", kSampling, false,
     "divide the positive logits of ids in the prompt or the answer so far by F and multiply "
     "the negative ones (transformers' repetition_penalty; F > 0, default 1: off)",
     nullptr, EnvRule::kNone,
     [](S v, O& o) { return SetPenalty<&Penalties::repetition>("--repeat-penalty", v, o); }},
    {"--presence-penalty", nullptr, "F", kSampling, false,
     "subtract F from the logit of every id generated so far (OpenAI's presence_penalty; in "
     "[-2, 2], default 0: off)",
     nullptr, EnvRule::kNone,
     [](S v, O& o) { return SetPenalty<&Penalties::presence>("--presence-penalty", v, o); }},
    {"--frequency-penalty", nullptr, "F", kSampling, false,
     "subtract from the logit of an id F for every time it was generated so far (OpenAI's "
     "frequency_penalty; in [-2, 2], default 0: off)",
     nullptr, EnvRule::kNone,
     [](S v, O& o) { return SetPenalty<&Penalties::frequency>("--frequency-penalty", v, o); }},
    {"--min-p", nullptr, "P", kSampling, false,
     "when sampling, leave out the ids less likely than P times the most likely one (in "
     "[0, 1], default 0: off)",
     nullptr, EnvRule::kNone,
     [](S v, O& o) { return SetPenalty<&Penalties::min_p>("--min-p", v, o); }},
    {"--logit-bias", nullptr, "ID=BIAS", kSampling, false,
     "add BIAS (in [-100, 100]) to the logit of token id ID: 100 all but forces it, -100 all "
     "but bans it; repeat for more ids, at most 64",
     nullptr, EnvRule::kNone,
     [](S v, O& o) {
       const size_t eq = v.find('=');
       if (eq == v.npos) {
         return absl::InvalidArgumentError(
             absl::StrCat("expected ID=BIAS (a token id and a number), got '", v, "'"));
       }
       SG_ASSIGN_OR_RETURN(const int64_t id, ParseInt(v.substr(0, eq), 0, INT32_MAX));
       SG_ASSIGN_OR_RETURN(const float bias, Number(v.substr(eq + 1)));
       o.penalties.logit_bias.emplace_back(static_cast<int32_t>(id), bias);
       return CheckPenaltyFlagValue("--logit-bias", o.penalties);
     }},
    {"--stop", nullptr, "TEXT", kRun | kChat, false,
     "end the answer where TEXT appears in it (matched on the text across tokens, and not "
     "printed); repeat for more, at most 4",
     nullptr, EnvRule::kNone,
     [](S v, O& o) {
       SG_RETURN_IF_ERROR(CheckStopString(v));
       if (o.stop.size() >= static_cast<size_t>(kMaxStopStrings)) {
         return absl::InvalidArgumentError(
             absl::StrCat("at most ", kMaxStopStrings, " stop strings"));
       }
       o.stop.emplace_back(v);
       return absl::OkStatus();
     }},
    {"--seed", nullptr, "S", kRun, false,
     "sampling seed of sequence 0; sequence i uses S + i (default 0)", nullptr, EnvRule::kNone,
     [](S v, O& o) { return SetInt32(v, INT32_MIN, INT32_MAX, o.seed); }},
    {"--seed", nullptr, "S", kChat, false, "sampling seed (default 0)", nullptr, EnvRule::kNone,
     [](S v, O& o) { return SetInt32(v, INT32_MIN, INT32_MAX, o.seed); }},
    {"--host", nullptr, "ADDR", kServe, false,
     "the address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for all)",
     nullptr, EnvRule::kNone,
     [](S v, O& o) {
       SG_RETURN_IF_ERROR(NonEmpty(v, "an address"));
       o.host = std::string(v);
       return absl::OkStatus();
     }},
    {"--port", nullptr, "N", kServe, false,
     "the TCP port (default 8080; 0: any free one, printed when listening)", nullptr,
     EnvRule::kNone, [](S v, O& o) { return SetInt(v, 0, 65535, o.port); }},
    {"--slots", nullptr, "N", kServe, false,
     "requests decoded together (KV cache slots; default 16)", nullptr, EnvRule::kNone,
     [](S v, O& o) { return SetInt(v, 1, 1024, o.slots); }},
    {"--api-key", nullptr, "KEY", kServe, false,
     "ask every /v1 request for 'Authorization: Bearer KEY' (401 otherwise)",
     "STEPGRAPH_API_KEY", EnvRule::kValue,
     [](S v, O& o) {
       SG_RETURN_IF_ERROR(NonEmpty(v, "a key"));
       o.api_key = std::string(v);
       return absl::OkStatus();
     }},
    {"--max-queue", nullptr, "N", kServe, false,
     "requests that may wait for a slot; more are answered 503 (default 64)", nullptr,
     EnvRule::kNone, [](S v, O& o) { return SetInt(v, 0, 1 << 20, o.max_queue); }},
    {"--max-body-bytes", nullptr, "N", kServe, false,
     "the largest request body; larger ones are answered 413 (default 1048576)", nullptr,
     EnvRule::kNone,
     [](S v, O& o) { return SetInt(v, 1024, int64_t{1} << 30, o.max_body_bytes); }},
    {"--max-prompt-tokens", nullptr, "N", kServe, false,
     "the longest prompt in tokens, after the chat template (400 beyond; default: the "
     "context)",
     nullptr, EnvRule::kNone,
     [](S v, O& o) { return SetInt(v, 1, INT32_MAX, o.max_prompt_tokens); }},
    {"--max-tokens", nullptr, "N", kServe, false,
     "the most tokens a request may ask for, and a chat's default (400 beyond; default: the "
     "context)",
     nullptr, EnvRule::kNone, [](S v, O& o) { return SetInt(v, 1, INT32_MAX, o.max_tokens); }},
    {"--http-threads", nullptr, "N", kServe, false,
     "connections served at once, each streaming one answer (default slots + max-queue + 8)",
     nullptr, EnvRule::kNone, [](S v, O& o) { return SetInt(v, 1, 4096, o.http_threads); }},
    {"--drain-seconds", nullptr, "S", kServe, false,
     "on SIGTERM, how long requests in flight may take to finish (default 30)", nullptr,
     EnvRule::kNone, [](S v, O& o) { return SetInt(v, 0, 86400, o.drain_seconds); }},
    {"--text", nullptr, "TEXT", kTokenize, false, "the text to encode instead of standard input",
     nullptr, EnvRule::kNone,
     [](S v, O& o) {
       o.text = std::string(v);
       return absl::OkStatus();
     }},
    {"--decode", nullptr, "1,2,3", kTokenize, false, "print the text of these ids", nullptr,
     EnvRule::kNone,
     [](S v, O& o) {
       std::vector<int32_t> ids;
       SG_RETURN_IF_ERROR(SetIds(v, ids));
       o.decode = std::move(ids);
       return absl::OkStatus();
     }},
    {"--dot", nullptr, "FILE", kGraph, false, "write the graph as Graphviz DOT to FILE", nullptr,
     EnvRule::kNone,
     [](S v, O& o) {
       SG_RETURN_IF_ERROR(NonEmpty(v, "a file name"));
       o.dot = std::string(v);
       return absl::OkStatus();
     }},
    {"--tensor-parallel", "--tp", "N", kBench, false,
     "shard the model over N ranks (GPUs 0..N-1 through NCCL; threads on the CPU reference) "
     "and measure the sharded step and its all-reduces",
     nullptr, EnvRule::kNone, [](S v, O& o) { return SetInt(v, 1, 64, o.tensor_parallel); }},
    {"--tensor-parallel", "--tp", "N", kRun | kChat | kServe | kGraph, false,
     "shard the model over N ranks (GPUs 0..N-1 through NCCL; threads on the CPU reference); "
     "its heads must divide by N",
     nullptr, EnvRule::kNone, [](S v, O& o) { return SetInt(v, 1, 64, o.tensor_parallel); }},
    {"--steps", nullptr, "N", kBench, false, "timed steps per measurement (default 64)", nullptr,
     EnvRule::kNone, [](S v, O& o) { return SetInt(v, 1, 1 << 20, o.steps); }},
    {"--positions", nullptr, "P1,P2,...", kBench, false,
     "context positions to measure at (default 100,1000)", nullptr, EnvRule::kNone,
     [](S v, O& o) {
       SG_ASSIGN_OR_RETURN(o.positions, ParseIntList(v, 0, INT32_MAX));
       return absl::OkStatus();
     }},
    {"--profile", nullptr, nullptr, kBench, false,
     "also time every node of an eager step, and of the longest --ttft-lengths prompt's "
     "prefill steps (device time per node)", nullptr, EnvRule::kNone,
     &SetSwitch<&Options::profile>},
    {"--prefill-chunk", nullptr, "N", kRun | kChat | kBench | kServe, false,
     "prompt tokens per prefill step (default 2048; 0: one token per decode step)", nullptr,
     EnvRule::kNone, [](S v, O& o) { return SetInt(v, 0, 16384, o.prefill_chunk); }},
    {"--ttft-lengths", nullptr, "L1,...", kBench, false,
     "prompt lengths whose time to first token is measured (default 128,512,2048; each must "
     "fit --max-seq when given)",
     nullptr, EnvRule::kNone,
     [](S v, O& o) {
       SG_ASSIGN_OR_RETURN(o.ttft_lengths, ParseIntList(v, 1, INT32_MAX));
       return absl::OkStatus();
     }},

    // ---- model options (every command) ----
    {"--model", nullptr, "PATH", kAll, true,
     "a Hugging Face Llama folder (config.json + *.safetensors) or a GGUF file (float or "
     "quantized weights)",
     nullptr, EnvRule::kNone,
     [](S v, O& o) {
       std::error_code ec;
       if (!std::filesystem::exists(std::string(v), ec)) {
         return absl::InvalidArgumentError(absl::StrCat("'", v, "' does not exist"));
       }
       o.model = std::string(v);
       return absl::OkStatus();
     }},
    {"--model-preset", nullptr, "NAME", kAll, true,
     "random weights in a known shape: tiny (default), llama-3.2-1b, llama-3.1-8b, "
     "llama-3.1-70b",
     nullptr, EnvRule::kNone,
     [](S v, O& o) {
       if (v != "tiny" && v != "llama-3.2-1b" && v != "llama-3.1-8b" && v != "llama-3.1-70b") {
         return absl::InvalidArgumentError(absl::StrCat(
             "unknown preset '", v, "' (known: tiny, llama-3.2-1b, llama-3.1-8b, llama-3.1-70b)"));
       }
       o.preset = std::string(v);
       return absl::OkStatus();
     }},
    {"--weight-seed", nullptr, "S", kAll, true, "seed of the random weights (default 0)", nullptr,
     EnvRule::kNone,
     [](S v, O& o) {
       SG_ASSIGN_OR_RETURN(const int64_t seed, ParseInt(v, 0));
       o.weight_seed = static_cast<uint64_t>(seed);
       return absl::OkStatus();
     }},
    {"--cpu", nullptr, nullptr, kAll, true,
     "run on the CPU reference even where a GPU is available", nullptr, EnvRule::kNone,
     &SetSwitch<&Options::cpu>},
    {"--threads", "-t", "N", kAll, true,
     "CPU reference: worker threads of its parallel ops (default: one per core)", nullptr,
     EnvRule::kNone, [](S v, O& o) { return SetInt(v, 1, 1024, o.threads); }},
    {"--eager", nullptr, nullptr, kAll, true,
     "GPU: launch every node each step instead of replaying a graph", "STEPGRAPH_EAGER",
     EnvRule::kSetUnlessZero,
     &SetSwitch<&Options::eager>},
    {"--matmul", nullptr, "POLICY", kAll, true, "GPU matmul path: auto (default), cublaslt, gemv",
     "STEPGRAPH_MATMUL", EnvRule::kValue,
     [](S v, O& o) {
       SG_ASSIGN_OR_RETURN(o.cuda.matmul, ParseMatmulPolicy(v));
       return absl::OkStatus();
     }},
    {"--no-pdl", nullptr, nullptr, kAll, true,
     "GPU: launch kernels without programmatic dependent launch", "STEPGRAPH_PDL",
     EnvRule::kSetIfZero,
     [](S, O& o) {
       o.cuda.programmatic_launch = false;
       return absl::OkStatus();
     }},
    {"--kernel-cache", nullptr, "DIR", kAll, true,
     "GPU: folder of the kernels compiled for the plan (NVRTC), or none for memory only "
     "(default $XDG_CACHE_HOME/stepgraph/kernels, else ~/.cache/stepgraph/kernels)",
     nullptr, EnvRule::kNone,
     [](S v, O& o) {
       SG_RETURN_IF_ERROR(NonEmpty(v, "a folder, or none"));
       o.cuda.kernel_cache_folder = v == "none" ? std::string() : std::string(v);
       return absl::OkStatus();
     }},
    {"--compiled-norm", nullptr, nullptr, kAll, true,
     "GPU: RmsNorm through a kernel compiled for the model's hidden size", nullptr,
     EnvRule::kNone,
     [](S, O& o) {
       o.cuda.compiled_norm = true;
       return absl::OkStatus();
     }},
    {"--one-shot-bytes", nullptr, "N", kAll, true,
     "tensor parallel: all-reduces of at most N bytes through stepgraph's one-shot kernel over "
     "NVLink, larger ones through NCCL (default 8192; 0: NCCL always)",
     nullptr, EnvRule::kNone,
     [](S v, O& o) { return SetInt(v, 0, int64_t{1} << 30, o.cuda.one_shot_all_reduce_bytes); }},
    {"--moe-by-expert", nullptr, "N", kAll, true,
     "GPU: mixture-of-experts matmuls walk by expert (each expert's weights read once per "
     "window of rows) from N (row, chosen expert) pairs per expert on average; below it "
     "block-format experts run on the one-row kernel and float ones a block per pair "
     "(default 2: prefill by expert, decode not; 0: always by expert)",
     nullptr, EnvRule::kNone,
     [](S v, O& o) { return SetInt(v, 0, int64_t{1} << 40, o.cuda.moe_by_expert_pairs); }},
    {"--moe-mma", nullptr, nullptr, kAll, true,
     "GPU: block-format mixture-of-experts matmuls that walk by expert (prefill) on the "
     "tensor cores, the experts' rows sorted on the device (the default)",
     nullptr, EnvRule::kNone,
     [](S, O& o) {
       o.cuda.moe_block_mma = true;
       return absl::OkStatus();
     }},
    {"--no-moe-mma", nullptr, nullptr, kAll, true,
     "GPU: block-format mixture-of-experts matmuls that walk by expert on the CUDA cores, "
     "in f32 (about 4x slower prefill on a Q4_K_M MoE file)",
     nullptr, EnvRule::kNone,
     [](S, O& o) {
       o.cuda.moe_block_mma = false;
       return absl::OkStatus();
     }},
    {"--no-attention-clusters", nullptr, nullptr, kAll, true,
     "GPU: decode attention merges a row's KV chunks through device memory only, not "
     "within thread block clusters first (the default on sm_90 and later where a chunk has "
     "fewer than 8 blocks, as a model with 4 KV heads at batch 1)",
     nullptr, EnvRule::kNone,
     [](S, O& o) {
       o.cuda.attention_clusters = false;
       return absl::OkStatus();
     }},
    {"--prefill-attention", nullptr, "P", kAll, true,
     "GPU: a prompt's attention with f32 activations: auto (default: f16 for GGUF files with "
     "quantized matrices, whose matmuls round x to f16 already, unless "
     "--block-gemm-precision is f32 or f16x2; f32 otherwise), f16 (the tensor cores, q, k, v "
     "and the probabilities rounded to f16, sums in f32; about 3.5x faster), f32 (f32 "
     "products on the CUDA cores)",
     nullptr, EnvRule::kNone,
     [](S v, O& o) {
       SG_ASSIGN_OR_RETURN(o.cuda.prefill_attention, ParsePrefillAttentionPrecision(v));
       return absl::OkStatus();
     }},
    {"--block-gemm-rows", nullptr, "N|auto", kAll, true,
     "GPU: rows from which a block-format (GGUF) matmul dequantizes its weight in chunks and "
     "runs cuBLASLt (0: never; default auto: 32 where that GEMM runs on tensor cores, never "
     "for exact f32, where the tensor-core kernel is faster)",
     nullptr, EnvRule::kNone,
     [](S v, O& o) {
       if (v == "auto") {
         o.cuda.block_gemm_min_rows = CudaOptions::kBlockGemmAuto;
         return absl::OkStatus();
       }
       SG_ASSIGN_OR_RETURN(o.cuda.block_gemm_min_rows, ParseInt(v, 0));
       return absl::OkStatus();
     }},
    {"--block-mma-rows", nullptr, "N", kAll, true,
     "GPU: rows from which block-format (GGUF) matmuls below --block-gemm-rows run on tensor "
     "cores, x split into exact bf16 parts (default 4; 0: never)",
     nullptr, EnvRule::kNone,
     [](S v, O& o) { return SetInt(v, 0, int64_t{1} << 30, o.cuda.block_mma_min_rows); }},
    {"--block-gemm-precision", nullptr, "P", kAll, true,
     "GPU: block-format matmuls' operands with f32 activations: auto (default: f16 from "
     "16 rows, prefill steps and decode batches of 16, f32 below), f32 (exact), "
     "f16x2 (the tensor-core kernel's x in two f16 parts per 32 values scaled by a power of "
     "two: f32's precision, fewer MMAs), int8 (x quantized to int8 per 32 values in int8 "
     "MMAs, as llama.cpp does: the fastest, not the reference's numbers), bf16x2 (x in two "
     "bf16 parts: 16 bits), tf32, bf16 (the block GEMM's and, as bf16, the tensor-core "
     "kernel's x), f16 (x in f16: the block GEMM's operands from 32 rows, as llama.cpp's "
     "cuBLAS path, one f16 part per 32 values scaled by a power of two in the tensor-core "
     "kernel below; fast, not the reference's numbers)",
     nullptr, EnvRule::kNone,
     [](S v, O& o) {
       SG_ASSIGN_OR_RETURN(o.cuda.block_gemm_precision, ParseBlockGemmPrecision(v));
       return absl::OkStatus();
     }},
    {"--block-gemv-precision", nullptr, "P", kAll, true,
     "GPU: how one-row block-format (GGUF) matmuls at decode meet x: auto (default: "
     "int16x2, but f32 for Q8_0), int16x2 (x as two int16 parts per 32 values in integer "
     "dot products, f32's precision), f32 (f32 products), int16 or int8 (one part; faster, "
     "not the reference's numbers)",
     nullptr, EnvRule::kNone,
     [](S v, O& o) {
       SG_ASSIGN_OR_RETURN(o.cuda.block_gemv_precision, ParseBlockGemvPrecision(v));
       return absl::OkStatus();
     }},
    {"--passes", nullptr, "LIST", kAll, true,
     "graph passes: default (every pass but norm_into_matmul and moe_down_into_combine, the "
     "fastest measured), all, none, names to run, or -name,... to skip from all (see "
     "stepgraph/graph/passes.h)",
     nullptr, EnvRule::kNone,
     [](S v, O& o) {
       SG_ASSIGN_OR_RETURN(o.passes, ParsePassList(v));
       return absl::OkStatus();
     }},
    {"--no-fuse", nullptr, nullptr, kAll, true, "the same as --passes none: run the plain graph",
     nullptr, EnvRule::kNone,
     [](S, O& o) {
       o.passes.enabled = false;
       return absl::OkStatus();
     }},
    {"--max-seq", nullptr, "N", kAll, true,
     "KV cache length per sequence (default: what the command needs; chat and serve: the "
     "model's context, at most 4096)",
     nullptr, EnvRule::kNone, [](S v, O& o) { return SetInt(v, 1, INT32_MAX, o.max_seq); }},
    {"--verbose", nullptr, nullptr, kAll & ~kChat & ~kServe, true,
     "also list the config.json fields accepted as metadata", nullptr, EnvRule::kNone,
     &SetSwitch<&Options::verbose>},
    {"--verbose", nullptr, nullptr, kServe, true,
     "also log every request on stderr (and the config.json fields accepted as metadata)",
     nullptr, EnvRule::kNone,
     &SetSwitch<&Options::verbose>},
    {"--verbose", nullptr, nullptr, kChat, true,
     "also print the speed of every answer (and the config.json fields accepted as metadata)",
     nullptr, EnvRule::kNone,
     &SetSwitch<&Options::verbose>},
    {"--help", "-h", nullptr, kAll, true, "this help", nullptr, EnvRule::kNone,
     &SetSwitch<&Options::help>},
};

// The definition of `arg` for `command`; `known` says whether any command has it.
const Flag* FindFlag(absl::string_view arg, Command command, bool* known) {
  *known = false;
  for (const Flag& f : kFlags) {
    if (arg != f.name && (f.short_name == nullptr || arg != f.short_name)) continue;
    *known = true;
    if (f.commands & command) return &f;
  }
  return nullptr;
}

// The variables stepgraph knows, mapped onto the flags that name them, and the default
// of the kernel cache (where the user's caches are). Flags given later override them.
absl::Status ApplyEnvironment(const Environment& env, Options& o) {
  auto get = [&](const char* name) -> absl::string_view {
    const char* v = env(name);
    return v == nullptr ? absl::string_view() : absl::string_view(v);
  };
  if (absl::string_view xdg = get("XDG_CACHE_HOME"); !xdg.empty()) {
    o.cuda.kernel_cache_folder = absl::StrCat(xdg, "/stepgraph/kernels");
  } else if (absl::string_view home = get("HOME"); !home.empty()) {
    o.cuda.kernel_cache_folder = absl::StrCat(home, "/.cache/stepgraph/kernels");
  }
  for (const Flag& f : kFlags) {
    if (f.env == nullptr || (f.commands & o.command) == 0) continue;
    const absl::string_view v = get(f.env);
    bool set = false;
    switch (f.env_rule) {
      case EnvRule::kNone:
        break;
      case EnvRule::kSetUnlessZero:
        set = !v.empty() && v != "0";
        break;
      case EnvRule::kSetIfZero:
        set = v == "0";
        break;
      case EnvRule::kValue:
        set = !v.empty();
        break;
    }
    if (!set) continue;
    if (absl::Status st = f.apply(f.env_rule == EnvRule::kValue ? v : "", o); !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("environment variable ", f.env, ": ", st.message()));
    }
  }
  return absl::OkStatus();
}

// What no single flag can check: flags that exclude each other.
absl::Status CheckTogether(const Options& o) {
  if (!o.model.empty() && o.preset != "tiny") {
    return absl::InvalidArgumentError("--model and --model-preset cannot be used together");
  }
  const bool text = o.prompt_text.has_value() || o.prompt_file.has_value();
  if (o.prompt_ids_given && text) {
    const char* flag = o.prompt_text.has_value() ? "--prompt" : "--file";
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " and --prompt-ids cannot be used together"));
  }
  if (o.prompt_text.has_value() && o.prompt_file.has_value()) {
    return absl::InvalidArgumentError("--prompt and --file cannot be used together");
  }
  if (o.chat && !text && (o.prompt_ids_given || o.model.empty())) {
    return absl::InvalidArgumentError(
        "--chat wraps a text prompt: give --prompt TEXT, --file PATH or the text on standard "
        "input, with a --model that has a tokenizer");
  }
  if (!o.stop.empty() && o.command == kChat && o.model.empty()) {
    return absl::InvalidArgumentError(
        "--stop matches the answer's text: it needs a --model with a tokenizer (the built-in "
        "model talks in ids)");
  }
  if (!o.stop.empty() && o.command == kRun && !text && (o.prompt_ids_given || o.model.empty())) {
    return absl::InvalidArgumentError(kStopNeedsText);
  }
  if (o.text.has_value() && o.decode.has_value()) {
    return absl::InvalidArgumentError("--text and --decode cannot be used together");
  }
  if (o.system.has_value() && o.model.empty()) {
    return absl::InvalidArgumentError(
        "--system needs a --model with a chat template; the built-in model has none");
  }
  return absl::OkStatus();
}

// `text` wrapped to lines of at most `width` columns, every line after the first
// indented by `indent` spaces.
std::string Wrap(absl::string_view text, size_t indent, size_t width) {
  std::string out;
  size_t column = indent;
  bool first = true;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!first && column + 1 + word.size() > width) {
      absl::StrAppend(&out, "\n", std::string(indent, ' '));
      column = indent;
      first = true;
    }
    if (!first) {
      out.push_back(' ');
      ++column;
    }
    absl::StrAppend(&out, word);
    column += word.size();
    first = false;
  }
  return out;
}

// One flag's lines of help.
std::string FlagHelp(const Flag& f) {
  constexpr size_t kColumn = 25, kWidth = 92;
  std::string left = f.short_name != nullptr ? absl::StrCat(f.short_name, ", ", f.name) : f.name;
  if (f.value != nullptr) absl::StrAppend(&left, " ", f.value);
  std::string help = f.help;
  if (f.env != nullptr) {
    absl::StrAppend(&help, " (also ", f.env,
                    f.env_rule == EnvRule::kSetUnlessZero ? "=1"
                    : f.env_rule == EnvRule::kSetIfZero   ? "=0"
                                                          : "",
                    ")");
  }
  std::string line = absl::StrCat("  ", left);
  if (line.size() + 1 > kColumn) {
    absl::StrAppend(&line, "\n");
    line.append(kColumn, ' ');
  } else {
    line.append(kColumn - line.size(), ' ');
  }
  return absl::StrCat(line, Wrap(help, kColumn, kWidth), "\n");
}

std::string ModelOptionsHelp(Command command) {
  std::string out = "model options:\n";
  for (const Flag& f : kFlags) {
    if (f.model_section && (f.commands & command)) absl::StrAppend(&out, FlagHelp(f));
  }
  return out;
}

}  // namespace

absl::string_view CommandName(Command c) {
  switch (c) {
    case kRun:
      return "run";
    case kChat:
      return "chat";
    case kGraph:
      return "graph";
    case kBench:
      return "bench";
    case kTokenize:
      return "tokenize";
    case kServe:
      return "serve";
  }
  return "run";
}

absl::Span<const Flag> Flags() { return kFlags; }

absl::Status CheckPenaltyFlags(const Penalties& penalties, int64_t vocab_size) {
  for (const PenaltyFlag& f : kPenaltyFlags) {
    if (absl::Status st = CheckPenaltyFlag(f, penalties, vocab_size); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(f.name, ": ", st.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParseInt(absl::string_view text, int64_t min, int64_t max) {
  int64_t v = 0;
  if (absl::SimpleAtoi(text, &v) && v >= min && v <= max) return v;
  return absl::InvalidArgumentError(
      max == INT64_MAX
          ? absl::StrCat("expected an integer >= ", min, ", got '", text, "'")
          : absl::StrCat("expected an integer in [", min, ", ", max, "], got '", text, "'"));
}

absl::StatusOr<float> ParseFloat(absl::string_view text, float lo, float hi, bool lo_open) {
  float v = 0;
  if (absl::SimpleAtof(text, &v) && std::isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi) {
    return v;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "expected a number in ", lo_open ? "(" : "[", lo, ", ", hi, "], got '", text, "'"));
}

absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view text, int64_t min,
                                                  int64_t max) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    SG_ASSIGN_OR_RETURN(const int64_t v, ParseInt(part, min, max));
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<Options> ParseArgs(absl::Span<const char* const> args, const Environment& env,
                                  std::optional<Command>* named) {
  Options o;
  size_t i = 0;
  if (i < args.size() && args[i][0] != '-') {
    const absl::string_view word = args[i];
    if (word == "help") {
      o.help = true;
      return o;
    }
    bool found = false;
    for (const CommandSpec& c : kCommands) {
      if (word == CommandName(c.command)) {
        o.command = c.command;
        found = true;
      }
    }
    if (!found) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown command '", word, "' (commands: run, chat, graph, bench, tokenize, serve)"));
    }
    *named = o.command;
    ++i;
  }
  SG_RETURN_IF_ERROR(ApplyEnvironment(env, o));
  for (; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    std::optional<absl::string_view> inline_value;
    if (const size_t eq = arg.find('='); absl::StartsWith(arg, "--") && eq != arg.npos) {
      inline_value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    bool known = false;
    const Flag* flag = FindFlag(arg, o.command, &known);
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          absl::StartsWith(arg, "-") ? "unknown flag '" : "unexpected argument '", arg, "'"));
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(arg, " is not an option of '", CommandName(o.command), "'"));
    }
    absl::string_view value;
    if (flag->value != nullptr) {
      if (inline_value.has_value()) {
        value = *inline_value;
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat(arg, ": missing value"));
      }
    } else if (inline_value.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(arg, " takes no value"));
    }
    if (absl::Status st = flag->apply(value, o); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(arg, ": ", st.message()));
    }
  }
  SG_RETURN_IF_ERROR(CheckTogether(o));
  return o;
}

std::string HelpText(std::optional<Command> command) {
  if (!command.has_value()) {
    std::string out = absl::StrCat(kOverview, "\ncommands:\n");
    for (const CommandSpec& c : kCommands) {
      const absl::string_view name = CommandName(c.command);
      absl::StrAppend(&out, "  ", name, std::string(9 - name.size(), ' '), c.summary, "\n");
    }
    absl::StrAppend(&out, "\n'stepgraph <command> --help' lists the command's options.\n\n",
                    ModelOptionsHelp(kRun));
    return out;
  }
  std::string out;
  for (const CommandSpec& c : kCommands) {
    if (c.command == *command) out = c.about;
  }
  absl::StrAppend(&out, "\n", CommandName(*command), " options:\n");
  for (const Flag& f : kFlags) {
    if (!f.model_section && (f.commands & *command)) absl::StrAppend(&out, FlagHelp(f));
  }
  absl::StrAppend(&out, "\n", ModelOptionsHelp(*command));
  return out;
}

}  // namespace sg::cli
