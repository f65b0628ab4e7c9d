// Launchers of the C ABI's training kernels: cross entropy (forward and backward), the
// mixture-of-experts load-balancing loss, the AdamW step and global-norm gradient clipping.
// Math in f32; each returns the first launch error. Sizes are checked by the caller (the C
// ABI's argument checks); a launcher refuses only what would not launch.
#ifndef STEPGRAPH_KERNELS_TRAINING_CUH_
#define STEPGRAPH_KERNELS_TRAINING_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/launch.h"
#include "stepgraph/base/dtype.h"

namespace sg::kernels {

// loss[i] = logsumexp(logits[i]) − logits[i, targets[i]]; 0 where targets[i] ==
// ignore_index; a target outside [0, vocab) otherwise gives 0 and ORs token_flag into
// *error_flags. log_probs (may be null) [rows, vocab] of dtype = logits − logsumexp.
cudaError_t LaunchCrossEntropy(const void* logits, const int32_t* targets, float* loss,
                               void* log_probs, int64_t rows, int64_t vocab,
                               int32_t ignore_index, DType dtype, uint32_t* error_flags,
                               uint32_t token_flag, Stream stream);

// dlogits[i, j] = dloss[i] · (softmax(logits[i])_j − [j == targets[i]]); zero rows where
// the target is ignore_index or out of range (which raises token_flag).
cudaError_t LaunchCrossEntropyBackward(const void* logits, const int32_t* targets,
                                       const float* dloss, void* dlogits, int64_t rows,
                                       int64_t vocab, int32_t ignore_index, DType dtype,
                                       uint32_t* error_flags, uint32_t token_flag,
                                       Stream stream);

// *loss = experts · Σ_e (count_e / tokens) · (Σ_t router_probs[t, e] / tokens), count_e the
// number of (token, choice) pairs of expert_ids [tokens, top_k] naming e. An id outside
// [0, experts) is not counted and raises token_flag. experts <= kMoeMaxExperts.
constexpr int64_t kMoeMaxExperts = 4096;
cudaError_t LaunchMoeAuxLoss(const void* router_probs, const int32_t* expert_ids, float* loss,
                             int64_t tokens, int64_t experts, int64_t top_k, DType dtype,
                             uint32_t* error_flags, uint32_t token_flag, Stream stream);

// One AdamW step over n f32 parameters with the gradient of `grad_dtype`, in place:
//   param *= decay; m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²;
//   param −= step_size · m / (sqrt(v) / bc2_sqrt + eps)
// with decay = 1 − lr·weight_decay, step_size = lr / (1 − β1^step), bc2_sqrt =
// sqrt(1 − β2^step), computed by the caller in double.
cudaError_t LaunchAdamW(float* param, const void* grad, float* exp_avg, float* exp_avg_sq,
                        int64_t n, float beta1, float beta2, float eps, float decay,
                        float step_size, float bc2_sqrt, DType grad_dtype,
                        Stream stream);

// *total_norm = sqrt(Σ over the buffers of g²); then each buffer is scaled in place by
// min(1, max_norm / (total_norm + 1e-6)).
cudaError_t LaunchClipGradNorm(void* const* grads, const int64_t* sizes, int64_t count,
                               float max_norm, DType dtype, float* total_norm,
                               Stream stream);

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_TRAINING_CUH_
