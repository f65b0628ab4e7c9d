// The `stepgraph` program's commands, one file each (run.cc, chat.cc, graph.cc, bench.cc,
// tokenize.cc, serve.cc). Each takes the parsed options, prints its results and returns the
// exit status (console.h).
#ifndef STEPGRAPH_TOOLS_COMMANDS_H_
#define STEPGRAPH_TOOLS_COMMANDS_H_

#include "tools/options.h"

namespace sg::cli {

int RunCommand(const Options& o);
int ChatCommand(const Options& o);
int GraphCommand(const Options& o);
int BenchCommand(const Options& o);
int TokenizeCommand(const Options& o);
int ServeCommand(const Options& o);

}  // namespace sg::cli

#endif  // STEPGRAPH_TOOLS_COMMANDS_H_
