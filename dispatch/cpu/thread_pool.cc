// The CPU reference's thread pool (see thread_pool.h).
#include "dispatch/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <system_error>

namespace sg::cpu {
namespace {

// How long a worker keeps polling for the next job before it sleeps.
constexpr auto kSpinFor = std::chrono::microseconds(200);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  threads = std::clamp(threads, 1, 256);
  workers_.reserve(threads - 1);
  for (int part = 1; part < threads; ++part) {
    try {
      workers_.emplace_back([this, part] { WorkerLoop(part); });
    } catch (const std::system_error&) {
      break;  // fewer threads than asked: still correct, only slower
    }
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunPart(int part) {
  const int parts = size();
  const int64_t begin = n_ * part / parts, end = n_ * (part + 1) / parts;
  if (begin < end) fn_(ctx_, part, begin, end);
}

void ThreadPool::Dispatch(int64_t n, PartFn fn, void* ctx) {
  fn_ = fn;
  ctx_ = ctx;
  n_ = n;
  remaining_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    // Under the lock, so that a worker deciding to sleep either sees the new generation
    // or is counted in sleeping_ before the check below.
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  if (sleeping_.load() > 0) wake_.notify_all();
  RunPart(0);
  for (int spins = 0; remaining_.load(std::memory_order_acquire) > 0; ++spins) {
    if (spins < 4096) {
      CpuRelax();
    } else {
      std::this_thread::yield();  // a worker was descheduled: let it run
    }
  }
}

void ThreadPool::WorkerLoop(int part) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t now = generation_.load(std::memory_order_acquire);
    if (now == seen) {
      const auto deadline = std::chrono::steady_clock::now() + kSpinFor;
      for (int spins = 1; now == seen && !stop_.load(std::memory_order_relaxed); ++spins) {
        CpuRelax();
        if (spins % 64 == 0 && std::chrono::steady_clock::now() > deadline) break;
        now = generation_.load(std::memory_order_acquire);
      }
    }
    if (now == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      sleeping_.fetch_add(1);
      wake_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
      sleeping_.fetch_sub(1);
      now = generation_.load(std::memory_order_acquire);
    }
    if (stop_.load()) return;
    seen = now;
    RunPart(part);
    remaining_.fetch_sub(1, std::memory_order_release);
  }
}

}  // namespace sg::cpu
