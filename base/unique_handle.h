// The one deleter of the C handles stepgraph owns (CUDA streams, events, graphs and memory,
// cuBLASLt descriptors, NVRTC programs, PCRE2 patterns): a std::unique_ptr deleter that
// calls the handle's release function and, where that returns a status, logs a failure to
// stderr. A deleter has nobody to return an error to and must not throw. CUDA-free, so
// that host-only code (the tokenizer) owns its handles the same way.
#ifndef STEPGRAPH_BASE_UNIQUE_HANDLE_H_
#define STEPGRAPH_BASE_UNIQUE_HANDLE_H_

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <type_traits>

namespace sg {

namespace internal {
inline void LogReleaseFailure(const char* what, int code) {
  std::fprintf(stderr, "stepgraph: %s failed with code %d while releasing a resource\n", what,
               code);
}

// A string literal as a template argument: the release function's name in the log.
template <size_t N>
struct ReleaseName {
  constexpr ReleaseName(const char (&s)[N]) { std::copy_n(s, N, text); }  // NOLINT: implicit
  char text[N];
};
}  // namespace internal

// Calls `Release(handle)`. A release that returns a status enum (cudaError_t,
// cublasStatus_t, nvrtcResult: success is 0 in each) has a nonzero result logged as
// "<kName> failed with code <n>".
template <typename Handle, auto Release, internal::ReleaseName kName>
struct HandleDeleter {
  void operator()(Handle handle) const noexcept {
    if constexpr (std::is_void_v<decltype(Release(handle))>) {
      Release(handle);
    } else {
      if (const auto result = Release(handle); static_cast<int>(result) != 0) {
        internal::LogReleaseFailure(kName.text, static_cast<int>(result));
      }
    }
  }
};

// The owner of a handle of pointer type `Handle` (cudaStream_t, pcre2_code*, void*, ...).
template <typename Handle, auto Release, internal::ReleaseName kName>
using UniqueHandle =
    std::unique_ptr<std::remove_pointer_t<Handle>, HandleDeleter<Handle, Release, kName>>;

}  // namespace sg

#endif  // STEPGRAPH_BASE_UNIQUE_HANDLE_H_
