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
#include "tessel/plan/traced.h"

using namespace tessel;

namespace {

plan::ModelSpec tiny(bool llama) {
  return llama ? plan::llama_spec("llama-tiny", 2, 32, 4, 2, 64, 256, 16) : plan::gpt_spec("gpt-tiny", 2, 32, 4, 256, 16);
}

// Rank 0's bytes on its tp group in one real training step of `layers` blocks (thread ranks).
std::map<std::string, int64_t> real_tp_bytes(const plan::ModelSpec& m, const plan::LayerShape& s, int layers) {
  RunConfig cfg = block_trace_config(m, s, layers);
  cfg.data.path = std::string(TESSEL_SOURCE_DIR) + "/data/kjv.txt";
  cfg.train.steps = 2;
  std::map<std::string, int64_t> out;
  std::mutex mu;
  std::map<std::string, int64_t> before;
  ParallelTrainOptions opts{.base = TrainOptions{.progress = false, .quiet = true}};
  opts.on_step = [&](const StepRecord& rec) {
    if (current_world_rank() != 0) return;
    const parallel::Layout layout(cfg.parallel, 0);
    const std::string tp = layout.group("tp")->name();
    std::lock_guard lock(mu);
    for (const GroupStats& g : world_group()->stats_by_group()) {
      if (g.name != tp) continue;
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
      std::map<std::string, int64_t> two = real_tp_bytes(m, s, 2), one = real_tp_bytes(m, s, 1);
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
