// Spin-then-block waiting. A thread that blocks idles its core, and waking it again costs a
// reschedule — on a virtual machine a trip through the hypervisor, which on a busy host can take
// milliseconds (counted as steal time). When every rank has a core of its own, a waiter polls
// for a short budget first: the partner it waits for usually arrives within microseconds.
#pragma once

#include <chrono>
#include <thread>

#include "tessel/core/context.h"

namespace tessel {

// How long a thread-backend waiter polls before it blocks.
inline constexpr std::chrono::microseconds kSpinBudget{5000};

// How long a waiter polls before it blocks when `workers` ranks (threads or processes) compute on
// this process's cores at once: kSpinBudget when each has a core of its own, else `crowded` —
// with more ranks than cores a polling waiter takes the core from the rank it waits for.
inline std::chrono::microseconds spin_budget(int workers, std::chrono::microseconds crowded) {
  return workers <= usable_cores() ? kSpinBudget : crowded;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls `ready` until it returns true or `budget` has passed; returns its last answer. Every
// few microseconds it yields, so that a thread waiting to run on this core (another process's,
// or a rank of an oversubscribed run) is not kept off it by the poll.
template <typename Ready>
bool spin_until(Ready ready, std::chrono::microseconds budget) {
  if (budget.count() <= 0) return ready();
  const auto until = std::chrono::steady_clock::now() + budget;
  for (int i = 0;; ++i) {
    if (ready()) return true;
    cpu_relax();
    if ((i & 63) == 63) {
      if (std::chrono::steady_clock::now() >= until) return ready();
      std::this_thread::yield();
    }
  }
}

}  // namespace tessel
