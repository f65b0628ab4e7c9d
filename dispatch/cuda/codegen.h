// CUDA source for kernels specialised to what a plan fixes, compiled through NVRTC
// (nvrtc_cache.h). Plain structs in, source and launch shape out: no graph types, no
// device, so a graph pass or a dispatcher's Prepare can describe the work and tests can
// compile the result without a GPU.
//
//   ElementwiseChain -> one kernel for any chain of elementwise ops over tensors of one
//                       element count (which the plan fixes), each step rounded to its
//                       dtype exactly as the unfused ops would store it;
//   RmsNormSpec      -> RmsNorm with hidden size, eps and dtype as constants.
//
// Generated kernels are a few constants and a kernel body over stepgraph's own device
// headers (kernels/device_common.cuh, kernels/rms_norm_row.cuh), which NVRTC gets embedded
// (nvrtc_headers.h): no device math is written here. They wait on griddepcontrol before
// their first read of anything an earlier kernel writes (AwaitPrerequisiteGrids, as every
// stepgraph kernel), and use 16-byte accesses when every pointer is 16-byte aligned,
// falling back to element accesses otherwise (checked inside the kernel, so any pointers
// are accepted).
#ifndef STEPGRAPH_DISPATCH_CUDA_CODEGEN_H_
#define STEPGRAPH_DISPATCH_CUDA_CODEGEN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dispatch/cuda/nvrtc_cache.h"
#include "stepgraph/base/dtype.h"

namespace sg::codegen {

// A generated kernel: compile `source` and launch `entry` on `grid` x `block` threads
// (CudaModuleCache::Load(source, entry, grid, block)).
struct GeneratedKernel {
  KernelSource source;
  std::string entry;
  uint32_t grid = 1;
  uint32_t block = 1;
};

// ---- Elementwise chains ------------------------------------------------------------------

// The ops of ops::FusedElementwise, which the elementwise_chain pass makes.
enum class EwOp : uint8_t {
  kAdd,      // a + b
  kMul,      // a · b
  kSilu,     // a · sigmoid(a)
  kSiluMul,  // silu(a) · b (SwiGLU)
};

// One step. Values are numbered: the chain's inputs first (0 .. inputs-1), then each
// step's result (inputs + i for step i). A step reads values numbered below its own.
// The result has the operands' dtype (binary ops need both alike); math is f32 and the
// result is rounded to its dtype, as a stored tensor is.
struct EwStep {
  EwOp op = EwOp::kAdd;
  int32_t a = -1;
  int32_t b = -1;  // binary ops only; -1 otherwise
};

struct ElementwiseChain {
  std::vector<DType> inputs;     // f32, bf16 or f16
  std::vector<EwStep> steps;
  std::vector<int32_t> outputs;  // values written, each in its own dtype
  int64_t elements = 0;          // of every input and output
};

// Limits of one generated chain.
inline constexpr int kMaxChainInputs = 16;
inline constexpr int kMaxChainSteps = 64;
inline constexpr int kMaxChainOutputs = 16;
inline constexpr int64_t kMaxChainElements = int64_t{1} << 40;

// The dtype of every value of `chain` (inputs, then step results); InvalidArgument naming
// the step when the chain is malformed.
absl::StatusOr<std::vector<DType>> ChainValueDTypes(const ElementwiseChain& chain);

// Kernel arguments, in order: one `const void*` per input, then one `void*` per output.
// An output may be the same buffer as an input (in place); no other overlap is allowed.
absl::StatusOr<GeneratedKernel> GenerateElementwise(const ElementwiseChain& chain);

// ---- RmsNorm -----------------------------------------------------------------------------

// y = round(x · rsqrt(mean(x²) + eps)) · w per row of [rows, hidden], f32 math, as
// ops::RmsNorm (include/stepgraph/graph/ops.h).
struct RmsNormSpec {
  int64_t rows = 0;
  int64_t hidden = 0;
  float eps = 1e-6f;
  DType dtype = DType::kF32;
  // w is a bound weight that no kernel of the step writes: it is read before the
  // griddepcontrol wait, overlapping the previous kernel's tail.
  bool weight_is_constant = true;
};

inline constexpr int64_t kMaxRmsNormHidden = 32768;

// Kernel arguments: const void* x, const void* w, void* y. One block per row.
absl::StatusOr<GeneratedKernel> GenerateRmsNorm(const RmsNormSpec& spec);

}  // namespace sg::codegen

#endif  // STEPGRAPH_DISPATCH_CUDA_CODEGEN_H_
