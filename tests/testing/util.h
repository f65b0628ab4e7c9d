// Helpers shared by stepgraph's tests: host tensors of any dtype filled with random
// values (never zeros), poisoning, and the normalised error every numeric check uses.
#ifndef STEPGRAPH_TESTS_TESTING_UTIL_H_
#define STEPGRAPH_TESTS_TESTING_UTIL_H_

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "stepgraph/dispatch/executor.h"
#include "stepgraph/graph/memory_plan.h"
#include "stepgraph/graph/types.h"

namespace sg::testing {

// Whether this build runs under AddressSanitizer (tools/sanitize.sh, CI): a few tests
// whose size only serves a time bound do less work there, and assert no time.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitizedBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif
#else
inline constexpr bool kSanitizedBuild = false;
#endif

// A host buffer holding one tensor in its storage dtype, 256-byte aligned. Quantized
// tensors (GGUF block formats) are filled by quantizing f32 values row by row and read
// back dequantized.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, Shape shape);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t bytes() const;
  int64_t size() const { return shape_.NumElements(); }
  void* data() { return storage_.get(); }
  const void* data() const { return storage_.get(); }

  // Uniform in [lo, hi), rounded to the dtype (quantized: valid random blocks); i32
  // tensors get integers in [lo, hi).
  void FillUniform(uint64_t seed, float lo = -1.0f, float hi = 1.0f);
  void FillFrom(const std::vector<float>& values);
  // Every byte 0xFF: NaN for floats, -1 for i32, so an unwritten element fails a check.
  void Poison();
  // Values converted to f32 (i32 converted exactly for small values).
  std::vector<float> ToFloat() const;
  float At(int64_t i) const;

 private:
  DType dtype_ = DType::kF32;
  Shape shape_;
  std::unique_ptr<std::byte[], void (*)(std::byte*)> storage_{nullptr, [](std::byte*) {}};
};

// ‖got − want‖ / ‖want‖ (want of all zeros: ‖got‖). NaN or inf anywhere gives +inf.
double NormalizedError(const std::vector<float>& got, const std::vector<double>& want);
double NormalizedError(const std::vector<float>& got, const std::vector<float>& want);

// Host buffers for every bound tensor of a plan plus the arena, bound and ready to
// execute on the CPU reference or the mock. Weights get uniform values in
// [-scale, scale) (norm weights around 1), states zeros, inputs must be set by the test.
class HostBindings {
 public:
  explicit HostBindings(const ExecutionPlan& plan, uint64_t seed = 1, float scale = 0.1f);

  Bindings& bindings() { return bindings_; }
  HostTensor& tensor(absl::string_view name);
  // The arena bytes of an intermediate output, as f32.
  std::vector<float> Read(const ExecutionPlan& plan, absl::string_view output_name) const;

 private:
  Bindings bindings_;
  std::vector<std::byte> arena_;
  std::vector<std::pair<std::string, std::unique_ptr<HostTensor>>> tensors_;
};

// Where tests keep files fetched once outside the repository (the real SmolLM2 model:
// tests/fixtures/fetch_smollm2.sh): $XDG_CACHE_HOME/stepgraph-test, else
// $HOME/.cache/stepgraph-test.
std::string TestCacheDir();

}  // namespace sg::testing

#endif  // STEPGRAPH_TESTS_TESTING_UTIL_H_
