// libFuzzer harness: any bytes as a safetensors file. The parser must return tensors whose
// spans lie inside the input, or an error; never crash, leak or hang.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "models/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  absl::StatusOr<std::vector<sg::SafetensorsTensor>> tensors =
      sg::ParseSafetensors(absl::Span<const std::byte>(bytes, size), "fuzz.safetensors");
  if (!tensors.ok()) return 0;
  for (const sg::SafetensorsTensor& t : *tensors) {
    if (t.data.data() < bytes || t.data.data() + t.data.size() > bytes + size) std::abort();
    (void)t.NumElements();
    (void)t.ShapeString();
  }
  return 0;
}
