// The CPU reference's thread pool: every index of every job is visited exactly once, by a
// thread index in range, whatever the sizes, many jobs in a row (a late worker must never
// run a chunk of the wrong job), and small jobs run inline on the caller.
#include "dispatch/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <vector>

namespace sg::cpu {
namespace {

TEST(ThreadPoolTest, EveryIndexOnceAcrossManyJobs) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    ASSERT_EQ(pool.size(), threads);
    std::vector<std::atomic<int>> hits(5000);
    int64_t expected_total = 0;
    for (int job = 0; job < 3000; ++job) {
      const int64_t n = 1 + (job * 7919) % 5000, grain = 1 + job % 5;
      std::atomic<int> bad_thread{0};
      pool.ParallelFor(n, grain, [&](int thread, int64_t begin, int64_t end) {
        if (thread < 0 || thread >= threads) bad_thread.fetch_add(1);
        for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
      });
      ASSERT_EQ(bad_thread.load(), 0);
      expected_total += n;
    }
    int64_t total = 0;
    for (auto& h : hits) total += h.load();
    EXPECT_EQ(total, expected_total) << threads << " threads";
  }
}

TEST(ThreadPoolTest, ExactCoverageOfOneJob) {
  ThreadPool pool(4);
  for (int64_t n : {1, 2, 3, 17, 1000, 65537}) {
    std::vector<int> hits(n, 0);  // ranges are disjoint: no two threads touch one element
    pool.ParallelFor(n, 1, [&](int, int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) ++hits[i];
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << "n " << n << " index " << i;
  }
}

TEST(ThreadPoolTest, SmallJobsRunInlineOnTheCaller) {
  ThreadPool pool(4);
  int calls = 0, thread_seen = -1;
  pool.ParallelFor(10, 8, [&](int thread, int64_t begin, int64_t end) {
    ++calls;
    thread_seen = thread;
    EXPECT_EQ(begin, 0);
    EXPECT_EQ(end, 10);
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(thread_seen, 0);
}

}  // namespace
}  // namespace sg::cpu
