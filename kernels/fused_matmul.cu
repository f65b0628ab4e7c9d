// The fused small-M matmul and the fused RoPE + KV-cache write.
//
// FusedMatmulKernel: block (b, s) computes kFusedCols "product columns" (rows of the
// grouped weights, see ColumnOf) over split s of K, for all M rows. The block's threads
// walk its K range in 16-byte vectors of every weight row (streaming loads, as the plain
// small-M kernel); x is re-read from L1/L2. With a folded RmsNorm the block first computes
// each row's 1/rms over the whole K (x is small and cached) and normalises x on load with
// the reference's roundings: round(round(x·inv_rms)·w_norm). Partial sums meet in shared
// memory; with split-K they go to an f32 workspace and the last block of the column group
// (an atomic ticket after a fence) adds the splits in order, so the result does not depend
// on which block finished last, and resets the ticket for the next launch. The epilogue
// then rounds the product to T (as a MatMul stores it) and adds the residual, applies
// SiluMul, reduces to the row's argmax through per-block bests and a second ticket, or
// rotates q and k and writes k and v into the KV caches (kRopeKvWrite: ColumnOf gives a
// block two whole RoPE pairs, so each thread finds its partner in shared memory).
//
// Block-format weights (GGUF's, in the device layout of kernels/quant_blocks.cuh): the
// same kernel with W = 0. The block's threads walk its K range in units of 32 values of
// each of its four weight rows (one or two 16-byte loads per unit; the 32-value formats
// four threads to a unit, AccumulateUnits says why), dequantize them in registers with
// the quant_blocks.cuh readers and meet activations loaded 8 at a time. Weights all of
// one format run the kernel compiled for that format (kFormat); a launch whose weights
// differ (a Q4_K_M file's q, k in Q4_K and v in Q6_K) runs the one whose blocks take the
// format of their columns' weight (a switch uniform over the block), or, for the pairs
// files mix (kFusedFormatPairs: Q4_K or Q5_K with Q6_K), one compiled for just those two
// formats, which holds fewer registers and runs about twice as fast. Norm, split-K and
// epilogues are the float path's. From FusedMatmulArgs::products on (batches, no folded
// norm), block weights go to the tensor cores instead (kernels/block_mma.cuh): the
// products of all rows first, one launch per run of a format, then the same kernel with
// W = -1 reads them, adds their splits in order and applies the epilogue, 64 rows a launch.
//
// RopeKvWriteKernel: one thread per rotated pair of the q and k heads, plus one per
// element pair of v. Every rotation is RotatePair's (kernels/rope_rotate.cuh), so the
// epilogue and the two kernels round as RopeKernel and the CPU reference do.
#include <algorithm>
#include <cfloat>
#include <cstring>
#include <iterator>
#include <type_traits>

#include "kernels/block_mma.cuh"
#include "kernels/common.cuh"
#include "kernels/fused_matmul.cuh"
#include "kernels/quant_blocks.cuh"
#include "kernels/rope_rotate.cuh"
#include "stepgraph/base/error_flags.h"

namespace sg::kernels {
namespace {

constexpr int kMaxWarps = 8;
constexpr int kThreads = 256;

// The product column computed by slot c of column block b: consecutive columns, except
// for kSiluMul, where the first half of the slots are gate columns h·b .. h·b + h - 1 and
// the second half the matching up columns n + h·b .. (h = kFusedCols / 2; the product's
// columns are gate's then up's), and for kRopeKvWrite's q and k heads in the rotate_half
// layout, where slots 0, 1 are columns 2j, 2j + 1 of a head and slots 2, 3 their RoPE
// partners 2j + d/2, 2j + 1 + d/2 (j over the head's d/4 blocks), so that a block holds
// whole pairs. Interleaved pairs (2j, 2j + 1) and v's columns are consecutive already.
__device__ __forceinline__ int64_t ColumnOf(const FusedMatmulArgs& a, int64_t b, int c) {
  constexpr int h = kFusedCols / 2;
  if (a.epilogue == FusedEpilogue::kSiluMul) {
    return c < h ? h * b + c : a.n[0] + h * b + (c - h);
  }
  if (a.epilogue == FusedEpilogue::kRopeKvWrite && !a.rope.interleaved &&
      static_cast<int>(b) < a.rope.rotated_blocks) {
    // 32-bit, from the sizes the launcher derived: at M <= 2 this formulation keeps the
    // kernel at 58 and 61 registers (bf16) without spills, where computing d / 4 and
    // n[0] + n[1] here cost a spill in the weight loop.
    const unsigned bb = static_cast<unsigned>(b), per = a.rope.blocks_per_head;
    const unsigned head = bb / per;
    const int j = 2 * static_cast<int>(bb - head * per) + (c & 1);
    return static_cast<int>(head) * a.rope.head_dim + j + (c >> 1) * a.rope.half;
  }
  return b * kFusedCols + c;
}

// Whether slot c of block b is a real column (the last block may be partial).
__device__ __forceinline__ bool ColumnValid(const FusedMatmulArgs& a, int64_t b, int c,
                                            int64_t n_total) {
  constexpr int h = kFusedCols / 2;
  if (a.epilogue == FusedEpilogue::kSiluMul) return h * b + (c % h) < a.n[0];
  return b * kFusedCols + c < n_total;
}

template <typename T>
__device__ __forceinline__ const T* WeightRow(const FusedMatmulArgs& a, int64_t col) {
  int64_t start = 0;
#pragma unroll
  for (int g = 0; g < kFusedMaxWeights; ++g) {
    if (g < a.weights && col < start + a.n[g]) {
      return static_cast<const T*>(a.w[g]) + (col - start) * a.k;
    }
    start += a.n[g];
  }
  return static_cast<const T*>(a.w[0]);
}

// The weight holding product column `col` and the column's row in it.
__device__ __forceinline__ int WeightOf(const FusedMatmulArgs& a, int64_t col, int64_t* row) {
  int64_t start = 0;
#pragma unroll
  for (int g = 0; g < kFusedMaxWeights; ++g) {
    if (g < a.weights && col < start + a.n[g]) {
      *row = col - start;
      return g;
    }
    start += a.n[g];
  }
  *row = 0;
  return 0;
}

// Each row's 1/rms over the whole of x (k elements), into inv_rms[0 .. kRows).
template <typename T, int kRows>
__device__ __forceinline__ void RowsInvRms(const T* x, int64_t k, float eps, float* inv_rms,
                                           float* scratch) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float sum_sq = 0.0f;
    for (int64_t e = threadIdx.x; e < k; e += blockDim.x) {
      const float f = ToFloat(x[r * k + e]);
      sum_sq = fmaf(f, f, sum_sq);
    }
    sum_sq = BlockSum(sum_sq, scratch);
    if (threadIdx.x == 0) inv_rms[r] = 1.0f / sqrtf(sum_sq / static_cast<float>(k) + eps);
  }
  __syncthreads();
}

// The block-format path's products: acc[r · kFusedCols + c] = this thread's share of row r
// of x (normalised on load when the norm is folded) times the weight row of slot c, over
// split s of K, every slot of the block in format Q.
template <typename T, int kRows, typename Q>
__device__ __forceinline__ void AccumulateUnits(const FusedMatmulArgs& a, int64_t b, int s,
                                                int64_t n_total, float* inv_rms,
                                                float* scratch,
                                                float (&acc)[kRows * kFusedCols]) {
  const int64_t k = a.k;
  const int64_t units = k / quant::kUnitElems;
  const uint8_t* base[kFusedCols];
  int64_t blocks[kFusedCols], first[kFusedCols];
#pragma unroll
  for (int c = 0; c < kFusedCols; ++c) {
    // A slot past the end reads the block's first column again (of the same format) and
    // is discarded.
    const int64_t col = ColumnOf(a, b, ColumnValid(a, b, c, n_total) ? c : 0);
    int64_t row;
    const int g = WeightOf(a, col, &row);
    base[c] = static_cast<const uint8_t*>(a.w[g]);
    blocks[c] = a.n[g] * (k / Q::kElems);
    first[c] = row * units;
  }
  const int64_t per_split = CeilDiv(units, a.splits);
  const int64_t u0 = static_cast<int64_t>(s) * per_split;
  const int64_t u1 = std::min<int64_t>(units, u0 + per_split);

  // The 32-value formats (a unit per block, cheap to load) go four threads to a unit, each
  // taking 8 of its values, so that a warp's loads of x are contiguous (a thread taking
  // whole units reads x at a 128-byte stride across the warp); each thread still walks
  // as many units' worth of values as before. The K formats, whose unit loads decode a
  // block head, keep a unit per thread.
  constexpr int kParts = Q::kUnits == 1 ? quant::kUnitElems / 8 : 1;
  const int part = static_cast<int>(threadIdx.x % kParts);
  const int64_t end = u1 * kParts;
  int64_t slot = u0 * kParts + threadIdx.x;  // unit slot / kParts, part slot % kParts
  // As the float path: at M = 1 the first units of constant weights are asked for before
  // the wait.
  // A thread of the four that share a unit loads only the quants of its part of it.
  auto load = [&](int c, int64_t t) {
    if constexpr (kParts > 1) {
      return Q::LoadPart(base[c], blocks[c], first[c] + t, part);
    } else {
      return Q::Load(base[c], blocks[c], first[c] + t);
    }
  };
  typename Q::Unit wu[kFusedCols];
  const bool preloaded = kRows == 1 && a.weights_constant && slot < end;
  if (preloaded) {
#pragma unroll
    for (int c = 0; c < kFusedCols; ++c) wu[c] = load(c, slot / kParts);
  }
  AwaitPrerequisiteGrids();

  const T* x = static_cast<const T*>(a.x);
  const T* norm_w = static_cast<const T*>(a.norm_w);
  if (norm_w != nullptr) RowsInvRms<T, kRows>(x, k, a.eps, inv_rms, scratch);

#pragma unroll
  for (int i = 0; i < kRows * kFusedCols; ++i) acc[i] = 0.0f;

  for (bool loaded = preloaded; slot < end; slot += blockDim.x, loaded = false) {
    const int64_t t = slot / kParts;
    if (!loaded) {
#pragma unroll
      for (int c = 0; c < kFusedCols; ++c) wu[c] = load(c, t);
    }
#pragma unroll
    for (int jj = 0; jj < quant::kUnitElems / 8 / kParts; ++jj) {
      const int j = kParts == 1 ? jj : part;
      const int64_t e0 = t * quant::kUnitElems + 8 * j;
      float xf[kRows][8];
#pragma unroll
      for (int r = 0; r < kRows; ++r) quant::LoadX8(x + r * k + e0, a.x_aligned, xf[r]);
      if (norm_w != nullptr) {
        float nw[8];
        quant::LoadX8(norm_w + e0, a.x_aligned, nw);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            xf[r][e] = RoundTo<T>(__fmul_rn(RoundTo<T>(__fmul_rn(xf[r][e], inv_rms[r])), nw[e]));
          }
        }
      }
      // Factored as in kernels/quant_matmul.cu: Scale·Σ code·x (+ Min·Σ x) per 8 values.
      float xsum[kRows];
      if constexpr (Q::Unit::kHasMin) quant::XSums8<kRows>(xf, xsum);
#pragma unroll
      for (int c = 0; c < kFusedCols; ++c) {
        quant::AccumulateUnit8<kFusedCols, kRows>(wu[c], j, xf, xsum, acc + c);
      }
    }
  }
}

// The float path's products (weights of x's dtype, W elements per load), as
// AccumulateUnits.
template <typename T, int W, int kRows>
__device__ __forceinline__ void AccumulateFloat(const FusedMatmulArgs& a, int64_t b, int s,
                                                int64_t n_total, float* inv_rms,
                                                float* scratch,
                                                float (&acc)[kRows * kFusedCols]) {
  constexpr int kAcc = kRows * kFusedCols;
  const int64_t k = a.k;
  const T* x = static_cast<const T*>(a.x);
  const T* norm_w = static_cast<const T*>(a.norm_w);

  const T* wrow[kFusedCols];
#pragma unroll
  for (int c = 0; c < kFusedCols; ++c) {
    // A slot past the end reads a valid row (the first) and is discarded.
    const int64_t col = ColumnValid(a, b, c, n_total) ? ColumnOf(a, b, c) : 0;
    wrow[c] = WeightRow<T>(a, col);
  }

  // This split's range of K, in whole vectors.
  const int64_t vectors = k / W;
  const int64_t per_split = CeilDiv(vectors, a.splits);
  const int64_t v0 = static_cast<int64_t>(s) * per_split;
  const int64_t v1 = std::min<int64_t>(vectors, v0 + per_split);

  // At M = 1, the weight vectors of this thread's first step are asked for before the
  // wait when the weights are constants of the step: they arrive while the predecessor
  // drains (H100, batch 1: 1.147 ms per step against 1.170). At M = 2 the registers it
  // takes cost a block per SM and the step 10% (1.350 ms against 1.221): there, and
  // beyond, each step loads its own.
  int64_t v = v0 + threadIdx.x;
  Vec<T, W> wv[kFusedCols];
  const bool preloaded = kRows == 1 && a.weights_constant && v < v1;
  if (preloaded) {
#pragma unroll
    for (int c = 0; c < kFusedCols; ++c) wv[c] = LoadStreaming<T, W>(wrow[c] + v * W);
  }
  AwaitPrerequisiteGrids();

  if (norm_w != nullptr) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float sum_sq = 0.0f;
      for (int64_t e = threadIdx.x; e < vectors; e += blockDim.x) {
        const Vec<T, W> xv = LoadVec<T, W>(x + r * k + e * W);
#pragma unroll
        for (int j = 0; j < W; ++j) {
          const float f = ToFloat(xv.v[j]);
          sum_sq = fmaf(f, f, sum_sq);
        }
      }
      sum_sq = BlockSum(sum_sq, scratch);
      if (threadIdx.x == 0) inv_rms[r] = 1.0f / sqrtf(sum_sq / static_cast<float>(k) + a.eps);
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;

  for (bool loaded = preloaded; v < v1; v += blockDim.x, loaded = false) {
    if (!loaded) {
#pragma unroll
      for (int c = 0; c < kFusedCols; ++c) wv[c] = LoadStreaming<T, W>(wrow[c] + v * W);
    }
    float xf[kRows][W];
#pragma unroll
    for (int r = 0; r < kRows; ++r) LoadFloats<T, W>(x + r * k + v * W, xf[r]);
    if (norm_w != nullptr) {
      const Vec<T, W> nv = LoadVec<T, W>(norm_w + v * W);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int e = 0; e < W; ++e) {
          xf[r][e] = RoundTo<T>(__fmul_rn(RoundTo<T>(__fmul_rn(xf[r][e], inv_rms[r])),
                                          ToFloat(nv.v[e])));
        }
      }
    }
#pragma unroll
    for (int e = 0; e < W; ++e) {
#pragma unroll
      for (int c = 0; c < kFusedCols; ++c) {
        const float wf = ToFloat(wv[c].v[e]);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          acc[r * kFusedCols + c] = fmaf(xf[r][e], wf, acc[r * kFusedCols + c]);
        }
      }
    }
  }
}

// AccumulateUnits in the format of the block's columns (uniform over the block).
template <typename T, int kRows>
__device__ __forceinline__ void AccumulateBlocks(const FusedMatmulArgs& a, int64_t b, int s,
                                                 int64_t n_total, float* inv_rms,
                                                 float* scratch,
                                                 float (&acc)[kRows * kFusedCols]) {
  int64_t row;
  const DType format = a.w_dtype[WeightOf(a, ColumnOf(a, b, 0), &row)];
#define SG_FUSED_FORMAT(t)                                                                  \
  case t:                                                                                  \
    AccumulateUnits<T, kRows, quant::Format<t>>(a, b, s, n_total, inv_rms, scratch, acc); \
    break;
  switch (format) {
    SG_FUSED_FORMAT(DType::kQ8_0)
    SG_FUSED_FORMAT(DType::kQ4_0)
    SG_FUSED_FORMAT(DType::kQ4_1)
    SG_FUSED_FORMAT(DType::kQ5_0)
    SG_FUSED_FORMAT(DType::kQ5_1)
    SG_FUSED_FORMAT(DType::kQ4_K)
    SG_FUSED_FORMAT(DType::kQ5_K)
    SG_FUSED_FORMAT(DType::kQ6_K)
    default:  // the launcher admits none other
      AwaitPrerequisiteGrids();
#pragma unroll
      for (int i = 0; i < kRows * kFusedCols; ++i) acc[i] = 0.0f;
      break;
  }
#undef SG_FUSED_FORMAT
}

// AccumulateUnits in the format of the block's columns, one of two (kA, kB): the kernel of
// a launch whose weights mix exactly these formats (FusedFormatPair).
template <typename T, int kRows, DType kA, DType kB>
__device__ __forceinline__ void AccumulateEither(const FusedMatmulArgs& a, int64_t b, int s,
                                                 int64_t n_total, float* inv_rms,
                                                 float* scratch,
                                                 float (&acc)[kRows * kFusedCols]) {
  int64_t row;
  if (a.w_dtype[WeightOf(a, ColumnOf(a, b, 0), &row)] == kA) {
    AccumulateUnits<T, kRows, quant::Format<kA>>(a, b, s, n_total, inv_rms, scratch, acc);
  } else {
    AccumulateUnits<T, kRows, quant::Format<kB>>(a, b, s, n_total, inv_rms, scratch, acc);
  }
}

// Orders (value, index) as Argmax does: larger value wins, NaN never wins, lower index
// wins a tie.
__device__ __forceinline__ bool Better(float v, int32_t i, float best, int32_t best_i) {
  return v > best || (v == best && i < best_i);
}

// kFormat: the block format of every weight, or kF32 for block formats chosen per column
// block (W = 0 only); with kFormatB, the blocks' format is one of kFormat and kFormatB.
// kMinBlocks: blocks of kThreads that must fit an SM (0: no bound).
template <typename T, int W, int kRows, DType kFormat = DType::kF32, int kMinBlocks = 0,
          DType kFormatB = DType::kF32>
__global__ void __launch_bounds__(kThreads, kMinBlocks) FusedMatmulKernel(FusedMatmulArgs a) {
  constexpr int kAcc = kRows * kFusedCols;
  static_assert(kAcc <= kThreads);
  __shared__ float inv_rms[kRows];
  __shared__ float scratch[kWarpSize + 1];
  __shared__ float partial[kMaxWarps][kAcc];
  __shared__ float values[kAcc];
  __shared__ float warp_best[kMaxWarps];
  __shared__ int32_t warp_index[kMaxWarps];
  __shared__ bool last_block;

  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  const int64_t b = blockIdx.x;
  const int s = blockIdx.y;
  int64_t n_total = 0;
  for (int g = 0; g < a.weights; ++g) n_total += a.n[g];
  if constexpr (W >= 0) {
    float acc[kAcc];
    if constexpr (W == 0) {
      if constexpr (kFormat == DType::kF32) {
        AccumulateBlocks<T, kRows>(a, b, s, n_total, inv_rms, scratch, acc);
      } else if constexpr (kFormatB != DType::kF32) {
        AccumulateEither<T, kRows, kFormat, kFormatB>(a, b, s, n_total, inv_rms, scratch, acc);
      } else {
        AccumulateUnits<T, kRows, quant::Format<kFormat>>(a, b, s, n_total, inv_rms, scratch,
                                                          acc);
      }
    } else {
      AccumulateFloat<T, W, kRows>(a, b, s, n_total, inv_rms, scratch, acc);
    }
#pragma unroll
    for (int j = 0; j < kAcc; ++j) {
      const float sum = WarpSum(acc[j]);
      if (lane == 0) partial[warp][j] = sum;
    }
    __syncthreads();
  }

  // values[r * kFusedCols + c]: this block's sum for (row r, slot c).
  const int i = threadIdx.x;
  const int r = i / kFusedCols, c = i % kFusedCols;
  const bool valid = i < kAcc && ColumnValid(a, b, c, n_total);
  if constexpr (W < 0) {
    // The tensor-core path's products: its splits added in order.
    AwaitPrerequisiteGrids();
    if (valid) {
      const int64_t col = ColumnOf(a, b, c);
      float total = 0.0f;
      for (int split = 0; split < a.product_splits; ++split) {
        total += a.products[(split * a.product_rows + r) * n_total + col];
      }
      values[i] = total;
    }
  } else {
    if (i < kAcc) {
      float total = 0.0f;
      for (int w = 0; w < warps; ++w) total += partial[w][i];
      values[i] = total;
    }
    if (a.splits > 1) {
      if (valid) {
        a.partials[(static_cast<int64_t>(s) * a.m + r) * n_total + ColumnOf(a, b, c)] =
            values[i];
      }
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0) {
        const uint32_t ticket = atomicAdd(&a.counters[b], 1u);
        last_block = ticket == static_cast<uint32_t>(a.splits - 1);
        if (last_block) a.counters[b] = 0;  // every split has counted: ready for the next launch
      }
      __syncthreads();
      if (!last_block) return;
      __threadfence();
      if (valid) {
        float total = 0.0f;
        for (int split = 0; split < a.splits; ++split) {
          // Written by other blocks of this launch: read through L2, not the L1 path.
          total += __ldcg(&a.partials[(static_cast<int64_t>(split) * a.m + r) * n_total +
                                      ColumnOf(a, b, c)]);
        }
        values[i] = total;
      }
    }
  }
  __syncthreads();

  // Epilogue. The product as a MatMul would store it.
  const float p = valid ? RoundTo<T>(values[i]) : 0.0f;
  switch (a.epilogue) {
    case FusedEpilogue::kNone:
      if (valid) static_cast<T*>(a.y)[r * n_total + ColumnOf(a, b, c)] = FromFloat<T>(p);
      break;
    case FusedEpilogue::kAdd:
      if (valid) {
        const int64_t o = r * n_total + ColumnOf(a, b, c);
        static_cast<T*>(a.y)[o] =
            FromFloat<T>(ToFloat(static_cast<const T*>(a.residual)[o]) + p);
      }
      break;
    case FusedEpilogue::kSiluMul: {
      __syncthreads();
      if (i < kAcc) values[i] = p;
      __syncthreads();
      constexpr int h = kFusedCols / 2;
      if (valid && c < h) {
        const float g = values[i], u = values[i + h];
        static_cast<T*>(a.y)[r * a.n[0] + h * b + c] = FromFloat<T>(Silu(g) * u);
      }
      break;
    }
    case FusedEpilogue::kRopeKvWrite: {
      __syncthreads();
      if (i < kAcc) values[i] = p;
      __syncthreads();
      if (!valid) break;
      const FusedRopeArgs& rope = a.rope;
      const int d = rope.head_dim;
      const int col = static_cast<int>(ColumnOf(a, b, c));
      const int q_cols = static_cast<int>(a.n[0]), kv_cols = static_cast<int>(a.n[1]);
      const int32_t pos = rope.pos[r];
      if (pos >= rope.seq && b == 0 && c == 0) {
        atomicOr(rope.error_flags, static_cast<uint32_t>(kErrorPositionOutOfRange));
      }
      float out = p;
      if (col < q_cols + kv_cols && pos >= 0) {
        // This slot's RoPE partner is in the block (ColumnOf): c ^ 1 for interleaved pairs,
        // c ^ 2 for rotate_half ones; the pair's first element is the lower column.
        const bool first = rope.interleaved ? (c & 1) == 0 : c < 2;
        const int in_head = col % d;
        const int j = rope.interleaved ? in_head / 2 : (first ? in_head : in_head - d / 2);
        const float other = values[r * kFusedCols + (rope.interleaved ? c ^ 1 : c ^ 2)];
        float y1, y2;
        RotatePair<T>(first ? p : other, first ? other : p, pos, rope.inv_freq[j], y1, y2);
        out = first ? y1 : y2;
      }
      if (col < q_cols) {
        static_cast<T*>(a.y)[static_cast<int64_t>(r) * q_cols + col] = FromFloat<T>(out);
      } else if (pos >= 0 && pos < rope.seq) {
        // Row r is cache slot r (the launcher offsets the caches of later row chunks).
        const bool is_k = col < q_cols + kv_cols;
        const int kv_col = col - q_cols - (is_k ? 0 : kv_cols);
        const int head = kv_col / d;
        T* cache = static_cast<T*>(is_k ? rope.k_cache : rope.v_cache);
        cache[((r * rope.kv_heads + head) * rope.seq + pos) * d + (kv_col - head * d)] =
            FromFloat<T>(out);
      }
      break;
    }
    case FusedEpilogue::kArgmax: {
      const int64_t blocks = gridDim.x;
      __syncthreads();
      if (i < kAcc) values[i] = valid ? p : -INFINITY;
      __syncthreads();
      if (i < kRows) {
        float best = -INFINITY;
        int32_t best_i = INT32_MAX;
        for (int cc = 0; cc < kFusedCols; ++cc) {
          const int32_t col = static_cast<int32_t>(b * kFusedCols + cc);
          const float val = values[i * kFusedCols + cc];
          if (ColumnValid(a, b, cc, n_total) && Better(val, col, best, best_i)) {
            best = val;
            best_i = col;
          }
        }
        a.argmax_value[i * blocks + b] = best;
        a.argmax_index[i * blocks + b] = best_i;
      }
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0) {
        const uint32_t ticket = atomicAdd(a.argmax_counter, 1u);
        last_block = ticket == static_cast<uint32_t>(blocks - 1);
        if (last_block) *a.argmax_counter = 0;
      }
      __syncthreads();
      if (!last_block) return;
      __threadfence();
      for (int row = 0; row < kRows; ++row) {
        float best = -INFINITY;
        int32_t best_i = INT32_MAX;
        for (int64_t j = threadIdx.x; j < blocks; j += blockDim.x) {
          const float v = __ldcg(&a.argmax_value[row * blocks + j]);
          const int32_t idx = __ldcg(&a.argmax_index[row * blocks + j]);
          if (Better(v, idx, best, best_i)) {
            best = v;
            best_i = idx;
          }
        }
#pragma unroll
        for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
          const float ov = __shfl_xor_sync(kFullMask, best, offset);
          const int32_t oi = __shfl_xor_sync(kFullMask, best_i, offset);
          if (Better(ov, oi, best, best_i)) {
            best = ov;
            best_i = oi;
          }
        }
        if (lane == 0) {
          warp_best[warp] = best;
          warp_index[warp] = best_i;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
          for (int w = 1; w < warps; ++w) {
            if (Better(warp_best[w], warp_index[w], best, best_i)) {
              best = warp_best[w];
              best_i = warp_index[w];
            }
          }
          // Nothing above -inf (all -inf or NaN): index 0, as Argmax.
          static_cast<int32_t*>(a.y)[row] =
              (best_i == INT32_MAX || !(best > -INFINITY)) ? 0 : best_i;
        }
        __syncthreads();
      }
      break;
    }
  }
}

static_assert(kFusedMaxRows == kMaxDispatchRows, "DispatchRows covers every row count");

template <typename T>
__global__ void __launch_bounds__(kThreads)
    RopeKvWriteKernel(const T* __restrict__ qkv, const int32_t* __restrict__ pos,
                      const float* __restrict__ inv_freq, T* __restrict__ q,
                      T* __restrict__ k_cache, T* __restrict__ v_cache, int64_t rows,
                      int64_t q_cols, int64_t kv_heads, int64_t seq, int head_dim,
                      bool interleaved, uint32_t* error_flags) {
  AwaitPrerequisiteGrids();
  const int64_t kv_cols = kv_heads * head_dim;
  const int64_t cols = q_cols + 2 * kv_cols;
  const int64_t pairs_per_row = cols / 2;  // q and k pairs rotate; v pairs are copied
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= rows * pairs_per_row) return;
  const int64_t row = t / pairs_per_row;
  const int64_t pair = t - row * pairs_per_row;
  const int half = head_dim / 2;
  const int32_t p = pos[row];
  const bool write_cache = p >= 0 && p < seq;
  if (p >= seq && pair == 0) {
    atomicOr(error_flags, static_cast<uint32_t>(kErrorPositionOutOfRange));
  }
  const T* in = qkv + row * cols;
  const int64_t rotated_pairs = (q_cols + kv_cols) / 2;
  if (pair >= rotated_pairs) {  // v: two elements to the cache
    if (!write_cache) return;
    const int64_t e = 2 * (pair - rotated_pairs);  // within v's kv_cols
    const int64_t head = e / head_dim, d = e - head * head_dim;
    T* dst = v_cache + ((row * kv_heads + head) * seq + p) * head_dim + d;
    dst[0] = in[q_cols + kv_cols + e];
    dst[1] = in[q_cols + kv_cols + e + 1];
    return;
  }
  const int64_t head = pair / half;  // q's heads, then k's
  const int j = static_cast<int>(pair - head * half);
  const int64_t base = head * head_dim;
  const int64_t ia = base + (interleaved ? 2 * j : j);
  const int64_t ib = base + (interleaved ? 2 * j + 1 : j + half);
  const T x1 = in[ia], x2 = in[ib];
  T y1 = x1, y2 = x2;
  if (p >= 0) {
    float f1, f2;
    RotatePair<T>(ToFloat(x1), ToFloat(x2), p, inv_freq[j], f1, f2);
    y1 = FromFloat<T>(f1);
    y2 = FromFloat<T>(f2);
  }
  if (base < q_cols) {
    q[row * q_cols + ia] = y1;
    q[row * q_cols + ib] = y2;
  } else if (write_cache) {
    const int64_t kh = (base - q_cols) / head_dim;
    T* dst = k_cache + ((row * kv_heads + kh) * seq + p) * head_dim;
    dst[ia - base] = y1;
    dst[ib - base] = y2;
  }
}

// RopeKvWriteKernel with every q and k head RmsNorm'd first (Qwen3's q and k norms): one
// warp per head of a row, q's heads, then k's, then v's. A q or k head's sum of squares is
// one warp reduction; each lane then normalises, rotates and stores the pairs j = lane,
// lane + 32, ... of the head, each value rounded as HeadRmsNorm stores it
// (round(round(x·r)·w)) before the rotation. v heads are copied into the cache.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    HeadNormRopeKvWriteKernel(const T* __restrict__ qkv, const int32_t* __restrict__ pos,
                              const float* __restrict__ inv_freq, const T* __restrict__ q_norm,
                              const T* __restrict__ k_norm, float eps, T* __restrict__ q,
                              T* __restrict__ k_cache, T* __restrict__ v_cache, int64_t rows,
                              int64_t q_heads, int64_t kv_heads, int64_t seq, int head_dim,
                              bool interleaved, uint32_t* error_flags) {
  AwaitPrerequisiteGrids();
  const int64_t heads = q_heads + 2 * kv_heads;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  if (warp >= rows * heads) return;  // whole warps: blockDim.x is a multiple of 32
  const int64_t row = warp / heads;
  const int64_t head = warp - row * heads;
  const int d = head_dim, half = head_dim / 2;
  const int32_t p = pos[row];
  const bool write_cache = p >= 0 && p < seq;
  if (p >= seq && head == 0 && lane == 0) {
    atomicOr(error_flags, static_cast<uint32_t>(kErrorPositionOutOfRange));
  }
  const T* in = qkv + (row * heads + head) * d;
  if (head >= q_heads + kv_heads) {  // v: copied
    if (!write_cache) return;
    T* dst = v_cache + ((row * kv_heads + (head - q_heads - kv_heads)) * seq + p) * d;
    for (int e = lane; e < d; e += kWarpSize) dst[e] = in[e];
    return;
  }
  const bool is_q = head < q_heads;
  const T* w = is_q ? q_norm : k_norm;
  float sum_sq = 0.0f;
  for (int e = lane; e < d; e += kWarpSize) {
    const float v = ToFloat(in[e]);
    sum_sq = __fadd_rn(sum_sq, __fmul_rn(v, v));
  }
  sum_sq = WarpSum(sum_sq);
  // 1 / sqrt, correctly rounded, as the reference computes it.
  const float inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(d) + eps);
  auto normed = [&](int e) {
    return RoundTo<T>(__fmul_rn(RoundTo<T>(__fmul_rn(ToFloat(in[e]), inv_rms)), ToFloat(w[e])));
  };
  T* out = is_q ? q + (row * q_heads + head) * d
          : write_cache ? k_cache + ((row * kv_heads + (head - q_heads)) * seq + p) * d
                        : nullptr;
  if (out == nullptr) return;
  for (int j = lane; j < half; j += kWarpSize) {
    const int ia = interleaved ? 2 * j : j;
    const int ib = interleaved ? 2 * j + 1 : j + half;
    float y1 = normed(ia), y2 = normed(ib);
    if (p >= 0) {
      const float x1 = y1, x2 = y2;
      RotatePair<T>(x1, x2, p, inv_freq[j], y1, y2);
    }
    out[ia] = FromFloat<T>(y1);
    out[ib] = FromFloat<T>(y2);
  }
}

// Calls f(std::integral_constant<int, m>{}) for m in {1, 2, 4, 8} (and, with kMma, 16, 32
// and 64): the row counts the block-format kernel and the tensor-core path's epilogue are
// compiled for (LaunchFusedMatmul cuts rows into such chunks).
template <bool kMma = false, typename F>
cudaError_t DispatchPowerOfTwoRows(int64_t m, F&& f) {
  switch (m) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default: break;
  }
  if constexpr (kMma) {
    switch (m) {
      case 16: return f(std::integral_constant<int, 16>{});
      case 32: return f(std::integral_constant<int, 32>{});
      case 64: return f(std::integral_constant<int, 64>{});
      default: break;
    }
  }
  return cudaErrorInvalidValue;
}
static_assert(kFusedMaxMmaRows == 64, "DispatchPowerOfTwoRows<true> tops out at 64");

bool BlockFormats(const FusedMatmulArgs& a) { return IsQuantized(a.w_dtype[0]); }

// The block-format kernel for weights all in `format`, or (kF32) the one that takes any
// mix of formats, choosing per column block. Compiled for one format, the kernel holds
// only that format's registers (at one row, H200: 64-104 against 128 for the mix, so twice
// the blocks fit an SM); at one row Q8_0, Q4_0 and Q6_K also ask for four blocks of 256
// threads per SM (64 registers), which took Q8_0's down projection from 11.8 to 9.4 us and
// Q6_K's from 11.2 to 10.1, where the same bound cost Q4_K's 0.7 us (docs/cuda_kernels.md).
template <DType kFormat, int kRows>
constexpr int FusedMinBlocks() {
  return kRows == 1 && (kFormat == DType::kQ8_0 || kFormat == DType::kQ4_0 ||
                        kFormat == DType::kQ6_K)
             ? 4
             : 0;
}

// The format pairs that files mix in one launch and that have a kernel of their own: a
// Q4_K_M (Q5_K_M) file's q and k in Q4_K (Q5_K) beside a v in Q6_K, in the layers where
// llama.cpp's quantizer gives v more bits. Compiled for two formats, the kernel holds the
// larger one's registers, not the eight formats' 128 (H200, q/k/v of the 1B shape at one
// row: 16.9 us in the kernel for any mix against 8.7 with v in Q4_K too).
constexpr DType kFusedFormatPairs[][2] = {{DType::kQ4_K, DType::kQ6_K},
                                          {DType::kQ5_K, DType::kQ6_K}};

// Index into kFusedFormatPairs of the two formats a's weights mix (in any order), or -1:
// weights of one format, of three or more, or of a pair without its kernel.
int FusedFormatPair(const FusedMatmulArgs& a) {
  DType first = a.w_dtype[0], second = DType::kF32;
  for (int g = 1; g < a.weights; ++g) {
    if (a.w_dtype[g] == first || a.w_dtype[g] == second) continue;
    if (second != DType::kF32) return -1;
    second = a.w_dtype[g];
  }
  if (second == DType::kF32) return -1;
  for (int p = 0; p < static_cast<int>(std::size(kFusedFormatPairs)); ++p) {
    const DType* pair = kFusedFormatPairs[p];
    if ((pair[0] == first && pair[1] == second) || (pair[0] == second && pair[1] == first)) {
      return p;
    }
  }
  return -1;
}

template <typename T, int kRows>
cudaError_t LaunchBlockKernel(DType format, dim3 grid, dim3 block, Stream stream,
                              const FusedMatmulArgs& a) {
  // The pairs' kernels at the rows of decode on CUDA cores, for f32 activations (a GGUF
  // file's); other mixes take the kernel that switches over every format.
  if constexpr (std::is_same_v<T, float> && kRows <= 2) {
    if (format == DType::kF32) {
      switch (FusedFormatPair(a)) {
        case 0:
          return LaunchKernel(FusedMatmulKernel<T, 0, kRows, kFusedFormatPairs[0][0], 0,
                                                kFusedFormatPairs[0][1]>,
                              grid, block, stream, a);
        case 1:
          return LaunchKernel(FusedMatmulKernel<T, 0, kRows, kFusedFormatPairs[1][0], 0,
                                                kFusedFormatPairs[1][1]>,
                              grid, block, stream, a);
        default:
          break;
      }
    }
  }
  switch (format) {
#define SG_FUSED_LAUNCH(t)                                                                     \
  case t:                                                                                      \
    return LaunchKernel(FusedMatmulKernel<T, 0, kRows, t, FusedMinBlocks<t, kRows>()>, grid, \
                        block, stream, a);
    SG_FUSED_LAUNCH(DType::kQ8_0)
    SG_FUSED_LAUNCH(DType::kQ4_0)
    SG_FUSED_LAUNCH(DType::kQ4_1)
    SG_FUSED_LAUNCH(DType::kQ5_0)
    SG_FUSED_LAUNCH(DType::kQ5_1)
    SG_FUSED_LAUNCH(DType::kQ4_K)
    SG_FUSED_LAUNCH(DType::kQ5_K)
    SG_FUSED_LAUNCH(DType::kQ6_K)
#undef SG_FUSED_LAUNCH
    default:
      return LaunchKernel(FusedMatmulKernel<T, 0, kRows>, grid, block, stream, a);
  }
}

// One launch for rows [0, a.m) with a.m <= kFusedMaxRows (block formats: a power of two).
cudaError_t LaunchRows(const FusedMatmulArgs& a, Stream stream) {
  const int64_t blocks = FusedColumnBlocks(a);
  if (blocks <= 0 || blocks > INT32_MAX) return cudaErrorInvalidValue;
  return DispatchFloat(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (BlockFormats(a)) {
      FusedMatmulArgs aligned = a;
      aligned.x_aligned = Aligned16(a.x) && (a.norm_w == nullptr || Aligned16(a.norm_w));
      return DispatchPowerOfTwoRows(a.m, [&](auto rows) {
        constexpr int kRows = decltype(rows)::value;
        const int64_t per_split = CeilDiv(a.k / quant::kUnitElems, a.splits);
        // Threads per unit: four for the 32-value formats when walked wide.
        bool whole_units = true;
        for (int g = 0; g < a.weights; ++g) {
          whole_units = whole_units && DTypeBlockElems(a.w_dtype[g]) == quant::kUnitElems;
        }
        const int64_t slots = kRows == 1 && whole_units && a.walk == FusedUnitWalk::kWide
                                  ? per_split * (quant::kUnitElems / 8)
                                  : per_split;
        const int64_t warps = std::clamp<int64_t>(CeilDiv(slots, kWarpSize), 1, kMaxWarps);
        const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(a.splits));
        const dim3 block(static_cast<unsigned>(warps * kWarpSize));
        // Weights all of one format run the kernel compiled for it, the others the one
        // that chooses a format per column block.
        DType format = a.w_dtype[0];
        for (int g = 1; g < a.weights; ++g) {
          if (a.w_dtype[g] != format) format = DType::kF32;
        }
        return LaunchBlockKernel<T, kRows>(format, grid, block, stream, aligned);
      });
    }
    bool vectorize = a.k % kVec16<T> == 0 && Aligned16(a.x) &&
                     (a.norm_w == nullptr || Aligned16(a.norm_w));
    for (int g = 0; g < a.weights; ++g) vectorize = vectorize && Aligned16(a.w[g]);
    return DispatchVecWidth<T>(vectorize, [&](auto width) {
      constexpr int W = decltype(width)::value;
      return DispatchRows(a.m, [&](auto rows) {
        constexpr int kRows = decltype(rows)::value;
        const int64_t per_split = CeilDiv(a.k / W, a.splits);
        const int64_t warps = std::clamp<int64_t>(CeilDiv(per_split, kWarpSize), 1, kMaxWarps);
        const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(a.splits));
        const dim3 block(static_cast<unsigned>(warps * kWarpSize));
        if constexpr (kRows == 1 && W == kVec16<T>) {
          if (a.min_blocks == 5) {
            return LaunchKernel(FusedMatmulKernel<T, W, 1, DType::kF32, 5>, grid, block, stream, a);
          }
          if (a.min_blocks == 6) {
            return LaunchKernel(FusedMatmulKernel<T, W, 1, DType::kF32, 6>, grid, block, stream, a);
          }
        }
        return LaunchKernel(FusedMatmulKernel<T, W, kRows>, grid, block, stream, a);
      });
    });
  });
}

// The tensor-core path's products of all a.m rows into a.products: one block MMA launch
// per run of consecutive weights of one format (a Q4_K_M file's q and k, then its v).
cudaError_t LaunchMmaProducts(const FusedMatmulArgs& a, int64_t n_total, Stream stream) {
  int64_t col0 = 0;
  for (int g0 = 0, g1 = 0; g0 < a.weights; g0 = g1) {
    BlockMmaArgs m;
    m.x = a.x;
    m.m = a.m;
    m.k = a.k;
    m.dtype = a.dtype;
    m.w_dtype = a.w_dtype[g0];
    m.terms = a.mma_terms;
    m.partials = a.products;
    m.scratch = a.mma_scratch;
    m.ld = n_total;
    m.col0 = col0;
    m.splits = a.product_splits;
    m.shape = a.mma_shape;
    m.weights = 0;
    for (g1 = g0; g1 < a.weights && a.w_dtype[g1] == a.w_dtype[g0]; ++g1) {
      m.w[m.weights] = a.w[g1];
      m.n[m.weights++] = a.n[g1];
      col0 += a.n[g1];
    }
    // x is split once: the later runs find it in the scratch.
    m.x_in_scratch = g0 > 0;
    const cudaError_t e = LaunchBlockMma(m, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// The tensor-core path's epilogue for rows [0, a.m) (a power of two up to
// kFusedMaxMmaRows), reading a.products.
cudaError_t LaunchProductEpilogue(const FusedMatmulArgs& a, Stream stream) {
  const int64_t blocks = FusedColumnBlocks(a);
  if (blocks <= 0 || blocks > INT32_MAX) return cudaErrorInvalidValue;
  return DispatchFloat(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return DispatchPowerOfTwoRows<true>(a.m, [&](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      return LaunchKernel(FusedMatmulKernel<T, -1, kRows>, dim3(static_cast<unsigned>(blocks)),
                          dim3(kThreads), stream, a);
    });
  });
}

}  // namespace

int64_t FusedColumnBlocks(const FusedMatmulArgs& a) {
  if (a.epilogue == FusedEpilogue::kSiluMul) return CeilDiv(a.n[0], kFusedCols / 2);
  int64_t n = 0;
  for (int g = 0; g < a.weights && g < kFusedMaxWeights; ++g) n += a.n[g];
  return CeilDiv(n, kFusedCols);
}

bool FusedBlockFormatsFit(const FusedMatmulArgs& a) {
  if (a.weights < 1 || a.weights > kFusedMaxWeights) return false;
  const bool blocks = IsQuantized(a.w_dtype[0]);
  bool mixed = false;
  for (int g = 0; g < a.weights; ++g) {
    if (IsQuantized(a.w_dtype[g]) != blocks) return false;
    mixed = mixed || a.w_dtype[g] != a.w_dtype[0];
  }
  if (!mixed) return true;
  if (a.epilogue == FusedEpilogue::kSiluMul) return false;
  for (int g = 0; g + 1 < a.weights; ++g) {
    if (a.n[g] % kFusedCols != 0) return false;
  }
  return true;
}

int FusedSplitsFor(const FusedMatmulArgs& a, int sm_count) {
  const int64_t blocks = std::max<int64_t>(FusedColumnBlocks(a), 1);
  const int64_t want = CeilDiv(2 * static_cast<int64_t>(sm_count), blocks);
  const int64_t most = std::max<int64_t>(1, a.k / 512);
  return static_cast<int>(std::clamp<int64_t>(want, 1, std::min<int64_t>(most, 16)));
}

bool FusedWideFitsOneWave(const FusedMatmulArgs& a, int sm_count) {
  if (a.m != 1 || a.splits < 1 || a.k <= 0 || sm_count <= 0) return false;
  const int64_t per_split = CeilDiv(a.k / quant::kUnitElems, a.splits);
  const int64_t warps =
      std::clamp<int64_t>(CeilDiv(per_split * (quant::kUnitElems / 8), kWarpSize), 1, kMaxWarps);
  const int64_t threads = warps * kWarpSize;
  // An SM holds 2048 threads and 65536 registers.
  const int64_t per_sm = std::min<int64_t>(2048 / threads, 65536 / (threads * 64));
  return FusedColumnBlocks(a) * a.splits <= per_sm * sm_count;
}

cudaError_t LaunchFusedMatmul(const FusedMatmulArgs& a, Stream stream) {
  if (a.m < 1 || a.k <= 0 || a.weights < 1 || a.weights > kFusedMaxWeights || a.splits < 1 ||
      a.x == nullptr || a.y == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (a.splits > 1 && (a.partials == nullptr || a.counters == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (a.epilogue == FusedEpilogue::kSiluMul && (a.weights != 2 || a.n[0] != a.n[1])) {
    return cudaErrorInvalidValue;
  }
  if (a.epilogue == FusedEpilogue::kAdd && a.residual == nullptr) return cudaErrorInvalidValue;
  if (a.epilogue == FusedEpilogue::kArgmax &&
      (a.weights != 1 || a.argmax_value == nullptr || a.argmax_index == nullptr ||
       a.argmax_counter == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (!FusedBlockFormatsFit(a)) return cudaErrorInvalidValue;
  const bool mma = a.products != nullptr;
  if (mma && (!BlockFormats(a) || a.norm_w != nullptr || a.product_splits < 1 ||
              a.mma_scratch == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (BlockFormats(a)) {
    for (int g = 0; g < a.weights; ++g) {
      if (a.k % DTypeBlockElems(a.w_dtype[g]) != 0) return cudaErrorInvalidValue;
      if (!Aligned16(a.w[g])) return cudaErrorMisalignedAddress;
    }
  }
  int64_t n_total = 0;
  for (int g = 0; g < a.weights; ++g) n_total += a.n[g];
  const FusedRopeArgs& rope = a.rope;
  if (a.epilogue == FusedEpilogue::kRopeKvWrite &&
      (a.weights != 3 || rope.head_dim <= 0 || rope.head_dim % kFusedCols != 0 ||
       a.n[0] <= 0 || a.n[0] % rope.head_dim != 0 || rope.kv_heads <= 0 ||
       a.n[1] != rope.kv_heads * rope.head_dim || a.n[2] != a.n[1] || rope.seq <= 0 ||
       n_total > INT32_MAX || rope.pos == nullptr || rope.inv_freq == nullptr ||
       rope.k_cache == nullptr || rope.v_cache == nullptr || rope.error_flags == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const int64_t out_cols =
      a.epilogue == FusedEpilogue::kSiluMul || a.epilogue == FusedEpilogue::kRopeKvWrite
          ? a.n[0]
      : a.epilogue == FusedEpilogue::kArgmax ? 1
                                             : n_total;
  const int64_t elem = a.dtype == DType::kF32 ? 4 : 2;
  const int64_t out_elem = a.epilogue == FusedEpilogue::kArgmax ? 4 : elem;
  // More rows than one launch holds: launches of kFusedMaxRows rows one after another on
  // the stream, reusing the workspace (each launch leaves its counters zeroed). Decode
  // steps have M <= 8; larger buckets read the weights once per launch.
  FusedMatmulArgs sized = a;
  if (a.epilogue == FusedEpilogue::kRopeKvWrite) {
    sized.rope.blocks_per_head = rope.head_dim / kFusedCols;
    sized.rope.half = rope.head_dim / 2;
    sized.rope.rotated_blocks = static_cast<int>((a.n[0] + a.n[1]) / kFusedCols);
  }
  // Block formats take chunks of 8, 4, 2 and 1 rows (a batch of 3 is two launches); on
  // tensor cores the products of all rows come first, then epilogues of up to 64 rows.
  if (mma) {
    const cudaError_t e = LaunchMmaProducts(sized, n_total, stream);
    if (e != cudaSuccess) return e;
    sized.product_rows = a.m;
  }
  const bool powers_of_two = BlockFormats(a);
  for (int64_t r0 = 0, rows = 0; r0 < a.m; r0 += rows) {
    FusedMatmulArgs chunk = sized;
    rows = std::min<int64_t>(mma ? kFusedMaxMmaRows : kFusedMaxRows, a.m - r0);
    while (powers_of_two && (rows & (rows - 1)) != 0) rows &= rows - 1;
    chunk.m = rows;
    if (mma) chunk.products = a.products + r0 * n_total;
    chunk.x = static_cast<const char*>(a.x) + r0 * a.k * elem;
    if (a.residual != nullptr) {
      chunk.residual = static_cast<const char*>(a.residual) + r0 * n_total * elem;
    }
    chunk.y = static_cast<char*>(a.y) + r0 * out_cols * out_elem;
    if (a.epilogue == FusedEpilogue::kRopeKvWrite) {
      // Row r of the chunk is row r0 + r of the step: its position and its cache slot.
      const int64_t slot_bytes = rope.kv_heads * rope.seq * rope.head_dim * elem;
      chunk.rope.pos = rope.pos + r0;
      chunk.rope.k_cache = static_cast<char*>(rope.k_cache) + r0 * slot_bytes;
      chunk.rope.v_cache = static_cast<char*>(rope.v_cache) + r0 * slot_bytes;
    }
    const cudaError_t e = mma ? LaunchProductEpilogue(chunk, stream) : LaunchRows(chunk, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t LaunchRopeKvWrite(const void* qkv, const int32_t* pos, const float* inv_freq,
                              void* q, void* k_cache, void* v_cache, int64_t rows,
                              int64_t q_cols, int64_t kv_heads, int64_t seq, int head_dim,
                              bool interleaved, DType dtype, uint32_t* error_flags,
                              Stream stream, const RopeHeadNorms& norms) {
  if (rows <= 0 || head_dim <= 0 || head_dim % 2 != 0 || q_cols % head_dim != 0 ||
      (norms.q == nullptr) != (norms.k == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (norms.q != nullptr) {
    const int64_t heads = q_cols / head_dim + 2 * kv_heads;
    if (heads > (int64_t{1} << 40) / rows) return cudaErrorInvalidValue;
    const int64_t warps_per_block = kThreads / kWarpSize;
    return DispatchFloat(dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      return LaunchKernel(HeadNormRopeKvWriteKernel<T>,
                          dim3(static_cast<unsigned>(CeilDiv(rows * heads, warps_per_block))),
                          dim3(kThreads), stream, static_cast<const T*>(qkv), pos, inv_freq,
                          static_cast<const T*>(norms.q), static_cast<const T*>(norms.k),
                          norms.eps, static_cast<T*>(q), static_cast<T*>(k_cache),
                          static_cast<T*>(v_cache), rows, q_cols / head_dim, kv_heads, seq,
                          head_dim, interleaved, error_flags);
    });
  }
  const int64_t pairs = rows * (q_cols + 2 * kv_heads * head_dim) / 2;
  return DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return LaunchKernel(RopeKvWriteKernel<T>,
                        dim3(static_cast<unsigned>(CeilDiv(pairs, kThreads))), dim3(kThreads),
                        stream, static_cast<const T*>(qkv), pos, inv_freq, static_cast<T*>(q),
                        static_cast<T*>(k_cache), static_cast<T*>(v_cache), rows, q_cols,
                        kv_heads, seq, head_dim, interleaved, error_flags);
  });
}

}  // namespace sg::kernels
