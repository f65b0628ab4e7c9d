// Helpers of the C ABI's GPU suites: device buffers, a test fixture with a stream and an
// error word, and the dtype helpers. Every suite that uses them skips without a device.
#ifndef STEPGRAPH_TESTS_C_API_GPU_UTIL_H_
#define STEPGRAPH_TESTS_C_API_GPU_UTIL_H_

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>

#include "stepgraph/c_api/c_api.h"
#include "stepgraph/base/dtype.h"
#include "tests/testing/util.h"

namespace sg::testing {

inline constexpr int32_t kOk = STEPGRAPH_OK;
inline constexpr int32_t kFloatDTypes[] = {STEPGRAPH_F32, STEPGRAPH_BF16, STEPGRAPH_F16};

inline DType ToDType(int32_t c_dtype) { return static_cast<DType>(c_dtype); }
inline absl::string_view Name(int32_t c_dtype) { return DTypeName(ToDType(c_dtype)); }
inline double Tol(int32_t c_dtype) { return c_dtype == STEPGRAPH_F32 ? 1e-5 : 1e-2; }

inline bool HasDevice() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

// One cudaMalloc'd buffer, freed on destruction.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t bytes) : bytes_(std::max<int64_t>(bytes, 1)) {
    EXPECT_EQ(cudaMalloc(&ptr_, static_cast<size_t>(bytes_)), cudaSuccess);
  }
  // A copy of `host`.
  explicit DeviceBuffer(const HostTensor& host) : DeviceBuffer(host.bytes()) {
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), host.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    Settle();
  }
  ~DeviceBuffer() { (void)cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  // Every byte 0xFF: NaN for floats, -1 for ids, so an unwritten element fails a check.
  void Poison() {
    EXPECT_EQ(cudaMemset(ptr_, 0xFF, static_cast<size_t>(bytes_)), cudaSuccess);
    Settle();
  }
  void Zero() {
    EXPECT_EQ(cudaMemset(ptr_, 0, static_cast<size_t>(bytes_)), cudaSuccess);
    Settle();
  }
  // Into `host`, whose size says how many bytes.
  void CopyTo(HostTensor& host) const {
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, host.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  }

 private:
  // cudaMemset and a pageable cudaMemcpy to the device may still be in flight when they
  // return, on the legacy stream, which the tests' non-blocking stream does not wait for.
  static void Settle() { EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess); }

  void* ptr_ = nullptr;
  int64_t bytes_;
};

class CApiGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HasDevice()) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    flags_ = std::make_unique<DeviceBuffer>(sizeof(uint32_t));
    flags_->Zero();
  }
  void TearDown() override {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }

  void Sync() { ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess); }
  uint32_t* flags() { return flags_->as<uint32_t>(); }
  // The error word after the stream's work, then zero again.
  uint32_t TakeFlags() {
    uint32_t f = 0xdeadbeef;
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(&f, flags(), sizeof(f), cudaMemcpyDeviceToHost), cudaSuccess);
    flags_->Zero();
    return f;
  }

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<DeviceBuffer> flags_;
};

}  // namespace sg::testing

#endif  // STEPGRAPH_TESTS_C_API_GPU_UTIL_H_
