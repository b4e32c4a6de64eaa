#include "tessel/plan/planner.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <sstream>
#include <tuple>

#include "tessel/core/error.h"
#include "tessel/core/limits.h"
#include "tessel/core/shape.h"
#include "tessel/parallel/schedule.h"
#include "tessel/plan/evaluate.h"

namespace tessel::plan {

using detail::CostCache;
using detail::CostKey;

namespace detail {

// Sizes whose products count the elements of one tensor the cost model describes (a micro-batch's
// activations, attention scores and logits; a step's tokens): past kMaxElements they would
// wrap in 64-bit arithmetic. Refused naming the sizes (docs/plan.md, "Limits").
void check_sizes(const ModelSpec& m, int64_t global_batch, int64_t micro_batch) {
  const int64_t widest = std::max({m.hidden, m.ffn, m.vocab});
  struct Product {
    const char* what;
    std::initializer_list<int64_t> factors;
  };
  for (const Product& p : {Product{"global batch x sequence length", {global_batch, m.seq}},
                           Product{"micro-batch x sequence length x widest layer", {micro_batch, m.seq, widest}},
                           Product{"micro-batch x heads x sequence length^2", {micro_batch, m.heads, m.seq, m.seq}}})
    TESSEL_CHECK_AS(InputError, checked_product(p.factors, kMaxElements),
                    "plan: {} of {} (global batch {}, micro-batch {}, sequence length {}, heads {}, widest layer {}) is "
                    "more than {} elements, the most one tensor may hold (2^48)",
                    p.what, m.name, global_batch, micro_batch, m.seq, m.heads, widest, kMaxElements);
}

// A cluster value built in code (not parsed, so not bounded by parse_cluster) could still hold
// counts whose int product wraps: checked before any use.
void check_cluster_counts(const Cluster& c) {
  TESSEL_CHECK_AS(InputError,
                  c.nodes >= 1 && c.devices_per_node >= 1 && c.total_devices >= 0 &&
                      checked_product({c.nodes, c.devices_per_node}, kMaxDevices),
                  "plan: cluster '{}' has {} nodes x {} devices per node; tessel plans 1..{} devices (2^20)", c.name,
                  c.nodes, c.devices_per_node, kMaxDevices);
}

}  // namespace detail

using detail::check_cluster_counts;
using detail::check_sizes;

double bucket_bytes_for(const Cluster& c, GroupSpan dp) {
  constexpr double kMiB = 1 << 20;
  if (dp.size <= 1) return 4 * kMiB;  // no data-parallel collective: the runtime's default
  const double latency = all_gather_time(c, 4, dp);
  double b = kMiB;
  while (b < 256 * kMiB && latency > 0.1 * all_gather_time(c, b, dp)) b *= 2;
  return b;
}

// ---------------------------------------------------------------- rank mapping

namespace {

// Mesh dim names are short and differ in their first letter: compared without a library call
// (the search asks for spans of ~150k candidates).
bool same_dim(std::string_view a, std::string_view b) {
  return a.size() == b.size() && (a.empty() || (a[0] == b[0] && a == b));
}

}  // namespace

GroupSpan RankMapping::span(std::string_view dim, const Layout& l, const Cluster& c) const {
  // Once map_ranks has placed every dim, the span it worked out (for the same layout).
  if (spans.size() == order.size())
    for (size_t i = 0; i < order.size(); ++i)
      if (same_dim(order[i], dim)) return spans[i];
  auto size_of = [&](std::string_view d) {
    return same_dim(d, "tp")   ? l.tp
           : same_dim(d, "dp") ? l.dp
           : same_dim(d, "ep") ? l.ep
           : same_dim(d, "cp") ? l.cp
                               : l.pp;
  };
  int stride = 1;
  for (const std::string& d : order) {
    if (same_dim(d, dim)) break;
    stride *= size_of(d);
  }
  const int size = size_of(dim);
  const int per_node = stride >= c.devices_per_node ? 1 : std::clamp(c.devices_per_node / stride, 1, size);
  return GroupSpan{size, per_node};
}

std::vector<std::string> RankMapping::reasons() const {
  std::vector<std::string> out;
  for (size_t i = 0; i < order.size(); ++i) {
    const GroupSpan g = spans[i];
    std::string where;
    if (g.size == 1)
      where = "size 1, no traffic";
    else if (g.per_node == g.size)
      where = fmt::format("all {} ranks inside one node ({})", g.size, intra);
    else if (g.per_node == 1)
      where = fmt::format("{} ranks on {} nodes, across {}", g.size, g.size, inter);
    else
      where = fmt::format("{} ranks, {} per node: {} inside, {} across", g.size, g.per_node, intra, inter);
    out.push_back(fmt::format("{}: {:.4g} GB per device per step -> {}", order[i], bytes[i] / 1e9, where));
  }
  return out;
}

namespace {

// The most communicating dim goes innermost (consecutive ranks: one node, the fastest links),
// then the next; ties keep tp, cp, ep, dp, pp order. ep and cp take part only when used.
// tp's, cp's and ep's collectives come with every micro-batch inside each stage, so a pipeline's
// fill and drain pass them through the stages one after another: on the step's critical path
// they count (m + pp - 1) / m times their bytes (with one micro-batch, pp times; a dp reduction
// runs once, on all stages at once). When the software overlaps the gradient reduction with the
// backward (overlap.grad_reduce), data-parallel bytes no longer outrank tensor-parallel ones:
// tp's collectives sit on every layer's critical path, dp's run in bulk under compute — so tp
// goes first at equal or more dp traffic (as Megatron orders its groups).
RankMapping map_ranks(const Cluster& c, const Layout& l, double tp_bytes, double dp_bytes, double pp_bytes,
                      double ep_bytes, double cp_bytes) {
  const double m = static_cast<double>(std::max<int64_t>(l.micro_batches, 1));
  const double fill = l.pp > 1 ? (m + l.pp - 1) / m : 1.0;
  const double tp_key = fill * tp_bytes;
  const double dp_rank = c.software.overlap.grad_reduce && l.tp > 1 ? std::min(dp_bytes, tp_key) : dp_bytes;
  std::array<std::tuple<double, int, const char*>, 5> dims{};
  size_t n = 0;
  dims[n++] = {tp_key, 0, "tp"};
  dims[n++] = {dp_rank, 3, "dp"};
  dims[n++] = {pp_bytes, 4, "pp"};
  if (l.cp > 1) dims[n++] = {fill * cp_bytes, 1, "cp"};
  if (l.ep > 1) dims[n++] = {fill * ep_bytes, 2, "ep"};
  std::sort(dims.begin(), dims.begin() + static_cast<std::ptrdiff_t>(n), [](const auto& a, const auto& b) {
    if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) > std::get<0>(b);
    return std::get<1>(a) < std::get<1>(b);
  });
  RankMapping r;
  r.intra = c.intra.kind;
  r.inter = c.inter.kind;
  r.order.reserve(n);
  r.bytes.reserve(n);
  r.spans.reserve(n);
  for (size_t i = 0; i < n; ++i) r.order.emplace_back(std::get<2>(dims[i]));
  for (size_t i = 0; i < n; ++i) {
    const auto& [key, index, name] = dims[i];
    r.bytes.push_back(index == 0   ? tp_bytes
                      : index == 1 ? cp_bytes
                      : index == 2 ? ep_bytes
                      : index == 3 ? dp_bytes
                                   : pp_bytes);
    r.spans.push_back(r.span(name, l, c));
  }
  return r;
}

using Sched = parallel::ScheduleKind;

// Activations held on pipeline rank r at most, in (micro-batch, chunk) units, as the
// schedules of parallel/schedule.h hold them (closed forms documented there).
int in_flight(const Layout& l, Sched sched, int rank) {
  const int64_t p = l.pp, m = l.micro_batches, v = l.vpp;
  if (l.pp == 1) return 1;
  if (sched == Sched::fthenb) return static_cast<int>(m);
  if (sched == Sched::vpp && v > 1) return static_cast<int>(std::min(2 * (p - rank - 1) + (v - 1) * p + 1, v * m));
  if (sched == Sched::zbh1) return static_cast<int>(std::min(p, m));
  return static_cast<int>(std::min<int64_t>(p - rank, m));
}

// Everything evaluate() derives from a layout before playing its schedule.
struct Prepared {
  Layout l;
  RankMapping mapping;
  LayerShape shape;                      // a dense block's, as costed
  std::vector<double> f, b, w;           // per virtual stage, per micro-batch
  std::vector<double> tp_per_vstage;     // tensor-parallel collective time per micro-batch
  std::vector<double> ep_per_vstage;     // expert-parallel all_to_all time per micro-batch (exposed)
  std::vector<double> cp_per_vstage;     // context-parallel communication per micro-batch (exposed)
  std::vector<double> cp_hidden_per_rank_mb;  // per pipeline rank: ring transfers under attention, per micro-batch
  double imbalance = 1;                  // expert load of the busiest ep rank over the mean
  double tp_hidden_per_rank = 0;         // tensor-parallel time hidden behind GEMMs per step (busiest rank)
  double p2p = 0;                        // one activation or gradient send between stages
  double capacity = 0;                   // stages that run at full speed at once when devices
                                         // share cores (simulate's capacity); 0: all of them
  std::vector<double> params_per_rank;   // parameters held by each pipeline rank (before ZeRO)
  std::vector<double> expert_params_per_rank;  // of them, routed experts' (reduced over dp only)
  std::vector<double> largest_unit;      // per pipeline rank: the most parameters one call uses (ZeRO-3 gathers)
  std::vector<double> largest_grad;      // ... and the largest gradient alive whole at once
  std::vector<int64_t> layers_per_vstage;
  double act_per_layer = 0, working = 0, head_act = 0;
  // Split backward (ZB-H1): what one layer's W still reads after its B, per micro-batch — the
  // gradients of its matmuls' outputs (their inputs are counted in act_per_layer).
  double w_pending_per_layer = 0;
};


void check_layout(const ModelSpec& m, const Cluster& c, Layout& l, int64_t global_batch) {
  check_cluster_counts(c);
  TESSEL_CHECK(l.dp > 0 && l.tp > 0 && l.pp > 0 && l.vpp > 0 && l.ep > 0 && l.cp > 0,
               "layout {}: degrees must be positive", l.str());
  TESSEL_CHECK_AS(InputError,
                  checked_product({l.dp, l.ep, l.cp, l.tp, l.pp}, kMaxDevices) &&
                      checked_product({l.pp, l.vpp}, kMaxDevices),
                  "layout {}: more than {} devices or virtual stages, the most tessel plans (2^20)", l.str(),
                  kMaxDevices);
  TESSEL_CHECK(l.micro_batch > 0 && l.micro_batch <= global_batch,
               "layout {}: micro-batch {} must be in 1..the global batch {}", l.str(), l.micro_batch, global_batch);
  check_sizes(m, global_batch, l.micro_batch);
  TESSEL_CHECK(l.devices() == c.devices(),
               "layout {}: dp x ep x cp x tp x pp = {} but the cluster '{}' has {} devices", l.str(), l.devices(),
               c.name, c.devices());
  TESSEL_CHECK(m.heads % l.tp == 0 && m.kv_heads % l.tp == 0,
               "layout {}: tp {} must divide the {} attention heads and {} key/value heads", l.str(), l.tp, m.heads,
               m.kv_heads);
  TESSEL_CHECK(l.ep == 1 || (m.is_moe() && m.experts % l.ep == 0),
               "layout {}: ep {} must divide the model's experts ({}; a dense model has none to split)", l.str(), l.ep,
               m.experts);
  if (l.cp > 1) {
    const std::string why = cp_refusal(m, l.tp, l.cp, l.cp_method);
    TESSEL_CHECK(why.empty(), "layout {}: {}", l.str(), why);
  }
  TESSEL_CHECK(m.layers >= static_cast<int64_t>(l.pp) * l.vpp,
               "layout {}: {} layers cannot fill pp {} x vpp {} virtual stages", l.str(), m.layers, l.pp, l.vpp);
  TESSEL_CHECK(checked_product({l.dp, l.ep, l.micro_batch}, global_batch) &&
                   global_batch % (static_cast<int64_t>(l.batch_shards()) * l.micro_batch) == 0,
               "layout {}: global batch {} is not a multiple of dp {} x ep {} x micro-batch {}", l.str(), global_batch,
               l.dp, l.ep, l.micro_batch);
  l.micro_batches = global_batch / (static_cast<int64_t>(l.batch_shards()) * l.micro_batch);
  TESSEL_CHECK(l.sharding_stage >= 0 && l.sharding_stage <= 3, "layout {}: sharding_stage must be 0-3", l.str());
  TESSEL_CHECK(l.recompute == "none" || l.recompute == "selective" || l.recompute == "full",
               "layout {}: recompute must be none, selective or full", l.str());
  l.schedule = parallel::canonical_schedule_name(l.schedule);
  if (l.tp == 1) l.sp = false;
  if (l.cp == 1) l.cp_method = "ring";
  TESSEL_CHECK(l.vpp == 1 || l.schedule == "VPP", "layout {}: vpp > 1 needs the VPP schedule", l.str());
  TESSEL_CHECK(l.vpp == 1 || l.micro_batches % l.pp == 0,
               "layout {}: the interleaved schedule needs micro-batches ({}) divisible by pp ({})", l.str(),
               l.micro_batches, l.pp);
}


// The pipeline message of a traced step: the bytes of one send on the pp group, or 0.
double traced_p2p_bytes(const std::vector<TracedCollective>* step) {
  if (step == nullptr) return 0;
  for (const TracedCollective& x : *step)
    if (x.dim == "pp" && x.kind == "send" && x.calls > 0) return static_cast<double>(x.bytes) / static_cast<double>(x.calls);
  return 0;
}

Prepared prepare(const ModelSpec& m, const Cluster& c, const Layout& l, CostCache* cache,
                 const std::vector<TracedCollective>* step) {
  Prepared p;
  p.l = l;
  const Precision prec = precision_for(c.dtype);
  const int vs_count = l.pp * l.vpp;
  // Traffic per device per step, for the mapping.
  LayerShape shape{l.micro_batch, l.tp, l.sp, l.recompute, GroupSpan{l.tp, std::min(l.tp, c.devices_per_node)}};
  shape.fused_attention = c.software.fused_attention;
  shape.ep = l.ep;
  shape.cp = l.cp;
  shape.cp_method = l.cp_method;
  const double local_seq = static_cast<double>(m.seq / l.cp);
  const double act_bytes = static_cast<double>(l.micro_batch) * local_seq * static_cast<double>(m.hidden) * prec.activation;
  const double layers_per_rank = static_cast<double>(m.layers) / l.pp;
  const double sparse_share = static_cast<double>(m.moe_layers(0, m.layers)) / static_cast<double>(m.layers);
  // Parameters of a dense layer and of a sparse one's on one device: tensor parallel splits
  // both, expert parallel the routed experts.
  const double dense_params = m.layer_parameters() / l.tp;
  const double expert_params = m.expert_parameters() / l.tp / l.ep;
  const double sparse_params = m.is_moe() ? (m.moe_layer_parameters() - m.expert_parameters()) / l.tp + expert_params : 0;
  const double mean_params = (1 - sparse_share) * dense_params + sparse_share * sparse_params;
  const double mb = static_cast<double>(l.micro_batches);
  const bool full_recompute = l.recompute == "full";
  const double tp_traffic = l.tp > 1 ? mb * layers_per_rank * 4 * act_bytes * (full_recompute ? 1.5 : 1.0) : 0;
  const double dp_traffic = l.dp > 1 || l.ep > 1 || l.cp > 1 ? 2 * layers_per_rank * mean_params * prec.grad : 0;
  const double pp_traffic = l.pp > 1 ? 2.0 * mb * l.vpp * act_bytes / l.tp : 0;
  const double ep_traffic = l.ep > 1 ? mb * layers_per_rank * sparse_share * 4 * static_cast<double>(m.top_k) *
                                           act_bytes * (full_recompute ? 1.5 : 1.0)
                                     : 0;
  double cp_traffic = 0;
  if (l.cp > 1) {
    const double kv = static_cast<double>(l.micro_batch) * local_seq * static_cast<double>(m.kv_heads / l.tp) *
                      static_cast<double>(m.head_dim()) * prec.activation;
    const double q = kv * static_cast<double>(m.heads) / static_cast<double>(m.kv_heads);
    const double per_layer = l.cp_method == "ring" ? 3.0 * (l.cp - 1) * 2 * kv : 4.0 * (q + kv);
    cp_traffic = mb * layers_per_rank * per_layer;
  }
  p.mapping = map_ranks(c, l, tp_traffic, dp_traffic, pp_traffic, ep_traffic, cp_traffic);
  shape.tp_group = p.mapping.span("tp", l, c);
  shape.ep_group = p.mapping.span("ep", l, c);
  shape.cp_group = p.mapping.span("cp", l, c);
  // Devices sharing a node's cores (local thread ranks): a pipeline rank waiting for a message
  // leaves its cores to the others, so a stage's steps are costed as if its own devices were
  // the only ones computing, and the simulator shares the cores among the stages busy at each
  // moment. Assumes a node holds an equal part of every stage, as on one node.
  if (l.pp > 1 && c.cores_per_node > 0 && c.devices_per_node > c.cores_per_node) {
    const int stage_devices = (c.devices_per_node + l.pp - 1) / l.pp;
    shape.busy_devices_per_node = stage_devices;
    p.capacity = std::max(1.0, static_cast<double>(c.cores_per_node) / stage_devices);
    if (p.capacity >= l.pp) p.capacity = 0;
  }
  const GroupSpan pp_span = p.mapping.span("pp", l, c);
  p.shape = shape;

  const CostKey key{shape.micro_batch,  shape.tp,          shape.sp,         shape.recompute,
                    shape.tp_group.size, shape.tp_group.per_node, shape.busy_devices_per_node,
                    shape.ep,           shape.ep_group.per_node, shape.cp,     shape.cp_method,
                    shape.cp_group.per_node, shape.cp_group.size};
  std::array<LayerCost, 4> costs;
  if (auto it = cache ? cache->find(key) : CostCache::iterator{}; cache && it != cache->end()) {
    costs = it->second;
  } else {
    LayerShape sparse = shape;
    sparse.moe = true;
    costs = {layer_cost(m, c, shape), m.is_moe() ? layer_cost(m, c, sparse) : LayerCost{}, embedding_cost(m, c, shape),
             head_cost(m, c, shape)};
    if (cache) cache->emplace(key, costs);
  }
  const LayerCost& lc = costs[0];
  const LayerCost& sc = costs[1];
  const LayerCost& emb = costs[2];
  const LayerCost& head = costs[3];
  p.imbalance = m.is_moe() ? sc.imbalance : 1;
  // Megatron's scatter/gather: each tensor-parallel rank sends 1/tp of the activation.
  // (tessel's own runtime, traced: the message its step sends.)
  const double traced_message = traced_p2p_bytes(step);
  const double message = traced_message > 0 ? traced_message : act_bytes / l.tp;
  p.p2p = l.pp > 1 ? p2p_time(c, message, pp_span.per_node == 1) : 0;

  // ZeRO-3 gathers a stage's parameters before its forward and again before its backward.
  const GroupSpan dp_span = p.mapping.span("dp", l, c);
  p.params_per_rank.assign(static_cast<size_t>(l.pp), 0.0);
  p.expert_params_per_rank.assign(static_cast<size_t>(l.pp), 0.0);
  p.cp_hidden_per_rank_mb.assign(static_cast<size_t>(l.pp), 0.0);
  p.largest_unit.assign(static_cast<size_t>(l.pp), std::max(dense_params, sparse_params));
  // A layer's largest matrix: the MLP's (4h or ffn wide; Llama's up and gate are two; a sparse
  // layer's stacked experts, one [E/ep, h, ffn/tp] tensor).
  p.largest_grad.assign(static_cast<size_t>(l.pp),
                        static_cast<double>(m.ffn * m.hidden) / l.tp * (m.is_moe() ? static_cast<double>(m.experts / l.ep) : 1.0));
  const double embed_params = static_cast<double>(m.vocab * m.hidden) / l.tp +
                              (m.position_embedding ? static_cast<double>(m.seq * m.hidden) : 0.0);
  const double head_params = static_cast<double>(m.vocab * m.hidden) / l.tp + 2.0 * static_cast<double>(m.hidden);
  for (std::vector<double>* v : {&p.f, &p.b, &p.w, &p.tp_per_vstage, &p.ep_per_vstage, &p.cp_per_vstage})
    v->reserve(static_cast<size_t>(vs_count));
  p.layers_per_vstage.reserve(static_cast<size_t>(vs_count));
  int64_t first_layer = 0;
  for (int vs = 0; vs < vs_count; ++vs) {
    const int64_t layers = split_size(m.layers, vs_count, vs);
    const int64_t sparse = m.moe_layers(first_layer, first_layer + layers);
    first_layer += layers;
    p.layers_per_vstage.push_back(layers);
    const double ld = static_cast<double>(layers - sparse), sd = static_cast<double>(sparse);
    auto both = [&](auto field) { return ld * (lc.*field) + sd * (sc.*field); };
    double f = both(&LayerCost::fwd) + both(&LayerCost::tp_fwd) + both(&LayerCost::ep_fwd) + both(&LayerCost::cp_fwd);
    double b = both(&LayerCost::bwd_input) + both(&LayerCost::tp_bwd) + both(&LayerCost::recompute) +
               both(&LayerCost::ep_bwd) + both(&LayerCost::cp_bwd);
    double w = both(&LayerCost::bwd_weight);
    const double full = full_recompute ? 1 : 0;
    double tp = both(&LayerCost::tp_fwd) + both(&LayerCost::tp_bwd) + full * both(&LayerCost::tp_fwd);
    const double ep = both(&LayerCost::ep_fwd) + both(&LayerCost::ep_bwd) + full * both(&LayerCost::ep_fwd);
    const double cp = both(&LayerCost::cp_fwd) + both(&LayerCost::cp_bwd) + full * both(&LayerCost::cp_fwd);
    double params = ld * dense_params + sd * sparse_params;
    const size_t rank = static_cast<size_t>(vs % l.pp);
    p.expert_params_per_rank[rank] += sd * expert_params;
    p.cp_hidden_per_rank_mb[rank] += both(&LayerCost::cp_hidden);
    const double table = static_cast<double>(m.vocab * m.hidden) / l.tp;
    if (vs == 0) {
      f += emb.fwd + emb.tp_fwd;
      b += emb.bwd_input + emb.tp_bwd;
      tp += emb.tp_fwd + emb.tp_bwd;
      params += embed_params;
      p.largest_unit[rank] = std::max(p.largest_unit[rank], embed_params);
      p.largest_grad[rank] = std::max(p.largest_grad[rank], table);
    }
    if (vs == vs_count - 1) {
      f += head.fwd + head.tp_fwd;
      b += head.bwd_input + head.tp_bwd + head.recompute;
      w += head.bwd_weight;
      tp += head.tp_fwd + head.tp_bwd;
      // A tied head on another rank than the embedding keeps its own copy (gradients summed).
      if (!m.tied_embedding || l.pp > 1) params += head_params;
      else params += 2.0 * static_cast<double>(m.hidden);
      p.largest_unit[rank] = std::max(p.largest_unit[rank], head_params);
      // One rank holding a tied table has both uses' gradients of it at once before they add.
      p.largest_grad[rank] = std::max(p.largest_grad[rank], (m.tied_embedding && l.pp == 1 ? 2.0 : 1.0) * table);
    }
    if (l.sharding_stage >= 3 && l.dp > 1) {
      const double gather = all_gather_time(c, params * prec.param, dp_span);
      f += gather;
      b += gather;
    }
    // Blocking sends (software overlap.p2p false): a stage waits for its own receive and send
    // of each micro-batch's activation (forward) and gradient (backward).
    if (!c.software.overlap.p2p && l.pp > 1) {
      const double hops = (vs > 0 ? 1.0 : 0.0) + (vs < vs_count - 1 ? 1.0 : 0.0);
      f += hops * p.p2p;
      b += hops * p.p2p;
    }
    p.f.push_back(f);
    p.b.push_back(b);
    p.w.push_back(w);
    p.tp_per_vstage.push_back(tp);
    p.ep_per_vstage.push_back(ep);
    p.cp_per_vstage.push_back(cp);
    p.params_per_rank[rank] += params;
  }
  p.tp_hidden_per_rank = mb * std::ceil(layers_per_rank) * lc.tp_hidden * (full_recompute ? 1.5 : 1.0);
  // The mean layer's activations: sparse layers hold their experts' intermediates.
  LayerShape sparse_shape = shape;
  sparse_shape.moe = true;
  p.act_per_layer = (1 - sparse_share) * layer_activation_bytes(m, prec, shape) +
                    (m.is_moe() ? sparse_share * layer_activation_bytes(m, prec, sparse_shape) : 0.0);
  {
    const double tokens = static_cast<double>(l.micro_batch) * local_seq, h = static_cast<double>(m.hidden);
    const double kv = static_cast<double>(m.kv_heads * m.head_dim()), f = static_cast<double>(m.ffn);
    // Column-parallel outputs are 1/tp wide; row-parallel ones are whole partial sums.
    const double column = m.swiglu() ? h + 2 * kv + 2 * f : 3 * h + f;
    p.w_pending_per_layer = tokens * (column / l.tp + 2 * h) * prec.activation;
  }
  // Full recompute rebuilds a whole layer's activations for its backward; selective rebuilds P
  // one block of queries at a time inside the attention's backward (no layer-sized working set).
  p.working = full_recompute ? layer_working_bytes(m, prec, m.is_moe() ? sparse_shape : shape) : 0;
  // Logits and their gradient in f32 on the last stage, one micro-batch at a time.
  p.head_act = 2.0 * static_cast<double>(l.micro_batch) * local_seq * static_cast<double>(m.vocab) / l.tp * 4;
  return p;
}

}  // namespace

namespace detail {

Estimate evaluate_with(const ModelSpec& m, const Cluster& c, const Layout& layout, int64_t global_batch, bool simulate,
                       CostCache* cache, const TracedStep* step) {
  Layout l = layout;
  check_layout(m, c, l, global_batch);
  Prepared p = prepare(m, c, l, cache, step != nullptr ? &step->comm : nullptr);
  const Precision prec = precision_for(c.dtype);
  Estimate e;
  e.layout = l;
  e.mapping = std::move(p.mapping);
  e.block = p.shape;
  // The bucket for this layout's data-parallel group: what ZeRO stages 1 to 3 hold of
  // whole-size gradients while a bucket is packed and another is on the wire.
  const double bucket_bytes = bucket_bytes_for(c, e.mapping.span("dp", l, c));
  e.layout.bucket_mb = bucket_bytes / (1 << 20);

  // The pipeline: played on the schedule the runtime would execute, or in closed form.
  const int ranks = l.pp;
  std::vector<double> busy(static_cast<size_t>(ranks), 0.0), tp_time(static_cast<size_t>(ranks), 0.0);
  std::vector<double> ep_time(static_cast<size_t>(ranks), 0.0), cp_time(static_cast<size_t>(ranks), 0.0);
  const double mb = static_cast<double>(l.micro_batches);
  for (size_t vs = 0; vs < p.f.size(); ++vs) {
    busy[vs % static_cast<size_t>(ranks)] += mb * (p.f[vs] + p.b[vs] + p.w[vs]);
    tp_time[vs % static_cast<size_t>(ranks)] += mb * p.tp_per_vstage[vs];
    ep_time[vs % static_cast<size_t>(ranks)] += mb * p.ep_per_vstage[vs];
    cp_time[vs % static_cast<size_t>(ranks)] += mb * p.cp_per_vstage[vs];
  }
  std::vector<int> flight(static_cast<size_t>(ranks));
  const Sched sched = parallel::schedule_kind(l.schedule);  // named once per candidate, not per rank
  std::vector<int> w_pending(static_cast<size_t>(ranks), sched == Sched::zbh1 ? 1 : 0);
  double makespan;
  if (simulate || l.pp == 1) {
    const std::string kind = l.pp == 1 ? "1F1B" : l.schedule;
    parallel::Schedule s = parallel::make_schedule(kind, l.pp, l.micro_batches, l.vpp);
    parallel::SimResult r = parallel::simulate(s, p.f, p.b, p.w, p.p2p, p.capacity);
    makespan = r.makespan;
    if (p.capacity > 0) {
      // Wall time on shared cores; the collectives inside stretch with the compute.
      for (int i = 0; i < ranks; ++i) {
        const size_t k = static_cast<size_t>(i);
        if (busy[k] > 0) {
          const double stretch = r.busy[k] / busy[k];
          tp_time[k] *= stretch;
          ep_time[k] *= stretch;
          cp_time[k] *= stretch;
        }
        busy[k] = r.busy[k];
      }
    }
    for (int i = 0; i < ranks; ++i) {
      flight[static_cast<size_t>(i)] = r.peak_in_flight[static_cast<size_t>(i)];
      w_pending[static_cast<size_t>(i)] = r.peak_w_pending[static_cast<size_t>(i)];
    }
    e.simulated = true;
  } else {
    // Closed form: the busiest rank's work plus the ramp of the schedule — (p-1) stage times
    // for FThenB/1F1B, (p-1)/v for the interleaved schedule, about a third of that for ZB-H1
    // whose deferred weight gradients fill most of it — plus the sends along the ramp.
    const double work = *std::max_element(busy.begin(), busy.end());
    const double stage = work / mb;  // per micro-batch, all chunks of a rank
    double ramp = (l.pp - 1) * stage;
    if (sched == Sched::vpp) ramp /= l.vpp;
    if (sched == Sched::zbh1) ramp /= 3;
    double wall = work;
    if (p.capacity > 0) {
      // Shared cores: the stages' work goes through `capacity` stages' worth of cores at a
      // time; the ramp, where fewer stages are busy, shrinks to nothing when one stage fills them.
      wall = std::max(work, std::accumulate(busy.begin(), busy.end(), 0.0) / p.capacity);
      ramp *= (p.capacity - 1) / (l.pp - 1);
    }
    makespan = wall + ramp + 2.0 * (l.pp - 1) * p.p2p;
    for (int i = 0; i < ranks; ++i) flight[static_cast<size_t>(i)] = in_flight(l, sched, i);
  }

  // Data-parallel / ZeRO traffic of the step: the gradients' reduction (all_reduce without
  // ZeRO; reduce_scatter with it) and, for ZeRO 1 and 2, the updated parameters' all_gather.
  // Dense parameters are replicated over dp x ep x cp ranks and their gradients summed over all
  // of them (costed as one collective over that group); routed experts' over dp alone.
  // Exposed after the backward unless the software overlaps them (docs/plan.md, "Overlap"): the
  // reduction bucket by bucket under the backward of the step's last micro-batch — which makes
  // the gradients, the earlier micro-batches only accumulate — except the last bucket; the
  // gather under the next step's first forward, except the first bucket, which that forward
  // needs before it can start.
  const GroupSpan dp_span = e.mapping.span("dp", l, c);
  GroupSpan replicas{l.dp * l.ep * l.cp, 1};
  {
    const GroupSpan es = e.mapping.span("ep", l, c), cs = e.mapping.span("cp", l, c);
    replicas.per_node = std::clamp(dp_span.per_node * es.per_node * cs.per_node, 1, replicas.size);
  }
  const size_t fullest = static_cast<size_t>(std::max_element(p.params_per_rank.begin(), p.params_per_rank.end()) -
                                             p.params_per_rank.begin());
  const double params_max = p.params_per_rank[fullest];
  const double experts_max = p.expert_params_per_rank[fullest], dense_max = params_max - experts_max;
  double dp_comm = 0, dp_hidden = 0;
  double reduce = 0, gather = 0;
  if (step != nullptr) {
    // tessel's own runtime: the step's traced collectives (f32, the cluster's precision) — the
    // gradients' all_reduces and reduce_scatters over dp, and their sums over ep, cp and the pp
    // pair of a tied embedding; ZeRO 1-2's all_gather of the updated parameters (ZeRO 3's
    // gathers, per micro-batch, are in the stages' forward and backward above).
    for (const TracedCollective& x : step->comm) {
      const bool sums = x.kind == "all_reduce" || x.kind == "reduce_scatter";
      if (x.dim == "dp" && sums) reduce += traced_comm_time(c, x, dp_span, 1.0);
      else if (x.dim == "dp" && x.kind == "all_gather" && l.sharding_stage <= 2)
        gather += traced_comm_time(c, x, dp_span, 1.0);
      else if ((x.dim == "ep" || x.dim == "cp" || x.dim == "pp") && x.kind == "all_reduce")
        reduce += traced_comm_time(c, x, e.mapping.span(x.dim, l, c), 1.0);
    }
    e.step_collectives = step->comm;
    e.step_copy_bytes = step->copy_bytes;
    e.traced_rank = step->rank;
  } else if (replicas.size > 1) {
    auto group = [&](double n, GroupSpan g) {
      if (g.size <= 1 || n <= 0) return;
      if (l.sharding_stage == 0) reduce += all_reduce_time(c, n * prec.grad, g);
      else if (l.sharding_stage <= 2)
        reduce += all_gather_time(c, n * prec.grad, g), gather += all_gather_time(c, n * prec.param, g);
      else reduce += all_gather_time(c, n * prec.grad, g);
    };
    group(dense_max, replicas);
    group(experts_max, dp_span);
  }
  if (step == nullptr && m.tied_embedding && l.pp > 1) {
    // A tied embedding split between the pipeline's first and last rank: after the backward the
    // two sum their gradients of the table (Megatron's embedding all-reduce over its pair group,
    // DeepSpeed's ReduceTiedGrads, both on f32 gradients in mixed precision). The traced path
    // reads this from the trace (the pp all_reduce above).
    const GroupSpan pp_span = e.mapping.span("pp", l, c);
    const GroupSpan pair{2, pp_span.per_node >= l.pp ? 2 : 1};
    reduce += all_reduce_time(c, static_cast<double>(m.vocab * m.hidden) / l.tp * prec.grad, pair);
  }
  if (reduce + gather > 0) {
    // One micro-batch's forward and backward on the busiest pipeline rank.
    double fwd_one = 0, bwd_one = 0;
    for (int r = 0; r < ranks; ++r) {
      double fr = 0, br = 0;
      for (size_t vs = static_cast<size_t>(r); vs < p.f.size(); vs += static_cast<size_t>(ranks)) {
        fr += p.f[vs];
        br += p.b[vs] + p.w[vs];
      }
      fwd_one = std::max(fwd_one, fr);
      bwd_one = std::max(bwd_one, br);
    }
    const double bucket_share = std::min(1.0, bucket_bytes / std::max(1.0, params_max * prec.grad));
    double reduce_exposed = reduce, gather_exposed = gather;
    if (c.software.overlap.grad_reduce)
      reduce_exposed = std::min(reduce, std::max(0.0, reduce - bwd_one) + bucket_share * reduce);
    if (c.software.overlap.param_gather && gather > 0)
      gather_exposed = std::min(gather, std::max(0.0, gather - fwd_one) + bucket_share * gather);
    dp_comm = reduce_exposed + gather_exposed;
    dp_hidden = reduce + gather - dp_comm;
  }
  // The optimizer streams its state, the gradient and the parameter once (read and write), at the
  // share of the streaming rate the software's optimizer reaches.
  const double opt_params = l.sharding_stage >= 1 ? params_max / l.dp : params_max;
  const double stream_rate =
      c.device.memory_bandwidth * c.calibration.memory_efficiency * c.compute_share(c.devices_per_node);
  double opt_time = opt_params * optimizer_step_bytes(prec) / (stream_rate * c.software.optimizer_efficiency);
  // tessel's runtime copies what its buckets carry (Megatron's gradients live in theirs): each
  // gradient it sums over dp, ep or cp into its bucket, and at ZeRO 1 and 2 the updated shards
  // into the parameters' gather buffer and the other ranks' out of it — as many bytes as its
  // traced step recorded, streamed with the optimizer step they belong to.
  if (step != nullptr) opt_time += step->copy_bytes / stream_rate;

  e.step_time = makespan + dp_comm + opt_time + c.software.step_overhead;
  const size_t busiest = static_cast<size_t>(std::max_element(busy.begin(), busy.end()) - busy.begin());
  e.tp_comm = tp_time[busiest];
  e.ep_comm = ep_time[busiest];
  e.cp_comm = cp_time[busiest];
  e.cp_hidden = mb * p.cp_hidden_per_rank_mb[busiest];
  e.expert_imbalance = p.imbalance;
  e.compute = busy[busiest] - tp_time[busiest] - ep_time[busiest] - cp_time[busiest];
  const double idle = std::max(0.0, makespan - busy[busiest]);
  e.pp_comm = std::min(idle, l.pp > 1 ? 2.0 * (l.pp - 1) * p.p2p : 0.0);
  e.bubble = idle - e.pp_comm;
  e.dp_comm = dp_comm;
  e.dp_hidden = dp_hidden;
  e.tp_hidden = p.tp_hidden_per_rank;
  e.optimizer = opt_time;
  e.step_overhead = c.software.step_overhead;

  const double tokens = static_cast<double>(global_batch) * static_cast<double>(m.seq);
  e.tokens_per_s = tokens / e.step_time;
  e.tflops_per_device = step_flops(m, global_batch, l.recompute) / e.step_time / c.devices() / 1e12;
  e.mfu = step_flops(m, global_batch, "none") / e.step_time / c.devices() / c.peak();

  // Memory of the fullest pipeline rank.
  for (int r = 0; r < ranks; ++r) {
    MemoryBreakdown mem;
    const double params = p.params_per_rank[static_cast<size_t>(r)];
    const int dp = l.dp;
    // As the runtime holds them (docs/parallel.md): stage 0 keeps whole gradients; stages 1 (with
    // one micro-batch), 2 and 3 reduce them bucket by bucket as the backward makes them, so
    // besides the 1/dp shard only two buckets and the largest gradient alive whole are held;
    // stage 1 over several micro-batches sums whole gradients until the step. Stage 3 holds 1/dp
    // of the parameters plus two units gathered (the one in use and the next, prefetched).
    const size_t ru = static_cast<size_t>(r);
    const bool sharded_grads = dp > 1 && (l.sharding_stage >= 2 || (l.sharding_stage == 1 && l.micro_batches == 1));
    const double in_flight = 2 * bucket_bytes + p.largest_grad[ru] * prec.grad;
    mem.params = params * prec.param / (l.sharding_stage >= 3 ? dp : 1);
    // Buckets hold at most the stage's gradients: a small model's whole gradients fit in one.
    mem.grads = sharded_grads ? std::min(params * prec.grad, params * prec.grad / dp + in_flight) : params * prec.grad;
    mem.optimizer = params * prec.optimizer / (l.sharding_stage >= 1 ? dp : 1);
    if (l.sharding_stage >= 3 && dp > 1) {
      mem.params += 2 * p.largest_unit[ru] * prec.param;
    }
    double layers_per_chunk = 0;
    for (int ch = 0; ch < l.vpp; ++ch)
      layers_per_chunk = std::max(layers_per_chunk, static_cast<double>(p.layers_per_vstage[static_cast<size_t>(ch * l.pp + r)]));
    mem.activations = flight[static_cast<size_t>(r)] * layers_per_chunk * p.act_per_layer + p.working +
                      w_pending[static_cast<size_t>(r)] * layers_per_chunk * p.w_pending_per_layer;
    if (r == ranks - 1) mem.activations += p.head_act;
    mem.other = c.software.reserved_bytes + c.software.fragmentation * c.device.memory_bytes;
    if (mem.total() > e.memory.total()) e.memory = mem;
  }
  e.fits = e.memory.total() <= c.device.memory_bytes;
  return e;
}

}  // namespace detail

namespace {

std::mutex g_step_tracer_mutex;
StepTracer g_step_tracer;

}  // namespace

namespace detail {

// The runtime's traced step in place of the closed forms where it applies (see StepTracer): one
// rank of each pipeline stage traced; the data-parallel and pipeline traffic from the stage
// holding the most parameters, the memory of the fullest stage.
void trace_step(const ModelSpec& m, const Cluster& c, int64_t global_batch, bool simulate, CostCache* cache,
                Estimate& e) {
  StepTracer tracer;
  {
    std::lock_guard lock(g_step_tracer_mutex);
    tracer = g_step_tracer;
  }
  if (!tracer || c.dtype != "f32") return;
  const Layout l = e.layout;  // with the bucket evaluate_with chose for it
  std::vector<TracedStep> stages;
  for (int stage = 0; stage < l.pp; ++stage) stages.push_back(tracer(m, l, global_batch, stage));
  const TracedStep& heaviest = *std::max_element(stages.begin(), stages.end(), [](const TracedStep& a, const TracedStep& b) {
    return a.memory.params < b.memory.params;
  });
  e = evaluate_with(m, c, l, global_batch, simulate, cache, &heaviest);
  MemoryBreakdown best;
  for (const TracedStep& t : stages) {
    MemoryBreakdown mem;
    mem.params = t.memory.params;
    mem.grads = t.memory.grads;
    mem.optimizer = t.memory.optimizer;
    mem.activations = std::max(0.0, t.memory.total - t.memory.params - t.memory.grads - t.memory.optimizer);
    mem.other = c.software.reserved_bytes + c.software.fragmentation * c.device.memory_bytes;
    if (mem.total() > best.total()) best = mem;
  }
  e.memory = best;
  e.fits = e.memory.total() <= c.device.memory_bytes;
}

}  // namespace detail

void set_step_tracer(StepTracer tracer) {
  std::lock_guard lock(g_step_tracer_mutex);
  g_step_tracer = std::move(tracer);
}

Estimate evaluate(const ModelSpec& m, const Cluster& c, const Layout& layout, int64_t global_batch, bool simulate) {
  validate(m);
  Estimate e = detail::evaluate_with(m, c, layout, global_batch, simulate, nullptr);
  detail::trace_step(m, c, global_batch, simulate, nullptr, e);
  return e;
}

Json Estimate::to_json() const {
  Json j = Json::Object{};
  Json lay = Json::Object{};
  lay["dp"] = layout.dp;
  lay["tp"] = layout.tp;
  lay["pp"] = layout.pp;
  lay["vpp"] = layout.vpp;
  lay["ep"] = layout.ep;
  lay["cp"] = layout.cp;
  lay["cp_method"] = layout.cp_method;
  lay["mbs"] = layout.micro_batch;
  lay["micro_batches"] = layout.micro_batches;
  lay["sharding_stage"] = layout.sharding_stage;
  lay["sp"] = layout.sp;
  lay["schedule"] = layout.schedule;
  lay["recompute"] = layout.recompute;
  lay["bucket_mb"] = layout.bucket_mb;
  lay["text"] = layout.str();
  j["layout"] = lay;
  j["step_time_s"] = step_time;
  j["tokens_per_s"] = tokens_per_s;
  j["tflops_per_device"] = tflops_per_device;
  j["mfu"] = mfu;
  Json t = Json::Object{};
  t["compute_s"] = compute;
  t["tp_comm_s"] = tp_comm;
  t["ep_comm_s"] = ep_comm;
  t["cp_comm_s"] = cp_comm;
  t["cp_comm_overlapped_s"] = cp_hidden;
  t["pp_comm_s"] = pp_comm;
  t["dp_comm_s"] = dp_comm;
  t["tp_comm_overlapped_s"] = tp_hidden;
  t["dp_comm_overlapped_s"] = dp_hidden;
  t["bubble_s"] = bubble;
  t["optimizer_s"] = optimizer;
  t["step_overhead_s"] = step_overhead;
  j["time"] = t;
  Json mem = Json::Object{};
  mem["total"] = memory.total() / 1e9;
  mem["params"] = memory.params / 1e9;
  mem["grads"] = memory.grads / 1e9;
  mem["optimizer"] = memory.optimizer / 1e9;
  mem["activations"] = memory.activations / 1e9;
  mem["other"] = memory.other / 1e9;
  j["memory_gb"] = mem;
  j["expert_imbalance"] = expert_imbalance;
  j["fits"] = fits;
  j["simulated"] = simulated;
  Json order = Json::Array{};
  for (const std::string& d : mapping.order) order.push_back(d);
  Json reasons = Json::Array{};
  for (const std::string& r : mapping.reasons()) reasons.push_back(r);
  Json map = Json::Object{};
  map["innermost_first"] = order;
  map["why"] = reasons;
  j["rank_mapping"] = map;
  return j;
}

}  // namespace tessel::plan
