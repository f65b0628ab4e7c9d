// The switches of the CUDA dispatcher, in a header without CUDA so that sessions, the step
// runner and the program can carry them on any build. The program maps the environment
// (STEPGRAPH_MATMUL, STEPGRAPH_PDL) onto these once; library code reads no environment.
#ifndef STEPGRAPH_DISPATCH_CUDA_OPTIONS_H_
#define STEPGRAPH_DISPATCH_CUDA_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stepgraph/base/dtype.h"

namespace sg {

// How the CUDA dispatcher picks a path for each MatMul. kAuto: stepgraph's small-M kernel
// where it is faster (decode shapes), cuBLASLt elsewhere; kGemv: the small-M kernel
// wherever it applies (M <= 8); kCublasLt: cuBLASLt everywhere. The forced ones let tests
// and benchmarks run each path.
enum class MatmulPolicy : uint8_t { kAuto, kCublasLt, kGemv };

absl::string_view MatmulPolicyName(MatmulPolicy p);  // "auto", "cublaslt", "gemv"
// Inverse of MatmulPolicyName; InvalidArgument naming the choices otherwise.
absl::StatusOr<MatmulPolicy> ParseMatmulPolicy(absl::string_view name);

// How the block-format GEMM path (CudaOptions::block_gemm_min_rows) computes when x is f32,
// which is how GGUF files with quantized matrices are computed (docs/gguf.md). With bf16
// or f16 activations the weight is always dequantized to x's dtype and every choice is the
// same. kF32: the weight dequantized to f32 exactly and an f32 GEMM (CUDA cores, the
// reference's values up to the order of additions); kTf32: the same f32 operands on the
// tensor cores in TF32 (10-bit mantissas); kBf16: weight and x rounded to bf16, the f32
// result accumulated in f32 (the fastest; 8-bit mantissas); kF16: the same in f16 (11-bit
// mantissas, as fast; x scaled by a power of two into f16's range on the device, the GEMM's
// alpha scaling y back), the tensor-core kernel below the GEMM's rows taking x as one f16
// part per 32 values scaled by a power of two (kernels::kBlockMmaF16x1). kBf16x2: the tensor-core
// kernel's x as two bf16 parts (16 significant bits; exact f32 takes three), the weights
// exact; the block GEMM, where forced, computes as kF32. kF16x2: the tensor-core kernel's x
// as two f16 parts of each row's 32 values scaled by a power of two (f32's precision
// relative to the unit's largest value, in two thirds of kF32's MMAs), the weights exact;
// the block GEMM, where forced, computes as kF32. kInt8: the tensor-core kernel's x
// quantized to int8 per row and 32 values (one f32 scale each, as llama.cpp's block
// matmuls quantize activations) in int8 MMAs: the fastest, not the reference's numbers
// (each x held to half of 1/127 of its unit's largest magnitude); the block GEMM, where
// forced, computes as kF32. kAuto (the default): f16 where it gains, exact f32 elsewhere:
// the block GEMM in f16 from 32 rows (prefill steps: on an H200, 2026-12-01, a 512-token
// Q4_0 prefill of the 1B shape in 7.9 ms against 14.6 with two f16 parts, 66.6k tokens/s
// against llama.cpp's 43.9k), the tensor-core kernel's one scaled f16 part from
// kBlockGemmAutoF16Rows rows (a Q4_K_M decode batch of 16 in 1,957 us against 2,216
// exact), and exact f32 (three bf16 parts) below, where f16 gains little (batch 8: 1,772
// against 1,830 us). Its precision: SmolLM2's Q4_1 file with x and weights in f16 gave
// every one of 24 answers of exact f32 (bench/precision_study.py, docs/gguf.md); weights
// past f16's range (65,504: no trained model's) overflow and surface as the session's
// non-finite-logits error. docs/cuda_kernels.md.
enum class BlockGemmPrecision : uint8_t {
  kF32,
  kTf32,
  kBf16,
  kBf16x2,
  kF16x2,
  kInt8,
  kAuto,
  kF16,
};
inline constexpr int64_t kBlockGemmAutoF16Rows = 16;

// "f32", "tf32", "bf16", "bf16x2", "f16x2", "int8", "auto", "f16"
absl::string_view BlockGemmPrecisionName(BlockGemmPrecision p);
// Inverse of BlockGemmPrecisionName; InvalidArgument naming the choices otherwise.
absl::StatusOr<BlockGemmPrecision> ParseBlockGemmPrecision(absl::string_view name);

// How one-row block-format matmuls (decode at batch 1) multiply f32 or 16-bit x with the
// weights (kernels/quant_matmul.cuh's QuantRowX). kF32 (the default): every weight value
// the CPU reference's, f32 products, the fused and one-row kernels as their own options
// choose. kInt16, kInt8: x quantized per 32 values to int16 or int8 with one f32 scale and
// multiplied in integer dot products (dp2a, dp4a), as llama.cpp multiplies block weights
// with int8; every one-row MatMul without bias and every one-row FusedMatMul without a
// folded norm whose epilogue is none, the residual add or SiluMul (gate and up in one
// format) runs the one-row kernel so, at any width; the q/k/v projection with its RoPE
// epilogue stays f32. Not the reference's numbers: docs/gguf.md's parity study. kInt16x2:
// the same kernels and routes with x as two int16 parts (QuantRowX::kInt16x2), each value
// held to 2^-30 of its unit's largest: the reference's numbers to f32's rounding noise.
// kAuto (the default): kInt16x2 for every block format but Q8_0, kF32 for Q8_0, whose f32
// kernels were faster (H200, the 1B step, 2026-11-30: Q4_K_M 0.787 ms against 0.900 f32,
// Q4_0 0.711 against 0.746; Q8_0 0.726 against 0.675; docs/cuda_kernels.md).
enum class BlockGemvPrecision : uint8_t { kF32, kInt16, kInt8, kInt16x2, kAuto };

// "f32", "int16", "int8", "int16x2", "auto"
absl::string_view BlockGemvPrecisionName(BlockGemvPrecision p);
// Inverse of BlockGemvPrecisionName; InvalidArgument naming the choices otherwise.
absl::StatusOr<BlockGemvPrecision> ParseBlockGemvPrecision(absl::string_view name);

// How a prompt's attention meets f32 activations (CudaOptions::prefill_attention).
enum class PrefillAttentionPrecision : uint8_t { kAuto, kF32, kF16 };
// "auto", "f32", "f16"; Parse is its inverse.
absl::string_view PrefillAttentionPrecisionName(PrefillAttentionPrecision p);
absl::StatusOr<PrefillAttentionPrecision> ParsePrefillAttentionPrecision(absl::string_view name);

// The tensor-core block kernel's thread-block shape (kernels/block_mma.cuh's BlockMmaShape,
// in the same order): kAuto picks one by rows and format; the others force one, for tests
// and benchmarks.
enum class BlockMmaShapeOption : uint8_t { kAuto, kDecode, kPrefill, kStaged };

// How the CUDA-core block kernel's threads walk the units of 32-value formats at one row
// (kernels/fused_matmul.cuh's FusedUnitWalk): kByWidth
// takes kWide for a FusedMatMul whose wide launch fits one wave of the GPU (the narrow
// projections: q/k/v, o) and kSerial elsewhere; kAuto is kByWidth, the fastest measured
// (H200, 1B shape, f32 activations, decode_bench QuantWalk, 2026-11-29: Q4_0 step 0.758
// ms by width against 0.779 serial and 0.989 wide; Q8_0 0.765 / 0.785 / 0.998); kSerial
// and kWide force one, for benchmarks.
enum class BlockUnitWalkOption : uint8_t { kAuto, kSerial, kWide, kByWidth };

struct CudaOptions {
  MatmulPolicy matmul = MatmulPolicy::kAuto;
  // Programmatic dependent launch on sm_90 and later (each kernel may start while its
  // predecessor drains). The dispatcher's own: other dispatchers of the process launch as
  // their options say.
  bool programmatic_launch = true;
  int64_t matmul_workspace_bytes = int64_t{32} << 20;
  // Kernels compiled for the plan through NVRTC (docs/nvrtc.md) are cached in memory per
  // process and, when this names a folder, on disk there (created if missing; a folder
  // that cannot be written leaves the cache in memory). The program passes
  // ${XDG_CACHE_HOME:-$HOME/.cache}/stepgraph/kernels.
  std::string kernel_cache_folder;
  // RmsNorm through a kernel compiled for the node's hidden size, eps and dtype (NVRTC)
  // instead of the built-in kernel. FusedElementwise nodes are always compiled.
  bool compiled_norm = false;
  // MatMul with w in a GGUF block format: from this many rows of x on, w is dequantized
  // into a workspace in chunks of its rows and each chunk multiplied by cuBLASLt (the block
  // GEMM); fewer rows run the block-format kernels (block_mma_min_rows). 0: never.
  // kBlockGemmAuto (the default): 32 where the GEMM multiplies on tensor cores (bf16 or f16
  // x; f32 x under block_gemm_precision auto, f16, tf32 or bf16), never where it would multiply exact
  // f32 on the CUDA cores (f32 x, precision f32) while the tensor-core kernel runs
  // (block_mma_min_rows > 0): that kernel is exact too and faster at every size measured
  // (H200, 2026-11-29, prefill_bench: 3 layers of Q4_0 matmuls, 512 rows 1.23 ms a layer
  // against 1.70, 64 rows 0.21 against 0.71; a Q4_0 1B prefill of 512 tokens 24.1k
  // tokens/s against 18.0k). prefill_bench's BlockMatMul cases compare the paths per format.
  static constexpr int64_t kBlockGemmAuto = -1;
  int64_t block_gemm_min_rows = kBlockGemmAuto;
  // The workspace those chunks are dequantized into (sized at Prepare from the largest
  // need of the plans prepared, never per step). A chunk holds at least 128 rows of w.
  int64_t block_gemm_workspace_bytes = int64_t{32} << 20;
  BlockGemmPrecision block_gemm_precision = BlockGemmPrecision::kAuto;
  // Block-format matmuls of this many rows of x or more (MatMul below the block GEMM's rows,
  // FusedMatMul without a folded norm) run on tensor cores (kernels/block_mma.cuh): each
  // weight read once per 32 rows, its codes exact in bf16, x split into bf16 parts whose
  // products are x·code exactly (three parts for f32 x; one, rounding x to bf16, under
  // block_gemm_precision bf16), sums in f32, scales and mins applied per 32 values as the
  // CUDA-core kernels do. Fewer rows, 0, or a device before sm_80: the CUDA-core kernels,
  // which pay every row in FMAs and read the weights once per 8 rows. On an H200 (the
  // 1B shape, f32 activations, quant_bench) they still win at 4 rows for Q4_0 and Q6_K
  // (q/o 5.7 against 8.8 us) and lose for Q4_K; from 8 rows the tensor cores win every
  // format, at 16 rows by 1.5 to 4x; and a Q4_K_M step of 4 rows took 1.86 ms fused on
  // tensor cores against 2.80 ms on CUDA cores (plain graph). docs/cuda_kernels.md.
  int64_t block_mma_min_rows = 4;
  BlockMmaShapeOption block_mma_shape = BlockMmaShapeOption::kAuto;
  BlockUnitWalkOption block_unit_walk = BlockUnitWalkOption::kAuto;
  // At one row, FusedMatMuls of float weights run the fused kernel compiled to hold this
  // many blocks of 256 threads an SM: 0 (no bound: 58 registers at bf16, so four blocks,
  // 64 KiB of weight loads in flight an SM), 5 (48 registers, 16 bytes spilled) or 6 (40
  // registers, 88 bytes spilled). The 1B step's matmuls under ncu (H200, 2026-12-02, each
  // kernel alone): gate/up 26.5 us for 67 MB (2.5 TB/s), q/k/v 10.4, o 6.2, down 11.7,
  // where the plain small-M kernel, 40 registers and six blocks an SM, streams the lm head
  // at 4.5 TB/s. Whether more blocks an SM gain despite the spills is what this option
  // lets decode_bench measure (Decode/min_blocks_<n>); not yet measured, so 0.
  int fused_float_min_blocks = 0;
  // A MatMul of one row of x (no bias) with a block-format w of at least this many
  // columns (rows of w: an lm head), in any format but Q5_K, runs the one-row kernel
  // (kernels/quant_matmul.cuh's LaunchQuantRowMatmul: persistent warps, each walking whole
  // columns with its next loads in flight) instead of the fused or block-format kernel;
  // 0: never. H200, the 1B lm head at f32 (quant_bench, 2026-11-29): Q4_0 76 us against 92,
  // Q8_0 85 against 97, Q5_0 97 against 113; Q4_K and Q6_K equal; Q5_K 138 against 121.
  int64_t block_row_min_cols = int64_t{32} << 10;
  // A FusedMatMul of one row with one block-format weight, no folded norm and no epilogue
  // but the residual add (the o projection) runs the one-row kernel when its K is at most
  // this; 0: never. The 1B o projection (2048 x 2048): Q4_K 3.1 us against 4.6 on the
  // fused kernel, Q6_K 2.9 against 3.3, Q8_0 2.6 against 3.9; the Q4_K_M step 0.890 ms
  // against 0.910. Down (K 8192) is slower on it (Q4_0 8.8 against 7.2 us).
  int64_t block_row_fused_max_k = 2048;
  BlockGemvPrecision block_gemv_precision = BlockGemvPrecision::kAuto;
  // Under an integer block_gemv_precision, the one-row kernel takes one-weight FusedMatMuls
  // (the o projection; none or the add) up to this K, gate/up with SiluMul and MatMuls up
  // to its own limit. Few columns over a long K leave its warps few: H200, quant_bench,
  // 2026-11-30, the 1B down (2048 x 8192) Q4_K 9.4 us int8 against 9.1 on the fused f32
  // kernel, Q4_0 7.8 against 7.2, where the 8B o projection (4096 x 4096) Q4_K takes 6.8
  // against 8.6.
  int64_t block_row_int_max_k = 4096;
  // MoeMatMul walks by expert (a block per expert and 8 columns, each expert's units read
  // once per window of 512 pairs) when its step has at least this many (row, chosen
  // expert) pairs per expert on average, and one block per pair below it: 0 walks by
  // expert always, a value past any step's pairs never. H200, 2026-11-29: a Qwen3-MoE-
  // shaped BF16 file of 4 layers prefills at 21.7k tokens/s walking by expert, where the
  // pair blocks gave its 12-layer files 2.2k to 3.0k (docs/cuda_kernels.md).
  int64_t moe_by_expert_pairs = 2;
  // Block-format MoeMatMuls that walk by expert (above) run on the tensor cores
  // (kernels/block_mma.cuh's LaunchMoeBlockMma: the step's pairs listed by expert on the
  // device, each expert's units read once per 32 of its pairs, x in block_gemm_precision's
  // parts by the step's pair count) instead of the by-expert kernel's f32 CUDA-core
  // products. H200, 2026-12-01: a Qwen3-MoE-shaped Q4_K_M file (12 layers) prefilled 512
  // tokens at 23.2k tokens/s with it and 6.1k without (llama.cpp 36.7k); decode, which
  // does not walk by expert, unchanged (0.833 ms). false: the by-expert kernel.
  bool moe_block_mma = true;
  // Prefill attention of f32 activations (a GGUF file with quantized matrices): kF16 runs
  // it on the tensor-core kernel, q, k, v and the softmax's probabilities rounded to f16
  // before their products, sums and the output in f32 (kernels/attention.cuh's
  // AttentionArgs::prefill_f32_f16); kF32 on the CUDA-core kernel's f32 products. The
  // dispatcher runs kAuto as kF32 (an attention node cannot see the model's weights);
  // DecodeSession resolves it with ResolvePrefillAttention. H200, 2026-12-01,
  // attention_bench: 2,048 rows of 32 heads 197 us against 704.
  PrefillAttentionPrecision prefill_attention = PrefillAttentionPrecision::kAuto;
  // Decode attention merges the KV chunks of a row within thread block clusters of up to 8
  // chunks through distributed shared memory (sm_90 and later) where a chunk has fewer than
  // 8 blocks (Qwen3-MoE's 4 KV heads at batch 1: its Q4_K_M step 4% shorter at position
  // 1,000), so that a context of up to eight chunks skips the workspace's round trip
  // (kernels/attention.cuh's AttentionClusters::kAuto). false: every chunk through the
  // workspace (kNever).
  bool attention_clusters = true;
  // Tensor parallel: AllReduce of at most this many bytes runs as stepgraph's one-shot
  // kernel over NVLink peer memory (kernels/collectives.cuh) where the group has its
  // buffers; larger ones, and every one with 0, through NCCL. On 4 H100s (NVLink, 64 in a
  // chain, replayed, 2026-11-27) one-shot took 8.6 us for 4 and 8 KiB against NCCL's 9.1 and
  // 9.4, and lost from 16 KiB on (11.9 against 10.3); on 2 of them the two were equal at
  // 8 KiB (6.6 us) and NCCL was 0.5 us faster at 4 KiB. On 2 H200s (2026-11-29) one-shot
  // won up to 16 KiB: 4.8 against 6.5 us at 8 KiB, 6.4 against 6.6 at 16.
  int64_t one_shot_all_reduce_bytes = int64_t{8} << 10;
};

// The rows from which a block-format MatMul of x in `x_dtype` takes the block GEMM under
// `o` (0: never): block_gemm_min_rows resolved where it is kBlockGemmAuto.
int64_t BlockGemmMinRows(const CudaOptions& o, DType x_dtype);

// prefill_attention for a model whose matrices are (some of them) block formats computing
// in f32 activations (`block_f32`): kAuto is kF16 there unless block_gemm_precision keeps
// f32's precision (f32, f16x2), since its matmuls' x is already rounded to 16 bits, and
// kF32 for every other model (f32 safetensors, f16 and bf16 files); kF32 and kF16 stay.
PrefillAttentionPrecision ResolvePrefillAttention(const CudaOptions& o, bool block_f32);

}  // namespace sg

#endif  // STEPGRAPH_DISPATCH_CUDA_OPTIONS_H_
