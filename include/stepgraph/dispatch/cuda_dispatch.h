// CudaDispatch: every op as one launch on one CUDA stream, through stepgraph's kernels and
// cuBLASLt. Everything a launch needs (cuBLASLt descriptors and algorithms, workspaces,
// RoPE tables, launch shapes, the error word) is made in Create and Prepare and kept per
// node in the PreparedPlan; Run only launches, so a plan's execution can be captured into
// a CUDA graph. Each op family is one unit in dispatch/cuda/ holding its ops' Prepare,
// Supports answer and Run (dispatch/cuda/op_units.h, docs/cuda_kernels.md).
#ifndef STEPGRAPH_DISPATCH_CUDA_DISPATCH_H_
#define STEPGRAPH_DISPATCH_CUDA_DISPATCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "stepgraph/dispatch/cuda_options.h"
#include "stepgraph/dispatch/dispatch.h"
#include "stepgraph/base/error_flags.h"

namespace sg {

class CudaModuleCache;

namespace kernels {
struct Stream;
}  // namespace kernels

namespace internal {
class MatmulRunner;
class RopeTables;
class AttentionWorkspace;
class SamplingWorkspace;
}  // namespace internal

// What the kernels' launch shapes depend on, read once from the device.
struct CudaDeviceInfo {
  int device = 0;
  int sm_count = 0;
  int64_t l2_bytes = 0;
  int compute_capability = 0;  // 90 for Hopper
};

// What a CudaDispatch with `options` runs (OpSupport), answered on the host without a
// device, so that graphs can be prepared for CUDA where there is none (a CudaDispatch
// answers the same for its own options).
class CudaSupport final : public OpSupport {
 public:
  explicit CudaSupport(CudaOptions options = {}) : options_(std::move(options)) {}
  bool Supports(const Op& op, absl::Span<const Tensor* const> inputs) const override;

 private:
  CudaOptions options_;
};

class CudaDispatch final : public KernelDispatch {
 public:
  struct Options {
    // Every launch goes to this stream (not owned); when null the dispatcher makes a
    // non-blocking stream of its own. Fixed for the dispatcher's life.
    cudaStream_t stream = nullptr;
    CudaOptions cuda;
    // The rank's NCCL communicator (an ncclComm_t, not owned; must outlive the
    // dispatcher) and the size of its group, which the collective ops meet. Null with
    // ranks 1: a group of one, where collectives are copies. More than one rank needs a
    // build with NCCL (FailedPrecondition otherwise).
    void* nccl_comm = nullptr;
    int ranks = 1;
    // The group's one-shot all-reduce buffers as this rank reaches them (a
    // kernels::OneShotPeers, not owned; kernels/collectives.cuh), or null: every
    // AllReduce through NCCL. Used for messages up to CudaOptions::one_shot_all_reduce_bytes.
    const void* one_shot_peers = nullptr;
  };

  // FailedPrecondition when no device is usable.
  static absl::StatusOr<std::unique_ptr<CudaDispatch>> Create(const Options& options);
  static absl::StatusOr<std::unique_ptr<CudaDispatch>> Create() { return Create(Options{}); }
  ~CudaDispatch() override;
  CudaDispatch(const CudaDispatch&) = delete;
  CudaDispatch& operator=(const CudaDispatch&) = delete;

  // Each node's launch: matmul path and cuBLASLt plan (shared per shape), RoPE table,
  // attention split and workspace, argmax split and workspace, kernels compiled for the
  // plan (FusedElementwise; RmsNorm with CudaOptions::compiled_norm). May be called for several
  // plans (batch buckets): workspaces grow to the largest need, and buffers outgrown stay
  // alive for plans prepared earlier. Must not be called while a captured graph that uses
  // this dispatcher may be replayed concurrently.
  absl::StatusOr<PreparedPlan> Prepare(const ExecutionPlan& plan) override;

  // Every Run only enqueues work on the stream.
  bool CaptureSafe(const Op& op) const override { return true; }
  // Block-format weights are held in the device layout of kernels/quant_blocks.cuh.
  bool RepacksWeight(const Tensor& weight) const override;
  absl::Status RepackWeight(const Tensor& weight, absl::Span<const std::byte> file_bytes,
                            absl::Span<std::byte> out) const override;

  // Its kernels' limits for these options, without a device (CudaSupport): a FusedMatMul's
  // weights all of x's dtype or all in block formats (kernels/fused_matmul.cuh's
  // FusedBlockFormatsFit), at most kFusedMaxWeights weights, the rope_kv_write epilogue
  // for head_dim a multiple of kFusedCols; a compiled RmsNorm up to its hidden size; the
  // shapes the attention and sampling kernels take.
  bool Supports(const Op& op, absl::Span<const Tensor* const> inputs) const override;

#define SG_CUDA_RUN(Name) absl::Status Run(const ops::Name& op, const NodeArgs& args) override;
  SG_OP_LIST(SG_CUDA_RUN)
#undef SG_CUDA_RUN

  cudaStream_t stream() const { return stream_; }
  const CudaDeviceInfo& device_info() const { return info_; }
  const CudaOptions& options() const { return options_; }

  // The device word kernels raise ErrorFlag bits in. Stays valid for the dispatcher's life.
  uint32_t* device_error_flags() const { return error_flags_; }
  // Waits for the stream, returns the ErrorFlag bits raised since the last call and
  // clears them. Not for the per-step path of a closed loop: read the word asynchronously.
  absl::StatusOr<uint32_t> TakeErrorFlags();

 private:
  CudaDispatch(cudaStream_t stream, bool owns_stream, CudaDeviceInfo info,
               const CudaOptions& options);

  // InvalidArgument naming the node when a collective is for another group size.
  absl::Status CheckRanks(int32_t ranks, absl::string_view op, const NodeArgs& args) const;

  // The stream and the launch mode of every kernel a Run launches: programmatic as this
  // dispatcher's options say, whatever other dispatchers of the process say
  // (dispatch/cuda/op_units.h).
  kernels::Stream launch() const;

  cudaStream_t stream_;
  bool owns_stream_;
  CudaDeviceInfo info_;
  CudaOptions options_;
  void* nccl_comm_ = nullptr;  // ncclComm_t, not owned
  const void* one_shot_peers_ = nullptr;  // kernels::OneShotPeers, not owned
  int ranks_ = 1;
  uint32_t* error_flags_ = nullptr;  // owned: cudaMalloc'd in Create, freed in the destructor
  std::unique_ptr<internal::MatmulRunner> matmul_;
  std::unique_ptr<internal::RopeTables> rope_;
  std::unique_ptr<internal::AttentionWorkspace> attention_;
  std::unique_ptr<internal::SamplingWorkspace> sampling_;
  std::unique_ptr<CudaModuleCache> modules_;  // kernels compiled for the plan (NVRTC)
};

}  // namespace sg

#endif  // STEPGRAPH_DISPATCH_CUDA_DISPATCH_H_
