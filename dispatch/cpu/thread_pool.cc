// The CPU reference's thread pool (see thread_pool.h).
#include "dispatch/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <system_error>

namespace sg::cpu {
namespace {

// How long a worker keeps polling for the next job before it sleeps.
constexpr auto kSpinFor = std::chrono::microseconds(100);
// Chunks per thread: enough that a descheduled thread's share is taken by the others.
constexpr int64_t kChunksPerThread = 4;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

uint32_t GenerationOf(uint64_t claim) { return static_cast<uint32_t>(claim >> 32); }

// The chunk index of a job that is being written and cannot be claimed yet.
constexpr uint32_t kClosed = 0xffffffffu;

}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  threads = std::clamp(threads, 1, 256);
  workers_.reserve(threads - 1);
  for (int thread = 1; thread < threads; ++thread) {
    try {
      workers_.emplace_back([this, thread] { WorkerLoop(thread); });
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

void ThreadPool::RunChunks(uint32_t generation, int thread) {
  uint64_t claim = claim_.load(std::memory_order_acquire);
  for (;;) {
    if (GenerationOf(claim) != generation) return;  // that job is over
    const uint32_t chunk = static_cast<uint32_t>(claim);
    if (chunk == kClosed) {  // the caller is still writing the job
      CpuRelax();
      claim = claim_.load(std::memory_order_acquire);
      continue;
    }
    if (chunk >= chunks_.load(std::memory_order_relaxed)) return;  // all claimed
    if (!claim_.compare_exchange_weak(claim, claim + 1, std::memory_order_acquire,
                                      std::memory_order_acquire)) {
      continue;  // `claim` now holds the current value
    }
    const int64_t chunks = chunks_.load(std::memory_order_relaxed);
    fn_(ctx_, thread, n_ * chunk / chunks, n_ * (chunk + 1) / chunks);
    chunks_done_.fetch_add(1, std::memory_order_release);
    claim = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::Dispatch(int64_t n, int64_t min_per_chunk, ChunkFn fn, void* ctx) {
  // Close the claim word to the previous job first (a late worker's claim of it then
  // fails), then write the job, then open it.
  const uint32_t generation = GenerationOf(claim_.load(std::memory_order_relaxed)) + 1;
  claim_.store(static_cast<uint64_t>(generation) << 32 | kClosed, std::memory_order_release);
  fn_ = fn;
  ctx_ = ctx;
  n_ = n;
  chunks_.store(std::clamp<int64_t>(n / std::max<int64_t>(min_per_chunk, 1), 1,
                                    kChunksPerThread * size()),
                std::memory_order_relaxed);
  chunks_done_.store(0, std::memory_order_relaxed);
  {
    // Under the lock, so that a worker deciding to sleep either sees the new job or is
    // counted in sleeping_ before the check below.
    std::lock_guard<std::mutex> lock(mu_);
    claim_.store(static_cast<uint64_t>(generation) << 32, std::memory_order_release);
  }
  if (sleeping_.load() > 0) wake_.notify_all();
  RunChunks(generation, 0);
  // Only chunks already claimed by workers are left; wait for them.
  const int64_t chunks = chunks_.load(std::memory_order_relaxed);
  for (int spins = 0; chunks_done_.load(std::memory_order_acquire) < chunks; ++spins) {
    if (spins < 4096) {
      CpuRelax();
    } else {
      std::this_thread::yield();  // the worker holding a chunk was descheduled
    }
  }
}

void ThreadPool::WorkerLoop(int thread) {
  uint32_t seen = 0;
  for (;;) {
    uint32_t now = GenerationOf(claim_.load(std::memory_order_acquire));
    if (now == seen) {
      const auto deadline = std::chrono::steady_clock::now() + kSpinFor;
      for (int spins = 1; now == seen && !stop_.load(std::memory_order_relaxed); ++spins) {
        CpuRelax();
        if (spins % 64 == 0 && std::chrono::steady_clock::now() > deadline) break;
        now = GenerationOf(claim_.load(std::memory_order_acquire));
      }
    }
    if (now == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      sleeping_.fetch_add(1);
      wake_.wait(lock, [&] {
        return stop_.load() || GenerationOf(claim_.load()) != seen;
      });
      sleeping_.fetch_sub(1);
      now = GenerationOf(claim_.load(std::memory_order_acquire));
    }
    if (stop_.load()) return;
    seen = now;
    RunChunks(now, thread);
  }
}

}  // namespace sg::cpu
