// MappedFile: a whole model file mapped read-only (see mapped_file.h).
#include "models/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"

namespace sg {
namespace {

absl::Status ErrnoError(int err, absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", path));
}

}  // namespace

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  // O_NONBLOCK so that a FIFO given by mistake is refused below instead of blocking the
  // open; it changes nothing for regular files.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoError(errno, "cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(err, "cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  MappedFile f;
  f.path_ = path;
  f.size_ = static_cast<size_t>(st.st_size);
  if (f.size_ > 0) {
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      f.size_ = 0;
      return ErrnoError(err, "cannot map", path);
    }
    f.data_ = static_cast<const std::byte*>(p);
  }
  // The mapping keeps the file alive; the descriptor is no longer needed.
  ::close(fd);
  return f;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      path_(std::move(other.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
  }
  return *this;
}

MappedFile::~MappedFile() { Reset(); }

void MappedFile::Reset() noexcept {
  if (data_ != nullptr) {
    // munmap of a mapping we made with its own size cannot fail short of a bug; there is
    // nothing a destructor could do about it, so it is ignored.
    ::munmap(const_cast<std::byte*>(data_), size_);
  }
  data_ = nullptr;
  size_ = 0;
}

}  // namespace sg
