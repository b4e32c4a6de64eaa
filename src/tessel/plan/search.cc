// The layout search: the candidates tessel train accepts, ranked by the closed-form estimate,
// the best played through their schedules (planner.h).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/plan/evaluate.h"
#include "tessel/plan/traced.h"

namespace tessel::plan {

namespace {

// Plans in the order they are offered: the fastest first; at the same predicted step time the
// one leaving more memory free (ZeRO-2 beside ZeRO-1 often predicts the same time); then by
// the layout's text, so the order never depends on the sort.
bool faster(const Estimate& a, const Estimate& b) {
  if (a.step_time != b.step_time) return a.step_time < b.step_time;
  if (a.memory.total() != b.memory.total()) return a.memory.total() < b.memory.total();
  return a.layout.str() < b.layout.str();
}

// Divisors of n in increasing order; 64-bit, so n near INT_MAX cannot wrap the counter (it
// once did, then divided by zero).
std::vector<int> divisors(int n) {
  std::vector<int> low, high;
  for (int64_t i = 1; i * i <= n; ++i) {
    if (n % i != 0) continue;
    low.push_back(static_cast<int>(i));
    if (i * i != n) high.push_back(static_cast<int>(n / i));
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

}  // namespace

std::vector<Layout> candidate_layouts(const ModelSpec& m, const Cluster& c, const PlanOptions& o) {
  validate(m);
  TESSEL_CHECK(o.global_batch > 0, "plan: the global batch must be positive");
  detail::check_cluster_counts(c);
  detail::check_sizes(m, o.global_batch, std::min(o.max_micro_batch, o.global_batch));
  const int n = c.devices();
  // With fused attention selective recompute holds and costs what none does: not offered.
  std::vector<std::string> recomputes = {"none", "selective", "full"};
  if (c.software.fused_attention) recomputes = {"none", "full"};
  if (!o.recompute.empty()) recomputes = o.recompute;
  std::vector<Layout> out;
  for (int tp : divisors(std::min(n, c.devices_per_node))) {
    if (n % tp != 0 || m.heads % tp != 0 || m.kv_heads % tp != 0) continue;
    // Context parallel: each degree by each method the runtime accepts for this model.
    std::vector<std::pair<int, std::string>> contexts = {{1, "ring"}};
    if (o.allow_cp)
      for (int cp : divisors(n / tp)) {
        if (cp == 1 || cp > m.seq) continue;
        for (const char* method : {"ring", "all_to_all"})
          if (cp_refusal(m, tp, cp, method).empty()) contexts.push_back({cp, method});
      }
    // Expert parallel: degrees dividing the experts (the runtime's rule), for sparse models.
    struct Extra {
      int cp;
      std::string cp_method;
      int ep;
    };
    std::vector<Extra> extras;
    for (const auto& [cp, method] : contexts)
      for (int ep : divisors(n / (tp * cp)))
        if (ep == 1 || (o.allow_ep && m.is_moe() && m.experts % ep == 0)) extras.push_back({cp, method, ep});
    for (const Extra& x : extras) {
      const int cp = x.cp, ep = x.ep;
      const std::string& cp_method = x.cp_method;
      for (int pp : divisors(n / (tp * cp * ep))) {
        if (pp > m.layers) continue;
        const int dp = n / (tp * cp * ep * pp);
        const int64_t shards = static_cast<int64_t>(dp) * ep;
        for (int64_t mbs = 1; mbs <= o.max_micro_batch; mbs *= 2) {
          if (o.global_batch % (shards * mbs) != 0) continue;
          const int64_t micro = o.global_batch / (shards * mbs);
          std::vector<std::pair<std::string, int>> schedules;
          if (pp == 1) {
            schedules.push_back({"1F1B", 1});
          } else {
            for (const std::string& s : o.schedules) {
              if (s != "VPP") {
                schedules.push_back({s, 1});
                continue;
              }
              if (micro % pp != 0) continue;
              for (int v = 2; v <= o.max_vpp; ++v)
                if (static_cast<int64_t>(pp) * v <= m.layers && m.layers % (static_cast<int64_t>(pp) * v) == 0)
                  schedules.push_back({"VPP", v});
            }
          }
          for (const auto& [schedule, vpp] : schedules)
            for (const std::string& rc : recomputes)
              for (int sp = 0; sp <= (tp > 1 ? 1 : 0); ++sp)
                for (int stage = 0; stage <= (dp > 1 && o.allow_sharding ? 3 : 0); ++stage) {
                  Layout l;
                  l.dp = dp;
                  l.tp = tp;
                  l.pp = pp;
                  l.vpp = vpp;
                  l.micro_batch = mbs;
                  l.micro_batches = micro;
                  l.schedule = schedule;
                  l.recompute = rc;
                  l.sp = sp == 1;
                  l.sharding_stage = stage;
                  l.ep = ep;
                  l.cp = cp;
                  l.cp_method = cp_method;
                  out.push_back(std::move(l));
                }
        }
      }
    }
  }
  return out;
}

std::string cp_refusal(const ModelSpec& m, int tp, int cp, const std::string& method) {
  if (cp <= 1) return "";
  if (m.is_moe() && m.capacity_factor > 0)
    return fmt::format(
        "cp {}: a capacity (factor {}) ranks each sequence's assignments together, and tessel's runtime "
        "refuses context parallel for mixture-of-experts blocks with one",
        cp, m.capacity_factor);
  if (method == "ring") {
    if (m.seq % (2 * cp) != 0)
      return fmt::format(
          "cp {} ring: the sequence length {} must be a multiple of 2 x cp = {} (each rank holds a "
          "chunk from each end)",
          cp, m.seq, 2 * cp);
    return "";
  }
  if (method == "all_to_all") {
    if (m.heads % (tp * cp) != 0 || m.kv_heads % (tp * cp) != 0)
      return fmt::format("cp {} all_to_all: tp x cp = {} must divide the {} heads and {} kv heads", cp, tp * cp,
                         m.heads, m.kv_heads);
    if (m.seq % cp != 0) return fmt::format("cp {} all_to_all: the sequence length {} must be a multiple of cp", cp, m.seq);
    return "";
  }
  return fmt::format("cp_method must be ring or all_to_all, got '{}'", method);
}

namespace {

// Runs work(unit, cache) for the units [0, n) on up to `threads` threads, each taking the next
// unit and keeping a cost cache of its own (a cached cost is the same whichever thread made
// it). When a unit throws, the others stop at their next unit and the exception of the lowest
// unit that threw is rethrown.
template <typename Work>
void on_threads(size_t n, int threads, const Work& work) {
  const auto count = std::clamp<size_t>(static_cast<size_t>(std::max(threads, 1)), 1, std::max<size_t>(n, 1));
  std::atomic<size_t> next{0};
  std::vector<size_t> failed_at(count, std::numeric_limits<size_t>::max());
  std::vector<std::exception_ptr> errors(count);
  auto run = [&](size_t t) {
    detail::CostCache cache;
    for (size_t u; (u = next.fetch_add(1)) < n;) {
      try {
        work(u, cache);
      } catch (...) {
        failed_at[t] = u;
        errors[t] = std::current_exception();
        next = n;
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < count; ++t) pool.emplace_back(run, t);
  run(0);
  for (std::thread& t : pool) t.join();
  size_t first = 0;
  for (size_t t = 1; t < count; ++t)
    if (failed_at[t] < failed_at[first]) first = t;
  if (errors[first]) std::rethrow_exception(errors[first]);
}

}  // namespace

SearchResult search(const ModelSpec& m, const Cluster& c, const PlanOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  SearchResult result;
  const int threads = o.threads > 0 ? o.threads : default_num_threads();
  std::vector<Estimate> feasible;
  {
    // Screening in closed form, on several threads, a chunk of candidates at a time; what fits
    // is gathered in candidate order, so the result does not depend on the threads.
    // Context-parallel blocks come from the listed model (traced below for the candidates
    // played). Chunks are handed out in bit-reversed order, so concurrent threads work on
    // candidates far apart in the list: neighbours need the same blocks traced, and a block
    // one thread is tracing another waits for.
    const std::vector<Layout> layouts = candidate_layouts(m, c, o);
    result.candidates = static_cast<int64_t>(layouts.size());
    constexpr size_t kChunk = 256;
    const size_t chunks = (layouts.size() + kChunk - 1) / kChunk;
    int bits = 0;
    while ((size_t{1} << bits) < chunks) ++bits;
    std::vector<size_t> chunk_order;
    chunk_order.reserve(chunks);
    for (size_t k = 0; k < (size_t{1} << bits); ++k) {
      size_t r = 0;
      for (int b = 0; b < bits; ++b) r |= ((k >> b) & 1) << (bits - 1 - b);
      if (r < chunks) chunk_order.push_back(r);
    }
    std::vector<std::vector<Estimate>> fits(chunks);  // by chunk, in candidate order
    on_threads(chunks, threads, [&](size_t k, detail::CostCache& cache) {
      ListedContextParallelScope listed_cp;
      const size_t chunk = chunk_order[k];
      for (size_t i = chunk * kChunk; i < std::min((chunk + 1) * kChunk, layouts.size()); ++i) {
        Estimate e = detail::evaluate_with(m, c, layouts[i], o.global_batch, false, &cache);
        if (e.fits) fits[chunk].push_back(std::move(e));
      }
    });
    for (std::vector<Estimate>& f : fits)
      for (Estimate& e : f) feasible.push_back(std::move(e));
    result.feasible = static_cast<int64_t>(feasible.size());
  }
  // By `faster` (a total order: ties go to the layout's text): the fastest closed-form first.
  // Indices are sorted, not the estimates themselves.
  {
    std::vector<size_t> order(feasible.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return faster(feasible[a], feasible[b]); });
    std::vector<Estimate> sorted;
    sorted.reserve(feasible.size());
    for (size_t i : order) sorted.push_back(std::move(feasible[i]));
    feasible = std::move(sorted);
  }
  // Play the schedules of the best candidates, fastest closed-form first, until enough are
  // played or the next one cannot beat the k-th played by 20%. The most that can be played
  // are played ahead on the threads; the rule then walks them in order as before (a
  // candidate's failure counts only if the walk reaches it).
  const size_t ahead = std::min(feasible.size(), static_cast<size_t>(std::max(o.max_simulations, 0)));
  std::vector<Estimate> simulated(ahead);
  std::vector<std::exception_ptr> failed(ahead);
  on_threads(ahead, threads, [&](size_t i, detail::CostCache& cache) {
    try {
      simulated[i] = detail::evaluate_with(m, c, feasible[i].layout, o.global_batch, true, &cache);
    } catch (...) {
      failed[i] = std::current_exception();
    }
  });
  std::vector<Estimate> played;
  for (size_t i = 0; i < feasible.size(); ++i) {
    if (result.simulated >= o.max_simulations) break;
    if (static_cast<int>(played.size()) >= o.top) {
      std::vector<double> times;
      for (const Estimate& e : played) times.push_back(e.step_time);
      std::nth_element(times.begin(), times.begin() + (o.top - 1), times.end());
      if (feasible[i].step_time > 1.2 * times[static_cast<size_t>(o.top - 1)]) break;
    }
    if (failed[i]) std::rethrow_exception(failed[i]);
    Estimate& e = simulated[i];
    ++result.simulated;
    if (e.fits) played.push_back(std::move(e));
  }
  // The layouts reported get the runtime's traced step where it applies (its data-parallel and
  // pipeline traffic, its memory); one that then does not fit is dropped.
  detail::CostCache played_cache;
  for (Estimate& e : played) detail::trace_step(m, c, o.global_batch, true, &played_cache, e);
  std::erase_if(played, [](const Estimate& e) { return !e.fits; });
  std::sort(played.begin(), played.end(), faster);
  if (static_cast<int>(played.size()) > o.top) played.resize(static_cast<size_t>(o.top));
  result.best = std::move(played);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace tessel::plan
