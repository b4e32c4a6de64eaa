#include "tessel/plan/cost_model.h"

#include <algorithm>
#include <cmath>

#include "tessel/core/attrs.h"
#include "tessel/core/error.h"
#include "tessel/ops/dispatch.h"
#include "tessel/ops/registry.h"
#include "tessel/plan/traced.h"

namespace tessel::plan {

Precision precision_for(const std::string& dtype) {
  if (dtype == "f32") return Precision{4, 4, 8, 4};
  return Precision{};  // bf16 / f16 mixed precision
}

// ---------------------------------------------------------------- collectives

namespace {

// A level's bandwidth as collectives reach it: inside a node (intra) or between nodes (inter).
double intra_bw(const Cluster& c) { return c.intra.bandwidth * c.calibration.link_share(false); }
double inter_bw(const Cluster& c) { return c.inter.bandwidth * c.calibration.link_share(true); }

// Ring over n ranks moving `factor` x bytes through every rank's link, 2(n-1) or (n-1) steps.
double ring(double bytes, int n, double factor_steps, double bw, double alpha) {
  if (n <= 1) return 0;
  return factor_steps * (n - 1) * alpha + factor_steps * (n - 1) / n * bytes / bw;
}

// Binary tree (reduce then broadcast), pipelined: 2 log2(n) latencies, twice the bytes once.
double tree(double bytes, int n, double bw, double alpha) {
  if (n <= 1) return 0;
  return 2 * std::ceil(std::log2(n)) * alpha + 2 * bytes / bw;
}

}  // namespace

double all_reduce_time(const Cluster& c, double bytes, GroupSpan g) {
  if (g.size <= 1 || bytes <= 0) return 0;
  const int local = std::clamp(g.per_node, 1, g.size);
  if (local == g.size) {
    const double bw = intra_bw(c), a = c.intra.latency;
    return std::min(ring(bytes, g.size, 2, bw, a), tree(bytes, g.size, bw, a));
  }
  const int nodes = (g.size + local - 1) / local;
  const double ibw = inter_bw(c), ia = c.inter.latency;
  if (local == 1) return std::min(ring(bytes, nodes, 2, ibw, ia), tree(bytes, nodes, ibw, ia));
  // Hierarchical: every rank of a node carries 1/local of the buffer across nodes on its NIC.
  const double bw = intra_bw(c), a = c.intra.latency;
  const double inside = 2 * ring(bytes, local, 1, bw, a);
  const double across = std::min(ring(bytes / local, nodes, 2, ibw, ia), tree(bytes / local, nodes, ibw, ia));
  return inside + across;
}

double all_gather_time(const Cluster& c, double bytes, GroupSpan g) {
  if (g.size <= 1 || bytes <= 0) return 0;
  const int local = std::clamp(g.per_node, 1, g.size);
  if (local == g.size) return ring(bytes, g.size, 1, intra_bw(c), c.intra.latency);
  const int nodes = (g.size + local - 1) / local;
  const double across = ring(bytes / local, nodes, 1, inter_bw(c), c.inter.latency);
  return across + ring(bytes, local, 1, intra_bw(c), c.intra.latency);
}

double p2p_time(const Cluster& c, double bytes, bool inter_node) {
  if (bytes <= 0) return 0;
  const Link& l = inter_node ? c.inter : c.intra;
  return l.latency + bytes / (inter_node ? inter_bw(c) : intra_bw(c));
}

double all_to_all_time(const Cluster& c, double bytes, GroupSpan g) {
  if (g.size <= 1 || bytes <= 0) return 0;
  const int local = std::clamp(g.per_node, 1, g.size);
  const double n = g.size, share = bytes / n;
  const double inside = (local - 1) * (c.intra.latency + share / intra_bw(c));
  const double across = (n - local) * (c.inter.latency + share / inter_bw(c));
  return std::max(inside, across);
}

double moe_imbalance(const ModelSpec& m, double assignments, int ep) {
  if (ep <= 1 || assignments <= 0) return 1;
  const double e = ep;
  double f = 1 + std::sqrt(2 * std::log(e) * (1 - 1 / e) / assignments);
  if (m.capacity_factor > 0) f = std::min(f, std::max(1.0, m.capacity_factor));
  return f;
}

// ---------------------------------------------------------------- compute

double gemm_size(const Calibration& c, double m, double n, double k) {
  if (c.gemm_size == "harmonic") return 3.0 / (1.0 / m + 1.0 / n + 1.0 / k);
  return std::min({m, n, k});
}

namespace {

// Forward and backward time of the ops of one layer, accumulated op by op.
struct Pass {
  const Cluster& c;
  DType dtype;
  double share;  // of a device's compute (thread ranks sharing cores)
  LayerCost cost;
  double attention_fwd = 0, attention_bwd = 0;  // the attention core
  // What selective recompute redoes in the backward: the probabilities (QK^T, softmax, dropout
  // on them), not P·V — the attention's output is kept for the projection after it.
  double attention_recompute = 0;
  double linear_fwd = 0;  // the linears' forward (what tensor-parallel comm overlap hides behind)

  TensorMeta meta(std::vector<int64_t> shape) const { return TensorMeta{Shape(shape.begin(), shape.end()), dtype, {}}; }

  double gemm_eff(double dim) const {
    const Calibration& k = c.calibration;
    return k.gemm_efficiency * c.software.kernel_efficiency * dim / (dim + k.gemm_half_dim);
  }
  // A fused attention kernel's efficiency at query length `dim` on sdpa's full count of FLOPs:
  // the software's share of a GEMM's, along the kernel's own curve where the software gives one
  // (attention_half_dim: tiles of a few rows cost more than a GEMM's), and at most twice a large
  // GEMM's — a causal kernel computes at least half of what the count says.
  double attention_eff(double dim) const {
    const Calibration& k = c.calibration;
    const SoftwareProfile& sw = c.software;
    const double half = sw.attention_half_dim > 0 ? sw.attention_half_dim : k.gemm_half_dim;
    const double top = k.gemm_efficiency * sw.kernel_efficiency;
    return std::min(top * dim / (dim + half) * sw.attention_efficiency, 2 * top);
  }
  double stream(double bytes) const {
    return bytes / (c.device.memory_bandwidth * c.calibration.memory_efficiency * share);
  }

  // One op by name through the registry. `gemm_dim`: the size d of a GEMM (0 for
  // streaming ops). Backward: twice the forward for both (two GEMMs; streaming ops read the
  // gradient and a saved tensor and write a gradient).
  // Returns the forward time.
  double op(const char* name, std::vector<TensorMeta> in, const Attrs& attrs, double gemm_dim, bool has_weight,
            bool attention_core = false) {
    Cost k = op_cost(op_by_name(name), in, attrs);
    double t;
    if (gemm_dim > 0) {
      const double eff = attention_core && c.software.fused_attention ? attention_eff(gemm_dim) : gemm_eff(gemm_dim);
      t = std::max(k.flops / (c.peak() * share * eff), stream(k.bytes));
    } else {
      t = stream(k.bytes);
    }
    t += c.software.op_overhead;
    cost.fwd += t;
    cost.flops_fwd += k.flops;
    cost.kernels += 1;
    // A GEMM's backward is two GEMMs of its size, one per operand: the input gradient and the
    // weight gradient of a linear (kept apart for ZB-H1), both input gradients of a product of
    // activations (attention's QK^T and PV; a fused attention kernel the same).
    cost.bwd_input += 2 * t;
    if (gemm_dim > 0 && has_weight) {
      cost.bwd_input -= t;
      cost.bwd_weight += t;
    }
    const double bwd = 2 * t;
    if (attention_core) {
      attention_fwd += t;
      attention_bwd += bwd;
    }
    return t;
  }
};

// The compute share of one device while the layer runs (see LayerShape::busy_devices_per_node).
double share_of(const Cluster& c, const LayerShape& s) {
  return c.compute_share(s.busy_devices_per_node > 0 ? s.busy_devices_per_node : c.devices_per_node);
}

Attrs linear_attrs() { return Attrs{{"weight_in_out", false}}; }

Attrs dropout_attrs(double p, std::vector<int64_t> shape) {
  std::vector<int64_t> zeros(shape.size(), 0);
  return Attrs{{"p", p}, {"seed", int64_t{0}}, {"stream", int64_t{0}}, {"global_shape", std::move(shape)},
               {"offset", std::move(zeros)}};
}

// tokens x in -> tokens x out (weight [out, in]), with bias when `bias`.
void linear(Pass& p, int64_t tokens, int64_t in, int64_t out, bool bias) {
  std::vector<TensorMeta> metas = {p.meta({tokens, in}), p.meta({out, in})};
  if (bias) metas.push_back(p.meta({out}));
  const double d = gemm_size(p.c.calibration, static_cast<double>(tokens), static_cast<double>(in),
                             static_cast<double>(out));
  p.linear_fwd += p.op("linear", metas, linear_attrs(), d, true);
}

void streaming(Pass& p, const char* name, std::vector<int64_t> shape, int inputs = 1, const Attrs& attrs = {}) {
  std::vector<TensorMeta> metas(static_cast<size_t>(inputs), p.meta(shape));
  p.op(name, metas, attrs, 0, false);
}

// The attention core of `b` sequences: q [b, hq, s, d], k/v [b, hkv, s, d]. Fused (one sdpa
// kernel, scores never stored) when the calibration says so; otherwise as Megatron-LM 2021
// runs it: batched QK^T, scale+mask+softmax, dropout, batched PV, the s x s scores in memory.
// Selective recompute redoes the part before PV (the QK^T product and the softmax); a fused
// kernel recomputes the scores in its backward anyway (its calibrated efficiency includes it),
// so selective recompute has nothing to add there.
//
// Context parallel: a rank holds `sq` = seq / cp queries. The ring attends them to all seq keys
// (cp blocks passed around, one per step); all_to_all attends whole sequences with 1/cp of the
// heads (hq and hkv already divided by cp by the caller). Either way 1/cp of the FLOPs.
void attention(Pass& p, const ModelSpec& m, int64_t b, int64_t hq, int64_t hkv, double dropout, int64_t sq) {
  const int64_t s = m.seq, d = m.head_dim();
  if (p.c.software.fused_attention) {
    Attrs a{{"causal", true}, {"scale", 1.0 / std::sqrt(static_cast<double>(d))}};
    p.op("sdpa", {p.meta({b, hq, sq, d}), p.meta({b, hkv, s, d}), p.meta({b, hkv, s, d})}, a, static_cast<double>(sq),
         false, true);
    return;  // nothing for selective recompute to redo: the kernel keeps no scores
  }
  Attrs mm{{"trans_a", false}, {"trans_b", true}};
  p.attention_recompute +=
      p.op("matmul", {p.meta({b * hq, sq, d}), p.meta({b * hq, s, d})}, mm, static_cast<double>(sq), false, true);
  p.attention_recompute += p.op("softmax", {p.meta({b * hq, sq, s})}, Attrs{{"dim", int64_t{-1}}}, 0, false, true);
  if (dropout > 0)
    p.attention_recompute +=
        p.op("dropout", {p.meta({b * hq, sq, s})}, dropout_attrs(dropout, {b * hq, sq, s}), 0, false, true);
  Attrs pv{{"trans_a", false}, {"trans_b", false}};
  p.op("matmul", {p.meta({b * hq, sq, s}), p.meta({b * hq, s, d})}, pv, static_cast<double>(std::min(sq, d * 4)),
       false, true);
}

// The ring's cp - 1 steps each way, a key/value block of `block` bytes per step in the forward,
// the block and its gradient accumulator side by side in the backward, each under the attention
// of the block in hand (a cp-th of the layer's): what the attention cannot cover is exposed.
void ring_comm(LayerCost& lc, const Cluster& c, const LayerShape& s, double block, double attn_fwd, double attn_bwd) {
  const bool across = s.cp_group.per_node < s.cp_group.size;
  const double steps = s.cp - 1;
  const double x_fwd = p2p_time(c, block, across), x_bwd = p2p_time(c, 2 * block, across);
  const double c_fwd = attn_fwd / s.cp, c_bwd = attn_bwd / s.cp;
  lc.cp_fwd += steps * std::max(0.0, x_fwd - c_fwd);
  lc.cp_bwd += steps * std::max(0.0, x_bwd - c_bwd);
  lc.cp_hidden += steps * (std::min(x_fwd, c_fwd) + std::min(x_bwd, c_bwd));
}

// Context-parallel communication of one attention (docs/plan.md, "Context parallel"). Ring:
// cp - 1 steps, each sending this rank's key/value block on (and receiving the next) while the
// attention of the block in hand runs — exposed per step is what the transfer takes beyond
// that block's compute (1/cp of the rank's attention); the backward sends the blocks and their
// gradients (twice the bytes) beside a backward step. all_to_all: q, k and v turned from
// sequence shards into head shards before the attention and the output back after (four
// all_to_alls), and as many in the backward; nothing to overlap them with.
void cp_comm(LayerCost& lc, const Cluster& c, const LayerShape& s, const ModelSpec& m, double attn_fwd, double attn_bwd,
             int64_t hq, int64_t hkv, double act) {
  if (s.cp <= 1) return;
  const double b = static_cast<double>(s.micro_batch), d = static_cast<double>(m.head_dim());
  const double sq = static_cast<double>(m.seq) / s.cp;
  if (s.cp_method == "ring") {
    const double block = 2 * b * sq * static_cast<double>(hkv) * d * act;  // K and V of one rank
    ring_comm(lc, c, s, block, attn_fwd, attn_bwd);
    lc.cp_bytes = (s.cp - 1) * 3 * block;
  } else {
    // Per rank before the reshard: its sq tokens of this tp rank's heads (hq, hkv are per tp
    // rank here, whole over cp).
    const double q = b * sq * static_cast<double>(hq) * d * act, kv = b * sq * static_cast<double>(hkv) * d * act;
    const double t = 2 * all_to_all_time(c, q, s.cp_group) + 2 * all_to_all_time(c, kv, s.cp_group);
    lc.cp_fwd = t;
    lc.cp_bwd = t;
    lc.cp_bytes = 2 * (2 * q + 2 * kv);
  }
}

// The software's tp_comm overlap on a layer's tensor-parallel collectives (lc.tp_fwd, equal to
// lc.tp_bwd): what the layer's forward linears cannot cover stays exposed, plus one chunk.
void overlap_tp_comm(LayerCost& lc, const Cluster& c, const LayerShape& s, double linear_fwd) {
  if (!c.software.overlap.tp_comm || !s.sp) return;
  const double all = lc.tp_fwd;
  const double exposed = std::min(all, std::max(0.0, all - linear_fwd) + all / s.tp);
  lc.tp_hidden = 2 * (all - exposed);
  lc.tp_fwd = exposed;
  lc.tp_bwd = exposed;
}

// Tensor-parallel collectives of one layer: without sequence parallelism an all_reduce after
// the attention and after the MLP (forward) and two in the backward; with it an all_gather
// before and a reduce_scatter after each block — the same bytes, half the latency-bound work.
//
// With the software's tp_comm overlap (Megatron-Core --tp-comm-overlap, which needs sequence
// parallelism) each all_gather runs in tp chunks under the column-parallel GEMM it feeds and
// each reduce_scatter under the row-parallel GEMM it follows: what stays exposed is what the
// layer's linears cannot cover, plus one chunk of each collective (the pipeline's fill: the
// first chunk before any GEMM can start, the last one after the last GEMM). The backward
// pairs the same collectives with the input-gradient GEMMs, as long as the forward ones.
void tp_comm(LayerCost& lc, const Cluster& c, const LayerShape& s, double act_bytes, double linear_fwd) {
  if (s.tp <= 1) return;
  const double one = s.sp ? 2 * all_gather_time(c, act_bytes, s.tp_group) : all_reduce_time(c, act_bytes, s.tp_group);
  lc.tp_fwd = 2 * one;
  lc.tp_bwd = 2 * one;
  lc.tp_bytes = 4 * act_bytes;
  overlap_tp_comm(lc, c, s, linear_fwd);
}

}  // namespace

// ---------------------------------------------------------------- traced

namespace {

// Ops that only make views: no kernel of their own on the devices costed.
bool view_op(const std::string& op) {
  return op == "reshape" || op == "permute" || op == "expand" || op == "split" || op == "slice";
}

}  // namespace

double traced_comm_time(const Cluster& c, const TracedCollective& x, GroupSpan g, double scale) {
  if (x.bytes <= 0) return 0;
  // A block adds calls, or bytes to a call every step makes anyway (one all_reduce of the
  // sequence-parallel norms' gradients): then the time of those bytes alone, latency aside.
  const double calls = std::max<int64_t>(x.calls, 1);
  const double per = static_cast<double>(x.bytes) / calls * scale;
  double one = 0;
  if (x.kind == "all_reduce") one = all_reduce_time(c, per, g);
  else if (x.kind == "all_gather") one = all_gather_time(c, per * g.size, g);
  else if (x.kind == "reduce_scatter") one = all_gather_time(c, per, g);
  else if (x.kind == "all_to_all") one = all_to_all_time(c, per, g);
  else if (x.kind == "send" || x.kind == "recv") one = p2p_time(c, per, g.per_node < g.size);
  else one = all_reduce_time(c, per, g);  // broadcast, reduce and the rest: at most an all_reduce's
  return one * calls;
}

LayerCost traced_layer_cost(const ModelSpec& m, const Cluster& c, const LayerShape& s, std::vector<OpTime>* breakdown) {
  const BlockTrace& bt = traced_block(m, s);
  const Precision prec = precision_for(c.dtype);
  const double scale = prec.activation / 4.0;  // traced in f32; the stack's activations are `prec`
  Pass p{c, prec.activation == 4 ? DType::f32 : DType::bf16, share_of(c, s), {}};
  LayerCost& lc = p.cost;
  const double overhead = c.software.op_overhead;
  auto product_time = [&](const OpCallRecord& r) {
    const double dim = r.op == "sdpa" ? r.m : gemm_size(c.calibration, r.m, r.n, r.k);
    const double eff = r.op == "sdpa" ? p.attention_eff(dim) : p.gemm_eff(dim);
    return std::max(r.cost.flops / (c.peak() * p.share * eff), p.stream(r.cost.bytes * scale));
  };
  double linear_fwd = 0, attn_fwd = 0, attn_bwd = 0;
  // A sparse block's experts: traced with a balanced router (every expert T·k/E rows); the
  // busiest expert-parallel rank has `imbalance` times that (moe_imbalance), and every rank
  // waits for it at the combine.
  if (m.is_moe() && s.moe) {
    const double tokens = static_cast<double>(s.micro_batch * (m.seq / std::max(1, s.cp)));
    lc.imbalance = moe_imbalance(m, tokens * static_cast<double>(m.top_k), s.ep);
  }
  for (const OpCallRecord& r : bt.calls) {
    if (view_op(r.op)) continue;
    const bool product = r.m > 0;
    double t;
    if (r.op == "sdpa" && !c.software.fused_attention) {
      // The software runs attention as Megatron-LM 2021 did: QK^T, softmax, dropout, PV with the
      // scores in memory — costed on the traced call's shapes through the registry.
      const auto bh = static_cast<int64_t>(std::llround(r.batch));
      Pass u{c, p.dtype, p.share, {}};
      ModelSpec shape = m;
      shape.seq = static_cast<int64_t>(r.n);
      attention(u, shape, 1, bh, bh, m.attn_rate(), static_cast<int64_t>(r.m));
      t = r.backward ? u.cost.bwd_input + u.cost.bwd_weight : u.cost.fwd;
      if (!r.backward && !r.recompute) {
        lc.kernels += u.cost.kernels;
        p.attention_recompute += u.attention_recompute;
      }
    } else if (product) {
      t = product_time(r) + overhead * (r.backward ? 2 : 1);
      if (r.op == "grouped_matmul") t *= lc.imbalance;
    } else {
      t = p.stream(r.cost.bytes * scale) + overhead;
    }
    if (breakdown != nullptr) {
      const std::string pass = r.backward ? "backward" : r.recompute ? "recompute" : "forward";
      auto it = std::find_if(breakdown->begin(), breakdown->end(),
                             [&](const OpTime& o) { return o.op == r.op && o.pass == pass; });
      if (it == breakdown->end()) it = breakdown->insert(breakdown->end(), OpTime{r.op, pass});
      it->calls += 1;
      it->flops += r.cost.flops;
      it->bytes += r.cost.bytes * scale;
      it->seconds += t;
    }
    if (r.op == "sdpa" && !r.recompute) (r.backward ? attn_bwd : attn_fwd) += t;
    if (r.backward) {
      // A linear's backward is its input gradient and its weight gradient (apart for ZB-H1).
      const bool weight = r.op == "linear" || r.op == "grouped_matmul";
      lc.bwd_input += weight ? t / 2 : t;
      lc.bwd_weight += weight ? t / 2 : 0;
    } else if (r.recompute) {
      lc.recompute += t;
    } else {
      lc.fwd += t;
      lc.flops_fwd += r.cost.flops;
      if (r.op != "sdpa" || c.software.fused_attention) lc.kernels += 1;
      if (r.op == "linear" || r.op == "grouped_matmul") linear_fwd += t;
    }
  }
  // Recompute, as the runtime's: full reruns the block's forward (its collectives too),
  // selective the attention's scores where they are materialised (a fused kernel rebuilds them
  // in its own backward, already in its traced cost).
  // Tensor-parallel collectives, as the block issued them; half in the forward, half in the
  // backward (their mirror images), with the software's overlap as layer_cost has it.
  for (const TracedCollective& x : bt.comm) {
    if (x.dim == "tp") {
      const double t = traced_comm_time(c, x, s.tp_group, scale);
      lc.tp_fwd += t / 2;
      lc.tp_bwd += t / 2;
      lc.tp_bytes += static_cast<double>(x.bytes) * scale;
    } else if (x.dim == "ep" && x.kind == "all_to_all") {
      // Dispatch and combine (and the counts ahead of them) in the forward, their gradients in
      // the backward: all exposed, as layer_cost has them. (The block's all_reduces over ep are
      // its dense weights' gradients, summed once a step: the planner's data-parallel part.)
      const double t = traced_comm_time(c, x, s.ep_group, scale);
      lc.ep_fwd += t / 2;
      lc.ep_bwd += t / 2;
      lc.ep_bytes += static_cast<double>(x.bytes) * scale;
    } else if (x.dim == "cp" && x.kind == "all_to_all") {
      // All-to-all context parallel: the reshards of q, k, v to head shards and of the output
      // back (forward), their mirror images (backward); all exposed.
      const double t = traced_comm_time(c, x, s.cp_group, scale);
      lc.cp_fwd += t / 2;
      lc.cp_bwd += t / 2;
      lc.cp_bytes += static_cast<double>(x.bytes) * scale;
    } else if (x.dim == "cp" && x.kind == "send" && x.calls > 0) {
      // The ring, as layer_cost has it, with the messages' size and the attention traced.
      ring_comm(lc, c, s, static_cast<double>(x.bytes) / static_cast<double>(x.calls) * scale, attn_fwd, attn_bwd);
      lc.cp_bytes += static_cast<double>(x.bytes) * scale;
    }
  }
  if (s.tp > 1) overlap_tp_comm(lc, c, s, linear_fwd);
  if (s.recompute == "full") lc.recompute = lc.fwd + lc.tp_fwd + lc.ep_fwd + lc.cp_fwd;
  else if (s.recompute == "selective") lc.recompute = p.attention_recompute;
  return lc;
}

LayerCost layer_cost(const ModelSpec& m, const Cluster& c, const LayerShape& s) {
  TESSEL_CHECK(s.tp >= 1 && s.micro_batch >= 1, "layer_cost: tp {} and micro-batch {} must be positive", s.tp,
               s.micro_batch);
  if (traceable(m, s)) return traced_layer_cost(m, c, s);
  const Precision prec = precision_for(c.dtype);
  TESSEL_CHECK(s.ep >= 1 && s.cp >= 1 && m.seq >= s.cp, "layer_cost: ep {} and cp {} must be positive, cp at most seq {}",
               s.ep, s.cp, m.seq);
  Pass p{c, prec.activation == 4 ? DType::f32 : DType::bf16, share_of(c, s), {}};
  const int64_t t = s.tp, b = s.micro_batch, h = m.hidden;
  const int64_t sq = m.seq / s.cp;  // this rank's share of each sequence (context parallel)
  const int64_t tokens = b * sq;
  const int64_t norm_tokens = s.sp ? std::max<int64_t>(1, tokens / t) : tokens;  // LN, dropout, residual
  const int64_t hq = std::max<int64_t>(1, m.heads / t), hkv = std::max<int64_t>(1, m.kv_heads / t);
  const int64_t d = m.head_dim();
  const bool llama = m.swiglu();
  const Attrs norm{{"has_weight", true}, {"has_bias", !llama}, {"eps", 1e-5}};
  const char* norm_op = llama ? "rms_norm" : "layer_norm";
  auto norm_call = [&] {
    std::vector<TensorMeta> in = {p.meta({norm_tokens, h}), p.meta({h})};
    if (!llama) in.push_back(p.meta({h}));
    p.op(norm_op, in, norm, 0, false);
  };
  auto residual = [&] {
    if (m.dropout > 0)
      streaming(p, "dropout", {norm_tokens, h}, 1, dropout_attrs(m.dropout, {norm_tokens, h}));
    streaming(p, "add", {norm_tokens, h}, 2);
  };

  // Attention block.
  norm_call();
  if (llama) {
    linear(p, tokens, h, hq * d, false);
    linear(p, tokens, h, hkv * d, false);
    linear(p, tokens, h, hkv * d, false);
    for (int i = 0; i < 3; ++i) {  // rotary embedding: x*cos + rotate(x)*sin on q and k
      streaming(p, "mul", {tokens, hq * d}, 2);
      streaming(p, "mul", {tokens, hkv * d}, 2);
    }
  } else {
    linear(p, tokens, h, 3 * hq * d, true);
  }
  // Each tensor-parallel rank attends over its own heads; all_to_all context parallel splits
  // them again over cp, with whole sequences.
  const double attn_fwd0 = p.attention_fwd, attn_bwd0 = p.attention_bwd;
  if (s.cp > 1 && s.cp_method == "all_to_all")
    attention(p, m, b, std::max<int64_t>(1, hq / s.cp), std::max<int64_t>(1, hkv / s.cp), m.attn_rate(), m.seq);
  else
    attention(p, m, b, hq, hkv, m.attn_rate(), sq);
  const double attn_fwd = p.attention_fwd - attn_fwd0, attn_bwd = p.attention_bwd - attn_bwd0;
  linear(p, tokens, hq * d, h, !llama);
  residual();
  // MLP block.
  norm_call();
  const int64_t f = std::max<int64_t>(1, m.ffn / t);
  double imbalance = 1, dispatch_bytes = 0;
  if (s.moe) {
    // The router on this rank's tokens: scores [tokens, E], softmax and top-k.
    const int64_t E = m.experts, k = m.top_k;
    linear(p, tokens, h, E, false);
    streaming(p, "softmax", {tokens, E}, 1, Attrs{{"dim", int64_t{-1}}});
    // Tokens x k rows sorted by expert and sent to the expert's rank; this rank's experts get
    // as many on average, the busiest rank `imbalance` times that (every rank waits for it at
    // the combine's all_to_all).
    const double assignments = static_cast<double>(tokens * k);
    imbalance = moe_imbalance(m, assignments, s.ep);
    const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(assignments * imbalance)));
    const int64_t local = std::max<int64_t>(1, E / s.ep);
    std::vector<int64_t> counts(static_cast<size_t>(local));
    for (int64_t e = 0; e < local; ++e) counts[static_cast<size_t>(e)] = rows / local + (e < rows % local ? 1 : 0);
    streaming(p, "contiguous", {tokens * k, h});  // permute into expert order
    // The experts: SwiGLU by grouped GEMMs over each expert's rows (tensor parallel splits
    // their width as a dense MLP's), each group at the rate of one GEMM of its size — as
    // bench/gpu_grouped_gemm.py measured on an H100 (docs/plan.md, "Mixture of experts").
    const double per_expert = static_cast<double>(rows) / static_cast<double>(local);
    auto grouped = [&](int64_t in, int64_t out) {
      const double dim = gemm_size(c.calibration, per_expert, static_cast<double>(in), static_cast<double>(out));
      p.linear_fwd += p.op("grouped_matmul", {p.meta({rows, in}), p.meta({local, in, out})},
                           Attrs{{"counts", counts}, {"trans_w", false}}, dim, true);
    };
    grouped(h, f);
    grouped(h, f);
    streaming(p, "silu", {rows, f});
    streaming(p, "mul", {rows, f}, 2);
    grouped(f, h);
    streaming(p, "contiguous", {tokens * k, h});  // back into token order
    streaming(p, "mul", {tokens * k, h}, 2);      // weighted by the router's scores and summed
    if (m.shared_ffn > 0) {
      const int64_t sf = std::max<int64_t>(1, m.shared_ffn / t);
      linear(p, tokens, h, sf, false);
      linear(p, tokens, h, sf, false);
      streaming(p, "silu", {tokens, sf});
      streaming(p, "mul", {tokens, sf}, 2);
      linear(p, tokens, sf, h, false);
    }
    dispatch_bytes = assignments * static_cast<double>(h) * prec.activation;
  } else if (llama) {
    linear(p, tokens, h, f, false);
    linear(p, tokens, h, f, false);
    streaming(p, "silu", {tokens, f});
    streaming(p, "mul", {tokens, f}, 2);
    linear(p, tokens, f, h, false);
  } else {
    linear(p, tokens, h, f, true);
    streaming(p, "gelu", {tokens, f}, 1, Attrs{{"tanh", true}});
    linear(p, tokens, f, h, true);
  }
  residual();

  LayerCost lc = p.cost;
  tp_comm(lc, c, s, static_cast<double>(tokens * h) * prec.activation, p.linear_fwd);
  if (s.moe && s.ep > 1) {  // dispatch and combine, and their gradients
    const double one = all_to_all_time(c, dispatch_bytes, s.ep_group);
    lc.ep_fwd = 2 * one;
    lc.ep_bwd = 2 * one;
    lc.ep_bytes = 4 * dispatch_bytes;
  }
  lc.imbalance = imbalance;
  cp_comm(lc, c, s, m, attn_fwd, attn_bwd, hq, hkv, prec.activation);
  if (s.recompute == "full") lc.recompute = lc.fwd + lc.tp_fwd + lc.ep_fwd + lc.cp_fwd;
  else if (s.recompute == "selective") lc.recompute = p.attention_recompute;
  return lc;
}

LayerCost embedding_cost(const ModelSpec& m, const Cluster& c, const LayerShape& s) {
  const Precision prec = precision_for(c.dtype);
  Pass p{c, prec.activation == 4 ? DType::f32 : DType::bf16, share_of(c, s), {}};
  const int64_t tokens = s.micro_batch * (m.seq / std::max(1, s.cp));
  // Gathering rows reads and writes tokens x hidden; the backward scatters them back.
  if (m.position_embedding) streaming(p, "add", {tokens, m.hidden}, 2);
  else streaming(p, "contiguous", {tokens, m.hidden});
  LayerCost lc = p.cost;
  if (s.tp > 1) {  // vocab-parallel embedding: partial rows summed across tensor-parallel ranks
    lc.tp_fwd = all_reduce_time(c, static_cast<double>(tokens * m.hidden) * prec.activation, s.tp_group);
    lc.tp_bytes = static_cast<double>(tokens * m.hidden) * prec.activation;
  }
  return lc;
}

LayerCost head_cost(const ModelSpec& m, const Cluster& c, const LayerShape& s) {
  const Precision prec = precision_for(c.dtype);
  Pass p{c, prec.activation == 4 ? DType::f32 : DType::bf16, share_of(c, s), {}};
  const int64_t tokens = s.micro_batch * (m.seq / std::max(1, s.cp)), v = std::max<int64_t>(1, m.vocab / s.tp);
  const bool llama = m.swiglu();
  std::vector<TensorMeta> in = {p.meta({tokens, m.hidden}), p.meta({m.hidden})};
  if (!llama) in.push_back(p.meta({m.hidden}));
  p.op(llama ? "rms_norm" : "layer_norm", in, Attrs{{"has_weight", true}, {"has_bias", !llama}, {"eps", 1e-5}}, 0,
       false);
  linear(p, tokens, m.hidden, v, false);
  // Cross entropy over the (vocab-parallel) logits: a softmax pass and its gradient, or the
  // software's own passes over them (SoftwareProfile::loss_fwd_bytes).
  const SoftwareProfile& sw = c.software;
  if (sw.loss_fwd_bytes > 0 || sw.loss_bwd_bytes > 0) {
    const double logits = static_cast<double>(tokens) * static_cast<double>(v);
    p.cost.fwd += p.stream(logits * sw.loss_fwd_bytes) + 6 * sw.op_overhead;
    p.cost.bwd_input += p.stream(logits * sw.loss_bwd_bytes) + 2 * sw.op_overhead;
    p.cost.kernels += 6;
  } else {
    streaming(p, "softmax", {tokens, v}, 1, Attrs{{"dim", int64_t{-1}}});
  }
  LayerCost lc = p.cost;
  if (s.tp > 1) {  // max and sum-exp across the vocabulary shards, and the input all_reduce
    const double row = static_cast<double>(tokens) * 4;
    lc.tp_fwd = 2 * all_reduce_time(c, row, s.tp_group);
    lc.tp_bwd = all_reduce_time(c, static_cast<double>(tokens * m.hidden) * prec.activation, s.tp_group);
  }
  if (s.recompute == "full") lc.recompute = lc.fwd + lc.tp_fwd;
  return lc;
}

// ---------------------------------------------------------------- memory

double layer_activation_bytes(const ModelSpec& m, const Precision& prec, const LayerShape& s) {
  // Context parallel: this rank's seq / cp of each sequence; the scores below still span all
  // seq keys per query.
  const double sbh = static_cast<double>(m.seq / std::max(1, s.cp) * s.micro_batch * m.hidden);
  const double t = s.tp, a = static_cast<double>(m.heads), h = static_cast<double>(m.hidden);
  const double sq = static_cast<double>(m.seq);
  const double e = prec.activation / 2;  // Korthikanti counts 2-byte activations, 1-byte masks
  if (s.recompute == "full") return 2 * e * sbh / (s.sp ? t : 1);  // each layer's input only
  const double r = static_cast<double>(m.kv_heads) / a;
  const double mask = m.dropout > 0 ? 1 : 0, attn_mask = m.attn_rate() > 0 ? 1 : 0;
  const double f = static_cast<double>(m.ffn) / h;
  // Per sbh: LN inputs 2+2; attention: QKV input 2, Q 2, K and V 4r, projection input 2,
  // dropout mask 1; MLP: input 2, its width's intermediates (GELU: fc out and GELU out, 4f;
  // SwiGLU: gate, up, SiLU and product, 8f), dropout mask 1.
  double replicated = 4 * e + 2 * e + 2 * e + 2 * mask;        // LN inputs, QKV and MLP inputs, masks
  double split = (2 + 4 * r + 2) * e + (m.swiglu() ? 8 * f : 4 * f) * e;
  if (s.moe) {
    // A sparse block: the experts' SwiGLU intermediates for tokens x top_k rows (the busiest
    // rank's share), the permuted input and the experts' output rows (whole over tp: the block
    // works on whole sequences), the router's f32 scores; the shared experts as a dense MLP.
    const double k = static_cast<double>(m.top_k);
    const double imb = moe_imbalance(m, static_cast<double>(m.seq / std::max(1, s.cp) * s.micro_batch) * k, s.ep);
    split = (2 + 4 * r + 2) * e + (8 * f * k * imb + 8 * static_cast<double>(m.shared_ffn) / h) * e;
    replicated += 2 * e * 2 * k * imb + 4 * static_cast<double>(m.experts) / h;
  }
  // Scores: softmax output 2, dropout mask 1 and output 2 per (head, query, key) — per sbh
  // that is (2 + 3·mask)·a·s/h. Selective recompute drops them (they are rebuilt); a fused
  // attention never stores them and keeps a 4-byte log-sum-exp per (head, query): 4·a/h.
  const double scores = s.fused_attention            ? 4 * a / h
                        : s.recompute == "selective" ? 0
                                                     : (2 * e + attn_mask * (1 + 2 * e)) * a * sq / h;
  const double per_sbh = s.sp ? (replicated + split + scores) / t : replicated + (split + scores) / t;
  return sbh * per_sbh;
}

double layer_working_bytes(const ModelSpec& m, const Precision& prec, const LayerShape& s) {
  LayerShape none = s;
  none.recompute = "none";
  return layer_activation_bytes(m, prec, none);
}

// ---------------------------------------------------------------- model FLOPs

double step_flops(const ModelSpec& m, int64_t global_batch, const std::string& recompute) {
  const double tokens = static_cast<double>(global_batch) * static_cast<double>(m.seq);
  const double l = static_cast<double>(m.layers), h = static_cast<double>(m.hidden);
  const double layer_matmul = m.layer_parameters() - (m.swiglu() ? 2 * h : 0);  // ~ every weight is a matmul's
  // Matmul weights only: drop GPT's biases and LayerNorm vectors (9h + ffn per layer).
  const double matmul = m.swiglu() ? layer_matmul : layer_matmul - 9 * h - static_cast<double>(m.ffn);
  // A sparse block: the router and the top_k experts a token passes through for the MLP.
  const double f = static_cast<double>(m.ffn);
  const double sparse_matmul = matmul - 3 * h * f + h * static_cast<double>(m.experts) +
                               static_cast<double>(m.top_k) * 3 * h * f + 3 * h * static_cast<double>(m.shared_ffn);
  const double sparse = static_cast<double>(m.moe_layers(0, m.layers));
  const double all_matmul = (l - sparse) * matmul + sparse * sparse_matmul;
  const double attention = 4 * static_cast<double>(m.seq) * h;  // per token per layer: QK^T and PV
  const double fwd = tokens * (2 * all_matmul + attention * l + 2 * static_cast<double>(m.vocab) * h);
  double total = 3 * fwd;
  if (recompute == "full") total += fwd - tokens * 2 * static_cast<double>(m.vocab) * h;
  else if (recompute == "selective") total += tokens * attention / 2 * l;  // QK^T again, not PV
  return total;
}

}  // namespace tessel::plan
