// Ring attention (Liu et al. 2023; the causal load balance of Megatron-Core's context
// parallel): sdpa with the sequence split over one mesh dim ("cp", n ranks), the SPMD rule's
// custom decision (ops/attention.cc).
//
// Layout: the sequence of T tokens is cut into 2n chunks of c = T / (2n); cp rank r holds
// chunks r and 2n-1-r, one from each end, so under a causal mask every rank has the same work
// (the data loader lays the tokens out that way: parallel/data.h). A rank's local q, k, v
// [B, H, 2c, D] are its two chunks in that order.
//
// Forward: each rank keeps its queries and passes its key/value block (k and v packed in one
// buffer) around the ring, n - 1 times: at step s it holds the block of rank (r - s) mod n,
// posts the send of that block to r + 1 and the receive of the next from r - 1, then computes
// its queries against the block it holds while they travel. Every (query chunk, key chunk)
// pair gives a partial out and log-sum-exp (ops' sdpa_block_forward with the chunks' global
// positions; pairs wholly above the causal diagonal are skipped), merged into the running
// result by LSE: lse = log(e^la + e^lb), out = out_a·e^(la - lse) + out_b·e^(lb - lse).
// Backward: the same ring, carrying beside each key/value block its gradient accumulator.
// At step s a rank adds its queries' contributions to the dK and dV of the block it holds
// (sdpa_block_backward from the merged out and LSE) to the accumulator that arrives from r - 1
// and passes it on; after n steps every accumulator is back with its block's owner. The sum
// order is fixed by the ring, so the results do not depend on timing or thread count.
#include "tessel/dist/ring_attention.h"

#include "tessel/dist/comm_buffers.h"
#include "tessel/dist/kernels/ring_merge.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <memory>

#include "tessel/autograd/function.h"
#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/core/profile.h"
#include "tessel/core/view.h"
#include "tessel/dist/dispatch.h"
#include "tessel/dist/dtensor.h"
#include "tessel/dist/mesh_comm.h"
#include "tessel/ops/attention.h"
#include "tessel/ops/dispatch.h"
#include "tessel/ops/inplace.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ops/op.h"
#include "tessel/ops/registry.h"
#include "tessel/ops/trace.h"
#include "tessel/sharding/ring_order.h"

namespace tessel {

namespace {

constexpr int kTagKv = 7301, kTagGrad = 7302;

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The end of a ring step, forward or backward: waits for the K/V block sent on and the one
// coming in (the time counted as exposed), and returns the one that came in.
Tensor finish_kv_step(const WorkPtr& send, const WorkPtr& recv, const Tensor& next, RingAttentionStats& stats) {
  ProfileScope scope("ring attention (wait kv)");
  const auto t_wait = std::chrono::steady_clock::now();
  send->wait();
  recv->wait();
  stats.wait_s += seconds_since(t_wait);
  stats.transfers += 1;
  stats.bytes += next.numel() * static_cast<int64_t>(dtype_size(next.dtype()));
  return next;
}

// One call's geometry and saved pieces.
struct RingState {
  ProcessMesh mesh;
  int64_t cp_dim = 0;
  std::vector<DistAttr> in_attrs;  // q, k, v
  std::vector<Shape> global;       // q, k, v
  DistAttr out_attr;
  Tensor q, kv, out, lse, docs;  // local: q [B, H, 2c, D]; kv [2, B, Hkv, 2c, D]; out like q; lse [B, H, 2c]
  bool causal = true;
  double scale = 0.0;
  int64_t T = 0, c = 0;  // global sequence, chunk
  // Dropout on the probabilities: the stream, and where this rank's batch rows and heads sit
  // among the global ones (the block pairs add their chunks' positions).
  SdpaBlockPlace drop;
};

// The place of block pair (query chunk gq, key chunk gk) in the global sequence.
SdpaBlockPlace block_place(const RingState& st, int64_t gq, int64_t gk) {
  SdpaBlockPlace at = st.drop;
  at.q0 = gq * st.c;
  at.k0 = gk * st.c;
  at.total = st.T;
  return at;
}

// A block pair's call in this rank's op trace (ops/trace.h), in a real step with trace_ops on
// and in a traced one alike: sdpa's cost and product sizes on the pair's shapes, forward or
// backward. (The merges by LSE are the ring's own loops, a few passes over the output.)
void trace_block(const Tensor& q, const Tensor& k, const Tensor& v, const RingState& st, bool backward) {
  if (!tracing_ops()) return;
  const OpDef& op = op_by_name("sdpa");
  const std::vector<TensorMeta> in = {q.meta(), k.meta(), v.meta()};
  const Attrs attrs{{"causal", st.causal}, {"scale", st.scale}};
  const std::vector<TensorMeta> out = infer_op(op, in, attrs);
  const Cost cost = backward ? backward_cost(op, in, out, attrs, {true, true, true}) : op.cost(MetaCall{op, in, attrs}, out);
  trace_cost(op.name, cost, backward, product_sizes(op, in, attrs));
}

// Rows [half·c, (half + 1)·c) of dim `d` of x.
Tensor half_of(const Tensor& x, int64_t d, int64_t half, int64_t c) { return view::slice(x, d, half * c, (half + 1) * c); }


// Whether query chunk gq sees anything of key chunk gk (causal: not wholly above the diagonal).
bool pair_visible(bool causal, int64_t gq, int64_t gk) { return !causal || gk <= gq; }

std::vector<Tensor> ring_forward(RingState& st, const std::shared_ptr<ProcessGroup>& group) {
  const int64_t n = group->size(), r = group->rank(), c = st.c;
  const Tensor& q = st.q;
  Tensor acc = Tensor::zeros(q.shape(), q.dtype());
  Tensor acc_lse = Tensor::full({q.size(0), q.size(1), q.size(2)}, -std::numeric_limits<double>::infinity(), q.dtype());
  Tensor cur = st.kv;
  for (int64_t s = 0; s < n; ++s) {
    const int64_t src = ((r - s) % n + n) % n;
    Tensor next;
    WorkPtr send, recv;
    if (s + 1 < n) {
      ProfileScope scope("ring attention (post kv)");
      next = Tensor::empty(cur.shape(), cur.dtype());
      CommBuffers out_kv, in_kv;
      send = out_kv.finish(
          group->send_async(out_kv.in(cur), cur.numel(), cur.dtype(), static_cast<int>((r + 1) % n), kTagKv));
      recv = in_kv.finish(
          group->recv_async(in_kv.out(next), next.numel(), next.dtype(), static_cast<int>((r - 1 + n) % n), kTagKv));
    }
    RingAttentionStats& stats = ring_attention_stats();
    const auto t_compute = std::chrono::steady_clock::now();
    {
      ProfileScope scope("ring attention (block)");
      const Tensor k = view::select(cur, 0, 0), v = view::select(cur, 0, 1);
      for (int64_t qh = 0; qh < 2; ++qh)
        for (int64_t kh = 0; kh < 2; ++kh) {
          const int64_t gq = ring_chunk(r, n, qh), gk = ring_chunk(src, n, kh);
          if (!pair_visible(st.causal, gq, gk)) continue;
          const Tensor qb = half_of(q, 2, qh, c), kb = half_of(k, 2, kh, c), vb = half_of(v, 2, kh, c);
          trace_block(qb, kb, vb, st, false);
          if (meta_mode()) continue;  // a traced step: shapes only, acc keeps its own
          // Named tensors, not a structured binding: clang 14 (the fuzz build) cannot capture those.
          const std::array<Tensor, 2> block =
              sdpa_block_forward(qb, kb, vb, st.docs, st.causal, st.scale, block_place(st, gq, gk));
          const Tensor &o = block[0], &l = block[1];
          kernels::ring_merge(acc, acc_lse, o, l, qh * c);
        }
    }
    stats.compute_s += seconds_since(t_compute);
    if (s + 1 < n) cur = finish_kv_step(send, recv, next, stats);
  }
  st.out = acc;
  st.lse = acc_lse;
  return {acc};
}

// dq, dk, dv (local) of the ring for the output gradient dout (local, like q).
std::array<Tensor, 3> ring_backward(const RingState& st, const std::shared_ptr<ProcessGroup>& group, const Tensor& dout) {
  const int64_t n = group->size(), r = group->rank(), c = st.c;
  const Tensor& q = st.q;
  Tensor dq = Tensor::zeros(q.shape(), q.dtype());
  Tensor cur = st.kv;
  // The accumulator of the block held, arriving from r - 1 (none at step 0: this rank's own).
  Tensor incoming;
  WorkPtr incoming_work;
  std::vector<std::pair<Tensor, WorkPtr>> in_flight;  // sends whose buffers must outlive them
  for (int64_t s = 0; s < n; ++s) {
    const int64_t src = ((r - s) % n + n) % n;
    Tensor next;
    WorkPtr send, recv;
    if (s + 1 < n) {
      next = Tensor::empty(cur.shape(), cur.dtype());
      CommBuffers out_kv, in_kv;
      send = out_kv.finish(
          group->send_async(out_kv.in(cur), cur.numel(), cur.dtype(), static_cast<int>((r + 1) % n), kTagKv));
      recv = in_kv.finish(
          group->recv_async(in_kv.out(next), next.numel(), next.dtype(), static_cast<int>((r - 1 + n) % n), kTagKv));
    }
    Tensor dkv = Tensor::zeros(cur.shape(), cur.dtype());
    RingAttentionStats& stats = ring_attention_stats();
    const auto t_compute = std::chrono::steady_clock::now();
    {
      ProfileScope scope("ring attention (block backward)");
      const Tensor k = view::select(cur, 0, 0), v = view::select(cur, 0, 1);
      const Tensor dk = view::select(dkv, 0, 0), dv = view::select(dkv, 0, 1);
      for (int64_t qh = 0; qh < 2; ++qh)
        for (int64_t kh = 0; kh < 2; ++kh) {
          const int64_t gq = ring_chunk(r, n, qh), gk = ring_chunk(src, n, kh);
          if (!pair_visible(st.causal, gq, gk)) continue;
          const Tensor qb = half_of(q, 2, qh, c), kb = half_of(k, 2, kh, c), vb = half_of(v, 2, kh, c);
          trace_block(qb, kb, vb, st, true);
          const std::array<Tensor, 3> g =
              meta_mode()
                  ? std::array<Tensor, 3>{Tensor::empty(qb.meta()), Tensor::empty(kb.meta()), Tensor::empty(vb.meta())}
                  : sdpa_block_backward(qb, kb, vb, half_of(st.out, 2, qh, c), half_of(st.lse, 2, qh, c),
                                        half_of(dout, 2, qh, c), st.docs, st.causal, st.scale, block_place(st, gq, gk));
          add_(half_of(dq, 2, qh, c), g[0]);
          add_(half_of(dk, 2, kh, c), g[1]);
          add_(half_of(dv, 2, kh, c), g[2]);
        }
    }
    stats.compute_s += seconds_since(t_compute);
    if (incoming_work) {
      ProfileScope scope("ring attention (wait grad)");
      const auto t_wait = std::chrono::steady_clock::now();
      incoming_work->wait();
      stats.wait_s += seconds_since(t_wait);
      stats.transfers += 1;
      stats.bytes += incoming.numel() * static_cast<int64_t>(dtype_size(incoming.dtype()));
      // The earlier ranks' sum first, then this rank's: one order on every run.
      add_(incoming, dkv);
      dkv = incoming;
    }
    // Pass the accumulator on; after the last step it reaches the block's owner, r + 1's... which
    // is what this rank receives from r - 1 at the same time: its own block's gradient.
    incoming = Tensor::empty(cur.shape(), cur.dtype());
    CommBuffers out_grad, in_grad;
    in_flight.emplace_back(dkv, out_grad.finish(group->send_async(out_grad.in(dkv), dkv.numel(), dkv.dtype(),
                                                                  static_cast<int>((r + 1) % n), kTagGrad)));
    incoming_work = in_grad.finish(group->recv_async(in_grad.out(incoming), incoming.numel(), incoming.dtype(),
                                                     static_cast<int>((r - 1 + n) % n), kTagGrad));
    if (s + 1 < n) cur = finish_kv_step(send, recv, next, stats);
  }
  {
    // The last accumulator (this rank's own gradient) has nothing left to hide behind.
    RingAttentionStats& stats = ring_attention_stats();
    const auto t_wait = std::chrono::steady_clock::now();
    incoming_work->wait();
    stats.wait_s += seconds_since(t_wait);
    stats.transfers += 1;
    stats.bytes += incoming.numel() * static_cast<int64_t>(dtype_size(incoming.dtype()));
  }
  for (auto& [buf, work] : in_flight) work->wait();
  return {dq, view::select(incoming, 0, 0), view::select(incoming, 0, 1)};
}

std::vector<Tensor> dist_ring_sdpa(const OpDef& op, std::vector<Tensor>& inputs, const Attrs& attrs,
                                   const SpmdDecision& dec) {
  auto st = std::make_shared<RingState>();
  st->mesh = dist_attr(inputs[0]).mesh;
  {
    std::vector<TensorMeta> metas;
    for (const Tensor& t : inputs) metas.push_back(t.meta());
    infer_op(op, metas, attrs);  // shapes and dtypes: every rank throws alike
  }
  for (size_t i = 0; i < inputs.size(); ++i)
    if (dist_attr(inputs[i]).placements != dec.inputs[i]) inputs[i] = reshard(inputs[i], st->mesh, dec.inputs[i]);
  for (size_t m = 0; m < dec.inputs[0].size(); ++m)
    if (dec.inputs[0][m].is_shard(2)) st->cp_dim = static_cast<int64_t>(m);
  const int64_t n = st->mesh.dim_size(st->cp_dim);
  st->T = inputs[0].size(2);
  TESSEL_CHECK(inputs[1].size(2) == st->T, "sdpa: ring attention needs q {} and k {} of one sequence length",
               inputs[0].str(), inputs[1].str());
  TESSEL_CHECK(st->T % (2 * n) == 0,
               "sdpa: ring attention over {} ranks cuts the sequence into {} chunks (one from each end per rank), so "
               "its length {} must be a multiple of {}",
               n, 2 * n, st->T, 2 * n);
  st->c = st->T / (2 * n);
  st->causal = attrs.b("causal");
  st->scale = attrs.f("scale");
  if (attrs.has("dropout") && attrs.f("dropout") != 0.0) {
    // The rule's local attributes place this rank's q among the global batch rows and heads.
    TESSEL_ASSERT(dec.local_attrs.has_value(), "sdpa: the rule gave ring attention no dropout offsets");
    const Attrs& a = *dec.local_attrs;
    st->drop.dropout = SdpaDropout{a.f("dropout"), static_cast<uint64_t>(a.i("seed")),
                                   static_cast<uint64_t>(a.i("stream")), a.i("row0")};
    st->drop.b0 = a.i("b0");
    st->drop.h0 = a.i("h0");
    st->drop.heads = a.i("heads");
  }
  for (size_t i = 0; i < 3; ++i) {
    st->in_attrs.push_back(dist_attr(inputs[i]));
    st->global.push_back(inputs[i].shape());
  }
  st->out_attr = DistAttr(st->mesh, dec.outputs[0]);
  const int64_t rank = current_world_rank();
  TESSEL_ASSERT(st->mesh.contains(rank), "ring attention on a rank outside its mesh");
  auto group = mesh_dim_group(st->mesh, st->cp_dim);
  st->q = local_piece(inputs[0]).detach();
  {
    const Tensor k = local_piece(inputs[1]), v = local_piece(inputs[2]);
    st->kv = Tensor::empty(Shape{2, k.size(0), k.size(1), k.size(2), k.size(3)}, k.dtype());
    view::copy(view::select(st->kv, 0, 0), k);
    view::copy(view::select(st->kv, 0, 1), v);
  }
  if (inputs.size() == 4) st->docs = view::contiguous(local_piece(inputs[3]));
  Tensor out_local;
  {
    GradModeGuard no_grad(false);
    out_local = ring_forward(*st, group)[0];
  }
  Tensor out = wrap_dtensor(out_local, st->out_attr, inputs[0].shape());
  record_function("sdpa (ring attention)", {inputs[0], inputs[1], inputs[2]}, {out}, [st](std::vector<Tensor>&& g) {
    if (!g[0].defined()) return std::vector<Tensor>(3);
    Tensor gd = g[0];
    if (dist_attr(gd).placements != st->out_attr.placements) gd = reshard(gd, st->mesh, st->out_attr.placements);
    const Tensor dout = view::contiguous(local_piece(gd));
    std::array<Tensor, 3> grads;
    {
      GradModeGuard no_grad(false);
      grads = ring_backward(*st, mesh_dim_group(st->mesh, st->cp_dim), dout);
    }
    std::vector<Tensor> out;
    for (size_t i = 0; i < 3; ++i) out.push_back(wrap_dtensor(view::contiguous(grads[i]), st->in_attrs[i], st->global[i]));
    return out;
  });
  return {out};
}

}  // namespace

RingAttentionStats& ring_attention_stats() {
  RankContext& ctx = rank_context();
  auto s = ctx.get_ext<RingAttentionStats>();
  if (!s) {
    s = std::make_shared<RingAttentionStats>();
    ctx.set_ext(s);
  }
  return *s;
}

void register_ring_attention() { register_dist_impl("sdpa", &dist_ring_sdpa); }

}  // namespace tessel
