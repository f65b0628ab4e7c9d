/* Compiled as C99 with -pedantic -Werror: proves that stepgraph/c_api.h is C, pins every
 * entry point's C signature (a changed signature must fail here, and then bump
 * STEPGRAPH_C_API_VERSION), and makes calls from C code for the C++ tests to judge. */
#include "tests/c_api/header_check.h"

#include <stddef.h>

#include "stepgraph/c_api.h"

typedef int32_t (*EmbeddingFn)(const void*, const int32_t*, void*, int64_t, int64_t, int64_t,
                               int32_t, uint32_t*, void*);
typedef int32_t (*MatmulFn)(const void*, const void*, const void*, void*, int64_t, int64_t,
                            int64_t, int32_t, void*);
typedef int32_t (*RmsNormFn)(const void*, const void*, void*, int64_t, int64_t, float, int32_t,
                             void*);
typedef int32_t (*BinaryFn)(const void*, const void*, void*, int64_t, int32_t, void*);
typedef int32_t (*UnaryFn)(const void*, void*, int64_t, int32_t, void*);
typedef int32_t (*RopeInvFreqFn)(int32_t, float, int32_t, float, float, float, int32_t, float*);
typedef int32_t (*RopeFn)(const void*, const int32_t*, const float*, void*, int64_t, int64_t,
                          int64_t, int32_t, int32_t, void*);
typedef int32_t (*KvWriteFn)(const void*, const int32_t*, void*, int64_t, int64_t, int64_t,
                             int64_t, int64_t, int32_t, uint32_t*, void*);
typedef int32_t (*AttentionBytesFn)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t*);
typedef int32_t (*AttentionFn)(const void*, const void*, const void*, const int32_t*, void*,
                               int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float,
                               int32_t, void*, int64_t, uint32_t*, void*);
typedef int32_t (*SoftmaxFn)(const void*, void*, int64_t, int64_t, int32_t, void*);
typedef int32_t (*ArgmaxBytesFn)(int64_t, int64_t, int64_t*);
typedef int32_t (*ArgmaxFn)(const void*, int32_t*, int64_t, int64_t, int32_t, void*, int64_t,
                            void*);
typedef int32_t (*SampleFn)(const void*, const int32_t*, const int32_t*, int32_t*, int64_t,
                            int64_t, float, int32_t, float, int32_t, void*);
typedef int32_t (*AdvanceFn)(int32_t*, int64_t, void*);
typedef int32_t (*VersionFn)(void);
typedef const char* (*ErrorStringFn)(int32_t);

static const EmbeddingFn kEmbedding = &stepgraph_embedding;
static const MatmulFn kMatmul = &stepgraph_matmul;
static const RmsNormFn kRmsNorm = &stepgraph_rmsnorm;
static const BinaryFn kAdd = &stepgraph_add;
static const BinaryFn kMul = &stepgraph_mul;
static const UnaryFn kSilu = &stepgraph_silu;
static const BinaryFn kSiluMul = &stepgraph_silu_mul;
static const RopeInvFreqFn kRopeInvFreq = &stepgraph_rope_inv_freq;
static const RopeFn kRope = &stepgraph_rope;
static const KvWriteFn kKvWrite = &stepgraph_kv_write;
static const AttentionBytesFn kAttentionBytes = &stepgraph_attention_workspace_bytes;
static const AttentionFn kAttention = &stepgraph_attention;
static const SoftmaxFn kSoftmax = &stepgraph_softmax;
static const ArgmaxBytesFn kArgmaxBytes = &stepgraph_argmax_workspace_bytes;
static const ArgmaxFn kArgmax = &stepgraph_argmax;
static const SampleFn kSample = &stepgraph_sample;
static const UnaryFn kCopy = &stepgraph_copy;
static const AdvanceFn kAdvance = &stepgraph_advance;
static const VersionFn kVersion = &stepgraph_abi_version;
static const ErrorStringFn kErrorString = &stepgraph_error_string;

int sg_c_api_null_pointer_calls(int32_t* codes, int capacity) {
  /* Never dereferenced: every call below has a NULL and is refused before any launch. */
  void* const p = (void*)(size_t)0x100000;
  int32_t* const ids = (int32_t*)p;
  uint32_t* const flags = (uint32_t*)p;
  const int32_t f32 = STEPGRAPH_F32;
  int32_t all[17];
  int n = 0, i;
  all[n++] = kEmbedding(p, NULL, p, 4, 100, 64, f32, flags, NULL);
  all[n++] = kMatmul(p, NULL, NULL, p, 1, 64, 64, f32, NULL);
  all[n++] = kRmsNorm(p, p, NULL, 4, 64, 1e-5f, f32, NULL);
  all[n++] = kAdd(p, NULL, p, 64, f32, NULL);
  all[n++] = kMul(NULL, p, p, 64, f32, NULL);
  all[n++] = kSilu(p, NULL, 64, f32, NULL);
  all[n++] = kSiluMul(p, p, NULL, 64, f32, NULL);
  all[n++] = kRope(p, ids, NULL, p, 4, 128, 64, 0, f32, NULL);
  all[n++] = kKvWrite(p, ids, p, 4, 4, 2, 32, 64, f32, NULL, NULL);
  all[n++] = kAttentionBytes(4, 8, 2, 128, 64, NULL);
  all[n++] = kAttention(p, p, NULL, ids, p, 4, 8, 2, 4, 128, 64, 0.125f, f32, NULL, 0, flags,
                        NULL);
  all[n++] = kSoftmax(NULL, p, 4, 64, f32, NULL);
  all[n++] = kArgmaxBytes(4, 1000, NULL);
  all[n++] = kArgmax(p, NULL, 4, 1000, f32, NULL, 0, NULL);
  all[n++] = kSample(p, ids, NULL, ids, 4, 1000, 1.0f, 0, 1.0f, f32, NULL);
  all[n++] = kCopy(p, NULL, 64, f32, NULL);
  all[n++] = kAdvance(NULL, 4, NULL);
  for (i = 0; i < n && i < capacity; ++i) codes[i] = all[i];
  return i;
}

int32_t sg_c_api_rope_inv_freq_from_c(float* inv_freq) {
  return kRopeInvFreq(8, 10000.0f, STEPGRAPH_ROPE_SCALING_NONE, 0.0f, 0.0f, 0.0f, 0, inv_freq);
}

int32_t sg_c_api_loaded_version(void) {
  /* The error strings must be there too, for every code. */
  if (kErrorString(STEPGRAPH_ERROR_INVALID_VALUE) == NULL) return -1;
  return kVersion();
}

int32_t sg_c_api_compiled_version(void) { return STEPGRAPH_C_API_VERSION; }
