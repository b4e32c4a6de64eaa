// Expert parallelism (expert.h).
#include "tessel/parallel/expert.h"

#include <numeric>

#include "tessel/autograd/function.h"
#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/core/profile.h"
#include "tessel/core/view.h"
#include "tessel/dist/comm_buffers.h"
#include "tessel/dist/dtensor.h"

namespace tessel::parallel {

Tensor exchange_rows(const Tensor& x, const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows,
                     std::shared_ptr<ProcessGroup> group) {
  ProfileScope scope("(expert all_to_all)");
  TESSEL_CHECK(x.dim() == 2, "exchange_rows: rows must be [n, C], got {}", shape_str(x.shape()));
  const int64_t C = x.size(1);
  TESSEL_CHECK(std::accumulate(send_rows.begin(), send_rows.end(), int64_t{0}) == x.size(0),
               "exchange_rows: {} rows but the send counts add up to {}", x.size(0),
               std::accumulate(send_rows.begin(), send_rows.end(), int64_t{0}));
  const Tensor in = view::contiguous(x);
  Tensor out = Tensor::empty({std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0}), C}, x.dtype());
  std::vector<int64_t> send(send_rows), recv(recv_rows);
  for (int64_t& v : send) v *= C;
  for (int64_t& v : recv) v *= C;
  CommBuffers cb;
  cb.finish(group->all_to_all_v_async(cb.in(in), send, cb.out(out), recv, x.dtype()))->wait();
  record_function("exchange_rows", {x}, {out}, [send_rows, recv_rows, group](std::vector<Tensor>&& g) {
    return std::vector<Tensor>{g[0].defined() ? exchange_rows(g[0], recv_rows, send_rows, group) : Tensor()};
  });
  return out;
}

std::shared_ptr<const nn::ExpertComm> expert_comm(const Layout& layout, const ProcessMesh& mesh) {
  auto c = std::make_shared<nn::ExpertComm>();
  const int64_t tp = layout.degree("tp");
  c->ep = layout.degree("ep");
  c->ep_rank = layout.coord("ep");
  c->router_share = 1.0 / static_cast<double>(tp);
  c->batch_shards = static_cast<double>(layout.degree("dp") * layout.degree("ep"));
  c->reports_stats = layout.coord("tp") == 0;
  // In: this rank's sequences (the batch split over dp and ep; the sequence whole, or split over
  // cp). Out: the experts' partial sums over tp, laid out as the activations between blocks.
  const Placements between = layout.activation_placements();
  const Placements whole = layout.placements({{"dp", Shard(0)}, {"ep", Shard(0)}, {"cp", Shard(1)}});
  const Placements partial =
      tp > 1 ? layout.placements({{"dp", Shard(0)}, {"ep", Shard(0)}, {"cp", Shard(1)}, {"tp", Partial()}}) : whole;
  c->seq_shards = layout.degree("cp");
  if (c->seq_shards > 1) {
    std::shared_ptr<ProcessGroup> group = layout.group("cp");
    c->sum_over_seq = [group](std::vector<double>& v) {
      group->all_reduce(v.data(), static_cast<int64_t>(v.size()), DType::f64, ReduceOp::sum);
    };
  }
  // What the block computes from a local piece is this rank's share of the gradient over every
  // dim the piece is replicated on (its tokens alone; over tp, the experts' partial sums).
  auto share = [](const Placements& p) {
    Placements out = p;
    for (Placement& x : out)
      if (x.is_replicate()) x = Partial();
    return out;
  };
  c->enter = [mesh, whole, share](const Tensor& x) { return to_local(reshard(x, mesh, whole), share(whole)); };
  c->leave = [mesh, partial, between](const Tensor& y, const Tensor& x) {
    return reshard(dtensor_from_local(y, mesh, partial, x.shape()), mesh, between);
  };
  c->local = [share](const Tensor& p) { return to_local(p, share(dist_attr(p).placements)); };
  if (c->ep > 1) {
    std::shared_ptr<ProcessGroup> group = layout.group("ep");
    c->exchange = [group](const Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
      return exchange_rows(x, send, recv, group);
    };
    c->exchange_counts = [group](const std::vector<int64_t>& counts) {
      std::vector<int64_t> out(counts.size());
      const int64_t per_rank = static_cast<int64_t>(counts.size()) / group->size();
      group->all_to_all(counts.data(), out.data(), per_rank, DType::i64);
      if (meta_mode()) {
        // A traced step has no peers to hear from: each sends what this rank sends its experts
        // (the router routes as a balanced one in meta mode, the same on every rank).
        const int64_t mine = group->rank() * per_rank;
        for (size_t i = 0; i < out.size(); ++i) out[i] = counts[static_cast<size_t>(mine) + i % static_cast<size_t>(per_rank)];
      }
      return out;
    };
  }
  return c;
}

}  // namespace tessel::parallel
