// libstepgraph_c.so loaded by path at run time, its functions found by name, as ctypes,
// cffi or a Rust FFI would: this file includes no stepgraph header (only the names of the
// list the build reads from c_api.h), declares the signatures and constants it calls
// itself from c_api.h's documentation, and is not linked to the library. Built in both builds, against the library that build made (the kernels with
// CUDA, the stub without); the real calls need a GPU and are skipped without one.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#ifdef SG_C_API_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

// What a binding would copy out of the header.
constexpr int32_t kOk = 0, kNoCuda = -1, kInvalid = -2;
constexpr int32_t kF32 = 0;
using VersionFn = int32_t (*)();
using ErrorStringFn = const char* (*)(int32_t);
using AddFn = int32_t (*)(const void*, const void*, void*, int64_t, int32_t, void*);
using ArgmaxFn = int32_t (*)(const void*, int32_t*, int64_t, int64_t, int32_t, void*, int64_t,
                             void*);
using ArgmaxBytesFn = int32_t (*)(int64_t, int64_t, int64_t*);

// Loaded once and never closed, as FFIs keep their libraries.
void* Library() {
  static void* handle = dlopen(SG_C_API_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  return handle;
}

template <typename Fn>
Fn Find(const char* name) {
  return reinterpret_cast<Fn>(dlsym(Library(), name));
}

bool HasDevice() {
#ifdef SG_C_API_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
#else
  return false;
#endif
}

TEST(CApiDlopenTest, LoadsAndFindsEveryEntryPoint) {
  ASSERT_NE(Library(), nullptr) << SG_C_API_LIBRARY << ": " << dlerror();
#define SG_C_API_HOST(Name, c_name, ret, params, args) #c_name,
#define SG_C_API_DEVICE SG_C_API_HOST
  const char* const names[] = {
#include "stepgraph/c_api_list.inc"
  };
#undef SG_C_API_HOST
#undef SG_C_API_DEVICE
  EXPECT_GE(std::size(names), 20u);  // the decode functions at least
  for (const char* name : names) EXPECT_NE(dlsym(Library(), name), nullptr) << name;
}

TEST(CApiDlopenTest, VersionAndErrorStrings) {
  ASSERT_NE(Library(), nullptr) << dlerror();
  const auto version = Find<VersionFn>("stepgraph_abi_version");
  const auto error_string = Find<ErrorStringFn>("stepgraph_error_string");
  ASSERT_NE(version, nullptr);
  ASSERT_NE(error_string, nullptr);
  EXPECT_EQ(version(), 2);
  EXPECT_NE(std::string(error_string(kInvalid)).find("invalid"), std::string::npos);
  EXPECT_EQ(std::string(error_string(12345)), "unknown error code");
}

// Argument errors are -2 before any device check, in both builds, with or without a GPU.
TEST(CApiDlopenTest, ArgumentErrors) {
  ASSERT_NE(Library(), nullptr) << dlerror();
  const auto add = Find<AddFn>("stepgraph_add");
  const auto argmax = Find<ArgmaxFn>("stepgraph_argmax");
  const auto argmax_bytes = Find<ArgmaxBytesFn>("stepgraph_argmax_workspace_bytes");
  ASSERT_NE(add, nullptr);
  ASSERT_NE(argmax, nullptr);
  ASSERT_NE(argmax_bytes, nullptr);
  const int32_t refused = kInvalid;
  std::vector<float> host(256, 1.0f);  // never touched: every call below is refused
  void* p = host.data();
  int32_t ids[4] = {0, 0, 0, 0};
  EXPECT_EQ(add(nullptr, p, p, 64, kF32, nullptr), refused);
  EXPECT_EQ(add(p, p, p, 0, kF32, nullptr), refused);
  EXPECT_EQ(add(p, p, p, -3, kF32, nullptr), refused);
  EXPECT_EQ(add(p, p, p, 64, 42, nullptr), refused);
  EXPECT_EQ(argmax(p, ids, 4, 64, kF32, nullptr, 16, nullptr), refused);  // bytes without buffer
  EXPECT_EQ(argmax(p, nullptr, 4, 64, kF32, nullptr, 0, nullptr), refused);
  EXPECT_EQ(argmax_bytes(4, 64, nullptr), refused);
  if (!HasDevice()) {
    // Valid arguments, no device: -1. (Host pointers: the call must not get that far.)
    int64_t bytes = -7;
    EXPECT_EQ(argmax_bytes(4, 64, &bytes), kNoCuda);
    EXPECT_EQ(bytes, -7);
  }
}

#ifdef SG_C_API_WITH_CUDA
// Device memory made with the CUDA runtime, as the caller's framework would make it.
struct DeviceFloats {
  explicit DeviceFloats(size_t n) { EXPECT_EQ(cudaMalloc(&ptr, n * sizeof(float)), cudaSuccess); }
  ~DeviceFloats() { cudaFree(ptr); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  void* ptr = nullptr;
};

TEST(CApiDlopenTest, RealCallsOnTheGpu) {
  if (!HasDevice()) GTEST_SKIP() << "no CUDA device";
  ASSERT_NE(Library(), nullptr) << dlerror();
  const auto add = Find<AddFn>("stepgraph_add");
  const auto argmax = Find<ArgmaxFn>("stepgraph_argmax");
  ASSERT_NE(add, nullptr);
  ASSERT_NE(argmax, nullptr);

  constexpr int64_t kRows = 3, kVocab = 5000;
  constexpr int64_t kN = kRows * kVocab;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> a(kN), b(kN);
  for (float& v : a) v = dist(rng);
  for (float& v : b) v = dist(rng);
  DeviceFloats da(kN), db(kN), dy(kN), dids(kRows);
  ASSERT_EQ(cudaMemcpy(da.ptr, a.data(), kN * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(db.ptr, b.data(), kN * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(dy.ptr, 0xFF, kN * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(dids.ptr, 0xFF, kRows * 4), cudaSuccess);

  // The default stream (NULL), then argmax over the sums, without a workspace.
  ASSERT_EQ(add(da.ptr, db.ptr, dy.ptr, kN, kF32, nullptr), kOk);
  ASSERT_EQ(argmax(dy.ptr, static_cast<int32_t*>(dids.ptr), kRows, kVocab, kF32, nullptr, 0,
                   nullptr),
            kOk);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<float> y(kN);
  std::vector<int32_t> ids(kRows);
  ASSERT_EQ(cudaMemcpy(y.data(), dy.ptr, kN * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(ids.data(), dids.ptr, kRows * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(y[i], a[i] + b[i]) << i;  // f32 adds are exact
  for (int64_t r = 0; r < kRows; ++r) {
    int32_t best = 0;
    for (int32_t j = 1; j < kVocab; ++j) {
      if (y[r * kVocab + j] > y[r * kVocab + best]) best = j;
    }
    EXPECT_EQ(ids[r], best) << "row " << r;
  }
}
#endif

}  // namespace
