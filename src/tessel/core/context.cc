// Per-thread rank contexts and process defaults.
#include "tessel/core/context.h"

#include <cblas.h>
#include <sched.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "tessel/core/thread_pool.h"

// OpenBLAS internals, exported by the library but not declared in cblas.h: re-read its
// environment; stop its worker threads (they start again, reading it, at the next threaded call).
extern "C" {
void openblas_read_env(void) __attribute__((weak));
void blas_thread_shutdown_(void) __attribute__((weak));
}

namespace tessel {

namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  return std::atoi(v);
}

struct ProcessDefaults {
  std::mutex mutex;
  int num_threads = 0;
  std::shared_ptr<ThreadPool> pool;
  std::shared_ptr<MemoryStats> memory = std::make_shared<MemoryStats>();
};

ProcessDefaults& defaults() {
  static ProcessDefaults d;
  return d;
}

std::shared_ptr<ThreadPool> default_pool() {
  ProcessDefaults& d = defaults();
  std::lock_guard lock(d.mutex);
  if (!d.pool) {
    if (d.num_threads == 0) d.num_threads = default_num_threads();
    openblas_set_num_threads(1);
    d.pool = std::make_shared<ThreadPool>(d.num_threads);
  }
  return d.pool;
}

thread_local RankContext* t_current = nullptr;

RankContext& thread_default_context() {
  thread_local std::unique_ptr<RankContext> own = [] {
    auto c = std::make_unique<RankContext>();
    c->memory = defaults().memory;
    return c;
  }();
  return *own;
}

}  // namespace

RankContext& rank_context() {
  return t_current != nullptr ? *t_current : thread_default_context();
}

std::shared_ptr<RankContext> make_rank_context(int rank, int world_size, int num_threads) {
  auto c = std::make_shared<RankContext>();
  c->rank = rank;
  c->world_size = world_size;
  if (num_threads > 0) c->pool = std::make_shared<ThreadPool>(num_threads);
  c->memory = std::make_shared<MemoryStats>();
  return c;
}

RankContextScope::RankContextScope(std::shared_ptr<RankContext> context)
    : context_(std::move(context)), previous_(t_current) {
  t_current = context_.get();
}

RankContextScope::~RankContextScope() { t_current = previous_; }

int default_num_threads() {
  if (int n = env_int("TESSEL_NUM_THREADS"); n > 0) return n;
  if (int n = env_int("OMP_NUM_THREADS"); n > 0) return n;
  if (int n = env_int("OPENBLAS_NUM_THREADS"); n > 0) return n;
  // The cores this process may run on (its affinity mask, which a container or taskset may
  // narrow), shared evenly with the other workers a launcher started on this node
  // (LOCAL_WORLD_SIZE, as torchrun and `tessel launch` set it): two processes on two cores
  // with two threads each ran a data-parallel step of configs/bench-gpt2.yaml 7% slower
  // than with one each.
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                                : static_cast<int>(std::thread::hardware_concurrency());
  const int workers = std::max(1, env_int("LOCAL_WORLD_SIZE"));
  return std::max(1, cores / workers);
}

void set_default_num_threads(int num_threads) {
  ProcessDefaults& d = defaults();
  std::lock_guard lock(d.mutex);
  d.num_threads = std::max(1, num_threads);
  // OpenBLAS always runs on one thread: its split of a product depends on its thread count,
  // so kernels::gemm tiles products itself on the pool (same bits at any count).
  openblas_set_num_threads(1);
  if (!d.pool || d.pool->num_threads() != d.num_threads) d.pool = std::make_shared<ThreadPool>(d.num_threads);
}

// OpenBLAS's idle workers poll with sched_yield for 2^28 cycles after every threaded call
// before they sleep. A training step calls a GEMM every few milliseconds, so they never sleep,
// and the pollers take the cores from the intra-op pool's kernels in between: with 2 threads,
// attention and GELU ran 1.3-1.8x slower inside a step than alone. 2^4 cycles (OpenBLAS's
// least) makes them sleep at once; waking them costs microseconds per GEMM.
void quiet_blas_workers() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("OPENBLAS_THREAD_TIMEOUT") != nullptr || openblas_read_env == nullptr ||
        blas_thread_shutdown_ == nullptr)
      return;
    ::setenv("OPENBLAS_THREAD_TIMEOUT", "4", 0);
    openblas_read_env();
    blas_thread_shutdown_();
  });
}

std::string blas_kernels_description() {
  const std::string config = openblas_get_config();
  const std::string version = config.substr(0, config.find(' ', config.find(' ') + 1));
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  return fmt::format("{}, {} kernels{}", version, openblas_get_corename(),
                     forced != nullptr && *forced != '\0' ? fmt::format(" (OPENBLAS_CORETYPE={})", forced) : "");
}

std::shared_ptr<ThreadPool> current_pool() {
  RankContext& c = rank_context();
  return c.pool ? c.pool : default_pool();
}

MemoryStats& process_memory() { return *defaults().memory; }

}  // namespace tessel
