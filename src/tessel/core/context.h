// The rank context: everything that is per rank rather than per process. Ranks may be
// threads of one process (the thread backend), so grad mode, the autograd sequence counter,
// intra-op threads, memory counters and the state of higher layers (communication world,
// current mesh) hang off a context installed for the rank's thread — never off a global.
//
// A thread with no installed context gets a private default context of its own (sharing the
// process-wide thread pool and memory counters), so helper threads never race on grad mode.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <typeindex>
#include <unordered_map>
#include <vector>

#include "tessel/core/storage.h"

namespace tessel {

class ThreadPool;

struct RankContext {
  int rank = 0;
  int world_size = 1;
  bool grad_enabled = true;
  uint64_t next_seq_nr = 0;                // autograd tape position of the next recorded op
  int backward_depth = 0;                  // backward passes running on this rank (nested: recompute)
  std::shared_ptr<ThreadPool> pool;        // intra-op threads owned by this rank (null: process pool)
  std::shared_ptr<MemoryStats> memory;     // bytes allocated by this rank
  MemoryKind memory_kind = MemoryKind::other;  // what this rank's allocations hold now
  // Tracing (MetaModeScope): storages made now have a size and are charged to `memory` like any
  // other, but hold no bytes; ops infer and cost instead of running their kernels.
  bool meta = false;
  // Recording each op's calls and cost on this rank (ops/trace.h) — always in meta mode, and in
  // a real run inside an OpTraceScope; `op_backward_depth` counts op backwards running (ops they
  // call are theirs, not the step's).
  bool trace_ops = false;
  int op_backward_depth = 0;
  bool summing_grads = false;  // the autograd engine adds gradients (traced as backward work)
  // The rank's device: factories without a device make their tensors there, and an op's
  // kernel runs with its inputs' device current. `stream` is the current stream on it.
  Device device;
  uint64_t stream = 0;
  // bf16 mixed precision (AutocastScope): ops called now pick their compute dtype by kind —
  // products in bf16, norms, softmax and sums in f32, the rest in the widest of their inputs
  // (ops/autocast.h). Off inside kernels, distributed dispatch and backward passes.
  bool autocast = false;

  // State owned by higher layers, keyed by its type (comm world, dist state, ...).
  template <typename T>
  std::shared_ptr<T> get_ext() const {
    auto it = ext_.find(std::type_index(typeid(T)));
    return it == ext_.end() ? nullptr : std::static_pointer_cast<T>(it->second);
  }
  template <typename T>
  void set_ext(std::shared_ptr<T> value) {
    ext_[std::type_index(typeid(T))] = std::move(value);
  }

 private:
  std::unordered_map<std::type_index, std::shared_ptr<void>> ext_;
};

// The calling thread's context.
RankContext& rank_context();

// A fresh context for one rank with `num_threads` intra-op threads (0: the process default).
std::shared_ptr<RankContext> make_rank_context(int rank, int world_size, int num_threads = 0);

// Installs `context` as the calling thread's context for the scope's lifetime.
class RankContextScope {
 public:
  explicit RankContextScope(std::shared_ptr<RankContext> context);
  ~RankContextScope();
  RankContextScope(const RankContextScope&) = delete;
  RankContextScope& operator=(const RankContextScope&) = delete;

 private:
  std::shared_ptr<RankContext> context_;
  RankContext* previous_;
};

// Disables (or enables) gradient recording on this rank for the scope's lifetime.
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : previous_(rank_context().grad_enabled) {
    rank_context().grad_enabled = enabled;
  }
  ~GradModeGuard() { rank_context().grad_enabled = previous_; }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_;
};

// Charges this rank's allocations to `kind` for the scope's lifetime.
class MemoryKindScope {
 public:
  explicit MemoryKindScope(MemoryKind kind) : previous_(rank_context().memory_kind) { rank_context().memory_kind = kind; }
  ~MemoryKindScope() { rank_context().memory_kind = previous_; }
  MemoryKindScope(const MemoryKindScope&) = delete;
  MemoryKindScope& operator=(const MemoryKindScope&) = delete;

 private:
  MemoryKind previous_;
};

// Runs this rank in meta mode (RankContext::meta) for the scope's lifetime: what a step would
// allocate, compute and communicate is recorded from the same code, with no data behind it.
class MetaModeScope {
 public:
  explicit MetaModeScope(bool enabled = true) : previous_(rank_context().meta) { rank_context().meta = enabled; }
  ~MetaModeScope() { rank_context().meta = previous_; }
  MetaModeScope(const MetaModeScope&) = delete;
  MetaModeScope& operator=(const MetaModeScope&) = delete;

 private:
  bool previous_;
};
inline bool meta_mode() { return rank_context().meta; }

// Makes `device` (and its default stream, or `stream`) this rank's current one for the scope.
class DeviceScope {
 public:
  explicit DeviceScope(Device device, uint64_t stream = 0)
      : device_(rank_context().device), stream_(rank_context().stream) {
    rank_context().device = device;
    rank_context().stream = stream;
  }
  ~DeviceScope() {
    rank_context().device = device_;
    rank_context().stream = stream_;
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  Device device_;
  uint64_t stream_;
};
// Turns bf16 mixed precision (RankContext::autocast) on or off for the scope.
class AutocastScope {
 public:
  explicit AutocastScope(bool enabled) : previous_(rank_context().autocast) { rank_context().autocast = enabled; }
  ~AutocastScope() { rank_context().autocast = previous_; }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool previous_;
};
inline bool autocast_enabled() { return rank_context().autocast; }

inline Device current_device() { return rank_context().device; }
inline Stream current_stream() { return Stream{rank_context().device, rank_context().stream}; }

class NoGradGuard : public GradModeGuard {
 public:
  NoGradGuard() : GradModeGuard(false) {}
};

inline bool grad_enabled() { return rank_context().grad_enabled; }

// The cores this process may run on: its affinity mask, which a container or taskset may narrow.
int usable_cores();
// Process defaults: TESSEL_NUM_THREADS, else OMP_NUM_THREADS, else OPENBLAS_NUM_THREADS,
// else the cores of the process's affinity mask divided by LOCAL_WORLD_SIZE (the workers a
// launcher started on this node; at least 1).
int default_num_threads();
// The thread count the environment asks for: TESSEL_NUM_THREADS, else OMP_NUM_THREADS, else
// OPENBLAS_NUM_THREADS (the first positive one), and which variable said so; {0, ""} when none does.
struct EnvThreads {
  int count = 0;
  const char* variable = "";
};
EnvThreads env_num_threads();
// Sets the process default thread count (the default context's pool); OpenBLAS stays on one
// thread, since kernels::gemm splits products over the pool itself.
void set_default_num_threads(int num_threads);
// Makes OpenBLAS's idle worker threads sleep right after each call instead of polling for
// about 0.1 s (unless OPENBLAS_THREAD_TIMEOUT is set). Pollers take the cores from tessel's own
// kernels between GEMMs. Call it first thing in main(): it sets an environment variable.
void quiet_blas_workers();
// "OpenBLAS 0.3.21, Cooperlake kernels": the BLAS library and the kernel set it dispatches to
// (OpenBLAS picks it by CPU model unless OPENBLAS_CORETYPE names one; the sgemm rate depends on it:
// AVX-512 kernels ran 1.85x the AVX2 ones on a Zen 5 core).
std::string blas_kernels_description();

// OpenBLAS (built with DYNAMIC_ARCH, as Debian's is) picks its kernel set by CPU model, and a
// CPU newer than the library falls back to its generic SSE3 set ("Prescott"): Debian 12's
// 0.3.21 does so on Intel's Emerald Rapids (family 6, model 207), where its sgemm then runs at
// a third to a fifth of the AVX-512 set's rate (32 against 107-152 GFLOP/s on one core, 1024^3;
// `tessel bench train configs/bench-gpt2.yaml`: 1449 against 5085 tokens/s). So where
// OPENBLAS_CORETYPE is unset and the library chose a set without AVX2 on a CPU that has
// AVX2 and FMA, tessel switches it, once, when the process starts (before any product), to
// the best set the library holds for what the CPU has: Cooperlake (AVX-512 with BF16),
// SkylakeX (AVX-512 F, CD, BW, DQ, VL), Haswell (AVX2 and FMA). blas_kernels_description()
// says when it did. OPENBLAS_CORETYPE, where set, is always obeyed.
struct CpuFeatures {
  bool avx2_fma = false;     // AVX2 and FMA, with the OS saving the AVX state
  bool avx512 = false;       // AVX-512 F, CD, BW, DQ and VL, with the OS saving the ZMM state
  bool avx512_bf16 = false;  // and AVX-512 BF16
};
CpuFeatures cpu_features();  // this CPU's (all false off x86-64)
// The kernel set to switch to, given the one OpenBLAS detected, the CPU's features and the
// sets the library holds (names as OPENBLAS_CORETYPE spells them); empty: keep the detected.
std::string better_blas_kernels(const std::string& detected, const CpuFeatures& cpu,
                                const std::vector<std::string>& available);
MemoryStats& process_memory();
// The pool the calling thread's parallel loops use.
std::shared_ptr<ThreadPool> current_pool();

}  // namespace tessel
