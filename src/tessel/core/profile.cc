// Op profiler storage and report.
#include "tessel/core/profile.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <mutex>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace tessel {

namespace {

struct Profile {
  std::mutex mutex;
  std::map<std::string, std::pair<int64_t, int64_t>, std::less<>> totals;  // name -> (ns, calls)
  std::atomic<bool> on{false};
  std::atomic<bool> cpu_time{false};
  Profile() {
    const char* v = std::getenv("TESSEL_PROFILE");
    if (v != nullptr && *v != '\0' && *v != '0') {
      on = true;
      cpu_time = std::string_view(v) == "cpu";
      std::atexit([] {
        std::string r = profile_report();
        if (!r.empty()) std::fputs(r.c_str(), stderr);
      });
    }
  }
};

// Never destroyed: the at-exit report runs after static destructors would have.
Profile& profile() {
  static Profile* p = new Profile();
  return *p;
}

}  // namespace

bool profiling_enabled() { return profile().on.load(std::memory_order_relaxed); }
void set_profiling(bool on) { profile().on = on; }

bool profiling_cpu_time() { return profile().cpu_time.load(std::memory_order_relaxed); }
void set_profiling_cpu_time(bool on) { profile().cpu_time = on; }

int64_t profile_clock_ns() {
  if (profiling_cpu_time()) {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  }
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void profile_add(std::string_view name, int64_t ns) {
  Profile& p = profile();
  std::lock_guard lock(p.mutex);
  auto it = p.totals.find(name);
  if (it == p.totals.end()) it = p.totals.emplace(std::string(name), std::pair<int64_t, int64_t>{0, 0}).first;
  it->second.first += ns;
  it->second.second += 1;
}

std::string profile_report() {
  Profile& p = profile();
  std::lock_guard lock(p.mutex);
  if (p.totals.empty()) return "";
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> rows(p.totals.begin(), p.totals.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  int64_t total = 0;
  for (const auto& r : rows) total += r.second.first;
  std::string out = fmt::format("{:<28} {:>10} {:>8} {:>10} {:>6}{}\n", "op", "total ms", "calls", "us/call", "share",
                                p.cpu_time ? "  (thread CPU time)" : "");
  for (const auto& [name, v] : rows)
    out += fmt::format("{:<28} {:>10.1f} {:>8} {:>10.1f} {:>5.1f}%\n", name, v.first / 1e6, v.second,
                       v.first / 1e3 / static_cast<double>(v.second), 100.0 * static_cast<double>(v.first) / static_cast<double>(total));
  return out;
}

void profile_reset() {
  Profile& p = profile();
  std::lock_guard lock(p.mutex);
  p.totals.clear();
}

}  // namespace tessel
