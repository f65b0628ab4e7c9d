// The CPU device of a StepRunner: host memory, the CPU reference (or a dispatcher the
// caller gives, e.g. the mock), no stream (every call completes before it returns), no
// capture. Memory comes from anonymous mappings, whose pages the system supplies as zeros
// on first touch: a KV cache sized for a long context costs only what is written.
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/runner_device.h"
#include "stepgraph/dispatch/collectives.h"
#include "stepgraph/dispatch/cpu_dispatch.h"
#include "stepgraph/base/status.h"

namespace sg {
namespace {

using Clock = std::chrono::steady_clock;

double MsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Memory the system reports available (MemAvailable), or free pages where that is not
// readable.
int64_t AvailableHostBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t value = 0;
  std::string unit;
  while (meminfo >> key >> value >> unit) {
    if (key == "MemAvailable:") return value * 1024;
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

class CpuRunnerDevice final : public RunnerDevice {
 public:
  explicit CpuRunnerDevice(const RunnerOptions& options) {
    if (options.cpu_dispatch != nullptr) {
      dispatch_ = options.cpu_dispatch;
    } else {
      owned_ = std::make_unique<CpuDispatch>(CpuDispatch::Options{
          .threads = options.cpu_threads,
          .collectives = dynamic_cast<HostCollectives*>(options.collectives),
          .rank = options.rank});
      cpu_ = owned_.get();
      dispatch_ = owned_.get();
    }
  }

  ~CpuRunnerDevice() override {
    for (const auto& [p, bytes] : mappings_) munmap(p, bytes);
  }

  std::string Describe() const override {
    return cpu_ != nullptr ? absl::StrCat("cpu (the f32 reference, ", cpu_->threads(),
                                          cpu_->threads() == 1 ? " thread)" : " threads)")
                           : "cpu (a caller's dispatcher)";
  }
  KernelDispatch& dispatch() override { return *dispatch_; }
  bool can_capture() const override { return false; }

  absl::StatusOr<void*> Allocate(int64_t bytes, bool, absl::string_view what) override {
    // Mapped pages read as zeros whether or not `zeroed` is asked for.
    if (bytes <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot allocate ", bytes, " bytes for ", what));
    }
    void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot allocate ", bytes, " bytes of host memory for ", what, ": ",
          std::strerror(errno), " (", AvailableHostBytes(), " bytes available)"));
    }
    try {
      mappings_.emplace_back(p, static_cast<size_t>(bytes));
    } catch (const std::bad_alloc&) {
      munmap(p, static_cast<size_t>(bytes));
      return absl::ResourceExhaustedError(absl::StrCat("out of memory allocating ", what));
    }
    return p;
  }
  absl::StatusOr<void*> AllocateHost(int64_t bytes, absl::string_view what) override {
    return Allocate(bytes, false, what);
  }
  absl::StatusOr<int64_t> FreeBytes() const override { return AvailableHostBytes(); }
  absl::Status Copy(void* dst, const void* src, int64_t bytes) override {
    std::memmove(dst, src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  absl::Status Sync() override { return absl::OkStatus(); }
  absl::StatusOr<uint32_t> TakeErrorFlags() override {
    return cpu_ != nullptr ? cpu_->TakeErrorFlags() : 0u;
  }

  absl::StatusOr<std::vector<double>> TimeCopies(int64_t bytes, int repeats) override {
    SG_ASSIGN_OR_RETURN(void* src, Allocate(bytes, false, "the copy source"));
    SG_ASSIGN_OR_RETURN(void* dst, Allocate(bytes, false, "the copy destination"));
    std::memset(src, 1, static_cast<size_t>(bytes));
    std::vector<double> seconds;
    for (int r = -1; r < repeats; ++r) {  // r = -1 warms up (and maps dst's pages)
      const Clock::time_point t0 = Clock::now();
      std::memcpy(dst, src, static_cast<size_t>(bytes));
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (r >= 0) seconds.push_back(s);
    }
    Release(src);
    Release(dst);
    return seconds;
  }

  absl::StatusOr<std::unique_ptr<ReplayableStep>> Capture(const PreparedPlan&,
                                                          const Bindings&) override {
    return absl::UnimplementedError("the CPU runs every step eagerly; nothing is captured");
  }

  absl::StatusOr<std::vector<double>> Profile(const PreparedPlan& prepared,
                                              const Bindings& bindings) override {
    std::vector<double> node_ms(static_cast<size_t>(prepared.plan().graph().num_nodes()), 0.0);
    Clock::time_point last = Clock::now();
    ExecOptions options;
    options.after_node = [&](int32_t node) {
      const Clock::time_point now = Clock::now();
      node_ms[node] = MsBetween(last, now);
      last = now;
      return absl::OkStatus();
    };
    SG_RETURN_IF_ERROR(Execute(prepared, bindings, *dispatch_, options).status());
    return node_ms;
  }

  absl::Status StartMarks(int64_t n) override {
    marks_.assign(static_cast<size_t>(n), Clock::time_point{});
    return absl::OkStatus();
  }
  absl::Status Mark(int64_t i) override {
    if (i < 0 || i >= static_cast<int64_t>(marks_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("time mark ", i, " was not started"));
    }
    marks_[i] = Clock::now();
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<double>> MarkIntervalsMs() override {
    std::vector<double> ms;
    for (size_t i = 1; i < marks_.size(); ++i) ms.push_back(MsBetween(marks_[i - 1], marks_[i]));
    return ms;
  }

 private:
  void Release(void* p) {
    for (size_t i = 0; i < mappings_.size(); ++i) {
      if (mappings_[i].first == p) {
        munmap(p, mappings_[i].second);
        mappings_.erase(mappings_.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
    }
  }

  std::unique_ptr<CpuDispatch> owned_;
  CpuDispatch* cpu_ = nullptr;  // the reference, when it is the dispatcher
  KernelDispatch* dispatch_ = nullptr;
  std::vector<std::pair<void*, size_t>> mappings_;
  std::vector<Clock::time_point> marks_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RunnerDevice>> MakeCpuRunnerDevice(
    const RunnerOptions& options) {
  if (options.collectives != nullptr &&
      (dynamic_cast<HostCollectives*>(options.collectives) == nullptr ||
       options.cpu_dispatch != nullptr)) {
    return absl::InvalidArgumentError(
        "the CPU reference meets its ranks through HostCollectives, with its own dispatcher");
  }
  return std::unique_ptr<RunnerDevice>(new CpuRunnerDevice(options));
}

}  // namespace sg
