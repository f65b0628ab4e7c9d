// The seam between DecodeSession's slot bookkeeping (models/session.cc, backend-free) and
// where steps run: the CPU reference (session.cc) or CUDA with captured graphs
// (session_cuda.cc, compiled only with STEPGRAPH_HAS_CUDA). Internal to the session.
#ifndef STEPGRAPH_MODELS_SESSION_BACKEND_H_
#define STEPGRAPH_MODELS_SESSION_BACKEND_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/llama.h"
#include "models/random_weights.h"
#include "models/safetensors.h"
#include "stepgraph/executor.h"
#include "stepgraph/plan.h"

namespace sg::internal {

// The step inputs of every bucket live in one block of i32: ids | pos | seeds, each
// `rows` (the largest bucket) long at a 256-byte-aligned offset; a bucket binds prefixes.
struct InputBlock {
  int64_t rows = 0;
  int64_t stride = 0;  // i32 elements from one array to the next
  explicit InputBlock(int64_t r) : rows(r), stride((r + 63) / 64 * 64) {}
  int64_t ints() const { return 3 * stride; }
  int64_t ids() const { return 0; }
  int64_t pos() const { return stride; }
  int64_t seeds() const { return 2 * stride; }
};

// Binds "ids", "pos" and (when the graph samples) "seeds" of `graph` to prefixes of the
// block at `base`.
absl::Status BindInputBlock(const Graph& graph, const InputBlock& block, int32_t* base,
                            Bindings& bindings);

// `n` values of `dtype` at `data` as f32.
std::vector<float> ToFloats(const void* data, DType dtype, int64_t n);

// What a backend is made from. The graphs are the buckets' decode steps (closed loop,
// slots = the largest bucket), in bucket order.
struct BackendSetup {
  LlamaConfig config;
  std::vector<int64_t> buckets;
  std::vector<Graph> graphs;
  int64_t max_seq = 0;
  int64_t ring_steps = 0;
  bool eager = false;
  int weight_threads = 0;
  uint64_t weight_seed = 0;
  // Exactly one is set: mapped weights, or (CPU) drawn weights to bind in place; with
  // neither, the backend draws them from weight_seed itself (CUDA: straight into its
  // upload buffer).
  const ModelWeights* mapped = nullptr;
  const RandomWeights* random = nullptr;
};

// Host staging areas. Each is rewritten only after the device finished reading it: the
// prefill rows and the prompt in Prefill, after its drain; the step rows in the first
// Step after a Prefill or Release, which drained too.
enum class Staging { kPrefillRows, kStepRows, kPrompt };

class StepBackend {
 public:
  virtual ~StepBackend() = default;

  virtual std::string Describe() const = 0;
  // Whether the steps were captured (false: every replay runs eagerly).
  virtual bool captured() const = 0;
  virtual const ExecutionPlan& plan(int64_t bucket_index) const = 0;
  virtual int64_t kv_cache_bytes() const = 0;

  // Host memory the session writes before Commit: an InputBlock for the rows, max_seq
  // ids for the prompt.
  virtual int32_t* staging(Staging area) = 0;
  // Sends a staged area to the step's buffers (rows: the whole block; prompt: the first
  // `count` ids), ordered before every later step.
  virtual absl::Status Commit(Staging area, int64_t count) = 0;
  // ids[row] = prompt[t], device side.
  virtual absl::Status FeedPromptToken(int64_t row, int64_t t) = 0;
  // One step of bucket `bucket_index`: its captured graph replayed, or run through the
  // executor when `eager` (with the time of every node in `node_ms` when given).
  virtual absl::Status RunStep(int64_t bucket_index, bool eager,
                               std::vector<double>* node_ms) = 0;
  // Copies the step's next_ids (its bucket's rows) into entry `k` of the id ring.
  virtual absl::Status RecordIds(int64_t bucket_index, int64_t k) = 0;
  // Entry `k` of the id ring (largest-bucket rows wide); valid after Sync.
  virtual const int32_t* ring(int64_t k) const = 0;
  virtual absl::Status Sync() = 0;
  // ErrorFlag bits raised since the last call (waits for the device).
  virtual absl::StatusOr<uint32_t> TakeErrorFlags() = 0;
  // The logits row `row` of the last step of bucket `bucket_index`, as f32.
  virtual absl::StatusOr<std::vector<float>> ReadLogits(int64_t bucket_index, int64_t row) = 0;

  // Time marks between steps: Mark(i) for i in [0, n), then the n - 1 intervals in ms.
  virtual absl::Status StartMarks(int64_t n) = 0;
  virtual absl::Status Mark(int64_t i) = 0;
  virtual absl::StatusOr<std::vector<double>> MarkIntervalsMs() = 0;
};

absl::StatusOr<std::unique_ptr<StepBackend>> MakeCpuBackend(BackendSetup setup);
#if STEPGRAPH_HAS_CUDA
absl::StatusOr<std::unique_ptr<StepBackend>> MakeCudaBackend(BackendSetup setup);
bool CudaDeviceFound();
#endif

}  // namespace sg::internal

#endif  // STEPGRAPH_MODELS_SESSION_BACKEND_H_
