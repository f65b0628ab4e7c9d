// The `stepgraph` program: decode with a Llama model end to end (run), talk to it (chat),
// show the decode step's graph (graph), measure decode speed against the memory-bandwidth
// floor (bench), use its tokenizer (tokenize) and serve it over HTTP (serve). With no
// --model it uses a small built-in model with deterministic random weights, so every
// command runs anywhere; without a GPU it runs the CPU reference.
//
// Exit status: 0 done (or --help), 1 a runtime error (a model that fails to load, a device
// error), 2 a usage error (unknown flag, bad value); errors are one line plus a hint.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <optional>
#include <vector>

#include "tools/commands.h"
#include "tools/console.h"
#include "tools/options.h"

namespace sg::cli {
namespace {

int Main(int argc, char** argv) {
  std::optional<Command> named;
  const std::vector<const char*> args(argv + 1, argv + argc);
  absl::StatusOr<Options> o =
      ParseArgs(args, [](const char* name) { return std::getenv(name); }, &named);
  if (!o.ok()) return UsageFailure(o.status().message(), named);
  if (o->help) {
    std::fputs(HelpText(named).c_str(), stdout);
    return kExitOk;
  }
  switch (o->command) {
    case kRun:
      return RunCommand(*o);
    case kChat:
      return ChatCommand(*o);
    case kGraph:
      return GraphCommand(*o);
    case kBench:
      return BenchCommand(*o);
    case kTokenize:
      return TokenizeCommand(*o);
    case kServe:
      return ServeCommand(*o);
  }
  return kExitOk;
}

}  // namespace
}  // namespace sg::cli

int main(int argc, char** argv) {
  // The library reports allocation failure as ResourceExhausted; this catches what the
  // program's own containers might throw, so that no run ends in an abort.
  try {
    return sg::cli::Main(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "stepgraph: error: out of memory\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stepgraph: error: %s\n", e.what());
  }
  return 1;
}
