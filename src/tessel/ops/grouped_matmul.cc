// Grouped matrix products (grouped_matmul.h). Group e's rows are a contiguous block of x and
// y, so each group is one tiled GEMM on views, in group order (the bits do not depend on the
// thread count, as every GEMM of tessel's). The backward is two more grouped products:
// dx_e = dy_e · W_eᵀ and dW_e = x_eᵀ · dy_e (an empty group's dW_e is zero).
//
// Shapes: x[N, K], w[E, K, F] (or [E, F, K] with trans_w), y[N, F]; attr counts[E], Σ = N.
#include "tessel/ops/grouped_matmul.h"

#include "tessel/ops/dispatch.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ops/op_list.h"
#include "tessel/sharding/spmd_rules.h"

namespace tessel {

namespace {

struct Dims {
  int64_t N, K, F, E;
};

Dims dims_of(const Shape& x, const Shape& w, bool trans_w) {
  return Dims{x[0], x[1], trans_w ? w[1] : w[2], w[0]};
}

std::vector<TensorMeta> grouped_matmul_infer(const MetaCall& c) {
  kernels::check_floating(c, 0);
  kernels::check_floating(c, 1);
  kernels::check_same_dtype(c, 0, 1);
  const Shape& x = c.inputs[0].shape;
  const Shape& w = c.inputs[1].shape;
  TESSEL_CHECK(x.size() == 2, "grouped_matmul: x must be [N, K], got {}", c.inputs[0].str());
  TESSEL_CHECK(w.size() == 3, "grouped_matmul: w must be [E, K, F] ([E, F, K] with trans_w), got {}",
               c.inputs[1].str());
  const bool trans_w = c.attrs.b_or("trans_w", false);
  const Dims d = dims_of(x, w, trans_w);
  const int64_t wk = trans_w ? w[2] : w[1];
  TESSEL_CHECK(wk == d.K, "grouped_matmul: x has K={} but w {} has K={}{}", d.K, shape_str(w), wk,
               trans_w ? " (trans_w: its last dim)" : " (its dim 1)");
  const std::vector<int64_t>& counts = c.attrs.ints("counts");
  TESSEL_CHECK(static_cast<int64_t>(counts.size()) == d.E, "grouped_matmul: {} counts for {} groups (w {})",
               counts.size(), d.E, shape_str(w));
  int64_t total = 0;
  for (int64_t n : counts) {
    TESSEL_CHECK(n >= 0, "grouped_matmul: a negative count {} in [{}]", n, fmt::join(counts, ", "));
    total += n;
  }
  TESSEL_CHECK(total == d.N, "grouped_matmul: the counts [{}] add up to {} rows but x has {}", fmt::join(counts, ", "),
               total, d.N);
  return {TensorMeta{{d.N, d.F}, c.inputs[0].dtype, {}}};
}

std::vector<Tensor> grouped_matmul_forward(const OpCall& c) {
  const Tensor x = kernels::contig(c.inputs[0]), w = kernels::contig(c.inputs[1]);
  const bool trans_w = c.attrs.b_or("trans_w", false);
  const Dims d = dims_of(x.shape(), w.shape(), trans_w);
  const std::vector<int64_t>& counts = c.attrs.ints("counts");
  Tensor y = Tensor::empty(c.outputs[0]);
  TESSEL_DISPATCH_FLOAT(x.dtype(), "grouped_matmul", [&]<typename T>() {
    const T* px = x.data<T>();
    const T* pw = w.data<T>();
    T* py = y.data<T>();
    int64_t row = 0;
    for (int64_t e = 0; e < d.E; ++e) {
      const int64_t n = counts[static_cast<size_t>(e)];
      if (n > 0)
        kernels::gemm<T>(false, trans_w, n, d.F, d.K, T(1), px + row * d.K, d.K, pw + e * d.K * d.F, trans_w ? d.K : d.F,
                         T(0), py + row * d.F, d.F);
      row += n;
    }
  });
  return {y};
}

std::vector<Tensor> grouped_matmul_backward(const GradCall& g) {
  const Tensor go = kernels::contig(g.grad_outputs[0]);
  const Tensor x = kernels::contig(g.inputs[0]), w = kernels::contig(g.inputs[1]);
  const bool trans_w = g.attrs.b_or("trans_w", false);
  const Dims d = dims_of(x.shape(), w.shape(), trans_w);
  const std::vector<int64_t>& counts = g.attrs.ints("counts");
  Tensor dx, dw;
  if (g.needs_grad[0]) dx = Tensor::empty(x.shape(), go.dtype());
  if (g.needs_grad[1]) dw = Tensor::zeros(w.shape(), go.dtype());
  TESSEL_DISPATCH_FLOAT(go.dtype(), "grouped_matmul", [&]<typename T>() {
    const T* pg = go.data<T>();
    const T* px = x.data<T>();
    const T* pw = w.data<T>();
    int64_t row = 0;
    for (int64_t e = 0; e < d.E; ++e) {
      const int64_t n = counts[static_cast<size_t>(e)];
      if (n > 0) {
        const T* we = pw + e * d.K * d.F;
        // dx_e[n, K] = dy_e[n, F] · W_eᵀ, W_e being [K, F] (or stored [F, K]).
        if (dx.defined())
          kernels::gemm<T>(false, !trans_w, n, d.K, d.F, T(1), pg + row * d.F, d.F, we, trans_w ? d.K : d.F, T(0),
                           dx.data<T>() + row * d.K, d.K);
        // dW_e = x_eᵀ · dy_e [K, F], or dy_eᵀ · x_e [F, K] stored transposed.
        if (dw.defined()) {
          T* dwe = dw.data<T>() + e * d.K * d.F;
          if (!trans_w)
            kernels::gemm<T>(true, false, d.K, d.F, n, T(1), px + row * d.K, d.K, pg + row * d.F, d.F, T(0), dwe, d.F);
          else
            kernels::gemm<T>(true, false, d.F, d.K, n, T(1), pg + row * d.F, d.F, px + row * d.K, d.K, T(0), dwe, d.K);
        }
      }
      row += n;
    }
  });
  return {dx, dw};
}

Cost grouped_matmul_cost(const MetaCall& c, std::span<const TensorMeta> out) {
  const Shape& x = c.inputs[0].shape;
  return Cost{2.0 * static_cast<double>(shape_numel(out[0].shape)) * static_cast<double>(x[1]),
              kernels::io_bytes(c, out)};
}

// Rows and groups stay whole (the rows of a group must meet its weight; spreading groups over
// ranks is expert parallelism, an all_to_all away); K may be sharded (Partial(sum) out, as a
// row-parallel linear) and F too (the output's columns, as a column-parallel one).
SpmdDecision grouped_matmul_spmd(const SpmdCall& c) {
  spmd::LabelRule r;
  r.inputs = {".k", c.attrs.b_or("trans_w", false) ? ".fk" : ".kf"};
  r.output = ".f";
  r.linearity = spmd::Linearity::single;
  return spmd::label_rule(c, r);
}

}  // namespace

const OpDef op_grouped_matmul{.name = "grouped_matmul", .num_inputs = 2, .infer = grouped_matmul_infer,
                              .forward = grouped_matmul_forward, .backward = grouped_matmul_backward,
                              .cost = grouped_matmul_cost, .spmd = grouped_matmul_spmd, .save = {0b11, 0},
                              .autocast = AutocastPolicy::lower,
                              .attrs = "counts: ints, trans_w: bool = false"};

Tensor grouped_matmul(const Tensor& x, const Tensor& w, const std::vector<int64_t>& counts, bool trans_w) {
  return call_op1(op_grouped_matmul, {x, w}, Attrs{{"counts", counts}, {"trans_w", trans_w}});
}

}  // namespace tessel
