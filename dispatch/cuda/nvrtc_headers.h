// The headers NVRTC compiles the generated kernels with (codegen.h): stepgraph's own
// device headers (kernels/device_common.cuh, kernels/rms_norm_row.cuh), the very files nvcc
// compiles the built-in kernels from, and the toolkit's cuda_fp16 and cuda_bf16 headers
// they include, all embedded in the library at build time (embed_nvrtc_headers.cmake), so
// that device code exists once and a program needs no toolkit folder at run time. Every
// program is compiled with all of them; the kernel cache's keys include their digest, so
// a change to any of them compiles anew.
#ifndef STEPGRAPH_DISPATCH_CUDA_NVRTC_HEADERS_H_
#define STEPGRAPH_DISPATCH_CUDA_NVRTC_HEADERS_H_

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace sg::internal {

struct NvrtcHeader {
  const char* include_name;  // as a program includes it: "kernels/device_common.cuh"
  absl::string_view text;   // text.data() is null-terminated, as NVRTC takes it
};

absl::Span<const NvrtcHeader> NvrtcHeaders();

// SHA-256 (hex) over every header's include name and text.
absl::string_view NvrtcHeadersDigest();

}  // namespace sg::internal

#endif  // STEPGRAPH_DISPATCH_CUDA_NVRTC_HEADERS_H_
