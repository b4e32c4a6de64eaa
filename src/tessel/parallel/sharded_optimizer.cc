// The sharded optimizer.
#include "tessel/parallel/sharded_optimizer.h"

#include <cmath>
#include <cstring>

#include "tessel/comm/world.h"
#include "tessel/core/error.h"
#include "tessel/core/view.h"
#include "tessel/dist/dtensor.h"
#include "tessel/dist/mesh_comm.h"
#include "tessel/core/shape.h"

namespace tessel::parallel {

struct ShardedOptimizer::Slot {
  nn::Parameter* p = nullptr;
  Placements stored;       // the parameter's placements on [dp, tp]
  bool tied = false;
  bool decay = false;      // AdamW weight decay: matrices only
  int64_t numel = 0;       // elements of the local piece
  int64_t off = 0, len = 0;  // this rank's flat slice of the local piece (stages 1, 2)
  std::vector<int64_t> counts;  // every dp rank's slice length
  Tensor m, v;             // f32 [len] (SGD: m is the momentum buffer)
};

ShardedOptimizer::~ShardedOptimizer() = default;

ShardedOptimizer::ShardedOptimizer(std::vector<nn::Parameter*> params, const Layout& layout, OptimizerOptions options,
                                   std::vector<nn::Parameter*> tied, std::shared_ptr<ProcessGroup> tied_group,
                                   bool count_tied)
    : layout_(layout), options_(std::move(options)), tied_group_(std::move(tied_group)), count_tied_(count_tied) {
  TESSEL_CHECK(options_.kind == "adamw" || options_.kind == "sgd", "train.optimizer must be adamw or sgd, got '{}'",
               options_.kind);
  const int64_t stage = layout_.config().sharding_stage, dp = layout_.config().dp;
  for (nn::Parameter* p : params) {
    Slot s;
    s.p = p;
    TESSEL_CHECK(p->value.defined() && is_dist(p->value), "shard_optimizer: parameter '{}' is not distributed; call "
                 "parallelize first", p->name);
    TESSEL_CHECK(p->value.dtype() == DType::f32, "shard_optimizer: parameter '{}' is {}, only f32 is supported", p->name,
                 p->value.dtype());
    s.stored = dist_attr(p->value).placements;
    s.decay = p->shape.size() >= 2;
    for (nn::Parameter* t : tied) s.tied = s.tied || t == p;
    s.numel = local_piece(p->value).numel();
    if (stage == 1 || stage == 2) {
      for (int64_t r = 0; r < dp; ++r) s.counts.push_back(split_size(s.numel, dp, r));
      s.off = split_offset(s.numel, dp, layout_.dp_rank);
      s.len = split_size(s.numel, dp, layout_.dp_rank);
    } else {
      s.off = 0;
      s.len = s.numel;
    }
    s.m = Tensor::zeros({s.len}, DType::f32);
    if (options_.kind == "adamw") s.v = Tensor::zeros({s.len}, DType::f32);
    slots_.push_back(std::move(s));
  }
}

double ShardedOptimizer::step(double lr, double max_norm) {
  const int64_t stage = layout_.config().sharding_stage;
  const ProcessMesh mesh = layout_.stage_mesh();
  auto dp_group = mesh_dim_group(mesh, 0);
  ++steps_;
  // 1. Gradients laid out like their parameter (stage 2: this rank's flat slice).
  std::vector<Tensor> grads(slots_.size());
  double sum_sq = 0;
  grad_bytes_ = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    Tensor g = s.p->value.grad();
    Placements target = s.stored;
    if (stage == 2) target[0] = Partial();
    if (!g.defined()) g = dtensor_from_local(Tensor::zeros(local_piece(s.p->value).shape(), DType::f32), mesh, s.stored,
                                             s.p->value.shape());
    if (dist_attr(g).placements != target) g = reshard(g, mesh, target);
    Tensor local = view::contiguous(local_piece(g));
    if (local.storage().use_count() > 1 || local.offset() != 0) local = view::clone(local);
    if (s.tied && tied_group_) tied_group_->all_reduce(local.data<float>(), local.numel(), DType::f32, ReduceOp::sum);
    Tensor shard;
    if (stage == 2) {
      shard = Tensor::empty({s.len}, DType::f32);
      dp_group->reduce_scatter_v(local.data<float>(), shard.data<float>(), s.counts, DType::f32, ReduceOp::sum);
    } else if (stage == 1) {
      shard = view::slice(view::reshape(local, {s.numel}), 0, s.off, s.off + s.len);
    } else {
      shard = view::reshape(local, {s.numel});
    }
    grad_bytes_ += (stage >= 2 ? s.len : s.numel) * 4;
    // Count each element once: over dp, stages 1–3 hold disjoint slices and stage 0 counts on
    // dp rank 0; over tp, replicated parameters count on tp rank 0; tied copies count once.
    bool counts = !(s.tied && !count_tied_);
    if (stage == 0) counts = counts && layout_.dp_rank == 0;
    if (!s.stored[1].is_shard()) counts = counts && layout_.tp_rank == 0;
    if (counts) {
      sum_sq += optim::sum_squares(shard.data<float>(), s.len);  // contiguous: a flat slice
    }
    grads[i] = shard;
  }
  world_group()->all_reduce(&sum_sq, 1, DType::f64, ReduceOp::sum);
  const double norm = std::sqrt(sum_sq);
  const double clip = max_norm > 0 && norm + 1e-6 > max_norm ? max_norm / (norm + 1e-6) : 1.0;

  // 2. Update this rank's slice; stages 1 and 2 then gather the slices back.
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    Tensor g = grads[i];
    if (clip < 1.0) {
      Tensor c = view::clone(g);
      float* pc = c.data<float>();
      for (int64_t k = 0; k < s.len; ++k) pc[k] = static_cast<float>(pc[k] * clip);
      g = c;
    }
    Tensor piece = local_piece(s.p->value);
    TESSEL_ASSERT(piece.is_contiguous(), "parameter '{}': local piece is not contiguous", s.p->name);
    float* p = piece.data<float>() + s.off;
    if (options_.kind == "adamw")
      optim::adamw_update(p, g.data<float>(), s.m.data<float>(), s.v.data<float>(), s.len, steps_, options_.adamw, lr,
                          s.decay);
    else
      optim::sgd_update(p, g.data<float>(), s.m.data<float>(), s.len, steps_ == 1, options_.sgd, lr);
    if (stage == 1 || stage == 2) {
      Tensor mine = Tensor::empty({s.len}, DType::f32);
      if (s.len > 0) std::memcpy(mine.data<float>(), p, static_cast<size_t>(s.len) * sizeof(float));
      dp_group->all_gather_v(mine.data<float>(), piece.data<float>(), s.counts, DType::f32);
    }
    s.p->value.set_grad(Tensor());
  }
  return norm;
}

StateBytes ShardedOptimizer::state_bytes() const {
  StateBytes b;
  for (const Slot& s : slots_) {
    b.params += s.numel * 4;
    b.optimizer += (s.m.defined() ? s.m.numel() * 4 : 0) + (s.v.defined() ? s.v.numel() * 4 : 0);
  }
  b.grads = grad_bytes_;
  return b;
}

}  // namespace tessel::parallel
