// The functions of header_check.c, which is compiled as C99: tests call them to run
// C ABI calls made from C code.
#ifndef STEPGRAPH_TESTS_C_API_HEADER_CHECK_H_
#define STEPGRAPH_TESTS_C_API_HEADER_CHECK_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// The number of functions in c_api.h, all of them and those that touch a device, as the
// list the build reads from it has them.
int sg_c_api_function_count(void);
int sg_c_api_device_function_count(void);

// Calls every entry point that touches the GPU once from C, each with otherwise valid
// arguments and one required pointer NULL, and writes the return codes to codes[0..];
// returns how many it wrote (at most capacity).
int sg_c_api_null_pointer_calls(int32_t* codes, int capacity);

// stepgraph_rope_inv_freq(8, 10000, no scaling) called from C into inv_freq[4].
int32_t sg_c_api_rope_inv_freq_from_c(float* inv_freq);

// stepgraph_abi_version() as C sees it, and STEPGRAPH_C_API_VERSION as C compiled it.
int32_t sg_c_api_loaded_version(void);
int32_t sg_c_api_compiled_version(void);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // STEPGRAPH_TESTS_C_API_HEADER_CHECK_H_
