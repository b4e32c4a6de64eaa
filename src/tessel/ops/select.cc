// Selection by masks: where, masked_fill and triu, plus causal_mask built on triu. Masks are
// bool tensors broadcast numpy-style; the kernels walk the broadcast operands with
// StridedLoop, so expanded (stride-0) masks cost no copy. Backward rules reuse the ops
// themselves (a masked gradient is a where/masked_fill/triu of the output gradient), so they
// are differentiable again.
//
// Shapes: where       out[...] = cond[...] ? a[...] : b[...]      (all three broadcast to out)
//         masked_fill out[...] = mask[...] ? value : x[...]       (mask broadcast to x)
//         triu        out[..., R, C] = x[..., r, c] if c - r >= diagonal else 0
#include "tessel/ops/select.h"

#include <algorithm>
#include <cstring>

#include "tessel/core/strided.h"
#include "tessel/ops/dispatch.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ops/op_list.h"
#include "tessel/sharding/spmd_rules.h"

namespace tessel {

using kernels::sum_to;

namespace {

// Throws naming the op and the input unless input `i` is a bool mask.
void check_bool(const MetaCall& c, size_t i, std::string_view role) {
  TESSEL_CHECK(c.inputs[i].dtype == DType::b8, "{}: {} (input {}) has dtype {}; expected bool (inputs: {})", c.op.name,
               role, i, c.inputs[i].dtype, kernels::inputs_str(c));
}

// Grain in outer runs so that each chunk covers about kElementGrain elements.
int64_t run_grain(int64_t inner) { return std::max<int64_t>(1, kernels::kElementGrain / std::max<int64_t>(1, inner)); }

Cost select_cost(const MetaCall& c, std::span<const TensorMeta> out) { return kernels::elementwise_cost(c, out, 1); }

// ---------------------------------------------------------------- where

std::vector<TensorMeta> where_infer(const MetaCall& c) {
  check_bool(c, 0, "condition");
  kernels::check_floating(c, 1);
  kernels::check_floating(c, 2);
  kernels::check_same_dtype(c, 1, 2);
  const Shape& sc = c.inputs[0].shape;
  const Shape& sa = c.inputs[1].shape;
  const Shape& sb = c.inputs[2].shape;
  size_t n = std::max({sc.size(), sa.size(), sb.size()});
  Shape out(n, 1);
  for (const Shape* s : {&sc, &sa, &sb}) {
    size_t lead = n - s->size();
    for (size_t d = 0; d < s->size(); ++d) {
      int64_t have = out[lead + d], want = (*s)[d];
      TESSEL_CHECK(have == want || have == 1 || want == 1,
                   "where: condition {}, a {} and b {} cannot be broadcast together (dim {}: {} vs {})", shape_str(sc),
                   shape_str(sa), shape_str(sb), lead + d, have, want);
      if (have == 1) out[lead + d] = want;
    }
  }
  return {TensorMeta{out, c.inputs[1].dtype, {}}};
}

// out[...] = cond[...] ? a[...] : b[...]; out contiguous, the others expanded to its shape.
template <typename T>
void where_kernel(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  Tensor ce = view::expand(cond, out.shape()), ae = view::expand(a, out.shape()), be = view::expand(b, out.shape());
  StridedLoop<4> loop(out.shape(), {&out.strides(), &ce.strides(), &ae.strides(), &be.strides()});
  T* __restrict y = out.data<T>();
  const bool* pc = ce.data<bool>();
  const T* pa = ae.data<T>();
  const T* pb = be.data<T>();
  parallel_for(0, loop.outer_count(), run_grain(loop.inner_size()), [&](int64_t lo, int64_t hi) {
    loop.run(lo, hi, [&](const auto& off, int64_t n, const auto& st) {
      T* __restrict yo = y + off[0];
      const bool* co = pc + off[1];
      const T* ao = pa + off[2];
      const T* bo = pb + off[3];
      if (st[0] == 1 && st[1] == 1 && st[2] == 1 && st[3] == 1) {
        for (int64_t i = 0; i < n; ++i) yo[i] = co[i] ? ao[i] : bo[i];
      } else {
        for (int64_t i = 0; i < n; ++i) yo[i * st[0]] = co[i * st[1]] ? ao[i * st[2]] : bo[i * st[3]];
      }
    });
  });
}

std::vector<Tensor> where_forward(const OpCall& c) {
  Tensor out = Tensor::empty(c.outputs[0]);
  TESSEL_DISPATCH_FLOAT(out.dtype(), "where",
                        [&]<typename T>() { where_kernel<T>(c.inputs[0], c.inputs[1], c.inputs[2], out); });
  return {out};
}

// d a = sum_to(cond ? g : 0), d b = sum_to(cond ? 0 : g); the condition gets none.
std::vector<Tensor> where_backward(const GradCall& g) {
  const Tensor& go = g.grad_outputs[0];
  const Tensor& cond = g.inputs[0];
  Tensor zero = Tensor::zeros({}, go.dtype());
  return {Tensor(),
          g.needs_grad[1] ? sum_to(where(cond, go, zero), g.input_metas[1].shape) : Tensor(),
          g.needs_grad[2] ? sum_to(where(cond, zero, go), g.input_metas[2].shape) : Tensor()};
}

// ---------------------------------------------------------------- masked_fill

std::vector<TensorMeta> masked_fill_infer(const MetaCall& c) {
  kernels::check_floating(c, 0);
  check_bool(c, 1, "mask");
  const Shape& x = c.inputs[0].shape;
  const Shape& m = c.inputs[1].shape;
  bool ok = m.size() <= x.size();
  for (size_t d = 0; ok && d < m.size(); ++d) ok = m[d] == 1 || m[d] == x[x.size() - m.size() + d];
  TESSEL_CHECK(ok, "masked_fill: mask {} does not broadcast to the input's shape {}", shape_str(m), shape_str(x));
  return {c.inputs[0]};
}

// out[...] = mask[...] ? value : x[...]; out contiguous, x and mask expanded to its shape.
template <typename T>
void masked_fill_kernel(const Tensor& x, const Tensor& mask, T value, const Tensor& out) {
  Tensor me = view::expand(mask, out.shape());
  StridedLoop<3> loop(out.shape(), {&out.strides(), &x.strides(), &me.strides()});
  T* __restrict y = out.data<T>();
  const T* px = x.data<T>();
  const bool* pm = me.data<bool>();
  parallel_for(0, loop.outer_count(), run_grain(loop.inner_size()), [&](int64_t lo, int64_t hi) {
    loop.run(lo, hi, [&](const auto& off, int64_t n, const auto& st) {
      T* __restrict yo = y + off[0];
      const T* xo = px + off[1];
      const bool* mo = pm + off[2];
      if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
        for (int64_t i = 0; i < n; ++i) yo[i] = mo[i] ? value : xo[i];
      } else if (st[0] == 1 && st[1] == 1 && st[2] == 0) {
        if (*mo) std::fill(yo, yo + n, value);
        else std::copy(xo, xo + n, yo);
      } else {
        for (int64_t i = 0; i < n; ++i) yo[i * st[0]] = mo[i * st[2]] ? value : xo[i * st[1]];
      }
    });
  });
}

std::vector<Tensor> masked_fill_forward(const OpCall& c) {
  Tensor out = Tensor::empty(c.outputs[0]);
  double value = c.attrs.f("value");
  TESSEL_DISPATCH_FLOAT(out.dtype(), "masked_fill", [&]<typename T>() {
    masked_fill_kernel<T>(c.inputs[0], c.inputs[1], static_cast<T>(value), out);
  });
  return {out};
}

// d x = mask ? 0 : g; the mask gets none.
std::vector<Tensor> masked_fill_backward(const GradCall& g) {
  return {masked_fill(g.grad_outputs[0], g.inputs[1], 0.0), Tensor()};
}

// ---------------------------------------------------------------- triu

std::vector<TensorMeta> triu_infer(const MetaCall& c) {
  kernels::check_ndim(c, 0, 2, /*at_least=*/true);
  DType t = c.inputs[0].dtype;
  TESSEL_CHECK(is_floating(t) || t == DType::b8,
               "triu: input has dtype {}; expected a floating or bool dtype (input {})", t, c.inputs[0].str());
  return {c.inputs[0]};
}

// out[b, r, c] = c - r >= diagonal ? x[b, r, c] : 0 over contiguous x viewed as [B, R, C].
template <typename T>
void triu_kernel(const T* x, T* out, int64_t R, int64_t C, int64_t diagonal, int64_t rows) {
  int64_t diag = std::clamp<int64_t>(diagonal, -R, C);  // beyond these every row is all kept / all zero
  parallel_for(0, rows, run_grain(C), [&](int64_t lo, int64_t hi) {
    for (int64_t q = lo; q < hi; ++q) {
      int64_t first = std::clamp<int64_t>(q % R + diag, 0, C);  // first kept column of this row
      std::fill(out + q * C, out + q * C + first, T{});
      std::copy(x + q * C + first, x + (q + 1) * C, out + q * C + first);
    }
  });
}

Tensor triu_raw(const Tensor& x, int64_t diagonal, const TensorMeta& out_meta) {
  Tensor xc = kernels::contig(x);
  Tensor out = Tensor::empty(out_meta);
  if (out.numel() == 0) return out;
  int64_t R = x.size(-2), C = x.size(-1), rows = x.numel() / C;
  if (x.dtype() == DType::b8) {
    triu_kernel<bool>(xc.data<bool>(), out.data<bool>(), R, C, diagonal, rows);
  } else {
    TESSEL_DISPATCH_FLOAT(x.dtype(), "triu",
                          [&]<typename T>() { triu_kernel<T>(xc.data<T>(), out.data<T>(), R, C, diagonal, rows); });
  }
  return out;
}

std::vector<Tensor> triu_forward(const OpCall& c) {
  return {triu_raw(c.inputs[0], c.attrs.i("diagonal"), c.outputs[0])};
}
// The rule is linear and its mask fixed: d x = triu(g).
std::vector<Tensor> triu_backward(const GradCall& g) { return {triu(g.grad_outputs[0], g.attrs.i("diagonal"))}; }

// ---------------------------------------------------------------- SPMD rules
// where and masked_fill are elementwise over their broadcast operands. Both are linear in
// their floating operands where the mask is fixed: where in a and b together (each rank picks
// from its own partial values, the condition replicated), masked_fill in x when the fill is 0
// (every rank fills 0, which sums to 0). Masks are bool and never Partial. triu keeps every
// shard, the last two dims included: a rank's piece starting at row r0, column c0 keeps
// c - r >= diagonal - r0 + c0 in local indices, which the rule passes as the local diagonal.

using spmd::Linearity;

// out[...] = cond[...] ? a[...] : b[...], all broadcast: sharded like any elementwise op; a and
// b Partial alike on a mesh dim stay Partial (cond gathered there) when that moves least.
SpmdDecision where_spmd(const SpmdCall& c) {
  SpmdDecision d = spmd::label_rule(c, spmd::elementwise_labels(c, 3, Linearity::none));
  for (size_t m = 0; m < static_cast<size_t>(c.mesh_ndim()); ++m) {
    const Placement& pa = c.input_attrs[1].placements[m];
    const Placement& pb = c.input_attrs[2].placements[m];
    if (!pa.is_partial() || !(pa == pb) || (pa.reduce != ReduceOp::sum && pa.reduce != ReduceOp::avg)) continue;
    const int64_t k = c.mesh().dim_size(static_cast<int64_t>(m));
    double chosen = 0;
    for (size_t i = 0; i < 3; ++i)
      chosen += spmd::transition_cost(c.inputs[i], c.input_attrs[i].placements[m], d.inputs[i][m], k);
    if (spmd::transition_cost(c.inputs[0], c.input_attrs[0].placements[m], Replicate(), k) > chosen) continue;
    d.inputs[0][m] = Replicate();
    d.inputs[1][m] = pa;
    d.inputs[2][m] = pb;
    d.outputs[0][m] = pa;
  }
  return d;
}

// out[...] = mask[...] ? value : x[...], mask broadcast to x: elementwise; x alone Partial
// (mask replicated) passes through when value == 0.
SpmdDecision masked_fill_spmd(const SpmdCall& c) {
  return spmd::elementwise_rule(c, c.attrs.f("value") == 0.0 ? Linearity::first : Linearity::none);
}

// out[..., R, C] = triu(x[..., R, C]): every shard kept, the local diagonal moved by the
// piece's offsets; Partial(sum/avg) passes (the zeroed places are zero on every rank).
SpmdDecision triu_spmd(const SpmdCall& c) {
  const TensorMeta& x = c.inputs[0];
  Placements p = c.input_attrs[0].placements;
  for (Placement& q : p)
    if (q.is_partial() && (x.dtype == DType::b8 || (q.reduce != ReduceOp::sum && q.reduce != ReduceOp::avg)))
      q = Replicate();
  SpmdDecision d{{p}, {p}};
  const Shape off = DistAttr(c.mesh(), p).local_offset(x.shape, c.rank);
  const size_t nd = x.shape.size();
  Attrs a = c.attrs;
  a.set("diagonal", c.attrs.i("diagonal") + off[nd - 2] - off[nd - 1]);
  d.local_attrs = a;
  return d;
}

}  // namespace

const OpDef op_where{.name = "where", .num_inputs = 3, .infer = where_infer, .forward = where_forward,
                     .backward = where_backward, .cost = select_cost, .spmd = where_spmd, .save = {0b001, 0}};
const OpDef op_masked_fill{.name = "masked_fill", .num_inputs = 2, .infer = masked_fill_infer,
                           .forward = masked_fill_forward, .backward = masked_fill_backward, .cost = select_cost,
                           .spmd = masked_fill_spmd, .save = {0b10, 0},
                           .attrs = "value: float"};
const OpDef op_triu{.name = "triu", .num_inputs = 1, .infer = triu_infer, .forward = triu_forward,
                    .backward = triu_backward, .cost = select_cost, .spmd = triu_spmd,
                    .attrs = "diagonal: int = 0"};

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) { return call_op1(op_where, {cond, a, b}); }

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  return call_op1(op_masked_fill, {x, mask}, Attrs{{"value", value}});
}

Tensor triu(const Tensor& x, int64_t diagonal) { return call_op1(op_triu, {x}, Attrs{{"diagonal", diagonal}}); }

Tensor causal_mask(int64_t t, int64_t s) {
  if (s == -1) s = t;
  TESSEL_CHECK(t >= 0 && s >= 0, "causal_mask: query length t={} and key length s={} must be non-negative", t, s);
  // Hidden: j > i + (s - t), i.e. j - i >= s - t + 1 — the upper triangle above that diagonal.
  return triu(Tensor::ones({t, s}, DType::b8), s - t + 1);
}

}  // namespace tessel
