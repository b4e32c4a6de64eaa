// The block tracer hook and the cache of traced blocks.
#include "tessel/plan/traced.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>

#include "tessel/core/error.h"

namespace tessel::plan {

namespace {

struct Tracing {
  std::mutex mutex;
  std::condition_variable traced;  // a block left `tracing`
  BlockTracer tracer;
  std::map<std::string, BlockTrace> blocks;  // by block_key
  std::set<std::string> tracing;             // being traced now (the search screens on several threads)
};

Tracing& tracing() {
  static Tracing t;
  return t;
}

// Everything a block's trace depends on (recompute aside: blocks are traced without it).
std::string block_key(const ModelSpec& m, const LayerShape& s) {
  const std::string moe = m.is_moe() && s.moe ? fmt::format("moe {},{},{},{},ep {}", m.experts, m.top_k, m.shared_ffn,
                                                           m.capacity_factor, s.ep)
                                              : "dense";
  return fmt::format("{}|{}|{},{},{},{},{},{},{},{},{}|{}|{}|{}|{},{}|{}", m.arch, m.name, m.hidden, m.heads,
                     m.kv_heads, m.ffn, m.vocab, m.seq, m.dropout, m.attn_rate(), m.embd_rate(), s.micro_batch, s.tp,
                     s.sp, s.cp, s.cp_method, moe);
}

std::string call_key(const OpCallRecord& r) {
  return fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}", r.op, r.backward, r.recompute, r.cost.flops, r.cost.bytes, r.m, r.n,
                     r.k, r.batch);
}

// What the optimizer does per step; the planner costs the update apart (per parameter).
bool optimizer_op(const std::string& op) { return op == "adamw_update" || op == "sgd_update" || op == "sum_squares"; }

thread_local bool t_listed_cp = false;

}  // namespace

ListedContextParallelScope::ListedContextParallelScope() : previous_(t_listed_cp) { t_listed_cp = true; }
ListedContextParallelScope::~ListedContextParallelScope() { t_listed_cp = previous_; }

bool traceable(const ModelSpec& /*m*/, const LayerShape& s) { return has_block_tracer() && !(s.cp > 1 && t_listed_cp); }

void set_block_tracer(BlockTracer tracer) {
  Tracing& t = tracing();
  std::lock_guard lock(t.mutex);
  t.tracer = std::move(tracer);
  t.blocks.clear();
}

bool has_block_tracer() {
  Tracing& t = tracing();
  std::lock_guard lock(t.mutex);
  return static_cast<bool>(t.tracer);
}

const BlockTrace& traced_block(const ModelSpec& m, const LayerShape& shape) {
  Tracing& t = tracing();
  LayerShape s = shape;
  s.recompute = "none";
  const std::string key = block_key(m, s);
  BlockTracer tracer;
  {
    // One trace per block: a thread asking for a block another is tracing waits for it.
    std::unique_lock lock(t.mutex);
    t.traced.wait(lock, [&] { return !t.tracing.contains(key); });
    if (auto it = t.blocks.find(key); it != t.blocks.end()) return it->second;
    TESSEL_CHECK(static_cast<bool>(t.tracer), "traced costs: no block tracer is installed (engine's install_block_tracer)");
    tracer = t.tracer;
    t.tracing.insert(key);
  }
  // Whatever happens, the key leaves `tracing` and the waiting threads look again.
  struct Done {
    Tracing& t;
    const std::string& key;
    ~Done() {
      {
        std::lock_guard lock(t.mutex);
        t.tracing.erase(key);
      }
      t.traced.notify_all();
    }
  } done{t, key};
  const StepTrace one = tracer(m, s, 1), two = tracer(m, s, 2);
  BlockTrace b;
  // The second block's calls: the two-block step's less the one-block step's, as multisets.
  std::map<std::string, int> base;
  for (const OpCallRecord& r : one.ops.calls) ++base[call_key(r)];
  for (const OpCallRecord& r : two.ops.calls) {
    int& n = base[call_key(r)];
    if (n > 0) {
      --n;
      continue;
    }
    if (!optimizer_op(r.op)) b.calls.push_back(r);
  }
  std::map<std::pair<std::string, std::string>, TracedCollective> comm;
  for (const TracedCollective& x : two.comm) {
    TracedCollective& y = comm[{x.dim, x.kind}];
    y.dim = x.dim;
    y.kind = x.kind;
    y.calls += x.calls;
    y.bytes += x.bytes;
  }
  for (const TracedCollective& x : one.comm) {
    TracedCollective& y = comm[{x.dim, x.kind}];
    y.calls -= x.calls;
    y.bytes -= x.bytes;
  }
  for (const auto& [k, x] : comm)  // a per-step sum grows in bytes, not in calls
    if (x.calls != 0 || x.bytes != 0) b.comm.push_back(x);
  std::lock_guard lock(t.mutex);
  return t.blocks.emplace(key, std::move(b)).first->second;
}

}  // namespace tessel::plan
