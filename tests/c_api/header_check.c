/* Compiled as C99 with -pedantic -Werror: proves that stepgraph/c_api/c_api.h is C, that the list
 * the build reads from it (c_api_list.inc) gives each function its declared type, and
 * makes calls from C code for the C++ tests to judge. */
#include "tests/c_api/header_check.h"

#include <stddef.h>

#include "stepgraph/c_api/c_api.h"

/* A typed pointer to every function, from the list the build read out of c_api.h: each must
 * have exactly the type the list says (so a declaration the reader misread fails to
 * compile here), and each must be defined (the link). */
#define SG_C_API_HOST(Name, c_name, ret, params, args) static ret(*const k##Name) params = &c_name;
#define SG_C_API_DEVICE SG_C_API_HOST
#include "stepgraph/c_api_list.inc"
#undef SG_C_API_HOST
#undef SG_C_API_DEVICE

/* Converting to void (*)(void) is C's generic function pointer. */
#define SG_C_API_HOST(Name, c_name, ret, params, args) (void (*)(void))k##Name,
#define SG_C_API_DEVICE SG_C_API_HOST
static void (*const kAll[])(void) = {
#include "stepgraph/c_api_list.inc"
};
#undef SG_C_API_HOST
#undef SG_C_API_DEVICE

#define SG_C_API_HOST(Name, c_name, ret, params, args)
#define SG_C_API_DEVICE(Name, c_name, ret, params, args) +1
static const int kDeviceFunctions = 0
#include "stepgraph/c_api_list.inc"
    ;
#undef SG_C_API_HOST
#undef SG_C_API_DEVICE

int sg_c_api_function_count(void) {
  int i, n = 0;
  for (i = 0; i < (int)(sizeof kAll / sizeof kAll[0]); ++i) n += kAll[i] != NULL;
  return n;
}

int sg_c_api_device_function_count(void) { return kDeviceFunctions; }

int sg_c_api_null_pointer_calls(int32_t* codes, int capacity) {
  /* Never dereferenced: every call below has a NULL and is refused before any launch. */
  void* const p = (void*)(size_t)0x100000;
  int32_t* const ids = (int32_t*)p;
  uint32_t* const flags = (uint32_t*)p;
  const int32_t f32 = STEPGRAPH_F32;
  int32_t all[64];
  int n = 0, i;
  all[n++] = kEmbedding(p, NULL, p, 4, 100, 64, f32, flags, NULL);
  all[n++] = kMatmul(p, NULL, NULL, p, 1, 64, 64, f32, NULL);
  all[n++] = kRmsnorm(p, p, NULL, 4, 64, 1e-5f, f32, NULL);
  all[n++] = kAdd(p, NULL, p, 64, f32, NULL);
  all[n++] = kMul(NULL, p, p, 64, f32, NULL);
  all[n++] = kSilu(p, NULL, 64, f32, NULL);
  all[n++] = kSiluMul(p, p, NULL, 64, f32, NULL);
  all[n++] = kRope(p, ids, NULL, p, 4, 128, 64, 0, f32, NULL);
  all[n++] = kKvWrite(p, ids, p, 4, 4, 2, 32, 64, f32, NULL, NULL);
  all[n++] = kAttentionWorkspaceBytes(4, 8, 2, 128, 64, NULL);
  all[n++] = kAttention(p, p, NULL, ids, p, 4, 8, 2, 4, 128, 64, 0.125f, f32, NULL, 0, flags,
                        NULL);
  all[n++] = kSoftmax(NULL, p, 4, 64, f32, NULL);
  all[n++] = kArgmaxWorkspaceBytes(4, 1000, NULL);
  all[n++] = kArgmax(p, NULL, 4, 1000, f32, NULL, 0, NULL);
  all[n++] = kSample(p, ids, NULL, ids, 4, 1000, 1.0f, 0, 1.0f, f32, NULL);
  all[n++] = kCopy(p, NULL, 64, f32, NULL);
  all[n++] = kAdvance(NULL, 4, NULL);
  all[n++] = kScale(NULL, p, 64, 2.0f, f32, NULL);
  all[n++] = kTopk(p, p, NULL, 4, 100, 8, f32, NULL);
  all[n++] = kFlashAttention(p, p, NULL, p, 1, 16, 8, 2, 64, 0.125f, 1, f32, NULL);
  all[n++] = kGemm(p, NULL, p, 4, 4, 4, 0, 0, 1.0f, 0.0f, f32, NULL, 0, NULL);
  all[n++] = kGemmBatched(p, p, NULL, 2, 4, 4, 4, 16, 16, 16, 0, 0, 1.0f, 0.0f, f32, NULL, 0,
                          NULL);
  all[n++] = kCrossEntropy(p, ids, NULL, NULL, 4, 100, -100, f32, flags, NULL);
  all[n++] = kCrossEntropyBackward(p, ids, (const float*)p, NULL, 4, 100, -100, f32, flags,
                                   NULL);
  all[n++] = kMoeAuxLoss(p, NULL, (float*)p, 10, 8, 2, f32, flags, NULL);
  all[n++] = kAdamwStep((float*)p, NULL, (float*)p, (float*)p, 64, 1e-3f, 0.9f, 0.999f, 1e-8f,
                        0.0f, 1, f32, NULL);
  {
    void* grads[1];
    int64_t sizes[1];
    grads[0] = p;
    sizes[0] = 64;
    all[n++] = kClipGradNorm(grads, sizes, 1, 1.0f, f32, NULL, NULL);
  }
  for (i = 0; i < n && i < capacity; ++i) codes[i] = all[i];
  return i;
}

int32_t sg_c_api_rope_inv_freq_from_c(float* inv_freq) {
  return kRopeInvFreq(8, 10000.0f, STEPGRAPH_ROPE_SCALING_NONE, 0.0f, 0.0f, 0.0f, 0, inv_freq);
}

int32_t sg_c_api_loaded_version(void) {
  /* The error strings must be there too, for every code. */
  if (kErrorString(STEPGRAPH_ERROR_INVALID_VALUE) == NULL) return -1;
  return kAbiVersion();
}

int32_t sg_c_api_compiled_version(void) { return STEPGRAPH_C_API_VERSION; }
