// A process-wide op profiler: when TESSEL_PROFILE=1 (or enabled in code), dispatch and the
// backward engine add each op's wall time under its name, and the table is printed to stderr
// at exit (or on demand). TESSEL_PROFILE=cpu adds the calling thread's CPU time instead: with
// more thread ranks than cores a rank's wall time includes the slices other ranks ran on its
// core, its CPU time does not (work an op hands to other threads is not counted then). Costs
// one branch per op when off.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tessel {

bool profiling_enabled();
void set_profiling(bool on);
// Whether scopes time the calling thread's CPU time rather than wall time (TESSEL_PROFILE=cpu).
bool profiling_cpu_time();
void set_profiling_cpu_time(bool on);
// Now, on the clock scopes use: steady wall time, or the calling thread's CPU time.
int64_t profile_clock_ns();
void profile_add(std::string_view name, int64_t nanoseconds);
// The table of totals, sorted by time (empty when nothing was recorded).
std::string profile_report();
void profile_reset();

// Times a scope under `name` when profiling is on.
class ProfileScope {
 public:
  explicit ProfileScope(std::string_view name) : name_(name), on_(profiling_enabled()) {
    if (on_) start_ = profile_clock_ns();
  }
  ~ProfileScope() {
    if (on_) profile_add(name_, profile_clock_ns() - start_);
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  std::string_view name_;
  bool on_;
  int64_t start_ = 0;
};

}  // namespace tessel
