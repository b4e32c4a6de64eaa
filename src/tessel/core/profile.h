// A process-wide op profiler: when TESSEL_PROFILE=1 (or enabled in code), dispatch and the
// backward engine add each op's wall time under its name, and the table is printed to stderr
// at exit (or on demand). Costs one branch per op when off.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessel {

bool profiling_enabled();
void set_profiling(bool on);
void profile_add(std::string_view name, int64_t nanoseconds);
// The table of totals, sorted by time (empty when nothing was recorded).
std::string profile_report();
void profile_reset();

// Times a scope under `name` when profiling is on.
class ProfileScope {
 public:
  explicit ProfileScope(std::string_view name) : name_(name), on_(profiling_enabled()) {
    if (on_) start_ = std::chrono::steady_clock::now();
  }
  ~ProfileScope() {
    if (on_)
      profile_add(name_, std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count());
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  std::string_view name_;
  bool on_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tessel
