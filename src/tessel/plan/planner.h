// The planner: evaluates a parallel layout of a model on a cluster — step time from the cost
// model and the very pipeline schedules the runtime executes (parallel::make_schedule, played
// by parallel::simulate), memory per device — and searches all sensible layouts for the best.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/json.h"
#include "tessel/plan/cluster.h"
#include "tessel/plan/cost_model.h"
#include "tessel/plan/model_spec.h"
#include "tessel/plan/traced.h"

namespace tessel::plan {

// A whole parallel layout. Mesh dims are [pp, dp, ep, cp, tp] as the runtime builds them (ep
// and cp only when used). The batch splits over dp x ep (expert parallel ranks split it too,
// inside data parallel: dense parameters are replicated over dp x ep x cp, experts split over ep
// and replicated over dp), the sequence over cp.
struct Layout {
  int dp = 1, tp = 1, pp = 1, vpp = 1;
  int ep = 1;                        // expert parallel (mixture-of-experts models)
  int cp = 1;                        // context parallel
  std::string cp_method = "ring";    // ring | all_to_all (with cp > 1)
  int sharding_stage = 0;            // ZeRO 0-3 over dp
  bool sp = false;                   // sequence parallel (with tp > 1)
  int64_t micro_batch = 1;           // sequences per micro-batch (of each dp x ep rank)
  int64_t micro_batches = 1;         // per data-parallel replica per step
  std::string schedule = "1F1B";     // FThenB | 1F1B | VPP | ZBH1
  std::string recompute = "none";    // none | selective | full
  // The gradient bucket (parallel.bucket_mb): chosen by the planner from the data-parallel
  // group's links (bucket_bytes_for), not part of the --layout text.
  double bucket_mb = 4;

  int devices() const { return dp * ep * cp * tp * pp; }
  int batch_shards() const { return dp * ep; }  // ranks the batch splits over
  // "dp=6,tp=8,pp=64,vpp=2,mbs=1,sharding_stage=0,sp=false,recompute=full,schedule=VPP", with
  // ",ep=8" and ",cp=2,cp_method=ring" after it where used.
  std::string str() const;
};

// The gradient bucket the cost model justifies for a data-parallel group spanning `dp` on `c`:
// the smallest power of two from 1 MiB up whose reduce-scatter spends at most 10% of its time
// on latency (the time of a 4-byte one), at most 256 MiB. A larger bucket only costs: two are
// alive at once (memory), and the last one's transfer is the exposed tail after the backward.
double bucket_bytes_for(const Cluster& c, GroupSpan dp);

// Parses the --layout text (keys as str() writes them, any order; missing keys default: dp
// from the device count, ep and cp 1, cp_method ring, mbs 1, vpp 1, schedule VPP when vpp > 1
// else 1F1B); micro_batches
// follows from the global batch. Throws naming the key on anything it cannot use.
Layout parse_layout(const std::string& text, int64_t global_batch, int devices);

// Which physical level each mesh dim's groups use, innermost (fastest links) first.
struct RankMapping {
  std::vector<std::string> order;  // e.g. {"tp", "ep", "dp", "pp"} (ep and cp when used)
  std::vector<double> bytes;       // per dim of `order`: its traffic per device per step
  std::vector<GroupSpan> spans;    // per dim of `order`: where its groups landed
  std::string intra, inter;        // the cluster's link kinds, for reasons()
  // Where `dim`'s groups land for the layout the mapping was made for (size 1 when unused).
  GroupSpan span(std::string_view dim, const Layout& l, const Cluster& c) const;
  // One line per dim: its traffic and where it landed. Formatted on demand: the search maps
  // the ranks of every candidate and prints a few.
  std::vector<std::string> reasons() const;
};

struct MemoryBreakdown {
  double params = 0, grads = 0, optimizer = 0, activations = 0, other = 0;
  double total() const { return params + grads + optimizer + activations + other; }
};

struct Estimate {
  Layout layout;
  RankMapping mapping;
  double step_time = 0;          // seconds
  double tokens_per_s = 0;
  double tflops_per_device = 0;  // hardware FLOPs (recompute included) / step / device, as Narayanan et al. report
  double mfu = 0;                // model FLOPs (no recompute) / step / device / peak
  // Breakdown of the step (seconds, on the slowest pipeline rank): compute, communication not
  // hidden behind compute (tensor-parallel inside the stages, expert-parallel all_to_alls,
  // context-parallel exchanges, pipeline sends, data-parallel / ZeRO gradient and parameter
  // traffic), pipeline bubble, optimizer, and the software profile's fixed time per step
  // (step_overhead).
  double compute = 0, tp_comm = 0, ep_comm = 0, cp_comm = 0, pp_comm = 0, dp_comm = 0, bubble = 0, optimizer = 0,
         step_overhead = 0;
  // Communication the software profile hides behind compute (not in step_time): tensor-parallel
  // collectives under the GEMMs, data-parallel reduction and gather under a micro-batch; and
  // the ring's key/value transfers under the attention (context parallel).
  double tp_hidden = 0, dp_hidden = 0, cp_hidden = 0;
  double expert_imbalance = 1;   // the busiest ep rank's expert load over the mean (moe_imbalance)
  MemoryBreakdown memory;        // per device, bytes (the busiest pipeline rank)
  // tessel's own runtime (an f32 cluster, the step tracer installed), the layouts it reports:
  // the traced step's collectives of the rank whose data-parallel and pipeline traffic the
  // step time charges (world rank `traced_rank`, the first of the stage holding the most
  // parameters). Its dp and pp entries (and the gradient sums over ep and cp) are what dp_comm
  // and pp_comm are timed from. Empty where the closed forms are used.
  std::vector<TracedCollective> step_collectives;
  // ... and the bytes that rank's optimizer copies around its buckets (TracedStep::copy_bytes),
  // streamed with the optimizer step (in `optimizer`).
  double step_copy_bytes = 0;
  int traced_rank = -1;
  LayerShape block;              // how a dense block was costed (spans, micro-batch): --explain
  bool fits = true;
  bool simulated = false;        // the schedule was played (false: closed-form estimate)
  Json to_json() const;
};

struct PlanOptions {
  int64_t global_batch = 0;      // sequences per step
  int top = 5;
  bool allow_sharding = true;    // search ZeRO stages 1-3
  std::vector<std::string> schedules = {"1F1B", "VPP", "ZBH1"};
  std::vector<std::string> recompute;  // kinds to try (empty: none, selective, full)
  int max_vpp = 8;
  int64_t max_micro_batch = 16;
  int max_simulations = 32;      // schedules played, best closed-form estimates first (deterministic)
  bool allow_ep = true;          // search expert parallel (mixture-of-experts models)
  bool allow_cp = true;          // search context parallel
  int threads = 0;               // screening threads (0: default_num_threads(), TESSEL_NUM_THREADS)
};

// Why the runtime would refuse context parallel of `cp` ranks by `method` with tensor parallel
// `tp` for `m` (parallel::ParallelConfig::validate_cp, the config's and engine's checks), or ""
// when it accepts it.
std::string cp_refusal(const ModelSpec& m, int tp, int cp, const std::string& method);

// Memory as the runtime holds it: the allocator's highest marks (bytes, by kind) over a traced
// training step of the whole layout on one rank of pipeline stage `stage` (engine/trace.h; the
// engine layer installs the tracer). The planner uses it for tessel's own f32 runtime — the
// clusters it plans for thread ranks or processes of this program — in place of the formulas,
// on the layouts it reports (evaluate, and search's best); a mixture of experts is traced with
// a balanced router.
// The same step gives the step's collectives, by mesh dim (dp, pp, tp, ...; plan/traced.h):
// the planner charges the data-parallel reduction and gather and the pipeline's messages of
// those layouts from them, in place of its closed forms.
struct TracedMemory {
  double params = 0, grads = 0, optimizer = 0, total = 0;
};
struct TracedStep {
  TracedMemory memory;
  std::vector<TracedCollective> comm;
  double copy_bytes = 0;  // what the optimizer's copies around its buckets read and wrote (op "bucket_copy")
  int rank = 0;           // the world rank traced
};
using StepTracer = std::function<TracedStep(const ModelSpec& m, const Layout& l, int64_t global_batch, int stage)>;
void set_step_tracer(StepTracer tracer);

// Evaluates one layout. Throws Error naming what does not fit together (degrees vs devices,
// heads vs tp, layers vs stages, batch vs dp x micro-batch, schedule constraints).
Estimate evaluate(const ModelSpec& m, const Cluster& c, const Layout& l, int64_t global_batch, bool simulate = true);

struct SearchResult {
  std::vector<Estimate> best;   // top-k, fastest first, all fitting in memory
  int64_t candidates = 0;       // layouts considered
  int64_t feasible = 0;         // of those, fitting in memory
  int64_t simulated = 0;        // schedules played
  double seconds = 0;           // search time
};
SearchResult search(const ModelSpec& m, const Cluster& c, const PlanOptions& o);

// Every layout search considers for `m` on `c` (before memory and speed rule any out): the
// degrees that fit the device count, heads and layers, micro-batch sizes that divide the
// global batch, o.schedules (vpp where the layers split evenly), o.recompute, sp with tp > 1,
// ZeRO stages with dp > 1; ep dividing the experts (mixture-of-experts models only); cp by
// each method the runtime accepts for the model (ring: seq a multiple of 2 cp; all_to_all:
// tp x cp dividing the heads and kv heads; for a mixture of experts only dropless routing).
// So also every layout `tessel plan` can emit.
std::vector<Layout> candidate_layouts(const ModelSpec& m, const Cluster& c, const PlanOptions& o);

// The `parallel:` section of a training config for `l` (YAML text).
std::string parallel_yaml(const Layout& l);

}  // namespace tessel::plan
