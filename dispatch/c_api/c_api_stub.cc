// The C ABI of a build without CUDA (STEPGRAPH_WITH_CUDA=OFF): the same header and symbols,
// so that a caller links and loads either library alike and learns at run time that there
// is no GPU. Every function that would touch the GPU returns STEPGRAPH_ERROR_NO_CUDA
// whatever its arguments; the host-only functions are in c_api_common.cc.
#include <cstdint>

#include "stepgraph/c_api.h"

extern "C" {

int32_t stepgraph_embedding(const void*, const int32_t*, void*, int64_t, int64_t, int64_t,
                            int32_t, uint32_t*, void*) noexcept {
  return STEPGRAPH_ERROR_NO_CUDA;
}

int32_t stepgraph_matmul(const void*, const void*, const void*, void*, int64_t, int64_t,
                         int64_t, int32_t, void*) noexcept {
  return STEPGRAPH_ERROR_NO_CUDA;
}

int32_t stepgraph_rmsnorm(const void*, const void*, void*, int64_t, int64_t, float, int32_t,
                          void*) noexcept {
  return STEPGRAPH_ERROR_NO_CUDA;
}

int32_t stepgraph_add(const void*, const void*, void*, int64_t, int32_t, void*) noexcept {
  return STEPGRAPH_ERROR_NO_CUDA;
}

int32_t stepgraph_mul(const void*, const void*, void*, int64_t, int32_t, void*) noexcept {
  return STEPGRAPH_ERROR_NO_CUDA;
}

int32_t stepgraph_silu(const void*, void*, int64_t, int32_t, void*) noexcept {
  return STEPGRAPH_ERROR_NO_CUDA;
}

int32_t stepgraph_silu_mul(const void*, const void*, void*, int64_t, int32_t, void*) noexcept {
  return STEPGRAPH_ERROR_NO_CUDA;
}

int32_t stepgraph_rope(const void*, const int32_t*, const float*, void*, int64_t, int64_t,
                       int64_t, int32_t, int32_t, void*) noexcept {
  return STEPGRAPH_ERROR_NO_CUDA;
}

int32_t stepgraph_kv_write(const void*, const int32_t*, void*, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int32_t, uint32_t*, void*) noexcept {
  return STEPGRAPH_ERROR_NO_CUDA;
}

int32_t stepgraph_attention_workspace_bytes(int64_t, int64_t, int64_t, int64_t, int64_t,
                                            int64_t*) noexcept {
  return STEPGRAPH_ERROR_NO_CUDA;
}

int32_t stepgraph_attention(const void*, const void*, const void*, const int32_t*, void*,
                            int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float,
                            int32_t, void*, int64_t, uint32_t*, void*) noexcept {
  return STEPGRAPH_ERROR_NO_CUDA;
}

int32_t stepgraph_softmax(const void*, void*, int64_t, int64_t, int32_t, void*) noexcept {
  return STEPGRAPH_ERROR_NO_CUDA;
}

int32_t stepgraph_argmax_workspace_bytes(int64_t, int64_t, int64_t*) noexcept {
  return STEPGRAPH_ERROR_NO_CUDA;
}

int32_t stepgraph_argmax(const void*, int32_t*, int64_t, int64_t, int32_t, void*, int64_t,
                         void*) noexcept {
  return STEPGRAPH_ERROR_NO_CUDA;
}

int32_t stepgraph_sample(const void*, const int32_t*, const int32_t*, int32_t*, int64_t,
                         int64_t, float, int32_t, float, int32_t, void*) noexcept {
  return STEPGRAPH_ERROR_NO_CUDA;
}

int32_t stepgraph_copy(const void*, void*, int64_t, int32_t, void*) noexcept {
  return STEPGRAPH_ERROR_NO_CUDA;
}

int32_t stepgraph_advance(int32_t*, int64_t, void*) noexcept { return STEPGRAPH_ERROR_NO_CUDA; }

}  // extern "C"
