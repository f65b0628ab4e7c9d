// The CUDA device of a StepRunner: device memory, one non-blocking stream (the
// dispatcher's, fixed when it is made), CudaDispatch, and each step captured once as a
// CUDA graph. Every copy goes to that stream too, so setup and steps are ordered without
// ever synchronising the device.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/runner_device.h"
#include "capture/captured_loop.h"
#include "dispatch/cuda/cuda_handles.h"
#include "dispatch/cuda/device_loop.h"
#include "dispatch/cuda/cuda_status.h"
#include "dispatch/cuda/one_shot.h"
#include "stepgraph/capture/cuda_graph.h"
#include "stepgraph/dispatch/cuda_dispatch.h"
#include "stepgraph/base/status.h"
#include "stepgraph/dispatch/collectives.h"

#if defined(STEPGRAPH_WITH_NCCL)
#include <nccl.h>
#endif

namespace sg {

bool BuiltWithCuda() { return true; }
bool CudaDeviceFound() { return CudaDeviceAvailable(); }

namespace {

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

// The GPUs of one process in a tensor-parallel group: one NCCL communicator each, made
// together (ncclCommInitAll), destroyed (or aborted) together.
class NcclGroup final : public CollectiveGroup {
 public:
#if defined(STEPGRAPH_WITH_NCCL)
  static absl::StatusOr<std::unique_ptr<NcclGroup>> Create(int ranks) {
    int devices = 0;
    SG_RETURN_IF_ERROR(ToStatus(cudaGetDeviceCount(&devices), "cudaGetDeviceCount"));
    if (ranks < 1 || ranks > devices) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor parallel over ", ranks, " GPUs: this machine has ", devices));
    }
    // NVLink multicast (NVLS) stays off: on shared machines it can take the host's GPUs
    // out of service (docs/parallel.md). NCCL reads the switch when a communicator is made.
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
    // Connections made when the communicators are, not at a collective's first call: a
    // first call inside a stream capture cannot make them (NCCL reports an internal
    // error). A caller's own choice stands.
    setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
    auto group = std::unique_ptr<NcclGroup>(new NcclGroup());
    group->comms_.assign(static_cast<size_t>(ranks), nullptr);
    std::vector<int> list(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) list[static_cast<size_t>(r)] = r;
    const ncclResult_t result = ncclCommInitAll(group->comms_.data(), ranks, list.data());
    if (result != ncclSuccess) {
      group->comms_.clear();
      return absl::InternalError(absl::StrCat("ncclCommInitAll over ", ranks,
                                              " GPUs failed: ", ncclGetErrorString(result)));
    }
    SG_ASSIGN_OR_RETURN(group->one_shot_, OneShotBuffers::Create(ranks));
    return group;
  }
  ~NcclGroup() override {
    for (ncclComm_t c : comms_) {
      const ncclResult_t r = aborted_ ? ncclCommAbort(c) : ncclCommDestroy(c);
      if (r != ncclSuccess) internal::LogReleaseFailure("ncclCommDestroy", static_cast<int>(r));
    }
  }
  void* comm(int rank) const { return comms_[static_cast<size_t>(rank)]; }
  // Rank `rank`'s view of the one-shot all-reduce buffers; null where the GPUs cannot reach
  // each other's memory (or the group is larger than the kernel takes).
  const void* one_shot(int rank) const {
    return one_shot_ == nullptr ? nullptr : one_shot_->peers(rank);
  }
  int ranks() const override { return static_cast<int>(comms_.size()); }
  // A rank that failed mid-step leaves the others' collectives waiting on their GPUs; they
  // end when the communicators are aborted, which the destructor does.
  void Abort(const absl::Status&) override { aborted_ = true; }

 private:
  NcclGroup() = default;

  std::vector<ncclComm_t> comms_;
  std::unique_ptr<OneShotBuffers> one_shot_;
  bool aborted_ = false;
#else
  void* comm(int) const { return nullptr; }
  const void* one_shot(int) const { return nullptr; }
  int ranks() const override { return 1; }
  void Abort(const absl::Status&) override {}
#endif
};

static_assert(StepRunner::kMaxLoopStopIds == kDeviceLoopMaxStops,
              "the runner's bound on stop ids is the control kernel's");

// A captured step's device loop: its ring and state on the device, their pinned copies,
// and the loop graph (capture/captured_loop.h).
class CudaDeviceLoop final : public DeviceLoop {
 public:
  static absl::StatusOr<std::unique_ptr<CudaDeviceLoop>> Create(const CapturedStep& step,
                                                                const int32_t* ids,
                                                                int64_t rows,
                                                                int64_t max_steps) {
    if (rows < 1 || rows > kDeviceLoopMaxRows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device loop: ", rows, " rows; one loop takes 1 to ", kDeviceLoopMaxRows));
    }
    auto loop = std::unique_ptr<CudaDeviceLoop>(new CudaDeviceLoop());
    loop->stream_ = step.stream();
    loop->rows_ = rows;
    const int64_t ring_bytes = max_steps * rows * 4;
    const int64_t state_bytes = DeviceLoopStateInts(rows) * 4;
    SG_ASSIGN_OR_RETURN(loop->ring_, AllocateDevice(ring_bytes, "device loop ring"));
    SG_ASSIGN_OR_RETURN(loop->state_, AllocateDevice(state_bytes, "device loop state"));
    void* host = nullptr;
    SG_RETURN_IF_ERROR(
        ToStatus(cudaMallocHost(&host, static_cast<size_t>(ring_bytes + state_bytes)),
                 "cudaMallocHost (device loop)"));
    loop->host_.reset(host);
    DeviceLoopBuffers b;
    b.ids = ids;
    b.rows = static_cast<int32_t>(rows);
    b.ring = static_cast<int32_t*>(loop->ring_.get());
    b.ring_stride = static_cast<int32_t>(rows);
    b.max_steps = static_cast<int32_t>(max_steps);
    b.state = static_cast<int32_t*>(loop->state_.get());
    SG_ASSIGN_OR_RETURN(loop->graph_, CapturedLoop::Create(step, b));
    return loop;
  }

  absl::StatusOr<int64_t> Run(int64_t limit, absl::Span<const int32_t> stop_ids,
                              absl::Span<const uint8_t> live, int32_t* ids_out,
                              int64_t ids_stride) override {
    auto* state = static_cast<int32_t*>(host_.get());
    int32_t* ring = state + DeviceLoopStateInts(rows_);
    state[DeviceLoopState::kSteps] = 0;
    state[DeviceLoopState::kLimit] = static_cast<int32_t>(limit);
    state[DeviceLoopState::kStops] = static_cast<int32_t>(stop_ids.size());
    for (size_t i = 0; i < stop_ids.size(); ++i) state[DeviceLoopState::kStopIds + i] = stop_ids[i];
    for (int64_t r = 0; r < rows_; ++r) state[DeviceLoopState::kRows + r] = live[r] ? 1 : 0;
    const size_t state_bytes = static_cast<size_t>(DeviceLoopStateInts(rows_) * 4);
    SG_RETURN_IF_ERROR(ToStatus(cudaMemcpyAsync(state_.get(), state, state_bytes,
                                                cudaMemcpyHostToDevice, stream_),
                                "cudaMemcpyAsync (device loop state)"));
    SG_RETURN_IF_ERROR(graph_->Launch());
    SG_RETURN_IF_ERROR(ToStatus(cudaMemcpyAsync(state, state_.get(), 4, cudaMemcpyDeviceToHost,
                                                stream_),
                                "cudaMemcpyAsync (device loop steps)"));
    SG_RETURN_IF_ERROR(ToStatus(cudaMemcpyAsync(ring, ring_.get(),
                                                static_cast<size_t>(limit * rows_ * 4),
                                                cudaMemcpyDeviceToHost, stream_),
                                "cudaMemcpyAsync (device loop ring)"));
    SG_RETURN_IF_ERROR(
        ToStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (device loop)"));
    const int64_t ran = state[DeviceLoopState::kSteps];
    if (ran < 1 || ran > limit) {
      return absl::InternalError(absl::StrCat("device loop: ran ", ran, " steps of ", limit));
    }
    for (int64_t k = 0; k < ran; ++k) {
      std::memcpy(ids_out + k * ids_stride, ring + k * rows_, static_cast<size_t>(rows_) * 4);
    }
    return ran;
  }

 private:
  CudaDeviceLoop() = default;
  cudaStream_t stream_ = nullptr;
  int64_t rows_ = 0;
  DeviceMemory ring_, state_;
  PinnedMemory host_;
  std::unique_ptr<CapturedLoop> graph_;
};

// The runner makes its device current before it replays (StepRunner::Run).
class CapturedReplay final : public ReplayableStep {
 public:
  explicit CapturedReplay(std::unique_ptr<CapturedStep> step) : step_(std::move(step)) {}
  absl::Status Replay() override { return step_->Replay(); }
  int64_t graph_nodes() const override { return step_->num_graph_nodes(); }
  absl::StatusOr<std::unique_ptr<DeviceLoop>> MakeLoop(const int32_t* ids, int64_t rows,
                                                       int64_t max_steps) override {
    SG_ASSIGN_OR_RETURN(std::unique_ptr<CudaDeviceLoop> loop,
                        CudaDeviceLoop::Create(*step_, ids, rows, max_steps));
    return std::unique_ptr<DeviceLoop>(std::move(loop));
  }

 private:
  std::unique_ptr<CapturedStep> step_;
};

class CudaRunnerDevice final : public RunnerDevice {
 public:
  ~CudaRunnerDevice() override {
    // Copies into pinned memory may still be queued.
    if (dispatch_ != nullptr) {
      if (cudaError_t e = cudaStreamSynchronize(stream()); e != cudaSuccess) {
        internal::LogReleaseFailure("cudaStreamSynchronize (step runner teardown)",
                                    static_cast<int>(e));
      }
    }
  }

  absl::Status Init(const RunnerOptions& options) {
    ordinal_ = options.cuda_device;
    switch_device_ = options.cuda_device != 0 || options.collectives != nullptr;
    SG_RETURN_IF_ERROR(MakeCurrent());
    CudaDispatch::Options d;
    d.cuda = options.cuda;
    if (options.collectives != nullptr) {
      auto* group = dynamic_cast<NcclGroup*>(options.collectives);
      if (group == nullptr || options.rank < 0 || options.rank >= group->ranks()) {
        return absl::InvalidArgumentError(
            "a CUDA runner meets its ranks through the NCCL group of MakeCudaCollectives, "
            "with a rank inside it");
      }
      d.nccl_comm = group->comm(options.rank);
      d.ranks = group->ranks();
      d.one_shot_peers = group->one_shot(options.rank);
    }
    SG_ASSIGN_OR_RETURN(dispatch_, CudaDispatch::Create(d));
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, dispatch_->device_info().device) == cudaSuccess) {
      name_ = prop.name;
    }
    return absl::OkStatus();
  }

  std::string Describe() const override {
    return absl::StrCat("cuda (", name_.empty() ? "device" : name_, ", ",
                        dispatch_->device_info().sm_count, " SMs)");
  }
  KernelDispatch& dispatch() override { return *dispatch_; }
  bool can_capture() const override { return true; }
  absl::Status MakeCurrent() override {
    if (!switch_device_) return absl::OkStatus();
    return ToStatus(cudaSetDevice(ordinal_), "cudaSetDevice (step runner)");
  }

  absl::StatusOr<void*> Allocate(int64_t bytes, bool zeroed, absl::string_view what) override {
    const std::string label(what);
    SG_ASSIGN_OR_RETURN(DeviceMemory m, AllocateDevice(bytes, label.c_str()));
    if (zeroed) {
      SG_RETURN_IF_ERROR(ToStatus(cudaMemsetAsync(m.get(), 0, static_cast<size_t>(bytes), stream()),
                                  absl::StrCat("cudaMemsetAsync (", what, ")")));
    }
    device_.push_back(std::move(m));
    return device_.back().get();
  }
  absl::StatusOr<void*> AllocateHost(int64_t bytes, absl::string_view what) override {
    if (bytes <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", bytes, " bytes for ", what));
    }
    void* p = nullptr;
    SG_RETURN_IF_ERROR(ToStatus(cudaMallocHost(&p, static_cast<size_t>(bytes)),
                                absl::StrCat("cudaMallocHost (", bytes, " bytes for ", what, ")")));
    pinned_.emplace_back(p);
    return p;
  }
  absl::StatusOr<int64_t> FreeBytes() const override {
    size_t free_bytes = 0, total = 0;
    SG_RETURN_IF_ERROR(ToStatus(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo"));
    return static_cast<int64_t>(free_bytes);
  }
  absl::Status Copy(void* dst, const void* src, int64_t bytes) override {
    return ToStatus(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault,
                                    stream()),
                    "cudaMemcpyAsync (step runner copy)");
  }
  absl::Status Sync() override {
    return ToStatus(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (step runner)");
  }
  absl::StatusOr<uint32_t> TakeErrorFlags() override { return dispatch_->TakeErrorFlags(); }

  absl::StatusOr<std::vector<double>> TimeCopies(int64_t bytes, int repeats) override {
    SG_ASSIGN_OR_RETURN(DeviceMemory src, AllocateDevice(bytes, "the copy source"));
    SG_ASSIGN_OR_RETURN(DeviceMemory dst, AllocateDevice(bytes, "the copy destination"));
    SG_ASSIGN_OR_RETURN(UniqueEvent start, CreateEvent("copy start"));
    SG_ASSIGN_OR_RETURN(UniqueEvent stop, CreateEvent("copy stop"));
    SG_RETURN_IF_ERROR(ToStatus(cudaMemsetAsync(src.get(), 1, bytes, stream()), "cudaMemsetAsync"));
    std::vector<double> seconds;
    for (int r = -1; r < repeats; ++r) {  // r = -1 warms up
      SG_RETURN_IF_ERROR(ToStatus(cudaEventRecord(start.get(), stream()), "cudaEventRecord"));
      SG_RETURN_IF_ERROR(ToStatus(cudaMemcpyAsync(dst.get(), src.get(), static_cast<size_t>(bytes),
                                                  cudaMemcpyDeviceToDevice, stream()),
                                  "cudaMemcpyAsync (device to device)"));
      SG_RETURN_IF_ERROR(ToStatus(cudaEventRecord(stop.get(), stream()), "cudaEventRecord"));
      SG_RETURN_IF_ERROR(ToStatus(cudaEventSynchronize(stop.get()), "cudaEventSynchronize"));
      float ms = 0;
      SG_RETURN_IF_ERROR(ToStatus(cudaEventElapsedTime(&ms, start.get(), stop.get()),
                                  "cudaEventElapsedTime"));
      if (r >= 0) seconds.push_back(ms * 1e-3);
    }
    return seconds;
  }

  absl::StatusOr<std::unique_ptr<ReplayableStep>> Capture(const PreparedPlan& prepared,
                                                          const Bindings& bindings) override {
    SG_ASSIGN_OR_RETURN(std::unique_ptr<CapturedStep> step,
                        CapturedStep::Create(prepared, bindings, *dispatch_));
    return std::unique_ptr<ReplayableStep>(new CapturedReplay(std::move(step)));
  }

  absl::StatusOr<std::vector<double>> Profile(const PreparedPlan& prepared,
                                              const Bindings& bindings) override {
    SG_RETURN_IF_ERROR(StartMarks(prepared.plan().graph().num_nodes() + 1));
    LaunchGate gate;
    SG_RETURN_IF_ERROR(ToStatus(cudaLaunchHostFunc(stream(), &LaunchGate::Wait, &gate),
                                "cudaLaunchHostFunc (profiling gate)"));
    absl::Status run = Mark(0);
    if (run.ok()) {
      ExecOptions options;
      options.after_node = [this](int32_t node) { return Mark(node + 1); };
      run = Execute(prepared, bindings, *dispatch_, options).status();
    }
    gate.open.store(true, std::memory_order_release);
    // The gate lives on this stack frame: nothing returns before the stream passed it.
    const absl::Status synced = Sync();
    SG_RETURN_IF_ERROR(run);
    SG_RETURN_IF_ERROR(synced);
    return MarkIntervalsMs();
  }

  absl::Status StartMarks(int64_t n) override {
    marks_.clear();
    for (int64_t i = 0; i < n; ++i) {
      SG_ASSIGN_OR_RETURN(UniqueEvent e, CreateEvent("a time mark"));
      marks_.push_back(std::move(e));
    }
    return absl::OkStatus();
  }
  absl::Status Mark(int64_t i) override {
    if (ABSL_PREDICT_FALSE(i < 0 || i >= static_cast<int64_t>(marks_.size()))) {
      return absl::InvalidArgumentError("time mark was not started");
    }
    return ToStatus(cudaEventRecord(marks_[i].get(), stream()), "cudaEventRecord (time mark)");
  }
  absl::StatusOr<std::vector<double>> MarkIntervalsMs() override {
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

 private:
  cudaStream_t stream() const { return dispatch_->stream(); }

  std::string name_;
  int ordinal_ = 0;
  bool switch_device_ = false;
  // Declared first, destroyed last: its stream orders everything below.
  std::unique_ptr<CudaDispatch> dispatch_;
  std::vector<DeviceMemory> device_;
  std::vector<PinnedMemory> pinned_;
  std::vector<UniqueEvent> marks_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<OpSupport>> CudaOpSupport(const CudaOptions& options) {
  return std::unique_ptr<OpSupport>(std::make_unique<CudaSupport>(options));
}

absl::StatusOr<std::unique_ptr<CollectiveGroup>> MakeCudaCollectives(int ranks) {
#if defined(STEPGRAPH_WITH_NCCL)
  SG_ASSIGN_OR_RETURN(std::unique_ptr<NcclGroup> group, NcclGroup::Create(ranks));
  return std::unique_ptr<CollectiveGroup>(std::move(group));
#else
  return absl::FailedPreconditionError(absl::StrCat(
      "tensor parallel over ", ranks, " GPUs needs NCCL, and this build has none ",
      "(pip install nvidia-nccl-cu13 and rebuild; docs/parallel.md)"));
#endif
}

absl::StatusOr<std::unique_ptr<RunnerDevice>> MakeCudaRunnerDevice(
    const RunnerOptions& options) {
  auto device = std::make_unique<CudaRunnerDevice>();
  SG_RETURN_IF_ERROR(device->Init(options));
  return std::unique_ptr<RunnerDevice>(std::move(device));
}

}  // namespace sg
