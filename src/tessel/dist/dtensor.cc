// Distributed tensor construction, conversion and resharding (all differentiable).
#include "tessel/dist/dtensor.h"

#include <map>
#include <mutex>

#include "tessel/autograd/function.h"
#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/core/view.h"
#include "tessel/dist/dispatch.h"
#include "tessel/dist/mesh_comm.h"
#include "tessel/dist/reshard.h"
#include "tessel/sharding/spmd.h"

namespace tessel {

namespace {

const DistSpec& spec(const Tensor& t) {
  TESSEL_CHECK(is_dist(t), "tensor {} is not distributed", t.str());
  return *t.impl_ptr()->dist;
}

// The placement a gradient takes: Partial inputs receive whole (replicated) gradients.
Placements dual(const Placements& p) {
  Placements out = p;
  for (Placement& x : out)
    if (x.is_partial()) x = Replicate();
  return out;
}

// The value a replicated tensor holds as a Partial piece on this rank.
Tensor as_partial_piece(const Tensor& x, const Placement& p, int64_t coord) {
  if (p.reduce == ReduceOp::sum && coord != 0) return Tensor::zeros(x.shape(), x.dtype());
  return x;
}

Tensor piece_of(const Tensor& full, const DistAttr& attr, int64_t rank) {
  if (!attr.mesh.contains(rank)) return Tensor::zeros(Shape(full.dim(), 0), full.dtype());
  Shape off = attr.local_offset(full.shape(), rank), shape = attr.local_shape(full.shape(), rank);
  Tensor x = full;
  for (int64_t d = 0; d < full.dim(); ++d) x = view::slice(x, d, off[static_cast<size_t>(d)], off[static_cast<size_t>(d)] + shape[static_cast<size_t>(d)]);
  x = view::clone(x);
  std::vector<int64_t> c = attr.mesh.coord(rank);
  for (size_t m = 0; m < attr.placements.size(); ++m)
    if (attr.placements[m].is_partial()) x = as_partial_piece(x, attr.placements[m], c[m]);
  return x;
}

const ReshardPlan& cached_plan(const DistAttr& src, const DistAttr& dst, const Shape& shape, DType dtype) {
  static std::mutex mutex;
  static auto* plans = new std::map<std::string, ReshardPlan>();
  std::string key = fmt::format("{}|{}|{}|{}", src.str(), dst.str(), shape_str(shape), dtype);
  std::lock_guard lock(mutex);
  auto it = plans->find(key);
  if (it == plans->end()) it = plans->emplace(key, plan_reshard(src, dst, shape, dtype)).first;
  return it->second;
}

}  // namespace

bool is_dist(const Tensor& t) { return t.defined() && t.impl_ptr()->dist != nullptr; }

const DistAttr& dist_attr(const Tensor& t) { return spec(t).attr; }

Tensor wrap_dtensor(Tensor local, const DistAttr& attr, const Shape& global_shape) {
  install_dist_dispatch();
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = global_shape;
  impl->strides = contiguous_strides(global_shape);
  impl->dtype = local.dtype();
  if (local.impl_use_count() != 1 || local.impl_ptr()->autograd) local = local.detach();
  impl->dist = std::make_shared<const DistSpec>(DistSpec{attr, std::move(local)});
  return Tensor(std::move(impl));
}

const Tensor& local_piece(const Tensor& t) { return spec(t).local; }

Tensor to_local(const Tensor& t) { return to_local(t, dual(spec(t).attr.placements)); }

Tensor to_local(const Tensor& t, const Placements& grad_placements) {
  const DistSpec& s = spec(t);
  Tensor out = s.local.detach();
  DistAttr grad_attr(s.attr.mesh, grad_placements);
  Shape global = t.shape();
  record_function("to_local", {t}, {out}, [grad_attr, global](std::vector<Tensor>&& g) {
    return std::vector<Tensor>{g[0].defined() ? wrap_dtensor(g[0], grad_attr, global) : Tensor()};
  });
  return out;
}

Tensor shard_tensor(const Tensor& full, const ProcessMesh& mesh, const Placements& placements) {
  TESSEL_CHECK(!is_dist(full), "shard_tensor: the input is already distributed ({}); use reshard", full.str());
  DistAttr attr(mesh, placements);
  attr.check(full.shape(), "shard_tensor");
  Tensor out = wrap_dtensor(piece_of(full, attr, current_world_rank()), attr, full.shape());
  record_function("shard_tensor", {full}, {out}, [](std::vector<Tensor>&& g) {
    return std::vector<Tensor>{g[0].defined() ? full_tensor(g[0]) : Tensor()};
  });
  return out;
}

Tensor dtensor_from_local(const Tensor& local, const ProcessMesh& mesh, const Placements& placements, Shape global_shape) {
  TESSEL_CHECK(!is_dist(local), "dtensor_from_local: the input is already distributed ({})", local.str());
  DistAttr attr(mesh, placements);
  int64_t rank = current_world_rank();
  if (global_shape.empty()) {
    global_shape = local.shape();
    for (size_t m = 0; m < placements.size(); ++m)
      if (placements[m].is_shard()) {
        TESSEL_CHECK(placements[m].dim < local.dim(), "dtensor_from_local: placement {} for a local piece of {} dims",
                     placements[m].str(), local.dim());
        global_shape[static_cast<size_t>(placements[m].dim)] *= mesh.dim_size(static_cast<int64_t>(m));
      }
  }
  attr.check(global_shape, "dtensor_from_local");
  if (mesh.contains(rank)) {
    Shape want = attr.local_shape(global_shape, rank);
    TESSEL_CHECK(local.shape() == want,
                 "dtensor_from_local: rank {} holds a piece of shape {} but {} of global shape {} gives it {}", rank,
                 shape_str(local.shape()), attr.str(), shape_str(global_shape), shape_str(want));
  }
  Tensor out = wrap_dtensor(local, attr, global_shape);
  DistAttr grad_attr(mesh, dual(placements));
  record_function("dtensor_from_local", {local}, {out}, [grad_attr](std::vector<Tensor>&& g) {
    if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
    Tensor r = reshard(g[0], grad_attr.mesh, grad_attr.placements);
    return std::vector<Tensor>{spec(r).local};
  });
  return out;
}

Tensor make_dtensor(const Shape& global_shape, DType dtype, const ProcessMesh& mesh, const Placements& placements,
                    const std::function<void(const Tensor& local, const GlobalBox& box)>& fill) {
  DistAttr attr(mesh, placements);
  attr.check(global_shape, "make_dtensor");
  for (const Placement& p : placements)
    TESSEL_CHECK(!p.is_partial(), "make_dtensor: placement {} is Partial; create replicated or sharded tensors", p.str());
  int64_t rank = current_world_rank();
  Tensor local = Tensor::empty(attr.local_shape(global_shape, rank), dtype);
  if (mesh.contains(rank)) fill(local, GlobalBox{global_shape, attr.local_offset(global_shape, rank)});
  return wrap_dtensor(local, attr, global_shape);
}

Tensor reshard(const Tensor& t, const ProcessMesh& mesh, const Placements& placements) {
  const DistSpec& s = spec(t);
  DistAttr dst(mesh, placements);
  if (s.attr == dst) return t;
  const ReshardPlan& plan = cached_plan(s.attr, dst, t.shape(), t.dtype());
  Tensor out = wrap_dtensor(run_reshard(s.local, plan), dst, t.shape());
  // Resharding is the identity on the global value, so on one mesh the gradient passes through
  // in whatever layout it has (communication waits until someone needs a layout); across meshes
  // it goes back to the source mesh.
  DistAttr src = s.attr;
  record_function("reshard", {t}, {out}, [src](std::vector<Tensor>&& g) {
    if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
    if (dist_attr(g[0]).mesh == src.mesh) return std::vector<Tensor>{g[0]};
    return std::vector<Tensor>{reshard(g[0], src.mesh, dual(src.placements))};
  });
  return out;
}

Tensor reshard_for_op(const Tensor& t, const Placements& placements) {
  const DistSpec& s = spec(t);
  if (s.attr.placements == placements) return t;
  const bool remember = grad_enabled() && t.requires_grad() && !t.is_leaf();
  if (!remember) return reshard(t, s.attr.mesh, placements);
  for (const auto& [p, moved] : s.reshards)
    if (p == placements) return moved;
  Tensor out = reshard(t, s.attr.mesh, placements);
  s.reshards.emplace_back(placements, out);
  return out;
}

Tensor full_tensor(const Tensor& t) {
  const DistAttr& a = dist_attr(t);
  return to_local(reshard(t, a.mesh, Placements(static_cast<size_t>(a.mesh.ndim()), Replicate())));
}

}  // namespace tessel
