// Conformance of the CUDA ops on weights in GGUF block formats against the CPU reference
// (tests/testing/conformance.h: the same random inputs on both sides, weights quantized
// from random values with QuantizeRow, arenas poisoned): MatMul for every format ×
// activation dtype × M in {1, 2, 5, 8} (and M = 11, two row groups) at a decode shape and
// at odd ones (K not a multiple of 256 for the 32-element formats, N odd), with and
// without bias; Embedding rows, which must equal the reference bit for bit, bad ids
// included; FusedMatMul over block formats, every epilogue and formats mixed. Skipped
// without a device; the host reading of the device layout and CUDA's fusion answers run
// everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/matmul.h"
#include "kernels/block_mma.cuh"
#include "kernels/fused_matmul.cuh"
#include "kernels/quant_layout.h"
#include "kernels/quant_matmul.cuh"
#include "stepgraph/base/quant.h"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/runtime/step_runner.h"
#include "tests/testing/conformance.h"

namespace sg::testing {
namespace {

constexpr DType kFloatTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
constexpr DType kQuantTypes[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                                 DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

// Both sides multiply the same dequantized values in f32; only the order of the additions
// differs (and, below f32, the output's rounding).
double Tol(DType t) { return t == DType::kF32 ? 1e-5 : 1e-2; }

std::vector<OpCase> MatmulCases() {
  std::vector<OpCase> cases;
  struct Mm {
    int64_t k, n;
    bool bias;
  };
  for (DType q : kQuantTypes) {
    const int64_t block = DTypeBlockElems(q);
    // A Llama-3.2-1B k/v projection; then K of 3 blocks (96 for the 32-element formats:
    // not a multiple of 256) with N odd; then one block with a bias; then, at one row, an
    // output wide enough that the K formats take the fused kernel unsplit (an lm head's
    // path: 1,202 columns fill two blocks per SM up to 150 SMs; the last block partial).
    const Mm shapes[] = {{2048, 512, false}, {3 * block, 33, false}, {block, 7, true},
                         {1024, 1202, false}};
    for (DType t : kFloatTypes) {
      for (const Mm& s : shapes) {
        for (int64_t m : {1, 2, 5, 8, 11}) {
          if (m == 11 && s.k == 2048) continue;  // row groups: the small shapes suffice
          if (m != 1 && s.n == 1202) continue;
          cases.push_back(
              {.name = absl::StrCat("MatMul/", DTypeName(q), "/", DTypeName(t), "/", m, "x", s.k,
                                    "x", s.n, s.bias ? "+bias" : ""),
               .build = [=](GraphBuilder& b) {
                 auto x = b.Input("x", t, {m, s.k});
                 auto w = b.Weight("w", q, {s.n, s.k});
                 b.Output("out", s.bias ? b.MatMul(x, w, b.Weight("bias", t, {s.n}))
                                        : b.MatMul(x, w));
               },
               .tolerance = Tol(t),
               // The block-format kernel itself, row groups included; the tensor-core kernel
               // (MmaMatmulCases) and the block GEMM that take over from
               // CudaOptions::block_mma_min_rows and block_gemm_min_rows rows have cases of
               // their own (the latter in cuda_block_gemm_test).
               .cuda_options = [](CudaOptions& o) {
                 o.block_gemm_min_rows = 0;
                 o.block_mma_min_rows = 0;
                 o.block_row_min_cols = 0;
                 o.block_gemv_precision = BlockGemvPrecision::kF32;
               }});
        }
      }
      // The one-row kernel (an lm head's path in every format but Q5_K), forced on
      // narrow outputs: a chunk of 64 units exactly, lanes past the row (K of 3 blocks),
      // three chunks with the last one partial, and more columns than the grid has warps
      // at once.
      const Mm row_shapes[] = {{2048, 512, false}, {3 * block, 33, false},
                               {(block == 32 ? 144 : 18) * block, 300, false},
                               {1024, 9000, false}};
      for (const Mm& s : row_shapes) {
        if (q == DType::kQ5_K) break;
        cases.push_back(
            {.name = absl::StrCat("MatMul/", DTypeName(q), "/", DTypeName(t), "/1x", s.k, "x",
                                  s.n, "/row_kernel"),
             .build = [=](GraphBuilder& b) {
               b.Output("out", b.MatMul(b.Input("x", t, {1, s.k}), b.Weight("w", q, {s.n, s.k})));
             },
             .tolerance = Tol(t),
             .cuda_options = [](CudaOptions& o) {
               o.block_row_min_cols = 1;
               o.block_gemv_precision = BlockGemvPrecision::kF32;
             }});
      }
    }
  }
  return cases;
}

// The tensor-core kernel (kernels/block_mma.cuh) in every block shape it is compiled for
// (decode: row tiles of 8, 16 and 32 rows, 64 columns; prefill from 33 rows: 64 rows and
// 128 columns, one partial row group at 40 rows, three at 130; staged: 128 rows and
// columns, x through shared memory, automatic only on wide grids; from 24 rows each shape
// forced, and the staged one over 64 units split four ways at 130 rows), odd N (a partial
// block and a partial warp tile), K of whole and partial stages of 4 units, with bias;
// f32 x in three bf16 parts (exact products: f32's tolerance), under
// block_gemm_precision bf16x2 in two (16 significant bits: 5e-5), under bf16 in one
// (bf16's), and under f16x2 in two f16 parts per 32 values scaled by a power of two
// (f32's tolerance, every shape: its scales pass through the staged shape's copies too);
// under f16 the first of those parts alone (kBlockMmaF16x1, every shape: each value to
// 2^-12 of its unit's largest, 3e-3).
// Under int8, every shape with x that int8 holds exactly (each row's 32 values q·2^−e,
// integers q within ±127, one of them ±127: the kernel's codes are q and its scale 2^−e,
// so f32's tolerance holds and a code, scale or row out of place shows), and random x where
// bf16x2 runs (1e-2: x to half of 1/127 of its unit's largest). The default precision,
// auto, at 130 rows (two scaled f16 parts there) at f32's tolerance.
// x [m, k] that int8 per 32 values holds exactly: each unit of a row is q·2^−e, q integers
// uniform in [−127, 127] and one of them ±127, e in [0, 8) (so that units' scales differ).
std::vector<float> Int8ExactX(int64_t m, int64_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> code(-127, 127), exponent(0, 7), at(0, 31), sign(0, 1);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (int64_t u = 0; u < m * k / 32; ++u) {
    const float scale = std::ldexp(1.0f, -exponent(rng));
    for (int i = 0; i < 32; ++i) x[u * 32 + i] = static_cast<float>(code(rng)) * scale;
    x[u * 32 + at(rng)] = (sign(rng) ? 127.0f : -127.0f) * scale;
  }
  return x;
}

// The int8 cases on random x (a precision value of its own in MmaMatmulCases' loop).
constexpr auto kInt8RandomX = static_cast<BlockGemmPrecision>(255);

std::vector<OpCase> MmaMatmulCases() {
  std::vector<OpCase> cases;
  struct Mm {
    int64_t m, k, n;
    bool bias;
  };
  for (DType q : kQuantTypes) {
    const int64_t block = DTypeBlockElems(q);
    const Mm shapes[] = {{2, 2048, 512, false},
                         {16, 3 * block, 75, true},
                         {5, block, 7, false},
                         {24, 2 * block, 100, false},
                         {40, 5 * block, 130, true},
                         {130, 2 * block, 300, false},
                         {130, 2048, 2048, true}};
    constexpr BlockMmaShapeOption kAuto = BlockMmaShapeOption::kAuto;
    for (DType t : kFloatTypes) {
      for (const Mm& s : shapes) {
        for (BlockGemmPrecision precision :
             {BlockGemmPrecision::kF32, BlockGemmPrecision::kBf16, BlockGemmPrecision::kBf16x2,
              BlockGemmPrecision::kF16x2, BlockGemmPrecision::kF16, BlockGemmPrecision::kInt8,
              kInt8RandomX, BlockGemmPrecision::kAuto}) {
          const bool bf16_x = precision == BlockGemmPrecision::kBf16;
          const bool parts2 = precision == BlockGemmPrecision::kBf16x2;
          // Two scaled f16 parts (f32 x only): every shape, at f32's tolerance.
          const bool f16x2 = precision == BlockGemmPrecision::kF16x2;
          const bool f16x1 = precision == BlockGemmPrecision::kF16;  // one scaled f16 part
          const bool int8 = precision == BlockGemmPrecision::kInt8;
          const bool int8_random = precision == kInt8RandomX;
          // The default, auto, where it takes one scaled f16 part: from 16 rows.
          const bool automatic = precision == BlockGemmPrecision::kAuto;
          if (automatic && (t != DType::kF32 || s.m < kBlockGemmAutoF16Rows)) continue;
          if ((f16x2 || f16x1 || int8 || int8_random) && t != DType::kF32) continue;
          if (int8_random && s.m != 16 && s.k != 2048) continue;
          if (bf16_x && (t != DType::kF32 || s.m != 16)) continue;
          // Two parts: a decode-shape row count and the staged shape over many units.
          if (parts2 && (t != DType::kF32 || (s.m != 16 && s.k != 2048))) continue;
          // From 24 rows every block shape forced too (the automatic choice is by rows);
          // the staged shape alone over many units (its copies' pipeline, split-K).
          for (BlockMmaShapeOption shape :
               {kAuto, BlockMmaShapeOption::kDecode, BlockMmaShapeOption::kPrefill,
                BlockMmaShapeOption::kStaged}) {
            const bool long_k = s.k == 2048 && s.m > 100;
            if (long_k ? shape != BlockMmaShapeOption::kStaged
                       : shape != kAuto &&
                             (s.m < 24 || bf16_x || parts2 || int8_random || automatic)) {
              continue;
            }
            static constexpr const char* kShapeNames[] = {"", "/decode", "/prefill", "/staged"};
            cases.push_back(
                {.name = absl::StrCat("MmaMatMul/", DTypeName(q), "/", DTypeName(t), "/", s.m,
                                      "x", s.k, "x", s.n, s.bias ? "+bias" : "",
                                      bf16_x ? "/bf16_x" : "", parts2 ? "/bf16x2_x" : "",
                                      f16x2 ? "/f16x2_x" : "", f16x1 ? "/f16_x" : "",
                                      int8 ? "/int8_exact_x" : "",
                                      int8_random ? "/int8_x" : "", automatic ? "/auto" : "",
                                      kShapeNames[static_cast<int>(shape)]),
                 .build = [=](GraphBuilder& b) {
                   auto x = b.Input("x", t, {s.m, s.k});
                   auto w = b.Weight("w", q, {s.n, s.k});
                   b.Output("out", s.bias ? b.MatMul(x, w, b.Weight("bias", t, {s.n}))
                                          : b.MatMul(x, w));
                 },
                 .tolerance = bf16_x || int8_random ? 1e-2
                              : f16x1 || automatic  ? 3e-3
                              : parts2              ? 5e-5
                                                    : Tol(t),
                 .float_values = int8 ? std::vector<std::pair<std::string, std::vector<float>>>{
                                            {"x", Int8ExactX(s.m, s.k, s.m * s.k + s.n)}}
                                      : std::vector<std::pair<std::string, std::vector<float>>>{},
                 .cuda_options = [=](CudaOptions& o) {
                   o.block_gemm_min_rows = 0;
                   o.block_mma_min_rows = 1;
                   o.block_mma_shape = shape;
                   o.block_gemm_precision =
                       int8_random ? BlockGemmPrecision::kInt8 : precision;
                 }});
          }
        }
      }
    }
  }
  return cases;
}

std::vector<OpCase> EmbeddingCases() {
  std::vector<OpCase> cases;
  for (DType q : kQuantTypes) {
    const int64_t hidden = 3 * DTypeBlockElems(q);
    for (DType t : kFloatTypes) {
      for (int64_t m : {1, 8}) {
        cases.push_back({.name = absl::StrCat("Embedding/", DTypeName(q), "/", DTypeName(t),
                                              "/V300xH", hidden, "/M", m),
                         .build = [=](GraphBuilder& b) {
                           b.Output("out", b.Embedding(b.Weight("table", q, {300, hidden}),
                                                       b.Input("ids", DType::kI32, {m}), t));
                         },
                         .tolerance = 0.0,
                         .int_hi = 300});
      }
      cases.push_back({.name = absl::StrCat("Embedding/", DTypeName(q), "/", DTypeName(t),
                                            "/bad_ids"),
                       .build = [=](GraphBuilder& b) {
                         b.Output("out", b.Embedding(b.Weight("table", q, {64, hidden}),
                                                     b.Input("ids", DType::kI32, {4}), t));
                       },
                       .tolerance = 0.0,
                       .int_values = {{"ids", {-1, 5, 64, 63}}}});
    }
  }
  return cases;
}

// FusedMatMul over block-format weights (the passes' fused ops on a GGUF file): every
// format with every epilogue, the folded norm, split-K (narrow outputs, long K), partial
// column blocks and row counts the block kernel cuts into launches of 8, 4, 2 and 1 rows
// (3, 5, 11); then weights of different formats in one op, as a Q4_K_M file's q, k (Q4_K)
// and v (Q6_K). Weights are quantized from random values, as the MatMul cases'.
using Epilogue = ops::FusedMatMul::Epilogue;

struct FusedShape {
  int64_t m, k;
  std::vector<DType> w;  // each weight's format
  std::vector<int64_t> n;
  bool norm;
  Epilogue e;
};

// The fused kernel on CUDA cores, or (mma) on tensor cores from one row on; never the
// one-row kernel, whose cases force it (the row_kernel and IntRow cases).
std::function<void(CudaOptions&)> BlockKernels(bool mma) {
  return [mma](CudaOptions& o) {
    o.block_mma_min_rows = mma ? 1 : 0;
    o.block_gemm_precision = BlockGemmPrecision::kF32;  // exact x (auto's f16 from 16 rows)
    o.block_row_fused_max_k = 0;
    o.block_gemv_precision = BlockGemvPrecision::kF32;
  };
}

OpCase FusedCase(const FusedShape& f, DType t, bool mma = false) {
  std::string name = absl::StrCat(mma ? "Mma" : "", "FusedMatMul/", DTypeName(t), "/", f.m,
                                  "x", f.k);
  for (size_t g = 0; g < f.n.size(); ++g) {
    absl::StrAppend(&name, "/", DTypeName(f.w[g]), "x", f.n[g]);
  }
  absl::StrAppend(&name, f.norm ? "/norm" : "", "/epilogue", static_cast<int>(f.e));
  const bool ids = f.e == Epilogue::kArgmax;
  return {.name = name,
          .build = [=](GraphBuilder& b) {
            ops::FusedMatMul op{.norm = f.norm, .eps = 1e-5f,
                                .weights = static_cast<int32_t>(f.n.size()), .epilogue = f.e};
            std::vector<TensorId> in = {b.Input("x", t, {f.m, f.k})};
            if (f.norm) in.push_back(b.Weight("norm_w", t, {f.k}));
            int64_t total = 0;
            for (size_t g = 0; g < f.n.size(); ++g) {
              in.push_back(b.Weight(absl::StrCat("w", g), f.w[g], {f.n[g], f.k}));
              total += f.n[g];
            }
            if (f.e == Epilogue::kAdd) in.push_back(b.Input("residual", t, {f.m, total}));
            b.Output("out", b.FusedMatMul(op, in));
          },
          .tolerance = Tol(t),
          // Below f32 products tie often; sums in another order may break a tie otherwise.
          .exact_ids = !ids || t == DType::kF32,
          .cuda_options = BlockKernels(mma)};
}

// q, k and v of a layer with the rope_kv_write epilogue: h heads, kvh kv heads of d.
OpCase FusedRopeCase(int64_t m, int64_t k, int64_t h, int64_t kvh, int64_t d, bool norm,
                     bool interleaved, DType wq, DType wv, DType t, bool mma = false) {
  return {.name = absl::StrCat(mma ? "Mma" : "", "FusedMatMul/", DTypeName(t),
                               "/rope_kv_write/", m, "x", k, "/",
                               DTypeName(wq), "/v_", DTypeName(wv), "/h", h, "kv", kvh, "d", d,
                               norm ? "/norm" : "", interleaved ? "/interleaved" : ""),
          .build = [=](GraphBuilder& b) {
            ops::Rope rope{.head_dim = static_cast<int32_t>(d), .theta = 500000.0f,
                           .interleaved = interleaved};
            ops::FusedMatMul op{.norm = norm, .eps = 1e-5f, .weights = 3,
                                .epilogue = Epilogue::kRopeKvWrite, .rope = rope};
            std::vector<TensorId> in = {b.Input("x", t, {m, k})};
            if (norm) in.push_back(b.Weight("norm_w", t, {k}));
            in.push_back(b.Weight("wq", wq, {h * d, k}));
            in.push_back(b.Weight("wk", wq, {kvh * d, k}));
            in.push_back(b.Weight("wv", wv, {kvh * d, k}));
            in.push_back(b.Input("pos", DType::kI32, {m}));
            TensorId kc = b.State("kc", t, {m + 1, kvh, 32, d});
            TensorId vc = b.State("vc", t, {m + 1, kvh, 32, d});
            in.push_back(kc);
            in.push_back(vc);
            b.Output("q", b.FusedMatMul(op, in));
            b.Output("kc_out", kc);
            b.Output("vc_out", vc);
          },
          .tolerance = Tol(t),
          // A padding row and a position past the cache among the rows.
          .int_values = {{"pos", std::vector<int32_t>{7, -1, 40, 31, 0}}},
          .cuda_options = BlockKernels(mma)};
}

std::vector<OpCase> FusedCases() {
  std::vector<OpCase> cases;
  for (DType q : kQuantTypes) {
    const std::vector<FusedShape> shapes = {
        {1, 512, {q, q, q}, {256, 64, 64}, true, Epilogue::kNone},  // q/k/v, no rope
        {3, 512, {q}, {128}, false, Epilogue::kAdd},                // narrow: split-K; 2 + 1 rows
        {2, 512, {q, q}, {96, 96}, true, Epilogue::kSiluMul},       // gate/up
        {1, 1024, {q}, {1000}, true, Epilogue::kArgmax},            // lm head
        {5, 256, {q}, {37}, false, Epilogue::kNone},                // partial block; 4 + 1 rows
        {11, 256, {q}, {13}, true, Epilogue::kAdd},                 // 8 + 2 + 1 rows
        {1, 2048, {q}, {64}, false, Epilogue::kAdd},                // long K: many splits
    };
    for (DType t : kFloatTypes) {
      for (const FusedShape& f : shapes) cases.push_back(FusedCase(f, t));
      cases.push_back(FusedRopeCase(1, 512, 4, 2, 32, true, false, q, q, t));
      cases.push_back(FusedRopeCase(2, 256, 2, 1, 64, false, true, q, q, t));
    }
  }
  // The 32-value formats at one row: the shapes above fit one wave, where the default walk
  // is wide (CudaOptions::block_unit_walk); the serial walk of the wider nodes, forced.
  for (DType q : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1}) {
    for (DType t : kFloatTypes) {
      for (const FusedShape& f : {FusedShape{1, 512, {q, q, q}, {256, 64, 64}, true, Epilogue::kNone},
                                  FusedShape{1, 2048, {q}, {64}, false, Epilogue::kAdd}}) {
        OpCase c = FusedCase(f, t);
        c.name += "/serial";
        c.cuda_options = [](CudaOptions& o) {
          o.block_mma_min_rows = 0;
          o.block_row_fused_max_k = 0;
          o.block_unit_walk = BlockUnitWalkOption::kSerial;
          o.block_gemv_precision = BlockGemvPrecision::kF32;
        };
        cases.push_back(std::move(c));
      }
    }
  }
  // The one-row kernel with f32 products, which takes one-row FusedMatMuls of one weight
  // with no norm and the add epilogue or none (the o projection) at K up to
  // block_row_fused_max_k: at K 2048, and forced at a K of 3 chunks, the last one partial.
  for (DType q : kQuantTypes) {
    for (DType t : kFloatTypes) {
      for (const FusedShape& f : {FusedShape{1, 2048, {q}, {300}, false, Epilogue::kAdd},
                                  FusedShape{1, 4608, {q}, {70}, false, Epilogue::kNone}}) {
        OpCase c = FusedCase(f, t);
        c.name += "/row_kernel";
        c.cuda_options = [k = f.k](CudaOptions& o) {
          o.block_mma_min_rows = 0;
          o.block_gemv_precision = BlockGemvPrecision::kF32;
          if (k > 2048) o.block_row_fused_max_k = k;
        };
        cases.push_back(std::move(c));
      }
    }
  }
  // Formats mixed in one op, as Q4_K_M (and the Q5_0/Q8_0 fallbacks) mix them.
  for (DType t : kFloatTypes) {
    cases.push_back(FusedRopeCase(1, 512, 4, 2, 32, true, false, DType::kQ4_K, DType::kQ6_K, t));
    cases.push_back(FusedRopeCase(3, 512, 4, 2, 32, false, false, DType::kQ4_K, DType::kQ6_K, t));
    cases.push_back(FusedRopeCase(1, 512, 4, 2, 32, false, false, DType::kQ5_K, DType::kQ6_K, t));
    cases.push_back(FusedCase({1, 512, {DType::kQ5_0, DType::kQ8_0, DType::kQ4_1}, {64, 32, 36},
                               true, Epilogue::kNone},
                              t));
    cases.push_back(FusedCase({2, 256, {DType::kQ6_K, DType::kQ5_K}, {128, 40}, false,
                               Epilogue::kAdd},
                              t));
  }
  return cases;
}

// The one-row kernel with x as integers (CudaOptions::block_gemv_precision int16, int8,
// int16x2 and auto, the default: int16x2 but for Q8_0, whose nodes keep the f32 kernels;
// kernels/quant_matmul.cuh's QuantRowX), which takes every one-row MatMul without
// bias and every one-row FusedMatMul without a norm whose epilogue is none, the add or
// SiluMul: a decode-shaped MatMul, a MatMul of K three chunks of 64 units with the last one
// partial and more columns than the grid's warps, the add at K 2048 and gate/up with
// SiluMul at that odd K (a warp walking the gate row's chunks, then the up row's); for
// int16x2 also the largest K the kernel takes. Tolerances fit x's
// bits: int8 per 32 values errs by ~4e-3 of a uniform x's norm, int16 by ~2e-5, int16x2
// (2^-30 of a unit's largest) within f32's tolerance, as the exact kernels; where a
// format has a min its codes carry the weights' mean, which the min cancels, so x's
// rounding weighs more (H200, bf16 x at int8, 1x4608x9000: Q4_K, Q5_K, Q4_1 and Q5_1 from
// 1.5e-2 to 1.73e-2).
std::vector<OpCase> IntRowCases() {
  std::vector<OpCase> cases;
  for (DType q : kQuantTypes) {
    const int64_t odd_k = (DTypeBlockElems(q) == 32 ? 144 : 18) * DTypeBlockElems(q);
    for (DType t : kFloatTypes) {
      for (BlockGemvPrecision p : {BlockGemvPrecision::kInt16, BlockGemvPrecision::kInt8,
                                   BlockGemvPrecision::kInt16x2, BlockGemvPrecision::kAuto}) {
        const double tol = p == BlockGemvPrecision::kInt16x2 || p == BlockGemvPrecision::kAuto
                               ? Tol(t)
                               : std::max(Tol(t), p == BlockGemvPrecision::kInt8 ? 3e-2 : 1e-4);
        auto options = [p](CudaOptions& o) {
          o.block_mma_min_rows = 0;
          o.block_gemv_precision = p;
        };
        const std::string suffix = absl::StrCat("/", BlockGemvPrecisionName(p));
        // Two parts at the largest K stage more than 48 KiB (the launch raises the limit).
        std::vector<std::pair<int64_t, int64_t>> shapes = {{2048, 512}, {odd_k, 9000}};
        if (p == BlockGemvPrecision::kInt16x2) shapes.push_back({kernels::kQuantRowMaxK, 300});
        for (const auto& [k, n] : shapes) {
          cases.push_back(
              {.name = absl::StrCat("MatMul/", DTypeName(q), "/", DTypeName(t), "/1x", k, "x", n,
                                    suffix),
               .build = [=, k = k, n = n](GraphBuilder& b) {
                 b.Output("out", b.MatMul(b.Input("x", t, {1, k}), b.Weight("w", q, {n, k})));
               },
               .tolerance = tol,
               .cuda_options = options});
        }
        for (const FusedShape& f : {FusedShape{1, 2048, {q}, {300}, false, Epilogue::kAdd},
                                    FusedShape{1, odd_k, {q, q}, {70, 70}, false,
                                               Epilogue::kSiluMul}}) {
          OpCase c = FusedCase(f, t);
          c.name += suffix;
          c.tolerance = tol;
          c.cuda_options = options;
          cases.push_back(std::move(c));
        }
      }
    }
  }
  return cases;
}

// MoeMatMul at decode on the one-row kernel (kernels/quant_matmul.cuh's LaunchQuantRowMoe,
// which the dispatcher takes for block-format experts below moe_by_expert_pairs) with f32
// products and x as two int16 parts: gate and up with SiluMul at a K of three chunks, the
// last partial, and more columns than a pair's share of the grid has warps (each warp
// walks several); rows of at most 32 units (two columns a chunk), an odd column count
// leaving a warp's last chunk one column; gate and up rows of 33 to 64 units as separate
// tasks of a block's warps (Qwen3-30B-A3B's 768 × 2,048, and 40 units over an odd count
// of columns); the down experts per slot; 128 experts and top 8 in bf16; a bad id (zeros
// and the flag, which the conformance run compares). And, per format, the pair kernel the
// row kernel leaves to K past kQuantRowMaxK.
std::vector<OpCase> MoeRowCases() {
  std::vector<OpCase> cases;
  for (DType q : kQuantTypes) {
    const int64_t block = DTypeBlockElems(q);
    const int64_t odd_k = (block == 32 ? 144 : 18) * block;
    // Rows of 18 or 24 units: a narrow chunk's halves are two columns (the down experts'
    // K of 768 in Qwen3-30B-A3B).
    const int64_t narrow_k = block == 32 ? 576 : 768;
    for (BlockGemvPrecision p : {BlockGemvPrecision::kF32, BlockGemvPrecision::kInt16x2}) {
      const std::string suffix = absl::StrCat("/", BlockGemvPrecisionName(p));
      auto options = [p](CudaOptions& o) { o.block_gemv_precision = p; };
      struct S { DType x; int64_t rows, experts, top_k, n, k; bool gated, per_slot; };
      for (S s : {S{DType::kF32, 1, 16, 4, 70, odd_k, true, false},
                  S{DType::kF32, 2, 8, 2, 3000, 256, false, false},
                  S{DType::kF32, 1, 8, 8, 3001, narrow_k, true, false},
                  S{DType::kF32, 1, 128, 8, 768, 2048, true, false},
                  S{DType::kF32, 2, 16, 4, 1001, 1280, true, false},
                  S{DType::kF32, 1, 128, 8, 2049, narrow_k, false, true},
                  S{DType::kF32, 1, 16, 4, 96, 512, false, true},
                  S{DType::kBF16, 1, 128, 8, 64, 256, true, false}}) {
        cases.push_back(
            {.name = absl::StrCat("MoeMatMul/", DTypeName(q), "/", DTypeName(s.x), "/", s.rows,
                                  "x", s.experts, "x", s.n, "x", s.k, "/top", s.top_k,
                                  s.gated ? "/silu_mul" : "", s.per_slot ? "/per_slot" : "",
                                  suffix),
             .build = [=](GraphBuilder& b) {
               const int64_t x_cols = s.per_slot ? s.top_k * s.k : s.k;
               auto x = b.Input("x", s.x, {s.rows, x_cols});
               auto ids = b.Input("ids", DType::kI32, {s.rows, s.top_k});
               b.Output("out", s.gated ? b.MoeGateUpSiluMul(
                                             x, b.Weight("wg", q, {s.experts, s.n, s.k}),
                                             b.Weight("wu", q, {s.experts, s.n, s.k}), ids)
                                       : b.MoeMatMul(x, b.Weight("w", q, {s.experts, s.n, s.k}),
                                                     ids));
             },
             .tolerance = Tol(s.x),
             .int_hi = static_cast<int32_t>(s.experts),
             .cuda_options = options});
      }
      cases.push_back(
          {.name = absl::StrCat("MoeMatMul/", DTypeName(q), "/f32/silu_mul/bad_ids", suffix),
           .build = [=](GraphBuilder& b) {
             b.Output("out", b.MoeGateUpSiluMul(b.Input("x", DType::kF32, {2, 256}),
                                                b.Weight("wg", q, {4, 40, 256}),
                                                b.Weight("wu", q, {4, 40, 256}),
                                                b.Input("ids", DType::kI32, {2, 2})));
           },
           .tolerance = Tol(DType::kF32),
           .int_values = {{"ids", {3, 4, -7, 0}}},
           .cuda_options = options});
    }
    const int64_t long_k = kernels::kQuantRowMaxK + 256;
    cases.push_back(
        {.name = absl::StrCat("MoeMatMul/", DTypeName(q), "/f32/2x4x16x", long_k, "/top2/pair"),
         .build = [=](GraphBuilder& b) {
           b.Output("out", b.MoeMatMul(b.Input("x", DType::kF32, {2, long_k}),
                                       b.Weight("w", q, {4, 16, long_k}),
                                       b.Input("ids", DType::kI32, {2, 2})));
         },
         .tolerance = Tol(DType::kF32),
         .int_hi = 4});
  }
  return cases;
}

// MoeMatMul of a prefill step on the tensor cores (CudaOptions::moe_block_mma; enough
// (row, expert) pairs per expert to walk by expert): the pairs sorted by expert on the
// device into segments of 32 rows, x split through that list, each segment's tiles times
// its expert. Plain and gated (silu_mul) experts, the down experts per slot, 128 experts
// of which some get no pair (empty segments), an odd column count (a partial block of
// columns and a partial column tile), bf16 x (one part), and under f32 the exact products
// (f32's tolerance), one scaled f16 part (f16, and auto from 16 pairs: 3e-3) and int8
// (1e-2); bad ids among the pairs (zeros and the flag, which the run compares).
std::vector<OpCase> MoeMmaCases() {
  std::vector<OpCase> cases;
  for (DType q : kQuantTypes) {
    const int64_t k = DTypeBlockElems(q) == 32 ? 320 : 512;
    struct S { DType x; int64_t rows, experts, top_k, n; bool gated, per_slot; };
    for (S s : {S{DType::kF32, 64, 16, 4, 200, false, false},
                S{DType::kF32, 64, 8, 2, 48, true, false},
                S{DType::kF32, 64, 8, 2, 64, false, true},
                S{DType::kF32, 32, 128, 8, 40, true, false},
                S{DType::kBF16, 48, 8, 2, 72, true, false}}) {
      for (BlockGemmPrecision p : {BlockGemmPrecision::kF32, BlockGemmPrecision::kAuto,
                                   BlockGemmPrecision::kF16, BlockGemmPrecision::kInt8}) {
        if (s.x != DType::kF32 && p != BlockGemmPrecision::kF32) continue;
        const bool int8 = p == BlockGemmPrecision::kInt8;
        const bool f16 = p == BlockGemmPrecision::kF16;
        cases.push_back(
            {.name = absl::StrCat("MoeMma/", DTypeName(q), "/", DTypeName(s.x), "/", s.rows,
                                  "x", s.experts, "x", s.n, "x", k, "/top", s.top_k,
                                  s.gated ? "/silu_mul" : "", s.per_slot ? "/per_slot" : "",
                                  "/", BlockGemmPrecisionName(p)),
             .build = [=](GraphBuilder& b) {
               auto x = b.Input("x", s.x, {s.rows, s.per_slot ? s.top_k * k : k});
               auto ids = b.Input("ids", DType::kI32, {s.rows, s.top_k});
               b.Output("out", s.gated ? b.MoeGateUpSiluMul(
                                             x, b.Weight("wg", q, {s.experts, s.n, k}),
                                             b.Weight("wu", q, {s.experts, s.n, k}), ids)
                                       : b.MoeMatMul(x, b.Weight("w", q, {s.experts, s.n, k}),
                                                     ids));
             },
             .tolerance = int8 ? 1e-2 : f16 || p == BlockGemmPrecision::kAuto ? 3e-3 : Tol(s.x),
             .int_hi = static_cast<int32_t>(s.experts),
             .cuda_options = [p](CudaOptions& o) {
               o.moe_block_mma = true;
               o.block_gemm_precision = p;
             }});
      }
    }
    // Routings of their own, plain and gated, 2 slots a row over 4 experts: one expert
    // taking most pairs (64 rows, 100 of the 128 ids expert 0: its segment four tiles, the
    // last one partial; expert 3 none), and bad ids (16 rows, every fifth id out of range).
    struct Routed { const char* name; int64_t rows, n; std::vector<int32_t> ids; };
    std::vector<int32_t> skewed(128), bad(32);
    for (int i = 0; i < 128; ++i) skewed[i] = i < 100 ? 0 : 1 + i % 2;
    for (int i = 0; i < 32; ++i) bad[i] = i % 5 == 4 ? (i % 2 == 0 ? -3 : 4) : i % 4;
    for (const Routed& r : {Routed{"skewed", 64, 40, skewed}, Routed{"bad_ids", 16, 24, bad}}) {
      for (bool gated : {false, true}) {
        cases.push_back(
            {.name = absl::StrCat("MoeMma/", DTypeName(q), "/f32/", r.name,
                                  gated ? "/silu_mul" : ""),
             .build = [=, rows = r.rows, n = r.n](GraphBuilder& b) {
               auto x = b.Input("x", DType::kF32, {rows, k});
               auto id = b.Input("ids", DType::kI32, {rows, 2});
               b.Output("out", gated ? b.MoeGateUpSiluMul(x, b.Weight("wg", q, {4, n, k}),
                                                          b.Weight("wu", q, {4, n, k}), id)
                                     : b.MoeMatMul(x, b.Weight("w", q, {4, n, k}), id));
             },
             .tolerance = Tol(DType::kF32),
             .int_values = {{"ids", r.ids}},
             .cuda_options = [](CudaOptions& o) {
               o.moe_block_mma = true;
               o.block_gemm_precision = BlockGemmPrecision::kF32;  // the routing, exact
             }});
      }
    }
  }
  return cases;
}

// The tensor-core path of FusedMatMul (no folded norm): the products of all rows, then
// epilogues of up to 64 rows (a 40-row argmax: 32 + 8), every epilogue, split-K (long K,
// narrow outputs), partial column tiles, and formats mixed in one op (one products launch
// per run of a format).
std::vector<OpCase> MmaFusedCases() {
  std::vector<OpCase> cases;
  for (DType q : kQuantTypes) {
    const std::vector<FusedShape> shapes = {
        {2, 512, {q, q, q}, {256, 64, 64}, false, Epilogue::kNone},
        {16, 512, {q}, {128}, false, Epilogue::kAdd},
        {3, 512, {q, q}, {96, 96}, false, Epilogue::kSiluMul},
        {40, 256, {q}, {1000}, false, Epilogue::kArgmax},
        {5, 256, {q}, {37}, false, Epilogue::kNone},
        {11, 2048, {q}, {64}, false, Epilogue::kAdd},
    };
    for (DType t : kFloatTypes) {
      for (const FusedShape& f : shapes) cases.push_back(FusedCase(f, t, true));
      cases.push_back(FusedRopeCase(16, 256, 2, 1, 64, false, true, q, q, t, true));
    }
  }
  for (DType t : kFloatTypes) {
    cases.push_back(
        FusedRopeCase(3, 512, 4, 2, 32, false, false, DType::kQ4_K, DType::kQ6_K, t, true));
    cases.push_back(FusedCase({8, 512, {DType::kQ5_0, DType::kQ8_0, DType::kQ5_0}, {64, 32, 36},
                               false, Epilogue::kNone},
                              t, true));
  }
  return cases;
}

std::string CaseName(const ::testing::TestParamInfo<OpCase>& info) {
  std::string n = info.param.name;
  for (char& ch : n) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return n;
}

class QuantConformanceTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(QuantConformanceTest, CpuAndCudaAgree) {
  if (!HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  RunConformance(GetParam());
}

INSTANTIATE_TEST_SUITE_P(QuantMatMul, QuantConformanceTest, ::testing::ValuesIn(MatmulCases()),
                         CaseName);
INSTANTIATE_TEST_SUITE_P(QuantEmbedding, QuantConformanceTest,
                         ::testing::ValuesIn(EmbeddingCases()), CaseName);
INSTANTIATE_TEST_SUITE_P(QuantFusedMatMul, QuantConformanceTest,
                         ::testing::ValuesIn(FusedCases()), CaseName);
INSTANTIATE_TEST_SUITE_P(QuantIntRow, QuantConformanceTest, ::testing::ValuesIn(IntRowCases()),
                         CaseName);
INSTANTIATE_TEST_SUITE_P(MoeMma, QuantConformanceTest, ::testing::ValuesIn(MoeMmaCases()),
                         CaseName);
INSTANTIATE_TEST_SUITE_P(QuantMoeRow, QuantConformanceTest, ::testing::ValuesIn(MoeRowCases()),
                         CaseName);
INSTANTIATE_TEST_SUITE_P(MmaMatMul, QuantConformanceTest, ::testing::ValuesIn(MmaMatmulCases()),
                         CaseName);
INSTANTIATE_TEST_SUITE_P(MmaFusedMatMul, QuantConformanceTest,
                         ::testing::ValuesIn(MmaFusedCases()), CaseName);

// What CUDA says of fused ops over block formats, without a device: every format and mix
// that the kernel takes, and no column block of the kernel across two formats.
TEST(QuantFusedSupportTest, BlockFormatsAreFusedWhereTheKernelTakesThem) {
  const CudaSupport cuda;
  auto supports = [&](Epilogue e, std::vector<DType> w, std::vector<int64_t> n) {
    GraphBuilder b;
    ops::FusedMatMul op{.weights = static_cast<int32_t>(w.size()), .epilogue = e};
    std::vector<TensorId> in = {b.Input("x", DType::kBF16, {1, 256})};
    int64_t total = 0;
    for (size_t g = 0; g < w.size(); ++g) {
      in.push_back(b.Weight(absl::StrCat("w", g), w[g], {n[g], 256}));
      total += n[g];
    }
    if (e == Epilogue::kAdd) in.push_back(b.Input("residual", DType::kBF16, {1, total}));
    b.Output("out", b.FusedMatMul(op, in));
    absl::StatusOr<Graph> g = std::move(b).Build();
    EXPECT_TRUE(g.ok()) << g.status();
    if (!g.ok()) return false;
    const Node& node = g->nodes().back();
    std::vector<const Tensor*> inputs;
    for (TensorId id : node.inputs) inputs.push_back(&g->tensor(id));
    return cuda.Supports(node.op, inputs);
  };
  for (DType q : kQuantTypes) {
    EXPECT_TRUE(supports(Epilogue::kNone, {q, q, q}, {64, 30, 30})) << DTypeName(q);
    EXPECT_TRUE(supports(Epilogue::kSiluMul, {q, q}, {64, 64})) << DTypeName(q);
  }
  EXPECT_TRUE(supports(Epilogue::kNone, {DType::kQ4_K, DType::kQ4_K, DType::kQ6_K},
                       {64, 32, 32}));
  // A column block would hold rows of Q4_K and Q6_K.
  EXPECT_FALSE(supports(Epilogue::kNone, {DType::kQ4_K, DType::kQ6_K}, {30, 32}));
  // silu_mul pairs gate and up columns in every block.
  EXPECT_FALSE(supports(Epilogue::kSiluMul, {DType::kQ4_K, DType::kQ6_K}, {64, 64}));
  // Float and block weights in one op.
  EXPECT_FALSE(supports(Epilogue::kNone, {DType::kBF16, DType::kQ8_0}, {64, 64}));
}

// The device layout, read on the host by the kernels' own readers, holds every value of
// the file's blocks bit for bit as the CPU reference dequantizes them (no device needed).
TEST(QuantDeviceLayoutTest, ReadersGiveTheReferenceValues) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  for (DType q : kQuantTypes) {
    SCOPED_TRACE(DTypeName(q));
    const int64_t rows = 5, k = 2 * DTypeBlockElems(q) + (DTypeBlockElems(q) == 32 ? 96 : 0);
    const int64_t blocks = rows * (k / DTypeBlockElems(q));
    const int64_t row_bytes = k / DTypeBlockElems(q) * DTypeBlockBytes(q);
    std::vector<std::byte> file(static_cast<size_t>(rows * row_bytes));
    std::vector<float> values(static_cast<size_t>(k));
    for (int64_t r = 0; r < rows; ++r) {
      // Values of several magnitudes, so that scales and mins differ across blocks.
      for (int64_t i = 0; i < k; ++i) values[i] = value(rng) * static_cast<float>(1 + i % 7);
      ASSERT_TRUE(QuantizeRow(q, values.data(), file.data() + r * row_bytes, k));
    }
    std::vector<std::byte> device(file.size());
    ASSERT_TRUE(kernels::RepackBlocksForDevice(q, blocks, file.data(), device.data()));
    std::vector<float> want(static_cast<size_t>(k)), got(static_cast<size_t>(k));
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_TRUE(DequantizeRow(q, file.data() + r * row_bytes, want.data(), k));
      // The readings of the CUDA-core kernels (eights of a unit loaded whole, or each eight
      // from its part's load) and of the tensor-core one (quarters).
      using kernels::DeviceLayoutReading;
      for (const auto& [reading, name] :
           {std::pair{DeviceLayoutReading::kEights, "eights"},
            std::pair{DeviceLayoutReading::kParts, "parts"},
            std::pair{DeviceLayoutReading::kQuarters, "quarters"}}) {
        std::fill(got.begin(), got.end(), std::nanf(""));
        ASSERT_TRUE(kernels::DequantizeDeviceLayoutRow(q, device.data(), blocks, r, k,
                                                       got.data(), reading));
        for (int64_t i = 0; i < k; ++i) {
          ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0)
              << name << " row " << r << " value " << i << ": " << got[i] << " != " << want[i];
        }
      }
    }
    // The layout does move the bytes (a reader of the file's layout would not pass).
    EXPECT_NE(std::memcmp(device.data(), file.data(), file.size()), 0);
  }
}

// The tensor-core kernel's host-side sizes, everywhere: the parts x is split into, its
// scratch (x's parts of every row padded to 8, and the rows' sums per 32 values), the
// split-K factor, and what the launcher refuses before it touches a device.
// What the one-row kernel takes, and what its launcher refuses before it touches a device.
TEST(QuantRowMatmulTest, TakesAndRefusals) {
  EXPECT_TRUE(kernels::QuantRowMatmulTakes(128256, 2048, DType::kQ6_K));
  EXPECT_TRUE(kernels::QuantRowMatmulTakes(1, kernels::kQuantRowMaxK, DType::kQ4_0));
  EXPECT_FALSE(kernels::QuantRowMatmulTakes(1, kernels::kQuantRowMaxK + 32, DType::kQ4_0));
  EXPECT_FALSE(kernels::QuantRowMatmulTakes(10, 96, DType::kQ4_K));  // not whole blocks
  EXPECT_FALSE(kernels::QuantRowMatmulTakes(10, 2048, DType::kBF16));
  EXPECT_FALSE(kernels::QuantRowMatmulTakes(0, 2048, DType::kQ8_0));
  EXPECT_FALSE(kernels::QuantRowMatmulTakes(int64_t{1} << 31, 2048, DType::kQ8_0));
  alignas(16) static float x[64], y[64];
  alignas(16) static uint8_t w[1024];
  EXPECT_EQ(kernels::LaunchQuantRowMatmul(x, w, DType::kQ8_0, nullptr, y, 4, 48, DType::kF32,
                                          true, 132, kernels::QuantRowX::kF32, kernels::Stream{}),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::LaunchQuantRowMatmul(x, w, DType::kQ8_0, nullptr, y, 4, 64, DType::kF32,
                                          true, 0, kernels::QuantRowX::kF32, kernels::Stream{}),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::LaunchQuantRowMatmul(x, w + 2, DType::kQ8_0, nullptr, y, 4, 64,
                                          DType::kF32, true, 132, kernels::QuantRowX::kInt8,
                                          kernels::Stream{}),
            cudaErrorMisalignedAddress);
}

// What the one-row kernel takes as a mixture of experts' matmul (its pairs a grid
// dimension, every expert's columns one stacked tensor), and what its launcher refuses
// before it touches a device.
// The tensor-core MoE path's sizes and refusals (host side: no launch reaches a device).
TEST(MoeBlockMmaTest, TakesSizesAndRefusals) {
  using kernels::MoeBlockMmaTakes;
  using kernels::MoeBlockMmaWorkspaceBytes;
  // Qwen3-30B-A3B's experts at a 512-token step: gate/up 768 × 2,048, down 2,048 × 768.
  EXPECT_TRUE(MoeBlockMmaTakes(512, 128, 768, 2048, 8, DType::kF32, DType::kQ4_K));
  EXPECT_TRUE(MoeBlockMmaTakes(512, 128, 2048, 768, 8, DType::kF32, DType::kQ6_K));
  EXPECT_TRUE(MoeBlockMmaTakes(16, 8, 64, 96, 2, DType::kBF16, DType::kQ4_0));
  EXPECT_FALSE(MoeBlockMmaTakes(16, 8, 64, 96, 2, DType::kF32, DType::kQ4_K));  // not whole blocks
  EXPECT_FALSE(MoeBlockMmaTakes(16, 8, 64, 256, 2, DType::kF32, DType::kBF16));  // float experts
  EXPECT_FALSE(MoeBlockMmaTakes(16, kernels::kMoeBlockMmaMaxExperts + 1, 64, 256, 2,
                                DType::kF32, DType::kQ8_0));
  EXPECT_FALSE(MoeBlockMmaTakes(0, 8, 64, 256, 2, DType::kF32, DType::kQ8_0));
  EXPECT_FALSE(MoeBlockMmaTakes(int64_t{1} << 28, 8, 64, 256, 8, DType::kF32, DType::kQ8_0));
  EXPECT_FALSE(MoeBlockMmaTakes(int64_t{1} << 40, 8, 64, 256, int64_t{1} << 40, DType::kF32,
                                DType::kQ8_0));
  // 16 × 2 pairs over 4 experts: 32 + 4 · 31 rows, whole segments of 32 (160); the list
  // (640 bytes, 768 with its alignment), the tiles' experts (20, 256), then the split of
  // 160 rows of 256 values in 3 parts.
  const int64_t sorted = 160;
  EXPECT_EQ(MoeBlockMmaWorkspaceBytes(16, 4, 256, 2, 3),
            768 + 256 + kernels::BlockMmaScratchBytes(sorted, 256, 3));
  EXPECT_EQ(MoeBlockMmaWorkspaceBytes(16, 0, 256, 2, 3), -1);
  EXPECT_EQ(MoeBlockMmaWorkspaceBytes(int64_t{1} << 40, 8, 256, 8, 3), -1);
  // Refused before any launch: missing arguments, a terms value x cannot take, gate/up
  // experts with per-slot x.
  kernels::MoeBlockMmaArgs a;
  a.rows = 16;
  a.experts = 4;
  a.n = 24;
  a.k = 256;
  a.top_k = 2;
  EXPECT_EQ(kernels::LaunchMoeBlockMma(a, kernels::Stream{}), cudaErrorInvalidValue);
  alignas(16) static std::byte dummy[64];
  a.x = a.w = a.y = a.workspace = dummy;
  a.ids = reinterpret_cast<const int32_t*>(dummy);
  a.dtype = DType::kBF16;  // one part: terms 3 is not bf16's
  EXPECT_EQ(kernels::LaunchMoeBlockMma(a, kernels::Stream{}), cudaErrorInvalidValue);
  a.dtype = DType::kF32;
  a.w_up = dummy;
  a.per_slot = true;
  EXPECT_EQ(kernels::LaunchMoeBlockMma(a, kernels::Stream{}), cudaErrorInvalidValue);
}

// Every MoeMma case's MoeMatMul takes the tensor-core path on a Hopper device (its
// workspace is asked for), and none does with the option off: the cases test that path,
// not the by-expert kernel behind it.
TEST(MoeBlockMmaTest, EveryCaseTakesTheTensorCores) {
  const CudaDeviceInfo hopper{.sm_count = 132, .l2_bytes = 50 << 20, .compute_capability = 90};
  for (const OpCase& c : MoeMmaCases()) {
    SCOPED_TRACE(c.name);
    GraphBuilder b;
    c.build(b);
    absl::StatusOr<Graph> graph = std::move(b).Build();
    ASSERT_TRUE(graph.ok()) << graph.status();
    CudaOptions on, off;
    c.cuda_options(on);
    c.cuda_options(off);
    off.moe_block_mma = false;
    int nodes = 0;
    for (const Node& node : graph->nodes()) {
      if (!std::holds_alternative<ops::MoeMatMul>(node.op)) continue;
      ++nodes;
      absl::StatusOr<int64_t> bytes = internal::MoeMmaWorkspaceBytes(*graph, node, on, hopper);
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      EXPECT_GT(*bytes, 0);
      bytes = internal::MoeMmaWorkspaceBytes(*graph, node, off, hopper);
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      EXPECT_EQ(*bytes, 0);
    }
    EXPECT_EQ(nodes, 1);
  }
}

TEST(QuantRowMoeTest, TakesAndRefusals) {
  using kernels::QuantRowMoeTakes;
  EXPECT_TRUE(QuantRowMoeTakes(1, 128, 768, 2048, 8, DType::kQ4_K));
  EXPECT_TRUE(QuantRowMoeTakes(kernels::kQuantRowMoeMaxPairs / 8, 128, 2048, 768, 8,
                               DType::kQ6_K));
  EXPECT_FALSE(QuantRowMoeTakes(kernels::kQuantRowMoeMaxPairs / 8 + 1, 128, 2048, 768, 8,
                                DType::kQ6_K));  // more pairs than a grid dimension
  EXPECT_FALSE(QuantRowMoeTakes(1, 1 << 20, 4096, 2048, 8, DType::kQ4_0));  // 2^32 rows of w
  EXPECT_FALSE(QuantRowMoeTakes(1, 8, 64, kernels::kQuantRowMaxK + 256, 2, DType::kQ4_K));
  EXPECT_FALSE(QuantRowMoeTakes(1, 8, 64, 96, 2, DType::kQ4_K));  // not whole blocks
  EXPECT_FALSE(QuantRowMoeTakes(1, 8, 64, 256, 2, DType::kBF16));
  EXPECT_FALSE(QuantRowMoeTakes(0, 8, 64, 256, 2, DType::kQ8_0));
  EXPECT_FALSE(QuantRowMoeTakes(1, 0, 64, 256, 2, DType::kQ8_0));
  EXPECT_FALSE(QuantRowMoeTakes(1, 8, 64, 256, 0, DType::kQ8_0));
  EXPECT_FALSE(QuantRowMoeTakes(int64_t{1} << 40, 8, 64, 256, int64_t{1} << 40, DType::kQ8_0));
  alignas(16) static float x[4 * 256], y[4 * 64];
  alignas(16) static uint8_t w[8 * 64 * 272];
  alignas(16) static int32_t ids[4];
  const auto launch = [&](const void* wp, const void* w_up, const int32_t* id, bool per_slot,
                          int sm_count) {
    return kernels::LaunchQuantRowMoe(x, wp, w_up, DType::kQ8_0, id, y, 1, 8, 64, 256, 2,
                                      per_slot, DType::kF32, nullptr, sm_count,
                                      kernels::QuantRowX::kF32, kernels::Stream{});
  };
  EXPECT_EQ(launch(w, nullptr, nullptr, false, 132), cudaErrorInvalidValue);  // no ids
  EXPECT_EQ(launch(w, w, ids, true, 132), cudaErrorInvalidValue);  // gate/up per slot
  EXPECT_EQ(launch(w, nullptr, ids, false, 0), cudaErrorInvalidValue);  // no SMs
  EXPECT_EQ(launch(w + 2, nullptr, ids, false, 132), cudaErrorMisalignedAddress);
  EXPECT_EQ(launch(w, w + 2, ids, false, 132), cudaErrorMisalignedAddress);
}

// A NaN or an infinity in x leaves every sum it enters non-finite in every way the one-row
// kernel reads x (the integer ones would otherwise quantize it to a finite code), and a
// finite x gives finite sums, on formats with and without a min, of 32 and 256 values.
// Device memory freed however a test ends (null, with a failure recorded, when cudaMalloc
// fails).
std::unique_ptr<void, cudaError_t (*)(void*)> DeviceBytes(size_t bytes) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
  return std::unique_ptr<void, cudaError_t (*)(void*)>(p, cudaFree);
}

// n rows of k values drawn from `value`, quantized to q, repacked into the device layout
// and copied to `dw` (at least n × k × 2 bytes). Fatal failures end the calling test.
// With `dequantized`, also the weights' values [n, k] as the reference reads them.
void UploadRandomBlocks(DType q, int64_t n, int64_t k, std::mt19937& rng,
                        std::uniform_real_distribution<float>& value, void* dw,
                        std::vector<float>* dequantized = nullptr) {
  const int64_t row_bytes = k / DTypeBlockElems(q) * DTypeBlockBytes(q);
  std::vector<std::byte> file(static_cast<size_t>(n * row_bytes)), repacked(file.size());
  std::vector<float> row(k);
  if (dequantized != nullptr) dequantized->resize(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) {
    for (float& v : row) v = value(rng);
    ASSERT_TRUE(QuantizeRow(q, row.data(), file.data() + r * row_bytes, k));
    if (dequantized != nullptr) {
      ASSERT_TRUE(DequantizeRow(q, file.data() + r * row_bytes, dequantized->data() + r * k, k));
    }
  }
  ASSERT_TRUE(kernels::RepackBlocksForDevice(q, n * (k / DTypeBlockElems(q)), file.data(),
                                             repacked.data()));
  ASSERT_EQ(cudaMemcpy(dw, repacked.data(), repacked.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
}

// One launch of the tensor-core kernel: f32 x [m, k] times one weight [n, k] in format q
// (device layout) with x in `terms` parts, into y [m, n], on the workspace ws laid out.
cudaError_t LaunchOneWeightMma(const void* x, int64_t m, int64_t k, const void* w, int64_t n,
                               DType q, int terms, const kernels::BlockMmaWorkspace& ws,
                               void* work, void* y) {
  kernels::BlockMmaArgs a;
  a.x = x;
  a.m = m;
  a.k = k;
  a.w[0] = w;
  a.n[0] = n;
  a.w_dtype = q;
  a.terms = terms;
  a.partials = ws.partial_bytes > 0 ? static_cast<float*>(work) : nullptr;
  a.scratch = static_cast<uint8_t*>(work) + ws.partial_bytes;
  a.y = y;
  a.ld = n;
  a.splits = ws.splits;
  a.shape = ws.shape;
  return kernels::LaunchBlockMma(a, kernels::Stream{});
}

TEST(QuantRowMatmulTest, ANonFiniteXLeavesEverySumNonFinite) {
  if (!CudaDeviceFound()) GTEST_SKIP() << "no CUDA device";
  int sm_count = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  constexpr int64_t n = 40, k = 512;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> x(k), y(n);
  for (float& v : x) v = value(rng);
  const auto x_buffer = DeviceBytes(k * sizeof(float)), y_buffer = DeviceBytes(n * sizeof(float));
  const auto w_buffer = DeviceBytes(n * k * 2);  // more than any format's n × k bytes
  void *dx = x_buffer.get(), *dw = w_buffer.get(), *dy = y_buffer.get();
  ASSERT_TRUE(dx != nullptr && dw != nullptr && dy != nullptr);
  for (DType q : {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    ASSERT_NO_FATAL_FAILURE(UploadRandomBlocks(q, n, k, rng, value, dw));
    for (kernels::QuantRowX mode : {kernels::QuantRowX::kF32, kernels::QuantRowX::kInt8,
                                    kernels::QuantRowX::kInt16, kernels::QuantRowX::kInt16x2}) {
      for (float bad : {0.0f, std::nanf(""), INFINITY, -INFINITY}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(q), " mode ", static_cast<int>(mode), " x[77] ",
                                  bad));
        std::vector<float> xb = x;
        if (bad != 0.0f) xb[77] = bad;  // NaN != 0 too
        ASSERT_EQ(cudaMemcpy(dx, xb.data(), k * sizeof(float), cudaMemcpyHostToDevice),
                  cudaSuccess);
        ASSERT_EQ(cudaMemset(dy, 0x7f, n * sizeof(float)), cudaSuccess);  // finite poison
        ASSERT_EQ(kernels::LaunchQuantRowMatmul(dx, dw, q, nullptr, dy, n, k, DType::kF32, true,
                                                sm_count, mode, kernels::Stream{}),
                  cudaSuccess);
        ASSERT_EQ(cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost),
                  cudaSuccess);
        const bool finite_x = xb[77] == x[77];
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(std::isfinite(y[i]), finite_x) << "column " << i << ": " << y[i];
        }
      }
    }
  }
}

// The tensor-core kernel's readings of f32 x (three exact bf16 parts, two, one, two scaled
// f16 parts, int8): a NaN or an infinity in a row leaves every sum of that row non-finite
// and the other rows' finite.
TEST(BlockMmaTest, ANonFiniteXLeavesItsRowNonFinite) {
  if (!CudaDeviceFound()) GTEST_SKIP() << "no CUDA device";
  int sm_count = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  constexpr int64_t m = 16, n = 40, k = 512, bad_row = 5;
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> x(m * k), y(m * n);
  for (float& v : x) v = value(rng);
  const auto x_buffer = DeviceBytes(m * k * sizeof(float));
  const auto y_buffer = DeviceBytes(m * n * sizeof(float)), w_buffer = DeviceBytes(n * k * 2);
  void *dx = x_buffer.get(), *dw = w_buffer.get(), *dy = y_buffer.get();
  ASSERT_TRUE(dx != nullptr && dw != nullptr && dy != nullptr);
  for (DType q : {DType::kQ4_0, DType::kQ5_1, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    ASSERT_NO_FATAL_FAILURE(UploadRandomBlocks(q, n, k, rng, value, dw));
    for (int terms : {3, 2, 1, kernels::kBlockMmaF16x2, kernels::kBlockMmaInt8}) {
      kernels::BlockMmaWorkspace ws;
      ASSERT_TRUE(kernels::BlockMmaWorkspaceFor(m, k, &n, 1, q, terms, sm_count, false, &ws));
      const auto work = DeviceBytes(static_cast<size_t>(ws.bytes));
      for (float bad : {0.0f, std::nanf(""), INFINITY, -INFINITY}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(q), " terms ", terms, " x[5, 300] ", bad));
        std::vector<float> xb = x;
        if (bad != 0.0f) xb[bad_row * k + 300] = bad;
        ASSERT_EQ(cudaMemcpy(dx, xb.data(), xb.size() * sizeof(float), cudaMemcpyHostToDevice),
                  cudaSuccess);
        ASSERT_EQ(cudaMemset(dy, 0x7f, m * n * sizeof(float)), cudaSuccess);  // finite poison
        ASSERT_EQ(LaunchOneWeightMma(dx, m, k, dw, n, q, terms, ws, work.get(), dy),
                  cudaSuccess);
        ASSERT_EQ(cudaMemcpy(y.data(), dy, y.size() * sizeof(float), cudaMemcpyDeviceToHost),
                  cudaSuccess);
        for (int64_t r = 0; r < m; ++r) {
          const bool finite = r != bad_row || bad == 0.0f;
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(std::isfinite(y[r * n + i]), finite)
                << "row " << r << " column " << i << ": " << y[r * n + i];
          }
        }
      }
    }
  }
}


// int8 x's scales of any magnitude: a row scaled by 2^e gives exactly 2^e times the sums
// of the row unscaled (its codes are the same and each unit's integer sum is scaled once),
// in every block shape, up to rows of 2^118 whose scales times the sums' 1.5·2^23 start
// would overflow f32; rows with subnormal scales (2^−120) within int8's tolerance of the
// reference, the unscaled rows too.
TEST(BlockMmaTest, Int8ScalesOfAnyMagnitudeGiveTheSameSums) {
  if (!CudaDeviceFound()) GTEST_SKIP() << "no CUDA device";
  int sm_count = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  constexpr int64_t m = 16, n = 40, k = 512, kBases = 4;
  // Row r is base row r % 4 times 2^exponent[r].
  constexpr int kExponent[m] = {0, 0, 0, 0, 100, -100, 3, -120,
                                110, 118, -90, 7, 104, 60, 0, -3};
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> base(kBases * k), x(m * k), y(m * n), w;
  for (float& v : base) v = value(rng);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t i = 0; i < k; ++i) {
      x[r * k + i] = std::ldexp(base[(r % kBases) * k + i], kExponent[r]);
    }
  }
  const auto x_buffer = DeviceBytes(m * k * sizeof(float));
  const auto y_buffer = DeviceBytes(m * n * sizeof(float)), w_buffer = DeviceBytes(n * k * 2);
  void *dx = x_buffer.get(), *dw = w_buffer.get(), *dy = y_buffer.get();
  ASSERT_TRUE(dx != nullptr && dw != nullptr && dy != nullptr);
  ASSERT_EQ(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  for (DType q : {DType::kQ4_0, DType::kQ5_1, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    ASSERT_NO_FATAL_FAILURE(UploadRandomBlocks(q, n, k, rng, value, dw, &w));
    for (kernels::BlockMmaShape shape : {kernels::BlockMmaShape::kDecode,
                                         kernels::BlockMmaShape::kPrefill,
                                         kernels::BlockMmaShape::kStaged}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(q), " shape ", static_cast<int>(shape)));
      kernels::BlockMmaWorkspace ws;
      ASSERT_TRUE(kernels::BlockMmaWorkspaceFor(m, k, &n, 1, q, kernels::kBlockMmaInt8,
                                                sm_count, false, &ws, shape));
      const auto work = DeviceBytes(static_cast<size_t>(ws.bytes));
      ASSERT_EQ(cudaMemset(dy, 0x7f, m * n * sizeof(float)), cudaSuccess);  // finite poison
      ASSERT_EQ(LaunchOneWeightMma(dx, m, k, dw, n, q, kernels::kBlockMmaInt8, ws, work.get(),
                                   dy),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(y.data(), dy, y.size() * sizeof(float), cudaMemcpyDeviceToHost),
                cudaSuccess);
      for (int64_t r = 0; r < m; ++r) {
        const int64_t b = r % kBases;
        if (kExponent[r] > -120) {
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(y[r * n + i], std::ldexp(y[b * n + i], kExponent[r]))
                << "row " << r << " column " << i;
          }
        }
        // Against the reference's sums of the row as given (int8: 1e-2).
        double err = 0.0, norm = 0.0;
        for (int64_t i = 0; i < n; ++i) {
          double ref = 0.0;
          for (int64_t j = 0; j < k; ++j) ref += double{w[i * k + j]} * double{x[r * k + j]};
          err += (y[r * n + i] - ref) * (y[r * n + i] - ref);
          norm += ref * ref;
        }
        EXPECT_LE(std::sqrt(err / norm), 1e-2) << "row " << r;
      }
    }
  }
}

TEST(BlockGemvPrecisionTest, NamesRoundTripAndABadOneIsNamed) {
  for (BlockGemvPrecision p :
       {BlockGemvPrecision::kF32, BlockGemvPrecision::kInt16, BlockGemvPrecision::kInt8,
        BlockGemvPrecision::kInt16x2, BlockGemvPrecision::kAuto}) {
    absl::StatusOr<BlockGemvPrecision> back = ParseBlockGemvPrecision(BlockGemvPrecisionName(p));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, p);
  }
  const absl::Status bad = ParseBlockGemvPrecision("int4").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("'int4'"), absl::string_view::npos) << bad;
}

TEST(BlockMmaSizesTest, TermsScratchSplitsAndRefusals) {
  EXPECT_EQ(kernels::BlockMmaTerms(DType::kBF16, 3), 1);
  EXPECT_EQ(kernels::BlockMmaTerms(DType::kF16, 3), 2);
  EXPECT_EQ(kernels::BlockMmaTerms(DType::kF32, 3), 3);
  EXPECT_EQ(kernels::BlockMmaTerms(DType::kF32, 1), 1);
  EXPECT_EQ(kernels::BlockMmaTerms(DType::kF32, 2), 2);  // block_gemm_precision bf16x2
  EXPECT_EQ(kernels::BlockMmaTerms(DType::kF16, 2), 2);
  EXPECT_EQ(kernels::BlockMmaTerms(DType::kBF16, 2), 1);
  // Two scaled f16 parts for f32 x only (block_gemm_precision f16x2).
  EXPECT_EQ(kernels::BlockMmaTerms(DType::kF32, kernels::kBlockMmaF16x2), kernels::kBlockMmaF16x2);
  EXPECT_EQ(kernels::BlockMmaTerms(DType::kBF16, kernels::kBlockMmaF16x2), 1);
  EXPECT_EQ(kernels::BlockMmaTerms(DType::kF16, kernels::kBlockMmaF16x2), 2);
  // int8 x for f32 x only (block_gemm_precision int8).
  EXPECT_EQ(kernels::BlockMmaTerms(DType::kF32, kernels::kBlockMmaInt8), kernels::kBlockMmaInt8);
  EXPECT_EQ(kernels::BlockMmaTerms(DType::kBF16, kernels::kBlockMmaInt8), 1);
  EXPECT_EQ(kernels::BlockMmaTerms(DType::kF16, kernels::kBlockMmaInt8), 2);
  // 16 rows, 64 units: 3 parts of 32 bf16 values per row and unit, then 16 × 64 sums.
  EXPECT_EQ(kernels::BlockMmaScratchBytes(16, 2048, 3), 64 * 16 * 3 * 32 * 2 + 64 * 16 * 4);
  EXPECT_EQ(kernels::BlockMmaScratchBytes(5, 32, 1), 8 * 32 * 2 + 8 * 4);
  EXPECT_EQ(kernels::BlockMmaScratchBytes(0, 32, 1), -1);
  // f16x2: 2 parts, then the sums and the scales.
  EXPECT_EQ(kernels::BlockMmaScratchBytes(16, 2048, kernels::kBlockMmaF16x2),
            64 * 16 * 2 * 32 * 2 + 2 * 64 * 16 * 4);
  // int8: a lane's 8 codes and its rows' two scales, 16 bytes per 8 rows' 32 values (one
  // bf16 part's bytes), then the sums.
  EXPECT_EQ(kernels::BlockMmaScratchBytes(16, 2048, kernels::kBlockMmaInt8),
            64 * 16 * 32 * 2 + 64 * 16 * 4);
  // f16 in one scaled part: one part's bytes, then the sums and the scales.
  EXPECT_EQ(kernels::BlockMmaTerms(DType::kF32, kernels::kBlockMmaF16x1), kernels::kBlockMmaF16x1);
  EXPECT_EQ(kernels::BlockMmaTerms(DType::kBF16, kernels::kBlockMmaF16x1), 1);
  EXPECT_EQ(kernels::BlockMmaScratchBytes(16, 2048, kernels::kBlockMmaF16x1),
            64 * 16 * 32 * 2 + 2 * 64 * 16 * 4);
  EXPECT_EQ(kernels::BlockMmaScratchBytes(4, 32, 7), -1);
  EXPECT_EQ(kernels::BlockMmaScratchBytes(int64_t{1} << 40, int64_t{1} << 40, 3), -1);
  // About four blocks per SM of 132, each split at least 4 units, at most 16 splits.
  EXPECT_EQ(kernels::BlockMmaSplitsFor(128, 2048, 132), 5);
  EXPECT_EQ(kernels::BlockMmaSplitsFor(1, 256, 132), 2);
  EXPECT_EQ(kernels::BlockMmaSplitsFor(8, 1 << 20, 132), 16);
  EXPECT_EQ(kernels::BlockMmaSplitsFor(4000, 8192, 132), 1);
  const int64_t n[] = {100, 64, 1};
  EXPECT_EQ(kernels::BlockMmaColumnBlocks(n, 3, 64), 2 + 1 + 1);
  EXPECT_EQ(kernels::BlockMmaColumnBlocks(n, 3, 128), 1 + 1 + 1);
  EXPECT_EQ(kernels::BlockMmaSplitsFor(128, 2048, 132, 2), 3);
  // The decode shape up to 32 rows (64 columns, 32 rows a block), from 33 the prefill shape
  // (128 columns, 64 rows) for Q4_K and Q5_K, or one forced (the staged shape: 128 columns
  // and rows, one block an SM).
  using kernels::BlockMmaShape;
  constexpr auto kAuto = BlockMmaShape::kAuto;
  EXPECT_EQ(kernels::BlockMmaTileFor(32, DType::kQ4_K, kAuto).cols, 64);
  EXPECT_EQ(kernels::BlockMmaTileFor(32, DType::kQ4_K, kAuto).rows, 32);
  EXPECT_EQ(kernels::BlockMmaTileFor(33, DType::kQ4_K, kAuto).cols, 128);
  EXPECT_EQ(kernels::BlockMmaTileFor(33, DType::kQ5_K, kAuto).rows, 64);
  EXPECT_EQ(kernels::BlockMmaTileFor(512, DType::kQ4_0, kAuto).cols, 64);
  EXPECT_EQ(kernels::BlockMmaTileFor(512, DType::kQ6_K, kAuto).rows, 32);
  EXPECT_EQ(kernels::BlockMmaTileFor(512, DType::kQ6_K, BlockMmaShape::kStaged).cols, 128);
  EXPECT_EQ(kernels::BlockMmaTileFor(512, DType::kQ4_K, BlockMmaShape::kStaged).blocks_per_sm, 1);
  EXPECT_EQ(kernels::BlockMmaTileFor(2, DType::kQ4_0, BlockMmaShape::kPrefill).cols, 128);
  EXPECT_EQ(kernels::BlockMmaTileFor(2, DType::kQ4_0, BlockMmaShape::kStaged).rows, 128);
  EXPECT_EQ(kernels::BlockMmaTileFor(512, DType::kQ4_K, BlockMmaShape::kDecode).cols, 64);
  // One workspace: the partial sums (256-byte aligned) when split or kept, then the scratch.
  kernels::BlockMmaWorkspace ws;
  ASSERT_TRUE(kernels::BlockMmaWorkspaceFor(16, 2048, n, 3, DType::kQ4_0, 3, 132, false, &ws));
  EXPECT_EQ(ws.splits, 16);  // 4 column blocks: 528 wanted, 16 at most
  EXPECT_EQ(ws.partial_bytes, (16 * 16 * 165 * 4 + 255) / 256 * 256);
  EXPECT_EQ(ws.bytes, ws.partial_bytes + kernels::BlockMmaScratchBytes(16, 2048, 3));
  const int64_t wide = 128256;  // an lm head: unsplit, its sums kept only when asked
  ASSERT_TRUE(kernels::BlockMmaWorkspaceFor(16, 2048, &wide, 1, DType::kQ4_0, 1, 132, false, &ws));
  EXPECT_EQ(ws.splits, 1);
  EXPECT_EQ(ws.partial_bytes, 0);
  ASSERT_TRUE(kernels::BlockMmaWorkspaceFor(16, 2048, &wide, 1, DType::kQ4_0, 1, 132, true, &ws));
  EXPECT_EQ(ws.partial_bytes, (16 * wide * 4 + 255) / 256 * 256);
  const int64_t huge = int64_t{1} << 40;
  EXPECT_FALSE(kernels::BlockMmaWorkspaceFor(huge, 32, &huge, 1, DType::kQ4_0, 1, 132, true, &ws));
  EXPECT_FALSE(kernels::BlockMmaWorkspaceFor(0, 32, n, 1, DType::kQ4_0, 1, 132, true, &ws));
  // A Q4_K prefill of 512 rows: 16 × 4 staged blocks of 128 columns and rows, split twice
  // to fill 128 of 132 SMs with one block each; the prefill shape forced: 16 × 8 blocks of
  // 64 rows, two wanted per SM (3 splits); the decode shape: 32 × 16 blocks, four wanted
  // per SM (2).
  const int64_t q = 2048;
  ASSERT_TRUE(kernels::BlockMmaWorkspaceFor(512, 2048, &q, 1, DType::kQ4_K, 3, 132, false, &ws));
  EXPECT_EQ(ws.shape, BlockMmaShape::kStaged);
  EXPECT_EQ(ws.splits, 2);
  ASSERT_TRUE(kernels::BlockMmaWorkspaceFor(512, 2048, &q, 1, DType::kQ4_K, 3, 132, false, &ws,
                                            BlockMmaShape::kPrefill));
  EXPECT_EQ(ws.shape, BlockMmaShape::kPrefill);
  EXPECT_EQ(ws.splits, 3);
  ASSERT_TRUE(kernels::BlockMmaWorkspaceFor(512, 2048, &q, 1, DType::kQ4_K, 3, 132, false, &ws,
                                            BlockMmaShape::kDecode));
  EXPECT_EQ(ws.splits, 2);
  // gate/up at 512 rows: 64 × 4 staged blocks, unsplit, two waves; at 127 rows the other
  // shapes; 100 blocks (3,200 columns) fill too little of one wave, 256 of 400 SMs too.
  const int64_t up = 8192;
  ASSERT_TRUE(kernels::BlockMmaWorkspaceFor(512, 2048, &up, 1, DType::kQ4_0, 3, 132, false, &ws));
  EXPECT_EQ(ws.shape, BlockMmaShape::kStaged);
  EXPECT_EQ(ws.splits, 1);
  ASSERT_TRUE(kernels::BlockMmaWorkspaceFor(127, 2048, &up, 1, DType::kQ4_0, 3, 132, false, &ws));
  EXPECT_EQ(ws.shape, BlockMmaShape::kDecode);
  const int64_t odd = 3200;
  ASSERT_TRUE(kernels::BlockMmaWorkspaceFor(512, 2048, &odd, 1, DType::kQ4_0, 3, 132, false, &ws));
  EXPECT_EQ(ws.shape, BlockMmaShape::kDecode);
  ASSERT_TRUE(kernels::BlockMmaWorkspaceFor(512, 2048, &up, 1, DType::kQ4_0, 3, 400, false, &ws));
  EXPECT_EQ(ws.shape, BlockMmaShape::kDecode);

  kernels::BlockMmaArgs a;
  alignas(16) static float x[64], y[64];
  alignas(16) static uint8_t w[64], scratch[64];
  a.x = x;
  a.m = 1;
  a.k = 32;
  a.w[0] = w;
  a.n[0] = 1;
  a.w_dtype = DType::kQ4_0;
  a.y = y;
  a.ld = 1;
  a.scratch = nullptr;  // no scratch
  EXPECT_EQ(kernels::LaunchBlockMma(a, {}), cudaErrorInvalidValue);
  a.scratch = scratch + 4;  // misaligned
  EXPECT_EQ(kernels::LaunchBlockMma(a, {}), cudaErrorMisalignedAddress);
  a.scratch = scratch;
  a.w_dtype = DType::kF32;  // no block format
  EXPECT_EQ(kernels::LaunchBlockMma(a, {}), cudaErrorInvalidValue);
  a.w_dtype = DType::kQ4_K;  // K not whole blocks of 256
  EXPECT_EQ(kernels::LaunchBlockMma(a, {}), cudaErrorInvalidValue);
  a.w_dtype = DType::kQ4_0;
  a.splits = 2;  // splits without partial sums
  EXPECT_EQ(kernels::LaunchBlockMma(a, {}), cudaErrorInvalidValue);
  a.splits = 1;
  a.ld = 0;  // y narrower than the columns
  EXPECT_EQ(kernels::LaunchBlockMma(a, {}), cudaErrorInvalidValue);
  a.ld = 1;
  // Parts other than BlockMmaTerms gives for x's dtype (the scratch is sized by them).
  a.terms = 7;
  EXPECT_EQ(kernels::LaunchBlockMma(a, {}), cudaErrorInvalidValue);
  a.terms = 0;  // f32 x: 1, 2, 3, kBlockMmaF16x2, kBlockMmaInt8 or kBlockMmaF16x1
  EXPECT_EQ(kernels::LaunchBlockMma(a, {}), cudaErrorInvalidValue);
  a.dtype = DType::kF16;
  a.terms = 1;  // f16 x: 2
  EXPECT_EQ(kernels::LaunchBlockMma(a, {}), cudaErrorInvalidValue);
  a.dtype = DType::kBF16;
  a.terms = 3;  // bf16 x: 1
  EXPECT_EQ(kernels::LaunchBlockMma(a, {}), cudaErrorInvalidValue);
  a.terms = kernels::kBlockMmaF16x2;  // f32 x only
  EXPECT_EQ(kernels::LaunchBlockMma(a, {}), cudaErrorInvalidValue);
  a.terms = kernels::kBlockMmaInt8;  // f32 x only
  EXPECT_EQ(kernels::LaunchBlockMma(a, {}), cudaErrorInvalidValue);
}

// CudaOptions::block_unit_walk's kByWidth (and kAuto) takes the wide walk where its blocks fit one
// wave: at the 1B shape on 132 SMs the o projection (512 column blocks of 256 threads, 4
// an SM) and not q/k/v (768) or gate/up.
TEST(FusedWalkTest, WideWhereOneWaveHoldsTheBlocks) {
  kernels::FusedMatmulArgs a;
  a.m = 1;
  a.k = 2048;
  a.w_dtype[0] = DType::kQ4_0;
  a.n[0] = 2048;
  a.splits = kernels::FusedSplitsFor(a, 132);
  EXPECT_TRUE(kernels::FusedWideFitsOneWave(a, 132));
  EXPECT_FALSE(kernels::FusedWideFitsOneWave(a, 100));  // 512 blocks, 400 at once
  a.weights = 3;
  a.n[1] = a.n[2] = 512;
  a.w_dtype[1] = a.w_dtype[2] = DType::kQ4_0;
  a.splits = kernels::FusedSplitsFor(a, 132);
  EXPECT_FALSE(kernels::FusedWideFitsOneWave(a, 132));
  a.weights = 2;
  a.n[0] = a.n[1] = 8192;
  a.epilogue = kernels::FusedEpilogue::kSiluMul;
  a.splits = kernels::FusedSplitsFor(a, 132);
  EXPECT_FALSE(kernels::FusedWideFitsOneWave(a, 132));
  a.m = 2;  // one row only
  EXPECT_FALSE(kernels::FusedWideFitsOneWave(a, 132));
}

// The cases exist whether or not a device does: a build that lost them would pass
// silently on a GPU machine.
TEST(QuantConformanceCasesTest, EveryFormatAndDTypeIsCovered) {
  // Per format and x dtype: 15 block-format shapes and rows; 4 on the one-row kernel for
  // the formats whose lm head takes it (all but Q5_K).
  EXPECT_EQ(MatmulCases().size(), 8u * 3u * (5u + 5u + 4u + 1u) + 7u * 3u * 4u);
  EXPECT_EQ(EmbeddingCases().size(), 8u * 3u * 3u);
  EXPECT_EQ(FusedCases().size(), 8u * 3u * (7u + 2u + 2u) + 5u * 3u * 2u + 3u * 5u);
  // Per format and x dtype: 6 shapes automatic, 3 of them in 3 forced block shapes, the
  // long one staged; f32 x rounded to bf16 once, in two parts three times, in two scaled
  // f16 parts, in one and as int8 held exactly in every shape, as int8 of random x three
  // times, and under the default precision (one f16 part from 16 rows) five times.
  EXPECT_EQ(MmaMatmulCases().size(),
            8u * (3u * (6u + 3u * 3u + 1u) + 1u + 3u + 3u * (6u + 3u * 3u + 1u) + 3u + 5u));
  EXPECT_EQ(MmaFusedCases().size(), 8u * 3u * (6u + 1u) + 3u * 2u);
  // Per format, x dtype and integer precision: 2 MatMuls, the add and SiluMul.
  EXPECT_EQ(IntRowCases().size(), 8u * 3u * (4u * 4u + 1u));
  // Per format: 2 precisions of 8 shapes and a bad id; the pair kernel at a long K.
  EXPECT_EQ(MoeRowCases().size(), 8u * (2u * (8u + 1u) + 1u));
  // Per format: 4 f32 shapes in 4 precisions, bf16 once, skewed and bad ids plain and
  // gated.
  EXPECT_EQ(MoeMmaCases().size(), 8u * (4u * 4u + 1u + 2u + 2u));
}

}  // namespace
}  // namespace sg::testing
