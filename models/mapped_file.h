// MappedFile: a model file (safetensors, GGUF) mapped read-only, so that weights are bound
// where they lie instead of being copied, or copied whole into memory of its own.
//
// A mapping reads the file each time a page is first touched. If the file is truncated
// while it is mapped (rewritten in place, a download restarted over it), a read past its
// new end raises SIGBUS and ends the process, as with any mmap loader. Two defences:
// MapOptions::copy reads the file once into anonymous memory, which no later change to the
// file can touch (the price is the file's size in resident memory and one read at load);
// and Prefault, which the loaders call on the bytes they parse first, turns a truncation
// that happened before it into an error instead of a signal. Replace model files by
// renaming a new file over the old one (what download tools do), never by writing in place.
#ifndef STEPGRAPH_MODELS_MAPPED_FILE_H_
#define STEPGRAPH_MODELS_MAPPED_FILE_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace sg {

struct MapOptions {
  // Read the whole file into private memory instead of mapping it (see above).
  bool copy = false;
};

// A whole file mapped read-only (or copied). Move-only; the destructor unmaps. The bytes
// stay at the same address for the object's life, moves included, so spans into them stay
// valid.
class MappedFile {
 public:
  // NotFound (or another errno-derived code) naming the path when it cannot be opened;
  // InvalidArgument when it is not a regular file; with copy, DataLoss when the file
  // shrinks while it is read. An empty file maps to no bytes.
  static absl::StatusOr<MappedFile> Open(const std::string& path, const MapOptions& options = {});

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  absl::Span<const std::byte> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }
  bool copied() const { return copied_; }

  // Reads bytes [offset, offset + size) (clamped to the file) into memory now. DataLoss
  // naming the file when they are no longer in it (it was truncated after it was mapped),
  // where touching them would raise SIGBUS. Kernels before Linux 5.14 cannot tell: there it
  // checks nothing and returns Ok. Always Ok for a copy.
  absl::Status Prefault(size_t offset, size_t size) const;

 private:
  void Reset() noexcept;

  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  bool copied_ = false;
  std::string path_;
};

}  // namespace sg

#endif  // STEPGRAPH_MODELS_MAPPED_FILE_H_
