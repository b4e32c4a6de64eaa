// Per-thread rank contexts and process defaults.
#include "tessel/core/context.h"

#include <cblas.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "tessel/core/thread_pool.h"

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
    if (d.num_threads == 0) {
      d.num_threads = default_num_threads();
      openblas_set_num_threads(d.num_threads);
    }
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
  return std::max(1u, std::thread::hardware_concurrency());
}

void set_default_num_threads(int num_threads) {
  ProcessDefaults& d = defaults();
  std::lock_guard lock(d.mutex);
  d.num_threads = std::max(1, num_threads);
  openblas_set_num_threads(d.num_threads);
  if (!d.pool || d.pool->num_threads() != d.num_threads) d.pool = std::make_shared<ThreadPool>(d.num_threads);
}

std::shared_ptr<ThreadPool> current_pool() {
  RankContext& c = rank_context();
  return c.pool ? c.pool : default_pool();
}

MemoryStats& process_memory() { return *defaults().memory; }

}  // namespace tessel
