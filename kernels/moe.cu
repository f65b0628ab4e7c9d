// The mixture-of-experts kernels (kernels/moe.cuh). Each reads the routing (expert ids)
// from device memory; nothing about it reaches the launch, so a captured step replays any
// routing.
//
// MoeRouteWeights: a warp per row, the softmax's max and sum over the experts reduced
//   across the warp, the chosen slots spread over the lanes.
// MoeMatMul: a block per (row, chosen expert) pair and kMoeMatMulCols output columns, a
//   warp per column walking the expert's row of w: float weights in 16-byte vectors, block
//   formats a unit of 32 values per lane at a time through the one reader of the device
//   layout (kernels/quant_blocks.cuh; unit g of the stacked tensor is unit g of its rows
//   e·N + c). Every pair reads its expert's matrix: rows that share an expert share it
//   through L2, not through one read. With many pairs per expert (a prefill step) the
//   blocks walk by expert instead (MoeGroupedMatMulKernel): a block per expert and 128
//   weight rows lists the pairs that chose it and multiplies them 32 at a time as a small
//   matrix product through shared memory, reading each unit once per tile of pairs. (The
//   CUDA dispatcher runs a decode step's block-format experts on the one-row kernel
//   instead, kernels/quant_matmul.cuh's LaunchQuantRowMoe: 1.3 to 2 times faster than the
//   block per pair at Qwen3-30B-A3B's shapes.)
// MoeCombine: a block per row and 256 columns; the block first ranks the row's slots by
//   expert id in shared memory, then each thread adds its column in that order with the
//   CPU reference's roundings (explicit _rn operations: no contraction into an FMA).
#include <algorithm>
#include <cmath>

#include "kernels/common.cuh"
#include "kernels/moe.cuh"
#include "kernels/moe_units.cuh"
#include "kernels/quant_blocks.cuh"
#include "stepgraph/base/error_flags.h"

namespace sg::kernels {
namespace {

constexpr int kRouteWarps = 4;
constexpr int kCombineThreads = 256;
constexpr int kMatMulThreads = static_cast<int>(kMoeMatMulCols) * kWarpSize;

// ---- MoeRouteWeights ---------------------------------------------------------------------

template <typename T>
__global__ void __launch_bounds__(kRouteWarps* kWarpSize)
    MoeRouteWeightsKernel(const T* __restrict__ logits, const int32_t* __restrict__ ids,
                          float* __restrict__ weights, int64_t rows, int experts, int top_k,
                          bool renormalize, bool round_to_dtype, uint32_t* error_flags) {
  AwaitPrerequisiteGrids();
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRouteWarps + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // the whole warp: no shuffle is left waiting
  float* out = weights + row * top_k;
  RowRouteWeights(logits + row * experts, ids + row * top_k, experts, top_k, renormalize,
                  round_to_dtype, error_flags, lane, [&](int j, float v) { out[j] = v; });
}

// ---- MoeMatMul ---------------------------------------------------------------------------

// Where a block's pair and its warp's column are: pair = row · top_k + slot (blockIdx.x),
// and the pair's expert. False when the warp's column is past n.
struct MoePair {
  int64_t row, slot, col;
  int32_t expert;
};

__device__ __forceinline__ bool LocatePair(const int32_t* ids, int64_t n, int top_k,
                                           MoePair& p) {
  const int64_t pair = blockIdx.x;
  p.row = pair / top_k;
  p.slot = pair % top_k;
  p.col = static_cast<int64_t>(blockIdx.y) * kMoeMatMulCols + threadIdx.x / kWarpSize;
  p.expert = ids[pair];
  return p.col < n;
}

template <typename T>
__device__ __forceinline__ bool ZeroBadExpert(const MoePair& p, int experts, T* out,
                                              uint32_t* error_flags) {
  if (p.expert >= 0 && p.expert < experts) return false;
  if (threadIdx.x % kWarpSize == 0) {
    out[p.col] = FromFloat<T>(0.0f);
    if (p.col == 0) RaiseExpertOutOfRange(error_flags);
  }
  return true;
}

// A column's value: the product as MoeMatMul stores it, or with kGated (w2 the up experts)
// SiluMul's value of the gate product `acc` and the up product `acc2`, each rounded first.
template <typename T, bool kGated>
__device__ __forceinline__ T MoeOutput(float acc, float acc2) {
  if constexpr (kGated) {
    return FromFloat<T>(Silu(RoundTo<T>(acc)) * RoundTo<T>(acc2));
  } else {
    return FromFloat<T>(acc);
  }
}

template <typename T, int W, bool kGated>
__global__ void __launch_bounds__(kMatMulThreads)
    MoeMatMulKernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ w2,
                    const int32_t* __restrict__ ids, T* __restrict__ y, int64_t n, int64_t k,
                    int top_k, bool per_slot, int experts, uint32_t* error_flags) {
  AwaitPrerequisiteGrids();
  MoePair p;
  if (!LocatePair(ids, n, top_k, p)) return;
  T* out = y + static_cast<int64_t>(blockIdx.x) * n;  // y[row, slot·n ..]
  if (ZeroBadExpert(p, experts, out, error_flags)) return;
  const T* xr = x + (per_slot ? (p.row * top_k + p.slot) * k : p.row * k);
  const int64_t at = (static_cast<int64_t>(p.expert) * n + p.col) * k;
  const T* wr = w + at;
  const int lane = threadIdx.x % kWarpSize;
  float acc = 0.0f, acc2 = 0.0f;
  const int64_t vectors = k / W;
  for (int64_t v = lane; v < vectors; v += kWarpSize) {
    const Vec<T, W> wv = LoadStreaming<T, W>(wr + v * W);
    const Vec<T, W> xv = LoadVec<T, W>(xr + v * W);
    if constexpr (kGated) {
      const Vec<T, W> uv = LoadStreaming<T, W>(w2 + at + v * W);
#pragma unroll
      for (int e = 0; e < W; ++e) acc2 = fmaf(ToFloat(xv.v[e]), ToFloat(uv.v[e]), acc2);
    }
#pragma unroll
    for (int e = 0; e < W; ++e) acc = fmaf(ToFloat(xv.v[e]), ToFloat(wv.v[e]), acc);
  }
  acc = WarpSum(acc);
  if constexpr (kGated) acc2 = WarpSum(acc2);
  if (lane == 0) out[p.col] = MoeOutput<T, kGated>(acc, acc2);
}

template <typename T, typename Q, bool kGated>
__global__ void __launch_bounds__(kMatMulThreads)
    MoeQuantMatMulKernel(const T* __restrict__ x, const uint8_t* __restrict__ w,
                         const uint8_t* __restrict__ w2, int64_t blocks,
                         const int32_t* __restrict__ ids, T* __restrict__ y, int64_t n,
                         int64_t k, int top_k, bool per_slot, int experts, bool vec_x,
                         uint32_t* error_flags) {
  AwaitPrerequisiteGrids();
  MoePair p;
  if (!LocatePair(ids, n, top_k, p)) return;
  T* out = y + static_cast<int64_t>(blockIdx.x) * n;
  if (ZeroBadExpert(p, experts, out, error_flags)) return;
  const T* xr = x + (per_slot ? (p.row * top_k + p.slot) * k : p.row * k);
  const int64_t units = k / quant::kUnitElems;
  const int64_t first = (static_cast<int64_t>(p.expert) * n + p.col) * units;
  const int lane = threadIdx.x % kWarpSize;
  float acc = 0.0f, acc2 = 0.0f;
  for (int64_t t = lane; t < units; t += kWarpSize) {
    const typename Q::Unit unit = Q::Load(w, blocks, first + t);
    // The up unit's loads go out with the gate unit's.
    typename Q::Unit unit2 = unit;
    if constexpr (kGated) unit2 = Q::Load(w2, blocks, first + t);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float v[8], a[8];
      unit.Values8(j, v);
      quant::LoadX8(xr + t * quant::kUnitElems + 8 * j, vec_x, a);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc = fmaf(v[i], a[i], acc);
      if constexpr (kGated) {
        unit2.Values8(j, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc2 = fmaf(v[i], a[i], acc2);
      }
    }
  }
  acc = WarpSum(acc);
  if constexpr (kGated) acc2 = WarpSum(acc2);
  if (lane == 0) out[p.col] = MoeOutput<T, kGated>(acc, acc2);
}

// ---- MoeMatMul by expert (prefill) --------------------------------------------------------
//
// With many rows a (row, expert) pair per block reads each expert's matrix once per row
// that chose it. Here a block takes one expert and kTileRows rows of its weight
// (kTileRows output columns, or with kGated kTileRows / 2 columns' gate and up rows,
// interleaved) and finds the pairs that chose its expert (a window of pairs at a time,
// listed in shared memory, a tile's worth carried over to the next window); it
// multiplies them kTilePairs at a time as a small matrix
// product on CUDA cores: per unit of K (32 values) half the threads decode the block's
// rows of the unit into shared memory (a thread a row, the CPU reference's values) and the
// other half copy the tile's pairs' 32 values of x beside them, then each thread adds up a
// tile of 4 pairs × 4 weight rows, two 16-byte shared loads per 16 FMAs (f32 products,
// summed in K's order). So an expert's units are read once per tile of pairs and x once
// per block, where the kernel before this one reread each listed pair's x from memory for
// every column. Block `experts` (one past the last) takes the pairs whose id is out of
// range: zeros and the error flag, as the pair kernels do.

constexpr int kGroupedWindow = 512;  // pairs listed per pass
constexpr int kTilePairs = 32;       // pairs per product tile: 4 per warp
constexpr int kTileRows = 128;       // weight rows per block: 4 per lane
static_assert(kMatMulThreads == 2 * kTileRows && kTilePairs * 4 == kTileRows &&
              kTilePairs == 4 * (kMatMulThreads / kWarpSize));

// Output columns one by-expert block computes.
template <bool kGated>
constexpr int64_t GroupedCols() {
  return kGated ? kTileRows / 2 : kTileRows;
}

// Unit t (values 32t .. 32t + 31) of row `row` (= expert · n + column) of a block-format w:
// Fetch loads it (nothing computed from the bytes, so the loads stay in flight until the
// Decode that needs them), Decode gives its 32 values as the CPU reference dequantizes
// them.
template <typename Q>
struct QuantUnits {
  using Raw = typename Q::Raw;
  const uint8_t* w;
  int64_t blocks;
  __device__ __forceinline__ Raw Fetch(int64_t row, int64_t units, int64_t t) const {
    return Q::Fetch(w, blocks, row * units + t);
  }
  __device__ __forceinline__ void Decode(const Raw& raw, float (&v)[32]) const {
    const typename Q::Unit unit = Q::Decode(raw);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float f[8];
      unit.Values8(j, f);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[8 * j + i] = f[i];
    }
  }
};

// The same of a float w of x's dtype (k a multiple of 32, w 16-byte aligned).
template <typename T>
struct FloatUnits {
  static constexpr int kW = kVec16<T>;
  struct Raw {
    Vec<T, kW> q[quant::kUnitElems / kW];
  };
  const T* w;
  __device__ __forceinline__ Raw Fetch(int64_t row, int64_t units, int64_t t) const {
    const T* p = w + (row * units + t) * quant::kUnitElems;
    Raw raw;
#pragma unroll
    for (int i = 0; i < quant::kUnitElems / kW; ++i) raw.q[i] = LoadStreaming<T, kW>(p + i * kW);
    return raw;
  }
  __device__ __forceinline__ void Decode(const Raw& raw, float (&v)[32]) const {
#pragma unroll
    for (int i = 0; i < quant::kUnitElems / kW; ++i) {
#pragma unroll
      for (int e = 0; e < kW; ++e) v[i * kW + e] = ToFloat(raw.q[i].v[e]);
    }
  }
};

template <typename T, typename Units, bool kGated>
__global__ void __launch_bounds__(kMatMulThreads)
    MoeGroupedMatMulKernel(const T* __restrict__ x, Units w, Units w2,
                           const int32_t* __restrict__ ids, T* __restrict__ y, int64_t pairs,
                           int64_t n, int64_t k, int top_k, bool per_slot, int experts,
                           bool vec_x, uint32_t* error_flags) {
  AwaitPrerequisiteGrids();
  // The listed pairs (indices into ids): fewer than kTilePairs left from the windows
  // before, then this window's.
  __shared__ int32_t listed[kTilePairs + kGroupedWindow];
  __shared__ int count;
  __shared__ __align__(16) float ws[quant::kUnitElems][kTileRows];
  __shared__ __align__(16) float xs[quant::kUnitElems][kTilePairs];
  const int expert = static_cast<int>(blockIdx.x);  // == experts: the bad ids
  const bool bad_ids = expert == experts;
  const int warp = static_cast<int>(threadIdx.x / kWarpSize);
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  constexpr int64_t kCols = GroupedCols<kGated>();
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * kCols;
  const int64_t units = k / quant::kUnitElems;
  // The weight row a decoding thread (threadIdx.x < kTileRows) reads: with kGated rows
  // 2c and 2c + 1 of the tile are column c's gate and up rows. A column past n reads the
  // last one again and is not written.
  const int r = static_cast<int>(threadIdx.x);
  const bool decodes = r < kTileRows;
  const bool up_row = kGated && (r & 1) != 0;
  const int64_t row_col = std::min<int64_t>(col0 + (kGated ? r / 2 : r), n - 1);
  const int64_t w_row = static_cast<int64_t>(expert) * n + row_col;
  // A copying thread's pair of the tile and its 8 values of each unit.
  const int copy = static_cast<int>(threadIdx.x) - kTileRows;
  const int copy_pair = copy % kTilePairs, copy_part = copy / kTilePairs;

  // The product of listed pairs t0 .. t0 + tile − 1 (tile <= kTilePairs), written to y.
  auto product = [&](int t0, int tile) {
    const T* xr = nullptr;
    if (!decodes && copy_pair < tile) {
      const int64_t pair = listed[t0 + copy_pair];
      xr = x + (per_slot ? pair : pair / top_k) * k + 8 * copy_part;
    }
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    }
    // Each thread's part of unit u + 1 is asked for before it multiplies unit u.
    const Units wu = up_row ? w2 : w;
    typename Units::Raw raw{};
    float a[8] = {};
    auto fetch = [&](int64_t u) {
      if (decodes) {
        raw = wu.Fetch(w_row, units, u);
      } else if (xr != nullptr) {
        quant::LoadX8(xr + u * quant::kUnitElems, vec_x, a);
      }
    };
    fetch(0);
    for (int64_t u = 0; u < units; ++u) {
      if (decodes) {
        float v[quant::kUnitElems];
        wu.Decode(raw, v);
#pragma unroll
        for (int e = 0; e < quant::kUnitElems; ++e) ws[e][r] = v[e];
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) xs[8 * copy_part + e][copy_pair] = a[e];
      }
      __syncthreads();
      if (u + 1 < units) fetch(u + 1);
#pragma unroll 8
      for (int e = 0; e < quant::kUnitElems; ++e) {
        const float4 wv = *reinterpret_cast<const float4*>(&ws[e][4 * lane]);
        const float4 xv = *reinterpret_cast<const float4*>(&xs[e][4 * warp]);
        const float wf[4] = {wv.x, wv.y, wv.z, wv.w};
        const float xf[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(xf[i], wf[j], acc[i][j]);
        }
      }
      __syncthreads();  // the next unit rewrites the tiles
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int p = 4 * warp + i;
      if (p >= tile) continue;
      T* out = y + static_cast<int64_t>(listed[t0 + p]) * n;
      if constexpr (kGated) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t col = col0 + 2 * lane + h;
          if (col < n) out[col] = MoeOutput<T, true>(acc[i][2 * h], acc[i][2 * h + 1]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t col = col0 + 4 * lane + j;
          if (col < n) out[col] = MoeOutput<T, false>(acc[i][j], 0.0f);
        }
      }
    }
  };

  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  for (int64_t w0 = 0; w0 < pairs; w0 += kGroupedWindow) {
    const int64_t w1 = w0 + kGroupedWindow < pairs ? w0 + kGroupedWindow : pairs;
    for (int64_t p = w0 + threadIdx.x; p < w1; p += blockDim.x) {
      const int32_t id = ids[p];
      if (bad_ids ? (id < 0 || id >= experts) : id == expert) {
        listed[atomicAdd(&count, 1)] = static_cast<int32_t>(p);
      }
    }
    __syncthreads();
    const int found = count;
    const bool last = w1 == pairs;
    if (bad_ids) {
      for (int i = threadIdx.x; i < found * kCols; i += blockDim.x) {
        const int64_t col = col0 + i % kCols;
        if (col < n) y[static_cast<int64_t>(listed[i / kCols]) * n + col] = FromFloat<T>(0.0f);
      }
      if (found > 0 && blockIdx.y == 0 && threadIdx.x == 0) RaiseExpertOutOfRange(error_flags);
      __syncthreads();
      if (threadIdx.x == 0) count = 0;
    } else {
      // Whole tiles; the rest waits for the next window's pairs, but after the last.
      const int done = last ? found : found / kTilePairs * kTilePairs;
      for (int t0 = 0; t0 < done; t0 += kTilePairs) {
        product(t0, found - t0 < kTilePairs ? found - t0 : kTilePairs);
      }
      // The rest (fewer than kTilePairs) to the front of the list.
      const int rest = found - done;
      int32_t moved = 0;
      if (done > 0 && static_cast<int>(threadIdx.x) < rest) moved = listed[done + threadIdx.x];
      __syncthreads();
      if (done > 0 && static_cast<int>(threadIdx.x) < rest) listed[threadIdx.x] = moved;
      if (threadIdx.x == 0) count = rest;
    }
    __syncthreads();  // the next window appends to the list
  }
}

// ---- MoeCombine --------------------------------------------------------------------------

// With kRoute, `weights` is the router's logits [rows, route.experts] and the block's
// first warp computes the row's weights (RowRouteWeights, as MoeRouteWeights does).
struct CombineRoute {
  int experts = 0;
  bool renormalize = true, round_to_dtype = false;
  uint32_t* error_flags = nullptr;
};

template <typename T, typename TW, bool kRoute>
__global__ void __launch_bounds__(kCombineThreads)
    MoeCombineKernel(const T* __restrict__ y, const TW* __restrict__ weights,
                     const int32_t* __restrict__ ids, const T* residual, T* out, int64_t n,
                     int top_k, CombineRoute route) {
  AwaitPrerequisiteGrids();
  __shared__ int order[kMoeCombineMaxTopK];
  __shared__ float scale[kMoeCombineMaxTopK];
  const int64_t row = blockIdx.x;
  const int32_t* row_ids = ids + row * top_k;
  for (int j = threadIdx.x; j < top_k; j += blockDim.x) {
    order[SlotRank(row_ids, top_k, j)] = j;
    if constexpr (!kRoute) scale[j] = ToFloat(weights[row * top_k + j]);
  }
  if constexpr (kRoute) {
    if (threadIdx.x < kWarpSize) {
      // Every block of the row computes them; one flags a bad id.
      RowRouteWeights(weights + row * route.experts, row_ids, route.experts, top_k,
                      route.renormalize, route.round_to_dtype,
                      blockIdx.y == 0 ? route.error_flags : nullptr,
                      static_cast<int>(threadIdx.x), [&](int j, float v) { scale[j] = v; });
    }
  }
  __syncthreads();
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= n) return;
  const T* yr = y + row * top_k * n + c;
  float sum = 0.0f;
  for (int r = 0; r < top_k; ++r) {
    const int j = order[r];
    sum = AddCombineTerm<T>(sum, scale[j], ToFloat(yr[j * n]));
  }
  // The residual add as Add computes it (out may be residual itself: this thread alone
  // reads and writes the element).
  if (residual != nullptr) sum = __fadd_rn(sum, ToFloat(residual[row * n + c]));
  out[row * n + c] = FromFloat<T>(sum);
}

}  // namespace

cudaError_t LaunchMoeRouteWeights(const void* logits, DType dtype, const int32_t* ids,
                                  float* weights, int64_t rows, int64_t experts, int64_t top_k,
                                  bool renormalize, bool round_to_dtype, uint32_t* error_flags,
                                  Stream stream) {
  if (rows <= 0 || experts <= 0 || top_k <= 0 || experts > 0x7fffffff || top_k > 0x7fffffff ||
      CeilDiv(rows, kRouteWarps) > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  return DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return LaunchKernel(MoeRouteWeightsKernel<T>,
                        dim3(static_cast<unsigned>(CeilDiv(rows, kRouteWarps))),
                        dim3(kRouteWarps * kWarpSize), stream, static_cast<const T*>(logits),
                        ids, weights, rows, static_cast<int>(experts), static_cast<int>(top_k),
                        renormalize, round_to_dtype, error_flags);
  });
}

bool MoeMatMulTakes(int64_t rows, int64_t experts, int64_t n, int64_t k, int64_t top_k,
                    DType dtype, DType w_dtype) {
  if (!IsFloat(dtype) || (w_dtype != dtype && !IsQuantized(w_dtype))) return false;
  if (rows <= 0 || experts <= 0 || n <= 0 || k <= 0 || top_k <= 0) return false;
  if (experts > 0x7fffffff || top_k > 0x7fffffff || rows > 0x7fffffff / top_k) return false;
  if (CeilDiv(n, kMoeMatMulCols) > 65535) return false;
  return !IsQuantized(w_dtype) || k % DTypeBlockElems(w_dtype) == 0;
}

bool MoeMatMulWalksByExpert(int64_t pairs, int64_t experts, int64_t k,
                            int64_t by_expert_pairs) {
  return experts > 0 && experts < 0x7fffffff && pairs / experts >= by_expert_pairs &&
         k % quant::kUnitElems == 0;
}

cudaError_t LaunchMoeMatMul(const void* x, const void* w, DType w_dtype, const int32_t* ids,
                            void* y, int64_t rows, int64_t experts, int64_t n, int64_t k,
                            int64_t top_k, bool per_slot, DType dtype, uint32_t* error_flags,
                            Stream stream, const void* w_up, int64_t by_expert_pairs) {
  if (!MoeMatMulTakes(rows, experts, n, k, top_k, dtype, w_dtype) ||
      (w_up != nullptr && per_slot) || by_expert_pairs < 0) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(rows * top_k),
                  static_cast<unsigned>(CeilDiv(n, kMoeMatMulCols)));
  const dim3 block(kMatMulThreads);
  const int e = static_cast<int>(experts), kk = static_cast<int>(top_k);
  const bool gated = w_up != nullptr;
  auto dispatch_gated = [&](auto&& f) {
    return gated ? f(std::true_type{}) : f(std::false_type{});
  };
  // Enough pairs that an expert's matrix would be read by several: by expert.
  const int64_t pairs = rows * top_k;
  const bool by_expert = MoeMatMulWalksByExpert(pairs, experts, k, by_expert_pairs);
  const dim3 expert_grid(static_cast<unsigned>(experts + 1),
                         static_cast<unsigned>(CeilDiv(n, gated ? GroupedCols<true>()
                                                                : GroupedCols<false>())));
  if (IsQuantized(w_dtype)) {
    if (!Aligned16(w) || (gated && !Aligned16(w_up))) return cudaErrorMisalignedAddress;
    const int64_t blocks = experts * n * (k / DTypeBlockElems(w_dtype));
    return DispatchFloat(dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      // Every unit starts at a multiple of 32 elements of a row (or slot) of x.
      const bool vec_x = Aligned16(x);
      return quant::DispatchFormat(w_dtype, [&](auto format) {
        using Q = decltype(format);
        if (by_expert) {
          const QuantUnits<Q> units{static_cast<const uint8_t*>(w), blocks};
          const QuantUnits<Q> units2{static_cast<const uint8_t*>(w_up), blocks};
          return dispatch_gated([&](auto g) {
            return LaunchKernel(MoeGroupedMatMulKernel<T, QuantUnits<Q>, decltype(g)::value>,
                                expert_grid, block, stream, static_cast<const T*>(x), units,
                                units2, ids, static_cast<T*>(y), pairs, n, k, kk, per_slot, e,
                                vec_x, error_flags);
          });
        }
        return dispatch_gated([&](auto g) {
          return LaunchKernel(MoeQuantMatMulKernel<T, Q, decltype(g)::value>, grid, block,
                              stream, static_cast<const T*>(x), static_cast<const uint8_t*>(w),
                              static_cast<const uint8_t*>(w_up), blocks, ids,
                              static_cast<T*>(y), n, k, kk, per_slot, e, vec_x, error_flags);
        });
      });
    });
  }
  return DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Rows (and slots) of x and w start at multiples of k: whole vectors when k is.
    const bool vectorize = k % kVec16<T> == 0 && Aligned16(x) && Aligned16(w) &&
                           (!gated || Aligned16(w_up));
    if (by_expert && vectorize) {
      const FloatUnits<T> units{static_cast<const T*>(w)};
      const FloatUnits<T> units2{static_cast<const T*>(w_up)};
      return dispatch_gated([&](auto g) {
        return LaunchKernel(MoeGroupedMatMulKernel<T, FloatUnits<T>, decltype(g)::value>,
                            expert_grid, block, stream, static_cast<const T*>(x), units, units2,
                            ids, static_cast<T*>(y), pairs, n, k, kk, per_slot, e, true,
                            error_flags);
      });
    }
    return DispatchVecWidth<T>(vectorize, [&](auto width) {
      constexpr int W = decltype(width)::value;
      return dispatch_gated([&](auto g) {
        return LaunchKernel(MoeMatMulKernel<T, W, decltype(g)::value>, grid, block, stream,
                            static_cast<const T*>(x), static_cast<const T*>(w),
                            static_cast<const T*>(w_up), ids, static_cast<T*>(y), n, k, kk,
                            per_slot, e, error_flags);
      });
    });
  });
}

cudaError_t LaunchMoeCombine(const void* y, DType dtype, const void* weights,
                             DType weights_dtype, const int32_t* ids, void* out, int64_t rows,
                             int64_t n, int64_t top_k, Stream stream, const void* residual,
                             const MoeCombineRoute* route) {
  if (rows <= 0 || rows > 0x7fffffff || n <= 0 || top_k <= 0 || top_k > kMoeCombineMaxTopK ||
      CeilDiv(n, kCombineThreads) > 65535) {
    return cudaErrorInvalidValue;
  }
  if (route != nullptr && (route->experts <= 0 || route->experts > 0x7fffffff)) {
    return cudaErrorInvalidValue;
  }
  CombineRoute r;
  if (route != nullptr) {
    r = CombineRoute{static_cast<int>(route->experts), route->renormalize,
                     route->round_to_dtype, route->error_flags};
  }
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(CeilDiv(n, kCombineThreads)));
  return DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return DispatchFloat(weights_dtype, [&](auto weights_tag) {
      using TW = typename decltype(weights_tag)::type;
      auto launch = [&](auto kernel) {
        return LaunchKernel(kernel, grid, dim3(kCombineThreads), stream,
                            static_cast<const T*>(y), static_cast<const TW*>(weights), ids,
                            static_cast<const T*>(residual), static_cast<T*>(out), n,
                            static_cast<int>(top_k), r);
      };
      return route != nullptr ? launch(MoeCombineKernel<T, TW, true>)
                              : launch(MoeCombineKernel<T, TW, false>);
    });
  });
}

}  // namespace sg::kernels
