// The C ABI of stepgraph (library stepgraph_c, libstepgraph_c.so): each kernel family as a
// plain `int32_t stepgraph_<op>(...)` for callers in other languages (ctypes, cffi, Rust,
// Julia, ...). This header is the single source of truth for the signatures; it compiles
// as C99 and as C++, and exposes nothing but C types.
//
// It is also the one list of the library's functions: the build reads the declarations
// below (each one `STEPGRAPH_C_EXPORT` or `STEPGRAPH_C_HOST`, a return type, the name and
// its parameters, ending in `STEPGRAPH_C_NOEXCEPT;`) and derives from them the entry points
// of both builds, the export check, the dlopen test's symbol list, the C header check and
// the Python and Rust signature checks (c_api/c_api_list.cmake). Adding a
// function is its declaration here, its argument check (c_api/c_api_checks.cc)
// and its launch (c_api/c_api_cuda.cc).
//
// Conventions, for every function below unless it says otherwise:
//   - Tensor pointers are device memory (cudaMalloc or managed), row-major and dense,
//     aligned to their element size. `const` pointers are read, the others written.
//     Sizes are element counts (int64_t), never bytes, and must be positive. Outputs must
//     not overlap inputs (the kernels read through restrict pointers), except the buffers
//     that a function updates in place (kv_write's cache, advance's pos).
//   - `stream` is a cudaStream_t of the current device; NULL means the default stream.
//     A call only enqueues work: it returns before the work ends and never synchronises,
//     so calls can be recorded by stream capture into a CUDA graph.
//   - `dtype` is one of STEPGRAPH_F32, STEPGRAPH_BF16, STEPGRAPH_F16 (float ops; math in
//     f32) or STEPGRAPH_I32 where a function says so. Ids and positions are always int32.
//   - Every tensor holds at most STEPGRAPH_MAX_ELEMENTS elements.
//   - `error_flags` points to one device uint32_t the kernel ORs STEPGRAPH_FLAG_* bits into
//     where it refused to read or write out of bounds (a bad token id or position). It is
//     never cleared by the library: zero it, run, read it back when convenient.
//
// Return codes and the order of the checks: every argument is checked first, on the host,
// before anything touches CUDA (STEPGRAPH_ERROR_INVALID_VALUE); then the presence of a
// usable device (STEPGRAPH_ERROR_NO_CUDA); then the launch (STEPGRAPH_ERROR_LAUNCH_FAILED,
// STEPGRAPH_ERROR_OUT_OF_MEMORY). So a bad argument is reported the same with or without a
// GPU. A launch error may also be one left behind by earlier, unrelated CUDA work on the
// thread (cudaGetLastError semantics); after an error that CUDA calls sticky (an illegal
// address, say) the process's CUDA context is unusable and every later call fails.
//
// A build without CUDA (STEPGRAPH_WITH_CUDA=OFF) has the same functions: the argument
// checks are the same code, and a call whose arguments pass returns STEPGRAPH_ERROR_NO_CUDA
// there (bindings take that code as "use a CPU fallback"). The functions marked
// STEPGRAPH_C_HOST run on the host only and behave the same in both builds.
//
// The functions keep no state, take no locks and are safe to call from any thread.
#ifndef STEPGRAPH_C_API_C_API_H_
#define STEPGRAPH_C_API_C_API_H_

#include <stdint.h>

#if defined(__GNUC__)
#define STEPGRAPH_C_EXPORT __attribute__((visibility("default")))
#else
#define STEPGRAPH_C_EXPORT
#endif
// Exported as well; marks the functions that never touch a device.
#define STEPGRAPH_C_HOST STEPGRAPH_C_EXPORT

#ifdef __cplusplus
#define STEPGRAPH_C_NOEXCEPT noexcept
extern "C" {
#else
#define STEPGRAPH_C_NOEXCEPT
#endif

// Bumped whenever a signature or a meaning below changes.
#define STEPGRAPH_C_API_VERSION 2

// Return codes.
#define STEPGRAPH_OK 0
// No device or driver, a device this build has no kernels for, or a build without CUDA.
#define STEPGRAPH_ERROR_NO_CUDA (-1)
#define STEPGRAPH_ERROR_INVALID_VALUE (-2)  // null pointer, bad size, shape, dtype or parameter
#define STEPGRAPH_ERROR_LAUNCH_FAILED (-3)  // CUDA refused or failed the launch
#define STEPGRAPH_ERROR_OUT_OF_MEMORY (-4)

// dtype values (the same numbers as sg::DType).
#define STEPGRAPH_F32 0
#define STEPGRAPH_BF16 1
#define STEPGRAPH_F16 2
#define STEPGRAPH_I32 3

// Bits of *error_flags (the same as sg::ErrorFlag).
#define STEPGRAPH_FLAG_TOKEN_OUT_OF_RANGE 1u  // embedding id outside [0, vocab): zero row
#define STEPGRAPH_FLAG_POSITION_OUT_OF_RANGE 2u  // kv_write / attention pos >= seq_len

// Limits.
#define STEPGRAPH_MAX_ELEMENTS (INT64_C(1) << 36)
#define STEPGRAPH_MATMUL_MAX_ROWS 8
#define STEPGRAPH_ATTENTION_MAX_HEAD_DIM 256
#define STEPGRAPH_MOE_MAX_EXPERTS 4096
#define STEPGRAPH_TOPK_MAX_K 1024
#define STEPGRAPH_FLASH_MAX_HEAD_DIM 256
#define STEPGRAPH_CLIP_MAX_BUFFERS 65536

// RoPE frequency scaling (stepgraph_rope_inv_freq).
#define STEPGRAPH_ROPE_SCALING_NONE 0
#define STEPGRAPH_ROPE_SCALING_LLAMA3 1

// STEPGRAPH_C_API_VERSION of the library actually loaded (compare with the header's).
STEPGRAPH_C_HOST int32_t stepgraph_abi_version(void) STEPGRAPH_C_NOEXCEPT;

// A static, never-NULL English description of a return code ("unknown error code" for
// others).
STEPGRAPH_C_HOST const char* stepgraph_error_string(int32_t code) STEPGRAPH_C_NOEXCEPT;

// out[i, :] = table[ids[i], :]. table [vocab, hidden], ids [rows] int32, out [rows, hidden].
// An id outside [0, vocab) writes a zero row and raises STEPGRAPH_FLAG_TOKEN_OUT_OF_RANGE.
// rows <= 65535. Float dtypes.
STEPGRAPH_C_EXPORT int32_t stepgraph_embedding(const void* table, const int32_t* ids, void* out,
                                               int64_t rows, int64_t vocab, int64_t hidden,
                                               int32_t dtype, uint32_t* error_flags,
                                               void* stream) STEPGRAPH_C_NOEXCEPT;

// y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n]), w in the PyTorch / Hugging Face layout; bias
// may be NULL. The decode-time kernel: it streams w once and takes 1 <= m <=
// STEPGRAPH_MATMUL_MAX_ROWS only; a larger m is STEPGRAPH_ERROR_INVALID_VALUE (use a BLAS).
// Float dtypes, f32 accumulation.
STEPGRAPH_C_EXPORT int32_t stepgraph_matmul(const void* x, const void* w, const void* bias,
                                            void* y, int64_t m, int64_t n, int64_t k,
                                            int32_t dtype, void* stream) STEPGRAPH_C_NOEXCEPT;

// y = round(x · rsqrt(mean(x²) + eps)) · weight per row (Hugging Face's order of rounding).
// x, y [rows, hidden], weight [hidden]; eps finite and >= 0. Float dtypes.
STEPGRAPH_C_EXPORT int32_t stepgraph_rmsnorm(const void* x, const void* weight, void* y,
                                             int64_t rows, int64_t hidden, float eps,
                                             int32_t dtype, void* stream) STEPGRAPH_C_NOEXCEPT;

// y = a + b over n elements. Float dtypes and STEPGRAPH_I32 (wrapping).
STEPGRAPH_C_EXPORT int32_t stepgraph_add(const void* a, const void* b, void* y, int64_t n,
                                         int32_t dtype, void* stream) STEPGRAPH_C_NOEXCEPT;
// y = a · b over n elements. Float dtypes.
STEPGRAPH_C_EXPORT int32_t stepgraph_mul(const void* a, const void* b, void* y, int64_t n,
                                         int32_t dtype, void* stream) STEPGRAPH_C_NOEXCEPT;
// y = x · sigmoid(x) over n elements. Float dtypes.
STEPGRAPH_C_EXPORT int32_t stepgraph_silu(const void* x, void* y, int64_t n, int32_t dtype,
                                          void* stream) STEPGRAPH_C_NOEXCEPT;
// y = silu(gate) · up over n elements (the fused SwiGLU). Float dtypes.
STEPGRAPH_C_EXPORT int32_t stepgraph_silu_mul(const void* gate, const void* up, void* y,
                                              int64_t n, int32_t dtype,
                                              void* stream) STEPGRAPH_C_NOEXCEPT;

// y = alpha · x over n elements (math in f32); alpha finite. Float dtypes.
STEPGRAPH_C_EXPORT int32_t stepgraph_scale(const void* x, void* y, int64_t n, float alpha,
                                           int32_t dtype, void* stream) STEPGRAPH_C_NOEXCEPT;

// Host only: writes the head_dim / 2 RoPE inverse frequencies, computed in f32 exactly as
// Hugging Face does, to the HOST array inv_freq (copy them to the device for
// stepgraph_rope). head_dim even, in [2, 65536]; theta finite and >= 1 (a smaller base
// makes frequencies grow with the dimension, and a tiny one overflows them). scaling is
// STEPGRAPH_ROPE_SCALING_NONE (the last four arguments are then ignored) or
// STEPGRAPH_ROPE_SCALING_LLAMA3 ("rope_type": "llama3": factor > 0, low_freq_factor > 0,
// high_freq_factor > low_freq_factor, all finite, original_max_position > 0). A table with
// a value that is not finite is refused and nothing is written.
STEPGRAPH_C_HOST int32_t stepgraph_rope_inv_freq(int32_t head_dim, float theta,
                                                   int32_t scaling, float factor,
                                                   float low_freq_factor,
                                                   float high_freq_factor,
                                                   int32_t original_max_position,
                                                   float* inv_freq) STEPGRAPH_C_NOEXCEPT;

// Rotates every head of each row of x [rows, cols] by the row's position: pairs
// (j, j + head_dim/2) of each head (Hugging Face's rotate_half), or (2j, 2j + 1) when
// interleaved is 1, turn by pos[i] · inv_freq[j]. pos [rows] int32 (a row with pos < 0 is
// copied unchanged); inv_freq [head_dim / 2] f32 on the device; y [rows, cols].
// cols a multiple of head_dim, head_dim even and at most 65536; interleaved 0 or 1. Float
// dtypes.
STEPGRAPH_C_EXPORT int32_t stepgraph_rope(const void* x, const int32_t* pos,
                                          const float* inv_freq, void* y, int64_t rows,
                                          int64_t cols, int64_t head_dim, int32_t interleaved,
                                          int32_t dtype, void* stream) STEPGRAPH_C_NOEXCEPT;

// Stores row i of kv [rows, kv_heads · head_dim] at position pos[i] of slot i of cache
// [slots, kv_heads, seq_len, head_dim] (slots >= rows), in place. pos < 0 writes nothing;
// pos >= seq_len writes nothing and raises STEPGRAPH_FLAG_POSITION_OUT_OF_RANGE. Float
// dtypes.
STEPGRAPH_C_EXPORT int32_t stepgraph_kv_write(const void* kv, const int32_t* pos, void* cache,
                                              int64_t rows, int64_t slots, int64_t kv_heads,
                                              int64_t seq_len, int64_t head_dim, int32_t dtype,
                                              uint32_t* error_flags,
                                              void* stream) STEPGRAPH_C_NOEXCEPT;

// Sets *bytes to the workspace size with which stepgraph_attention of this shape splits
// the keys as it prefers on the current device (0 when it would not split). Needs the
// device, so it returns STEPGRAPH_ERROR_NO_CUDA without one; the shape rules are
// stepgraph_attention's.
STEPGRAPH_C_EXPORT int32_t stepgraph_attention_workspace_bytes(int64_t rows, int64_t heads,
                                                               int64_t kv_heads,
                                                               int64_t seq_len,
                                                               int64_t head_dim,
                                                               int64_t* bytes)
    STEPGRAPH_C_NOEXCEPT;

// Decode attention: out[i, head h] = softmax(scale · q_h · K[0..pos[i]]ᵀ) · V[0..pos[i]] for
// one query token per row, against slot i of k_cache and v_cache [slots, kv_heads,
// seq_len, head_dim] (slots >= rows). Grouped-query: head h reads kv head h / (heads /
// kv_heads). q and out [rows, heads · head_dim], pos [rows] int32. A row with pos < 0 gets
// zeros; pos >= seq_len gets zeros and raises STEPGRAPH_FLAG_POSITION_OUT_OF_RANGE.
// rows <= 65535; heads a multiple of kv_heads; head_dim even and at most
// STEPGRAPH_ATTENTION_MAX_HEAD_DIM; scale finite and > 0 (usually 1 / sqrt(head_dim)); q, the
// caches and out aligned to two elements. Float dtypes.
// workspace: NULL (workspace_bytes 0) runs each (row, head) in one block, which is slow
// for long contexts; otherwise a 16-byte aligned device buffer of workspace_bytes bytes
// (cudaMalloc's are), of which the
// call uses what lets it split the keys over more blocks, up to the size that
// stepgraph_attention_workspace_bytes gives. Its contents need not be anything: the call
// clears what it uses on `stream` first. Launches that may run at the same time must not
// share a workspace.
STEPGRAPH_C_EXPORT int32_t stepgraph_attention(const void* q, const void* k_cache,
                                               const void* v_cache, const int32_t* pos,
                                               void* out, int64_t rows, int64_t heads,
                                               int64_t kv_heads, int64_t slots,
                                               int64_t seq_len, int64_t head_dim, float scale,
                                               int32_t dtype, void* workspace,
                                               int64_t workspace_bytes, uint32_t* error_flags,
                                               void* stream) STEPGRAPH_C_NOEXCEPT;

// y = exp(x − max) / Σ exp(x − max) per row of x, y [rows, n]. Needs compute capability
// 9.0 (a row is shared by a cluster of blocks). Float dtypes.
STEPGRAPH_C_EXPORT int32_t stepgraph_softmax(const void* x, void* y, int64_t rows, int64_t n,
                                             int32_t dtype, void* stream) STEPGRAPH_C_NOEXCEPT;

// Sets *bytes to the workspace size with which stepgraph_argmax over [rows, vocab] splits
// long rows over several blocks on the current device (0 when it would not split).
// Returns STEPGRAPH_ERROR_NO_CUDA without a device.
STEPGRAPH_C_EXPORT int32_t stepgraph_argmax_workspace_bytes(int64_t rows, int64_t vocab,
                                                            int64_t* bytes)
    STEPGRAPH_C_NOEXCEPT;

// ids[i] = the lowest index among the maxima of row i of logits [rows, vocab]; NaN never
// wins, and a row of NaN or -inf gives 0. rows <= 65535, vocab < 2^31. Float dtypes.
// workspace: NULL (workspace_bytes 0) gives one block per row; a 16-byte aligned buffer
// of at least stepgraph_argmax_workspace_bytes lets long rows be split (a smaller one is
// left unused). Cleared by the call on
// `stream` as for stepgraph_attention; not to be shared by concurrent launches.
STEPGRAPH_C_EXPORT int32_t stepgraph_argmax(const void* logits, int32_t* ids, int64_t rows,
                                            int64_t vocab, int32_t dtype, void* workspace,
                                            int64_t workspace_bytes,
                                            void* stream) STEPGRAPH_C_NOEXCEPT;

// ids[i] drawn from softmax(logits[i] / temperature) restricted to the top_k largest
// (0: no limit; ties by lower index) and then to the smallest prefix of those whose mass
// reaches top_p, with the uniform number fixed by (seeds[i], pos[i]) through a
// counter-based generator: the same inputs give the same ids on every run. top_k = 1 is
// the argmax of logits / temperature. logits [rows, vocab], seeds and pos [rows] int32.
// temperature finite and > 0, top_k >= 0, top_p in (0, 1]; vocab < 2^31. Float dtypes.
STEPGRAPH_C_EXPORT int32_t stepgraph_sample(const void* logits, const int32_t* seeds,
                                            const int32_t* pos, int32_t* ids, int64_t rows,
                                            int64_t vocab, float temperature, int32_t top_k,
                                            float top_p, int32_t dtype,
                                            void* stream) STEPGRAPH_C_NOEXCEPT;

// dst = src, n elements of dtype (any dtype, STEPGRAPH_I32 included), device to device.
// The buffers must not overlap unless they are the same (then nothing is enqueued).
STEPGRAPH_C_EXPORT int32_t stepgraph_copy(const void* src, void* dst, int64_t n, int32_t dtype,
                                          void* stream) STEPGRAPH_C_NOEXCEPT;

// pos[i] += 1 where pos[i] >= 0, in place, over n int32 positions (padding rows with
// pos < 0 stay as they are): the end of a decode step.
STEPGRAPH_C_EXPORT int32_t stepgraph_advance(int32_t* pos, int64_t n,
                                             void* stream) STEPGRAPH_C_NOEXCEPT;

// The k largest of each row of x [rows, n], largest first: values [rows, k] of dtype and
// their indices [rows, k] int32. Ties go to the lower index; NaN ranks above every number
// (torch.topk's order). 1 <= k <= min(n, STEPGRAPH_TOPK_MAX_K); rows, n < 2^31. The kernel
// makes k passes over each row: fast for sampling-sized k. Float dtypes.
STEPGRAPH_C_EXPORT int32_t stepgraph_topk(const void* x, void* values, int32_t* indices,
                                          int64_t rows, int64_t n, int64_t k, int32_t dtype,
                                          void* stream) STEPGRAPH_C_NOEXCEPT;

// Attention over whole sequences (training, prefill): out[b, i, h] = softmax(scale ·
// q[b, i, h] · K[b, j, g]ᵀ) · V[b, j, g] over the keys j <= i when causal is 1 (all j when
// 0), with g = h / (heads / kv_heads) (grouped-query). q and out [batch, seq, heads,
// head_dim], k and v [batch, seq, kv_heads, head_dim] (the projections' layout, not
// transposed). batch and heads <= 65535, seq < 2^31, heads a multiple of kv_heads, head_dim
// <= STEPGRAPH_FLASH_MAX_HEAD_DIM, scale finite and > 0. The online softmax (no score
// matrix), one warp per query: correct for every shape above, not tuned for speed. Float
// dtypes.
STEPGRAPH_C_EXPORT int32_t stepgraph_flash_attention(const void* q, const void* k,
                                                     const void* v, void* out, int64_t batch,
                                                     int64_t seq, int64_t heads,
                                                     int64_t kv_heads, int64_t head_dim,
                                                     float scale, int32_t causal, int32_t dtype,
                                                     void* stream) STEPGRAPH_C_NOEXCEPT;

// ---- General matrix products (cuBLASLt) ----

// C[m, n] = alpha · op(A) · op(B) + beta · C, row-major: op(A) [m, k] is A [m, k], or A
// [k, m] transposed when trans_a is 1; op(B) [k, n] is B [k, n], or B [n, k] transposed when
// trans_b is 1 (trans_b = 1 takes the PyTorch / Hugging Face weight layout [out, in]).
// cuBLASLt with f32 accumulation (no TF32 for f32). With beta = 0, C is only written.
// m, n, k < 2^31; trans_a, trans_b 0 or 1; alpha, beta finite. workspace: NULL
// (workspace_bytes 0) or a 256-byte aligned device buffer that cuBLASLt may use (a few MiB
// let it pick faster algorithms). A cuBLASLt handle is made and freed by every call, which
// costs some microseconds of host time: this is for occasional products, not a step's hot
// path. Float dtypes.
STEPGRAPH_C_EXPORT int32_t stepgraph_gemm(const void* a, const void* b, void* c, int64_t m,
                                          int64_t n, int64_t k, int32_t trans_a,
                                          int32_t trans_b, float alpha, float beta,
                                          int32_t dtype, void* workspace,
                                          int64_t workspace_bytes,
                                          void* stream) STEPGRAPH_C_NOEXCEPT;

// `batch` products as stepgraph_gemm, product i reading A at a + i · stride_a elements, B
// at b + i · stride_b and writing C at c + i · stride_c. stride_a, stride_b >= 0 (0: the
// same matrix for every product); stride_c >= m · n (the outputs must not overlap).
// batch < 2^31; every extent within STEPGRAPH_MAX_ELEMENTS.
STEPGRAPH_C_EXPORT int32_t stepgraph_gemm_batched(const void* a, const void* b, void* c,
                                                  int64_t batch, int64_t m, int64_t n,
                                                  int64_t k, int64_t stride_a,
                                                  int64_t stride_b, int64_t stride_c,
                                                  int32_t trans_a, int32_t trans_b,
                                                  float alpha, float beta, int32_t dtype,
                                                  void* workspace, int64_t workspace_bytes,
                                                  void* stream) STEPGRAPH_C_NOEXCEPT;

// ---- Training: losses and optimizer steps (PyTorch's definitions, math in f32) ----

// Cross entropy of each row of logits [rows, vocab] with its class targets[i] (int32):
// loss[i] = logsumexp(logits[i]) − logits[i, targets[i]] in f32 (PyTorch's
// F.cross_entropy with reduction="none"; average it yourself), 0 where targets[i] ==
// ignore_index. A target outside [0, vocab) that is not ignore_index gives 0 and raises
// STEPGRAPH_FLAG_TOKEN_OUT_OF_RANGE. log_probs: NULL, or [rows, vocab] of dtype receiving
// logits − logsumexp. rows < 2^31; loss [rows] f32. A NaN logit makes its row's loss NaN.
// Float dtypes.
STEPGRAPH_C_EXPORT int32_t stepgraph_cross_entropy(const void* logits, const int32_t* targets,
                                                   float* loss, void* log_probs, int64_t rows,
                                                   int64_t vocab, int32_t ignore_index,
                                                   int32_t dtype, uint32_t* error_flags,
                                                   void* stream) STEPGRAPH_C_NOEXCEPT;

// Its gradient: dlogits[i, j] = dloss[i] · (softmax(logits[i])_j − [j == targets[i]]), a
// zero row where the target is ignore_index or out of range (which raises
// STEPGRAPH_FLAG_TOKEN_OUT_OF_RANGE). dloss [rows] f32 (1 / rows for a mean); dlogits
// [rows, vocab] of dtype. Float dtypes.
STEPGRAPH_C_EXPORT int32_t stepgraph_cross_entropy_backward(const void* logits,
                                                            const int32_t* targets,
                                                            const float* dloss, void* dlogits,
                                                            int64_t rows, int64_t vocab,
                                                            int32_t ignore_index, int32_t dtype,
                                                            uint32_t* error_flags,
                                                            void* stream) STEPGRAPH_C_NOEXCEPT;

// The Switch Transformer load-balancing loss, as Hugging Face's Mixtral computes it:
// *loss = experts · Σ_e f_e · P_e, f_e = (the number of (token, choice) pairs of expert_ids
// [tokens, top_k] naming e) / tokens, P_e = the mean over tokens of router_probs[t, e]
// ([tokens, experts], dtype). An id outside [0, experts) is not counted and raises
// STEPGRAPH_FLAG_TOKEN_OUT_OF_RANGE. experts <= STEPGRAPH_MOE_MAX_EXPERTS, 1 <= top_k <=
// experts; loss is one f32 on the device. One block does the work: meant for the
// per-step router outputs, not for huge batches. Float dtypes.
STEPGRAPH_C_EXPORT int32_t stepgraph_moe_aux_loss(const void* router_probs,
                                                  const int32_t* expert_ids, float* loss,
                                                  int64_t tokens, int64_t experts, int64_t top_k,
                                                  int32_t dtype, uint32_t* error_flags,
                                                  void* stream) STEPGRAPH_C_NOEXCEPT;

// One step of torch.optim.AdamW (amsgrad off) over n f32 parameters in place, with f32
// moments exp_avg and exp_avg_sq (zeros before the first step) and the gradient grad of
// grad_dtype (a float dtype: f32, or bf16/f16 next to f32 master weights). step is the
// step's number, from 1 (bias correction 1 − β^step). lr, eps and weight_decay finite and
// >= 0; beta1 and beta2 in [0, 1).
STEPGRAPH_C_EXPORT int32_t stepgraph_adamw_step(float* param, const void* grad, float* exp_avg,
                                                float* exp_avg_sq, int64_t n, float lr,
                                                float beta1, float beta2, float eps,
                                                float weight_decay, int64_t step,
                                                int32_t grad_dtype,
                                                void* stream) STEPGRAPH_C_NOEXCEPT;

// torch.nn.utils.clip_grad_norm_ (L2): *total_norm (one f32 on the device) = the L2 norm of
// all `count` buffers together, then every buffer is scaled in place by
// min(1, max_norm / (total_norm + 1e-6)). grads and sizes are HOST arrays of count device
// pointers (of dtype, all the same) and their element counts; 1 <= count <=
// STEPGRAPH_CLIP_MAX_BUFFERS, max_norm finite and > 0. The buffers must not overlap.
// Float dtypes.
STEPGRAPH_C_EXPORT int32_t stepgraph_clip_grad_norm(void* const* grads, const int64_t* sizes,
                                                    int64_t count, float max_norm,
                                                    int32_t dtype, float* total_norm,
                                                    void* stream) STEPGRAPH_C_NOEXCEPT;

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // STEPGRAPH_C_API_C_API_H_
