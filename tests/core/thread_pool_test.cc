// Thread pool: coverage of the range, chunking independent of thread count, exceptions and
// nesting.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>

#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/core/thread_pool.h"

namespace tessel {
namespace {

TEST(ThreadPool, CoversTheRangeExactlyOnce) {
  for (int threads : {1, 2, 3}) {
    auto ctx = make_rank_context(0, 1, threads);
    RankContextScope scope(ctx);
    std::vector<std::atomic<int>> hits(1000);
    parallel_for(0, 1000, 7, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

TEST(ThreadPool, ChunksDoNotDependOnTheThreadCount) {
  auto chunks_with = [](int threads) {
    auto ctx = make_rank_context(0, 1, threads);
    RankContextScope scope(ctx);
    std::mutex m;
    std::set<std::pair<int64_t, int64_t>> seen;
    parallel_for(5, 105, 10, [&](int64_t b, int64_t e) {
      std::lock_guard lock(m);
      seen.insert({b, e});
    });
    return seen;
  };
  EXPECT_EQ(chunks_with(1), chunks_with(3));
  EXPECT_EQ(chunks_with(1).size(), 10u);
}

TEST(ThreadPool, RethrowsAWorkersException) {
  auto ctx = make_rank_context(0, 1, 2);
  RankContextScope scope(ctx);
  EXPECT_THROW(parallel_for(0, 100, 1,
                            [](int64_t b, int64_t) {
                              if (b == 57) TESSEL_THROW("boom at {}", b);
                            }),
               Error);
  // The pool still works afterwards.
  std::atomic<int64_t> total{0};
  parallel_for(0, 100, 1, [&](int64_t b, int64_t e) { total += e - b; });
  EXPECT_EQ(total.load(), 100);
}

TEST(ThreadPool, NestedLoopsRunInline) {
  auto ctx = make_rank_context(0, 1, 2);
  RankContextScope scope(ctx);
  std::atomic<int64_t> total{0};
  parallel_for(0, 8, 1, [&](int64_t, int64_t) {
    parallel_for(0, 10, 1, [&](int64_t b, int64_t e) { total += e - b; });
  });
  EXPECT_EQ(total.load(), 80);
}

}  // namespace
}  // namespace tessel
