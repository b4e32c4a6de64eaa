// Per-thread rank contexts and process defaults.
#include "tessel/core/context.h"

#include <cblas.h>
#include <dlfcn.h>
#include <sched.h>
#include <strings.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <algorithm>
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

// What choose_blas_kernels did: the kernel set OpenBLAS detected and the one tessel switched
// it to (both empty when it kept OpenBLAS's choice).
struct BlasChoice {
  std::string detected, chosen;
};

BlasChoice& blas_choice() {
  static BlasChoice c;
  return c;
}

// See better_blas_kernels (context.h). OpenBLAS chooses its kernel set in a constructor that
// runs when the library is loaded, before this one; gotoblas_dynamic_quit forgets the choice
// and gotoblas_dynamic_init makes it again, reading OPENBLAS_CORETYPE (both exported by
// DYNAMIC_ARCH builds; the kernel tables are exported as gotoblas_<SET>). Found by dlsym, so a
// BLAS without them (another build, another library) is left alone.
void choose_blas_kernels() {
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (forced != nullptr && *forced != '\0') return;
  using Hook = void (*)();
  const auto quit = reinterpret_cast<Hook>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
  const auto init = reinterpret_cast<Hook>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
  if (quit == nullptr || init == nullptr || blas_thread_shutdown_ == nullptr) return;
  std::vector<std::string> available;
  const std::pair<const char*, const char*> sets[] = {
      {"Cooperlake", "gotoblas_COOPERLAKE"}, {"SkylakeX", "gotoblas_SKYLAKEX"}, {"Haswell", "gotoblas_HASWELL"}};
  for (const auto& [set, table] : sets)
    if (dlsym(RTLD_DEFAULT, table) != nullptr) available.emplace_back(set);
  const std::string detected = openblas_get_corename();
  const std::string better = better_blas_kernels(detected, cpu_features(), available);
  if (better.empty()) return;
  // OpenBLAS's constructor has started its worker threads, and a worker that starts late reads
  // the kernel table (its buffer's offsets) — null between quit and init: three launched test
  // processes of a CI run died of it. So the workers are stopped (joined) first; they start
  // again at the next threaded call. Nothing else runs yet, so setenv is safe too.
  blas_thread_shutdown_();
  ::setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  quit();
  init();
  ::unsetenv("OPENBLAS_CORETYPE");
  blas_choice() = {detected, openblas_get_corename()};
}

// Before main: no product has run yet.
[[maybe_unused]] const bool kBlasKernelsChosen = (choose_blas_kernels(), true);

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

EnvThreads env_num_threads() {
  for (const char* name : {"TESSEL_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"})
    if (int n = env_int(name); n > 0) return {n, name};
  return {};
}

int default_num_threads() {
  if (EnvThreads e = env_num_threads(); e.count > 0) return e.count;
  // The usable cores shared evenly with the other workers a launcher started on this node
  // (LOCAL_WORLD_SIZE, as torchrun and `tessel launch` set it): two processes on two cores
  // with two threads each ran a data-parallel step of configs/bench-gpt2.yaml 7% slower
  // than with one each.
  const int workers = std::max(1, env_int("LOCAL_WORLD_SIZE"));
  return std::max(1, usable_cores() / workers);
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
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
  std::string why;
  if (forced != nullptr && *forced != '\0')
    why = fmt::format(" (OPENBLAS_CORETYPE={})", forced);
  else if (!blas_choice().chosen.empty())
    why = fmt::format(" (chosen by tessel for this CPU; OpenBLAS detected {})", blas_choice().detected);
  return fmt::format("{}, {} kernels{}", version, openblas_get_corename(), why);
}

CpuFeatures cpu_features() {
  CpuFeatures f;
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return f;
  const bool fma = (c & (1u << 12)) != 0, osxsave = (c & (1u << 27)) != 0, avx = (c & (1u << 28)) != 0;
  if (!osxsave || !avx) return f;
  uint32_t xcr0 = 0, xcr0_high = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
  const bool ymm = (xcr0 & 0x6u) == 0x6u;    // the OS saves the SSE and AVX state
  const bool zmm = (xcr0 & 0xe6u) == 0xe6u;  // and the opmask and ZMM state
  if (!ymm || __get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return f;
  const unsigned max_subleaf = a;
  f.avx2_fma = fma && (b & (1u << 5)) != 0;
  // AVX-512 F (16), DQ (17), CD (28), BW (30), VL (31)
  const unsigned avx512 = (1u << 16) | (1u << 17) | (1u << 28) | (1u << 30) | (1u << 31);
  f.avx512 = f.avx2_fma && zmm && (b & avx512) == avx512;
  if (f.avx512 && max_subleaf >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0)
    f.avx512_bf16 = (a & (1u << 5)) != 0;
#endif
  return f;
}

std::string better_blas_kernels(const std::string& detected, const CpuFeatures& cpu,
                                const std::vector<std::string>& available) {
  // OpenBLAS's sets with AVX2 kernels or wider: whichever of them it chose stands.
  static const char* const kModern[] = {"Haswell", "Zen", "Excavator", "SkylakeX", "Cooperlake", "SapphireRapids"};
  for (const char* m : kModern)
    if (strcasecmp(detected.c_str(), m) == 0) return {};
  const std::pair<bool, const char*> ranked[] = {
      {cpu.avx512_bf16, "Cooperlake"}, {cpu.avx512, "SkylakeX"}, {cpu.avx2_fma, "Haswell"}};
  for (const auto& [has, set] : ranked)
    if (has && std::find(available.begin(), available.end(), set) != available.end()) return set;
  return {};
}

std::shared_ptr<ThreadPool> current_pool() {
  RankContext& c = rank_context();
  return c.pool ? c.pool : default_pool();
}

MemoryStats& process_memory() { return *defaults().memory; }

}  // namespace tessel
