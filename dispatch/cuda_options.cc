// Names of the CUDA dispatcher's switches (stepgraph/dispatch/cuda_options.h); core code, so that
// the program parses them on builds without CUDA too.
#include "stepgraph/dispatch/cuda_options.h"

#include "absl/strings/str_cat.h"

namespace sg {

absl::string_view MatmulPolicyName(MatmulPolicy p) {
  switch (p) {
    case MatmulPolicy::kAuto:
      return "auto";
    case MatmulPolicy::kCublasLt:
      return "cublaslt";
    case MatmulPolicy::kGemv:
      return "gemv";
  }
  return "?";
}

absl::StatusOr<MatmulPolicy> ParseMatmulPolicy(absl::string_view name) {
  for (MatmulPolicy p : {MatmulPolicy::kAuto, MatmulPolicy::kCublasLt, MatmulPolicy::kGemv}) {
    if (name == MatmulPolicyName(p)) return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("matmul policy must be auto, cublaslt or gemv, got '", name, "'"));
}

absl::string_view BlockGemmPrecisionName(BlockGemmPrecision p) {
  switch (p) {
    case BlockGemmPrecision::kF32:
      return "f32";
    case BlockGemmPrecision::kTf32:
      return "tf32";
    case BlockGemmPrecision::kBf16:
      return "bf16";
    case BlockGemmPrecision::kBf16x2:
      return "bf16x2";
    case BlockGemmPrecision::kF16x2:
      return "f16x2";
    case BlockGemmPrecision::kInt8:
      return "int8";
    case BlockGemmPrecision::kAuto:
      return "auto";
    case BlockGemmPrecision::kF16:
      return "f16";
  }
  return "?";
}

absl::StatusOr<BlockGemmPrecision> ParseBlockGemmPrecision(absl::string_view name) {
  for (BlockGemmPrecision p : {BlockGemmPrecision::kF32, BlockGemmPrecision::kTf32,
                               BlockGemmPrecision::kBf16, BlockGemmPrecision::kBf16x2,
                               BlockGemmPrecision::kF16x2, BlockGemmPrecision::kInt8,
                               BlockGemmPrecision::kAuto, BlockGemmPrecision::kF16}) {
    if (name == BlockGemmPrecisionName(p)) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "block GEMM precision must be auto, f32, tf32, bf16, f16, bf16x2, f16x2 or int8, got '",
      name, "'"));
}

absl::string_view BlockGemvPrecisionName(BlockGemvPrecision p) {
  switch (p) {
    case BlockGemvPrecision::kF32:
      return "f32";
    case BlockGemvPrecision::kInt16:
      return "int16";
    case BlockGemvPrecision::kInt8:
      return "int8";
    case BlockGemvPrecision::kInt16x2:
      return "int16x2";
    case BlockGemvPrecision::kAuto:
      return "auto";
  }
  return "?";
}

absl::StatusOr<BlockGemvPrecision> ParseBlockGemvPrecision(absl::string_view name) {
  for (BlockGemvPrecision p :
       {BlockGemvPrecision::kF32, BlockGemvPrecision::kInt16, BlockGemvPrecision::kInt8,
        BlockGemvPrecision::kInt16x2, BlockGemvPrecision::kAuto}) {
    if (name == BlockGemvPrecisionName(p)) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "block GEMV precision must be auto, f32, int16x2, int16 or int8, got '", name, "'"));
}

absl::string_view PrefillAttentionPrecisionName(PrefillAttentionPrecision p) {
  switch (p) {
    case PrefillAttentionPrecision::kAuto:
      return "auto";
    case PrefillAttentionPrecision::kF32:
      return "f32";
    case PrefillAttentionPrecision::kF16:
      return "f16";
  }
  return "?";
}

absl::StatusOr<PrefillAttentionPrecision> ParsePrefillAttentionPrecision(absl::string_view name) {
  for (PrefillAttentionPrecision p : {PrefillAttentionPrecision::kAuto,
                                      PrefillAttentionPrecision::kF32,
                                      PrefillAttentionPrecision::kF16}) {
    if (name == PrefillAttentionPrecisionName(p)) return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("prefill attention precision must be auto, f32 or f16, got '", name, "'"));
}

PrefillAttentionPrecision ResolvePrefillAttention(const CudaOptions& o, bool block_f32) {
  if (o.prefill_attention != PrefillAttentionPrecision::kAuto) return o.prefill_attention;
  const bool exact_matmuls = o.block_gemm_precision == BlockGemmPrecision::kF32 ||
                             o.block_gemm_precision == BlockGemmPrecision::kF16x2;
  return block_f32 && !exact_matmuls ? PrefillAttentionPrecision::kF16
                                     : PrefillAttentionPrecision::kF32;
}

int64_t BlockGemmMinRows(const CudaOptions& o, DType x_dtype) {
  if (o.block_gemm_min_rows != CudaOptions::kBlockGemmAuto) return o.block_gemm_min_rows;
  // The tensor-core kernel's f32 x in parts (three exact, two) beats the block GEMM's f32
  // on CUDA cores at every size; tf32, bf16 and f16 GEMMs (auto's is f16) take over from
  // 32 rows. Every precision but those (the GEMM's own) is the tensor-core kernel's.
  const bool parts_f32 = x_dtype == DType::kF32 &&
                         o.block_gemm_precision != BlockGemmPrecision::kTf32 &&
                         o.block_gemm_precision != BlockGemmPrecision::kBf16 &&
                         o.block_gemm_precision != BlockGemmPrecision::kF16 &&
                         o.block_gemm_precision != BlockGemmPrecision::kAuto;
  return parts_f32 && o.block_mma_min_rows > 0 ? 0 : 32;
}

}  // namespace sg
