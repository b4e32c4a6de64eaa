// Layout-invariant dropout. Whether an element is dropped is a pure function of (seed,
// stream, its linear index in the *global* tensor): the op's box attributes place the local
// tensor inside the global one, so a shard dropped out alone equals that slice of dropping
// out the whole tensor. The mask is never stored: backward draws it again from the same
// counters, which is why the op saves nothing.
//
// Shapes: out[...] = u(k) < p ? 0 : x[...] / (1 - p), k = the element's global linear index,
//         u(k) = uniform_f32_at(seed, stream, k).
// With the attributes ring_dim and ring_ranks (context parallel's ring: that dim of the global
// tensor holds the sequence in the load-balanced order), k is the index the element has in the
// natural order, so the mask is the single-rank run's whatever order the tokens are held in.
#include "tessel/ops/random.h"

#include "tessel/ops/dispatch.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ops/op_list.h"
#include "tessel/sharding/ring_order.h"

namespace tessel {

namespace {

GlobalBox box_of(const Attrs& a) { return GlobalBox{a.ints("global_shape"), a.ints("offset")}; }

SequenceOrder order_of(const Attrs& a) {
  if (!a.has("ring_dim")) return {};
  return SequenceOrder{a.i("ring_dim"), a.i("ring_ranks")};
}

// The natural-order index of element g of a tensor of `shape` whose dim `o.dim` holds the
// sequence in the ring's order.
int64_t natural_index(int64_t g, const Shape& shape, const SequenceOrder& o) {
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(o.dim) + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t T = shape[static_cast<size_t>(o.dim)];
  const int64_t outer = g / (inner * T), s = g / inner % T, rest = g % inner;
  return (outer * T + ring_natural_position(s, T, o.ranks)) * inner + rest;
}

std::vector<TensorMeta> dropout_infer(const MetaCall& c) {
  kernels::check_floating(c, 0);
  double p = c.attrs.f("p");
  TESSEL_CHECK(p >= 0.0 && p < 1.0, "dropout: p={} must be in [0, 1) (input {})", p, c.inputs[0].str());
  // The box must place the local tensor inside the global one (for_each_global_row checks
  // again, but without the op's name).
  const Shape& local = c.inputs[0].shape;
  GlobalBox box = box_of(c.attrs);
  const Shape& global = box.global_shape.empty() ? local : box.global_shape;
  bool ok = global.size() == local.size() && (box.offset.empty() || box.offset.size() == local.size());
  for (size_t d = 0; ok && d < local.size(); ++d) {
    int64_t off = box.offset.empty() ? 0 : box.offset[d];
    ok = off >= 0 && off + local[d] <= global[d];
  }
  TESSEL_CHECK(ok, "dropout: local input {} at offset {} does not fit inside global shape {}", shape_str(local),
               shape_str(box.offset), shape_str(global));
  const SequenceOrder o = order_of(c.attrs);
  if (o.dim >= 0) {
    TESSEL_CHECK(o.dim < static_cast<int64_t>(global.size()) && o.ranks >= 1 &&
                     global[static_cast<size_t>(o.dim)] % (2 * o.ranks) == 0,
                 "dropout: ring order over {} ranks on dim {} of global shape {} needs that dim to be a multiple of {}",
                 o.ranks, o.dim, shape_str(global), 2 * o.ranks);
  }
  return {c.inputs[0]};
}

// out = x with each element dropped where u(global index) < p and the rest scaled by 1/(1-p).
// x contiguous; rows are mapped to global indices by for_each_global_row.
template <typename T>
void dropout_kernel(const T* x, T* out, const Shape& shape, const GlobalBox& box, const SequenceOrder& order, double p,
                    uint64_t seed, uint64_t stream) {
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  if (order.dim >= 0 && order.ranks > 1) {
    const Shape& global_shape = box.global_shape.empty() ? shape : box.global_shape;
    for_each_global_row(shape, box, [&](int64_t local, int64_t global, int64_t len) {
      for (int64_t i = 0; i < len; ++i) {
        const auto at = static_cast<uint64_t>(natural_index(global + i, global_shape, order));
        bool drop = static_cast<double>(uniform_f32_at(seed, stream, at)) < p;
        out[local + i] = drop ? T(0) : x[local + i] * scale;
      }
    });
    return;
  }
  for_each_global_row(shape, box, [&](int64_t local, int64_t global, int64_t len) {
    for (int64_t i = 0; i < len; ++i) {
      bool drop = static_cast<double>(uniform_f32_at(seed, stream, static_cast<uint64_t>(global + i))) < p;
      out[local + i] = drop ? T(0) : x[local + i] * scale;
    }
  });
}

// Forward and backward are the same masked scaling: d x = g · mask / (1 - p).
Tensor dropout_raw(const Tensor& x, const Attrs& a) {
  Tensor xc = kernels::contig(x);
  Tensor out = Tensor::empty(xc.shape(), xc.dtype());
  double p = a.f("p");
  if (p == 0.0) {  // nothing dropped, scale 1: skip drawing the mask
    view::copy(out, xc);
    return out;
  }
  auto seed = static_cast<uint64_t>(a.i("seed")), stream = static_cast<uint64_t>(a.i("stream"));
  TESSEL_DISPATCH_FLOAT(xc.dtype(), "dropout", [&]<typename T>() {
    dropout_kernel<T>(xc.data<T>(), out.data<T>(), xc.shape(), box_of(a), order_of(a), p, seed, stream);
  });
  return out;
}

std::vector<Tensor> dropout_forward(const OpCall& c) { return {dropout_raw(c.inputs[0], c.attrs)}; }
// The mask comes from the RNG again; going through the op keeps the backward differentiable.
std::vector<Tensor> dropout_backward(const GradCall& g) { return {call_op1(op_dropout, {g.grad_outputs[0]}, g.attrs)}; }

Cost dropout_cost(const MetaCall& c, std::span<const TensorMeta> out) { return kernels::elementwise_cost(c, out, 1); }

// SPMD rule: any shard is kept, since the mask depends only on global indices: the local
// kernel gets the box of this rank's piece, the op's own box (the distributed tensor's place in
// a larger one, or the whole tensor when empty) composed with the piece's offset in the
// distributed tensor. Partial(sum/avg) passes: ranks holding parts of one element draw the
// same mask for it, and a fixed mask and scale are linear.
SpmdDecision dropout_spmd(const SpmdCall& c) {
  Placements p = c.input_attrs[0].placements;
  for (Placement& q : p)
    if (q.is_partial() && q.reduce != ReduceOp::sum && q.reduce != ReduceOp::avg) q = Replicate();
  SpmdDecision d{{p}, {p}};
  const Shape& shape = c.inputs[0].shape;
  GlobalBox box = box_of(c.attrs);
  Shape offset = DistAttr(c.mesh(), p).local_offset(shape, c.rank);
  for (size_t i = 0; i < offset.size() && !box.offset.empty(); ++i) offset[i] += box.offset[i];
  Attrs a = c.attrs;
  a.set("global_shape", box.global_shape.empty() ? shape : box.global_shape).set("offset", offset);
  d.local_attrs = a;
  return d;
}

}  // namespace

const OpDef op_dropout{.name = "dropout", .num_inputs = 1, .infer = dropout_infer, .forward = dropout_forward,
                       .backward = dropout_backward, .cost = dropout_cost, .spmd = dropout_spmd,
                       .attrs = "p: float, seed: int = 0, stream: int = 0, global_shape: ints = [], "
                                 "offset: ints = [], ring_dim: int?, ring_ranks: int?"};

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream, const GlobalBox& box,
               const SequenceOrder& order) {
  Attrs attrs{{"p", p},
              {"seed", static_cast<int64_t>(seed)},
              {"stream", static_cast<int64_t>(stream)},
              {"global_shape", box.global_shape},
              {"offset", box.offset}};
  if (order.dim >= 0 && order.ranks > 1) attrs.set("ring_dim", order.dim).set("ring_ranks", order.ranks);
  return call_op1(op_dropout, {x}, attrs);
}

}  // namespace tessel
