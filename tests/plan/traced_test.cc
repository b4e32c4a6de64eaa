// Traced costs (issue 28, deliverable 1): the planner costs a transformer block from the runtime's
// step traced in meta mode (plan/traced.h, engine/trace.h). Here the block the planner traces is
// checked against the runtime itself: what it charges a layer's tensor-parallel collectives is
// what the comm layer counts in real steps of the same layouts (a two-block model's step less a
// one-block model's), and what it adds for recompute is what the runtime's recompute reruns.
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "tessel/comm/world.h"
#include "tessel/core/context.h"
#include "tessel/dist/mesh_comm.h"
#include "tessel/engine/trace.h"
#include "tessel/plan/cluster.h"
#include "tessel/plan/planner.h"
#include "tessel/plan/traced.h"

using namespace tessel;

namespace {

plan::ModelSpec tiny(bool llama) {
  return llama ? plan::llama_spec("llama-tiny", 2, 32, 4, 2, 64, 256, 16) : plan::gpt_spec("gpt-tiny", 2, 32, 4, 256, 16);
}

// The bytes on mesh dim `dim`'s group in one real training step of `layers` blocks (thread
// ranks): rank 0's, or summed over every rank.
std::map<std::string, int64_t> real_bytes(const plan::ModelSpec& m, const plan::LayerShape& s, int layers,
                                          const std::string& dim = "tp", bool every_rank = false) {
  RunConfig cfg = block_trace_config(m, s, layers);
  cfg.data.path = std::string(TESSEL_SOURCE_DIR) + "/data/kjv.txt";
  cfg.train.steps = 2;
  std::map<std::string, int64_t> out;
  std::mutex mu;
  std::map<std::string, int64_t> before;
  ParallelTrainOptions opts{.base = TrainOptions{.progress = false, .quiet = true}};
  opts.on_step = [&](const StepRecord& rec) {
    if (current_world_rank() != 0 && !every_rank) return;
    const parallel::Layout layout(cfg.parallel, current_world_rank());
    const std::string group = layout.group(dim)->name();
    std::lock_guard lock(mu);
    for (const GroupStats& g : world_group()->stats_by_group()) {
      if (g.name != group) continue;
      for (const auto& [kind, e] : g.stats.ops) (rec.step == 0 ? before[kind] : out[kind]) += e.bytes;
    }
  };
  train_parallel_threads(cfg, static_cast<int>(cfg.parallel.world_size()), opts);
  for (auto& [kind, b] : out) b -= before[kind];
  return out;
}

}  // namespace

TEST(TracedCosts, ALayersTensorParallelTrafficIsWhatRealStepsCount) {
  install_block_tracer();
  for (bool llama : {false, true})
    for (bool sp : {false, true}) {
      SCOPED_TRACE(fmt::format("{} sp {}", llama ? "llama" : "gpt", sp));
      const plan::ModelSpec m = tiny(llama);
      plan::LayerShape s;
      s.micro_batch = 2;
      s.tp = 2;
      s.sp = sp;
      std::map<std::string, int64_t> two = real_bytes(m, s, 2), one = real_bytes(m, s, 1);
      std::map<std::string, int64_t> real;
      for (const auto& [kind, b] : two)
        if (b - one[kind] != 0) real[kind] = b - one[kind];
      std::map<std::string, int64_t> charged;
      for (const plan::TracedCollective& x : plan::traced_block(m, s).comm)
        if (x.dim == "tp") charged[x.kind] += x.bytes;
      EXPECT_EQ(charged, real);
      ASSERT_FALSE(real.empty());
      // The layer cost charges those bytes (f32 here: the trace's own precision).
      plan::Cluster c = plan::cluster_preset("dgx-a100-80g:8");
      c.dtype = "f32";
      s.tp_group = plan::GroupSpan{2, 2};
      int64_t total = 0;
      for (const auto& [kind, b] : real) total += b;
      EXPECT_DOUBLE_EQ(plan::layer_cost(m, c, s).tp_bytes, static_cast<double>(total));
    }
}

// A sparse block (Mixtral's, four experts, two per token) over ep = 2: traced with a balanced
// router, its dispatch and combine (and their gradients) carry per rank what the real steps'
// exchanges carry on average over the expert ranks — the router of a real step sends more to one
// rank than the other, but every row comes back — and the layer cost charges those bytes.
TEST(TracedCosts, ASparseLayersExpertTrafficIsWhatRealStepsCountOnAverage) {
  install_block_tracer();
  const plan::ModelSpec m = plan::mixtral_spec("mixtral-tiny", 2, 32, 4, 2, 64, 256, 16, 4, 2);
  plan::LayerShape s;
  s.micro_batch = 2;
  s.moe = true;
  s.ep = 2;
  std::map<std::string, int64_t> two = real_bytes(m, s, 2, "ep", true), one = real_bytes(m, s, 1, "ep", true);
  const double real = static_cast<double>(two["all_to_all"] - one["all_to_all"]) / s.ep;
  ASSERT_GT(real, 0);
  double charged = 0;
  for (const plan::TracedCollective& x : plan::traced_block(m, s).comm)
    if (x.dim == "ep" && x.kind == "all_to_all") charged += static_cast<double>(x.bytes);
  // The token counts ahead of the rows (an i64 per expert, each way) are the same either way.
  EXPECT_DOUBLE_EQ(charged, real);
  plan::Cluster c = plan::cluster_preset("dgx-a100-80g:8");
  c.dtype = "f32";
  s.ep_group = plan::GroupSpan{2, 2};
  const plan::LayerCost lc = plan::layer_cost(m, c, s);
  EXPECT_DOUBLE_EQ(lc.ep_bytes, real);
  EXPECT_GT(lc.ep_fwd, 0);
  EXPECT_GT(lc.imbalance, 1);
}

// A context-parallel block (Llama tiny, cp = 2): the ring's key/value and gradient messages, or
// the all_to_all reshards to head shards and back, that the layer cost charges are what the comm
// layer counts between real steps of a two-block and a one-block model on rank 0's cp group.
TEST(TracedCosts, AContextParallelLayersTrafficIsWhatRealStepsCount) {
  install_block_tracer();
  for (const char* method : {"ring", "all_to_all"}) {
    SCOPED_TRACE(method);
    const plan::ModelSpec m = tiny(true);
    plan::LayerShape s;
    s.micro_batch = 2;
    s.cp = 2;
    s.cp_method = method;
    std::map<std::string, int64_t> two = real_bytes(m, s, 2, "cp"), one = real_bytes(m, s, 1, "cp");
    const std::string kind = s.cp_method == "ring" ? "send" : "all_to_all";
    const double real = static_cast<double>(two[kind] - one[kind]);
    ASSERT_GT(real, 0);
    plan::Cluster c = plan::cluster_preset("dgx-a100-80g:8");
    c.dtype = "f32";
    s.cp_group = plan::GroupSpan{2, 2};
    const plan::LayerCost lc = plan::layer_cost(m, c, s);
    EXPECT_DOUBLE_EQ(lc.cp_bytes, real);
    EXPECT_GT(lc.cp_fwd + lc.cp_hidden, 0);
  }
}

// tessel's own runtime (an f32 cluster): a layout the planner reports is costed with its traced
// step's data-parallel and pipeline traffic. Those collectives — what dp_comm and pp_comm are
// timed from — are what the comm layer counts on the same rank in a real step of the layout,
// kind by kind, calls and bytes.
TEST(TracedCosts, TheStepsDataAndPipelineTrafficChargedIsWhatARealStepCounts) {
  install_block_tracer();
  for (bool llama : {false, true})
    for (auto [text, devices] : {std::pair{"dp=2", 2}, {"dp=2,sharding_stage=2", 2}, {"dp=2,pp=2,sharding_stage=1", 4},
                                 {"dp=1,tp=2,pp=2,sp=true", 4}, {"dp=4,sharding_stage=3", 4},
                                 {"dp=2,tp=2,pp=2,sharding_stage=3,sp=true", 8}}) {
      SCOPED_TRACE(fmt::format("{} {}", llama ? "llama" : "gpt", text));
      const plan::ModelSpec m = tiny(llama);
      const int64_t batch = 8;
      const plan::Layout layout = plan::parse_layout(text, batch, devices);
      plan::Cluster c = plan::cluster_preset(fmt::format("dgx-a100-80g:{}", layout.devices()));
      c.dtype = "f32";
      const plan::Estimate e = plan::evaluate(m, c, layout, batch);
      ASSERT_GE(e.traced_rank, 0);
      // The same layout, really trained (two steps; the second one's counts).
      plan::LayerShape whole;
      RunConfig cfg = block_trace_config(m, whole, static_cast<int>(m.layers));
      cfg.train.global_batch = batch;
      apply_layout(cfg, e.layout);
      cfg.data.path = std::string(TESSEL_SOURCE_DIR) + "/data/kjv.txt";
      cfg.train.steps = 2;
      std::mutex mu;
      std::vector<GroupStats> first, second;
      double copied = -1;  // the second step's bucket copies on the traced rank, as its ops recorded them
      ParallelTrainOptions opts{.base = TrainOptions{.progress = false, .quiet = true}};
      opts.on_step = [&](const StepRecord& rec) {
        if (current_world_rank() != e.traced_rank) return;
        std::lock_guard lock(mu);
        (rec.step == 0 ? first : second) = world_group()->stats_by_group();
        if (rec.step == 0) {
          reset_op_trace();
          rank_context().trace_ops = true;
        } else {
          copied = op_trace().bytes("bucket_copy");
        }
      };
      train_parallel_threads(cfg, static_cast<int>(cfg.parallel.world_size()), opts);
      RankTrace real;
      real.rank = e.traced_rank;
      for (GroupStats g : second) {
        for (const GroupStats& b : first)
          if (b.name == g.name) g.stats = g.stats - b.stats;
        if (!g.stats.ops.empty()) real.groups.push_back(std::move(g));
      }
      auto charged = [](const std::vector<plan::TracedCollective>& all) {
        std::map<std::string, std::pair<int64_t, int64_t>> out;  // "dim kind" -> calls, bytes
        for (const plan::TracedCollective& x : all)
          if (x.dim == "dp" || x.dim == "pp") out[x.dim + " " + x.kind] = {x.calls, x.bytes};
        return out;
      };
      const auto want = charged(collectives_by_dim(real, cfg.parallel));
      EXPECT_EQ(charged(e.step_collectives), want);
      EXPECT_FALSE(want.empty());
      // The optimizer's copies around its buckets: charged as many bytes as the real step's
      // packing recorded, at least every gradient summed over dp once (f32, read and written).
      EXPECT_EQ(e.step_copy_bytes, copied);
      if (layout.dp > 1) {
        EXPECT_GT(e.dp_comm + e.dp_hidden, 0);
        EXPECT_GE(e.step_copy_bytes, 2 * e.memory.params);
      }
    }
}

TEST(TracedCosts, FullRecomputeRerunsTheBlocksForward) {
  const plan::ModelSpec m = tiny(false);
  plan::LayerShape s;
  s.micro_batch = 2;
  s.tp = 2;
  s.recompute = "full";
  auto block = [&](int layers) { return trace_rank_step(block_trace_config(m, s, layers), 0, 1).ops.calls; };
  const std::vector<OpCallRecord> two = block(2), one = block(1);
  // Per op: forward calls of the second block, and its calls rerun in the backward.
  std::map<std::string, int> fwd, rerun;
  for (const auto* list : {&two, &one})
    for (const OpCallRecord& r : *list) {
      if (r.backward || r.op == "add_" || r.op == "adamw_update" || r.op == "sum_squares") continue;
      (r.recompute ? rerun : fwd)[r.op] += list == &two ? 1 : -1;
    }
  std::erase_if(fwd, [](const auto& kv) { return kv.second == 0; });
  std::erase_if(rerun, [](const auto& kv) { return kv.second == 0; });
  EXPECT_FALSE(fwd.empty());
  EXPECT_EQ(rerun, fwd);
}

// The search screens its candidates on several threads, which trace the blocks they need as
// they go: what it offers does not depend on how many threads, nor on which traced a block.
TEST(TracedCosts, SearchOffersTheSamePlansOnAnyNumberOfThreads) {
  const plan::ModelSpec m = plan::model_preset("mixtral-8x7b");
  const plan::Cluster c = plan::cluster_preset("dgx-h100:64");
  auto run = [&](int threads) {
    plan::set_block_tracer(nullptr);
    install_block_tracer();  // an empty cache of traced blocks: this search traces them anew
    plan::PlanOptions o;
    o.global_batch = 256;
    o.top = 5;
    o.threads = threads;
    return plan::search(m, c, o);
  };
  const plan::SearchResult one = run(1), three = run(3);
  EXPECT_EQ(one.candidates, three.candidates);
  EXPECT_EQ(one.feasible, three.feasible);
  EXPECT_EQ(one.simulated, three.simulated);
  ASSERT_EQ(one.best.size(), three.best.size());
  ASSERT_FALSE(one.best.empty());
  for (size_t i = 0; i < one.best.size(); ++i) {
    SCOPED_TRACE(one.best[i].layout.str());
    EXPECT_EQ(one.best[i].layout.str(), three.best[i].layout.str());
    EXPECT_EQ(one.best[i].step_time, three.best[i].step_time);
    EXPECT_EQ(one.best[i].memory.total(), three.best[i].memory.total());
    EXPECT_EQ(one.best[i].mapping.order, three.best[i].mapping.order);
  }
  std::printf("mixtral-8x7b on 64 H100s: %lld candidates, best %s on 1 and 3 threads (%.2f / %.2f s)\n",
              static_cast<long long>(one.candidates), one.best.front().layout.str().c_str(), one.seconds,
              three.seconds);
}
