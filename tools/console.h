// What the `stepgraph` program reads and prints besides its results: the exit statuses,
// an error line with a hint that fits what went wrong, byte sizes, progress with an
// estimate for whatever runs longer than a few seconds, and text read whole from standard
// input or a file (bounded).
#ifndef STEPGRAPH_TOOLS_CONSOLE_H_
#define STEPGRAPH_TOOLS_CONSOLE_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tools/options.h"

namespace sg::cli {

// Exit statuses: done (or --help); a runtime error (a model that fails to load, a device
// error); a usage error (unknown flag, bad value, a request the model cannot hold).
constexpr int kExitOk = 0;
constexpr int kExitRuntime = 1;
constexpr int kExitUsage = 2;

// "stepgraph: error: MESSAGE" and a hint to the command's help, on stderr; kExitUsage.
int UsageFailure(absl::string_view message, std::optional<Command> command);
// "stepgraph: error: MESSAGE" and "hint: HINT", on stderr; kExitRuntime.
int Failure(const absl::Status& status, absl::string_view hint);
// The hint for errors that need no particular one.
std::string HelpHint(Command command);

// All of standard input, or of the file at `path`: at most 64 MiB, refused beyond that
// before it is read (`what` names the text in errors: "the prompt").
absl::StatusOr<std::string> ReadStdin(absl::string_view what);
absl::StatusOr<std::string> ReadTextFile(const std::string& path, absl::string_view what);
// Whether standard input is a pipe or a file (something to read a prompt from), not a
// terminal or a device such as /dev/null.
bool StdinIsPipeOrFile();

// "1.5 MiB".
std::string Bytes(int64_t bytes);

using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t0);
// "7 s", "3 min 5 s", "1 h 2 min".
std::string Duration(double seconds);

// Progress of a task on stderr, shown only once it has run for a couple of seconds (a
// short task prints nothing): the count done of the total, the rate and the time left at
// that rate; updated in place on a terminal, a line every few seconds otherwise.
class Progress {
 public:
  // `what` names the task ("prefill"), `unit` what is counted ("tokens").
  Progress(std::string what, int64_t total, std::string unit);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void Update(int64_t done);
  // Ends the line on a terminal (also done on destruction).
  void Done();

 private:
  std::string what_, unit_;
  int64_t total_;
  bool tty_;
  bool shown_ = false;
  int64_t shown_done_ = 0;  // the count last shown
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_ = start_;
};

}  // namespace sg::cli

#endif  // STEPGRAPH_TOOLS_CONSOLE_H_
