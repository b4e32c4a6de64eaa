// bf16 mixed precision (train.precision: bf16, docs/precision.md): products in bf16, norms,
// softmax and the loss in f32, f32 weights, gradients and optimizer states. Its losses stay
// within 1e-2 (relative) of the f32 run's and differ from them (the rounding is real); the
// guarded device and a save/resume give its bits exactly; each layout of the subset gives one
// rank's bf16 losses within the bound below, and the same bits when run again.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
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

// bf16 against f32 over 20 steps: the bar (measured worst: see the note in the test's output).
constexpr double kBf16Rel = 1e-2;

double worst_rel(const std::vector<double>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
  return worst;
}

TrainResult run(const std::string& arch, int steps, std::vector<std::string> sets, TrainOptions o = {}) {
  o.quiet = true;
  return train(parse_run_config(tiny_yaml(arch, steps), sets, "", "test"), o);
}

class Bf16Training : public ::testing::TestWithParam<std::string> {};

TEST_P(Bf16Training, LossesStayWithinOnePercentOfF32AndDifferFromThem) {
  const std::vector<double> f32 = losses(run(GetParam(), 20, {}));
  const std::vector<double> bf16 = losses(run(GetParam(), 20, {"train.precision=bf16"}));
  ASSERT_EQ(bf16.size(), 20u);
  for (double l : bf16) ASSERT_TRUE(std::isfinite(l));
  const double worst = worst_rel(bf16, f32);
  std::printf("  %s: bf16 against f32 over 20 steps, worst loss rel diff %.2e (first %.6f / %.6f, last %.6f / %.6f)\n",
              GetParam().c_str(), worst, bf16.front(), f32.front(), bf16.back(), f32.back());
  EXPECT_LE(worst, kBf16Rel);
  EXPECT_NE(bf16, f32) << "bf16 gave the f32 losses exactly: mixed precision did not run";
}

TEST_P(Bf16Training, TheGuardedDeviceGivesTheCpusBits) {
  const std::vector<double> cpu = losses(run(GetParam(), 4, {"train.precision=bf16"}));
  EXPECT_EQ(losses(run(GetParam(), 4, {"train.precision=bf16", "train.device=guarded"})), cpu);
}

TEST_P(Bf16Training, SaveAndResumeContinueTheTrajectoryBitForBit) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("tessel_bf16_{}_{}", ::getpid(), GetParam());
  fs::remove_all(dir);
  const std::vector<double> all = losses(run(GetParam(), 6, {"train.precision=bf16"}));
  run(GetParam(), 6, {"train.precision=bf16", "train.steps=3", "train.async_save=false"},
      TrainOptions{.save_dir = dir.string()});
  const TrainResult resumed = run(GetParam(), 6, {"train.precision=bf16"}, TrainOptions{.resume_dir = dir.string()});
  EXPECT_EQ(losses(resumed), std::vector<double>(all.begin() + 3, all.end()));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Models, Bf16Training, ::testing::Values("gpt2", "llama", "mixtral"));

// A layout against one rank in bf16. The layouts sum gradients in another order, so the f32
// weights differ in their last bits, which bf16 rounding turns into whole bf16 steps now and
// then: not bit for bit, but within kLayoutRel (measured at most 3.8e-5, tp+sp, 6 steps).
constexpr double kLayoutRel = 2e-4;

using testing::LayoutCase;

class Bf16Layouts : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(Bf16Layouts, TrainLikeOneRankAndRepeatTheirBits) {
  const LayoutCase& c = GetParam();
  std::vector<std::string> sets = c.sets;
  sets.push_back("train.precision=bf16");
  const std::vector<double> one = losses(run(c.arch, 6, {"train.precision=bf16"}));
  const RunConfig cfg = parse_run_config(tiny_yaml(c.arch, 6), sets, "", "test");
  const int n = static_cast<int>(cfg.parallel.world_size());
  ASSERT_GT(n, 1);
  const ParallelTrainOptions opts{.base = TrainOptions{.quiet = true}};
  const std::vector<double> first = losses(train_parallel_threads(cfg, n, opts).train);
  const double worst = worst_rel(first, one);
  std::printf("  %s: bf16 against one rank's bf16, worst loss rel diff %.2e\n", c.name, worst);
  EXPECT_LE(worst, kLayoutRel);
  EXPECT_EQ(losses(train_parallel_threads(cfg, n, opts).train), first) << "the same layout ran twice gave other bits";
}

INSTANTIATE_TEST_SUITE_P(Layouts, Bf16Layouts, ::testing::ValuesIn(testing::layout_subset()),
                         [](const ::testing::TestParamInfo<LayoutCase>& info) { return testing::layout_name(info.param); });

// train.grad_reduce: bf16 sums the dp buckets in bf16: close to the f32 sums' run, not equal.
TEST(Bf16GradReduce, DataParallelBucketsSummedInBf16) {
  const ParallelTrainOptions opts{.base = TrainOptions{.quiet = true}};
  for (const char* stage : {"parallel.sharding_stage=0", "parallel.sharding_stage=2"}) {
    const std::vector<std::string> base{"parallel.dp=2", stage, "train.precision=bf16"};
    std::vector<std::string> bf16_sets = base;
    bf16_sets.push_back("train.grad_reduce=bf16");
    const std::vector<double> f32_sums =
        losses(train_parallel_threads(parse_run_config(tiny_yaml("gpt2", 8), base, "", "test"), 2, opts).train);
    const std::vector<double> bf16_sums =
        losses(train_parallel_threads(parse_run_config(tiny_yaml("gpt2", 8), bf16_sets, "", "test"), 2, opts).train);
    const double worst = worst_rel(bf16_sums, f32_sums);
    std::printf("  %s: gradients summed in bf16 against f32, worst loss rel diff %.2e\n", stage, worst);
    EXPECT_LE(worst, kBf16Rel) << stage;
    EXPECT_NE(bf16_sums, f32_sums) << stage << ": bf16 sums gave the f32 sums' losses exactly";
  }
}

TEST(Bf16Config, BadPrecisionNamesTheKey) {
  for (const char* set : {"train.precision=fp16", "train.grad_reduce=f16"}) {
    try {
      parse_run_config(tiny_yaml("gpt2", 2), {set}, "", "test");
      FAIL() << "accepted " << set;
    } catch (const Error& e) {
      const std::string key = std::string(set).substr(0, std::string(set).find('='));
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("expected f32 or bf16"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(parse_run_config(tiny_yaml("gpt2", 2), {"train.precision=bfloat16"}, "", "test").train.precision, "bf16");
}

}  // namespace
}  // namespace tessel
