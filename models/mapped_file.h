// MappedFile: a model file (safetensors, GGUF) mapped read-only, so that weights are bound
// where they lie instead of being copied.
#ifndef STEPGRAPH_MODELS_MAPPED_FILE_H_
#define STEPGRAPH_MODELS_MAPPED_FILE_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace sg {

// A whole file mapped read-only. Move-only; the destructor unmaps. The bytes stay at the
// same address for the object's life, moves included, so spans into them stay valid.
class MappedFile {
 public:
  // NotFound (or another errno-derived code) naming the path when it cannot be opened;
  // InvalidArgument when it is not a regular file. An empty file maps to no bytes.
  static absl::StatusOr<MappedFile> Open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  absl::Span<const std::byte> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  void Reset() noexcept;

  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace sg

#endif  // STEPGRAPH_MODELS_MAPPED_FILE_H_
