// The sharded optimizer: gradient buckets launched from grad-ready hooks, ZeRO shards as
// Shard(d) boxes of each parameter's local piece, and the update on this rank's shard.
#include "tessel/parallel/sharded_optimizer.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "tessel/comm/world.h"
#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/core/profile.h"
#include "tessel/core/shape.h"
#include "tessel/core/view.h"
#include "tessel/dist/comm_buffers.h"
#include "tessel/dist/dtensor.h"
#include "tessel/ops/inplace.h"
#include "tessel/ops/trace.h"

namespace tessel::parallel {

struct ShardedOptimizer::Slot {
  nn::Parameter* p = nullptr;
  Placements stored;  // the parameter's placements on the stage mesh
  Placements shard;   // its ZeRO shard's: optimizer states and the synced gradient
  bool tied = false;
  bool decay = false;  // AdamW weight decay: matrices only
  // Stages 1 and 2: this rank's shard is the box of the local piece at its dp coordinate along
  // `dim`, `sizes[r]` wide for dp rank r. False for stages 0 and 3 (the whole local piece is
  // the shard) and for a 1-D parameter tp already splits, which stays replicated over dp.
  bool split = false;
  // Stage 3 (with dp > 1): the parameter is stored Shard(dim) over dp, `sizes[r]` wide for dp
  // rank r, and its gradient arrives full over dp from the gathered weight's backward; the
  // bucket cuts it into the same boxes as stage 2 does (the local piece is the shard itself).
  bool gathered = false;
  int64_t dim = 0;
  std::vector<int64_t> sizes;
  bool hooked = false;      // synced from grad-ready hooks
  int64_t ready = 0;        // backwards this step whose gradient is complete
  bool tp_partial = false;  // the gradient is still a partial sum over tp
  // The mesh dims besides dp over which the gradient is a partial sum of the batch's pieces, in
  // mesh order: cp (context parallel), and ep for a parameter replicated over it.
  std::vector<int64_t> sum_dims;
  Tensor grad;              // the synced gradient: distributed, placed like `shard` (tp partial aside)
  Tensor m, v;              // distributed, placed `shard` (SGD: m is the momentum buffer)

  int64_t offset(int64_t r) const {
    int64_t o = 0;
    for (int64_t i = 0; i < r; ++i) o += sizes[static_cast<size_t>(i)];
    return o;
  }
  // Dp rank r's box of a local piece (a strided view unless dim is 0).
  Tensor box(const Tensor& piece, int64_t r) const {
    return split ? view::slice(piece, dim, offset(r), offset(r) + sizes[static_cast<size_t>(r)]) : piece;
  }
  // Dp rank r's box of a gradient as the bucket receives it: of the local piece (stages 1, 2)
  // or of the gathered weight's (stage 3).
  Tensor grad_box(const Tensor& grad, int64_t r) const {
    return split || gathered ? view::slice(grad, dim, offset(r), offset(r) + sizes[static_cast<size_t>(r)]) : grad;
  }
  // The shape of dp rank r's shard of the parameter's local piece.
  Shape shard_shape(int64_t r) const {
    Shape shape = local_piece(p->value).shape();
    if (split) shape[static_cast<size_t>(dim)] = sizes[static_cast<size_t>(r)];
    return shape;
  }
};

struct ShardedOptimizer::Bucket {
  std::vector<size_t> slots;
  std::vector<Tensor> grads;             // full local gradients, until packed
  int64_t bytes = 0;
  Tensor flat, mine;                     // what is sent, and this rank's reduced part
  std::vector<std::vector<int64_t>> at;  // per slot and dp rank, its place in that rank's region
  std::vector<int64_t> region;           // stages 1, 2: every dp rank's region size
  WorkPtr work;                          // over dp (none when dp is 1)
  std::vector<int64_t> sum_dims;         // the slots' sum_dims
  size_t summing = 0;                    // which of them sum_work sums over
  WorkPtr sum_work;                      // the sum over it of what the dp collective left here
};

template <typename F>
void ShardedOptimizer::timed(const char* what, F&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  waits_.push_back({what, start, std::chrono::steady_clock::now()});
}

ShardedOptimizer::~ShardedOptimizer() {
  for (Slot& s : slots_) {
    s.p->value.autograd_meta().grad_ready_hooks.clear();
    s.p->value.autograd_meta().post_accumulate_hooks.clear();
  }
  // Never free a buffer a collective still uses.
  for (Bucket& b : in_flight_)
    if (b.work) b.work->wait();
  for (Bucket& b : sum_in_flight_) b.sum_work->wait();
}

ShardedOptimizer::ShardedOptimizer(std::vector<nn::Parameter*> params, const Layout& layout, OptimizerOptions options,
                                   std::vector<nn::Parameter*> tied, std::shared_ptr<ProcessGroup> tied_group,
                                   bool count_tied)
    : layout_(layout), options_(std::move(options)), tied_group_(std::move(tied_group)), count_tied_(count_tied) {
  TESSEL_CHECK(options_.kind == "adamw" || options_.kind == "sgd", "train.optimizer must be adamw or sgd, got '{}'",
               options_.kind);
  TESSEL_CHECK(options_.bucket_bytes > 0, "parallel.bucket_mb must be positive");
  TESSEL_CHECK(options_.reduce_dtype == DType::f32 || options_.reduce_dtype == DType::bf16,
               "train.grad_reduce must be f32 or bf16, got {}", dtype_name(options_.reduce_dtype));
  const int64_t stage = layout_.config().sharding_stage, dp = layout_.degree("dp");
  const size_t dp_dim = static_cast<size_t>(layout_.stage_dim("dp")), tp_dim = static_cast<size_t>(layout_.stage_dim("tp"));
  const ProcessMesh mesh = layout_.stage_mesh();
  auto batch_dim = [&](const char* name) {  // a mesh dim of more than one rank the batch is split over
    return layout_.has_dim(name) && layout_.degree(name) > 1 ? layout_.stage_dim(name) : int64_t{-1};
  };
  const int64_t cp_dim = batch_dim("cp"), ep_dim = batch_dim("ep");
  for (int64_t d : {cp_dim, ep_dim})
    if (d >= 0) sum_groups_[d] = layout_.group(d == cp_dim ? "cp" : "ep");
  MemoryKindScope charge(MemoryKind::optimizer);
  slots_.reserve(params.size());
  for (nn::Parameter* p : params) {
    Slot s;
    s.p = p;
    TESSEL_CHECK(p->value.defined() && is_dist(p->value), "shard_optimizer: parameter '{}' is not distributed; call "
                 "parallelize first", p->name);
    TESSEL_CHECK(p->value.dtype() == DType::f32, "shard_optimizer: parameter '{}' is {}, only f32 is supported", p->name,
                 p->value.dtype());
    s.stored = s.shard = dist_attr(p->value).placements;
    s.decay = p->stored_shape().size() >= 2;  // matrices as checkpoints hold them (c_attn's bias [3, C] is a vector)
    for (nn::Parameter* t : tied) s.tied = s.tied || t == p;
    if (cp_dim >= 0) s.sum_dims.push_back(cp_dim);
    if (ep_dim >= 0 && !s.stored[static_cast<size_t>(ep_dim)].is_shard()) s.sum_dims.push_back(ep_dim);
    std::sort(s.sum_dims.begin(), s.sum_dims.end());
    // A placement over a mesh dim of one rank splits nothing.
    Placements splits = s.stored;
    for (size_t m = 0; m < splits.size(); ++m)
      if (mesh.dim_size(static_cast<int64_t>(m)) == 1) splits[m] = Replicate();
    const int64_t d = dp_shard_dim(splits, dp_dim, p->shape, dp);
    bool taken = false;  // another mesh dim shards d (no dim was free)
    for (size_t m = 0; m < splits.size(); ++m) taken = taken || (m != dp_dim && splits[m].is_shard(d));
    if ((stage == 1 || stage == 2) && dp > 1 && !p->shape.empty() && !taken) {
      s.split = true;
      s.dim = d;
      const int64_t n = local_piece(p->value).size(d);
      for (int64_t r = 0; r < dp; ++r) s.sizes.push_back(split_size(n, dp, r));
      s.shard[dp_dim] = Shard(d);
    }
    if (stage == 3 && dp > 1 && s.stored[dp_dim].is_shard() &&
        !(layout_.degree("tp") > 1 && s.stored[tp_dim].is_shard(s.stored[dp_dim].dim))) {
      s.gathered = true;
      s.dim = s.stored[dp_dim].dim;
      const int64_t n = p->shape[static_cast<size_t>(s.dim)];
      for (int64_t r = 0; r < dp; ++r) s.sizes.push_back(split_size(n, dp, r));
    }
    auto zeros = [&] {
      return dtensor_from_local(Tensor::zeros(s.shard_shape(layout_.coord("dp")), DType::f32), mesh, s.shard, p->shape);
    };
    s.m = zeros();
    if (options_.kind == "adamw") s.v = zeros();
    slots_.push_back(std::move(s));
  }
  // Gradients are synced from the backward when a collective is owed for them (stages 0 to 2
  // over dp > 1, or a sum over cp or ep); the rest waits for step().
  if (stage <= 2) {
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (stage >= 1 && !slots_[i].split) continue;
      if (dp == 1 && slots_[i].sum_dims.empty()) continue;
      slots_[i].hooked = true;
      auto& meta = slots_[i].p->value.autograd_meta();
      meta.grad_ready_hooks.push_back([this, i](const Tensor&) { on_ready(i); });
    }
  }
  // Gradient bytes are charged as such from the moment a leaf holds them.
  for (Slot& s : slots_)
    s.p->value.autograd_meta().post_accumulate_hooks.push_back([](const Tensor& g) {
      if (g.defined()) local_piece(g).storage()->charge_as(MemoryKind::grads);
    });
}

namespace {

// `g` laid out as the optimizer reduces it: like `stored`, except a partial sum over dp when
// `over_dp` (the data-parallel sum is still owed), a partial sum over each of `sum_dims` (cp
// or ep: each rank there saw its own tokens; a gradient a rule left whole over it becomes a
// partial one locally, so one sum serves a whole bucket), and a partial sum over tp that the
// parameter is replicated over, which is summed later with the others. Sets `tp_partial` for
// the latter.
Tensor as_reduced(const Tensor& g, const Placements& stored, size_t dp_dim, size_t tp_dim, bool over_dp,
                  const std::vector<int64_t>& sum_dims, const ProcessMesh& mesh, bool& tp_partial) {
  Placements target = stored;
  if (over_dp) target[dp_dim] = Partial();
  for (int64_t d : sum_dims) target[static_cast<size_t>(d)] = Partial();
  const Placements& have = dist_attr(g).placements;
  tp_partial = have[tp_dim].is_partial() && target[tp_dim].is_replicate();
  if (tp_partial) target[tp_dim] = have[tp_dim];
  return have == target ? g : reshard(g, mesh, target);
}

// Records a copy of `t` the optimizer makes around its buckets (each element read and written
// once) in this rank's op trace: the planner charges a traced step's copies from there
// (plan::TracedStep::copy_bytes), as the runtime makes them.
void trace_copy(const Tensor& t, int times = 1) {
  if (tracing_ops()) trace_cost("bucket_copy", Cost{0, 2.0 * times * static_cast<double>(t.nbytes())});
}

// Copies `src` into `flat` at `at` (laid out contiguously with src's shape).
void pack(const Tensor& flat, int64_t at, const Tensor& src) {
  trace_copy(src);
  view::copy(view::reshape(view::slice(flat, 0, at, at + src.numel()), src.shape()), src);
}
// The piece of `flat` at `at` with `shape`.
Tensor unpack(const Tensor& flat, int64_t at, const Shape& shape) {
  return view::reshape(view::slice(flat, 0, at, at + shape_numel(shape)), shape);
}

}  // namespace

void ShardedOptimizer::on_ready(size_t i) {
  Slot& s = slots_[i];
  ++s.ready;
  // Stages 0 and 1 sum the micro-batches locally and reduce once; stage 2 reduces each.
  if (layout_.config().sharding_stage <= 1 && s.ready < layout_.config().micro_batches) return;
  enqueue(i);
}

void ShardedOptimizer::enqueue(size_t i) {
  Slot& s = slots_[i];
  Tensor g = s.p->value.grad();
  if (!g.defined()) return;
  s.p->value.set_grad(Tensor());  // the bucket holds it now
  enqueue_grad(i, std::move(g));
}

bool ShardedOptimizer::accept_gathered_grad(const nn::Parameter* p, const Tensor& grad) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].p != p) continue;
    if (!slots_[i].gathered) return false;
    if (!grad.defined()) return true;
    Slot& s = slots_[i];
    const size_t dp_dim = static_cast<size_t>(layout_.stage_dim("dp"));
    if (!dist_attr(grad).placements[dp_dim].is_partial()) {
      // Already whole over dp (an earlier op summed it): the shard is a slice, no collective.
      Tensor shard = reshard(grad, layout_.stage_mesh(), s.stored);
      if (s.grad.defined()) add_(local_piece(s.grad), local_piece(shard));
      else s.grad = shard;
      return true;
    }
    local_piece(grad).storage()->charge_as(MemoryKind::grads);
    enqueue_grad(i, grad);
    return true;
  }
  return false;
}

void ShardedOptimizer::enqueue_grad(size_t i, Tensor g) {
  Slot& s = slots_[i];
  ProfileScope profile_scope("(grad bucket)");
  // Stage 3's gradient is of the gathered weight: its placements are the stored ones with dp
  // replicated, still a partial sum over dp.
  Placements stored = s.stored;
  if (s.gathered) stored[static_cast<size_t>(layout_.stage_dim("dp"))] = Replicate();
  g = as_reduced(g, stored, static_cast<size_t>(layout_.stage_dim("dp")), static_cast<size_t>(layout_.stage_dim("tp")),
                 layout_.degree("dp") > 1, s.sum_dims, layout_.stage_mesh(), s.tp_partial);
  std::unique_ptr<Bucket>& filling = filling_[s.sum_dims];
  if (!filling) {
    filling = std::make_unique<Bucket>();
    filling->sum_dims = s.sum_dims;
  }
  filling->slots.push_back(i);
  filling->grads.push_back(local_piece(g));
  filling->bytes += local_piece(g).numel() * 4;
  if (filling->bytes >= options_.bucket_bytes) {
    Bucket b = std::move(*filling);
    filling.reset();
    launch(std::move(b));
  }
}

void ShardedOptimizer::launch(Bucket&& b) {
  // At most one bucket in flight over dp while the next is packed (and the one before it
  // summing over cp or ep): the full-size gradients alive are those of the buckets filling, the
  // one being packed and the ones on the wire.
  while (!sum_in_flight_.empty()) finish_oldest_sum();
  while (!in_flight_.empty()) finish_oldest();
  MemoryKindScope charge(MemoryKind::grads);
  const int64_t dp = layout_.degree("dp");
  auto group = layout_.group("dp");
  if (layout_.config().sharding_stage == 0) {
    int64_t total = 0;
    for (const Tensor& g : b.grads) {
      b.at.push_back({total});
      total += g.numel();
    }
    b.flat = Tensor::empty({total}, options_.reduce_dtype);
    for (size_t k = 0; k < b.grads.size(); ++k) pack(b.flat, b.at[k][0], b.grads[k]);
    b.grads.clear();
    if (dp > 1) {
      CommBuffers cb;
      b.work = cb.finish(group->all_reduce_async(cb.inout(b.flat), total, b.flat.dtype(), ReduceOp::sum));
    }
  } else {
    // Region r holds dp rank r's box of every gradient of the bucket, one after another.
    b.region.assign(static_cast<size_t>(dp), 0);
    for (size_t k = 0; k < b.slots.size(); ++k) {
      const Slot& s = slots_[b.slots[k]];
      b.at.emplace_back();
      for (int64_t r = 0; r < dp; ++r) {
        b.at[k].push_back(b.region[static_cast<size_t>(r)]);
        b.region[static_cast<size_t>(r)] += s.grad_box(b.grads[k], r).numel();
      }
    }
    int64_t total = 0;
    std::vector<int64_t> start;
    for (int64_t n : b.region) {
      start.push_back(total);
      total += n;
    }
    b.flat = Tensor::empty({total}, options_.reduce_dtype);
    for (size_t k = 0; k < b.slots.size(); ++k)
      for (int64_t r = 0; r < dp; ++r)
        pack(b.flat, start[static_cast<size_t>(r)] + b.at[k][static_cast<size_t>(r)],
             slots_[b.slots[k]].grad_box(b.grads[k], r));
    b.grads.clear();
    b.mine = Tensor::empty({b.region[static_cast<size_t>(layout_.coord("dp"))]}, options_.reduce_dtype);
    CommBuffers cb;
    b.work = cb.finish(
        group->reduce_scatter_v_async(cb.in(b.flat), cb.out(b.mine), b.region, b.flat.dtype(), ReduceOp::sum));
  }
  in_flight_.push_back(std::move(b));
}

void ShardedOptimizer::finish_oldest() {
  Bucket b = std::move(in_flight_.front());
  in_flight_.erase(in_flight_.begin());
  if (b.work) {
    ProfileScope profile_scope("(grad bucket wait)");
    timed("wait for gradient bucket", [&] { b.work->wait(); });
  }
  if (!b.sum_dims.empty()) {
    // What this rank holds after the dp collective (the whole bucket, or its reduce-scattered
    // part) is still a partial sum over cp and/or ep: summed over the first here, the next
    // once that is done.
    b.summing = 0;
    start_sum(b);
    sum_in_flight_.push_back(std::move(b));
    return;
  }
  unpack_bucket(b);
}

void ShardedOptimizer::start_sum(Bucket& b) {
  const Tensor& held = layout_.config().sharding_stage == 0 ? b.flat : b.mine;
  CommBuffers cb;
  b.sum_work = cb.finish(
      sum_groups_.at(b.sum_dims[b.summing])->all_reduce_async(cb.inout(held), held.numel(), held.dtype(), ReduceOp::sum));
}

void ShardedOptimizer::finish_oldest_sum() {
  Bucket& front = sum_in_flight_.front();
  {
    ProfileScope profile_scope("(grad bucket wait)");
    timed("wait for gradient bucket (cp/ep sum)", [&] { front.sum_work->wait(); });
  }
  if (++front.summing < front.sum_dims.size()) {  // the next dim's sum; the bucket stays first in line
    start_sum(front);
    return;
  }
  Bucket b = std::move(front);
  sum_in_flight_.erase(sum_in_flight_.begin());
  unpack_bucket(b);
}

// Each slot's reduced piece of a finished bucket, onto its gradient (stage 2's later
// micro-batches add to the first's).
void ShardedOptimizer::unpack_bucket(Bucket& b) {
  const ProcessMesh mesh = layout_.stage_mesh();
  const size_t me = static_cast<size_t>(layout_.coord("dp")), tp_dim = static_cast<size_t>(layout_.stage_dim("tp"));
  const bool stage0 = layout_.config().sharding_stage == 0;
  for (size_t k = 0; k < b.slots.size(); ++k) {
    Slot& s = slots_[b.slots[k]];
    const Shape shape = s.shard_shape(static_cast<int64_t>(me));
    Tensor piece = stage0 ? unpack(b.flat, b.at[k][0], shape) : unpack(b.mine, b.at[k][me], shape);
    if (piece.dtype() != DType::f32) piece = view::to_dtype(piece, DType::f32);  // a bf16 bucket, widened
    if (s.grad.defined()) {
      add_(local_piece(s.grad), piece);  // stage 2: this micro-batch's shard onto the earlier ones'
      continue;
    }
    Placements pl = s.shard;
    if (s.tp_partial) pl[tp_dim] = Partial();
    s.grad = wrap_dtensor(piece, DistAttr(mesh, pl), s.p->shape);
  }
}

double ShardedOptimizer::step(double lr, double max_norm) {
  ProfileScope profile_scope("optimizer.step");
  const int64_t stage = layout_.config().sharding_stage, dp = layout_.degree("dp");
  const ProcessMesh mesh = layout_.stage_mesh();
  const size_t dp_dim = static_cast<size_t>(layout_.stage_dim("dp")), tp_dim = static_cast<size_t>(layout_.stage_dim("tp"));
  const int64_t me = layout_.coord("dp");
  ++steps_;
  // 1. The rest of the backward's buckets, and gradients set without a backward's hooks.
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].hooked && slots_[i].p->value.grad().defined()) enqueue(i);
  for (auto& [dim, filling] : filling_) {
    if (!filling) continue;
    Bucket b = std::move(*filling);
    filling.reset();
    launch(std::move(b));
  }
  while (!in_flight_.empty()) finish_oldest();
  while (!sum_in_flight_.empty()) finish_oldest_sum();

  // 2. Gradients the hooks did not sync: a data-parallel sum still owed (dp > 1 at stage 0 with
  //    no hook, or a parameter stages 1 and 2 keep whole) goes in one all_reduce; stage 3's
  //    arrive as dp shards already; a parameter with no gradient counts zero.
  //    A gradient that owes a sum over cp or ep gets it in one more all_reduce per dim.
  std::vector<size_t> owe_dp;
  std::map<int64_t, std::vector<size_t>> owe_sum;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    TESSEL_CHECK(!(s.gathered && s.grad.defined() && s.p->value.grad().defined()),
                 "ZeRO-3: parameter '{}' got a gradient both through its unit's gather and outside it", s.p->name);
    if (s.grad.defined()) continue;
    const bool over_dp = dp > 1 && stage <= 2;
    Tensor g = s.p->value.grad();
    s.p->value.set_grad(Tensor());
    if (!g.defined()) {
      s.grad = dtensor_from_local(Tensor::zeros(s.shard_shape(me), DType::f32), mesh, s.shard, s.p->shape);
      continue;
    }
    g = as_reduced(g, s.stored, dp_dim, tp_dim, over_dp, s.sum_dims, mesh, s.tp_partial);
    s.grad = g;
    if (over_dp) owe_dp.push_back(i);
    for (int64_t d : s.sum_dims) owe_sum[d].push_back(i);
  }
  // One buffer for a group of gradients: each's local piece packed, summed over `group`, and
  // each replaced by its summed piece (placed as `placed(slot)`).
  auto sum_over = [&](const std::vector<size_t>& which, ProcessGroup& group, auto placed) {
    if (which.empty()) return;
    MemoryKindScope charge(MemoryKind::grads);
    int64_t total = 0;
    for (size_t i : which) total += local_piece(slots_[i].grad).numel();
    Tensor flat = Tensor::empty({total}, DType::f32);
    int64_t at = 0;
    for (size_t i : which) {
      pack(flat, at, local_piece(slots_[i].grad));
      at += local_piece(slots_[i].grad).numel();
    }
    timed("gradient sum", [&] {
      CommBuffers cb;
      cb.finish(group.all_reduce_async(cb.inout(flat), total, DType::f32, ReduceOp::sum))->wait();
    });
    at = 0;
    for (size_t i : which) {
      Slot& s = slots_[i];
      const Shape shape = local_piece(s.grad).shape();
      s.grad = wrap_dtensor(unpack(flat, at, shape), DistAttr(mesh, placed(s)), s.p->shape);
      at += shape_numel(shape);
    }
  };
  sum_over(owe_dp, *layout_.group("dp"), [&](const Slot& s) {
    Placements pl = dist_attr(s.grad).placements;
    pl[dp_dim] = s.stored[dp_dim];
    return pl;
  });
  for (const auto& owed : owe_sum) {
    const int64_t dim = owed.first;  // a named variable: clang 14 (the fuzz build) cannot capture a binding
    sum_over(owed.second, *sum_groups_.at(dim), [&](const Slot& s) {
      Placements pl = dist_attr(s.grad).placements;
      pl[static_cast<size_t>(dim)] = Replicate();
      return pl;
    });
  }
  // 3. Sums over tp of tp-replicated parameters (sequence parallel), and over the pipeline
  //    ranks sharing a tied parameter.
  std::vector<size_t> owe_tp, owe_tied;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].tp_partial) owe_tp.push_back(i);
    if (slots_[i].tied && tied_group_) owe_tied.push_back(i);
  }
  sum_over(owe_tp, *layout_.group("tp"), [&](const Slot& s) {
    Placements pl = dist_attr(s.grad).placements;
    pl[tp_dim] = Replicate();
    return pl;
  });
  for (size_t i : owe_tp) slots_[i].tp_partial = false;
  if (tied_group_) sum_over(owe_tied, *tied_group_, [&](const Slot& s) { return dist_attr(s.grad).placements; });

  // 4. The global norm. Count each element once: over dp, shards are disjoint and a whole
  //    piece counts on dp rank 0; over tp, replicated parameters count on tp rank 0; tied
  //    copies count once.
  double sum_sq = 0;
  for (const Slot& s : slots_) {
    bool counts = !(s.tied && !count_tied_);
    if (!s.shard[dp_dim].is_shard()) counts = counts && me == 0;
    // Likewise over every other mesh dim (tp, ep, cp): a piece replicated there counts on its rank 0.
    for (size_t m = 0; m < s.stored.size(); ++m)
      if (m != dp_dim && !s.stored[m].is_shard() && layout_.stage_mesh().coord(layout_.rank)[m] != 0) counts = false;
    if (!counts) continue;
    Tensor g = view::contiguous(local_piece(s.grad));
    sum_sq += optim::sum_squares(g);
  }
  timed("gradient norm", [&] { world_group()->all_reduce(&sum_sq, 1, DType::f64, ReduceOp::sum); });
  const double norm = std::sqrt(sum_sq);
  const float clip = optim::clip_coefficient(norm, max_norm);

  // 5. Update this rank's shard (the clip scales the gradient inside the update). Stages 1 and
  //    2 then all-gather every rank's updated shards back into every rank's piece, a bucket of
  //    parameters per collective: each bucket's gather is launched as soon as its parameters
  //    are updated and runs while the next bucket is updated.
  std::vector<size_t> split;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].split) split.push_back(i);
    else update(i, clip, lr);
  }
  struct Gather {
    size_t first, last;
    std::vector<int64_t> region, start;
    std::vector<std::vector<int64_t>> at;
    Tensor mine, all;
    WorkPtr work;
  };
  std::optional<Gather> in_flight;  // the previous bucket's gather
  auto finish_gather = [&](Gather& g) {
    timed("gather updated shards", [&] { g.work->wait(); });
    for (size_t k = g.first; k < g.last; ++k) {
      const Slot& s = slots_[split[k]];
      const Tensor piece = local_piece(s.p->value);
      for (int64_t r = 0; r < dp; ++r) {
        if (r == me) continue;
        const Tensor box = s.box(piece, r);
        trace_copy(box);
        view::copy(box, unpack(g.all, g.start[static_cast<size_t>(r)] + g.at[k - g.first][static_cast<size_t>(r)],
                               box.shape()));
      }
    }
  };
  for (size_t first = 0; first < split.size();) {
    Gather g;
    g.first = first;
    int64_t bytes = 0;
    g.last = first;
    while (g.last < split.size() && (g.last == first || bytes < options_.bucket_bytes))
      bytes += local_piece(slots_[split[g.last++]].p->value).numel() * 4;
    g.region.assign(static_cast<size_t>(dp), 0);
    for (size_t k = g.first; k < g.last; ++k) {
      const Slot& s = slots_[split[k]];
      update(split[k], clip, lr);
      g.at.emplace_back();
      for (int64_t r = 0; r < dp; ++r) {
        g.at.back().push_back(g.region[static_cast<size_t>(r)]);
        g.region[static_cast<size_t>(r)] += s.box(local_piece(s.p->value), r).numel();
      }
    }
    int64_t total = 0;
    for (int64_t n : g.region) {
      g.start.push_back(total);
      total += n;
    }
    g.mine = Tensor::empty({g.region[static_cast<size_t>(me)]}, DType::f32);
    g.all = Tensor::empty({total}, DType::f32);
    for (size_t k = g.first; k < g.last; ++k)
      pack(g.mine, g.at[k - g.first][static_cast<size_t>(me)], slots_[split[k]].box(local_piece(slots_[split[k]].p->value), me));
    CommBuffers cb;
    g.work = cb.finish(layout_.group("dp")->all_gather_v_async(cb.in(g.mine), cb.out(g.all), g.region, DType::f32));
    if (in_flight) finish_gather(*in_flight);  // at most two in flight
    first = g.last;
    in_flight = std::move(g);
  }
  if (in_flight) finish_gather(*in_flight);
  for (Slot& s : slots_) {
    s.grad = Tensor();
    s.ready = 0;
  }
  return norm;
}

void ShardedOptimizer::update(size_t i, float clip, double lr) {
  Slot& s = slots_[i];
  const Tensor piece = local_piece(s.p->value);
  TESSEL_ASSERT(piece.is_contiguous(), "parameter '{}': local piece is not contiguous", s.p->name);
  const Tensor target = s.box(piece, layout_.coord("dp"));
  // A box along an inner dim is strided: updated in a contiguous copy, then written back.
  const Tensor p = target.is_contiguous() ? target : view::contiguous(target);
  if (!target.is_contiguous()) trace_copy(target, 2);  // into p, and back after the update
  const Tensor g = view::contiguous(local_piece(s.grad));
  if (!local_piece(s.grad).is_contiguous()) trace_copy(g);
  TESSEL_ASSERT(g.shape() == p.shape(), "parameter '{}': gradient shard {} for parameter shard {}", s.p->name,
                shape_str(g.shape()), shape_str(p.shape()));
  if (tracing_ops()) {  // reads and writes the parameter and its states, reads the gradient
    const double states = options_.kind == "adamw" ? 2 : 1;
    trace_cost(options_.kind == "adamw" ? "adamw_update" : "sgd_update",
               Cost{10.0 * static_cast<double>(p.numel()), static_cast<double>(p.nbytes()) * (3 + 2 * states)});
  }
  if (p.is_meta()) return;  // tracing: no values to update
  if (options_.kind == "adamw") {
    optim::adamw_update(p, g, local_piece(s.m), local_piece(s.v), steps_, options_.adamw, lr, s.decay, clip);
  } else {
    const Tensor buf = local_piece(s.m);
    optim::sgd_update(p, g, &buf, steps_ == 1, options_.sgd, lr, clip);
  }
  if (!target.is_contiguous()) view::copy(target, p);
}

std::map<std::string, Tensor> ShardedOptimizer::state() const {
  std::map<std::string, Tensor> out;
  for (const Slot& s : slots_) {
    if (options_.kind == "adamw") {
      out[s.p->name + ".exp_avg"] = s.m;
      out[s.p->name + ".exp_avg_sq"] = s.v;
    } else {
      out[s.p->name + ".momentum_buffer"] = s.m;
    }
  }
  out["step"] = Tensor::scalar(static_cast<double>(steps_), DType::i64);
  return out;
}

void ShardedOptimizer::restore_steps(int64_t steps) {
  TESSEL_CHECK(steps >= 0, "shard_optimizer: step count {} is negative", steps);
  steps_ = steps;
}

Placements ShardedOptimizer::shard_placements(const std::string& param) const {
  for (const Slot& s : slots_)
    if (s.p->name == param) return s.shard;
  TESSEL_THROW("shard_optimizer: no parameter '{}'", param);
}

}  // namespace tessel::parallel
