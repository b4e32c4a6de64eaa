// The mixture-of-experts block (moe.h): route, dispatch, grouped SwiGLU experts, combine.
#include "tessel/nn/moe.h"

#include <numeric>

#include "tessel/autograd/function.h"
#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/ops/grouped_matmul.h"
#include "tessel/ops/ops.h"

namespace tessel::nn {

namespace {

// One stacked weight of the experts ("experts.w1.weight" [E, ...]).
class ExpertWeight : public Module {
 public:
  ExpertWeight(const Shape& shape, double init_std) {
    weight_ = &add_parameter("weight", shape, Init::normal(init_std));
    weight_->file_stack = true;
  }
  Parameter& weight() { return *weight_; }

 private:
  Parameter* weight_;
};


Tensor index_tensor(const std::vector<int64_t>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
}

// An index list of n rows, the vector make() returns — not made while tracing (meta mode),
// where only its length matters and the router lists no assignments.
template <typename Make>
Tensor index_list(int64_t n, Make make) {
  if (meta_mode()) return Tensor::empty({n}, DType::i64);
  return index_tensor(make());
}

}  // namespace

MoeStep& moe_step() {
  RankContext& ctx = rank_context();
  auto s = ctx.get_ext<MoeStep>();
  if (!s) {
    s = std::make_shared<MoeStep>();
    ctx.set_ext(s);
  }
  return *s;
}

Tensor attach_loss(const Tensor& y, const Tensor& loss, double scale) {
  if (!rank_context().grad_enabled || !loss.requires_grad() || scale == 0) return y;
  Tensor out = y.detach();
  const Shape shape = loss.shape();
  const DType dtype = loss.dtype();
  record_function("attach_loss", {y, loss}, {out}, [shape, dtype, scale](std::vector<Tensor>&& g) {
    return std::vector<Tensor>{std::move(g[0]), Tensor::full(shape, scale, dtype)};
  });
  return out;
}

MoeBlock::MoeBlock(int64_t dim, const MoeConfig& c, double init_std, int64_t layer) : c_(c), layer_(layer) {
  TESSEL_CHECK(c.num_experts >= 1 && c.top_k >= 1 && c.top_k <= c.num_experts && c.expert_hidden > 0,
               "moe config: num_local_experts ({}) must be ≥ 1, num_experts_per_tok ({}) 1..num_local_experts and the "
               "expert width ({}) positive",
               c.num_experts, c.top_k, c.expert_hidden);
  const int64_t E = c.num_experts, F = c.expert_hidden;
  gate_ = &add_module("gate", std::make_unique<Linear>(dim, E, false, Linear::Layout::out_in, init_std));
  auto& experts = add_module("experts", std::make_unique<ModuleGroup>());
  // Hugging Face's per-expert w1, w3 [F, C] and w2 [C, F] ([out, in]), stacked.
  w1_ = &experts.add("w1", std::make_unique<ExpertWeight>(Shape{E, F, dim}, init_std)).weight();
  w2_ = &experts.add("w2", std::make_unique<ExpertWeight>(Shape{E, dim, F}, init_std)).weight();
  w3_ = &experts.add("w3", std::make_unique<ExpertWeight>(Shape{E, F, dim}, init_std)).weight();
  if (c.shared_expert_hidden > 0)
    shared_ = &add_module("shared_expert", std::make_unique<SwiGlu>(dim, c.shared_expert_hidden, init_std));
}

Tensor MoeBlock::forward(const Tensor& x) const {
  const ExpertComm* ec = comm.get();
  const Tensor xl = ec ? ec->enter(x) : x;
  TESSEL_CHECK(xl.dim() == 3, "moe block: input must be [B, T, C], got {}", shape_str(xl.shape()));
  auto local = [&](const Parameter& p) { return ec ? ec->local(p.use()) : p.use(); };
  const int64_t B = xl.size(0), T = xl.size(1), C = xl.size(2), E = c_.num_experts, k = c_.top_k;
  const Tensor flat = reshape(xl, {B * T, C});

  // Route each sequence as one group (its T tokens here are 1/seq_shards of it under context
  // parallel).
  const int64_t seq_shards = ec ? ec->seq_shards : 1;
  const Routing r =
      route_tokens(linear(flat, local(gate_->weight())), {.top_k = k,
                                                          .scores = c_.scores,
                                                          .renormalize = c_.renormalize,
                                                          .capacity_factor = c_.capacity_factor,
                                                          .group_tokens = T,
                                                          .group_shards = seq_shards,
                                                          .sum_over_shards = ec ? ec->sum_over_seq : nullptr});
  MoeStep& step = moe_step();
  if (step.record && !meta_mode() && rank_context().backward_depth == 0 && (!ec || ec->reports_stats)) {
    MoeLayerStats& s = step.layers[layer_];
    s.tokens_per_expert.resize(static_cast<size_t>(E), 0.0);
    for (int64_t e = 0; e < E; ++e) s.tokens_per_expert[static_cast<size_t>(e)] += static_cast<double>(r.counts[static_cast<size_t>(e)]);
    s.assignments += static_cast<double>(B * T * k);
    s.dropped += static_cast<double>(r.dropped);
    // (Under context parallel each rank holds a part of B sequences and of their loss.)
    s.aux_sum += r.aux_loss.item() * static_cast<double>(B);
    s.sequences += static_cast<double>(B) / static_cast<double>(seq_shards);
    s.z_sum += r.z_loss.item() * static_cast<double>(B * T);
    s.tokens += static_cast<double>(B * T);
  }

  // Dispatch: the kept assignments' token rows, sorted by expert.
  const int64_t n = std::accumulate(r.counts.begin(), r.counts.end(), int64_t{0});
  Tensor rows = embedding(flat, index_list(n, [&] {
                            std::vector<int64_t> token_of(static_cast<size_t>(n));
                            for (int64_t i = 0; i < n; ++i)
                              token_of[static_cast<size_t>(i)] = r.order[static_cast<size_t>(i)] / k;
                            return token_of;
                          }));  // [n, C]

  std::vector<int64_t> counts = r.counts, send_rows, recv_rows, to_expert_major;
  const int64_t ep = ec ? ec->ep : 1;
  if (ep > 1) {
    // Each expert rank gets the rows for its experts; they arrive by source rank, by expert
    // within a source, and are reordered expert-major for the grouped GEMM.
    TESSEL_CHECK(E % ep == 0, "moe block: {} experts do not split over ep = {}", E, ep);
    const int64_t El = E / ep;
    const std::vector<int64_t> in = ec->exchange_counts(r.counts);  // [source][local expert]
    send_rows.assign(static_cast<size_t>(ep), 0);
    recv_rows.assign(static_cast<size_t>(ep), 0);
    counts.assign(static_cast<size_t>(El), 0);
    for (int64_t s = 0; s < ep; ++s)
      for (int64_t e = 0; e < El; ++e) {
        send_rows[static_cast<size_t>(s)] += r.counts[static_cast<size_t>(s * El + e)];
        recv_rows[static_cast<size_t>(s)] += in[static_cast<size_t>(s * El + e)];
        counts[static_cast<size_t>(e)] += in[static_cast<size_t>(s * El + e)];
      }
    if (!meta_mode()) {
      std::vector<int64_t> start(static_cast<size_t>(ep * El));  // where (source, expert) begins
      for (int64_t i = 0, at = 0; i < ep * El; ++i)
        start[static_cast<size_t>(i)] = at, at += in[static_cast<size_t>(i)];
      for (int64_t e = 0; e < El; ++e)
        for (int64_t s = 0; s < ep; ++s)
          for (int64_t j = 0; j < in[static_cast<size_t>(s * El + e)]; ++j)
            to_expert_major.push_back(start[static_cast<size_t>(s * El + e)] + j);
    }
    const int64_t received = std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0});
    rows = embedding(ec->exchange(rows, send_rows, recv_rows),
                     index_list(received, [&]() -> const std::vector<int64_t>& { return to_expert_major; }));
  }

  // The experts: down(silu(x·w1ᵀ) ⊙ x·w3ᵀ), one grouped product per matrix.
  const Tensor h = mul(silu(grouped_matmul(rows, local(*w1_), counts, true)), grouped_matmul(rows, local(*w3_), counts, true));
  Tensor out = grouped_matmul(h, local(*w2_), counts, true);  // [rows, C]

  if (ep > 1) {
    const Tensor back = index_list(out.size(0), [&] {
      std::vector<int64_t> v(to_expert_major.size());
      for (size_t i = 0; i < to_expert_major.size(); ++i)
        v[static_cast<size_t>(to_expert_major[i])] = static_cast<int64_t>(i);
      return v;
    });
    out = ec->exchange(embedding(out, back), recv_rows, send_rows);
  }

  // Combine: each token's k outputs weighted by the router (a dropped one reads a zero row).
  const Tensor position = index_list(B * T * k, [&] {
    std::vector<int64_t> v(static_cast<size_t>(B * T * k), n);
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(r.order[static_cast<size_t>(i)])] = i;
    return v;
  });
  const Tensor padded = cat({out, Tensor::zeros({1, C}, out.dtype())}, 0);
  const Tensor per_choice = reshape(embedding(padded, position), {B * T, k, C});
  Tensor y = reshape(sum(mul(per_choice, unsqueeze(r.weights, 2)), {1}), {B, T, C});

  // The balancing and z losses: means over the global batch's sequences and tokens (the
  // balancing loss here is already this rank's part of its sequences'; the z-loss a mean over
  // this rank's part of their tokens).
  const double share = step.loss_scale * (ec ? ec->router_share / ec->batch_shards : 1.0);
  y = attach_loss(y, r.aux_loss, c_.aux_loss_coef * share);
  y = attach_loss(y, r.z_loss, c_.z_loss_coef * share / static_cast<double>(seq_shards));
  if (ec) y = ec->leave(y, x);
  if (shared_) y = add(y, shared_->forward(x));
  return y;
}

}  // namespace tessel::nn
