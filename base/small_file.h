// Reading the small text files of a model folder (config.json, the safetensors index,
// tokenizer.json and its config) whole, safely: only a regular file is read (a FIFO would
// block forever, /dev/zero would never end, a directory is not a config), never more than
// a cap fitting what the file can be, and every failure names the path and its cause
// (the errno text). Header-only so that the models and the tokenizer libraries share it
// without one depending on the other.
#ifndef STEPGRAPH_BASE_SMALL_FILE_H_
#define STEPGRAPH_BASE_SMALL_FILE_H_

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <new>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace sg {

// Caps: a config.json is a few kilobytes, an index lists a few thousand tensors, a
// tokenizer.json of a 256k-token vocabulary is about 40 MiB.
inline constexpr int64_t kMaxConfigFileBytes = int64_t{1} << 20;
inline constexpr int64_t kMaxIndexFileBytes = int64_t{64} << 20;
inline constexpr int64_t kMaxTokenizerFileBytes = int64_t{256} << 20;

namespace internal {

inline absl::string_view FileTypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Closes `fd` on every way out.
struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

}  // namespace internal

// The whole of the file at `path`. `what` names it in messages ("config file"). Errors:
// the errno-derived code of open/fstat/read (NotFound, PermissionDenied, ...) with the
// errno text; InvalidArgument when it is not a regular file or is larger than
// `max_bytes`; ResourceExhausted when its bytes cannot be allocated.
inline absl::StatusOr<std::string> ReadSmallFile(const std::string& path, int64_t max_bytes,
                                                 absl::string_view what) {
  auto errno_error = [&](int err, absl::string_view verb) {
    // ErrnoToStatus appends the errno text ("No such file or directory").
    return absl::ErrnoToStatus(err, absl::StrCat("cannot ", verb, " ", what, " ", path));
  };
  // O_NONBLOCK so that opening a FIFO does not wait for a writer; it is refused below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return errno_error(errno, "open");
  const internal::FdCloser closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return errno_error(errno, "stat");
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is ",
                                                   internal::FileTypeName(st.st_mode),
                                                   ", not a regular file"));
  }
  if (st.st_size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is ", st.st_size,
                                                   " bytes, more than the ", max_bytes,
                                                   " such a file may have"));
  }
  std::string data;
  try {
    data.resize(static_cast<size_t>(st.st_size));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot read ", what, " ", path, ": out of memory for ", st.st_size,
                     " bytes"));
  }
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t got = ::read(fd, data.data() + done, data.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return errno_error(errno, "read");
    if (got == 0) break;  // the file shrank since fstat: what is there is the file
    done += static_cast<size_t>(got);
  }
  data.resize(done);
  return data;
}

}  // namespace sg

#endif  // STEPGRAPH_BASE_SMALL_FILE_H_
