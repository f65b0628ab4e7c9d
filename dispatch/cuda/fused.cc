// The fused unit of CudaDispatch: the fused ops of the graph passes, FusedMatMul and
// RopeKvWrite (kernels/fused_matmul.cuh), over weights of x's dtype or in GGUF block
// formats (held in the device layout of kernels/quant_blocks.cuh). Preparing a FusedMatMul
// node fixes its launch (split-K factor for this GPU) and allocates its workspace: split-K
// partial sums and tickets, argmax per-block bests; the tickets are zeroed once here and every launch
// leaves them zeroed, so replays need no reset. The rope_kv_write epilogue gets its RoPE
// frequency table here, as RopeKvWrite does.
#include <algorithm>
#include <variant>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_handles.h"
#include "dispatch/cuda/cuda_status.h"
#include "dispatch/cuda/matmul.h"
#include "dispatch/cuda/op_units.h"
#include "dispatch/cuda/rope.h"
#include "kernels/block_mma.cuh"
#include "kernels/fused_matmul.cuh"
#include "kernels/quant_matmul.cuh"
#include "stepgraph/base/status.h"
#include "stepgraph/dispatch/cuda_dispatch.h"

namespace sg {
namespace internal {
namespace {

struct FusedMatmulState final : PreparedState<FusedMatmulState> {
  kernels::FusedMatmulArgs launch;  // shapes, split and workspace; pointers bound at Run
  DeviceMemory workspace;
  // The node runs the one-row kernel (TakesRowKernel), x as row_x says.
  bool row_kernel = false;
  kernels::QuantRowX row_x = kernels::QuantRowX::kF32;
};

struct RopeKvWriteState final : PreparedState<RopeKvWriteState> {
  const float* inv_freq = nullptr;
};

kernels::FusedEpilogue KernelEpilogue(ops::FusedMatMul::Epilogue e) {
  switch (e) {
    case ops::FusedMatMul::Epilogue::kAdd: return kernels::FusedEpilogue::kAdd;
    case ops::FusedMatMul::Epilogue::kSiluMul: return kernels::FusedEpilogue::kSiluMul;
    case ops::FusedMatMul::Epilogue::kArgmax: return kernels::FusedEpilogue::kArgmax;
    case ops::FusedMatMul::Epilogue::kRopeKvWrite: return kernels::FusedEpilogue::kRopeKvWrite;
    default: return kernels::FusedEpilogue::kNone;
  }
}

int64_t AlignUp(int64_t v) { return (v + 255) / 256 * 256; }

// Whether a FusedMatMul over x [m, k] and weights in block formats (`blocks`) runs on
// tensor cores: no folded norm, enough rows, a device that has the MMA.
bool TakesBlockMma(const ops::FusedMatMul& op, int64_t m, bool blocks,
                   const CudaOptions& options, const CudaDeviceInfo& info) {
  return blocks && !op.norm && options.block_mma_min_rows > 0 &&
         m >= options.block_mma_min_rows && kernels::BlockMmaRuns(info.compute_capability);
}

// Whether a FusedMatMul over x [m, k] and weights `a` runs the one-row kernel
// (kernels/quant_matmul.cuh's LaunchQuantRowMatmul, CudaOptions::block_row_fused_max_k):
// one row, one block-format weight, no folded norm, no epilogue but the residual add; under
// an integer block_gemv_precision up to block_row_int_max_k, and gate and up of one format
// with SiluMul at any K the kernel takes (LaunchQuantRowSiluMul).
bool TakesRowKernel(const ops::FusedMatMul& op, const kernels::FusedMatmulArgs& a,
                    const CudaOptions& options) {
  if (a.m != 1 || op.norm || !kernels::QuantRowMatmulTakes(a.n[0], a.k, a.w_dtype[0])) {
    return false;
  }
  const bool integer = RowXFor(options, a.w_dtype[0]) != kernels::QuantRowX::kF32;
  if (op.epilogue == ops::FusedMatMul::Epilogue::kSiluMul) {
    return integer && op.weights == 2 && a.n[1] == a.n[0] && a.w_dtype[1] == a.w_dtype[0];
  }
  return op.weights == 1 &&
         (op.epilogue == ops::FusedMatMul::Epilogue::kNone ||
          op.epilogue == ops::FusedMatMul::Epilogue::kAdd) &&
         a.k <= (integer ? std::max(options.block_row_fused_max_k, options.block_row_int_max_k)
                         : options.block_row_fused_max_k);
}

// The tensor-core path's workspace for `a` (shapes set): its products (kept even when
// unsplit: the epilogue launches read them), then the block MMA scratch for x.
absl::StatusOr<kernels::BlockMmaWorkspace> MmaWorkspace(const kernels::FusedMatmulArgs& a,
                                                        int terms, int sm_count) {
  kernels::BlockMmaWorkspace ws;
  if (!kernels::BlockMmaWorkspaceFor(a.m, a.k, a.n, a.weights, a.w_dtype[0], terms, sm_count,
                                     true, &ws, a.mma_shape)) {
    return absl::InvalidArgumentError(absl::StrCat("FusedMatMul products of ", a.m,
                                                   " rows (K ", a.k, ") overflow"));
  }
  return ws;
}

// The walk of a block-format launch of one row whose splits are set
// (CudaOptions::block_unit_walk): by width, wide where its blocks fit one wave.
kernels::FusedUnitWalk UnitWalkFor(BlockUnitWalkOption option, const kernels::FusedMatmulArgs& a,
                                   int sm_count) {
  switch (option) {
    case BlockUnitWalkOption::kSerial: return kernels::FusedUnitWalk::kSerial;
    case BlockUnitWalkOption::kWide: return kernels::FusedUnitWalk::kWide;
    case BlockUnitWalkOption::kAuto:
    case BlockUnitWalkOption::kByWidth: break;
  }
  return kernels::FusedWideFitsOneWave(a, sm_count) ? kernels::FusedUnitWalk::kWide
                                                    : kernels::FusedUnitWalk::kSerial;
}

}  // namespace

absl::StatusOr<int64_t> FusedMmaWorkspaceBytes(const Graph& graph, const Node& node,
                                               const CudaOptions& options,
                                               const CudaDeviceInfo& info) {
  const auto* op = std::get_if<ops::FusedMatMul>(&node.op);
  if (op == nullptr || op->weights < 1 || op->weights > kernels::kFusedMaxWeights) return 0;
  const Tensor& x = graph.tensor(node.inputs[0]);
  const int first_w = op->norm ? 2 : 1;
  if (x.shape.rank() != 2 ||
      static_cast<int>(node.inputs.size()) < first_w + op->weights ||
      !TakesBlockMma(*op, x.shape[0], IsQuantized(graph.tensor(node.inputs[first_w]).dtype),
                     options, info)) {
    return 0;
  }
  kernels::FusedMatmulArgs a;
  a.m = x.shape[0];
  a.k = x.shape[1];
  a.weights = op->weights;
  for (int g = 0; g < op->weights; ++g) {
    a.n[g] = graph.tensor(node.inputs[first_w + g]).shape[0];
    a.w_dtype[g] = graph.tensor(node.inputs[first_w + g]).dtype;
  }
  a.mma_shape = BlockMmaShapeFor(options);
  SG_ASSIGN_OR_RETURN(const kernels::BlockMmaWorkspace ws,
                      MmaWorkspace(a, BlockMmaTermsFor(x.dtype, a.m, options), info.sm_count));
  return ws.bytes;
}

// What the fused kernel takes of a FusedMatMul over `in` (a CudaPrepareContext or a
// CudaSupportQuery): at most kFusedMaxWeights weights, all of x's float dtype or all in
// GGUF block formats (each weight its own, K whole blocks of each, no column block of the
// kernel spanning two formats: FusedBlockFormatsFit), and the rope_kv_write epilogue only
// for head_dim a multiple of kFusedCols (a block's four columns hold whole RoPE pairs).
// Unimplemented naming the limit otherwise; formats only then.
namespace {
template <typename Inputs>
absl::Status FusedKernelTakes(const ops::FusedMatMul& op, const Inputs& in) {
  if (op.weights > kernels::kFusedMaxWeights) {
    return absl::UnimplementedError(absl::StrCat("CUDA FusedMatMul takes at most ",
                                                 kernels::kFusedMaxWeights, " weights, got ",
                                                 op.weights));
  }
  if (op.epilogue == ops::FusedMatMul::Epilogue::kRopeKvWrite &&
      op.rope.head_dim % kernels::kFusedCols != 0) {
    return absl::UnimplementedError(absl::StrCat(
        "CUDA FusedMatMul's rope_kv_write epilogue takes head_dim a multiple of ",
        kernels::kFusedCols, " (a block's columns hold whole RoPE pairs), got ",
        op.rope.head_dim));
  }
  const Tensor& x = in.input(0);
  const int first_w = op.norm ? 2 : 1;
  const bool blocks = IsQuantized(in.input(first_w).dtype);
  kernels::FusedMatmulArgs formats;
  formats.weights = op.weights;
  formats.epilogue = KernelEpilogue(op.epilogue);
  for (int g = 0; g < op.weights; ++g) {
    const Tensor& w = in.input(first_w + g);
    if (blocks ? !IsQuantized(w.dtype) : w.dtype != x.dtype) {
      return absl::UnimplementedError(absl::StrCat(
          "CUDA FusedMatMul takes weights all of x's dtype (", DTypeName(x.dtype),
          ") or all in block formats; weight '", w.name, "' is ", DTypeName(w.dtype)));
    }
    if (blocks && x.shape[1] % DTypeBlockElems(w.dtype) != 0) {
      return absl::UnimplementedError(absl::StrCat(
          "CUDA FusedMatMul takes K a multiple of the block of weight '", w.name, "' (",
          DTypeName(w.dtype), "), got ", x.shape[1]));
    }
    formats.n[g] = w.shape[0];
    formats.w_dtype[g] = w.dtype;
  }
  if (!kernels::FusedBlockFormatsFit(formats)) {
    return absl::UnimplementedError(
        "CUDA FusedMatMul takes weights of different block formats only where each but "
        "the last has a multiple of 4 rows (a column block holds one format) and never for "
        "silu_mul's gate and up");
  }
  return absl::OkStatus();
}
}  // namespace

bool Supports(const ops::FusedMatMul& op, const CudaSupportQuery& q) {
  return FusedKernelTakes(op, q).ok();
}

PreparedOr Prepare(const ops::FusedMatMul& op, const CudaPrepareContext& c) {
  SG_RETURN_IF_ERROR(FusedKernelTakes(op, c));
  const Tensor& x = c.input(0);
  const int first_w = op.norm ? 2 : 1;
  const bool rope = op.epilogue == ops::FusedMatMul::Epilogue::kRopeKvWrite;
  auto node_state = std::make_unique<FusedMatmulState>();
  kernels::FusedMatmulArgs& a = node_state->launch;
  a.m = x.shape[0];
  a.k = x.shape[1];
  a.eps = op.eps;
  a.weights = op.weights;
  a.epilogue = KernelEpilogue(op.epilogue);
  a.dtype = x.dtype;
  int64_t n_total = 0;
  a.weights_constant = true;  // while every weight so far is a graph Weight
  for (int g = 0; g < op.weights; ++g) {
    const Tensor& w = c.input(first_w + g);
    a.weights_constant = a.weights_constant && w.kind == TensorKind::kWeight;
    a.n[g] = w.shape[0];
    a.w_dtype[g] = w.dtype;
    n_total += w.shape[0];
  }
  if (rope) {
    // The frequency table, made once and shared with the Rope and RopeKvWrite nodes of
    // the same parameters; pointers to pos and the caches are bound at Run.
    SG_ASSIGN_OR_RETURN(a.rope.inv_freq, c.rope.Table(op.rope));
    const Tensor& k_cache = c.input(first_w + op.weights + 1);
    a.rope.kv_heads = k_cache.shape[1];
    a.rope.seq = k_cache.shape[2];
    a.rope.head_dim = op.rope.head_dim;
    a.rope.interleaved = op.rope.interleaved;
  }
  if (TakesRowKernel(op, a, c.options)) {
    node_state->row_kernel = true;
    node_state->row_x = RowXFor(c.options, a.w_dtype[0]);
    return Keep(std::move(node_state));
  }
  // Block formats of enough rows: tensor cores, their products in the shared block
  // workspace (MatmulRunner::ReserveBlockGemm sized it), no split-K of the fused kernel.
  const bool mma = TakesBlockMma(op, a.m, IsQuantized(a.w_dtype[0]), c.options, c.info);
  if (mma) {
    a.mma_terms = BlockMmaTermsFor(x.dtype, a.m, c.options);
    a.mma_shape = BlockMmaShapeFor(c.options);
    SG_ASSIGN_OR_RETURN(const kernels::BlockMmaWorkspace ws,
                        MmaWorkspace(a, a.mma_terms, c.info.sm_count));
    SG_ASSIGN_OR_RETURN(void* workspace, c.matmul.BlockWorkspace(ws.bytes, c.node.name));
    a.product_splits = ws.splits;
    // The staged shape where the workspace chose it; otherwise each launch over one format
    // (a Q4_K_M file's q/k, then its v) resolves its own.
    if (ws.shape == kernels::BlockMmaShape::kStaged) a.mma_shape = ws.shape;
    a.products = static_cast<float*>(workspace);
    a.mma_scratch = static_cast<char*>(workspace) + ws.partial_bytes;
  }
  a.splits = mma ? 1 : kernels::FusedSplitsFor(a, c.info.sm_count);
  a.walk = UnitWalkFor(c.options.block_unit_walk, a, c.info.sm_count);
  a.min_blocks = c.options.fused_float_min_blocks;
  const int64_t blocks = kernels::FusedColumnBlocks(a);
  const int64_t rows =
      std::min<int64_t>(a.m, mma ? kernels::kFusedMaxMmaRows : kernels::kFusedMaxRows);
  const int64_t partial_bytes = a.splits > 1 ? AlignUp(a.splits * rows * n_total * 4) : 0;
  const int64_t counter_bytes = a.splits > 1 ? AlignUp(blocks * 4) : 0;
  const bool argmax = op.epilogue == ops::FusedMatMul::Epilogue::kArgmax;
  const int64_t best_bytes = argmax ? AlignUp(rows * blocks * 4) : 0;
  const int64_t total = partial_bytes + counter_bytes + 2 * best_bytes + (argmax ? 256 : 0);
  if (total > 0) {
    SG_ASSIGN_OR_RETURN(node_state->workspace, AllocateDevice(total, "a fused matmul's workspace"));
    auto* base = static_cast<char*>(node_state->workspace.get());
    SG_RETURN_IF_ERROR(ToStatus(cudaMemset(base, 0, total), "cudaMemset(fused matmul workspace)"));
    SG_RETURN_IF_ERROR(ToStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize after cudaMemset"));
    int64_t at = 0;
    if (a.splits > 1) {
      a.partials = reinterpret_cast<float*>(base + at);
      at += partial_bytes;
      a.counters = reinterpret_cast<uint32_t*>(base + at);
      at += counter_bytes;
    }
    if (argmax) {
      a.argmax_value = reinterpret_cast<float*>(base + at);
      at += best_bytes;
      a.argmax_index = reinterpret_cast<int32_t*>(base + at);
      at += best_bytes;
      a.argmax_counter = reinterpret_cast<uint32_t*>(base + at);
    }
  }
  return Keep(std::move(node_state));
}

// Every head_dim its shape inference accepts.
bool Supports(const ops::RopeKvWrite&, const CudaSupportQuery&) { return true; }

PreparedOr Prepare(const ops::RopeKvWrite& op, const CudaPrepareContext& c) {
  auto state = std::make_unique<RopeKvWriteState>();
  SG_ASSIGN_OR_RETURN(state->inv_freq, c.rope.Table(op.rope));
  return Keep(std::move(state));
}

}  // namespace internal

absl::Status CudaDispatch::Run(const ops::FusedMatMul& op, const NodeArgs& args) {
  SG_ASSIGN_OR_RETURN(const internal::FusedMatmulState* s,
                      args.PreparedAs<internal::FusedMatmulState>());
  kernels::FusedMatmulArgs a = s->launch;
  const int first_w = op.norm ? 2 : 1;
  a.x = args.inputs[0].data;
  a.norm_w = op.norm ? args.inputs[1].data : nullptr;
  for (int g = 0; g < op.weights; ++g) a.w[g] = args.inputs[first_w + g].data;
  if (op.epilogue == ops::FusedMatMul::Epilogue::kAdd) {
    a.residual = args.inputs[first_w + op.weights].data;
  }
  if (op.epilogue == ops::FusedMatMul::Epilogue::kRopeKvWrite) {
    const int p = first_w + op.weights;
    a.rope.pos = args.inputs[p].as<const int32_t>();
    a.rope.k_cache = args.inputs[p + 1].data;
    a.rope.v_cache = args.inputs[p + 2].data;
    a.rope.error_flags = error_flags_;
  }
  a.y = args.output.data;
  if (s->row_kernel && op.epilogue == ops::FusedMatMul::Epilogue::kSiluMul) {
    return ToStatus(kernels::LaunchQuantRowSiluMul(a.x, a.w[0], a.w[1], a.w_dtype[0], a.y,
                                                   a.n[0], a.k, a.dtype, a.weights_constant,
                                                   info_.sm_count, s->row_x, launch()),
                    "LaunchQuantRowSiluMul");
  }
  if (s->row_kernel) {
    return ToStatus(kernels::LaunchQuantRowMatmul(a.x, a.w[0], a.w_dtype[0], a.residual, a.y,
                                                  a.n[0], a.k, a.dtype, a.weights_constant,
                                                  info_.sm_count, s->row_x, launch()),
                    "LaunchQuantRowMatmul");
  }
  return ToStatus(kernels::LaunchFusedMatmul(a, launch()), "LaunchFusedMatmul");
}

absl::Status CudaDispatch::Run(const ops::RopeKvWrite& op, const NodeArgs& args) {
  SG_ASSIGN_OR_RETURN(const internal::RopeKvWriteState* s,
                      args.PreparedAs<internal::RopeKvWriteState>());
  const TensorArg& kc = args.inputs[2];
  return ToStatus(
      kernels::LaunchRopeKvWrite(args.inputs[0].data, args.inputs[1].as<const int32_t>(),
                                 s->inv_freq, args.output.data, kc.data, args.inputs[3].data,
                                 args.output.shape[0], args.output.shape[1], kc.shape[1],
                                 kc.shape[2], op.rope.head_dim, op.rope.interleaved, kc.dtype,
                                 error_flags_, launch(),
                                 op.head_norm ? kernels::RopeHeadNorms{args.inputs[4].data,
                                                                       args.inputs[5].data, op.eps}
                                              : kernels::RopeHeadNorms{}),
      "LaunchRopeKvWrite");
}

}  // namespace sg
