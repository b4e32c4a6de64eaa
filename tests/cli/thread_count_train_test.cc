// Single-rank training gives the same bits at any intra-op thread count (docs/development.md):
// the demo GPT-2 (configs/gpt2-tiny.yaml, with dropout on and a smaller batch) for 20 steps at 1
// and at 2 threads has the same loss and gradient norm at every step. Before gemms were tiled
// over tessel's own pool, OpenBLAS's thread count changed the rounding of its products: every
// step's gradient norm and some steps' losses differed by about one float32 ulp.
#include <gtest/gtest.h>

#include "tessel/cli/config.h"
#include "tessel/cli/trainer.h"
#include "tessel/core/context.h"
#include "tessel/core/thread_pool.h"

namespace tessel {
namespace {

TrainResult run_with_threads(int threads) {
  const std::string config = std::string(TESSEL_SOURCE_DIR) + "/configs/gpt2-tiny.yaml";
  RunConfig cfg = load_run_config(config, {"train.steps=20", "train.global_batch=4", "train.micro_batch=4",
                                           "train.dropout=0.1", "train.save_every=0",
                                           "train.threads=" + std::to_string(threads)});
  return train(cfg, TrainOptions{.quiet = true});
}

TEST(TrainThreads, OneAndTwoThreadsGiveTheSameLossesBitForBit) {
  const int before = current_num_threads();
  const TrainResult one = run_with_threads(1);
  const TrainResult two = run_with_threads(2);
  set_default_num_threads(before);
  ASSERT_EQ(one.steps.size(), 20u);
  ASSERT_EQ(two.steps.size(), 20u);
  for (size_t i = 0; i < one.steps.size(); ++i) {
    EXPECT_EQ(one.steps[i].loss, two.steps[i].loss) << "step " << i;
    EXPECT_EQ(one.steps[i].grad_norm, two.steps[i].grad_norm) << "step " << i;
  }
}

}  // namespace
}  // namespace tessel
