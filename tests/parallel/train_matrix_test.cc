// Hybrid-parallel training equals single-rank training. GPT-2 tiny and Llama tiny, 10 steps,
// every pair of values of dp, tp, pp, sharding stage, sp, schedule, micro-batches, model,
// dropout and optimizer (AdamW, SGD with Nesterov momentum) covered by some layout (a greedy
// pairwise covering set), plus the full corner dp2·tp2·pp2·stage 3·sp·interleaved. The oracle
// is the single-rank trainer on the same config: the loss at every step, every parameter after
// the last and the validation loss (held-out tail, at steps 0, 4, 8 and 10; forward only
// through the pipeline) must agree to 1e-4 (relative).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/ranges.h>

#include "tessel/cli/parallel_trainer.h"
#include "tessel/cli/trainer.h"

namespace tessel {
namespace {

struct Layout {
  int dp, tp, pp, stage, sp, schedule, mb4, llama, dropout, sgd;
};
const char* kSchedules[] = {"FThenB", "1F1B", "VPP", "ZBH1"};
constexpr int kFields = 10;  // of Layout

std::string describe(const Layout& l) {
  return fmt::format("{} dp{} tp{} pp{} stage{} sp{} {} m{} dropout{} {}", l.llama ? "llama" : "gpt2", l.dp, l.tp, l.pp,
                     l.stage, l.sp, kSchedules[l.schedule], l.mb4 ? 4 : 1, l.dropout, l.sgd ? "sgd" : "adamw");
}

bool valid(const Layout& l) {
  // The interleaved schedule needs micro-batches in multiples of the pipeline ranks.
  return !(l.schedule == 2 && l.pp == 2 && !l.mb4);
}

// Greedy pairwise covering: repeatedly take the layout that covers most uncovered value pairs.
std::vector<Layout> pairwise_layouts() {
  const std::vector<std::vector<int>> values = {{1, 2}, {1, 2}, {1, 2}, {0, 1, 2, 3}, {0, 1},
                                                {0, 1, 2, 3}, {0, 1}, {0, 1}, {0, 1}, {0, 1}};
  std::vector<Layout> all;
  for (int a : values[0]) for (int b : values[1]) for (int c : values[2]) for (int d : values[3]) for (int e : values[4])
    for (int f : values[5]) for (int g : values[6]) for (int h : values[7]) for (int i : values[8])
      for (int j : values[9]) {
        Layout l{a, b, c, d, e, f, g, h, i, j};
        if (valid(l)) all.push_back(l);
      }
  auto fields = [](const Layout& l) {
    return std::vector<int>{l.dp, l.tp, l.pp, l.stage, l.sp, l.schedule, l.mb4, l.llama, l.dropout, l.sgd};
  };
  std::set<std::tuple<int, int, int, int>> uncovered;
  for (const Layout& l : all) {
    auto f = fields(l);
    for (int i = 0; i < kFields; ++i)
      for (int j = i + 1; j < kFields; ++j) uncovered.insert({i, f[i], j, f[j]});
  }
  std::vector<Layout> chosen;
  while (!uncovered.empty()) {
    const Layout* best = nullptr;
    int best_gain = 0;
    for (const Layout& l : all) {
      auto f = fields(l);
      int gain = 0;
      for (int i = 0; i < kFields; ++i)
        for (int j = i + 1; j < kFields; ++j) gain += uncovered.count({i, f[i], j, f[j]}) ? 1 : 0;
      if (gain > best_gain) {
        best_gain = gain;
        best = &l;
      }
    }
    auto f = fields(*best);
    for (int i = 0; i < kFields; ++i)
      for (int j = i + 1; j < kFields; ++j) uncovered.erase({i, f[i], j, f[j]});
    chosen.push_back(*best);
  }
  chosen.push_back(Layout{2, 2, 2, 3, 1, 2, 1, 0, 1, 0});  // the full corner, GPT-2
  chosen.push_back(Layout{2, 2, 2, 3, 1, 2, 1, 1, 0, 1});  // and Llama
  return chosen;
}

RunConfig config_for(const Layout& l) {
  std::vector<std::string> sets = {"train.steps=10", "train.warmup=2", "train.global_batch=8", "train.seq_len=16",
                                   "train.save_every=0", "train.threads=1", "log.every=1000",
                                   "data.val_fraction=0.05", "train.eval_every=4", "train.eval_batches=2",
                                   fmt::format("train.micro_batch={}", l.mb4 ? 2 : 8),
                                   fmt::format("train.dropout={}", l.dropout ? 0.1 : 0.0)};
  // SGD's steps are lr x the clipped gradient: a large rate so that a wrong gradient shows.
  if (l.sgd) {
    for (const char* s : {"train.optimizer=sgd", "train.lr=0.2", "train.momentum=0.9", "train.nesterov=true"})
      sets.push_back(s);
  }
  std::string path = std::string(TESSEL_SOURCE_DIR) + (l.llama ? "/configs/llama-tiny.yaml" : "/configs/gpt2-tiny.yaml");
  if (l.llama) {
    for (const char* s : {"model.num_hidden_layers=4", "model.hidden_size=32", "model.num_attention_heads=4",
                          "model.num_key_value_heads=2", "model.intermediate_size=64", "model.max_position_embeddings=32"})
      sets.push_back(s);
    sets.erase(std::remove(sets.begin(), sets.end(), fmt::format("train.dropout={}", l.dropout ? 0.1 : 0.0)), sets.end());
  } else {
    for (const char* s : {"model.n_layer=4", "model.n_embd=32", "model.n_head=4", "model.n_positions=32"}) sets.push_back(s);
  }
  return load_run_config(path, sets);
}

RunConfig with_layout(RunConfig cfg, const Layout& l) {
  cfg.parallel.dp = l.dp;
  cfg.parallel.tp = l.tp;
  cfg.parallel.pp = l.pp;
  cfg.parallel.vpp = l.schedule == 2 && l.pp == 2 ? 2 : 1;
  cfg.parallel.sharding_stage = l.stage;
  cfg.parallel.sp = l.sp != 0;
  cfg.parallel.schedule = kSchedules[l.schedule];
  return cfg;
}

double rel_diff(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_doubles(), y = b.to_doubles();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-12);
}

TEST(HybridParallel, EveryLayoutTrainsLikeOneRank) {
  std::map<std::string, TrainResult> oracles;  // by model/dropout/micro-batches
  const std::vector<Layout> layouts = pairwise_layouts();
  std::printf("%zu layouts (pairwise cover + corners)\n", layouts.size());
  for (const Layout& l : layouts) {
    SCOPED_TRACE(describe(l));
    RunConfig base = config_for(l);
    const std::string key = fmt::format("{}{}{}{}", l.llama, l.dropout, l.mb4, l.sgd);
    if (!oracles.count(key)) oracles[key] = train(base, TrainOptions{.progress = false, .quiet = true, .collect_params = true});
    const TrainResult& one = oracles[key];

    const RunConfig cfg = with_layout(base, l);
    ParallelTrainResult r = train_parallel_threads(
        cfg, static_cast<int>(cfg.parallel.world_size()),
        ParallelTrainOptions{.base = TrainOptions{.progress = false, .quiet = true, .collect_params = true}});
    ASSERT_EQ(r.train.steps.size(), one.steps.size());
    double worst_loss = 0, worst_param = 0;
    std::string worst_name;
    for (size_t s = 0; s < one.steps.size(); ++s) {
      const double d = std::abs(r.train.steps[s].loss - one.steps[s].loss) / std::abs(one.steps[s].loss);
      worst_loss = std::max(worst_loss, d);
      EXPECT_LE(d, 1e-4) << "step " << s << ": loss " << r.train.steps[s].loss << " vs one rank " << one.steps[s].loss;
    }
    ASSERT_EQ(r.train.validation.size(), one.validation.size());
    double worst_val = 0;
    for (size_t i = 0; i < one.validation.size(); ++i) {
      const auto& [step, want] = one.validation[i];
      EXPECT_EQ(r.train.validation[i].first, step);
      const double d = std::abs(r.train.validation[i].second - want) / std::abs(want);
      worst_val = std::max(worst_val, d);
      EXPECT_LE(d, 1e-4) << "validation after " << step << " updates: " << r.train.validation[i].second
                         << " vs one rank " << want;
    }
    ASSERT_EQ(r.final_params.size(), one.final_params.size());
    for (const auto& [name, full] : one.final_params) {
      ASSERT_TRUE(r.final_params.count(name)) << name;
      const double d = rel_diff(r.final_params.at(name), full);
      if (d > worst_param) {
        worst_param = d;
        worst_name = name;
      }
      EXPECT_LE(d, 1e-4) << "parameter " << name;
    }
    std::printf("  %-52s loss rel diff %.1e, validation %.1e, parameters %.1e (%s)\n", describe(l).c_str(), worst_loss,
                worst_val, worst_param, worst_name.c_str());
  }
}

// model.init_from: every rank reads its pieces of the weights from one safetensors file (here
// a single-rank checkpoint after 3 steps) and the run continues as one rank started from that
// file does.
TEST(HybridParallel, StartsFromAWeightsFileLikeOneRank) {
  const std::string dir = ::testing::TempDir() + "/tessel-init-from";
  std::filesystem::remove_all(dir);
  for (int llama : {0, 1}) {
    const Layout corner{2, 2, 2, 3, 1, 2, 1, llama, 0, 0};
    SCOPED_TRACE(describe(corner));
    RunConfig first = config_for(corner);
    first.train.steps = 3;
    first.train.eval_every = 0;
    const TrainResult saved = train(first, TrainOptions{.save_dir = dir, .progress = false, .quiet = true});
    ASSERT_FALSE(saved.last_checkpoint.empty());
    RunConfig base = config_for(corner);
    const TrainResult fresh = train(base, TrainOptions{.progress = false, .quiet = true});
    base.model.init_from = saved.last_checkpoint + "/model.safetensors";
    const TrainResult one = train(base, TrainOptions{.progress = false, .quiet = true, .collect_params = true});
    // The file was read: the first loss is that of the trained weights, not of a fresh init.
    EXPECT_LT(one.steps[0].loss, fresh.steps[0].loss - 0.05);
    ParallelTrainResult r = train_parallel_threads(
        with_layout(base, corner), 8,
        ParallelTrainOptions{.base = TrainOptions{.progress = false, .quiet = true, .collect_params = true}});
    ASSERT_EQ(r.train.steps.size(), one.steps.size());
    for (size_t i = 0; i < one.steps.size(); ++i)
      EXPECT_LE(std::abs(r.train.steps[i].loss - one.steps[i].loss) / one.steps[i].loss, 1e-4) << "step " << i;
    for (const auto& [name, full] : one.final_params) EXPECT_LE(rel_diff(r.final_params.at(name), full), 1e-4) << name;
    std::filesystem::remove_all(dir);
  }
}

// Mesh dims are found by name: the same training with the world's dims declared in other
// orders (so every rank holds other coordinates, and the groups along each dim are made of
// other world ranks) gives the losses and parameters of the default order and of one rank.
TEST(HybridParallel, MeshDimsInAnyOrderTrainAlike) {
  const Layout corner{2, 2, 2, 3, 1, 2, 1, 0, 1, 0};
  RunConfig base = config_for(corner);
  base.train.steps = 4;
  base.train.eval_every = 0;
  const TrainResult one = train(base, TrainOptions{.progress = false, .quiet = true, .collect_params = true});
  std::vector<ParallelTrainResult> runs;
  for (std::vector<std::string> order : {std::vector<std::string>{"pp", "dp", "tp"}, {"tp", "pp", "dp"}, {"dp", "tp", "pp"}}) {
    SCOPED_TRACE(fmt::format("mesh [{}]", fmt::join(order, ", ")));
    RunConfig cfg = with_layout(base, corner);
    cfg.parallel.mesh = order;
    runs.push_back(train_parallel_threads(
        cfg, 8, ParallelTrainOptions{.base = TrainOptions{.progress = false, .quiet = true, .collect_params = true}}));
    const ParallelTrainResult& r = runs.back();
    ASSERT_EQ(r.train.steps.size(), one.steps.size());
    for (size_t i = 0; i < one.steps.size(); ++i) {
      EXPECT_LE(std::abs(r.train.steps[i].loss - one.steps[i].loss) / one.steps[i].loss, 1e-4) << "step " << i;
      // Against the default order: the same groups reduce in the same order, so the same bits.
      EXPECT_EQ(r.train.steps[i].loss, runs.front().train.steps[i].loss) << "step " << i;
    }
    for (const auto& [name, full] : one.final_params) {
      ASSERT_TRUE(r.final_params.count(name)) << name;
      EXPECT_LE(rel_diff(r.final_params.at(name), full), 1e-4) << name;
      EXPECT_EQ(rel_diff(r.final_params.at(name), runs.front().final_params.at(name)), 0.0) << name;
    }
  }
}

}  // namespace
}  // namespace tessel

namespace tessel {
namespace {

// ZeRO (Rajbhandari et al. 2020) with f32 parameters and gradients and AdamW's two f32
// moments: per rank, Ψ parameters hold 4Ψ + 4Ψ + 8Ψ bytes at stage 0; stage 1 shards the 8Ψ
// of optimizer states over N data-parallel ranks, stage 2 also the gradients, stage 3 also the
// parameters.
TEST(HybridParallel, StateBytesFollowTheZeroFormulas) {
  for (int dp : {2, 4}) {
    for (int stage = 0; stage <= 3; ++stage) {
      RunConfig cfg = load_run_config(std::string(TESSEL_SOURCE_DIR) + "/configs/gpt2-tiny.yaml",
                                      {"train.steps=1", "train.warmup=0", "train.global_batch=8", "train.micro_batch=8",
                                       "train.seq_len=16", "train.save_every=0", "train.threads=1", "model.n_layer=2",
                                       "model.n_embd=64", "model.n_head=2", "model.n_positions=16"});
      cfg.parallel.dp = dp;
      cfg.parallel.sharding_stage = stage;
      const double psi = static_cast<double>(build_model(cfg)->num_parameters()), n = dp;
      ParallelTrainResult r = train_parallel_threads(cfg, dp, ParallelTrainOptions{.base = TrainOptions{.quiet = true}});
      const double expect_params = 4 * psi / (stage >= 3 ? n : 1), expect_grads = 4 * psi / (stage >= 2 ? n : 1),
                   expect_states = 8 * psi / (stage >= 1 ? n : 1);
      const parallel::StateBytes& b = r.state_bytes;
      const double got = static_cast<double>(b.params + b.grads + b.optimizer), expect = expect_params + expect_grads + expect_states;
      std::printf("dp %d stage %d: parameters %lld (formula %.0f), gradients %lld (%.0f), states %lld (%.0f): %.2f%% off\n",
                  dp, stage, static_cast<long long>(b.params), expect_params, static_cast<long long>(b.grads), expect_grads,
                  static_cast<long long>(b.optimizer), expect_states, 100 * std::abs(got - expect) / expect);
      EXPECT_NEAR(got, expect, 0.05 * expect) << "dp " << dp << " stage " << stage;
      EXPECT_NEAR(static_cast<double>(b.params), expect_params, 0.05 * expect_params);
      EXPECT_NEAR(static_cast<double>(b.grads), expect_grads, 0.05 * expect_grads);
      EXPECT_NEAR(static_cast<double>(b.optimizer), expect_states, 0.05 * expect_states);
    }
  }
}

}  // namespace
}  // namespace tessel
