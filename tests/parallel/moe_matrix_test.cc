// Mixture-of-experts training equals single-rank training in every layout (issue 29): a tiny
// Mixtral (4 experts, 2 per token, balancing and z losses on), 10 steps, with the experts split
// over ep = 2 and 4, alone and with dp, tp + sequence parallel, pipelines (1F1B and
// interleaved) and ZeRO stages 1-3, dropless and with a capacity that drops tokens. The oracle is
// the single-rank trainer on the same config: each step's loss to kLossRel, every parameter after
// the last step to kParamRel (the bounds of train_matrix_test.cc). The router's record (tokens per
// expert and dropped per layer, the losses) must be the same numbers as the engine's on one rank:
// routing and dropping are per sequence, so they do not depend on where a sequence is computed.
#include <gtest/gtest.h>

#include <cmath>

#include <fmt/ranges.h>

#include "support/compare.h"
#include "support/reference_trainer.h"
#include "tessel/cli/config.h"
#include "tessel/engine/engine.h"

namespace tessel {
namespace {

constexpr double kLossRel = 0x1p-22;
constexpr double kParamRel = 1e-4;

struct MoeLayout {
  int dp, ep, tp, pp, stage;
  bool sp, capacity;
  const char* schedule;
  int micro_batches;
  int cp = 1;  // context parallel: each rank routes its part of every sequence
  const char* cp_method = "ring";
};

std::string describe(const MoeLayout& l) {
  return fmt::format("dp{} ep{} tp{}{} pp{}{} {} m{} stage{} {}", l.dp, l.ep, l.tp, l.sp ? " sp" : "", l.pp,
                     l.cp > 1 ? fmt::format(" cp{} {}", l.cp, l.cp_method) : "", l.schedule, l.micro_batches, l.stage,
                     l.capacity ? "capacity 1.0" : "dropless");
}

RunConfig moe_config(bool capacity, int micro_batches) {
  return load_run_config(
      std::string(TESSEL_SOURCE_DIR) + "/configs/mixtral-tiny.yaml",
      {"train.steps=10", "train.warmup=2", "train.global_batch=8", "train.seq_len=16", "train.save_every=0",
       "train.threads=1", "log.every=1000", fmt::format("train.micro_batch={}", 8 / micro_batches),
       "model.num_hidden_layers=4", "model.hidden_size=32", "model.num_attention_heads=4", "model.num_key_value_heads=2",
       "model.intermediate_size=32", "model.max_position_embeddings=32", "model.num_local_experts=4",
       "model.num_experts_per_tok=2", "model.router_aux_loss_coef=0.05", "model.router_z_loss_coef=0.01",
       fmt::format("model.capacity_factor={}", capacity ? 1.0 : 0.0)});
}

RunConfig with_layout(RunConfig cfg, const MoeLayout& l) {
  cfg.parallel.dp = l.dp;
  cfg.parallel.ep = l.ep;
  cfg.parallel.tp = l.tp;
  cfg.parallel.pp = l.pp;
  cfg.parallel.sp = l.sp;
  cfg.parallel.sharding_stage = l.stage;
  cfg.parallel.cp = l.cp;
  cfg.parallel.cp_method = l.cp_method;
  cfg.parallel.schedule = l.schedule;
  cfg.parallel.vpp = std::string(l.schedule) == "VPP" ? 2 : 1;
  return cfg;
}

double rel(double got, double want) { return std::abs(got - want) / std::abs(want); }

TEST(MixtureOfExperts, EveryExpertParallelLayoutTrainsLikeOneRank) {
  std::vector<MoeLayout> layouts = {
      {1, 1, 1, 1, 0, false, false, "1F1B", 1}, {2, 1, 1, 1, 0, false, false, "1F1B", 1},
      {1, 2, 1, 1, 0, false, false, "1F1B", 1}, {1, 4, 1, 1, 0, false, true, "1F1B", 1},
      {2, 2, 1, 1, 1, false, true, "1F1B", 2},  {1, 2, 2, 1, 2, true, false, "1F1B", 1},
      {1, 2, 1, 2, 3, false, true, "1F1B", 4},  {1, 4, 1, 2, 0, false, false, "VPP", 2},
      {2, 2, 2, 1, 3, true, true, "1F1B", 2},   {2, 2, 1, 2, 2, false, false, "VPP", 2},
      {2, 1, 2, 1, 0, true, true, "1F1B", 1},
  };
  // Context parallel (dropless: a capacity ranks a sequence's assignments together and is
  // refused with cp): every rank routes its part of each sequence and the ranks add up the
  // sequences' counts, so the router's record is the one-rank record too.
  const std::vector<MoeLayout> with_cp = {
      {1, 1, 1, 1, 0, false, false, "1F1B", 1, 2, "ring"},
      {1, 1, 1, 1, 0, false, false, "1F1B", 1, 2, "all_to_all"},
      {1, 1, 1, 1, 0, false, false, "1F1B", 1, 4, "ring"},
      {1, 2, 1, 1, 0, false, false, "1F1B", 1, 2, "ring"},
      {2, 1, 1, 1, 1, false, false, "1F1B", 2, 2, "ring"},
      {1, 1, 2, 1, 0, true, false, "1F1B", 1, 2, "ring"},
      {1, 2, 1, 2, 2, false, false, "1F1B", 2, 2, "all_to_all"},
      {2, 2, 1, 1, 3, false, false, "1F1B", 2, 2, "ring"},
  };
  layouts.insert(layouts.end(), with_cp.begin(), with_cp.end());
  std::map<std::string, TrainResult> oracles;
  std::map<std::string, Json> one_rank_router;  // the engine's router record on one rank, per step
  for (const MoeLayout& l : layouts) {
    SCOPED_TRACE(describe(l));
    const RunConfig base = moe_config(l.capacity, l.micro_batches);
    const std::string key = fmt::format("{}{}", l.capacity, l.micro_batches);
    if (!oracles.count(key)) {
      oracles[key] = reference_train(base, TrainOptions{.progress = false, .quiet = true, .collect_params = true});
      ParallelTrainResult engine_one = train_parallel_threads(base, 1, ParallelTrainOptions{.base = TrainOptions{.progress = false, .quiet = true}});
      for (const StepRecord& r : engine_one.train.steps) one_rank_router[fmt::format("{}/{}", key, r.step)] = r.moe;
    }
    const TrainResult& one = oracles[key];
    const RunConfig cfg = with_layout(base, l);
    ParallelTrainResult r = train_parallel_threads(
        cfg, static_cast<int>(cfg.parallel.world_size()),
        ParallelTrainOptions{.base = TrainOptions{.progress = false, .quiet = true, .collect_params = true}});
    ASSERT_EQ(r.train.steps.size(), one.steps.size());
    double worst_loss = 0, worst_param = 0, dropped = 0;
    for (size_t s = 0; s < one.steps.size(); ++s) {
      const double d = rel(r.train.steps[s].loss, one.steps[s].loss);
      worst_loss = std::max(worst_loss, d);
      EXPECT_LE(d, kLossRel) << "step " << s << ": loss " << r.train.steps[s].loss << " vs one rank " << one.steps[s].loss;
      // The router's record: counts exactly, the losses to the same bound as the loss.
      const Json& want = one_rank_router.at(fmt::format("{}/{}", key, s));
      const Json& got = r.train.steps[s].moe;
      ASSERT_TRUE(got.is_object()) << "no router record at step " << s;
      dropped += got.at("dropped_fraction").as_double();
      EXPECT_EQ(got.at("dropped_fraction").as_double(), want.at("dropped_fraction").as_double()) << "step " << s;
      EXPECT_LE(rel(got.at("aux_loss").as_double(), want.at("aux_loss").as_double()), 1e-5) << "step " << s;
      EXPECT_LE(rel(got.at("z_loss").as_double(), want.at("z_loss").as_double()), 1e-5) << "step " << s;
      for (size_t layer = 0; layer < want.at("layers").as_array().size(); ++layer)
        EXPECT_EQ(got.at("layers").as_array()[layer].at("tokens_per_expert").dump(),
                  want.at("layers").as_array()[layer].at("tokens_per_expert").dump())
            << "step " << s << " layer " << layer;
    }
    if (l.capacity) {
      EXPECT_GT(dropped, 0) << "the capacity should drop tokens in this test";
    }
    std::string worst_name;
    ASSERT_EQ(r.final_params.size(), one.final_params.size());
    for (const auto& [name, full] : one.final_params) {
      ASSERT_TRUE(r.final_params.count(name)) << name;
      const double d = rel_diff(r.final_params.at(name), full);
      if (d > worst_param) worst_param = d, worst_name = name;
      EXPECT_LE(d, kParamRel) << "parameter " << name;
    }
    std::printf("  %-48s loss rel diff %.1e, parameters %.1e (%s), mean dropped %.2f%%\n", describe(l).c_str(),
                worst_loss, worst_param, worst_name.c_str(), 100 * dropped / static_cast<double>(one.steps.size()));
  }
}

}  // namespace
}  // namespace tessel

namespace tessel {
namespace {

// The ep dim is found by name like the others: dp2·ep2·tp2 with ep declared at other places in
// the mesh (so the expert groups are made of other world ranks) trains like one rank.
TEST(MixtureOfExperts, EpAnywhereInTheMeshTrainsAlike) {
  RunConfig base = moe_config(true, 2);
  base.train.steps = 4;
  const TrainResult one = reference_train(base, TrainOptions{.progress = false, .quiet = true, .collect_params = true});
  for (std::vector<std::string> order :
       {std::vector<std::string>{"pp", "dp", "tp"}, {"ep", "pp", "tp", "dp"}, {"tp", "dp", "pp", "ep"}}) {
    SCOPED_TRACE(fmt::format("mesh [{}]", fmt::join(order, ", ")));
    RunConfig cfg = with_layout(base, {2, 2, 2, 1, 1, true, true, "1F1B", 2});
    cfg.parallel.mesh = order;
    const ParallelTrainResult r = train_parallel_threads(
        cfg, 8, ParallelTrainOptions{.base = TrainOptions{.progress = false, .quiet = true, .collect_params = true}});
    ASSERT_EQ(r.train.steps.size(), one.steps.size());
    for (size_t i = 0; i < one.steps.size(); ++i)
      EXPECT_LE(rel(r.train.steps[i].loss, one.steps[i].loss), kLossRel) << "step " << i;
    for (const auto& [name, full] : one.final_params) EXPECT_LE(rel_diff(r.final_params.at(name), full), kParamRel) << name;
  }
}

}  // namespace
}  // namespace tessel
