// A small fixed pool of threads for the CPU reference: ParallelFor splits a range into one
// contiguous part per thread (the calling thread takes the first) and returns when all are
// done. Each op's result must not depend on the split, so the reference gives the same
// bits with any number of threads: a part computes whole output elements, never a share of
// one sum. Workers spin briefly after a part (a decode step calls ParallelFor hundreds of
// times, and waking a sleeping thread costs more than most parts take), then sleep.
#ifndef STEPGRAPH_DISPATCH_CPU_THREAD_POOL_H_
#define STEPGRAPH_DISPATCH_CPU_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace sg::cpu {

class ThreadPool {
 public:
  // `threads` participants in all (the caller and threads − 1 workers); 0 means one per
  // core. Never throws: when a worker cannot be started the pool runs with fewer.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Participants, the caller included (>= 1).
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls body(part, begin, end) for consecutive ranges covering [0, n), part in
  // [0, size()); runs inline as one part when n < 2·min_per_part. `body` must not throw.
  template <typename Body>
  void ParallelFor(int64_t n, int64_t min_per_part, Body&& body) {
    using B = std::remove_reference_t<Body>;
    if (n <= 0) return;
    if (workers_.empty() || n < 2 * min_per_part) {
      body(0, int64_t{0}, n);
      return;
    }
    Dispatch(n, [](void* ctx, int part, int64_t begin, int64_t end) {
      (*static_cast<B*>(ctx))(part, begin, end);
    }, const_cast<void*>(static_cast<const void*>(&body)));
  }

 private:
  using PartFn = void (*)(void* ctx, int part, int64_t begin, int64_t end);
  void Dispatch(int64_t n, PartFn fn, void* ctx);
  void RunPart(int part);
  void WorkerLoop(int part);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> generation_{0};   // bumped (under mu_) for each job
  std::atomic<int> sleeping_{0};          // workers waiting on wake_
  std::atomic<int> remaining_{0};         // workers yet to finish the current job
  // The current job: written before generation_ is bumped, read after it is seen.
  PartFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
};

}  // namespace sg::cpu

#endif  // STEPGRAPH_DISPATCH_CPU_THREAD_POOL_H_
