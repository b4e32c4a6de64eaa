// Intra-op parallelism. Each rank owns a pool sized to the cores it owns, so N thread-ranks
// on C cores run C threads in all, not N × C. Work is split into chunks whose boundaries
// depend only on the range and grain — never on the thread count — so a kernel that reduces
// chunk by chunk gives the same bits with any number of threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tessel {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }
  // Runs fn(chunk_begin, chunk_end) over [0, n) in chunks of `grain` (the last may be
  // shorter). Runs inline when the pool has one thread, when called from inside a parallel
  // region, or when another thread holds the pool. Rethrows the first exception.
  void run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop(int index);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one parallel region at a time
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, job_grain_ = 0, job_chunks_ = 0;
  int64_t next_chunk_ = 0, finished_chunks_ = 0;
  uint64_t generation_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
};

// Parallel loop on the calling rank's pool: fn(begin, end) over [begin, end) in chunks of
// `grain` elements.
void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// Number of intra-op threads of the calling rank.
int current_num_threads();

}  // namespace tessel
