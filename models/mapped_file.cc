// MappedFile: a whole model file mapped read-only, or copied (see mapped_file.h).
#include "models/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"

namespace sg {
namespace {

absl::Status ErrnoError(int err, absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", path));
}

// Closes a descriptor on every way out.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// The file's `size` bytes read into fresh anonymous pages, made read-only; nullptr and
// *error set on failure. Anonymous pages keep the same alignment a mapping would have.
void* CopyIntoMemory(int fd, size_t size, const std::string& path, absl::Status* error) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    *error = absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", size, " bytes to copy ", path, " into"));
    return nullptr;
  }
  auto* out = static_cast<char*>(p);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, out + done, std::min<size_t>(size - done, size_t{1} << 30),
                              static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *error = n < 0 ? ErrnoError(errno, "cannot read", path)
                     : absl::DataLossError(absl::StrCat(path, " shrank from ", size, " to ", done,
                                                        " bytes while it was read"));
      ::munmap(p, size);
      return nullptr;
    }
    done += static_cast<size_t>(n);
  }
  ::mprotect(p, size, PROT_READ);  // a failure only leaves the copy writable
  return p;
}

}  // namespace

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path, const MapOptions& options) {
  // O_NONBLOCK so that a FIFO given by mistake is refused below instead of blocking the
  // open; it changes nothing for regular files.
  Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (fd.fd < 0) return ErrnoError(errno, "cannot open", path);
  struct stat st;
  if (::fstat(fd.fd, &st) != 0) return ErrnoError(errno, "cannot stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  MappedFile f;
  f.path_ = path;
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) return f;
  if (options.copy) {
    absl::Status error;
    void* p = CopyIntoMemory(fd.fd, size, path, &error);
    if (p == nullptr) return error;
    f.data_ = static_cast<const std::byte*>(p);
    f.copied_ = true;
  } else {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
    if (p == MAP_FAILED) return ErrnoError(errno, "cannot map", path);
    f.data_ = static_cast<const std::byte*>(p);
  }
  // The mapping keeps the file alive; the descriptor is no longer needed.
  f.size_ = size;
  return f;
}

absl::Status MappedFile::Prefault(size_t offset, size_t size) const {
#ifdef MADV_POPULATE_READ
  if (copied_ || offset >= size_) return absl::OkStatus();
  size = std::min(size, size_ - offset);
  if (size == 0) return absl::OkStatus();
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(data_) + offset;
  const uintptr_t aligned = begin / page * page;
  // MADV_POPULATE_READ faults the pages in as a read would, but reports a page past the
  // end of the file as EFAULT instead of raising SIGBUS.
  if (::madvise(reinterpret_cast<void*>(aligned), begin + size - aligned, MADV_POPULATE_READ) !=
          0 &&
      errno == EFAULT) {
    return absl::DataLossError(absl::StrCat(
        path_, " was truncated after it was mapped: bytes [", offset, ", ", offset + size,
        ") of its ", size_, " are gone (reading them would end the process with SIGBUS); "
        "replace model files by renaming a new file over them, never by writing in place"));
  }
#else
  (void)offset;
  (void)size;
#endif
  return absl::OkStatus();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      copied_(std::exchange(other.copied_, false)),
      path_(std::move(other.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    copied_ = std::exchange(other.copied_, false);
    path_ = std::move(other.path_);
  }
  return *this;
}

MappedFile::~MappedFile() { Reset(); }

void MappedFile::Reset() noexcept {
  if (data_ != nullptr) {
    // munmap of a mapping we made with its own size cannot fail short of a bug; there is
    // nothing a destructor could do about it, so it is ignored. A copy is a mapping too.
    ::munmap(const_cast<std::byte*>(data_), size_);
  }
  data_ = nullptr;
  size_ = 0;
  copied_ = false;
}

}  // namespace sg
