// Pipeline schedules as values. A schedule lists, for every pipeline rank, the steps it runs
// in one training step, in order: forward (F), backward (B), weight-gradient (W) and the
// point-to-point messages between neighbouring stages (SEND_F/RECV_F carry activations
// forward, SEND_B/RECV_B carry input gradients back). Nothing here communicates: the runtime
// walks these lists, and the same lists feed the validator (can this deadlock?) and the
// simulator (how long, how idle, how many activations held?).
//
// Placement: with p ranks and v chunks per rank, virtual stage s = c·p + r lives on rank r as
// its local chunk c (Megatron's looping placement), and stage s feeds s+1. Every compute step
// is bracketed by its messages: RECV right before it, SEND right after, so a runtime may post
// the receive early or fuse it with the step without reordering the list.
//
// Generators follow published schedules:
//   FThenB  GPipe (Huang et al. 2019): all forwards, then all backwards.
//   1F1B    PipeDream-flush / Megatron non-interleaved: p-r-1 warm-up forwards on rank r,
//           then one forward and one backward alternately, then the remaining backwards.
//   VPP     Megatron interleaved 1F1B (Narayanan et al. 2021), v chunks per rank.
//   ZBH1    zero-bubble H1 (Qi et al. 2023): 1F1B with the backward split into B (input
//           gradient, on the critical path) and W (weight gradient), W's lagged to fill bubbles.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessel::parallel {

// One step of one pipeline rank. F/B/W compute; SEND_*/RECV_* move the activation (F) or the
// input gradient (B) of `microbatch` across the boundary to the neighbouring virtual stage.
enum class ActionKind { F, B, W, SEND_F, RECV_F, SEND_B, RECV_B };

struct Action {
  ActionKind kind = ActionKind::F;
  int microbatch = 0;
  int chunk = 0;  // local model chunk on this rank (0..chunks-1)
  int peer = -1;  // pipeline rank at the other end, for SEND_*/RECV_*; -1 otherwise
  // "F3.1" (forward, micro-batch 3, chunk 1), "B0.0", "W2.0", "SF3.0", "RF3.0", "SB0.1",
  // "RB0.1"; the chunk suffix is always present, the peer never is.
  std::string str() const;
  bool operator==(const Action&) const = default;
};

struct Schedule {
  std::string name;             // "FThenB", "1F1B", "VPP", "ZBH1"
  int stages = 1;               // pipeline ranks p
  int microbatches = 1;         // m
  int chunks = 1;               // v: model chunks per rank (>1 only for VPP)
  bool split_backward = false;  // true: B is the input gradient only and a W follows for
                                // every (microbatch, chunk); false: B is the whole backward
  std::vector<std::vector<Action>> ranks;  // per pipeline rank, in execution order

  int virtual_stages() const { return stages * chunks; }
  int virtual_stage(int rank, int chunk) const { return chunk * stages + rank; }
  int rank_of(int vstage) const { return vstage % stages; }
  int chunk_of(int vstage) const { return vstage / stages; }

  // A step × rank grid of the unit-time simulation (F, B, W one unit each; idle ".";
  // messages not shown), one line per rank, fixed-width columns. 1F1B, p=2, m=3:
  //   rank 0 | F0.0 F1.0  .   B0.0 F2.0 B1.0  .   B2.0
  //   rank 1 |  .   F0.0 B0.0 F1.0 B1.0 F2.0 B2.0
  std::string grid() const;
};

// Builds schedule `kind` for `stages` ranks, `microbatches` micro-batches and `chunks` chunks
// per rank. Kinds, case-insensitive: "FThenB" (alias "GPipe"), "1F1B", "VPP" (alias
// "interleaved"), "ZBH1" (alias "ZB-H1"). chunks must be 1 except for VPP; VPP with chunks > 1
// needs microbatches % stages == 0 (as Megatron does), and with chunks == 1 it is 1F1B (the
// result keeps the name "VPP"). Activations held on rank r (see SimResult::peak_in_flight):
// FThenB m; 1F1B min(p-r, m); VPP min(2(p-r-1) + (v-1)p + 1, v·m) as in Megatron; ZBH1
// min(p, m) on every rank counted until W — 1F1B's rank-0 peak, the paper's "same peak
// memory" — and 1F1B's min(p-r, m) counted until B. Throws Error on an unknown kind (listing
// the valid ones), non-positive sizes, or chunks/microbatches the kind cannot take.
Schedule make_schedule(std::string_view kind, int stages, int microbatches, int chunks = 1);

// The kinds of schedule, for code that branches on one (the planner's closed forms).
enum class ScheduleKind { fthenb, one_f_one_b, vpp, zbh1 };

// The kind schedule `kind` names (case-insensitive, with the aliases above); throws Error
// listing the valid kinds for an unknown one.
ScheduleKind schedule_kind(std::string_view kind);

// The canonical name of schedule `kind` ("gpipe" -> "FThenB", "interleaved" -> "VPP", ...);
// throws Error listing the valid kinds for an unknown one.
std::string canonical_schedule_name(std::string_view kind);

// Proves `s` runs to completion, or throws Error naming the rank, the action and what it
// waits for. Checks the structure first: every (micro-batch, virtual stage) has exactly one F
// and one B (and one W iff split_backward); every boundary crossing has exactly one SEND on
// the producing rank and one RECV on the consuming rank with the right peers; the first
// virtual stage receives no activation and sends no gradient, the last sends no activation
// and receives no gradient. Then plays all ranks: sends never block; a RECV waits for its
// SEND; F(m,s>0) waits for RECV_F(m,s); B(m,s) waits for F(m,s) and, unless s is last,
// RECV_B(m,s); SEND_F/SEND_B wait for their F/B; W waits for its B.
void validate(const Schedule& s);

struct SimResult {
  double makespan = 0;                  // time when the last action ends
  std::vector<double> busy;             // per rank: summed compute time
  std::vector<double> idle_share;       // per rank: 1 - busy/makespan (0 when makespan is 0)
  std::vector<int> peak_in_flight;      // per rank: most (microbatch, chunk) whose F is done
                                        // and whose B (W when split) is not: activations held
  std::vector<int> peak_w_pending;      // per rank, split backward: most (microbatch, chunk) whose
                                        // B is done and whose W is not: output gradients held
  std::vector<std::vector<std::pair<double, double>>> spans;  // per rank, per action in
                                        // order: (start, end); SEND/RECV zero-length
};

// Plays `s` (validating it as validate does) with compute times per virtual stage: F takes
// f[vs]; B takes b[vs] when split_backward, else b[vs] + w[vs] (the whole backward); W takes
// w[vs]. A message becomes receivable `comm` after its SEND ran; SEND/RECV take no rank time
// (a RECV's wait shows as idle). Vectors must have virtual_stages() entries, all >= 0.
// `capacity` > 0 and below the rank count: the ranks share that many ranks' worth of
// processors (thread ranks on fewer cores). While k ranks compute at once each runs at
// min(1, capacity / k) of its speed, and a rank waiting for a message leaves its share to the
// others; the times above are then each step's length when its rank runs alone. busy and
// spans are wall time. 0 (or at least the rank count): every rank has its own processor.
SimResult simulate(const Schedule& s, const std::vector<double>& f, const std::vector<double>& b,
                   const std::vector<double>& w, double comm = 0, double capacity = 0);
// The same with one time for every virtual stage. The defaults (1, 1, 1) give split and
// unsplit schedules the same total work: an unsplit B then takes 2.
SimResult simulate(const Schedule& s, double f = 1, double b = 1, double w = 1, double comm = 0);

// The idle share the literature gives: FThenB and 1F1B (p-1)/(m+p-1); VPP (p-1)/(v·m+p-1)
// (Narayanan et al. 2021); ZBH1 has no closed form under our accounting, so it returns the
// mean idle share of simulate(s, 1, 1, 1). Throws for a schedule name it does not know.
double theoretical_idle_share(const Schedule& s);

}  // namespace tessel::parallel
