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
    s.decay = p->stored_shape().size() >= 2;  // matrices as checkpoints hold them (c_attn's bias [3, C] is a vector)
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

namespace {

void copy_floats(float* dst, const float* src, int64_t n) {
  if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

// One buffer for many gradient pieces, so that a group reduces them with one collective
// instead of one per parameter.
struct Bucket {
  Tensor flat;                   // f32
  std::vector<int64_t> offsets;  // of each piece in `flat`

  // Packs the pieces one after another.
  static Bucket pack(const std::vector<Tensor*>& pieces) {
    Bucket b;
    int64_t total = 0;
    for (Tensor* t : pieces) {
      b.offsets.push_back(total);
      total += t->numel();
    }
    b.flat = Tensor::empty({total}, DType::f32);
    for (size_t i = 0; i < pieces.size(); ++i) copy_into(*pieces[i], b.flat.data<float>() + b.offsets[i]);
    return b;
  }
  // Piece i, read back from `flat` with its shape.
  Tensor piece(size_t i, const Shape& shape) const {
    return view::reshape(view::slice(flat, 0, offsets[i], offsets[i] + shape_numel(shape)), shape);
  }
  static void copy_into(const Tensor& t, float* dst) {
    Tensor c = view::contiguous(t);
    copy_floats(dst, c.data<float>(), c.numel());
  }
};

}  // namespace

double ShardedOptimizer::step(double lr, double max_norm) {
  const int64_t stage = layout_.config().sharding_stage, dp = layout_.config().dp;
  const ProcessMesh mesh = layout_.stage_mesh();
  auto dp_group = mesh_dim_group(mesh, 0);
  ++steps_;
  // Stages 0-2 sum the data-parallel partial gradients of all parameters together: one
  // all_reduce (stage 0) or one reduce_scatter of every rank's flat slices (stages 1 and 2).
  // Stage 3 gradients arrive as dp shards already (the gather's backward reduce-scattered them).
  const bool dp_bucket = dp > 1 && stage <= 2;
  // 1. Each gradient's local piece, laid out like its parameter over tp and still a partial sum
  //    over dp when dp_bucket; a partial sum over tp of a tp-replicated parameter is kept too
  //    and summed with the others over tp.
  std::vector<Tensor> locals(slots_.size());
  std::vector<bool> owned(slots_.size(), false);  // `locals[i]` is ours to change in place
  std::vector<Tensor*> tp_partial;
  std::vector<size_t> tp_partial_slots;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    Placements target = s.stored;
    if (dp_bucket) target[0] = Partial();
    Tensor g = s.p->value.grad();
    if (!g.defined()) {
      g = dtensor_from_local(Tensor::zeros(local_piece(s.p->value).shape(), DType::f32), mesh, target,
                             s.p->value.shape());
    }
    const Placements& have = dist_attr(g).placements;
    if (have[1].is_partial() && target[1].is_replicate()) target[1] = have[1];
    if (have != target) g = reshard(g, mesh, target);
    locals[i] = view::contiguous(local_piece(g));
    if (target[1].is_partial() && !s.stored[1].is_partial()) {
      tp_partial.push_back(&locals[i]);
      tp_partial_slots.push_back(i);
    }
  }
  if (!tp_partial.empty()) {
    Bucket b = Bucket::pack(tp_partial);
    mesh_dim_group(mesh, 1)->all_reduce(b.flat.data<float>(), b.flat.numel(), DType::f32, ReduceOp::sum);
    for (size_t k = 0; k < tp_partial.size(); ++k) {
      *tp_partial[k] = b.piece(k, tp_partial[k]->shape());
      owned[tp_partial_slots[k]] = true;
    }
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i].tied || !tied_group_) continue;
    if (!owned[i]) locals[i] = view::clone(locals[i]);
    tied_group_->all_reduce(locals[i].data<float>(), locals[i].numel(), DType::f32, ReduceOp::sum);
  }

  // 2. This rank's gradient for each slot: all of it (stages 0, 3) or its flat slice (1, 2).
  //    Stages 1 and 2 pack the slots of at most kPackMax elements, where a collective's latency
  //    outweighs copying, with rank r's slices of every such slot one after another in region
  //    r; a larger slot is scattered and gathered alone, in place.
  constexpr int64_t kPackMax = 1 << 16;
  std::vector<bool> packed(slots_.size(), false);
  std::vector<int64_t> region(static_cast<size_t>(dp) + 1, 0);  // region r starts at region[r]
  std::vector<int64_t> region_size;                             // ... and holds region_size[r]
  std::vector<std::vector<int64_t>> at(slots_.size());          // slot i's slice in region r at at[i][r]
  std::vector<Tensor> grads(slots_.size());
  const size_t me = static_cast<size_t>(layout_.dp_rank);
  if (dp_bucket && stage == 0) {
    std::vector<Tensor*> all;
    for (Tensor& t : locals) all.push_back(&t);
    Bucket b = Bucket::pack(all);
    dp_group->all_reduce(b.flat.data<float>(), b.flat.numel(), DType::f32, ReduceOp::sum);
    for (size_t i = 0; i < slots_.size(); ++i)
      grads[i] = view::reshape(b.piece(i, locals[i].shape()), {slots_[i].numel});
  } else if (dp_bucket) {
    for (size_t i = 0; i < slots_.size(); ++i) packed[i] = slots_[i].numel <= kPackMax;
    for (int64_t r = 0; r < dp; ++r) {
      const size_t ru = static_cast<size_t>(r);
      int64_t used = 0;
      for (size_t i = 0; i < slots_.size(); ++i) {
        if (!packed[i]) continue;
        at[i].push_back(used);
        used += slots_[i].counts[ru];
      }
      region[ru + 1] = region[ru] + used;
      region_size.push_back(used);
    }
    Tensor flat = Tensor::empty({region.back()}, DType::f32);
    for (size_t i = 0; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      if (!packed[i]) {
        grads[i] = Tensor::empty({s.len}, DType::f32);
        dp_group->reduce_scatter_v(locals[i].data<float>(), grads[i].data<float>(), s.counts, DType::f32,
                                   ReduceOp::sum);
        continue;
      }
      for (int64_t r = 0; r < dp; ++r) {
        const size_t ru = static_cast<size_t>(r);
        copy_floats(flat.data<float>() + region[ru] + at[i][ru], locals[i].data<float>() + split_offset(s.numel, dp, r),
                    s.counts[ru]);
      }
    }
    locals.clear();  // packed or scattered: free them before the reduced slices are made
    Tensor mine = Tensor::empty({region_size[me]}, DType::f32);
    dp_group->reduce_scatter_v(flat.data<float>(), mine.data<float>(), region_size, DType::f32, ReduceOp::sum);
    for (size_t i = 0; i < slots_.size(); ++i)
      if (packed[i]) grads[i] = view::slice(mine, 0, at[i][me], at[i][me] + slots_[i].len);
  } else {
    for (size_t i = 0; i < slots_.size(); ++i) grads[i] = view::reshape(locals[i], {slots_[i].numel});
  }

  // 3. The global norm. Count each element once: over dp, stages 1–3 hold disjoint slices and
  //    stage 0 counts on dp rank 0; over tp, replicated parameters count on tp rank 0; tied
  //    copies count once.
  double sum_sq = 0;
  grad_bytes_ = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    grad_bytes_ += (stage >= 2 ? s.len : s.numel) * 4;
    bool counts = !(s.tied && !count_tied_);
    if (stage == 0) counts = counts && layout_.dp_rank == 0;
    if (!s.stored[1].is_shard()) counts = counts && layout_.tp_rank == 0;
    if (counts) sum_sq += optim::sum_squares(grads[i].data<float>(), s.len);  // contiguous: a flat slice
  }
  world_group()->all_reduce(&sum_sq, 1, DType::f64, ReduceOp::sum);
  const double norm = std::sqrt(sum_sq);
  const float clip = optim::clip_coefficient(norm, max_norm);

  // 4. Update this rank's slice (the clip scales the gradient inside the update); stages 1 and
  //    2 then gather every rank's slices back: the packed ones with one all_gather.
  const bool gather = dp_bucket && stage != 0;
  Tensor mine_packed = gather ? Tensor::empty({region_size[me]}, DType::f32) : Tensor();
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    Tensor piece = local_piece(s.p->value);
    TESSEL_ASSERT(piece.is_contiguous(), "parameter '{}': local piece is not contiguous", s.p->name);
    float* p = piece.data<float>() + s.off;
    const float* g = grads[i].data<float>();
    if (options_.kind == "adamw")
      optim::adamw_update(p, g, s.m.data<float>(), s.v.data<float>(), s.len, steps_, options_.adamw, lr, s.decay, clip);
    else
      optim::sgd_update(p, g, s.m.data<float>(), s.len, steps_ == 1, options_.sgd, lr, clip);
    s.p->value.set_grad(Tensor());
  }
  grads.clear();
  if (gather) {
    for (size_t i = 0; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      float* piece = local_piece(s.p->value).data<float>();
      if (packed[i]) {
        copy_floats(mine_packed.data<float>() + at[i][me], piece + s.off, s.len);
        continue;
      }
      Tensor mine = Tensor::empty({s.len}, DType::f32);
      copy_floats(mine.data<float>(), piece + s.off, s.len);
      dp_group->all_gather_v(mine.data<float>(), piece, s.counts, DType::f32);
    }
    Tensor all = Tensor::empty({region.back()}, DType::f32);
    dp_group->all_gather_v(mine_packed.data<float>(), all.data<float>(), region_size, DType::f32);
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (!packed[i]) continue;
      float* piece = local_piece(slots_[i].p->value).data<float>();
      for (int64_t r = 0; r < dp; ++r) {
        const size_t ru = static_cast<size_t>(r);
        if (r == layout_.dp_rank) continue;
        copy_floats(piece + split_offset(slots_[i].numel, dp, r), all.data<float>() + region[ru] + at[i][ru],
                    slots_[i].counts[ru]);
      }
    }
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
