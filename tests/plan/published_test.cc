// The planner against the published runs (issue 28, deliverable 3): for every row of every table
// in plan/published.h, the published layout evaluated on its cluster preset with the software
// profile of the stack that ran it, predicted beside published, with each table's mean and max
// error. Asserted: the tables are what their sources print, each row plans, fits and is
// simulated, and issue 28's bar (mean <= 10%, max <= 20%) on each of its three tables —
// Narayanan et al. 2021 Table 1, the Megatron-Core r0.8 H100 table and MT-NLG (the last with the
// deepspeed-megatron-2022 profile calibrated on BLOOM's runs, nothing fitted to MT-NLG:
// docs/plan.md) — and on BLOOM's other layouts (out of sample); BLOOM's calibration rows and
// their check mean 2%, max 5%; Megatron-Core's Mixtral 8x7B row issue 29's bar of 15%.
// Blocks are costed from traces of the runtime (plan/traced.h), as `tessel plan` costs them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cctype>
#include <cstdio>
#include <string>

#include "tessel/engine/trace.h"
#include "tessel/plan/published.h"

using namespace tessel;
using namespace tessel::plan;

namespace {

[[maybe_unused]] const bool traced = (install_block_tracer(), true);

const PublishedTable& table(const std::string& name) {
  static const std::vector<PublishedTable> tables = published_tables();
  for (const PublishedTable& t : tables)
    if (t.name == name) return t;
  throw std::runtime_error("no published table " + name);
}

Cluster cluster_of(const PublishedRun& r) { return published_cluster(r); }

// The FLOPs of one step in the source's count: model FLOPs, or hardware FLOPs with the
// layout's recomputation.
double published_flops(const PublishedRun& r) {
  return step_flops(model_preset(r.model), r.global_batch, r.model_flops ? "none" : r.layout.recompute);
}

// The published step time: as printed, or where the source gives throughput alone, the time
// its TFLOP/s imply for the step's FLOPs (the same count, so the time error is the TFLOP/s one).
double published_seconds(const PublishedRun& r) {
  if (r.iteration_time > 0) return r.iteration_time;
  return published_flops(r) / (r.tflops_per_device * 1e12 * cluster_of(r).devices());
}

}  // namespace

// Each table is what its source prints: the layout covers the cluster, the model presets have
// the sizes the sources name, and the reported figures agree with one another (MFU with
// TFLOP/s over the peak; MT-NLG's TFLOP/s with its iteration times and the 530B FLOP count).
TEST(PublishedTables, RowsAreConsistentWithTheirSources) {
  for (const PublishedTable& t : published_tables()) {
    SCOPED_TRACE(t.name);
    EXPECT_FALSE(t.rows.empty());
    for (const PublishedRun& r : t.rows) {
      SCOPED_TRACE(r.model + " on " + r.cluster);
      const Cluster c = cluster_of(r);
      EXPECT_EQ(r.layout.devices(), c.devices());
      EXPECT_EQ(r.layout.batch_shards() * r.layout.micro_batch * r.layout.micro_batches, r.global_batch);
      if (r.mfu > 0) {
        EXPECT_NEAR(r.tflops_per_device * 1e12 / c.peak(), r.mfu, 0.005);
      }
      if (r.iteration_time > 0) {
        EXPECT_NEAR(published_flops(r) / (r.iteration_time * c.devices()) / 1e12 / r.tflops_per_device, 1.0, 0.01);
      }
    }
  }
  // The README's model sizes from the presets (untied embedding and output layer).
  const std::pair<const char*, double> sizes[] = {
      {"mcore-gpt-1.7b", 1.7e9},  {"mcore-gpt-7.1b", 7.1e9},   {"mcore-gpt-16b", 16e9},
      {"mcore-gpt-32b", 32e9},    {"mcore-gpt-70b", 70e9},     {"mcore-gpt-119b", 119e9},
      {"mcore-gpt-177b", 177e9},  {"mcore-gpt-314b", 314e9},   {"mcore-gpt-462b", 462e9},
      {"mt-nlg-530b", 530e9},
  };
  // The README rounds down: its 1.7B is 1.75B with the learned position table.
  for (const auto& [name, params] : sizes) EXPECT_NEAR(model_preset(name).parameters() / params, 1.0, 0.04) << name;
  EXPECT_EQ(table("megatron-core-r0.8-h100").rows.size(), 9u);
  EXPECT_EQ(table("mt-nlg-530b").rows.size(), 3u);
  // BLOOM: 176.2B parameters (its README: 70 x (12h^2 + 13h) + v x h), tp 4 x pp 12 x dp 8.
  EXPECT_NEAR(model_preset("bloom-176b").parameters() / 176.25e9, 1.0, 0.002);
  EXPECT_EQ(table("bigscience-bloom-176b").rows.at(0).layout.micro_batches, 128);
  EXPECT_EQ(table("bigscience-bloom-176b-reshaping").rows.size(), 5u);
  // Megatron-Core's Mixtral 8x7B mapping: 64 GPUs as TP 1 x EP 8 x PP 4 x DP 2, VP 8, batch 256.
  const PublishedRun& mixtral = table("megatron-core-mixtral-h100").rows.at(0);
  EXPECT_EQ(mixtral.layout.ep, 8);
  EXPECT_EQ(mixtral.layout.dp, 2);
  EXPECT_EQ(mixtral.layout.micro_batches, 16);
  EXPECT_EQ(mixtral.tflops_per_device, 438);
}

// The deepspeed-megatron-2022 profile's calibration, kernel_efficiency and step_overhead, is the
// one pair that predicts BLOOM's two logged iterations (batch 2048: 104.70 s; batch 16, one
// micro-batch per replica: 15.23 s), refitted here by bisection: the constants in software.cc
// must be that fit (to the digits they are written with), so they cannot drift toward the
// MT-NLG rows they are checked against. The big batch pins the kernels, the one-micro-batch
// step what a step costs besides them.
TEST(PublishedTables, DeepSpeedProfileIsCalibratedOnBloomAlone) {
  const PublishedTable& bloom = table("bigscience-bloom-176b");
  ASSERT_GE(bloom.rows.size(), 2u);
  const PublishedRun& big = bloom.rows[0];
  const PublishedRun& one = bloom.rows[1];
  ASSERT_EQ(big.global_batch, 2048);
  ASSERT_EQ(one.layout.micro_batches, 1);
  const ModelSpec m = model_preset(big.model);
  Cluster c = cluster_of(big);
  const double shipped_k = c.software.kernel_efficiency, shipped_s = c.software.step_overhead;
  auto seconds = [&](const PublishedRun& r, double k, double overhead) {
    c.software.kernel_efficiency = k;
    c.software.step_overhead = overhead;
    return evaluate(m, c, r.layout, r.global_batch).step_time;
  };
  // The kernel efficiency that predicts the big batch with a given overhead (time falls as it rises).
  auto k_for = [&](double overhead) {
    double lo = 0.3, hi = 1.0;
    for (int i = 0; i < 24; ++i) {
      const double mid = 0.5 * (lo + hi);
      (seconds(big, mid, overhead) > big.iteration_time ? lo : hi) = mid;
    }
    return 0.5 * (lo + hi);
  };
  // The one-micro-batch step grows with the overhead along that curve.
  double lo = 0, hi = 10;
  ASSERT_LT(seconds(one, k_for(lo), lo), one.iteration_time);
  ASSERT_GT(seconds(one, k_for(hi), hi), one.iteration_time);
  for (int i = 0; i < 24; ++i) {
    const double mid = 0.5 * (lo + hi);
    (seconds(one, k_for(mid), mid) > one.iteration_time ? hi : lo) = mid;
  }
  const double overhead = 0.5 * (lo + hi), k = k_for(overhead);
  std::printf(
      "deepspeed-megatron-2022 fitted on BLOOM's %.2f s and %.2f s: kernel_efficiency %.4f, step_overhead "
      "%.3f s (shipped %.3f, %.3f s)\n",
      big.iteration_time, one.iteration_time, k, overhead, shipped_k, shipped_s);
  EXPECT_NEAR(shipped_k, k, 0.005) << "software.cc's deepspeed-megatron-2022 kernel_efficiency is not BLOOM's fit";
  EXPECT_NEAR(shipped_s, overhead, 0.05) << "software.cc's deepspeed-megatron-2022 step_overhead is not BLOOM's fit";
}

// "dp=48 tp=8 pp=16 vpp=1 mbs=1 z1 sp none 1F1B": the layout in a column's width.
static std::string short_layout(const Layout& l) {
  return "dp=" + std::to_string(l.dp) + (l.ep > 1 ? " ep=" + std::to_string(l.ep) : "") + " tp=" +
         std::to_string(l.tp) + " pp=" + std::to_string(l.pp) + " vpp=" + std::to_string(l.vpp) +
         " mbs=" + std::to_string(l.micro_batch) + " z" +
         std::to_string(l.sharding_stage) + (l.sp ? " sp " : " ") + l.recompute + " " + l.schedule;
}

// Every row's published layout plans on its cluster preset (its schedule played) and is
// compared; the printout is predicted against published per row, the step's breakdown (% of
// the predicted step: compute, exposed tensor-parallel, expert-parallel, pipeline-send, data-parallel
// communication, bubble, optimizer, the profile's fixed time per step) and the table's mean and
// max absolute error.
//
// Memory: every row must fit. (A row that does not is accepted only where the layout keeps no
// attention scores to drop — recompute none with fused attention — and fits once selective
// recompute drops them: the count of the scores is then what is wrong.)
class PublishedTableTest : public ::testing::TestWithParam<const char*> {};

TEST_P(PublishedTableTest, EveryRowPlansAndIsCompared) {
  const PublishedTable& t = table(GetParam());
  std::printf("\n%s: %s\n", t.name.c_str(), t.source.c_str());
  std::printf("%-15s %5s %-44s %8s %8s %7s %8s %8s %6s  %-27s\n", "model", "GPUs", "layout", "TF/s pub", "TF/s prd",
              "error", "s pub", "s pred", "mem GB", "comp/tp/ep/pp/dp/bubble/opt/fixed %");
  double sum = 0, worst = 0;
  int unfit = 0;
  for (const PublishedRun& r : t.rows) {
    SCOPED_TRACE(r.model + " on " + r.cluster);
    const ModelSpec m = model_preset(r.model);
    const Cluster c = cluster_of(r);
    Estimate e;
    ASSERT_NO_THROW(e = evaluate(m, c, r.layout, r.global_batch));
    EXPECT_TRUE(e.simulated);
    if (!e.fits) {
      ++unfit;
      Layout no_scores = r.layout;
      no_scores.recompute = "selective";
      const Estimate s = evaluate(m, c, no_scores, r.global_batch);
      EXPECT_TRUE(r.layout.recompute == "none" && c.software.fused_attention && s.fits)
          << "needs " << e.memory.total() / 1e9 << " GB of " << c.device.memory_bytes / 1e9 << " ("
          << s.memory.total() / 1e9 << " GB without the attention scores)";
    }
    const double predicted = published_flops(r) / e.step_time / c.devices() / 1e12;
    const double error = predicted / r.tflops_per_device - 1;
    sum += std::abs(error);
    worst = std::max(worst, std::abs(error));
    auto pct = [&](double part) { return static_cast<int>(std::lround(100 * part / e.step_time)); };
    std::printf("%-15s %5d %-44s %8.1f %8.1f %+6.1f%% %7.2f%s %8.2f %6.1f  %d/%d/%d/%d/%d/%d/%d/%d%s\n",
                r.model.c_str(), c.devices(), short_layout(r.layout).c_str(), r.tflops_per_device, predicted,
                100 * error, published_seconds(r), r.iteration_time > 0 ? " " : "*", e.step_time,
                e.memory.total() / 1e9, pct(e.compute), pct(e.tp_comm), pct(e.ep_comm), pct(e.pp_comm), pct(e.dp_comm),
                pct(e.bubble), pct(e.optimizer), pct(e.step_overhead),
                e.fits ? "" : "  does not fit (attention scores charged)");
  }
  const double mean = sum / static_cast<double>(t.rows.size());
  std::printf("%s: mean absolute error %.1f%%, max %.1f%% over %zu rows (%s TFLOP/s; * the step time the published "
              "TFLOP/s imply); %d rows over the device memory\n",
              t.name.c_str(), 100 * mean, 100 * worst, t.rows.size(), t.rows.front().model_flops ? "model" : "hardware",
              unfit);
  // Issue 28's bar where a table meets it, and today's figure as a ceiling where it does not yet.
  struct Bar {
    const char* table;
    double mean, max;
  };
  const Bar bars[] = {{"narayanan2021-table1", 0.10, 0.20},
                      {"megatron-core-r0.8-h100", 0.10, 0.20},
                      {"mt-nlg-530b", 0.10, 0.20},
                      {"bigscience-bloom-176b", 0.02, 0.05},
                      {"bigscience-bloom-176b-reshaping", 0.10, 0.20},
                      {"megatron-core-mixtral-h100", 0.15, 0.15}};
  for (const Bar& b : bars) {
    if (t.name != b.table) continue;
    EXPECT_LE(mean, b.mean) << t.name;
    EXPECT_LE(worst, b.max) << t.name;
  }
  RecordProperty("mean_abs_error_pct", std::to_string(100 * mean));
  RecordProperty("max_abs_error_pct", std::to_string(100 * worst));
}

INSTANTIATE_TEST_SUITE_P(Published, PublishedTableTest,
                         ::testing::Values("narayanan2021-table1", "megatron-core-r0.8-h100", "mt-nlg-530b",
                                           "bigscience-bloom-176b", "bigscience-bloom-176b-reshaping",
                                           "megatron-core-mixtral-h100"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           std::string n = i.param;
                           std::replace_if(n.begin(), n.end(), [](char ch) { return !std::isalnum(ch); }, '_');
                           return n;
                         });
