// Training on the guarded test device (train.device: guarded): the CPU's kernels on memory
// the host may touch only inside them, so any path of a training step — forward, backward,
// loss, optimizer, data, checkpoint save and resume — that reads device memory as host memory
// dies here. Every loss must be the CPU run's, bit for bit.
#include <gtest/gtest.h>

#include <filesystem>

#include "tessel/cli/config.h"
#include "tessel/cli/trainer.h"
#include "tessel/core/error.h"
#include "tessel/engine/engine.h"
#include "tiny_train.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;
using testing::losses;
using testing::tiny_yaml;

class GuardedTraining : public ::testing::TestWithParam<std::string> {};

TEST_P(GuardedTraining, LossesAreTheCpusBitForBit) {
  const TrainResult cpu = train(parse_run_config(tiny_yaml(GetParam(), 6), {}, "", "test"), TrainOptions{.quiet = true});
  const TrainResult guarded =
      train(parse_run_config(tiny_yaml(GetParam(), 6), {"train.device=guarded"}, "", "test"), TrainOptions{.quiet = true});
  ASSERT_EQ(cpu.steps.size(), 6u);
  EXPECT_EQ(losses(guarded), losses(cpu));
}

// Saved on the guarded device after 3 steps, resumed there: the remaining steps are the
// uninterrupted CPU run's.
TEST_P(GuardedTraining, SaveAndResumeContinueTheCpuTrajectory) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("tessel_guarded_{}_{}", ::getpid(), GetParam());
  fs::remove_all(dir);
  const TrainResult cpu = train(parse_run_config(tiny_yaml(GetParam(), 6), {}, "", "test"), TrainOptions{.quiet = true});
  const RunConfig first = parse_run_config(
      tiny_yaml(GetParam(), 6), {"train.device=guarded", "train.steps=3", "train.async_save=false"}, "", "test");
  train(first, TrainOptions{.save_dir = dir.string(), .quiet = true});
  ASSERT_TRUE(fs::exists(dir / "step-000003" / "optimizer.safetensors"));
  const RunConfig rest = parse_run_config(tiny_yaml(GetParam(), 6), {"train.device=guarded"}, "", "test");
  const TrainResult resumed = train(rest, TrainOptions{.resume_dir = dir.string(), .quiet = true});
  ASSERT_EQ(resumed.steps.size(), 3u);
  const std::vector<double> all = losses(cpu);
  EXPECT_EQ(losses(resumed), std::vector<double>(all.begin() + 3, all.end()));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Models, GuardedTraining, ::testing::Values("gpt2", "llama", "mixtral"));

// The layout subset: each layout (thread ranks, each on a guarded device of its own, their
// collectives staged through host copies) gives the same layout's CPU losses, bit for bit.
// (The CPU layouts themselves are checked against one rank by tests/parallel.)
using testing::LayoutCase;

class GuardedLayouts : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(GuardedLayouts, TrainLikeTheSameLayoutOnTheCpu) {
  const LayoutCase& c = GetParam();
  std::vector<std::string> sets = c.sets;
  sets.push_back("train.steps=3");
  const RunConfig cpu = parse_run_config(tiny_yaml(c.arch, 6), sets, "", "test");
  sets.push_back("train.device=guarded");
  const RunConfig guarded = parse_run_config(tiny_yaml(c.arch, 6), sets, "", "test");
  const int n = static_cast<int>(cpu.parallel.world_size());
  ASSERT_GT(n, 1);
  const ParallelTrainOptions opts{.base = TrainOptions{.quiet = true}};
  const std::vector<double> want = losses(train_parallel_threads(cpu, n, opts).train);
  ASSERT_EQ(want.size(), 3u);
  EXPECT_EQ(losses(train_parallel_threads(guarded, n, opts).train), want);
}

INSTANTIATE_TEST_SUITE_P(Layouts, GuardedLayouts, ::testing::ValuesIn(testing::layout_subset()),
                         [](const ::testing::TestParamInfo<LayoutCase>& info) { return testing::layout_name(info.param); });

TEST(GuardedTraining, ABadDeviceNameIsAConfigError) {
  try {
    parse_run_config(tiny_yaml("gpt2", 6), {"train.device=tpu"}, "", "test");
    FAIL() << "accepted train.device=tpu";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.device"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'tpu'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel
