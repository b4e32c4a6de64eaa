// The op profiler's two clocks: wall time (TESSEL_PROFILE=1) counts a scope's sleep, the
// calling thread's CPU time (TESSEL_PROFILE=cpu) does not but counts its work; and the table
// says which clock it shows.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "tessel/core/profile.h"

namespace tessel {
namespace {

// Milliseconds recorded under `name` in the report's table ("name  total_ms  calls ...").
double recorded_ms(const std::string& report, const std::string& name) {
  size_t at = report.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(report.substr(at + 1 + name.size()));
}

class ProfileClock : public ::testing::Test {
 protected:
  void SetUp() override {
    profile_reset();
    set_profiling(true);
  }
  void TearDown() override {
    set_profiling(false);
    set_profiling_cpu_time(false);
    profile_reset();
  }
};

void sleep_in_scope() {
  ProfileScope scope("sleep");
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
}

// Spins until the calling thread has used `ms` of CPU time by the profiler's own clock.
volatile double sink = 0;
void work_in_scope(int ms) {
  ProfileScope scope("work");
  const int64_t until = profile_clock_ns() + int64_t{ms} * 1'000'000;
  while (profile_clock_ns() < until)
    for (int i = 0; i < 1000; ++i) sink = sink + 1e-9 * i;
}

TEST_F(ProfileClock, WallTimeCountsASleep) {
  sleep_in_scope();
  const std::string report = profile_report();
  EXPECT_GE(recorded_ms(report, "sleep"), 60) << report;
  EXPECT_EQ(report.find("thread CPU time"), std::string::npos) << report;
}

TEST_F(ProfileClock, CpuTimeLeavesOutASleepButCountsWork) {
  set_profiling_cpu_time(true);
  sleep_in_scope();
  work_in_scope(20);
  const std::string report = profile_report();
  EXPECT_GE(recorded_ms(report, "sleep"), 0) << report;
  EXPECT_LT(recorded_ms(report, "sleep"), 30) << "a sleeping thread uses no CPU time\n" << report;
  EXPECT_GE(recorded_ms(report, "work"), 20) << report;
  EXPECT_NE(report.find("(thread CPU time)"), std::string::npos) << report;
}

}  // namespace
}  // namespace tessel
