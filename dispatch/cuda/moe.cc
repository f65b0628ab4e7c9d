// The mixture-of-experts unit of CudaDispatch: MoeTopK (kernels/topk.cuh, whose order and
// ties are the op's), MoeRouteWeights, MoeMatMul and MoeCombine (kernels/moe.cuh; with
// `matmul` the one-row kernel's LaunchQuantRowMoeCombine), one
// launch per node and no state. The kernels read the expert ids from device memory, so the
// launches depend on the shapes only and a captured step replays any routing. Prepare
// refuses by name what the kernels do not take (Supports says no to the same), so nothing
// runs to a silent wrong answer.
#include <climits>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_status.h"
#include "dispatch/cuda/matmul.h"
#include "dispatch/cuda/op_units.h"
#include "kernels/block_mma.cuh"
#include "kernels/moe.cuh"
#include "kernels/quant_matmul.cuh"
#include "kernels/topk.cuh"
#include "stepgraph/base/status.h"

namespace sg {
namespace internal {
namespace {

// How a MoeMatMul node runs: with block-format experts and fewer (row, expert) pairs per
// expert than CudaOptions::moe_by_expert_pairs (a decode step), on the one-row kernel
// (kernels/quant_matmul.cuh's LaunchQuantRowMoe; x as block_gemv_precision says, as the
// dense one-row matmuls), where it takes the sizes; with at least that many and
// CudaOptions::moe_block_mma, on the tensor cores (kernels/block_mma.cuh's
// LaunchMoeBlockMma: x in `terms` parts, its listing and split in `workspace`);
// otherwise LaunchMoeMatMul.
struct MoeMatMulState final : PreparedState<MoeMatMulState> {
  bool row_kernel = false;
  kernels::QuantRowX row_x = kernels::QuantRowX::kF32;
  bool block_mma = false;
  int terms = 3;
  void* workspace = nullptr;
};

// Whether a MoeMatMul of x, block-format experts w and ids runs on the tensor cores under
// `options` on a device of compute capability `cc`, and then x's parts.
bool TakesMoeBlockMma(const Tensor& x, const Tensor& w, const Tensor& ids,
                      const CudaOptions& options, int cc) {
  const int64_t rows = x.shape[0], experts = w.shape[0], top_k = ids.shape[1];
  // MoeBlockMmaTakes bounds rows · top_k before it is formed.
  return options.moe_block_mma && IsQuantized(w.dtype) && kernels::BlockMmaRuns(cc) &&
         kernels::MoeBlockMmaTakes(rows, experts, w.shape[1], w.shape[2], top_k, x.dtype,
                                   w.dtype) &&
         kernels::MoeMatMulWalksByExpert(rows * top_k, experts, w.shape[2],
                                         options.moe_by_expert_pairs);
}
int MoeTermsFor(const Tensor& x, const Tensor& ids, const CudaOptions& options) {
  return BlockMmaTermsFor(x.dtype, x.shape[0] * ids.shape[1], options);
}

// The limits of each kernel over inputs shape inference accepted (op_units.h: logits
// [M, E], ids [M, k], w [E, N, K], y [M, k·N]); an empty message when they are met.
std::string TopKLimits(const ops::MoeTopK& op, const Shape& logits) {
  if (logits[0] > INT_MAX || logits[1] > INT_MAX || op.top_k > kernels::kTopkMaxK) {
    return absl::StrCat("the CUDA top-k takes up to 2^31-1 rows and experts and top_k up to ",
                        kernels::kTopkMaxK, "; got logits ", logits.ToString(), " and top_k ",
                        op.top_k);
  }
  return "";
}

std::string RouteLimits(const Shape& logits, const Shape& ids) {
  if (logits[0] > INT_MAX || logits[1] > INT_MAX || ids[1] > INT_MAX) {
    return absl::StrCat("the CUDA route weights take up to 2^31-1 rows, experts and chosen "
                        "experts; got logits ", logits.ToString(), " and ids ", ids.ToString());
  }
  return "";
}

std::string MatMulLimits(const Tensor& x, const Tensor& w, const Tensor& ids) {
  if (kernels::MoeMatMulTakes(x.shape[0], w.shape[0], w.shape[1], w.shape[2], ids.shape[1],
                              x.dtype, w.dtype)) {
    return "";
  }
  return absl::StrCat(
      "no CUDA MoeMatMul for x ", x.shape.ToString(), " ", DTypeName(x.dtype), " with w ",
      w.shape.ToString(), " ", DTypeName(w.dtype), " and ids ", ids.shape.ToString(),
      " (it takes w of x's dtype or a block format with K a multiple of its block, N up to ",
      65535 * kernels::kMoeMatMulCols, " and rows * top_k up to 2^31-1)");
}

// ids [M, top_k] (the weights' shape without `route`; with it the logits are [M, E], E
// within 32 bits as every shape is).
std::string CombineLimits(const Shape& y, const Shape& ids) {
  const int64_t top_k = ids[1], n = y[1] / top_k;
  if (y[0] > INT_MAX || top_k > kernels::kMoeCombineMaxTopK || (n + 255) / 256 > 65535) {
    return absl::StrCat("the CUDA MoeCombine takes up to 2^31-1 rows, top_k up to ",
                        kernels::kMoeCombineMaxTopK, " and N up to ", 65535 * 256, "; got y ",
                        y.ToString(), " and ids ", ids.ToString());
  }
  return "";
}

// MoeCombine with `matmul`: x [M, k·K], w [E, N, K], ids [M, k]: the one-row kernel's
// family (kernels/quant_matmul.cuh's LaunchQuantRowMoeCombine).
std::string DownCombineLimits(const Tensor& x, const Tensor& w, const Tensor& ids) {
  if (kernels::QuantRowMoeCombineTakes(x.shape[0], w.shape[0], w.shape[1], w.shape[2],
                                       ids.shape[1], x.dtype, w.dtype)) {
    return "";
  }
  return absl::StrCat(
      "no CUDA MoeCombine with matmul for x ", x.shape.ToString(), " ", DTypeName(x.dtype),
      " with w ", w.shape.ToString(), " ", DTypeName(w.dtype), " and ids ",
      ids.shape.ToString(), " (it takes experts in a block format or in x's dtype, K up to ",
      kernels::kQuantRowMaxK, ", top_k up to ", kernels::kQuantRowMoeCombineMaxTopK,
      ", top_k * K up to ", kernels::kQuantRowMoeCombineMaxXs, " and up to 65535 rows)");
}

// The limits of a MoeCombine node of these inputs, whichever its params.
std::string CombineNodeLimits(const ops::MoeCombine& op, const std::vector<const Tensor*>& in) {
  const Tensor& ids = *in[2];
  if (op.route) {
    if (std::string limits = RouteLimits(in[1]->shape, ids.shape); !limits.empty()) return limits;
  }
  if (op.matmul) return DownCombineLimits(*in[0], *in[op.residual ? 4 : 3], ids);
  return CombineLimits(in[0]->shape, ids.shape);
}

// MoeCombine with `matmul`: how x meets the experts (as the one-row MoeMatMul's).
struct MoeCombineState final : PreparedState<MoeCombineState> {
  kernels::QuantRowX row_x = kernels::QuantRowX::kF32;
};

PreparedOr RefuseUnless(const std::string& limits) {
  if (limits.empty()) return NoState();
  return absl::UnimplementedError(limits);
}

}  // namespace

bool Supports(const ops::MoeTopK& op, const CudaSupportQuery& q) {
  return TopKLimits(op, q.input(0).shape).empty();
}
bool Supports(const ops::MoeRouteWeights&, const CudaSupportQuery& q) {
  return RouteLimits(q.input(0).shape, q.input(1).shape).empty();
}
bool Supports(const ops::MoeMatMul& op, const CudaSupportQuery& q) {
  return MatMulLimits(q.input(0), q.input(1), q.input(op.silu_mul ? 3 : 2)).empty();
}
bool Supports(const ops::MoeCombine& op, const CudaSupportQuery& q) {
  return CombineNodeLimits(op, {q.inputs.begin(), q.inputs.end()}).empty();
}

PreparedOr Prepare(const ops::MoeTopK& op, const CudaPrepareContext& c) {
  return RefuseUnless(TopKLimits(op, c.input(0).shape));
}
PreparedOr Prepare(const ops::MoeRouteWeights&, const CudaPrepareContext& c) {
  return RefuseUnless(RouteLimits(c.input(0).shape, c.input(1).shape));
}
PreparedOr Prepare(const ops::MoeMatMul& op, const CudaPrepareContext& c) {
  if (c.options.moe_by_expert_pairs < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaOptions::moe_by_expert_pairs must be >= 0, got ", c.options.moe_by_expert_pairs));
  }
  const Tensor& x = c.input(0);
  const Tensor& w = c.input(1);
  const Tensor& ids = c.input(op.silu_mul ? 3 : 2);
  if (std::string limits = MatMulLimits(x, w, ids); !limits.empty()) {
    return absl::UnimplementedError(limits);
  }
  auto state = std::make_unique<MoeMatMulState>();
  const int64_t rows = x.shape[0], experts = w.shape[0], top_k = ids.shape[1];
  // MatMulLimits bounded rows · top_k to 32 bits.
  state->row_kernel = IsQuantized(w.dtype) &&
                      !kernels::MoeMatMulWalksByExpert(rows * top_k, experts, w.shape[2],
                                                       c.options.moe_by_expert_pairs) &&
                      kernels::QuantRowMoeTakes(rows, experts, w.shape[1], w.shape[2], top_k,
                                                w.dtype);
  state->row_x = RowXFor(c.options, w.dtype);
  // The tensor-core path where the block workspace's Reserve sized it for this node.
  SG_ASSIGN_OR_RETURN(const int64_t need,
                      MoeMmaWorkspaceBytes(c.graph, c.node, c.options, c.info));
  if (need > 0) {
    state->block_mma = true;
    state->row_kernel = false;
    state->terms = MoeTermsFor(x, ids, c.options);
    SG_ASSIGN_OR_RETURN(state->workspace, c.matmul.BlockWorkspace(need, c.node.name));
  }
  return Keep(std::move(state));
}
PreparedOr Prepare(const ops::MoeCombine& op, const CudaPrepareContext& c) {
  std::vector<const Tensor*> in;
  for (int i = 0; i < static_cast<int>(c.node.inputs.size()); ++i) in.push_back(&c.input(i));
  if (std::string limits = CombineNodeLimits(op, in); !limits.empty()) {
    return absl::UnimplementedError(limits);
  }
  if (!op.matmul) return NoState();
  auto state = std::make_unique<MoeCombineState>();
  state->row_x = RowXFor(c.options, in.back()->dtype);
  return Keep(std::move(state));
}

absl::StatusOr<int64_t> MoeMmaWorkspaceBytes(const Graph& graph, const Node& node,
                                             const CudaOptions& options,
                                             const CudaDeviceInfo& info) {
  const auto* op = std::get_if<ops::MoeMatMul>(&node.op);
  if (op == nullptr || node.inputs.size() < (op->silu_mul ? 4u : 3u)) return 0;
  const Tensor& x = graph.tensor(node.inputs[0]);
  const Tensor& w = graph.tensor(node.inputs[1]);
  const Tensor& ids = graph.tensor(node.inputs[op->silu_mul ? 3 : 2]);
  if (x.shape.rank() != 2 || w.shape.rank() != 3 || ids.shape.rank() != 2 ||
      !TakesMoeBlockMma(x, w, ids, options, info.compute_capability)) {
    return 0;
  }
  const int64_t bytes = kernels::MoeBlockMmaWorkspaceBytes(
      x.shape[0], w.shape[0], w.shape[2], ids.shape[1], MoeTermsFor(x, ids, options));
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeMatMul node '", node.name, "': its tensor-core workspace overflows"));
  }
  return bytes;
}

}  // namespace internal

// Shapes were checked in Prepare.
absl::Status CudaDispatch::Run(const ops::MoeTopK& op, const NodeArgs& args) {
  const TensorArg& logits = args.inputs[0];
  return ToStatus(kernels::LaunchTopk(logits.data, nullptr, args.output.as<int32_t>(),
                                      logits.shape[0], logits.shape[1], op.top_k, logits.dtype,
                                      launch()),
                  "LaunchTopk");
}

absl::Status CudaDispatch::Run(const ops::MoeRouteWeights& op, const NodeArgs& args) {
  const TensorArg& logits = args.inputs[0];
  const TensorArg& ids = args.inputs[1];
  return ToStatus(kernels::LaunchMoeRouteWeights(
                      logits.data, logits.dtype, ids.as<const int32_t>(),
                      args.output.as<float>(), logits.shape[0], logits.shape[1], ids.shape[1],
                      op.renormalize, op.round_to_dtype, error_flags_, launch()),
                  "LaunchMoeRouteWeights");
}

absl::Status CudaDispatch::Run(const ops::MoeMatMul& op, const NodeArgs& args) {
  SG_ASSIGN_OR_RETURN(const internal::MoeMatMulState* s,
                      args.PreparedAs<internal::MoeMatMulState>());
  const TensorArg& x = args.inputs[0];
  const TensorArg& w = args.inputs[1];
  const TensorArg& ids = args.inputs[op.silu_mul ? 3 : 2];
  const int64_t k = w.shape[2];
  if (s->block_mma) {
    kernels::MoeBlockMmaArgs a;
    a.x = x.data;
    a.dtype = x.dtype;
    a.w = w.data;
    a.w_up = op.silu_mul ? args.inputs[2].data : nullptr;
    a.w_dtype = w.dtype;
    a.ids = ids.as<const int32_t>();
    a.rows = x.shape[0];
    a.experts = w.shape[0];
    a.n = w.shape[1];
    a.k = k;
    a.top_k = ids.shape[1];
    a.per_slot = x.shape[1] != k;
    a.y = args.output.data;
    a.terms = s->terms;
    a.workspace = s->workspace;
    a.error_flags = error_flags_;
    return ToStatus(kernels::LaunchMoeBlockMma(a, launch()), "LaunchMoeBlockMma");
  }
  if (s->row_kernel) {
    return ToStatus(kernels::LaunchQuantRowMoe(
                        x.data, w.data, op.silu_mul ? args.inputs[2].data : nullptr, w.dtype,
                        ids.as<const int32_t>(), args.output.data, x.shape[0], w.shape[0],
                        w.shape[1], k, ids.shape[1], x.shape[1] != k, x.dtype, error_flags_,
                        info_.sm_count, s->row_x, launch()),
                    "LaunchQuantRowMoe");
  }
  return ToStatus(kernels::LaunchMoeMatMul(x.data, w.data, w.dtype, ids.as<const int32_t>(),
                                           args.output.data, x.shape[0], w.shape[0],
                                           w.shape[1], k, ids.shape[1], x.shape[1] != k,
                                           x.dtype, error_flags_, launch(),
                                           op.silu_mul ? args.inputs[2].data : nullptr,
                                           options_.moe_by_expert_pairs),
                  "LaunchMoeMatMul");
}

absl::Status CudaDispatch::Run(const ops::MoeCombine& op, const NodeArgs& args) {
  const TensorArg& y = args.inputs[0];  // with `matmul`: x
  const TensorArg& weights = args.inputs[1];  // with `route`: the logits
  const int64_t top_k = args.inputs[2].shape[1];
  const kernels::MoeCombineRoute route{weights.shape[1], op.renormalize, op.round_to_dtype,
                                       error_flags_};
  if (op.matmul) {
    SG_ASSIGN_OR_RETURN(const internal::MoeCombineState* s,
                        args.PreparedAs<internal::MoeCombineState>());
    const TensorArg& w = args.inputs[op.residual ? 4 : 3];
    kernels::QuantRowMoeCombine a;
    a.x = y.data;
    a.w = w.data;
    a.w_dtype = w.dtype;
    a.ids = args.inputs[2].as<const int32_t>();
    a.weights = weights.data;
    a.weights_dtype = weights.dtype;
    if (op.route) {
      a.route_experts = weights.shape[1];
      a.renormalize = op.renormalize;
      a.round_to_dtype = op.round_to_dtype;
    }
    a.residual = op.residual ? args.inputs[3].data : nullptr;
    a.out = args.output.data;
    a.rows = y.shape[0];
    a.experts = w.shape[0];
    a.n = w.shape[1];
    a.k = w.shape[2];
    a.top_k = top_k;
    a.dtype = y.dtype;
    a.error_flags = error_flags_;
    return ToStatus(kernels::LaunchQuantRowMoeCombine(a, info_.sm_count, s->row_x, launch()),
                    "LaunchQuantRowMoeCombine");
  }
  return ToStatus(kernels::LaunchMoeCombine(y.data, y.dtype, weights.data, weights.dtype,
                                            args.inputs[2].as<const int32_t>(),
                                            args.output.data, y.shape[0], y.shape[1] / top_k,
                                            top_k, launch(),
                                            op.residual ? args.inputs[3].data : nullptr,
                                            op.route ? &route : nullptr),
                  "LaunchMoeCombine");
}

}  // namespace sg
