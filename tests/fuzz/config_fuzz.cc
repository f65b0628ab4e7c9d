// libFuzzer harness: any text as a config.json. The parser must return a validated config
// or an error naming the field; never crash, leak or hang.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "models/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<sg::LlamaConfig> config = sg::ParseLlamaConfig(text, "fuzz/config.json");
  if (config.ok() && !config->Validate().ok()) std::abort();  // accepted means valid
  return 0;
}
