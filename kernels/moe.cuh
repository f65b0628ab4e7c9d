// Launchers for the mixture-of-experts ops past the choice of experts (MoeTopK runs on
// kernels/topk.cuh): MoeRouteWeights, MoeMatMul and MoeCombine, with the semantics and
// roundings of include/stepgraph/graph/ops.h and the CPU reference. Every launch reads the
// expert ids from device memory, so its grid depends on the shapes only and a captured
// step replays whatever the routing. An id outside [0, experts) raises
// kErrorExpertOutOfRange in *error_flags where the op says so and is never read through.
// One launch on `stream`; the result is the launch's error.
#ifndef STEPGRAPH_KERNELS_MOE_CUH_
#define STEPGRAPH_KERNELS_MOE_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/launch.h"
#include "stepgraph/base/dtype.h"

namespace sg::kernels {

// The most chosen experts per row MoeCombine takes (its order of the slots lives in
// shared memory).
inline constexpr int64_t kMoeCombineMaxTopK = 256;
// Output columns one block of MoeMatMul computes (a warp each); N is taken up to
// 65535 · kMoeMatMulCols.
inline constexpr int64_t kMoeMatMulCols = 8;

// weights [rows, top_k] f32 from logits [rows, experts] (`dtype`: f32, bf16, f16) and ids
// [rows, top_k]: softmax over every expert in f32, the chosen ones' probabilities,
// divided by their sum when `renormalize`, rounded to `dtype` when `round_to_dtype`.
// rows, experts and top_k within 32 bits.
cudaError_t LaunchMoeRouteWeights(const void* logits, DType dtype, const int32_t* ids,
                                  float* weights, int64_t rows, int64_t experts, int64_t top_k,
                                  bool renormalize, bool round_to_dtype, uint32_t* error_flags,
                                  Stream stream);

// Whether LaunchMoeMatMul takes these sizes and dtypes (x's `dtype` f32, bf16 or f16; w of
// that dtype or a block format with k a multiple of its block).
bool MoeMatMulTakes(int64_t rows, int64_t experts, int64_t n, int64_t k, int64_t top_k,
                    DType dtype, DType w_dtype);

// y [rows, top_k · n] (`dtype`): y[i, j·n + c] = x_ij · w[ids[i, j], c, :], an f32 dot
// product rounded once, where x_ij is row i of x [rows, k] or, when `per_slot`, its slot j
// of x [rows, top_k · k]. w [experts, n, k] of `dtype` or in block format `w_dtype`, held
// whole in the device layout of kernels/quant_blocks.cuh (its planes span every expert)
// at a 16-byte aligned address. A bad id gives zeros. cudaErrorInvalidValue where
// MoeMatMulTakes says no; cudaErrorMisalignedAddress for a block-format w not 16-byte
// aligned. With `w_up` (w's shape and format; not per_slot) each output is instead
// silu(g)·u of the two products (the gate experts w, the up experts w_up), each rounded to
// `dtype` first, as ops::MoeMatMul's silu_mul. The blocks walk by expert (each expert's
// matrix read once per tile of 32 of its pairs) when rows · top_k holds at least
// `by_expert_pairs` pairs per expert (0: always; CudaOptions::moe_by_expert_pairs) and k is
// a multiple of 32; below it, a block per pair.
cudaError_t LaunchMoeMatMul(const void* x, const void* w, DType w_dtype, const int32_t* ids,
                            void* y, int64_t rows, int64_t experts, int64_t n, int64_t k,
                            int64_t top_k, bool per_slot, DType dtype, uint32_t* error_flags,
                            Stream stream, const void* w_up, int64_t by_expert_pairs);

// Whether LaunchMoeMatMul walks by expert for `pairs` (rows · top_k) pairs over `experts`
// experts and this k (the rule its comment gives); the dispatcher asks it too.
bool MoeMatMulWalksByExpert(int64_t pairs, int64_t experts, int64_t k, int64_t by_expert_pairs);

// MoeCombine's `route`: the weights computed from the router's logits [rows, experts]
// as LaunchMoeRouteWeights computes them (the same bits); error_flags nullable.
struct MoeCombineRoute {
  int64_t experts = 0;
  bool renormalize = true, round_to_dtype = false;
  uint32_t* error_flags = nullptr;
};

// out [rows, n] (`dtype`) = Σ_j weights[i, j] · y[i, j·n ..], y [rows, top_k · n] of
// `dtype`, weights [rows, top_k] of `weights_dtype` (float dtypes), the terms taken in
// ascending ids[i, j] (ties by slot), each term and each partial sum rounded to `dtype`:
// bit for bit the CPU reference. top_k up to kMoeCombineMaxTopK. With `residual` [rows, n]
// of `dtype` (nullable; it may be out itself): out = residual + that sum, added in f32 and
// rounded once, as Add. With `route` (nullable), `weights` is the router's logits [rows,
// route->experts] of `weights_dtype` and the weights are computed from them in the launch.
cudaError_t LaunchMoeCombine(const void* y, DType dtype, const void* weights,
                             DType weights_dtype, const int32_t* ids, void* out, int64_t rows,
                             int64_t n, int64_t top_k, Stream stream,
                             const void* residual = nullptr,
                             const MoeCombineRoute* route = nullptr);

}  // namespace sg::kernels

#endif  // STEPGRAPH_KERNELS_MOE_CUH_
