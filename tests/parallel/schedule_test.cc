// Pipeline schedules: every generator over a table of sizes validates, runs each step exactly
// once, brackets compute with its messages, holds the activations its paper promises and
// idles as the bubble theory says; the validator catches broken schedules by name; the
// simulator's times and the grid are checked against hand-worked values.
#include "tessel/parallel/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <tuple>

#include "tessel/core/error.h"

namespace tessel::parallel {
namespace {

struct Case {
  std::string kind;
  int p, m, v;
  std::string label() const { return fmt::format("{} p={} m={} v={}", kind, p, m, v); }
};

// Every kind over p in 1..4, m in {1,2,3,4,8}; VPP also with v in {2,3} where m % p == 0.
std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int p : {1, 2, 3, 4})
    for (int m : {1, 2, 3, 4, 8}) {
      for (const char* kind : {"FThenB", "1F1B", "ZBH1", "VPP"}) cases.push_back({kind, p, m, 1});
      if (m % p == 0)
        for (int v : {2, 3}) cases.push_back({"VPP", p, m, v});
    }
  return cases;
}

std::string names(const std::vector<Action>& list) {
  std::string out;
  for (const Action& a : list) {
    if (!out.empty()) out += ' ';
    out += a.str();
  }
  return out;
}

double mean(const std::vector<double>& x) { return std::accumulate(x.begin(), x.end(), 0.0) / x.size(); }

// Most (micro-batch, chunk) on `rank` whose F ran and whose B has not: full activations held.
int peak_until_b(const std::vector<Action>& list) {
  int held = 0, peak = 0;
  for (const Action& a : list) {
    if (a.kind == ActionKind::F) peak = std::max(peak, ++held);
    if (a.kind == ActionKind::B) --held;
  }
  return peak;
}

// Expects `fn` to throw tessel::Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    for (const std::string& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "'" << part << "' not in: " << e.what();
  }
}

TEST(Action, PrintsKindMicrobatchAndChunk) {
  EXPECT_EQ((Action{ActionKind::F, 3, 1}.str()), "F3.1");
  EXPECT_EQ((Action{ActionKind::B, 0, 0}.str()), "B0.0");
  EXPECT_EQ((Action{ActionKind::W, 2, 0}.str()), "W2.0");
  EXPECT_EQ((Action{ActionKind::SEND_F, 3, 0, 1}.str()), "SF3.0");
  EXPECT_EQ((Action{ActionKind::RECV_F, 3, 0, 0}.str()), "RF3.0");
  EXPECT_EQ((Action{ActionKind::SEND_B, 12, 2, 3}.str()), "SB12.2");
  EXPECT_EQ((Action{ActionKind::RECV_B, 0, 1, 0}.str()), "RB0.1");
}

TEST(MakeSchedule, NamesAreCaseInsensitiveWithAliases) {
  EXPECT_EQ(make_schedule("gpipe", 2, 2).name, "FThenB");
  EXPECT_EQ(make_schedule("FTHENB", 2, 2).name, "FThenB");
  EXPECT_EQ(make_schedule("1f1b", 2, 2).name, "1F1B");
  EXPECT_EQ(make_schedule("Interleaved", 2, 2, 2).name, "VPP");
  EXPECT_EQ(make_schedule("zb-h1", 2, 2).name, "ZBH1");
  Schedule z = make_schedule("ZBH1", 3, 4);
  EXPECT_TRUE(z.split_backward);
  EXPECT_FALSE(make_schedule("1F1B", 3, 4).split_backward);
  Schedule v = make_schedule("VPP", 2, 4, 3);
  EXPECT_EQ(v.virtual_stages(), 6);
  EXPECT_EQ(v.virtual_stage(1, 2), 5);
  EXPECT_EQ(v.rank_of(5), 1);
  EXPECT_EQ(v.chunk_of(5), 2);
}

TEST(MakeSchedule, OneRankIsJustTheComputeSteps) {
  EXPECT_EQ(names(make_schedule("FThenB", 1, 3).ranks[0]), "F0.0 F1.0 F2.0 B0.0 B1.0 B2.0");
  EXPECT_EQ(names(make_schedule("1F1B", 1, 3).ranks[0]), "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0");
  EXPECT_EQ(names(make_schedule("ZBH1", 1, 2).ranks[0]), "F0.0 B0.0 W0.0 F1.0 B1.0 W1.0");
  // Two chunks on one rank still cross a stage boundary: the messages go to the rank itself.
  EXPECT_EQ(names(make_schedule("VPP", 1, 1, 2).ranks[0]), "F0.0 SF0.0 RF0.1 F0.1 B0.1 SB0.1 RB0.0 B0.0");
}

TEST(MakeSchedule, TwoRankOneFOneBHasMessagesAroundCompute) {
  Schedule s = make_schedule("1F1B", 2, 2);
  EXPECT_EQ(names(s.ranks[0]), "F0.0 SF0.0 F1.0 SF1.0 RB0.0 B0.0 RB1.0 B1.0");
  EXPECT_EQ(names(s.ranks[1]), "RF0.0 F0.0 B0.0 SB0.0 RF1.0 F1.0 B1.0 SB1.0");
  for (const Action& a : s.ranks[0]) EXPECT_EQ(a.peer, a.kind == ActionKind::F || a.kind == ActionKind::B ? -1 : 1);
}

TEST(MakeSchedule, VppWithOneChunkIsOneFOneB) {
  for (int p : {1, 2, 3, 4})
    for (int m : {1, 3, 8}) {
      SCOPED_TRACE(fmt::format("p={} m={}", p, m));
      EXPECT_EQ(make_schedule("VPP", p, m, 1).ranks, make_schedule("1F1B", p, m).ranks);
    }
}

TEST(MakeSchedule, MegatronInterleavedOrderOnRankZero) {
  // p=2, v=2, m=4: micro-batches go through chunk 0 in groups of p, then chunk 1; rank 0
  // runs 2(p-1) + (v-1)p = 4 forwards ahead.
  Schedule s = make_schedule("VPP", 2, 4, 2);
  std::vector<Action> compute;
  for (const Action& a : s.ranks[0])
    if (a.kind == ActionKind::F || a.kind == ActionKind::B) compute.push_back(a);
  EXPECT_EQ(names(compute), "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
}

TEST(ScheduleTable, EveryScheduleValidates) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.label());
    EXPECT_NO_THROW(validate(make_schedule(c.kind, c.p, c.m, c.v)));
  }
}

TEST(ScheduleTable, EveryStepRunsOnceOnTheRankThatHoldsItsStage) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.label());
    Schedule s = make_schedule(c.kind, c.p, c.m, c.v);
    std::map<std::tuple<ActionKind, int, int>, int> count;  // (kind, micro-batch, vstage)
    for (int r = 0; r < s.stages; ++r)
      for (const Action& a : s.ranks[r]) ++count[{a.kind, a.microbatch, s.virtual_stage(r, a.chunk)}];
    const int last = s.virtual_stages() - 1;
    for (int mb = 0; mb < c.m; ++mb)
      for (int vs = 0; vs <= last; ++vs) {
        EXPECT_EQ((count[{ActionKind::F, mb, vs}]), 1);
        EXPECT_EQ((count[{ActionKind::B, mb, vs}]), 1);
        EXPECT_EQ((count[{ActionKind::W, mb, vs}]), c.kind == "ZBH1" ? 1 : 0);
        EXPECT_EQ((count[{ActionKind::SEND_F, mb, vs}]), vs < last ? 1 : 0);
        EXPECT_EQ((count[{ActionKind::RECV_B, mb, vs}]), vs < last ? 1 : 0);
        EXPECT_EQ((count[{ActionKind::RECV_F, mb, vs}]), vs > 0 ? 1 : 0);
        EXPECT_EQ((count[{ActionKind::SEND_B, mb, vs}]), vs > 0 ? 1 : 0);
      }
  }
}

TEST(ScheduleTable, ReceivesComeRightBeforeAndSendsRightAfterTheirStep) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.label());
    Schedule s = make_schedule(c.kind, c.p, c.m, c.v);
    for (int r = 0; r < s.stages; ++r) {
      const auto& list = s.ranks[r];
      for (size_t i = 0; i < list.size(); ++i) {
        const Action& a = list[i];
        const int vs = s.virtual_stage(r, a.chunk);
        auto is = [&](size_t j, ActionKind k) {
          return j < list.size() && list[j].kind == k && list[j].microbatch == a.microbatch && list[j].chunk == a.chunk;
        };
        switch (a.kind) {
          case ActionKind::RECV_F: EXPECT_TRUE(is(i + 1, ActionKind::F)) << a.str(); break;
          case ActionKind::RECV_B: EXPECT_TRUE(is(i + 1, ActionKind::B)) << a.str(); break;
          case ActionKind::SEND_F: EXPECT_TRUE(i > 0 && is(i - 1, ActionKind::F)) << a.str(); break;
          case ActionKind::SEND_B: EXPECT_TRUE(i > 0 && is(i - 1, ActionKind::B)) << a.str(); break;
          default: EXPECT_EQ(a.peer, -1) << a.str(); continue;
        }
        const int other = a.kind == ActionKind::SEND_F || a.kind == ActionKind::RECV_B ? vs + 1 : vs - 1;
        EXPECT_EQ(a.peer, s.rank_of(other)) << a.str() << " on rank " << r;
      }
    }
  }
}

TEST(ScheduleTable, PeakInFlightMatchesEachSchedulesPromise) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.label());
    Schedule s = make_schedule(c.kind, c.p, c.m, c.v);
    SimResult sim = simulate(s);
    for (int r = 0; r < c.p; ++r) {
      SCOPED_TRACE(fmt::format("rank {}", r));
      const int one_f_one_b = std::min(c.p - r, c.m);
      if (c.kind == "FThenB") {
        EXPECT_EQ(sim.peak_in_flight[r], c.m * c.v);
      } else if (c.kind == "1F1B" || (c.kind == "VPP" && c.v == 1)) {
        EXPECT_EQ(sim.peak_in_flight[r], one_f_one_b);
      } else if (c.kind == "ZBH1") {
        // Counted until W, every rank holds what rank 0 holds under 1F1B (the paper's "same
        // peak memory"); counted until B (full activations) it is exactly 1F1B's.
        EXPECT_EQ(sim.peak_in_flight[r], std::min(c.p, c.m));
        EXPECT_EQ(peak_until_b(s.ranks[r]), one_f_one_b);
      } else {  // Megatron interleaved: its warm-up forwards plus the one of the first 1F1B step
        EXPECT_EQ(sim.peak_in_flight[r], std::min(2 * (c.p - r - 1) + (c.v - 1) * c.p + 1, c.m * c.v));
      }
    }
    // The peak over ranks of the memory-bounded schedules is 1F1B's: rank 0 holds min(p, m).
    if (c.kind != "FThenB" && c.v == 1) {
      EXPECT_EQ(*std::max_element(sim.peak_in_flight.begin(), sim.peak_in_flight.end()), std::min(c.p, c.m));
    }
  }
}

// Unit model: F and B one unit each (W = 0, so an unsplit B is one unit). FThenB and 1F1B then
// take 2(m+p-1) units and every rank is busy 2m of them: idle share (p-1)/(m+p-1) on every
// rank, exactly. With a uniform but slower backward (b = 2) the share is the same, since
// both the busy time and the makespan scale by (f+b).
TEST(ScheduleTable, GpipeAndOneFOneBIdleExactlyAsTheBubbleFormula) {
  for (const Case& c : all_cases()) {
    if (c.kind != "FThenB" && c.kind != "1F1B") continue;
    SCOPED_TRACE(c.label());
    Schedule s = make_schedule(c.kind, c.p, c.m);
    const double theory = double(c.p - 1) / (c.m + c.p - 1);
    EXPECT_DOUBLE_EQ(theoretical_idle_share(s), theory);
    SimResult unit = simulate(s, 1.0, 1.0, 0.0);
    EXPECT_EQ(unit.makespan, 2 * (c.m + c.p - 1));
    for (int r = 0; r < c.p; ++r) {
      EXPECT_EQ(unit.busy[r], 2 * c.m);
      EXPECT_DOUBLE_EQ(unit.idle_share[r], theory);
    }
    SimResult slow_b = simulate(s, 1.0, 2.0, 0.0);
    EXPECT_EQ(slow_b.makespan, 3 * (c.m + c.p - 1));
    for (double idle : slow_b.idle_share) EXPECT_DOUBLE_EQ(idle, theory);
  }
}

// Narayanan et al. give (p-1)/(v·m+p-1) for the interleaved schedule. In the unit model
// (one unit per chunk step, so a chunk is 1/v of a stage) Megatron's order meets it on every
// case of the table: we allow 1e-12, i.e. we observe it exactly.
TEST(ScheduleTable, VppIdlesAsTheInterleavedBubbleFormula) {
  for (const Case& c : all_cases()) {
    if (c.kind != "VPP") continue;
    SCOPED_TRACE(c.label());
    Schedule s = make_schedule(c.kind, c.p, c.m, c.v);
    const double theory = double(c.p - 1) / (c.v * c.m + c.p - 1);
    EXPECT_DOUBLE_EQ(theoretical_idle_share(s), theory);
    SimResult unit = simulate(s, 1.0, 1.0, 0.0);
    EXPECT_NEAR(mean(unit.idle_share), theory, 1e-12);
  }
}

// Same total work per micro-batch and stage (3 units): ZBH1 with F = B = W = 1 against 1F1B
// whose backward is B + W = 2. The bubble falls from 3(p-1) to (p-1) units — the paper's
// (p-1)(F+B-W) — whenever m >= p.
TEST(ScheduleTable, ZeroBubbleH1IdlesLessThanOneFOneB) {
  for (const Case& c : all_cases()) {
    if (c.kind != "ZBH1") continue;
    SCOPED_TRACE(c.label());
    Schedule zb = make_schedule("ZBH1", c.p, c.m);
    SimResult z = simulate(zb, 1.0, 1.0, 1.0);
    SimResult base = simulate(make_schedule("1F1B", c.p, c.m), 1.0, 2.0, 0.0);
    EXPECT_DOUBLE_EQ(theoretical_idle_share(zb), mean(z.idle_share));
    for (int r = 0; r < c.p; ++r) EXPECT_EQ(z.busy[r], 3 * c.m);
    if (c.p >= 2 && c.m >= c.p) {
      EXPECT_EQ(z.makespan, 3 * c.m + c.p - 1);
      EXPECT_EQ(base.makespan, 3 * (c.m + c.p - 1));
      EXPECT_LT(mean(z.idle_share), mean(base.idle_share));
    } else {
      EXPECT_LE(z.makespan, base.makespan);
    }
  }
}

// A split backward holds each micro-batch's output gradients from its B until its W. Read off
// the grid of ZB-H1 on 2 ranks and 4 micro-batches:
//   rank 0 | F0 F1  .  B0 W0 F2 B1 W1 F3 B2 W2 B3 W3      at most 1 owed
//   rank 1 |  . F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3      B0 and B1 before W0: 2
// A schedule whose B does all the work owes none.
TEST(Simulate, CountsTheWeightStepsASplitBackwardStillOwes) {
  EXPECT_EQ(simulate(make_schedule("ZBH1", 2, 4), 1.0, 1.0, 1.0).peak_w_pending, (std::vector<int>{1, 2}));
  EXPECT_EQ(simulate(make_schedule("1F1B", 2, 4), 1.0, 2.0, 0.0).peak_w_pending, (std::vector<int>{0, 0}));
}

TEST(Simulate, HandWorkedTimesWithPerStageCostsAndCommunication) {
  // 1F1B, p=2, m=1. Rank 0: F [0,1], SF at 1. Rank 1: RF at 1.5 (comm 0.5), F [1.5,3.5],
  // B [3.5,7.5] (b + w = 3 + 1), SB at 7.5. Rank 0: RB at 8, B [8,10] (b + w = 1.5 + 0.5).
  Schedule s = make_schedule("1F1B", 2, 1);
  SimResult r = simulate(s, {1, 2}, {1.5, 3}, {0.5, 1}, 0.5);
  using Span = std::pair<double, double>;
  EXPECT_EQ(r.spans[0], (std::vector<Span>{{0, 1}, {1, 1}, {8, 8}, {8, 10}}));
  EXPECT_EQ(r.spans[1], (std::vector<Span>{{1.5, 1.5}, {1.5, 3.5}, {3.5, 7.5}, {7.5, 7.5}}));
  EXPECT_EQ(r.makespan, 10);
  EXPECT_EQ(r.busy, (std::vector<double>{3, 6}));
  EXPECT_DOUBLE_EQ(r.idle_share[0], 0.7);
  EXPECT_DOUBLE_EQ(r.idle_share[1], 0.4);

  // Split backward: B no longer includes w, and W follows on its own.
  SimResult z = simulate(make_schedule("ZBH1", 1, 1), 1, 2, 3);
  EXPECT_EQ(z.spans[0], (std::vector<Span>{{0, 1}, {1, 3}, {3, 6}}));
}

// Compute spans of `rank` only (messages are zero-length and only clutter the expectation).
std::vector<std::pair<double, double>> compute_spans(const Schedule& s, const SimResult& r, int rank) {
  std::vector<std::pair<double, double>> out;
  for (size_t i = 0; i < s.ranks[rank].size(); ++i) {
    const ActionKind k = s.ranks[rank][i].kind;
    if (k == ActionKind::F || k == ActionKind::B || k == ActionKind::W) out.push_back(r.spans[rank][i]);
  }
  return out;
}

TEST(SimulateShared, HandWorkedFThenBOnOneProcessor) {
  // FThenB, p=2, m=2, every step 1 alone, one processor for both ranks. Rank 0's F0 runs alone
  // [0,1]; its F1 and rank 1's F0 share the processor, half speed each, both end at 3; rank 1
  // runs F1 and B0 alone [3,5]; rank 1's B1 and rank 0's B0 share [5,7]; rank 0's B1 [7,8].
  Schedule s = make_schedule("FThenB", 2, 2);
  SimResult r = simulate(s, {1, 1}, {1, 1}, {0, 0}, 0, 1);
  using Span = std::pair<double, double>;
  EXPECT_EQ(compute_spans(s, r, 0), (std::vector<Span>{{0, 1}, {1, 3}, {5, 7}, {7, 8}}));
  EXPECT_EQ(compute_spans(s, r, 1), (std::vector<Span>{{1, 3}, {3, 4}, {4, 5}, {5, 7}}));
  EXPECT_EQ(r.makespan, 8);
  EXPECT_EQ(r.busy, (std::vector<double>{6, 6}));  // wall time, the shared stretches counted whole

  // One and a half processors: two busy ranks run at 0.75 each, so the shared F takes 4/3.
  SimResult h = simulate(s, {1, 1}, {1, 1}, {0, 0}, 0, 1.5);
  EXPECT_EQ(compute_spans(s, h, 0)[0], Span(0, 1));
  EXPECT_DOUBLE_EQ(compute_spans(s, h, 0)[1].second, 1 + 4.0 / 3);
  EXPECT_DOUBLE_EQ(compute_spans(s, h, 1)[0].second, 1 + 4.0 / 3);
}

TEST(SimulateShared, OneProcessorRunsAllTheWorkBackToBack) {
  // Without message latency some rank can always run, so one shared processor never idles:
  // the makespan is the sum of every step's work.
  for (const Case& c : all_cases()) {
    if (c.p < 2) continue;
    SCOPED_TRACE(c.label());
    Schedule s = make_schedule(c.kind, c.p, c.m, c.v);
    const auto n = static_cast<size_t>(s.virtual_stages());
    std::vector<double> f(n), b(n), w(n);
    for (size_t i = 0; i < n; ++i) f[i] = 1 + 0.25 * i, b[i] = 2 + 0.5 * (i % 3), w[i] = s.split_backward ? 0.75 : 0.5;
    double total = 0;
    for (size_t i = 0; i < n; ++i) total += c.m * (f[i] + b[i] + w[i]);
    SimResult r = simulate(s, f, b, w, 0, 1);
    EXPECT_NEAR(r.makespan, total, 1e-9 * total);
    // Never faster than with a processor per rank, never slower than that with every step
    // slowed to the shared rate throughout.
    SimResult own = simulate(s, f, b, w);
    SimResult two = simulate(s, f, b, w, 0, 2);
    EXPECT_GE(two.makespan, own.makespan * (1 - 1e-12));
    EXPECT_LE(two.makespan, own.makespan * c.p / 2.0 * (1 + 1e-12));
  }
}

TEST(SimulateShared, AsManyProcessorsAsRanksIsThePlainSimulation) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.label());
    Schedule s = make_schedule(c.kind, c.p, c.m, c.v);
    const auto n = static_cast<size_t>(s.virtual_stages());
    std::vector<double> f(n, 1.5), b(n, 2.5), w(n, 1);
    EXPECT_EQ(simulate(s, f, b, w, 0.25, c.p).spans, simulate(s, f, b, w, 0.25).spans);
  }
}

TEST(Grid, OneFOneBTwoRanksThreeMicrobatches) {
  EXPECT_EQ(make_schedule("1F1B", 2, 3).grid(),
            "rank 0 | F0.0 F1.0  .   B0.0 F2.0 B1.0  .   B2.0\n"
            "rank 1 |  .   F0.0 B0.0 F1.0 B1.0 F2.0 B2.0\n");
}

TEST(Grid, ZeroBubbleShowsTheLaggedWeightSteps) {
  EXPECT_EQ(make_schedule("ZBH1", 2, 2).grid(),
            "rank 0 | F0.0 F1.0  .   B0.0 W0.0 B1.0 W1.0\n"
            "rank 1 |  .   F0.0 B0.0 F1.0 B1.0 W0.0 W1.0\n");
}

TEST(Validate, NamesTheRankAndActionOfAMissingReceive) {
  Schedule s = make_schedule("1F1B", 2, 3);
  auto& list = s.ranks[1];
  list.erase(std::find(list.begin(), list.end(), Action{ActionKind::RECV_F, 1, 0, 0}));
  expect_error([&] { validate(s); }, {"rank 1", "RF1.0", "0 time(s), expected 1"});
}

TEST(Validate, NamesEveryStuckRankOfADeadlock) {
  // Rank 0 waits for the gradient of micro-batch 0 before sending its activation forward.
  Schedule s = make_schedule("1F1B", 2, 2);
  ASSERT_EQ(s.ranks[0][1].str(), "SF0.0");
  ASSERT_EQ(s.ranks[0][4].str(), "RB0.0");
  std::swap(s.ranks[0][1], s.ranks[0][4]);
  expect_error([&] { validate(s); }, {"deadlocks", "rank 0 is stuck at RB0.0 (action #1) waiting for SB0.0 on rank 1",
                                      "rank 1 is stuck at RF0.0 (action #0) waiting for SF0.0 on rank 0"});
}

TEST(Validate, CatchesStepsOutOfOrderOnOneRank) {
  Schedule s = make_schedule("ZBH1", 2, 2);
  auto& list = s.ranks[1];
  auto w = std::find(list.begin(), list.end(), Action{ActionKind::W, 0, 0});
  std::rotate(list.begin(), w, w + 1);  // W0.0 first: before its B
  expect_error([&] { validate(s); }, {"rank 1 is stuck at W0.0 (action #0) waiting for B0.0 on rank 1"});
}

TEST(Validate, CatchesMalformedActions) {
  struct Mutation {
    std::string what;
    std::function<void(Schedule&)> apply;
    std::vector<std::string> message;
  };
  const std::vector<Mutation> mutations = {
      {"wrong peer", [](Schedule& s) { s.ranks[0][1].peer = 2; }, {"rank 0", "SF0.0", "peer 2", "on rank 1"}},
      {"send past the last stage", [](Schedule& s) { s.ranks[2].push_back({ActionKind::SEND_F, 0, 0, 0}); },
       {"rank 2", "SF0.0", "last virtual stage 2"}},
      {"duplicate forward", [](Schedule& s) { s.ranks[0].push_back({ActionKind::F, 1, 0}); },
       {"rank 0 has F1.0 2 time(s), expected 1"}},
      {"W without split", [](Schedule& s) { s.ranks[0].push_back({ActionKind::W, 0, 0}); },
       {"rank 0", "W0.0", "split_backward is false"}},
      {"micro-batch out of range", [](Schedule& s) { s.ranks[1][0].microbatch = 5; }, {"rank 1", "micro-batch 5", "[0, 3)"}},
      {"chunk out of range", [](Schedule& s) { s.ranks[1][0].chunk = 1; }, {"rank 1", "chunk 1", "[0, 1)"}},
      {"peer on compute", [](Schedule& s) { s.ranks[0][0].peer = 1; }, {"rank 0", "F0.0", "peer 1"}},
      {"missing rank", [](Schedule& s) { s.ranks.pop_back(); }, {"2 rank lists", "(3)"}},
  };
  for (const Mutation& mu : mutations) {
    SCOPED_TRACE(mu.what);
    Schedule s = make_schedule("1F1B", 3, 3);
    mu.apply(s);
    expect_error([&] { validate(s); }, mu.message);
  }
}

TEST(Errors, BadInputsAreNamed) {
  expect_error([] { make_schedule("DualPipe", 2, 2); }, {"'DualPipe'", "FThenB", "1F1B", "VPP", "ZBH1"});
  expect_error([] { make_schedule("1F1B", 0, 2); }, {"stages", "got 0"});
  expect_error([] { make_schedule("1F1B", 2, -1); }, {"microbatches", "got -1"});
  expect_error([] { make_schedule("VPP", 2, 2, 0); }, {"chunks", "got 0"});
  expect_error([] { make_schedule("1F1B", 2, 2, 2); }, {"1F1B", "chunks must be 1", "got 2"});
  expect_error([] { make_schedule("VPP", 4, 6, 2); }, {"microbatches (6)", "stages (4)"});
  Schedule s = make_schedule("1F1B", 2, 2);
  expect_error([&] { simulate(s, {1, 1, 1}, {1, 1}, {0, 0}); }, {"f has 3 entries", "(2)"});
  expect_error([&] { simulate(s, {1, 1}, {1, -2}, {0, 0}); }, {"b[1] = -2"});
  expect_error([&] { simulate(s, 1, 1, 0, -1); }, {"comm = -1"});
  expect_error([&] { simulate(s, {1, 1}, {1, 1}, {0, 0}, 0, -1); }, {"capacity = -1"});
  s.name = "mine";
  expect_error([&] { theoretical_idle_share(s); }, {"'mine'"});
}

}  // namespace
}  // namespace tessel::parallel
