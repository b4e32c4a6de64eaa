// Every layout `tessel plan` can emit is one `tessel train` accepts. The planner's own
// enumeration (plan::candidate_layouts: what search ranks and --format yaml prints the best
// of) for GPT-2 tiny (configs/gpt2-tiny.yaml) on one node of 1 to 8 ranks (none fit 5 or 7), every schedule and
// recompute kind: each layout, taken into a training config the two ways the CLI does — the
// `parallel:` YAML as --set overrides, and apply_layout (--plan auto) — loads, passes
// ParallelConfig::validate with the same degrees, and needs as many ranks as the cluster has.
// One layout of each (dp, tp, pp, vpp, schedule), its other fields cycled through their
// values, then trains a step on thread ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <sstream>
#include <tuple>

#include "support/reference_trainer.h"
#include "tessel/engine/engine.h"
#include "tessel/cli/plan_support.h"
#include "tessel/plan/planner.h"

namespace tessel {
namespace {

const std::string kConfig = std::string(TESSEL_SOURCE_DIR) + "/configs/gpt2-tiny.yaml";

// "parallel:\n  dp: 2\n ..." -> {"parallel.dp=2", ...}
std::vector<std::string> yaml_as_sets(const std::string& yaml) {
  std::vector<std::string> sets;
  std::istringstream in(yaml);
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (line.rfind("  ", 0) != 0 || colon == std::string::npos) continue;
    sets.push_back("parallel." + line.substr(2, colon - 2) + "=" + line.substr(colon + 2));
  }
  return sets;
}

void expect_degrees(const parallel::ParallelConfig& p, const plan::Layout& l) {
  EXPECT_EQ(p.dp, l.dp);
  EXPECT_EQ(p.tp, l.tp);
  EXPECT_EQ(p.pp, l.pp);
  EXPECT_EQ(p.vpp, l.vpp);
  EXPECT_EQ(p.sharding_stage, l.sharding_stage);
  EXPECT_EQ(p.sp, l.sp);
  EXPECT_EQ(p.micro_batches, l.micro_batches);
  EXPECT_EQ(p.schedule, l.schedule);
  EXPECT_EQ(p.recompute, l.recompute);
  EXPECT_EQ(p.bucket_mb, l.bucket_mb);
  EXPECT_EQ(p.ep, l.ep);
  EXPECT_EQ(p.cp, l.cp);
  if (l.cp > 1) {
    EXPECT_EQ(p.cp_method, l.cp_method);
  }
}

TEST(PlanLayouts, EveryLayoutThePlannerCanEmitTrains) {
  const RunConfig base = load_run_config(kConfig);
  const plan::ModelSpec model = model_spec_of(base);
  const int64_t blocks = base.model.gpt2.n_layer, batch = base.train.global_batch;
  // Small and short for the training step: the layouts depend on the degrees, not the width.
  const std::vector<std::string> quick = {"train.steps=1", "train.warmup=0", "train.seq_len=16", "train.save_every=0",
                                          "train.threads=1", "log.every=1000", "model.n_embd=32", "model.n_positions=16"};
  int64_t checked = 0, trained = 0;
  std::set<std::string> recomputes_seen;
  for (int ranks = 1; ranks <= 8; ++ranks) {
    // As `--cluster local:N`: one node of N devices sharing this machine's cores.
    plan::Cluster cluster = plan::cluster_preset(fmt::format("dgx-a100-80g:{}", ranks));
    cluster.cores_per_node = 2;
    plan::PlanOptions o;
    o.global_batch = batch;
    o.schedules = {"FThenB", "1F1B", "VPP", "ZBH1"};  // search's defaults and the one --layout adds
    // (dp, tp, pp, vpp, schedule, cp, cp_method) trained
    std::set<std::tuple<int, int, int, int, std::string, int, std::string>> shapes;
    const std::vector<plan::Layout> layouts = plan::candidate_layouts(model, cluster, o);
    // 5 and 7 ranks: no degrees fit (the global batch 16 and the 4 heads; 4 layers < 5 stages).
    EXPECT_EQ(layouts.empty(), ranks == 5 || ranks == 7) << ranks << " ranks";
    for (const plan::Layout& l : layouts) {
      SCOPED_TRACE(fmt::format("{} ranks: {}", ranks, l.str()));
      ASSERT_EQ(l.devices(), ranks);
      recomputes_seen.insert(l.recompute);
      // `tessel plan --format yaml`, pasted into the config (here as --set overrides).
      std::vector<std::string> sets = yaml_as_sets(plan::parallel_yaml(l));
      // ep, and cp with its method, only where used.
      ASSERT_EQ(sets.size(), 10u + (l.ep > 1 ? 1 : 0) + (l.cp > 1 ? 2 : 0)) << plan::parallel_yaml(l);
      RunConfig from_yaml;
      ASSERT_NO_THROW(from_yaml = load_run_config(kConfig, sets));
      expect_degrees(from_yaml.parallel, l);
      EXPECT_EQ(from_yaml.train.micro_batch, l.dp * l.micro_batch);  // rows of a global micro-batch
      EXPECT_EQ(from_yaml.parallel.world_size(), ranks);
      EXPECT_NO_THROW(from_yaml.parallel.validate(blocks, batch));
      // `tessel train --plan auto`: the layout applied to the loaded config.
      RunConfig applied = base;
      apply_layout(applied, l);
      expect_degrees(applied.parallel, l);
      EXPECT_EQ(applied.train.micro_batch, from_yaml.train.micro_batch);
      EXPECT_NO_THROW(applied.parallel.validate(blocks, batch));
      EXPECT_EQ(base.model.gpt2.n_head % l.tp, 0);  // the trainer gives each tp rank whole heads
      ++checked;

      // One training step of the first layout of each shape, its other fields cycled.
      // Context parallel: one of each degree and method, the rest as without it.
      const auto shape = l.cp > 1 ? std::tuple{0, 0, 0, 0, std::string(), l.cp, l.cp_method}
                                  : std::tuple{l.dp, l.tp, l.pp, l.vpp, l.schedule, 1, std::string()};
      if (!shapes.insert(shape).second) continue;
      const size_t k = shapes.size();
      plan::Layout run = l;
      run.recompute = std::array{"none", "selective", "full"}[k % 3];
      run.sp = l.tp > 1 && k % 2 == 1;
      run.sharding_stage = l.dp > 1 ? static_cast<int>(k % 4) : 0;
      std::vector<std::string> run_sets = quick;
      for (const std::string& s : yaml_as_sets(plan::parallel_yaml(run))) run_sets.push_back(s);
      const RunConfig cfg = load_run_config(kConfig, run_sets);
      const TrainOptions opts{.progress = false, .quiet = true};
      const double loss = ranks == 1 ? reference_train(cfg, opts).steps.at(0).loss
                                     : train_parallel_threads(cfg, ranks, ParallelTrainOptions{.base = opts})
                                           .train.steps.at(0)
                                           .loss;
      EXPECT_TRUE(std::isfinite(loss) && loss > 0) << loss;
      ++trained;
    }
  }
  EXPECT_EQ(recomputes_seen, (std::set<std::string>{"none", "selective", "full"}));
  std::printf("%lld planner layouts of gpt2-tiny on 1-8 ranks load and validate; %lld of them trained a step\n",
              static_cast<long long>(checked), static_cast<long long>(trained));
}

}  // namespace
}  // namespace tessel
