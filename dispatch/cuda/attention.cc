// The Attention unit of CudaDispatch: one launch per node, of kernels/attention.cu (decode,
// and prefill steps the prefill kernel does not take) or kernels/attention_prefill.cu
// (prefill). The KV-chunk count is a function of the shapes and the device (never of
// positions), and the workspace the chunks merge in is made in Prepare, where the kernel
// is chosen too, so Run only launches and can be captured.
#include "dispatch/cuda/attention.h"

#include <algorithm>
#include <climits>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_status.h"
#include "dispatch/cuda/op_units.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace internal {

absl::StatusOr<kernels::AttentionShape> AttentionShapeOf(const Shape& q, const Shape& cache,
                                                         absl::string_view node) {
  const auto error = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("Attention node '", node, "' with q ", q.ToString(), " and cache ",
                     cache.ToString(), ": ", why));
  };
  if (q.rank() != 2 || cache.rank() != 4) return error("q must be [M, h*d], caches [slots, kvh, S, d]");
  for (const int64_t dim : {q[0], q[1], cache[1], cache[2], cache[3]}) {
    if (dim > INT_MAX) return error("a dimension does not fit in 32 bits");
  }
  kernels::AttentionShape s;
  s.rows = static_cast<int>(q[0]);
  s.kv_heads = static_cast<int>(cache[1]);
  s.seq_len = static_cast<int>(cache[2]);
  s.head_dim = static_cast<int>(cache[3]);
  s.heads = static_cast<int>(q[1] / cache[3]);
  if (const char* why = kernels::AttentionShapeError(s); why[0] != '\0') return error(why);
  return s;
}

absl::StatusOr<std::unique_ptr<AttentionWorkspace>> AttentionWorkspace::Create(
    const CudaDeviceInfo& info) {
  SG_RETURN_IF_ERROR(
      ToStatus(kernels::PreparePrefillAttention(), "PreparePrefillAttention (shared memory)"));
  return std::unique_ptr<AttentionWorkspace>(new AttentionWorkspace(info));
}

int AttentionWorkspace::Chunks(const kernels::AttentionShape& shape, DType dtype) const {
  return kernels::ChooseAttentionChunks(shape, dtype, info_.sm_count);
}

absl::Status AttentionWorkspace::Reserve(const ExecutionPlan& plan) {
  const Graph& graph = plan.graph();
  int64_t need = 0;
  for (const Node& node : graph.nodes()) {
    if (!std::holds_alternative<ops::Attention>(node.op)) continue;
    SG_ASSIGN_OR_RETURN(const kernels::AttentionShape s,
                        AttentionShapeOf(graph.tensor(node.inputs[0]).shape,
                                         graph.tensor(node.inputs[1]).shape, node.name));
    need = std::max(need, kernels::AttentionWorkspaceBytes(
                              s, Chunks(s, graph.tensor(node.inputs[0]).dtype)));
  }
  // The arrival counters must start at zero; launches leave them zero.
  return workspace_.Reserve(need, "the attention workspace");
}

namespace {
struct AttentionState final : PreparedState<AttentionState> {
  kernels::AttentionShape shape;
  int chunks = 0;
  void* workspace = nullptr;
  // Prefill steps (seq_slots): rows per sequence, the cache's slots, and whether the
  // prefill kernel runs (else the row-by-row kernel serves them).
  int rows_per_seq = 1;
  int slots = 0;
  bool prefill_kernel = false;
};
}  // namespace

// The shapes the kernels take (AttentionShapeError), with the slots of a prefill step's
// cache within 32 bits.
bool Supports(const ops::Attention& op, const CudaSupportQuery& q) {
  if (!AttentionShapeOf(q.input(0).shape, q.input(1).shape, "").ok()) return false;
  return !op.has_slots || q.input(1).shape[0] <= INT_MAX;
}

PreparedOr Prepare(const ops::Attention& op, const CudaPrepareContext& c) {
  const Tensor& q = c.input(0);
  const Shape& cache = c.input(1).shape;
  const absl::string_view name = c.node.name;
  auto state = std::make_unique<AttentionState>();
  SG_ASSIGN_OR_RETURN(state->shape, AttentionShapeOf(q.shape, cache, name));
  if (op.has_slots) {
    const Shape& seq_slots = c.input(4).shape;
    if (seq_slots.rank() == 1 && seq_slots[0] > 0) {
      state->rows_per_seq = static_cast<int>(q.shape[0] / seq_slots[0]);
      if (cache[0] > INT_MAX) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Attention node '", name, "': ", cache[0], " KV slots do not fit in 32 bits"));
      }
      state->slots = static_cast<int>(cache[0]);
      // The tiled prefill kernel has no sliding window or soft-capping: such nodes
      // run on the row-by-row kernel, which has both.
      state->prefill_kernel =
          op.window == 0 && op.softcap == 0.0f &&
          kernels::PrefillAttentionSupported(state->shape, q.dtype, state->rows_per_seq);
    }
  }
  state->chunks = c.attention.Chunks(state->shape, q.dtype);
  const int64_t need = kernels::AttentionWorkspaceBytes(state->shape, state->chunks);
  SG_ASSIGN_OR_RETURN(state->workspace, c.attention.For(need, name));
  return Keep(std::move(state));
}

}  // namespace internal

absl::Status CudaDispatch::Run(const ops::Attention& op, const NodeArgs& args) {
  SG_ASSIGN_OR_RETURN(const internal::AttentionState* node,
                      args.PreparedAs<internal::AttentionState>());
  const TensorArg& q = args.inputs[0];
  const TensorArg& k_cache = args.inputs[1];
  kernels::AttentionArgs a;
  a.q = q.data;
  a.k_cache = k_cache.data;
  a.v_cache = args.inputs[2].data;
  a.pos = args.inputs[3].as<const int32_t>();
  a.out = args.output.data;
  a.scale = op.scale;
  a.window = op.window;
  a.softcap = op.softcap;
  a.workspace = node->workspace;
  a.error_flags = error_flags_;
  a.clusters = options_.attention_clusters ? kernels::AttentionClusters::kAuto
                                             : kernels::AttentionClusters::kNever;
  if (op.has_slots) {
    a.seq_slots = args.inputs[4].as<const int32_t>();
    a.rows_per_seq = node->rows_per_seq;
    a.slots = node->slots;
    if (node->prefill_kernel) {
      a.prefill_f32_f16 = options_.prefill_attention == PrefillAttentionPrecision::kF16;
      return ToStatus(kernels::LaunchPrefillAttention(a, node->shape, q.dtype, launch()),
                      "LaunchPrefillAttention");
    }
  }
  return ToStatus(kernels::LaunchAttention(a, node->shape, node->chunks, q.dtype, launch()),
                  "LaunchAttention");
}

}  // namespace sg
