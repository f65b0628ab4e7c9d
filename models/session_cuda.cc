// DecodeSession's CUDA backend: the weights uploaded once into one device allocation, the
// KV cache and the step inputs in device memory shared by every bucket, and a GraphCache
// with one captured closed-loop step per bucket. A step is one graph replay and one
// asynchronous copy of its ids into a pinned ring; the host writes inputs only from pinned
// staging, and waits only in Sync. Compiled only with STEPGRAPH_HAS_CUDA.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/cuda_handles.h"
#include "dispatch/cuda/cuda_status.h"
#include "models/session.h"
#include "models/session_backend.h"
#include "stepgraph/capture.h"
#include "stepgraph/cuda_dispatch.h"
#include "stepgraph/status.h"

namespace sg {
namespace internal {
namespace {

absl::StatusOr<PinnedMemory> AllocatePinned(int64_t bytes, const char* what) {
  void* p = nullptr;
  SG_RETURN_IF_ERROR(ToStatus(cudaMallocHost(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1))),
                              absl::StrCat("cudaMallocHost(", bytes, " bytes) for ", what)));
  return PinnedMemory(p);
}

// Holds a stream's work until the host opens it, so that a profiled step's launches are
// all queued before the first one runs and each node's events time the device alone. A
// deadline opens it anyway: a launch queue that fills up blocks the host, which could
// otherwise never open the gate.
struct LaunchGate {
  std::atomic<bool> open{false};
  static void CUDART_CB Wait(void* p) {
    auto* gate = static_cast<LaunchGate*>(p);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (!gate->open.load(std::memory_order_acquire) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
  }
};

class CudaBackend final : public StepBackend {
 public:
  explicit CudaBackend(int64_t rows) : block_(rows) {}

  ~CudaBackend() override {
    // Copies into the pinned ring and staging may still be queued.
    if (cache_ != nullptr) {
      if (cudaError_t e = cudaStreamSynchronize(cache_->stream()); e != cudaSuccess) {
        LogReleaseFailure("cudaStreamSynchronize (session teardown)", static_cast<int>(e));
      }
    }
  }

  absl::Status Init(BackendSetup& setup) {
    rows_ = setup.buckets.back();
    buckets_ = setup.buckets;
    max_seq_ = setup.max_seq;
    SG_ASSIGN_OR_RETURN(dispatch_, CudaDispatch::Create(nullptr));
    const Graph& largest = setup.graphs.back();

    // Weights: one allocation, each tensor at its layout offset.
    BufferLayout weights = LayoutBuffers(largest, TensorKind::kWeight);
    SG_ASSIGN_OR_RETURN(weights_, AllocateDevice(weights.total_bytes, "the model weights"));
    auto* weight_base = static_cast<std::byte*>(weights_.get());
    if (setup.mapped != nullptr) {
      for (const BufferLayout::Entry& e : weights.entries) {
        const ModelWeights::Entry found = setup.mapped->Find(e.name);
        if (found.tensor == nullptr) {
          return absl::NotFoundError(absl::StrCat("weight '", e.name, "' is not in ",
                                                  setup.mapped->dir()));
        }
        SG_RETURN_IF_ERROR(ToStatus(
            cudaMemcpy(weight_base + e.offset, found.tensor->data.data(),
                       static_cast<size_t>(e.bytes), cudaMemcpyHostToDevice),
            absl::StrCat("cudaMemcpy (uploading weight '", e.name, "')")));
      }
    } else {
      // Drawn on the host, exactly as the CPU backend draws them, then uploaded at once.
      SG_ASSIGN_OR_RETURN(AlignedHostBuffer host,
                          AlignedHostBuffer::Allocate(weights.total_bytes, "random weights"));
      SG_RETURN_IF_ERROR(FillRandomWeights(largest, weights, setup.weight_seed, host.span(),
                                           setup.weight_threads));
      SG_RETURN_IF_ERROR(ToStatus(cudaMemcpy(weight_base, host.data(),
                                             static_cast<size_t>(weights.total_bytes),
                                             cudaMemcpyHostToDevice),
                                  "cudaMemcpy (uploading random weights)"));
    }

    kv_layout_ = LayoutBuffers(largest, TensorKind::kState);
    SG_ASSIGN_OR_RETURN(kv_, AllocateDevice(kv_layout_.total_bytes, "the KV cache"));
    SG_RETURN_IF_ERROR(ToStatus(cudaMemset(kv_.get(), 0, static_cast<size_t>(kv_layout_.total_bytes)),
                                "cudaMemset (KV cache)"));

    // Step inputs start as all padding, so that nothing a capture might run writes a cache.
    const int64_t input_bytes = block_.ints() * static_cast<int64_t>(sizeof(int32_t));
    SG_ASSIGN_OR_RETURN(inputs_, AllocateDevice(input_bytes, "the step inputs"));
    std::vector<int32_t> initial(static_cast<size_t>(block_.ints()), 0);
    std::fill_n(initial.begin() + block_.pos(), block_.rows, -1);
    SG_RETURN_IF_ERROR(ToStatus(cudaMemcpy(inputs_.get(), initial.data(),
                                           static_cast<size_t>(input_bytes),
                                           cudaMemcpyHostToDevice),
                                "cudaMemcpy (initial step inputs)"));
    // The uploads and the memset above went to the legacy stream, which the session's
    // non-blocking stream does not wait for: let them land before any step runs.
    SG_RETURN_IF_ERROR(ToStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize (after setup)"));
    SG_ASSIGN_OR_RETURN(prompt_, AllocateDevice(max_seq_ * 4, "the prompt ids"));
    SG_ASSIGN_OR_RETURN(staging_,
                        AllocatePinned((2 * block_.ints() + max_seq_) * 4, "input staging"));
    SG_ASSIGN_OR_RETURN(ring_, AllocatePinned(setup.ring_steps * rows_ * 4, "the id ring"));

    GraphCache::Options options;
    options.buckets = setup.buckets;
    options.capture = DefaultCaptureOptions();
    options.capture.eager = options.capture.eager || setup.eager;
    // Captured now, while every row is padding, rather than on first use in mid-decode.
    options.capture_up_front = !options.capture.eager;
    std::vector<Graph> graphs = std::move(setup.graphs);
    std::vector<int64_t> buckets = setup.buckets;
    auto make_graph = [graphs, buckets](int64_t batch) -> absl::StatusOr<Graph> {
      for (size_t i = 0; i < buckets.size(); ++i) {
        if (buckets[i] == batch) return graphs[i];
      }
      return absl::InvalidArgumentError(absl::StrCat("session: no graph for batch ", batch));
    };
    auto* kv_base = static_cast<std::byte*>(kv_.get());
    auto* input_base = static_cast<int32_t*>(inputs_.get());
    auto bind = [weights, kv_layout = kv_layout_, block = block_, weight_base, kv_base,
                 input_base](const Graph& g, Bindings& b) -> absl::Status {
      SG_RETURN_IF_ERROR(BindLayout(g, TensorKind::kWeight, weights, weight_base, b));
      SG_RETURN_IF_ERROR(BindLayout(g, TensorKind::kState, kv_layout, kv_base, b));
      return BindInputBlock(g, block, input_base, b);
    };
    SG_ASSIGN_OR_RETURN(cache_, GraphCache::Create(make_graph, bind, *dispatch_, options));
    captured_ = !options.capture.eager;

    for (int64_t bucket : buckets_) {
      const ExecutionPlan& plan = cache_->plan(bucket);
      const Graph& g = plan.graph();
      SG_ASSIGN_OR_RETURN(TensorId next, g.FindOutput(kNextIdsOutput));
      SG_ASSIGN_OR_RETURN(TensorId logits, g.FindOutput(kLogitsOutput));
      next_.push_back(ResolveTensor(plan, cache_->bindings(bucket), next.index));
      logits_.push_back(ResolveTensor(plan, cache_->bindings(bucket), logits.index));
    }

    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, dispatch_->device_info().device) == cudaSuccess) {
      device_name_ = prop.name;
    }
    return absl::OkStatus();
  }

  std::string Describe() const override {
    return absl::StrCat("cuda (", device_name_.empty() ? "device" : device_name_, ", ",
                        dispatch_->device_info().sm_count, " SMs)");
  }
  bool captured() const override { return captured_; }
  const ExecutionPlan& plan(int64_t i) const override { return cache_->plan(buckets_[i]); }
  int64_t kv_cache_bytes() const override { return kv_layout_.total_bytes; }

  int32_t* staging(Staging area) override {
    int32_t* base = static_cast<int32_t*>(staging_.get());
    switch (area) {
      case Staging::kPrefillRows:
        return base;
      case Staging::kStepRows:
        return base + block_.ints();
      case Staging::kPrompt:
        return base + 2 * block_.ints();
    }
    return nullptr;
  }

  absl::Status Commit(Staging area, int64_t count) override {
    if (area == Staging::kPrompt) {
      return ToStatus(cudaMemcpyAsync(prompt_.get(), staging(area), count * 4,
                                      cudaMemcpyHostToDevice, stream()),
                      "cudaMemcpyAsync (prompt ids)");
    }
    return ToStatus(cudaMemcpyAsync(inputs_.get(), staging(area), block_.ints() * 4,
                                    cudaMemcpyHostToDevice, stream()),
                    "cudaMemcpyAsync (step inputs)");
  }

  absl::Status FeedPromptToken(int64_t row, int64_t t) override {
    return ToStatus(cudaMemcpyAsync(static_cast<int32_t*>(inputs_.get()) + block_.ids() + row,
                                    static_cast<const int32_t*>(prompt_.get()) + t, 4,
                                    cudaMemcpyDeviceToDevice, stream()),
                    "cudaMemcpyAsync (prompt id into the step's ids)");
  }

  absl::Status RunStep(int64_t i, bool eager, std::vector<double>* node_ms) override {
    const int64_t bucket = buckets_[i];
    if (node_ms != nullptr) return ProfileStep(i, node_ms);
    if (eager) {
      dispatch_->set_stream(stream());
      return Execute(cache_->plan(bucket), cache_->bindings(bucket), *dispatch_).status();
    }
    SG_ASSIGN_OR_RETURN(CapturedStep * step, cache_->Step(bucket));
    return step->Replay();
  }

  absl::Status RecordIds(int64_t i, int64_t k) override {
    return ToStatus(cudaMemcpyAsync(static_cast<int32_t*>(ring_.get()) + k * rows_, next_[i].data,
                                    static_cast<size_t>(next_[i].bytes()),
                                    cudaMemcpyDeviceToHost, stream()),
                    "cudaMemcpyAsync (next ids into the id ring)");
  }
  const int32_t* ring(int64_t k) const override {
    return static_cast<const int32_t*>(ring_.get()) + k * rows_;
  }
  absl::Status Sync() override {
    return ToStatus(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (session)");
  }
  absl::StatusOr<uint32_t> TakeErrorFlags() override {
    dispatch_->set_stream(stream());
    return dispatch_->TakeErrorFlags();
  }
  absl::StatusOr<std::vector<float>> ReadLogits(int64_t i, int64_t row) override {
    const TensorArg& l = logits_[i];
    const int64_t vocab = l.shape.cols();
    const int64_t row_bytes = vocab * DTypeBytes(l.dtype);
    std::vector<std::byte> host(static_cast<size_t>(row_bytes));
    SG_RETURN_IF_ERROR(Sync());
    SG_RETURN_IF_ERROR(ToStatus(cudaMemcpy(host.data(),
                                           static_cast<const std::byte*>(l.data) + row * row_bytes,
                                           static_cast<size_t>(row_bytes), cudaMemcpyDeviceToHost),
                                "cudaMemcpy (logits)"));
    return ToFloats(host.data(), l.dtype, vocab);
  }

  absl::Status StartMarks(int64_t n) override {
    marks_.clear();
    for (int64_t i = 0; i < n; ++i) {
      SG_ASSIGN_OR_RETURN(UniqueEvent e, CreateEvent("a session time mark"));
      marks_.push_back(std::move(e));
    }
    return absl::OkStatus();
  }
  absl::Status Mark(int64_t i) override {
    return ToStatus(cudaEventRecord(marks_[i].get(), stream()), "cudaEventRecord (time mark)");
  }
  absl::StatusOr<std::vector<double>> MarkIntervalsMs() override { return Intervals(); }

 private:
  cudaStream_t stream() const { return cache_->stream(); }

  absl::StatusOr<std::vector<double>> Intervals() {
    std::vector<double> ms;
    if (marks_.empty()) return ms;
    SG_RETURN_IF_ERROR(ToStatus(cudaEventSynchronize(marks_.back().get()),
                                "cudaEventSynchronize (time marks)"));
    for (size_t i = 1; i < marks_.size(); ++i) {
      float t = 0;
      SG_RETURN_IF_ERROR(ToStatus(cudaEventElapsedTime(&t, marks_[i - 1].get(), marks_[i].get()),
                                  "cudaEventElapsedTime"));
      ms.push_back(t);
    }
    return ms;
  }

  absl::Status ProfileStep(int64_t i, std::vector<double>* node_ms) {
    const int64_t bucket = buckets_[i];
    const ExecutionPlan& plan = cache_->plan(bucket);
    SG_RETURN_IF_ERROR(StartMarks(plan.graph().num_nodes() + 1));
    dispatch_->set_stream(stream());
    LaunchGate gate;
    SG_RETURN_IF_ERROR(ToStatus(cudaLaunchHostFunc(stream(), &LaunchGate::Wait, &gate),
                                "cudaLaunchHostFunc (profiling gate)"));
    absl::Status run = Mark(0);
    if (run.ok()) {
      ExecOptions options;
      options.after_node = [this](int32_t node) { return Mark(node + 1); };
      run = Execute(plan, cache_->bindings(bucket), *dispatch_, options).status();
    }
    gate.open.store(true, std::memory_order_release);
    // The gate lives on this stack frame: nothing returns before the stream passed it.
    const absl::Status synced = Sync();
    SG_RETURN_IF_ERROR(run);
    SG_RETURN_IF_ERROR(synced);
    SG_ASSIGN_OR_RETURN(*node_ms, Intervals());
    return absl::OkStatus();
  }

  InputBlock block_;
  int64_t rows_ = 0;
  int64_t max_seq_ = 0;
  std::vector<int64_t> buckets_;
  bool captured_ = false;
  std::string device_name_;
  BufferLayout kv_layout_;
  std::vector<TensorArg> next_, logits_;
  // Declared before the cache, so destroyed after it: the cache's graphs use these.
  std::unique_ptr<CudaDispatch> dispatch_;
  DeviceMemory weights_, kv_, inputs_, prompt_;
  PinnedMemory staging_, ring_;
  std::vector<UniqueEvent> marks_;
  std::unique_ptr<GraphCache> cache_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StepBackend>> MakeCudaBackend(BackendSetup setup) {
  auto backend = std::make_unique<CudaBackend>(setup.buckets.back());
  SG_RETURN_IF_ERROR(backend->Init(setup));
  return std::unique_ptr<StepBackend>(std::move(backend));
}

bool CudaDeviceFound() { return CudaDeviceAvailable(); }

}  // namespace internal

absl::StatusOr<double> MeasureDeviceCopyBandwidth(int64_t bytes, int repeats) {
  if (bytes <= 0 || repeats <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device copy bandwidth: bytes and repeats must be > 0, got ", bytes, " and ", repeats));
  }
  SG_ASSIGN_OR_RETURN(UniqueStream stream, CreateStream("the copy bandwidth measurement"));
  SG_ASSIGN_OR_RETURN(DeviceMemory src, AllocateDevice(bytes, "the copy source"));
  SG_ASSIGN_OR_RETURN(DeviceMemory dst, AllocateDevice(bytes, "the copy destination"));
  SG_ASSIGN_OR_RETURN(UniqueEvent start, CreateEvent("copy start"));
  SG_ASSIGN_OR_RETURN(UniqueEvent stop, CreateEvent("copy stop"));
  SG_RETURN_IF_ERROR(ToStatus(cudaMemsetAsync(src.get(), 1, bytes, stream.get()), "cudaMemsetAsync"));
  std::vector<double> seconds;
  for (int r = -1; r < repeats; ++r) {  // r = -1 warms up
    SG_RETURN_IF_ERROR(ToStatus(cudaEventRecord(start.get(), stream.get()), "cudaEventRecord"));
    SG_RETURN_IF_ERROR(ToStatus(cudaMemcpyAsync(dst.get(), src.get(), static_cast<size_t>(bytes),
                                                cudaMemcpyDeviceToDevice, stream.get()),
                                "cudaMemcpyAsync (device to device)"));
    SG_RETURN_IF_ERROR(ToStatus(cudaEventRecord(stop.get(), stream.get()), "cudaEventRecord"));
    SG_RETURN_IF_ERROR(ToStatus(cudaEventSynchronize(stop.get()), "cudaEventSynchronize"));
    float ms = 0;
    SG_RETURN_IF_ERROR(ToStatus(cudaEventElapsedTime(&ms, start.get(), stop.get()),
                                "cudaEventElapsedTime"));
    if (r >= 0) seconds.push_back(ms * 1e-3);
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  return 2.0 * static_cast<double>(bytes) / median;
}

}  // namespace sg
