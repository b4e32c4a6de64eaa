// What a training step asks of the network, counted by the comm layer: for GPT-2 tiny and
// Llama tiny over a matrix of layouts (dp, tp, pp, ZeRO stage, sequence parallel), the
// collectives each rank issues in one steady step (the counters' difference between the ends
// of steps 2 and 3) and the payload bytes they carry, against the figures recorded in
// comm_counts_base.txt (at the commit before the SPMD rules priced their layouts as a whole).
// A rule change may make a step cheaper, never dearer: per layout and rank, calls and bytes
// must not exceed the recorded ones. TESSEL_RECORD_COMM_COUNTS=1 rewrites the file.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "support/reference_trainer.h"
#include "tessel/cli/config.h"
#include "tessel/comm/world.h"
#include "tessel/core/context.h"
#include "tessel/ops/trace.h"
#include "tessel/dist/mesh_comm.h"
#include "tessel/engine/engine.h"
#include "tessel/engine/trace.h"
#include "tessel/parallel/layout.h"

namespace tessel {
namespace {

struct Layout {
  bool llama;
  int dp, tp, pp, stage, sp;
  int cp = 1;                 // context parallel
  const char* cp_method = "ring";
};

std::string name(const Layout& l) {
  std::string out = fmt::format("{}-dp{}-tp{}-pp{}-z{}-sp{}", l.llama ? "llama" : "gpt2", l.dp, l.tp, l.pp, l.stage, l.sp);
  if (l.cp > 1) out += fmt::format("-cp{}-{}", l.cp, l.cp_method);
  return out;
}

RunConfig config_for(const Layout& l) {
  std::vector<std::string> sets = {"train.steps=3", "train.warmup=1", "train.global_batch=8", "train.seq_len=16",
                                   "train.save_every=0", "train.threads=1", "log.every=1000", "train.eval_every=0", "data.val_fraction=0.05",
                                   fmt::format("train.micro_batch={}", 2 * l.dp)};
  std::string path = std::string(TESSEL_SOURCE_DIR) + (l.llama ? "/configs/llama-tiny.yaml" : "/configs/gpt2-tiny.yaml");
  if (l.llama) {
    for (const char* s : {"model.num_hidden_layers=2", "model.hidden_size=32", "model.num_attention_heads=4",
                          "model.num_key_value_heads=2", "model.intermediate_size=64", "model.max_position_embeddings=32"})
      sets.push_back(s);
  } else {
    for (const char* s : {"model.n_layer=2", "model.n_embd=32", "model.n_head=4", "model.n_positions=32"}) sets.push_back(s);
  }
  RunConfig cfg = load_run_config(path, sets);
  cfg.parallel.dp = l.dp;
  cfg.parallel.tp = l.tp;
  cfg.parallel.pp = l.pp;
  cfg.parallel.sharding_stage = l.stage;
  cfg.parallel.sp = l.sp != 0;
  cfg.parallel.cp = l.cp;
  cfg.parallel.cp_method = l.cp_method;
  cfg.parallel.schedule = "1F1B";
  return cfg;
}

struct Count {
  int64_t calls = 0, bytes = 0;
};

// Per rank: the calls and bytes of the last step.
std::map<int64_t, Count> count_step(const Layout& l) {
  const RunConfig cfg = config_for(l);
  std::mutex m;
  std::map<int64_t, std::vector<Count>> cumulative;
  ParallelTrainOptions opts{.base = TrainOptions{.progress = false, .quiet = true}};
  opts.on_step = [&](const StepRecord&) {
    CommStats s = mesh_comm_stats();
    Count c;
    for (const auto& [op, e] : s.ops) c.calls += e.calls, c.bytes += e.bytes;
    std::lock_guard lock(m);
    cumulative[current_world_rank()].push_back(c);
  };
  train_parallel_threads(cfg, static_cast<int>(cfg.parallel.world_size()), opts);
  std::map<int64_t, Count> out;
  for (const auto& [rank, v] : cumulative) {
    EXPECT_EQ(v.size(), 3u) << name(l) << " rank " << rank;
    if (v.size() < 2) continue;
    out[rank] = Count{v.back().calls - v[v.size() - 2].calls, v.back().bytes - v[v.size() - 2].bytes};
  }
  return out;
}

const std::vector<Layout> kLayouts = [] {
  std::vector<Layout> out;
  for (bool llama : {false, true})
    for (Layout l : {Layout{false, 2, 1, 1, 0, 0}, Layout{false, 1, 2, 1, 0, 0}, Layout{false, 1, 2, 1, 0, 1},
                     Layout{false, 2, 2, 1, 1, 1}, Layout{false, 2, 2, 1, 3, 0}, Layout{false, 1, 2, 2, 0, 1},
                     Layout{false, 2, 1, 2, 2, 0}, Layout{false, 2, 2, 2, 3, 1}, Layout{false, 1, 4, 1, 0, 1},
                     Layout{false, 4, 1, 1, 3, 0}}) {
      l.llama = llama;
      out.push_back(l);
    }
  return out;
}();

TEST(CommCounts, TrainingStepIssuesNoMoreThanRecorded) {
  const std::string path = std::string(TESSEL_SOURCE_DIR) + "/tests/dist/comm_counts_base.txt";
  std::map<std::string, Count> base;  // "layout rank" -> count
  {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream ss(line);
      std::string layout;
      int64_t rank = 0;
      Count c;
      ss >> layout >> rank >> c.calls >> c.bytes;
      base[layout + " " + std::to_string(rank)] = c;
    }
  }
  const bool record = std::getenv("TESSEL_RECORD_COMM_COUNTS") != nullptr;
  std::string recorded = "# layout rank calls bytes: one steady training step, per rank (comm_counts_test.cc)\n";
  int64_t total_calls = 0, total_bytes = 0, base_calls = 0, base_bytes = 0;
  for (const Layout& l : kLayouts) {
    SCOPED_TRACE(name(l));
    int64_t calls = 0, bytes = 0, bcalls = 0, bbytes = 0;
    for (const auto& [rank, c] : count_step(l)) {
      recorded += fmt::format("{} {} {} {}\n", name(l), rank, c.calls, c.bytes);
      calls += c.calls, bytes += c.bytes;
      if (record) continue;
      auto it = base.find(name(l) + " " + std::to_string(rank));
      ASSERT_NE(it, base.end()) << "no recorded figures for rank " << rank << " in " << path;
      bcalls += it->second.calls, bbytes += it->second.bytes;
      EXPECT_LE(c.calls, it->second.calls) << "rank " << rank << " issued more collectives than recorded";
      EXPECT_LE(c.bytes, it->second.bytes) << "rank " << rank << " moved more bytes than recorded";
    }
    std::printf("  %-28s calls %6lld (recorded %6lld)  bytes %10lld (recorded %10lld)\n", name(l).c_str(),
                static_cast<long long>(calls), static_cast<long long>(bcalls), static_cast<long long>(bytes),
                static_cast<long long>(bbytes));
    total_calls += calls, total_bytes += bytes, base_calls += bcalls, base_bytes += bbytes;
  }
  std::printf("  all layouts: calls %lld (recorded %lld), bytes %lld (recorded %lld)\n",
              static_cast<long long>(total_calls), static_cast<long long>(base_calls),
              static_cast<long long>(total_bytes), static_cast<long long>(base_bytes));
  if (record) std::ofstream(path) << recorded;
}

// Per rank, group by group ("group: kinds, calls, bytes", sorted): the last step's collectives
// as the comm layer counted them on every group the rank has (the tied embedding's too).
std::map<std::string, std::string> by_group(const std::vector<GroupStats>& now, const std::vector<GroupStats>& before) {
  std::map<std::string, std::string> out;
  for (const GroupStats& g : now) {
    CommStats d = g.stats;
    for (const GroupStats& b : before)
      if (b.name == g.name) d = d - b.stats;
    if (!d.ops.empty()) out[g.name] = d.str();
  }
  return out;
}

std::map<int64_t, std::map<std::string, std::string>> real_step(const RunConfig& cfg) {
  std::mutex m;
  std::map<int64_t, std::vector<std::vector<GroupStats>>> cumulative;
  ParallelTrainOptions opts{.base = TrainOptions{.progress = false, .quiet = true}};
  opts.on_step = [&](const StepRecord&) {
    std::vector<GroupStats> s = world_group()->stats_by_group();
    std::lock_guard lock(m);
    cumulative[current_world_rank()].push_back(std::move(s));
  };
  train_parallel_threads(cfg, static_cast<int>(cfg.parallel.world_size()), opts);
  std::map<int64_t, std::map<std::string, std::string>> out;
  for (const auto& [rank, v] : cumulative) out[rank] = by_group(v.back(), v[v.size() - 2]);
  return out;
}

// The planner's source of truth: a step traced on one rank in meta mode, with no data and no
// peers, issues exactly the collectives the real step's rank issued — per group, the same kinds,
// calls and bytes.
// Context parallel (ring and all_to_all), alone and with dp, tp + sp and pp.
const std::vector<Layout> kCpLayouts = {
    Layout{true, 1, 1, 1, 0, 0, 2, "ring"},  Layout{true, 1, 1, 1, 0, 0, 2, "all_to_all"},
    Layout{true, 2, 1, 1, 1, 0, 2, "ring"},  Layout{true, 1, 2, 1, 0, 1, 2, "ring"},
    Layout{true, 1, 2, 1, 0, 0, 2, "ring"},
    Layout{false, 1, 1, 2, 0, 0, 2, "all_to_all"}};

TEST(CommCounts, TracedStepIssuesWhatTheRealStepIssued) {
  std::vector<Layout> layouts = kLayouts;
  layouts.insert(layouts.end(), kCpLayouts.begin(), kCpLayouts.end());
  for (const Layout& l : layouts) {
    SCOPED_TRACE(name(l));
    RunConfig cfg = config_for(l);
    cfg.data.val_fraction = 0;  // a training step alone (the last step of the run above also evaluates)
    for (const auto& [rank, want] : real_step(cfg)) {
      const RankTrace t = trace_rank_step(cfg, static_cast<int>(rank), 3);
      EXPECT_EQ(by_group(t.groups, {}), want) << "rank " << rank;
    }
  }
}

// The compute of a traced step equals the real step's, op by op and rank by rank: the same
// calls, FLOPs and bytes of every forward and backward (the real run records them from its
// kernels' shapes, trace_ops on) — the planner costs what runs, not a list of its own. And the
// memory the trace's allocator counted is the real run's (rank 0: the result's).
TEST(CommCounts, TracedStepComputesWhatTheRealStepComputed) {
  for (Layout l : {Layout{false, 1, 1, 1, 0, 0}, Layout{true, 1, 1, 1, 0, 0}, Layout{false, 2, 2, 1, 3, 1},
                   Layout{true, 1, 2, 2, 0, 1}, Layout{false, 2, 1, 2, 2, 0}, kCpLayouts[0], kCpLayouts[1],
                   kCpLayouts[3]}) {
    SCOPED_TRACE(name(l));
    RunConfig cfg = config_for(l);
    cfg.data.val_fraction = 0;
    cfg.train.steps = 2;
    std::mutex m;
    std::map<int64_t, OpTrace> real;
    ParallelTrainOptions opts{.base = TrainOptions{.progress = false, .quiet = true}};
    opts.on_step = [&](const StepRecord& rec) {
      if (rec.step == 0) {  // from here on: the second step, as the trace keeps
        reset_op_trace();
        rank_context().trace_ops = true;
        return;
      }
      std::lock_guard lock(m);
      real[current_world_rank()] = op_trace();
    };
    const ParallelTrainResult rr = train_parallel_threads(cfg, static_cast<int>(cfg.parallel.world_size()), opts);
    ASSERT_EQ(real.size(), static_cast<size_t>(cfg.parallel.world_size()));
    for (const auto& [rank, want] : real) {
      const RankTrace t = trace_rank_step(cfg, static_cast<int>(rank), 2);
      // Memory as the allocator counts it: the training state exactly, the peak within 5% (an op
      // whose real kernel hands back a view of its input still gets storage of its own here).
      if (rank == 0) {
        EXPECT_EQ(t.memory.params, rr.memory.params);
        EXPECT_EQ(t.memory.grads, rr.memory.grads);
        EXPECT_EQ(t.memory.optimizer, rr.memory.optimizer);
        EXPECT_NEAR(static_cast<double>(t.memory.total), static_cast<double>(rr.memory.total), 0.05 * static_cast<double>(rr.memory.total));
      }
      for (bool bwd : {false, true}) {
        const auto& w = bwd ? want.backward : want.forward;
        const auto& got = bwd ? t.ops.backward : t.ops.forward;
        ASSERT_FALSE(w.empty());
        for (const auto& [op, x] : w) {
          auto it = got.find(op);
          ASSERT_NE(it, got.end()) << "rank " << rank << ": " << op << (bwd ? " (backward)" : "")
                                   << " ran " << x.calls << " times in the real step but is not in the trace";
          EXPECT_EQ(it->second.calls, x.calls) << "rank " << rank << ": " << op;
          EXPECT_DOUBLE_EQ(it->second.flops, x.flops) << "rank " << rank << ": " << op;
          EXPECT_DOUBLE_EQ(it->second.bytes, x.bytes) << "rank " << rank << ": " << op;
        }
        EXPECT_EQ(got.size(), w.size()) << "rank " << rank << ": the trace has ops the real step did not run";
      }
    }
  }
}

// A mixture of experts (Mixtral tiny, four experts, two per token): its routing is data, so a
// traced step routes as a balanced router would (every expert tokens x top_k / experts rows).
// Every group's collectives still match the real step's in kind and calls on every rank, and in
// bytes, except what the token exchange over ep carries: a rank sends all its tokens' rows out
// (its own share included) whatever the router chose, but what comes back from the others is
// their routing — so for ep's all_to_alls the bytes are compared summed over the group, which no
// routing changes. The compute is compared the same way: each op's calls on every rank, its
// FLOPs and bytes summed over the world (each rank's grouped products follow its tokens).
RunConfig moe_config(int dp, int ep, int tp, bool sp, int cp) {
  std::vector<std::string> sets = {"train.steps=3", "train.warmup=1", "train.global_batch=8", "train.seq_len=16",
                                   "train.save_every=0", "train.threads=1", "log.every=1000", "data.val_fraction=0",
                                   fmt::format("train.micro_batch={}", 2 * dp * ep),
                                   "model.num_hidden_layers=2", "model.hidden_size=32", "model.num_attention_heads=4",
                                   "model.num_key_value_heads=2", "model.intermediate_size=64",
                                   "model.max_position_embeddings=32", "model.num_local_experts=4"};
  RunConfig cfg = load_run_config(std::string(TESSEL_SOURCE_DIR) + "/configs/mixtral-tiny.yaml", sets);
  cfg.parallel.dp = dp;
  cfg.parallel.ep = ep;
  cfg.parallel.tp = tp;
  cfg.parallel.sp = sp;
  cfg.parallel.cp = cp;
  cfg.parallel.schedule = "1F1B";
  return cfg;
}

// (With context parallel, each rank routes its part of every sequence, and the ranks add up the
// sequences' assignment counts over cp.)
TEST(CommCounts, TracedMixtureOfExpertsStepIssuesWhatTheRealStepIssued) {
  for (auto [dp, ep, tp, sp, cp] :
       {std::tuple{2, 1, 1, false, 1}, std::tuple{1, 2, 1, false, 1}, std::tuple{2, 2, 1, false, 1},
        std::tuple{1, 2, 2, true, 1}, std::tuple{1, 1, 1, false, 2}, std::tuple{1, 2, 1, false, 2}}) {
    SCOPED_TRACE(fmt::format("mixtral-dp{}-ep{}-tp{}-sp{}-cp{}", dp, ep, tp, sp, cp));
    const RunConfig cfg = moe_config(dp, ep, tp, sp, cp);
    // Per rank, the real step's and the traced step's groups; summed over ranks, the ep
    // exchange's bytes.
    std::mutex m;
    std::map<int64_t, std::vector<std::vector<GroupStats>>> cumulative;
    std::map<int64_t, OpTrace> real_ops;
    ParallelTrainOptions opts{.base = TrainOptions{.progress = false, .quiet = true}};
    opts.on_step = [&](const StepRecord& rec) {
      std::vector<GroupStats> st = world_group()->stats_by_group();
      std::lock_guard lock(m);
      if (rec.step == 1) {
        reset_op_trace();
        rank_context().trace_ops = true;
      }
      if (rec.step == 2) real_ops[current_world_rank()] = op_trace();
      cumulative[current_world_rank()].push_back(std::move(st));
    };
    train_parallel_threads(cfg, static_cast<int>(cfg.parallel.world_size()), opts);
    int64_t real_exchange = 0, traced_exchange = 0;
    std::map<std::string, OpTally> real_sum, traced_sum;
    for (const auto& [rank, v] : cumulative) {
      SCOPED_TRACE(fmt::format("rank {}", rank));
      const RankTrace t = trace_rank_step(cfg, static_cast<int>(rank), 3);
      std::map<std::string, CommStats> want, got;
      std::vector<int> ep_ranks;  // this rank's expert-parallel group
      const parallel::Layout layout(cfg.parallel, rank);
      if (ep > 1)
        for (int64_t i = 0; i < ep; ++i) ep_ranks.push_back(static_cast<int>(layout.peer("ep", i)));
      std::string ep_group;
      for (const GroupStats& g : v.back()) {
        CommStats d = g.stats;
        for (const GroupStats& b : v[v.size() - 2])
          if (b.name == g.name) d = d - b.stats;
        if (!d.ops.empty()) want[g.name] = d;
        if (ep > 1 && g.ranks == ep_ranks) ep_group = g.name;
      }
      for (const GroupStats& g : t.groups) got[g.name] = g.stats;
      ASSERT_EQ(got.size(), want.size());
      for (auto& [name, w] : want) {
        ASSERT_TRUE(got.count(name)) << name;
        CommStats& x = got[name];
        const bool exchange = name == ep_group && w.ops.count("all_to_all");
        if (exchange) {
          real_exchange += w.ops["all_to_all"].bytes;
          traced_exchange += x.ops["all_to_all"].bytes;
          EXPECT_EQ(x.ops["all_to_all"].calls, w.ops["all_to_all"].calls) << name;
          w.ops.erase("all_to_all");
          x.ops.erase("all_to_all");
        }
        EXPECT_EQ(x.str(), w.str()) << name;
      }
      const OpTrace& r = real_ops[rank];
      for (bool bwd : {false, true}) {
        const auto& wo = bwd ? r.backward : r.forward;
        const auto& go = bwd ? t.ops.backward : t.ops.forward;
        EXPECT_EQ(go.size(), wo.size()) << (bwd ? "backward" : "forward");
        for (const auto& [op, x] : wo) {
          auto it = go.find(op);
          ASSERT_NE(it, go.end()) << op << (bwd ? " (backward)" : "") << " ran but is not in the trace";
          EXPECT_EQ(it->second.calls, x.calls) << op;
          const std::string key = op + (bwd ? " backward" : "");
          real_sum[key].flops += x.flops, real_sum[key].bytes += x.bytes;
          traced_sum[key].flops += it->second.flops, traced_sum[key].bytes += it->second.bytes;
        }
      }
    }
    EXPECT_EQ(traced_exchange, real_exchange);
    if (ep > 1) {
      EXPECT_GT(real_exchange, 0);
    }
    for (const auto& [op, x] : real_sum) {
      EXPECT_DOUBLE_EQ(traced_sum[op].flops, x.flops) << op;
      EXPECT_DOUBLE_EQ(traced_sum[op].bytes, x.bytes) << op;
    }
  }
}

}  // namespace
}  // namespace tessel
