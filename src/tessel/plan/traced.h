// Traced costs: the planner asks the runtime what a transformer block of a layout does, instead
// of describing the block itself. The engine layer (above this one) installs a BlockTracer that
// runs the model's training step in meta mode on one rank of a trace world (engine/trace.h):
// every op's FLOPs, bytes and product sizes, every collective by mesh dim. A block's share is
// the difference between the steps of a model with two blocks and with one; it is traced once
// per distinct block layout (model, micro-batch, tp, sp, cp, ep, recompute) and cached, so a
// search over tens of thousands of layouts traces a few dozen blocks.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tessel/ops/trace.h"
#include "tessel/plan/cluster.h"
#include "tessel/plan/cost_model.h"
#include "tessel/plan/model_spec.h"

namespace tessel::plan {

// One kind of collective on one mesh dim's group in a traced step, as this rank issued it.
struct TracedCollective {
  std::string dim;   // tp | cp | ep | dp | pp | world
  std::string kind;  // all_reduce, all_gather, reduce_scatter, all_to_all, send, recv, ...
  int64_t calls = 0;
  int64_t bytes = 0;
  bool operator==(const TracedCollective&) const = default;
};

// A traced training step of `layers` blocks (one micro-batch, dp = pp = 1).
struct StepTrace {
  OpTrace ops;
  std::vector<TracedCollective> comm;
};

// The time of traced collectives on one mesh dim's group of span `g`, their bytes scaled by
// `scale` (the cluster's precision over the trace's f32). CommStats' bytes: the buffer of an
// all_reduce, each rank's input of an all_gather, the full input of a reduce_scatter, what a
// rank sends of an all_to_all. A collective with bytes and no calls (a per-step sum that grew)
// is timed for its bytes alone.
double traced_comm_time(const Cluster& c, const TracedCollective& x, GroupSpan g, double scale);

using BlockTracer = std::function<StepTrace(const ModelSpec& m, const LayerShape& s, int layers)>;
// Installs the tracer (the engine layer's install_block_tracer does); null removes it.
void set_block_tracer(BlockTracer tracer);
bool has_block_tracer();

// One block of `m` laid out as `s`: its calls (the two-block step's less the one-block step's)
// and its collectives per micro-batch. Traced without recompute (what recompute redoes is the
// block's forward, or the attention's scores: traced_layer_cost adds it) and cached per
// distinct (model, shape).
struct BlockTrace {
  std::vector<OpCallRecord> calls;
  std::vector<TracedCollective> comm;
};
const BlockTrace& traced_block(const ModelSpec& m, const LayerShape& s);

// layer_cost from a traced block: each call's time on the roofline of `c` (products at the
// device's GEMM efficiency for their sizes, the rest at memory bandwidth, the software's
// per-kernel overhead), the software's attention (fused, or unfused as Megatron 2021 ran it,
// on the traced sdpa's shapes), forward work redone in the backward (recompute) kept apart, and
// the tensor-, context- and expert-parallel collectives the block issued, timed by group span.
// One op of a traced block as costed: its calls, FLOPs, bytes (at the cluster's precision) and
// seconds per micro-batch (forward; backward; rerun by recompute apart).
struct OpTime {
  std::string op;
  std::string pass;  // forward | backward | recompute
  int64_t calls = 0;
  double flops = 0, bytes = 0, seconds = 0;
};
LayerCost traced_layer_cost(const ModelSpec& m, const Cluster& c, const LayerShape& s,
                            std::vector<OpTime>* breakdown = nullptr);
// Whether layer_cost traces this block: a tracer is installed (and, for a context-parallel
// block, no ListedContextParallelScope lives). A sparse block is traced with a balanced router —
// in meta mode the router sends each expert tokens x top_k / experts rows — and the busiest
// expert rank's excess (moe_imbalance) is applied to its grouped products.
bool traceable(const ModelSpec& m, const LayerShape& s);

// While it lives (on this thread), context-parallel blocks are costed from the cost model's list
// (layer_cost's own): a search screens its tens of thousands of candidates in closed form this
// way — a traced cp block runs the ring's cp steps on a mesh of tp x cp ranks, and the degrees a
// long sequence admits reach the thousands — and then costs the candidates whose schedules it
// plays, the ones it reports, from traces.
class ListedContextParallelScope {
 public:
  ListedContextParallelScope();
  ~ListedContextParallelScope();
  ListedContextParallelScope(const ListedContextParallelScope&) = delete;
  ListedContextParallelScope& operator=(const ListedContextParallelScope&) = delete;

 private:
  bool previous_;
};

}  // namespace tessel::plan
