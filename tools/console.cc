// Error lines, hints, sizes, progress and input text of the `stepgraph` program; see
// console.h.
#include "tools/console.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace sg::cli {

int UsageFailure(absl::string_view message, std::optional<Command> command) {
  std::fprintf(stderr, "stepgraph: error: %s\n", std::string(message).c_str());
  std::fprintf(stderr, "hint: run 'stepgraph%s --help' for usage\n",
               command.has_value() ? absl::StrCat(" ", CommandName(*command)).c_str() : "");
  return kExitUsage;
}

int Failure(const absl::Status& status, absl::string_view hint) {
  std::fprintf(stderr, "stepgraph: error: %s\n", std::string(status.message()).c_str());
  std::fprintf(stderr, "hint: %s\n", std::string(hint).c_str());
  return kExitRuntime;
}

std::string HelpHint(Command command) {
  return absl::StrCat("see 'stepgraph ", CommandName(command), " --help'");
}

namespace {

constexpr size_t kMaxInputBytes = size_t{64} << 20;

absl::StatusOr<std::string> ReadBounded(FILE* f, absl::string_view what,
                                        absl::string_view from) {
  std::string text;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) {
    if (text.size() + n > kMaxInputBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", from, " holds more than 64 MiB"));
    }
    text.append(buf, n);
  }
  if (std::ferror(f)) {
    return absl::DataLossError(absl::StrCat(what, ": cannot read ", from));
  }
  return text;
}

}  // namespace

absl::StatusOr<std::string> ReadStdin(absl::string_view what) {
  return ReadBounded(stdin, what, "standard input");
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path, absl::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat(what, ": cannot open '", path, "': ", std::strerror(errno)));
  }
  // A FIFO would block and a folder reads as nothing: only a regular file is a prompt.
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": '", path, "' is not a regular file"));
  }
  if (static_cast<uint64_t>(st.st_size) > kMaxInputBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": '", path, "' holds ", st.st_size,
                                                   " bytes, more than 64 MiB"));
  }
  struct Closer {
    void operator()(FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<FILE, Closer> f(std::fopen(path.c_str(), "rb"));
  if (f == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(what, ": cannot open '", path, "': ", std::strerror(errno)));
  }
  return ReadBounded(f.get(), what, absl::StrCat("'", path, "'"));
}

bool StdinIsPipeOrFile() {
  struct stat st {};
  return ::fstat(STDIN_FILENO, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISREG(st.st_mode));
}

std::string Bytes(int64_t b) {
  const double v = static_cast<double>(b);
  if (v >= 1 << 30) return absl::StrFormat("%.2f GiB", v / (1 << 30));
  if (v >= 1 << 20) return absl::StrFormat("%.1f MiB", v / (1 << 20));
  if (v >= 1 << 10) return absl::StrFormat("%.1f KiB", v / (1 << 10));
  return absl::StrCat(b, " B");
}

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::string Duration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s < 60) return absl::StrCat(s, " s");
  if (s < 3600) return absl::StrCat(s / 60, " min ", s % 60, " s");
  return absl::StrCat(s / 3600, " h ", s / 60 % 60, " min");
}

Progress::Progress(std::string what, int64_t total, std::string unit)
    : what_(std::move(what)), unit_(std::move(unit)), total_(total),
      tty_(isatty(STDERR_FILENO) != 0) {}

Progress::~Progress() { Done(); }

void Progress::Update(int64_t done) {
  constexpr double kQuietMs = 2000;  // what ends sooner shows nothing
  const double ms = MsSince(start_);
  const double every_ms = tty_ ? 200 : 5000;  // a log file gets a line now and then
  // The end of a task that never showed needs no line; one that did ends with its time.
  const bool finished = done >= total_;
  if (ms < kQuietMs || done <= 0 || (finished && (!shown_ || shown_done_ >= total_))) return;
  if (shown_ && !finished && MsSince(last_) < every_ms) return;
  last_ = Clock::now();
  shown_ = true;
  shown_done_ = done;
  const double rate = 1e3 * static_cast<double>(done) / ms;
  const double left_s = static_cast<double>(total_ - done) / rate;
  const std::string when = finished ? absl::StrCat("done in ", Duration(ms / 1e3))
                                    : absl::StrCat("about ", Duration(left_s), " left");
  std::fprintf(stderr, "%sstepgraph: %s %lld/%lld %s, %.1f %s/s, %s%s", tty_ ? "\r\033[K" : "",
               what_.c_str(), static_cast<long long>(done), static_cast<long long>(total_),
               unit_.c_str(), rate, unit_.c_str(), when.c_str(), tty_ ? "" : "\n");
  std::fflush(stderr);
}

void Progress::Done() {
  if (shown_ && tty_) std::fputs("\n", stderr);
  shown_ = false;
}

}  // namespace sg::cli
