// default_num_threads: an explicit count wins (TESSEL_NUM_THREADS, OMP_NUM_THREADS,
// OPENBLAS_NUM_THREADS, in that order); otherwise the process's cores are shared evenly with
// the other workers a launcher started on the node (LOCAL_WORLD_SIZE), at least one each.
#include <gtest/gtest.h>

#include <sched.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "tessel/core/context.h"

namespace tessel {
namespace {

// Sets (or, with nullopt, unsets) environment variables for one test and restores them.
class Env {
 public:
  void set(const char* name, std::optional<std::string> value) {
    if (!saved_.count(name)) {
      const char* was = std::getenv(name);
      saved_[name] = was != nullptr ? std::optional<std::string>(was) : std::nullopt;
    }
    if (value)
      ::setenv(name, value->c_str(), 1);
    else
      ::unsetenv(name);
  }
  ~Env() {
    for (const auto& [name, value] : saved_) {
      if (value)
        ::setenv(name.c_str(), value->c_str(), 1);
      else
        ::unsetenv(name.c_str());
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

int affinity_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  return CPU_COUNT(&set);
}

TEST(DefaultNumThreads, SharesTheCoresWithTheLaunchersOtherWorkers) {
  Env env;
  for (const char* name : {"TESSEL_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"})
    env.set(name, std::nullopt);
  const int cores = affinity_cores();
  env.set("LOCAL_WORLD_SIZE", std::nullopt);
  EXPECT_EQ(default_num_threads(), cores);
  env.set("LOCAL_WORLD_SIZE", "1");
  EXPECT_EQ(default_num_threads(), cores);
  env.set("LOCAL_WORLD_SIZE", std::to_string(cores));
  EXPECT_EQ(default_num_threads(), 1);
  env.set("LOCAL_WORLD_SIZE", std::to_string(4 * cores + 3));  // more workers than cores: one each
  EXPECT_EQ(default_num_threads(), 1);
  if (cores >= 2) {
    env.set("LOCAL_WORLD_SIZE", "2");
    EXPECT_EQ(default_num_threads(), cores / 2);
  }
}

TEST(DefaultNumThreads, AnExplicitCountWins) {
  Env env;
  env.set("LOCAL_WORLD_SIZE", "64");
  env.set("TESSEL_NUM_THREADS", std::nullopt);
  env.set("OMP_NUM_THREADS", std::nullopt);
  env.set("OPENBLAS_NUM_THREADS", "5");
  EXPECT_EQ(default_num_threads(), 5);
  env.set("OMP_NUM_THREADS", "4");
  EXPECT_EQ(default_num_threads(), 4);
  env.set("TESSEL_NUM_THREADS", "3");
  EXPECT_EQ(default_num_threads(), 3);
}

}  // namespace
}  // namespace tessel
