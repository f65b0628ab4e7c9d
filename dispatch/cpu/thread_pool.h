// A small fixed pool of threads for the CPU reference. ParallelFor splits a range into a
// few chunks per thread which the calling thread and the workers claim one at a time, so
// a thread the system deschedules (other programs on the same cores) delays only the
// chunk it holds, not the loop: the others take the rest. Each op's result must not depend
// on the split, so the reference gives the same bits with any number of threads: a chunk
// computes whole output elements, never a share of one sum. Workers spin briefly after a
// job (a decode step calls ParallelFor hundreds of times, and waking a sleeping thread
// costs more than most chunks take), then sleep.
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

  // Calls body(thread, begin, end) for consecutive ranges covering [0, n), each range at
  // least min_per_chunk long (but the last), `thread` in [0, size()) naming the calling
  // thread (0) or a worker, so that body may use per-thread scratch. Runs inline when n <
  // 2·min_per_chunk. `body` must not throw.
  template <typename Body>
  void ParallelFor(int64_t n, int64_t min_per_chunk, Body&& body) {
    using B = std::remove_reference_t<Body>;
    if (n <= 0) return;
    if (workers_.empty() || n < 2 * min_per_chunk) {
      body(0, int64_t{0}, n);
      return;
    }
    Dispatch(n, min_per_chunk, [](void* ctx, int thread, int64_t begin, int64_t end) {
      (*static_cast<B*>(ctx))(thread, begin, end);
    }, const_cast<void*>(static_cast<const void*>(&body)));
  }

 private:
  using ChunkFn = void (*)(void* ctx, int thread, int64_t begin, int64_t end);
  void Dispatch(int64_t n, int64_t min_per_chunk, ChunkFn fn, void* ctx);
  // Claims and runs chunks of job `generation` until none is left.
  void RunChunks(uint32_t generation, int thread);
  void WorkerLoop(int thread);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::atomic<bool> stop_{false};
  std::atomic<int> sleeping_{0};  // workers waiting on wake_
  // The job's generation (high 32 bits) and its next unclaimed chunk (low 32 bits), one
  // word so that a claim is tied to a job: a worker that wakes late cannot claim a chunk
  // of a later job while thinking it belongs to an earlier one.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> chunks_done_{0};
  // The current job: written before claim_ publishes it, read only after a claim of it
  // succeeded (the job cannot end, and be replaced, while a claimed chunk runs).
  ChunkFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> chunks_{0};  // also read by late workers, to see there is no work
};

}  // namespace sg::cpu

#endif  // STEPGRAPH_DISPATCH_CPU_THREAD_POOL_H_
