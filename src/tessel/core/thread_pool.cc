// A small fork-join pool: the caller and the workers claim fixed-size chunks of a range.
#include "tessel/core/thread_pool.h"

#include <algorithm>

#include "tessel/core/context.h"

namespace tessel {

namespace {
thread_local bool t_in_parallel = false;

struct InParallel {
  bool previous = t_in_parallel;
  InParallel() { t_in_parallel = true; }
  ~InParallel() { t_in_parallel = previous; }
};

void run_inline(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  InParallel guard;
  for (int64_t b = 0; b < n; b += grain) fn(b, std::min(n, b + grain));
}
}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t chunks = (n + grain - 1) / grain;
  if (num_threads_ == 1 || chunks == 1 || t_in_parallel) return run_inline(n, grain, fn);
  std::unique_lock run_lock(run_mutex_, std::try_to_lock);
  if (!run_lock.owns_lock()) return run_inline(n, grain, fn);

  {
    std::lock_guard lock(mutex_);
    job_ = &fn;
    job_n_ = n;
    job_grain_ = grain;
    job_chunks_ = chunks;
    next_chunk_ = 0;
    finished_chunks_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();

  InParallel guard;
  std::unique_lock lock(mutex_);
  while (next_chunk_ < job_chunks_) {
    int64_t c = next_chunk_++;
    lock.unlock();
    std::exception_ptr err;
    try {
      fn(c * grain, std::min(n, (c + 1) * grain));
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    if (err && !error_) error_ = err;
    ++finished_chunks_;
  }
  done_.wait(lock, [&] { return finished_chunks_ == job_chunks_; });
  job_ = nullptr;
  std::exception_ptr err = error_;
  error_ = nullptr;
  lock.unlock();
  if (err) std::rethrow_exception(err);
}

void ThreadPool::worker_loop(int) {
  t_in_parallel = true;
  uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    while (job_ != nullptr && next_chunk_ < job_chunks_) {
      int64_t c = next_chunk_++;
      const auto* fn = job_;
      int64_t n = job_n_, grain = job_grain_;
      lock.unlock();
      std::exception_ptr err;
      try {
        (*fn)(c * grain, std::min(n, (c + 1) * grain));
      } catch (...) {
        err = std::current_exception();
      }
      lock.lock();
      if (err && !error_) error_ = err;
      if (++finished_chunks_ == job_chunks_) done_.notify_all();
    }
  }
}

void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (end <= begin) return;
  std::shared_ptr<ThreadPool> pool = current_pool();
  if (pool->num_threads() == 1) {
    InParallel guard;
    for (int64_t b = begin; b < end; b += std::max<int64_t>(grain, 1)) fn(b, std::min(end, b + std::max<int64_t>(grain, 1)));
    return;
  }
  pool->run(end - begin, grain, [&](int64_t b, int64_t e) { fn(begin + b, begin + e); });
}

int current_num_threads() { return current_pool()->num_threads(); }

}  // namespace tessel
