// The exported device functions of the C ABI, one per declaration of c_api.h, expanded from
// the generated list (c_api_list.inc): check the arguments (c_api_checks.cc, the same in
// both builds), then, in the CUDA build, look for a device and launch (c_api_cuda.cc). A
// build without CUDA compiles this same file with SG_C_API_WITH_CUDA 0: there, a call whose
// arguments pass returns STEPGRAPH_ERROR_NO_CUDA.
#include <cstdint>

#include "c_api/c_api_internal.h"
#include "stepgraph/c_api/c_api.h"

#if SG_C_API_WITH_CUDA
namespace sg::capi {
bool DeviceAvailable() noexcept;  // c_api_cuda.cc
}  // namespace sg::capi
#define SG_C_API_RUN(Name, args) \
  return ::sg::capi::DeviceAvailable() ? ::sg::capi::Run##Name args : STEPGRAPH_ERROR_NO_CUDA
#else
#define SG_C_API_RUN(Name, args) return STEPGRAPH_ERROR_NO_CUDA
#endif

extern "C" {

#define SG_C_API_HOST(Name, c_name, ret, params, args)
#define SG_C_API_DEVICE(Name, c_name, ret, params, args)                               \
  ret c_name params noexcept {                                                         \
    if (const int32_t rc = ::sg::capi::Check##Name args; rc != STEPGRAPH_OK) return rc; \
    SG_C_API_RUN(Name, args);                                                          \
  }
#include "stepgraph/c_api_list.inc"
#undef SG_C_API_HOST
#undef SG_C_API_DEVICE

}  // extern "C"
