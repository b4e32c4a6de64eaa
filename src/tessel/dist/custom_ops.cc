// Custom distributed implementations (custom_ops.h).
//
// cross_entropy over logits [..., C] and integer targets [...], with the rows (leading dims)
// split over some mesh dims ("row dims": logits and targets sharded alike) and the classes
// over others ("class dims": vocab-parallel, as in Megatron; targets replicated there). A rank
// holds x[R, Cl] — its R rows, classes [c0, c0 + Cl) — and the targets t[R] of those rows:
//   m[r]  = max over class dims of max_c x[r, c]                               all_reduce(max)
//   s[r]  = Σ over class dims of Σ_c exp(x[r, c] - m[r]),  lse[r] = m[r] + log s[r]
//   xt[r] = Σ over class dims of x[r, t[r] - c0] from the rank owning t[r]    (one all_reduce)
//   loss  = Σ over row dims of Σ_{r not ignored} (lse[r] - xt[r]), divided for mean by the
//           global count of non-ignored targets                                all_reduce(sum)
//   dx[r, c] = (exp(x[r, c] - lse[r]) - [c0 + c == t[r]]) · g / count (g for sum); 0 for
//           ignored rows.
// Ranks along a class or replicated mesh dim hold the same rows, so only row dims add up losses
// and counts. Every rank of the mesh takes part in every collective whatever its piece: empty
// class pieces reduce as -inf and 0 (a group without rows skips its row statistics, all its
// members alike). A target outside [0, C) is counted across the row dims, so every
// rank throws together rather than leaving the others waiting. The loss is a replicated scalar;
// the logits' gradient has the placements the rule gave the logits (no Partial).
#include "tessel/dist/custom_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <type_traits>

#include "tessel/autograd/function.h"
#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/core/thread_pool.h"
#include "tessel/core/view.h"
#include "tessel/dist/dispatch.h"
#include "tessel/dist/dtensor.h"
#include "tessel/dist/kernels/cross_entropy.h"
#include "tessel/dist/mesh_comm.h"
#include "tessel/dist/ring_attention.h"
#include "tessel/ops/dispatch.h"
#include "tessel/ops/fast_math.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ops/ops.h"
#include "tessel/ops/trace.h"
#include "tessel/sharding/spmd.h"

namespace tessel {

namespace {

// ---------------------------------------------------------------- cross_entropy

// One call's pieces and statistics, kept for the backward.
struct CrossEntropyState {
  ProcessMesh mesh;
  DistAttr logits_attr;
  Shape global;                  // the logits' global shape
  Tensor x;                      // local logits, contiguous, viewed as [R, Cl]
  std::vector<int64_t> targets;  // local targets [R]
  std::vector<double> lse;       // [R]
  DType dtype = DType::f32;
  int64_t R = 0, Cl = 0, c0 = 0, ignore = -100;
  double count = 0;  // global non-ignored targets
  bool mean = true;
};

// Fills st.lse and returns the loss (sum or mean over every rank's rows).
template <typename T>
double cross_entropy_forward(CrossEntropyState& st, const std::vector<int64_t>& class_dims,
                             const std::vector<int64_t>& row_dims, int64_t C) {
  const int64_t R = st.R;
  const bool meta = st.x.is_meta();  // tracing: the same collectives, no arithmetic
  // The members of a class dim's group hold the same rows, so they skip its reductions together
  // when there are none.
  const std::vector<int64_t> reduce_dims = R > 0 ? class_dims : std::vector<int64_t>{};
  std::vector<T> m(static_cast<size_t>(R), -std::numeric_limits<T>::infinity());
  std::vector<T> sx(static_cast<size_t>(2 * R), T(0));  // s[R] then xt[R]
  if (!meta) kernels::ce_row_max<T>(st.x, m);
  for (int64_t d : reduce_dims) mesh_dim_group(st.mesh, d)->all_reduce(m.data(), R, dtype_of<T>, ReduceOp::max);
  if (!meta) kernels::ce_row_sums<T>(st.x, m, st.targets, st.c0, st.ignore, sx);
  for (int64_t d : reduce_dims) mesh_dim_group(st.mesh, d)->all_reduce(sx.data(), 2 * R, dtype_of<T>, ReduceOp::sum);
  st.lse.assign(static_cast<size_t>(R), 0.0);
  double acc[3] = {0, 0, 0};  // loss sum, non-ignored count, targets out of range
  int64_t bad_here = 0, bad_target = 0;  // this rank's count and first
  for (int64_t r = 0; r < R && !meta; ++r) {
    const T lse = m[r] + std::log(sx[r]);
    st.lse[r] = static_cast<double>(lse);
    const int64_t t = st.targets[r];
    if (t == st.ignore) continue;
    if (t < 0 || t >= C) {
      if (bad_here++ == 0) bad_target = t;
      acc[2] += 1;
      continue;
    }
    acc[0] += static_cast<double>(lse - sx[R + r]);
    acc[1] += 1;
  }
  for (int64_t d : row_dims) mesh_dim_group(st.mesh, d)->all_reduce(acc, 3, DType::f64, ReduceOp::sum);
  TESSEL_CHECK(acc[2] == 0, "cross_entropy: targets outside [0, {}) for C={} classes (ignore_index {}): {} over the "
               "ranks{}", C, C, st.ignore, acc[2],
               bad_here > 0 ? fmt::format("; this rank's first: target {}", bad_target) : std::string());
  st.count = acc[1];
  return st.mean ? acc[0] / acc[1] : acc[0];  // mean of none: NaN, as serially
}

// dx[R, Cl] for the loss gradient g.
template <typename T>
Tensor cross_entropy_backward(const CrossEntropyState& st, double g) {
  const T scale = static_cast<T>(st.mean ? g / std::max(st.count, 1.0) : g);
  if (tracing_ops())
    trace_cost("cross_entropy", Cost{3.0 * static_cast<double>(st.x.numel()), 2.0 * static_cast<double>(st.x.nbytes())}, true);
  if (st.x.is_meta()) return Tensor::empty(st.x.shape(), st.x.dtype());
  return kernels::ce_backward<T>(st.x, st.lse, st.targets, st.c0, st.ignore, scale);
}

// The loss gradient as a number on this rank (replicated first when it is distributed).
double scalar_grad(const Tensor& g, const ProcessMesh& mesh) {
  if (!is_dist(g)) return g.item();
  Tensor r = reshard(g, mesh, Placements(static_cast<size_t>(mesh.ndim()), Replicate()));
  return local_piece(r).item();
}

std::vector<Tensor> dist_cross_entropy(const OpDef& op, std::vector<Tensor>& inputs, const Attrs& attrs,
                                       const SpmdDecision& dec) {
  {
    std::vector<TensorMeta> metas{inputs[0].meta(), inputs[1].meta()};
    infer_op(op, metas, attrs);  // shapes, dtypes and attrs: every rank throws alike
  }
  auto st = std::make_shared<CrossEntropyState>();
  st->mesh = dist_attr(inputs[0]).mesh;
  for (size_t i = 0; i < 2; ++i)
    if (dist_attr(inputs[i]).placements != dec.inputs[i]) inputs[i] = reshard(inputs[i], st->mesh, dec.inputs[i]);
  const Tensor& logits = inputs[0];
  st->logits_attr = dist_attr(logits);
  st->global = logits.shape();
  st->ignore = attrs.i("ignore_index");
  st->mean = attrs.s("reduction") == "mean";
  const int64_t last = logits.dim() - 1, C = logits.size(-1);
  const DType dtype = logits.dtype();
  st->dtype = dtype;
  const Placements all_r(static_cast<size_t>(st->mesh.ndim()), Replicate());
  const int64_t rank = current_world_rank();

  Tensor loss;
  if (!st->mesh.contains(rank)) {
    loss = wrap_dtensor(Tensor::zeros({}, dtype), DistAttr(st->mesh, all_r), {});
  } else {
    std::vector<int64_t> class_dims, row_dims;
    for (int64_t d = 0; d < st->mesh.ndim(); ++d) {
      if (dec.inputs[0][static_cast<size_t>(d)].is_shard(last)) class_dims.push_back(d);
      else if (dec.inputs[1][static_cast<size_t>(d)].is_shard()) row_dims.push_back(d);
    }
    st->x = view::contiguous(local_piece(logits));
    st->Cl = st->x.size(-1);
    st->c0 = st->logits_attr.local_offset(st->global, rank)[static_cast<size_t>(last)];
    Tensor t = view::contiguous(local_piece(inputs[1]));
    st->R = t.numel();
    st->targets.resize(static_cast<size_t>(st->R));
    if (tracing_ops()) {
      std::vector<TensorMeta> local{st->x.meta(), t.meta()};
      trace_cost(op.name, op_cost(op, local, attrs));
    }
    if (!t.is_meta()) st->targets = t.to_vector<int64_t>();  // host control: which class each row wants
    const double value = TESSEL_DISPATCH_FLOAT(dtype, "cross_entropy", [&]<typename T>() {
      return cross_entropy_forward<T>(*st, class_dims, row_dims, C);
    });
    loss = wrap_dtensor(Tensor::scalar(value, dtype), DistAttr(st->mesh, all_r), {});
  }
  record_function("cross_entropy (distributed)", {logits}, {loss}, [st](std::vector<Tensor>&& g) {
    if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
    Tensor dx;
    if (!st->mesh.contains(current_world_rank())) {
      dx = Tensor::zeros(Shape(st->global.size(), 0), st->dtype);  // outside the mesh: an empty piece
    } else {
      const double gv = scalar_grad(g[0], st->mesh);
      dx = TESSEL_DISPATCH_FLOAT(st->x.dtype(), "cross_entropy",
                                 [&]<typename T>() { return cross_entropy_backward<T>(*st, gv); });
    }
    return std::vector<Tensor>{wrap_dtensor(dx, st->logits_attr, st->global)};
  });
  return {loss};
}

// ---------------------------------------------------------------- max over a sharded dim
//
// max(x, dims) with a reduced dim sharded over some mesh dims ("select dims"): each rank
// reduces its piece, and the output is Partial(max) there — the reduction of the (small)
// output is left to whoever needs it, instead of gathering the (large) input first. The
// gradient must reach only the selected element, the first maximum in the global order: the
// backward finds, per output element, the value all ranks agree is the maximum (all_reduce
// max of the saved local maxima) and, among the ranks holding it, the one whose element comes
// first in the global order (all_reduce min of the global flat index along the reduced dims);
// only that rank routes the gradient to its local argmax. Two all_reduces of the output's size
// in the backward, none of the input's.

struct MaxState {
  ProcessMesh mesh;
  DistAttr in_attr;
  Shape global;
  std::vector<int64_t> dims;     // reduced dims (normalised)
  std::vector<int64_t> select;   // mesh dims sharding a reduced dim
  Tensor values, index;          // local maxima and their positions in the local reduced block
  TensorMeta local_meta;
  Placements out_dual;           // the output's placements with Partial(max) -> R: the gradient's
  Attrs attrs;
  bool smallest = false;         // min: Partial(min), the first minimum
};

std::vector<Tensor> dist_max(const OpDef& op, std::vector<Tensor>& inputs, const Attrs& attrs, const SpmdDecision& dec) {
  auto st = std::make_shared<MaxState>();
  st->mesh = dist_attr(inputs[0]).mesh;
  if (dist_attr(inputs[0]).placements != dec.inputs[0]) inputs[0] = reshard(inputs[0], st->mesh, dec.inputs[0]);
  const Tensor& x = inputs[0];
  st->in_attr = dist_attr(x);
  st->global = x.shape();
  st->dims = normalize_dims(attrs.ints("dims"), x.dim(), "max");
  st->smallest = op.name == "min";
  st->attrs = attrs;
  for (int64_t m = 0; m < st->mesh.ndim(); ++m) {
    const Placement& p = dec.inputs[0][static_cast<size_t>(m)];
    if (p.is_shard() && std::binary_search(st->dims.begin(), st->dims.end(), p.dim)) st->select.push_back(m);
  }
  const std::vector<TensorMeta> in_meta{x.meta()};
  std::vector<TensorMeta> metas = infer_op(op, in_meta, attrs);
  for (const Placement& p : dec.outputs[0]) st->out_dual.push_back(p.is_partial() ? Replicate() : p);
  const int64_t rank = current_world_rank();
  Tensor local = local_piece(x);
  st->local_meta = local.meta();
  Tensor out_local;
  int64_t reduced_local = 1;
  for (int64_t d : st->dims) reduced_local *= local.size(d);
  const Shape local_out = DistAttr(st->mesh, dec.outputs[0]).local_shape(metas[0].shape, rank);
  if (st->mesh.contains(rank) && reduced_local == 0) {
    // An empty piece of the reduced dims (more ranks than elements): it holds no candidate.
    st->values = Tensor::full(local_out, (st->smallest ? 1 : -1) * std::numeric_limits<double>::infinity(),
                              metas[0].dtype);
    st->index = Tensor::zeros({shape_numel(local_out)}, DType::i64);
    out_local = st->values;
  } else if (st->mesh.contains(rank)) {
    GradModeGuard no_grad(false);
    const std::vector<Tensor> in_local{local};
    std::vector<Tensor> outs = run_kernel(op, in_local, attrs);
    st->values = outs[0];
    st->index = outs[1];
    out_local = outs[0];
  } else {
    out_local = Tensor::zeros(Shape(metas[0].shape.size(), 0), metas[0].dtype);
  }
  Tensor out = wrap_dtensor(out_local, DistAttr(st->mesh, dec.outputs[0]), metas[0].shape);
  record_function("max (distributed)", {x}, {out}, [st, &op, reduced_local](std::vector<Tensor>&& g) {
    if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
    const int64_t me = current_world_rank();
    if (!st->mesh.contains(me))
      return std::vector<Tensor>{wrap_dtensor(Tensor::zeros(Shape(st->global.size(), 0), st->local_meta.dtype), st->in_attr,
                                              st->global)};
    Tensor gd = g[0];
    if (dist_attr(gd).placements != st->out_dual) gd = reshard(gd, st->mesh, st->out_dual);
    Tensor go = view::contiguous(local_piece(gd));
    const int64_t n = st->values.numel();
    // The winner per output element: the global maximum, then the first global position.
    std::vector<double> best(static_cast<size_t>(n)), first(static_cast<size_t>(n));
    const Shape local_shape = st->local_meta.shape;
    const Shape offset = st->in_attr.local_offset(st->global, me);
    // The selection is host control flow on host copies of the (output-sized) maxima.
    const std::vector<int64_t> pi = st->index.to_vector<int64_t>();
    const std::vector<double> pv = view::contiguous(st->values).to_doubles();
    for (int64_t o = 0; o < n; ++o) best[o] = pv[o];
    for (int64_t d : st->select)
      mesh_dim_group(st->mesh, d)->all_reduce(best.data(), n, DType::f64, st->smallest ? ReduceOp::min : ReduceOp::max);
    for (int64_t o = 0; o < n; ++o) {
      if (reduced_local == 0 || pv[o] != best[o]) {
        first[o] = std::numeric_limits<double>::infinity();
        continue;
      }
      // The local position (row-major over the local reduced dims) to a global one.
      int64_t rem = pi[o];
      double global = 0, stride = 1;
      for (size_t j = st->dims.size(); j-- > 0;) {
        const size_t d = static_cast<size_t>(st->dims[j]);
        const int64_t coord = rem % local_shape[d] + offset[d];
        rem /= local_shape[d];
        global += static_cast<double>(coord) * stride;
        stride *= static_cast<double>(st->global[d]);
      }
      first[o] = global;
    }
    std::vector<double> mine = first;
    for (int64_t d : st->select) mesh_dim_group(st->mesh, d)->all_reduce(first.data(), n, DType::f64, ReduceOp::min);
    // The gradient stays where this rank holds the winner, 0 elsewhere.
    std::vector<double> wins(static_cast<size_t>(n));
    for (int64_t o = 0; o < n; ++o) wins[o] = mine[o] == first[o] ? 1.0 : 0.0;
    DeviceScope on(go.device());
    const Tensor keep = ne(Tensor::from_vector(wins, go.shape()), Tensor::scalar(0.0, DType::f64));
    Tensor masked = where(keep, go, Tensor::zeros(go.shape(), go.dtype()));
    if (reduced_local == 0)
      return std::vector<Tensor>{wrap_dtensor(Tensor::zeros(local_shape, masked.dtype()), st->in_attr, st->global)};
    std::vector<Tensor> ins{Tensor()}, outs{st->values, st->index}, grads{masked};
    std::vector<TensorMeta> in_metas{st->local_meta};
    std::vector<bool> needs{true};
    GradCall call{op, st->attrs, ins, outs, in_metas, grads, needs};
    std::vector<Tensor> dx = op.backward(call);
    return std::vector<Tensor>{wrap_dtensor(dx[0], st->in_attr, st->global)};
  });
  return {out};
}

// ---------------------------------------------------------------- argmax over a sharded dim
//
// Each rank takes its piece's top-1 along the dim (value and global position); the candidates
// merge over the mesh dims sharding the dim: the maximum value (all_reduce max), then the
// first global position holding it (all_reduce min) — two all_reduces of the output's size
// instead of gathering the input. The index output is replicated there. (NaN inputs are not
// ordered across ranks.)
std::vector<Tensor> dist_argmax(const OpDef& op, std::vector<Tensor>& inputs, const Attrs& attrs, const SpmdDecision& dec) {
  const ProcessMesh mesh = dist_attr(inputs[0]).mesh;
  if (dist_attr(inputs[0]).placements != dec.inputs[0]) inputs[0] = reshard(inputs[0], mesh, dec.inputs[0]);
  const Tensor& x = inputs[0];
  const int64_t d = normalize_dim(attrs.i("dim"), x.dim(), "argmax");
  std::vector<int64_t> select;
  for (int64_t m = 0; m < mesh.ndim(); ++m)
    if (dec.inputs[0][static_cast<size_t>(m)].is_shard(d)) select.push_back(m);
  Placements out_p;
  for (const Placement& p : dec.outputs[0]) out_p.push_back(p.is_partial() ? Replicate() : p);
  const std::vector<TensorMeta> in_meta{x.meta()};
  const TensorMeta out_meta = infer_op(op, in_meta, attrs)[0];
  const int64_t rank = current_world_rank();
  if (!mesh.contains(rank))
    return {wrap_dtensor(Tensor::zeros(Shape(out_meta.shape.size(), 0), DType::i64), DistAttr(mesh, out_p), out_meta.shape)};
  const Tensor local = view::contiguous(local_piece(x));
  const int64_t L = local.size(d), offset = DistAttr(mesh, dec.inputs[0]).local_offset(x.shape(), rank)[static_cast<size_t>(d)];
  const Shape out_local = DistAttr(mesh, out_p).local_shape(out_meta.shape, rank);
  const int64_t n = shape_numel(out_local);
  std::vector<double> best(static_cast<size_t>(n), -std::numeric_limits<double>::infinity());
  std::vector<double> first(static_cast<size_t>(n), std::numeric_limits<double>::infinity());
  if (L > 0) {
    GradModeGuard no_grad(false);
    const std::vector<Tensor> in_local{local};
    // Host control on host copies: the local argmax and the values there.
    const std::vector<int64_t> pi = run_kernel(op, in_local, attrs)[0].to_vector<int64_t>();
    const std::vector<double> px = local.to_doubles();
    int64_t inner = 1;
    for (int64_t j = d + 1; j < local.dim(); ++j) inner *= local.size(j);
    for (int64_t o = 0; o < n; ++o) {
      const int64_t outer = o / inner, i = o % inner;
      best[o] = px[static_cast<size_t>((outer * L + pi[o]) * inner + i)];
      first[o] = static_cast<double>(pi[o] + offset);
    }
  }
  std::vector<double> mine = best;
  for (int64_t m : select) mesh_dim_group(mesh, m)->all_reduce(best.data(), n, DType::f64, ReduceOp::max);
  for (int64_t o = 0; o < n; ++o)
    if (mine[o] != best[o]) first[o] = std::numeric_limits<double>::infinity();
  for (int64_t m : select) mesh_dim_group(mesh, m)->all_reduce(first.data(), n, DType::f64, ReduceOp::min);
  std::vector<int64_t> po(static_cast<size_t>(n));
  for (int64_t o = 0; o < n; ++o) po[o] = static_cast<int64_t>(first[o]);
  DeviceScope on(local.device());
  return {wrap_dtensor(Tensor::from_vector(po, out_local), DistAttr(mesh, out_p), out_meta.shape)};
}

// ---------------------------------------------------------------- topk over a sharded dim
//
// Each rank takes its piece's top k along the dim (values and global positions); the
// candidates are gathered over each mesh dim sharding the dim (k per output row from every rank
// of the group, all_gather) and merged — the k best by value, ties to the first global position,
// as the one-rank kernel orders them. Both outputs are then replicated there. The gradient of
// an output element reaches only the rank whose piece holds its global position. The input is
// never gathered: the traffic is k candidates per row per rank.

struct TopkState {
  ProcessMesh mesh;
  DistAttr in_attr;
  Shape global, local_shape;
  DType dtype;
  int64_t dim = 0, k = 0, offset = 0, rows_outer = 0, inner = 0;
  Placements out_p;
  std::vector<int64_t> index;  // the merged global positions, [outer, k, inner] like the output
};

std::vector<Tensor> dist_topk(const OpDef& op, std::vector<Tensor>& inputs, const Attrs& attrs, const SpmdDecision& dec) {
  auto st = std::make_shared<TopkState>();
  st->mesh = dist_attr(inputs[0]).mesh;
  if (dist_attr(inputs[0]).placements != dec.inputs[0]) inputs[0] = reshard(inputs[0], st->mesh, dec.inputs[0]);
  const Tensor& x = inputs[0];
  st->in_attr = dist_attr(x);
  st->global = x.shape();
  st->dtype = x.dtype();
  const int64_t d = st->dim = normalize_dim(attrs.i("dim"), x.dim(), "topk");
  const int64_t k = st->k = attrs.i("k");
  const bool largest = attrs.b("largest");
  std::vector<int64_t> select;
  for (int64_t m = 0; m < st->mesh.ndim(); ++m)
    if (dec.inputs[0][static_cast<size_t>(m)].is_shard(d)) select.push_back(m);
  for (const Placement& p : dec.outputs[0]) st->out_p.push_back(p.is_partial() ? Replicate() : p);
  const std::vector<TensorMeta> in_meta{x.meta()};
  const std::vector<TensorMeta> metas = infer_op(op, in_meta, attrs);
  const int64_t rank = current_world_rank();
  const DistAttr out_attr(st->mesh, st->out_p);
  if (!st->mesh.contains(rank)) {
    const Shape none(metas[0].shape.size(), 0);
    return {wrap_dtensor(Tensor::zeros(none, metas[0].dtype), out_attr, metas[0].shape),
            wrap_dtensor(Tensor::zeros(none, DType::i64), out_attr, metas[1].shape)};
  }
  const Tensor local = view::contiguous(local_piece(x));
  st->local_shape = local.shape();
  const int64_t L = local.size(d);
  st->offset = st->in_attr.local_offset(st->global, rank)[static_cast<size_t>(d)];
  const Shape out_local = out_attr.local_shape(metas[0].shape, rank);
  st->inner = 1;
  for (int64_t j = d + 1; j < local.dim(); ++j) st->inner *= local.size(j);
  st->rows_outer = shape_numel(out_local) / std::max<int64_t>(k * st->inner, 1);
  const int64_t rows = st->rows_outer * st->inner;
  // Candidates per row: k (value, global position) pairs, padded past the piece with the worst
  // value and an impossible position.
  const double worst = largest ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  std::vector<double> value(static_cast<size_t>(rows * k), worst), pos(static_cast<size_t>(rows * k),
                                                                      std::numeric_limits<double>::infinity());
  const int64_t mine = std::min(k, L);
  if (mine > 0) {
    GradModeGuard no_grad(false);
    Attrs local_attrs = attrs;
    local_attrs.set("k", mine);
    const std::vector<Tensor> in_local{local};
    const std::vector<Tensor> outs = run_kernel(op, in_local, local_attrs);
    // Host copies of the (k-sized) candidates.
    const std::vector<double> pv = outs[0].to_doubles();
    const std::vector<int64_t> pi = outs[1].to_vector<int64_t>();
    for (int64_t o = 0; o < st->rows_outer; ++o)
      for (int64_t j = 0; j < mine; ++j)
        for (int64_t i = 0; i < st->inner; ++i) {
          const int64_t src = (o * mine + j) * st->inner + i, row = o * st->inner + i;
          value[static_cast<size_t>(row * k + j)] = pv[static_cast<size_t>(src)];
          pos[static_cast<size_t>(row * k + j)] = static_cast<double>(pi[static_cast<size_t>(src)] + st->offset);
        }
  }
  // Merge over each mesh dim sharding the dim: gather every rank's k per row, keep the best k.
  for (int64_t m : select) {
    auto group = mesh_dim_group(st->mesh, m);
    const int64_t g = group->size(), n = rows * k;
    std::vector<double> all_v(static_cast<size_t>(g * n)), all_p(static_cast<size_t>(g * n));
    group->all_gather(value.data(), all_v.data(), n, DType::f64);
    group->all_gather(pos.data(), all_p.data(), n, DType::f64);
    std::vector<int64_t> order(static_cast<size_t>(g * k));
    for (int64_t row = 0; row < rows; ++row) {
      auto at = [&](int64_t c, const std::vector<double>& a) {
        return a[static_cast<size_t>((c / k) * n + row * k + c % k)];
      };
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
        const double va = at(a, all_v), vb = at(b, all_v);
        if (va != vb) return largest ? va > vb : va < vb;
        return at(a, all_p) < at(b, all_p);
      });
      for (int64_t j = 0; j < k; ++j) {
        value[static_cast<size_t>(row * k + j)] = at(order[static_cast<size_t>(j)], all_v);
        pos[static_cast<size_t>(row * k + j)] = at(order[static_cast<size_t>(j)], all_p);
      }
    }
  }
  const int64_t total = shape_numel(out_local);
  std::vector<double> vals(static_cast<size_t>(total));
  std::vector<int64_t> po(static_cast<size_t>(total));
  st->index.resize(static_cast<size_t>(rows * k));
  for (int64_t o = 0; o < st->rows_outer; ++o)
    for (int64_t j = 0; j < k; ++j)
      for (int64_t i = 0; i < st->inner; ++i) {
        const int64_t dst = (o * k + j) * st->inner + i, row = o * st->inner + i;
        // The merged values are the candidates' own (f64 holds every f32 exactly).
        vals[static_cast<size_t>(dst)] = value[static_cast<size_t>(row * k + j)];
        po[static_cast<size_t>(dst)] = static_cast<int64_t>(pos[static_cast<size_t>(row * k + j)]);
        st->index[static_cast<size_t>(dst)] = po[static_cast<size_t>(dst)];
      }
  DeviceScope on(local.device());
  Tensor values = Tensor::from_doubles(vals, out_local, st->dtype), indices = Tensor::from_vector(po, out_local);
  Tensor out_values = wrap_dtensor(values, out_attr, metas[0].shape);
  Tensor out_indices = wrap_dtensor(indices, out_attr, metas[1].shape);
  record_function("topk (distributed)", {x}, {out_values}, [st](std::vector<Tensor>&& g) {
    if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
    const int64_t me = current_world_rank();
    if (!st->mesh.contains(me))
      return std::vector<Tensor>{
          wrap_dtensor(Tensor::zeros(Shape(st->global.size(), 0), st->dtype), st->in_attr, st->global)};
    Tensor gd = g[0];
    if (dist_attr(gd).placements != st->out_p) gd = reshard(gd, st->mesh, st->out_p);
    const Tensor go = view::contiguous(local_piece(gd));
    const int64_t L = st->local_shape[static_cast<size_t>(st->dim)];
    // Each selected position gets its one gradient (positions are distinct), on host copies.
    const std::vector<double> pg = go.to_doubles();
    std::vector<double> pd(static_cast<size_t>(shape_numel(st->local_shape)), 0.0);
    for (int64_t o = 0; o < st->rows_outer; ++o)
      for (int64_t j = 0; j < st->k; ++j)
        for (int64_t i = 0; i < st->inner; ++i) {
          const int64_t src = (o * st->k + j) * st->inner + i;
          const int64_t at = st->index[static_cast<size_t>(src)] - st->offset;
          if (at >= 0 && at < L) pd[static_cast<size_t>((o * L + at) * st->inner + i)] += pg[static_cast<size_t>(src)];
        }
    DeviceScope on(go.device());
    const Tensor dx = Tensor::from_doubles(pd, st->local_shape, go.dtype());
    return std::vector<Tensor>{wrap_dtensor(dx, st->in_attr, st->global)};
  });
  return {out_values, out_indices};
}

}  // namespace

void register_custom_ops() {
  register_dist_impl("argmax", &dist_argmax);
  register_dist_impl("topk", &dist_topk);
  register_dist_impl("cross_entropy", &dist_cross_entropy);
  register_dist_impl("max", &dist_max);
  register_dist_impl("min", &dist_max);
  register_ring_attention();
}

}  // namespace tessel
