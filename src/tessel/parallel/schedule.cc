// Pipeline schedules: the four generators, the structural checks, and one event-driven player
// shared by validate (zero durations: can it finish?) and simulate (real durations: when?).
#include "tessel/parallel/schedule.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <limits>
#include <optional>

#include "tessel/core/error.h"

namespace tessel::parallel {
namespace {

constexpr int kNumKinds = 7;

const char* kind_prefix(ActionKind k) {
  switch (k) {
    case ActionKind::F: return "F";
    case ActionKind::B: return "B";
    case ActionKind::W: return "W";
    case ActionKind::SEND_F: return "SF";
    case ActionKind::RECV_F: return "RF";
    case ActionKind::SEND_B: return "SB";
    case ActionKind::RECV_B: return "RB";
  }
  return "?";
}

bool is_compute(ActionKind k) { return k == ActionKind::F || k == ActionKind::B || k == ActionKind::W; }

// ---------------------------------------------------------------------------------------------
// Names

using Kind = ScheduleKind;

std::optional<Kind> parse_kind(std::string_view text) {
  std::string lower(text);
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (lower == "fthenb" || lower == "gpipe") return Kind::fthenb;
  if (lower == "1f1b") return Kind::one_f_one_b;
  if (lower == "vpp" || lower == "interleaved") return Kind::vpp;
  if (lower == "zbh1" || lower == "zb-h1") return Kind::zbh1;
  return std::nullopt;
}

constexpr const char* kValidKinds = "FThenB (alias GPipe), 1F1B, VPP (alias interleaved), ZBH1 (alias ZB-H1)";

const char* canonical_name(Kind k) {
  switch (k) {
    case Kind::fthenb: return "FThenB";
    case Kind::one_f_one_b: return "1F1B";
    case Kind::vpp: return "VPP";
    case Kind::zbh1: return "ZBH1";
  }
  return "?";
}

}  // namespace

ScheduleKind schedule_kind(std::string_view kind) {
  std::optional<Kind> k = parse_kind(kind);
  TESSEL_CHECK(k.has_value(), "unknown pipeline schedule '{}' (known: {})", kind, kValidKinds);
  return *k;
}

std::string canonical_schedule_name(std::string_view kind) { return canonical_name(schedule_kind(kind)); }

namespace {

// ---------------------------------------------------------------------------------------------
// Generators. Each appends compute steps through Builder, which brackets them with their
// messages, so the generators only decide the order of compute.

class Builder {
 public:
  explicit Builder(Schedule& s) : s_(s) { s_.ranks.assign(s_.stages, {}); }

  void forward(int rank, int mb, int chunk) {
    int vs = s_.virtual_stage(rank, chunk);
    if (vs > 0) push(rank, ActionKind::RECV_F, mb, chunk, s_.rank_of(vs - 1));
    push(rank, ActionKind::F, mb, chunk, -1);
    if (vs < last()) push(rank, ActionKind::SEND_F, mb, chunk, s_.rank_of(vs + 1));
  }
  void backward(int rank, int mb, int chunk) {
    int vs = s_.virtual_stage(rank, chunk);
    if (vs < last()) push(rank, ActionKind::RECV_B, mb, chunk, s_.rank_of(vs + 1));
    push(rank, ActionKind::B, mb, chunk, -1);
    if (vs > 0) push(rank, ActionKind::SEND_B, mb, chunk, s_.rank_of(vs - 1));
  }
  void weight(int rank, int mb, int chunk) { push(rank, ActionKind::W, mb, chunk, -1); }

 private:
  int last() const { return s_.virtual_stages() - 1; }
  void push(int rank, ActionKind kind, int mb, int chunk, int peer) {
    s_.ranks[rank].push_back(Action{kind, mb, chunk, peer});
  }
  Schedule& s_;
};

void schedule_fthenb(Schedule& s) {
  Builder out(s);
  for (int r = 0; r < s.stages; ++r) {
    for (int mb = 0; mb < s.microbatches; ++mb) out.forward(r, mb, 0);
    for (int mb = 0; mb < s.microbatches; ++mb) out.backward(r, mb, 0);
  }
}

// Rank r runs p-r-1 forwards ahead so that, once the pipeline is full, every rank alternates
// one forward and one backward; that caps the activations held on rank r at p-r.
void schedule_1f1b(Schedule& s) {
  Builder out(s);
  const int p = s.stages, m = s.microbatches;
  for (int r = 0; r < p; ++r) {
    int warmup = std::min(p - r - 1, m);
    for (int mb = 0; mb < warmup; ++mb) out.forward(r, mb, 0);
    for (int k = 0; k < m; ++k) {
      if (k + warmup < m) out.forward(r, k + warmup, 0);
      out.backward(r, k, 0);
    }
  }
}

// Megatron's interleaved 1F1B. A rank walks "virtual micro-batches" k = 0..m·v-1 in groups of
// p·v: within a group, p micro-batches go through chunk 0, then the same p through chunk 1,
// and so on (backwards visit the chunks in reverse). Rank r runs 2(p-r-1) + (v-1)p forwards
// ahead: (v-1)p fills its later chunks, and the doubled distance to the last rank covers the
// round trip that a gradient needs to come back to it. m % p == 0 keeps the groups whole.
void schedule_vpp(Schedule& s) {
  Builder out(s);
  const int p = s.stages, m = s.microbatches, v = s.chunks;
  const int total = m * v, group = p * v;
  auto microbatch = [&](int k) { return (k / group) * p + k % p; };
  auto fwd_chunk = [&](int k) { return (k % group) / p; };
  auto bwd_chunk = [&](int k) { return v - 1 - (k % group) / p; };
  for (int r = 0; r < p; ++r) {
    int warmup = std::min(2 * (p - r - 1) + (v - 1) * p, total);
    for (int k = 0; k < warmup; ++k) out.forward(r, microbatch(k), fwd_chunk(k));
    for (int k = 0; k < total; ++k) {
      if (k + warmup < total) out.forward(r, microbatch(k + warmup), fwd_chunk(k + warmup));
      out.backward(r, microbatch(k), bwd_chunk(k));
    }
  }
}

// Zero-bubble H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", section 2.1): the 1F1B
// order of F and B, with B computing only the input gradient so the gradient chain back to
// rank 0 no longer waits for weight gradients. Rank r lags its W's r micro-batches behind its
// B's — the r warm-up forwards it runs fewer than rank 0 — so every rank holds the same
// number of micro-batches (p) as rank 0 does under 1F1B, and the lagged W's fill the gaps
// of the cool-down. Held-until-W counts thus reach min(p, m) on every rank; held-until-B
// counts stay at 1F1B's min(p-r, m) (a W-pending micro-batch keeps only what W needs).
void schedule_zbh1(Schedule& s) {
  Builder out(s);
  const int p = s.stages, m = s.microbatches;
  for (int r = 0; r < p; ++r) {
    const int warmup = std::min(p - r - 1, m), lag = r;
    int next_w = 0;
    for (int mb = 0; mb < warmup; ++mb) out.forward(r, mb, 0);
    for (int k = 0; k < m; ++k) {
      if (k + warmup < m) out.forward(r, k + warmup, 0);
      out.backward(r, k, 0);
      if (k >= lag) out.weight(r, next_w++, 0);
    }
    while (next_w < m) out.weight(r, next_w++, 0);
  }
}

// ---------------------------------------------------------------------------------------------
// Structure

std::string describe(const Schedule& s) {
  return fmt::format("schedule {} (stages={}, microbatches={}, chunks={})", s.name, s.stages, s.microbatches,
                     s.chunks);
}

// Dense index of (kind, micro-batch, virtual stage): every step of a valid schedule is unique.
struct Index {
  int m, vs;
  size_t operator()(ActionKind k, int mb, int v) const {
    return (static_cast<size_t>(k) * m + mb) * vs + v;
  }
  size_t size() const { return static_cast<size_t>(kNumKinds) * m * vs; }
};

void check_sizes(const Schedule& s) {
  TESSEL_CHECK(s.stages >= 1, "{}: stages must be >= 1, got {}", describe(s), s.stages);
  TESSEL_CHECK(s.microbatches >= 1, "{}: microbatches must be >= 1, got {}", describe(s), s.microbatches);
  TESSEL_CHECK(s.chunks >= 1, "{}: chunks must be >= 1, got {}", describe(s), s.chunks);
  TESSEL_CHECK(static_cast<int>(s.ranks.size()) == s.stages, "{}: has {} rank lists, expected one per stage ({})",
               describe(s), s.ranks.size(), s.stages);
}

// Each action on its own: fields in range, a peer that really holds the neighbouring stage,
// no message across the pipeline's ends, W only when the backward is split.
void check_action(const Schedule& s, int rank, size_t pos, const Action& a) {
  const int last = s.virtual_stages() - 1;
  TESSEL_CHECK(a.microbatch >= 0 && a.microbatch < s.microbatches,
               "{}: rank {} action #{} ({}) has micro-batch {}, outside [0, {})", describe(s), rank, pos, a.str(),
               a.microbatch, s.microbatches);
  TESSEL_CHECK(a.chunk >= 0 && a.chunk < s.chunks, "{}: rank {} action #{} ({}) has chunk {}, outside [0, {})",
               describe(s), rank, pos, a.str(), a.chunk, s.chunks);
  const int vs = s.virtual_stage(rank, a.chunk);
  if (is_compute(a.kind)) {
    TESSEL_CHECK(a.peer == -1, "{}: rank {} action #{} ({}) is compute but has peer {} (expected -1)", describe(s),
                 rank, pos, a.str(), a.peer);
    TESSEL_CHECK(a.kind != ActionKind::W || s.split_backward,
                 "{}: rank {} action #{} ({}) is a W but split_backward is false (B is the whole backward)",
                 describe(s), rank, pos, a.str());
    return;
  }
  const bool downstream = a.kind == ActionKind::SEND_F || a.kind == ActionKind::RECV_B;
  const int other = downstream ? vs + 1 : vs - 1;
  TESSEL_CHECK(other >= 0 && other <= last,
               "{}: rank {} action #{} ({}) crosses past the {} virtual stage {}: nothing is there", describe(s),
               rank, pos, a.str(), downstream ? "last" : "first", vs);
  TESSEL_CHECK(a.peer == s.rank_of(other),
               "{}: rank {} action #{} ({}) has peer {}, but virtual stage {} (at the other end) is on rank {}",
               describe(s), rank, pos, a.str(), a.peer, other, s.rank_of(other));
}

// How many times each step must appear: compute once (W iff split), messages once per
// boundary crossing.
int expected_count(const Schedule& s, ActionKind k, int vs) {
  const int last = s.virtual_stages() - 1;
  switch (k) {
    case ActionKind::F:
    case ActionKind::B: return 1;
    case ActionKind::W: return s.split_backward ? 1 : 0;
    case ActionKind::SEND_F:
    case ActionKind::RECV_B: return vs < last ? 1 : 0;
    case ActionKind::RECV_F:
    case ActionKind::SEND_B: return vs > 0 ? 1 : 0;
  }
  return 0;
}

void check_structure(const Schedule& s) {
  check_sizes(s);
  const Index idx{s.microbatches, s.virtual_stages()};
  std::vector<int> count(idx.size(), 0);
  for (int r = 0; r < s.stages; ++r)
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      check_action(s, r, i, a);
      ++count[idx(a.kind, a.microbatch, s.virtual_stage(r, a.chunk))];
    }
  for (int vs = 0; vs < s.virtual_stages(); ++vs)
    for (int k = 0; k < kNumKinds; ++k)
      for (int mb = 0; mb < s.microbatches; ++mb) {
        const auto kind = static_cast<ActionKind>(k);
        const int have = count[idx(kind, mb, vs)], want = expected_count(s, kind, vs);
        TESSEL_CHECK(have == want, "{}: rank {} has {} {} time(s), expected {} (micro-batch {}, virtual stage {})",
                     describe(s), s.rank_of(vs), Action{kind, mb, s.chunk_of(vs)}.str(), have, want, mb, vs);
      }
}

// ---------------------------------------------------------------------------------------------
// Playing

// A step that must be done before another may start. `message`: the wait for a SEND, which
// becomes receivable `comm` after it ran.
struct Dep {
  ActionKind kind;
  int microbatch, vstage;
  bool message = false;
};

// The dependency rules of validate(), at most two per action.
int dependencies(const Schedule& s, const Action& a, int vs, std::array<Dep, 2>& out) {
  const int last = s.virtual_stages() - 1, mb = a.microbatch;
  int n = 0;
  switch (a.kind) {
    case ActionKind::F:
      if (vs > 0) out[n++] = {ActionKind::RECV_F, mb, vs};
      break;
    case ActionKind::B:
      out[n++] = {ActionKind::F, mb, vs};
      if (vs < last) out[n++] = {ActionKind::RECV_B, mb, vs};
      break;
    case ActionKind::W: out[n++] = {ActionKind::B, mb, vs}; break;
    case ActionKind::SEND_F: out[n++] = {ActionKind::F, mb, vs}; break;
    case ActionKind::SEND_B: out[n++] = {ActionKind::B, mb, vs}; break;
    case ActionKind::RECV_F: out[n++] = {ActionKind::SEND_F, mb, vs - 1, true}; break;
    case ActionKind::RECV_B: out[n++] = {ActionKind::SEND_B, mb, vs + 1, true}; break;
  }
  return n;
}

// When action `a` (at virtual stage vs) may start given each step's end time (-1: not done):
// the latest of its dependencies' ends, a message's `comm` later; -1 while one is not done.
double ready_time(const Schedule& s, const Action& a, int vs, const Index& idx, const std::vector<double>& end,
                  double comm) {
  std::array<Dep, 2> deps;
  double ready = 0;
  for (int i = 0, n = dependencies(s, a, vs, deps); i < n; ++i) {
    const double t = end[idx(deps[i].kind, deps[i].microbatch, deps[i].vstage)];
    if (t < 0) return -1;
    ready = std::max(ready, t + (deps[i].message ? comm : 0.0));
  }
  return ready;
}

// Runs every rank's list in order, each action as soon as its dependencies are done (list
// scheduling: the order is fixed, only start times are free). `duration(a, vs)` is a compute
// step's length. Returns (start, end) per action; throws naming each stuck rank on a deadlock.
// Requires check_structure(s) to have passed, so every dependency exists exactly once.
template <typename Duration>
std::vector<std::vector<std::pair<double, double>>> play(const Schedule& s, Duration duration, double comm) {
  const Index idx{s.microbatches, s.virtual_stages()};
  std::vector<double> end(idx.size(), -1);  // end time of each step; -1: not done yet
  std::vector<std::vector<std::pair<double, double>>> spans(s.stages);
  std::vector<size_t> next(s.stages, 0);
  std::vector<double> clock(s.stages, 0);
  size_t remaining = 0;
  for (const auto& list : s.ranks) remaining += list.size();

  std::array<Dep, 2> deps;
  while (remaining > 0) {
    bool progressed = false;
    for (int r = 0; r < s.stages; ++r) {
      const auto& list = s.ranks[r];
      while (next[r] < list.size()) {
        const Action& a = list[next[r]];
        const int vs = s.virtual_stage(r, a.chunk);
        const double ready = ready_time(s, a, vs, idx, end, comm);
        if (ready < 0) break;
        const double start = std::max(clock[r], ready);
        double stop = start + (is_compute(a.kind) ? duration(a, vs) : 0.0);
        spans[r].emplace_back(start, stop);
        end[idx(a.kind, a.microbatch, vs)] = stop;
        clock[r] = stop;
        ++next[r];
        --remaining;
        progressed = true;
      }
    }
    if (progressed) continue;
    std::string stuck;
    for (int r = 0; r < s.stages; ++r) {
      if (next[r] == s.ranks[r].size()) continue;
      const Action& a = s.ranks[r][next[r]];
      const int vs = s.virtual_stage(r, a.chunk);
      for (int i = 0, n = dependencies(s, a, vs, deps); i < n; ++i) {
        if (end[idx(deps[i].kind, deps[i].microbatch, deps[i].vstage)] >= 0) continue;
        const Action waited{deps[i].kind, deps[i].microbatch, s.chunk_of(deps[i].vstage)};
        stuck += fmt::format("{}rank {} is stuck at {} (action #{}) waiting for {} on rank {}", stuck.empty() ? "" : "; ",
                             r, a.str(), next[r], waited.str(), s.rank_of(deps[i].vstage));
        break;
      }
    }
    TESSEL_THROW("{} deadlocks: {}", describe(s), stuck);
  }
  return spans;
}

// play() on ranks that share `capacity` ranks' worth of processors: while k ranks compute at
// once, each progresses at min(1, capacity / k) of its own speed (processor sharing), and a
// rank waiting for a message uses none. Event by event: start what is ready, run the busy
// ranks at the shared rate until the next one finishes or a message arrives. Requires the
// schedule to have passed play() (no deadlock), so some rank always runs or waits on a message.
template <typename Duration>
std::vector<std::vector<std::pair<double, double>>> play_shared(const Schedule& s, Duration duration, double comm,
                                                                double capacity) {
  constexpr double kNever = std::numeric_limits<double>::infinity();
  const Index idx{s.microbatches, s.virtual_stages()};
  std::vector<double> end(idx.size(), -1);  // end time of each step; -1: not done yet
  std::vector<std::vector<std::pair<double, double>>> spans(s.stages);
  std::vector<size_t> next(s.stages, 0);
  std::vector<double> left(s.stages, -1);  // work left in the running compute step; -1: none
  std::vector<double> started(s.stages, 0);
  size_t remaining = 0;
  for (const auto& list : s.ranks) remaining += list.size();

  double now = 0;
  auto finish = [&](int r, double start) {
    const Action& a = s.ranks[r][next[r]];
    spans[r].emplace_back(start, now);
    end[idx(a.kind, a.microbatch, s.virtual_stage(r, a.chunk))] = now;
    ++next[r];
    --remaining;
  };
  // Starts rank r's next steps that are ready at `now`: zero-length ones run through, a compute
  // step is left running. Returns whether anything started; lowers `wake` to the time an
  // awaited message becomes receivable.
  auto start_ready = [&](int r, double& wake) {
    bool started_any = false;
    while (left[r] < 0 && next[r] < s.ranks[r].size()) {
      const Action& a = s.ranks[r][next[r]];
      const int vs = s.virtual_stage(r, a.chunk);
      const double ready_at = ready_time(s, a, vs, idx, end, comm);
      if (ready_at < 0) return started_any;
      if (ready_at > now) {
        wake = std::min(wake, ready_at);
        return started_any;
      }
      const double work = is_compute(a.kind) ? duration(a, vs) : 0.0;
      if (work > 0) {
        left[r] = work;
        started[r] = now;
      } else {
        finish(r, now);
      }
      started_any = true;
    }
    return started_any;
  };
  while (remaining > 0) {
    double wake = kNever;
    // A zero-length step may free another rank's next one: sweep until nothing starts.
    for (bool progressed = true; progressed;) {
      progressed = false;
      wake = kNever;
      for (int r = 0; r < s.stages; ++r) progressed = start_ready(r, wake) || progressed;
    }
    if (remaining == 0) break;
    const auto running = std::count_if(left.begin(), left.end(), [](double w) { return w >= 0; });
    const double rate = running > 0 ? std::min(1.0, capacity / static_cast<double>(running)) : 0.0;
    double event = wake;
    for (int r = 0; r < s.stages; ++r)
      if (left[r] >= 0) event = std::min(event, now + left[r] / rate);
    TESSEL_CHECK(event < kNever, "simulate {}: no rank can run (internal error: the schedule passed validation)",
                 describe(s));
    for (int r = 0; r < s.stages; ++r) {
      if (left[r] < 0) continue;
      const double finish_at = now + left[r] / rate;
      left[r] = finish_at <= event * (1 + 1e-12) ? 0 : left[r] - (event - now) * rate;
    }
    now = event;
    for (int r = 0; r < s.stages; ++r)
      if (left[r] == 0) {
        left[r] = -1;
        finish(r, started[r]);
      }
  }
  return spans;
}

void check_times(const Schedule& s, const char* what, const std::vector<double>& t) {
  TESSEL_CHECK(static_cast<int>(t.size()) == s.virtual_stages(),
               "simulate {}: {} has {} entries, expected one per virtual stage ({})", describe(s), what, t.size(),
               s.virtual_stages());
  for (size_t i = 0; i < t.size(); ++i)
    TESSEL_CHECK(std::isfinite(t[i]) && t[i] >= 0, "simulate {}: {}[{}] = {} must be finite and >= 0", describe(s),
                 what, i, t[i]);
}

}  // namespace

std::string Action::str() const { return fmt::format("{}{}.{}", kind_prefix(kind), microbatch, chunk); }

Schedule make_schedule(std::string_view kind, int stages, int microbatches, int chunks) {
  std::optional<Kind> k = parse_kind(kind);
  TESSEL_CHECK(k.has_value(), "unknown pipeline schedule '{}'; valid: {}", kind, kValidKinds);
  const char* name = canonical_name(*k);
  TESSEL_CHECK(stages >= 1, "make_schedule({}): stages must be >= 1, got {}", name, stages);
  TESSEL_CHECK(microbatches >= 1, "make_schedule({}): microbatches must be >= 1, got {}", name, microbatches);
  TESSEL_CHECK(chunks >= 1, "make_schedule({}): chunks must be >= 1, got {}", name, chunks);
  TESSEL_CHECK(chunks == 1 || *k == Kind::vpp,
               "make_schedule({}): chunks must be 1 (only VPP places several chunks per rank), got {}", name, chunks);
  TESSEL_CHECK(chunks == 1 || microbatches % stages == 0,
               "make_schedule(VPP): microbatches ({}) must be a multiple of stages ({}) when chunks ({}) > 1",
               microbatches, stages, chunks);

  Schedule s;
  s.name = name;
  s.stages = stages;
  s.microbatches = microbatches;
  s.chunks = chunks;
  s.split_backward = *k == Kind::zbh1;
  switch (*k) {
    case Kind::fthenb: schedule_fthenb(s); break;
    case Kind::one_f_one_b: schedule_1f1b(s); break;
    case Kind::vpp: chunks == 1 ? schedule_1f1b(s) : schedule_vpp(s); break;
    case Kind::zbh1: schedule_zbh1(s); break;
  }
  return s;
}

void validate(const Schedule& s) {
  check_structure(s);
  play(s, [](const Action&, int) { return 0.0; }, 0.0);
}

SimResult simulate(const Schedule& s, const std::vector<double>& f, const std::vector<double>& b,
                   const std::vector<double>& w, double comm, double capacity) {
  check_structure(s);
  check_times(s, "f", f);
  check_times(s, "b", b);
  check_times(s, "w", w);
  TESSEL_CHECK(std::isfinite(comm) && comm >= 0, "simulate {}: comm = {} must be finite and >= 0", describe(s), comm);
  TESSEL_CHECK(std::isfinite(capacity) && capacity >= 0, "simulate {}: capacity = {} must be finite and >= 0",
               describe(s), capacity);
  auto duration = [&](const Action& a, int vs) {
    switch (a.kind) {
      case ActionKind::F: return f[vs];
      case ActionKind::B: return s.split_backward ? b[vs] : b[vs] + w[vs];
      case ActionKind::W: return w[vs];
      default: return 0.0;
    }
  };

  SimResult out;
  if (capacity > 0 && capacity < s.stages) {
    play(s, [](const Action&, int) { return 0.0; }, 0.0);  // throws on a deadlock
    out.spans = play_shared(s, duration, comm, capacity);
  } else {
    out.spans = play(s, duration, comm);
  }
  out.busy.assign(s.stages, 0);
  out.peak_in_flight.assign(s.stages, 0);
  out.peak_w_pending.assign(s.stages, 0);
  // Activations of a (micro-batch, chunk) are held from its F until the step that finishes
  // its backward: W when the backward is split, B otherwise.
  const ActionKind release = s.split_backward ? ActionKind::W : ActionKind::B;
  for (int r = 0; r < s.stages; ++r) {
    int held = 0, pending = 0;
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      const auto [start, stop] = out.spans[r][i];
      out.makespan = std::max(out.makespan, stop);
      if (is_compute(a.kind)) out.busy[r] += stop - start;
      if (a.kind == ActionKind::F) out.peak_in_flight[r] = std::max(out.peak_in_flight[r], ++held);
      if (a.kind == release) --held;
      if (s.split_backward && a.kind == ActionKind::B) out.peak_w_pending[r] = std::max(out.peak_w_pending[r], ++pending);
      if (s.split_backward && a.kind == ActionKind::W) --pending;
    }
  }
  for (double busy : out.busy) out.idle_share.push_back(out.makespan > 0 ? 1 - busy / out.makespan : 0.0);
  return out;
}

SimResult simulate(const Schedule& s, double f, double b, double w, double comm) {
  check_sizes(s);
  const auto n = static_cast<size_t>(s.virtual_stages());
  return simulate(s, std::vector<double>(n, f), std::vector<double>(n, b), std::vector<double>(n, w), comm);
}

double theoretical_idle_share(const Schedule& s) {
  std::optional<Kind> k = parse_kind(s.name);
  TESSEL_CHECK(k.has_value(), "theoretical_idle_share: unknown schedule name '{}'; valid: {}", s.name, kValidKinds);
  check_sizes(s);
  const double p = s.stages, m = s.microbatches, v = s.chunks;
  switch (*k) {
    case Kind::fthenb:
    case Kind::one_f_one_b: return (p - 1) / (m + p - 1);
    case Kind::vpp: return (p - 1) / (v * m + p - 1);
    case Kind::zbh1: {
      SimResult r = simulate(s, 1.0, 1.0, 1.0);
      double sum = 0;
      for (double x : r.idle_share) sum += x;
      return sum / s.stages;
    }
  }
  return 0;
}

std::string Schedule::grid() const {
  // Unit times make every start an integer: the column of a step is its start time.
  const SimResult sim = simulate(*this, 1.0, 1.0, split_backward ? 1.0 : 0.0);
  const int steps = static_cast<int>(std::lround(sim.makespan));
  std::vector<std::vector<std::string>> cells(stages, std::vector<std::string>(steps, "."));
  size_t width = 1;
  for (int r = 0; r < stages; ++r)
    for (size_t i = 0; i < ranks[r].size(); ++i) {
      if (!is_compute(ranks[r][i].kind)) continue;
      const double start = sim.spans[r][i].first;
      const int col = static_cast<int>(std::lround(start));
      TESSEL_ASSERT(col == start && col < steps, "unit-time step starts at {}", start);
      cells[r][col] = ranks[r][i].str();
      width = std::max(width, cells[r][col].size());
    }
  const size_t rank_width = fmt::format("{}", stages - 1).size();
  std::string out;
  for (int r = 0; r < stages; ++r) {
    // A rank's line ends with its last step: the idle tail until the makespan is left out.
    size_t used = cells[r].size();
    while (used > 0 && cells[r][used - 1] == ".") --used;
    std::string line = fmt::format("rank {:<{}} |", r, rank_width);
    for (size_t c = 0; c < used; ++c) line += fmt::format(" {:^{}}", cells[r][c], width);
    out += line + '\n';
  }
  return out;
}

}  // namespace tessel::parallel
