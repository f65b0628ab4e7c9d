// The rotary unit of CudaDispatch: Rope (its state points at the frequency table of its
// parameters, uploaded at Prepare) and KvWrite (no state); and the RoPE frequency tables
// (rope.h).
#include "dispatch/cuda/rope.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_status.h"
#include "dispatch/cuda/op_units.h"
#include "kernels/rope.cuh"
#include "stepgraph/base/status.h"
#include "stepgraph/graph/rope.h"

namespace sg {
namespace internal {

absl::StatusOr<std::unique_ptr<RopeTables>> RopeTables::Create(const CudaDeviceInfo&) {
  return std::make_unique<RopeTables>();
}

RopeTables::Key RopeTables::KeyOf(const ops::Rope& op) {
  auto bits = [](float f) {
    uint32_t b;
    std::memcpy(&b, &f, sizeof(b));
    return b;
  };
  const ops::RopeScaling& s = op.scaling;
  const bool llama3 = s.type == ops::RopeScaling::Type::kLlama3;
  // Without scaling the scaling fields do not change the table: keep them out of the key.
  return Key{op.head_dim,
             bits(op.theta),
             static_cast<uint8_t>(s.type),
             llama3 ? bits(s.factor) : 0u,
             llama3 ? bits(s.low_freq_factor) : 0u,
             llama3 ? bits(s.high_freq_factor) : 0u,
             llama3 ? s.original_max_position : 0};
}

absl::StatusOr<const float*> RopeTables::Table(const ops::Rope& op) {
  const Key key = KeyOf(op);
  if (auto it = tables_.find(key); it != tables_.end()) {
    return static_cast<const float*>(it->second.get());
  }
  if (op.head_dim <= 0 || op.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RoPE head_dim must be even and positive, got ", op.head_dim));
  }
  const std::vector<float> inv_freq = RopeInvFreq(op);
  const int64_t bytes = static_cast<int64_t>(inv_freq.size() * sizeof(float));
  SG_ASSIGN_OR_RETURN(DeviceMemory table, AllocateDevice(bytes, "a RoPE frequency table"));
  SG_RETURN_IF_ERROR(ToStatus(
      cudaMemcpy(table.get(), inv_freq.data(), bytes, cudaMemcpyHostToDevice),
      "cudaMemcpy(RoPE frequency table)"));
  // From pageable memory cudaMemcpy may return before the DMA lands; the dispatcher's
  // stream does not wait on the legacy stream, so wait here, once, at setup.
  SG_RETURN_IF_ERROR(ToStatus(cudaStreamSynchronize(cudaStreamLegacy),
                              "cudaStreamSynchronize(RoPE frequency table)"));
  return static_cast<const float*>(tables_.emplace(key, std::move(table)).first->second.get());
}

// ---- The Rope and KvWrite unit ----------------------------------------------------------

namespace {
struct RopeState final : PreparedState<RopeState> {
  const float* inv_freq = nullptr;  // owned by the dispatcher's RopeTables
};
}  // namespace

PreparedOr Prepare(const ops::Rope& op, const CudaPrepareContext& c) {
  auto state = std::make_unique<RopeState>();
  SG_ASSIGN_OR_RETURN(state->inv_freq, c.rope.Table(op));
  return Keep(std::move(state));
}

PreparedOr Prepare(const ops::KvWrite&, const CudaPrepareContext&) { return NoState(); }

// Every head_dim and shape their shape inference accepts.
bool Supports(const ops::Rope&, const CudaSupportQuery&) { return true; }
bool Supports(const ops::KvWrite&, const CudaSupportQuery&) { return true; }

}  // namespace internal

absl::Status CudaDispatch::Run(const ops::Rope& op, const NodeArgs& args) {
  SG_ASSIGN_OR_RETURN(const internal::RopeState* s, args.PreparedAs<internal::RopeState>());
  const TensorArg& x = args.inputs[0];
  return ToStatus(kernels::LaunchRope(x.data, args.inputs[1].as<const int32_t>(), s->inv_freq,
                                      args.output.data, x.shape[0], x.shape[1], op.head_dim,
                                      op.interleaved, x.dtype, launch()),
                  "LaunchRope");
}

absl::Status CudaDispatch::Run(const ops::KvWrite& op, const NodeArgs& args) {
  const TensorArg& kv = args.inputs[0];
  const TensorArg& cache = args.output;  // [slots, kv_heads, seq, head_dim], the last input
  kernels::KvSlots slots;
  if (op.has_slots) {
    const TensorArg& seq_slots = args.inputs[2];
    slots.seq_slots = seq_slots.as<const int32_t>();
    slots.rows_per_seq = kv.shape[0] / seq_slots.shape[0];
    slots.slots = cache.shape[0];
  }
  return ToStatus(kernels::LaunchKvWrite(kv.data, args.inputs[1].as<const int32_t>(),
                                         cache.data, kv.shape[0], cache.shape[1],
                                         cache.shape[2], cache.shape[3], cache.dtype,
                                         error_flags_, launch(), slots),
                  "LaunchKvWrite");
}

}  // namespace sg
