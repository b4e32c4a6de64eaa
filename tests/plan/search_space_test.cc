// The planner only proposes what runs (issue 28, deliverable 4): every layout of the search
// space, for small models on clusters of 1 to 16 devices, written as `tessel plan --format yaml`
// writes it (plan::parallel_yaml) into the model's training config, must pass `tessel train`'s
// config validation (cli/config.cc, parallel::ParallelConfig::validate), build the pipeline
// schedule the engine builds from it, and give the same parallel section as `tessel train
// --plan auto` copies from a plan (apply_layout) — so the two can never disagree. That holds
// for expert parallel on a tiny Mixtral (ep dividing its 8 experts, the batch over dp x ep) and
// for context parallel by ring and all_to_all on the dense models (issues 29 and 30).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tessel/cli/config.h"
#include "tessel/cli/plan_support.h"
#include "tessel/parallel/schedule.h"
#include "tessel/plan/planner.h"

using namespace tessel;

namespace {

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Case {
  const char* config;   // under configs/
  int64_t global_batch;
  std::vector<int> devices;
};

}  // namespace

TEST(SearchSpace, EveryCandidateIsAcceptedByTesselTrain) {
  const std::filesystem::path configs = std::filesystem::path(TESSEL_SOURCE_DIR) / "configs";
  const Case cases[] = {
      {"gpt2-tiny.yaml", 16, {1, 2, 3, 4, 6, 8, 12, 16}},
      {"llama-tiny.yaml", 16, {1, 2, 4, 8, 16}},
      {"gpt2-tiny.yaml", 12, {2, 3, 4, 6, 12}},
      {"mixtral-tiny.yaml", 16, {1, 2, 4, 8, 16}},
  };
  int64_t checked = 0, with_ep = 0, with_cp_ring = 0, with_cp_a2a = 0;
  for (const Case& k : cases) {
    const std::string base = read_text(configs / k.config);
    ASSERT_FALSE(base.empty()) << k.config;
    const std::vector<std::string> sizes = {"train.global_batch=" + std::to_string(k.global_batch),
                                            "train.micro_batch=" + std::to_string(k.global_batch)};
    RunConfig config = parse_run_config(base, sizes, configs.string(), k.config);
    const plan::ModelSpec m = model_spec_of(config);
    for (int n : k.devices) {
      SCOPED_TRACE(std::string(k.config) + " on " + std::to_string(n) + " devices, batch " +
                   std::to_string(k.global_batch));
      for (const char* preset : {"dgx-a100-80g", "dgx-h100"}) {
        plan::Cluster c = plan::cluster_preset(std::string(preset) + ":" + std::to_string(n));
        plan::PlanOptions o;
        o.global_batch = k.global_batch;
        o.schedules = {"1F1B", "VPP", "ZBH1", "FThenB"};
        const std::vector<plan::Layout> space = plan::candidate_layouts(m, c, o);
        EXPECT_FALSE(space.empty());
        for (plan::Layout l : space) {
          SCOPED_TRACE(l.str());
          // The bucket as the planner sets it for this layout's data-parallel group.
          l.bucket_mb = plan::evaluate(m, c, l, k.global_batch, false).layout.bucket_mb;
          RunConfig parsed;
          ASSERT_NO_THROW(parsed = parse_run_config(base + plan::parallel_yaml(l), sizes, configs.string(), k.config))
              << plan::parallel_yaml(l);
          const parallel::ParallelConfig& pc = parsed.parallel;
          EXPECT_EQ(pc.world_size(), n);
          EXPECT_EQ(pc.ep, l.ep);
          EXPECT_EQ(pc.cp, l.cp);
          if (l.cp > 1) {
            EXPECT_EQ(pc.cp_method, l.cp_method);
          }
          EXPECT_EQ(parsed.train.micro_batch, static_cast<int64_t>(l.dp) * l.ep * l.micro_batch);
          with_ep += l.ep > 1;
          with_cp_ring += l.cp > 1 && l.cp_method == "ring";
          with_cp_a2a += l.cp > 1 && l.cp_method == "all_to_all";
          EXPECT_NO_THROW(parallel::make_schedule(pc.pp == 1 && pc.schedule == "VPP" ? "1F1B" : pc.schedule,
                                                  static_cast<int>(pc.pp), static_cast<int>(pc.micro_batches),
                                                  static_cast<int>(pc.vpp)));
          // --plan auto's copy of the same layout is the same parallel section.
          RunConfig automatic = config;
          apply_layout(automatic, l);
          const parallel::ParallelConfig& ac = automatic.parallel;
          EXPECT_EQ(ac.str(), pc.str());
          EXPECT_EQ(ac.bucket_mb, pc.bucket_mb);
          EXPECT_EQ(automatic.train.micro_batch, parsed.train.micro_batch);
          ++checked;
        }
      }
    }
  }
  std::printf("%lld candidate layouts accepted (%lld with ep > 1, %lld with ring cp, %lld with all_to_all cp)\n",
              static_cast<long long>(checked), static_cast<long long>(with_ep), static_cast<long long>(with_cp_ring),
              static_cast<long long>(with_cp_a2a));
  EXPECT_GT(checked, 1000);
  EXPECT_GT(with_ep, 100);
  EXPECT_GT(with_cp_ring, 100);
  EXPECT_GT(with_cp_a2a, 100);
}
