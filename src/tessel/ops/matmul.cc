// Matrix products on OpenBLAS: matmul (batched, broadcasting, transposed operands) and
// linear (the fused x @ W + bias of every projection). Strided operands whose last two dims
// are row- or column-major go to BLAS as they are; only other layouts are copied.
//
// Shapes: matmul out[..., M, N] = A[..., M, K] @ B[..., K, N]
//         linear y[R, O] = x[R, I] @ W[I, O] + bias[O]   (R = rows of x flattened)
//         linear with several output dims (in_out layout only): y[..., O1, O2] = x[..., I] @
//         W[I, O1, O2] + bias[O1, O2] — one GEMM with O = O1·O2, W's contiguous local piece
//         read as the matrix [I, O] (GPT-2's c_attn [C, 3, C], sharded by heads on its last dim).
#include <array>

#include "tessel/core/strided.h"
#include "tessel/ops/dispatch.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ops/matmul.h"
#include "tessel/ops/op_list.h"
#include "tessel/ops/reduce.h"
#include "tessel/ops/shape.h"
#include "tessel/sharding/spmd_rules.h"

namespace tessel {

using kernels::gemm;

namespace {

// How BLAS can read an R×C matrix with strides (sr, sc): row-major with leading dim `ld`, or
// (transposed) column-major. False when neither holds and a copy is needed.
bool blas_layout(int64_t R, int64_t C, int64_t sr, int64_t sc, int64_t& ld, bool& transposed) {
  if (sc == 1 || C <= 1) {
    ld = R <= 1 ? std::max<int64_t>(C, 1) : sr;
    if (ld >= std::max<int64_t>(C, 1)) {
      transposed = false;
      return true;
    }
  }
  if (sr == 1 || R <= 1) {
    ld = C <= 1 ? std::max<int64_t>(R, 1) : sc;
    if (ld >= std::max<int64_t>(R, 1)) {
      transposed = true;
      return true;
    }
  }
  return false;
}

// An operand's last two dims as BLAS sees them.
struct Operand {
  Tensor t;  // possibly a contiguous copy
  int64_t ld = 0;
  bool transposed = false;
};

Operand blas_operand(const Tensor& x) {
  int64_t nd = x.dim();
  Operand o{x};
  if (!blas_layout(x.size(nd - 2), x.size(nd - 1), x.stride(nd - 2), x.stride(nd - 1), o.ld, o.transposed)) {
    o.t = view::contiguous(x);
    o.ld = std::max<int64_t>(x.size(nd - 1), 1);
    o.transposed = false;
  }
  return o;
}

Shape batch_of(const Shape& s) { return Shape(s.begin(), s.end() - 2); }

std::vector<TensorMeta> matmul_infer(const MetaCall& c) {
  kernels::check_floating(c, 0);
  kernels::check_floating(c, 1);
  kernels::check_same_dtype(c, 0, 1);
  kernels::check_ndim(c, 0, 2, true);
  kernels::check_ndim(c, 1, 2, true);
  const Shape& a = c.inputs[0].shape;
  const Shape& b = c.inputs[1].shape;
  bool ta = c.attrs.b("trans_a"), tb = c.attrs.b("trans_b");
  int64_t M = ta ? a[a.size() - 1] : a[a.size() - 2];
  int64_t Ka = ta ? a[a.size() - 2] : a[a.size() - 1];
  int64_t Kb = tb ? b[b.size() - 1] : b[b.size() - 2];
  int64_t N = tb ? b[b.size() - 2] : b[b.size() - 1];
  TESSEL_CHECK(Ka == Kb, "matmul: inner dims differ: {}{} has K={} but {}{} has K={}", shape_str(a),
               ta ? "^T" : "", Ka, shape_str(b), tb ? "^T" : "", Kb);
  Shape out = broadcast_shapes(batch_of(a), batch_of(b), "matmul (batch dims)");
  out.push_back(M);
  out.push_back(N);
  return {TensorMeta{out, c.inputs[0].dtype, {}}};
}

template <typename T>
void matmul_kernel(const Tensor& a, const Tensor& b, bool ta, bool tb, const Tensor& out) {
  const int64_t nd = out.dim();
  const int64_t M = out.size(nd - 2), N = out.size(nd - 1);
  const int64_t K = ta ? a.size(-2) : a.size(-1);
  T* C = out.data<T>();
  Operand oa = blas_operand(a), ob = blas_operand(b);
  const bool eff_ta = ta != oa.transposed, eff_tb = tb != ob.transposed;
  Shape out_batch = batch_of(out.shape());
  int64_t batches = shape_numel(out_batch);

  // One tall gemm when B has no batch and A's batch·M rows are evenly strided.
  if (batches > 1 && shape_numel(batch_of(b.shape())) == 1 && !ta && !oa.transposed) {
    Tensor a2 = oa.t;
    if (auto v = view::try_view(a2, {batches * M, K})) {
      if (v->stride(1) == 1 || K <= 1) {
        int64_t lda = batches * M <= 1 ? std::max<int64_t>(K, 1) : v->stride(0);
        if (lda >= std::max<int64_t>(K, 1)) {
          gemm<T>(false, eff_tb, batches * M, N, K, T(1), v->template data<T>(), lda, ob.t.template data<T>(), ob.ld, T(0),
                  C, std::max<int64_t>(N, 1));
          return;
        }
      }
    }
  }
  Tensor ae = view::expand(view::as_strided(oa.t, batch_of(oa.t.shape()), batch_of(oa.t.strides()), oa.t.offset()),
                           out_batch);
  Tensor be = view::expand(view::as_strided(ob.t, batch_of(ob.t.shape()), batch_of(ob.t.strides()), ob.t.offset()),
                           out_batch);
  Shape out_bstrides = batch_of(out.strides());
  const T* A = static_cast<const T*>(oa.t.storage()->data());
  const T* B = static_cast<const T*>(ob.t.storage()->data());
  // Offsets of each batch's C, A and B. Products of at least one gemm tile run one after
  // another, each split over the pool; smaller ones run several at once, each whole on one
  // thread (its bits are those of its own gemm call, whichever thread runs it).
  std::vector<std::array<int64_t, 3>> offsets;
  offsets.reserve(static_cast<size_t>(batches));
  StridedLoop<3> loop(out_batch, {&out_bstrides, &ae.strides(), &be.strides()});
  loop.run([&](const auto& off, int64_t n, const auto& st) {
    for (int64_t i = 0; i < n; ++i)
      offsets.push_back({off[0] + i * st[0], ae.offset() + off[1] + i * st[1], be.offset() + off[2] + i * st[2]});
  });
  const double work = std::max(1.0, static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K));
  auto run = [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const auto& o = offsets[static_cast<size_t>(i)];
      gemm<T>(eff_ta, eff_tb, M, N, K, T(1), A + o[1], oa.ld, B + o[2], ob.ld, T(0), C + o[0], std::max<int64_t>(N, 1));
    }
  };
  const int64_t count = static_cast<int64_t>(offsets.size());
  if (work >= static_cast<double>(kernels::kGemmTileWork)) return run(0, count);  // each gemm splits itself
  parallel_for(0, count, static_cast<int64_t>(static_cast<double>(kernels::kGemmTileWork) / work), run);
}

std::vector<Tensor> matmul_forward(const OpCall& c) {
  Tensor out = Tensor::empty(c.outputs[0]);
  bool ta = c.attrs.b("trans_a"), tb = c.attrs.b("trans_b");
  TESSEL_DISPATCH_FLOAT(out.dtype(), "matmul", [&]<typename T>() { matmul_kernel<T>(c.inputs[0], c.inputs[1], ta, tb, out); });
  return {out};
}

// out = op(A) @ op(B): d op(A) = g @ op(B)^T and d op(B) = op(A)^T @ g, written without
// materialising transposes, then summed over broadcast batch dims.
std::vector<Tensor> matmul_backward(const GradCall& g) {
  const Tensor& go = g.grad_outputs[0];
  const Tensor& a = g.inputs[0];
  const Tensor& b = g.inputs[1];
  bool ta = g.attrs.b("trans_a"), tb = g.attrs.b("trans_b");
  Tensor da, db;
  if (g.needs_grad[0]) da = kernels::sum_to(ta ? matmul(b, go, tb, true) : matmul(go, b, false, !tb), g.input_metas[0].shape);
  if (g.needs_grad[1]) db = kernels::sum_to(tb ? matmul(go, a, true, ta) : matmul(a, go, !ta, false), g.input_metas[1].shape);
  return {da, db};
}

Cost matmul_cost(const MetaCall& c, std::span<const TensorMeta> out) {
  const Shape& o = out[0].shape;
  int64_t K = c.attrs.b("trans_a") ? c.inputs[0].shape[c.inputs[0].shape.size() - 2] : c.inputs[0].shape.back();
  return Cost{2.0 * static_cast<double>(shape_numel(o)) * static_cast<double>(K), kernels::io_bytes(c, out)};
}

// ---------------------------------------------------------------- linear

// The output dims of a linear weight: w[1:] (in_out) or w[0] (out_in).
Shape linear_out_dims(const Shape& w, bool in_out) { return in_out ? Shape(w.begin() + 1, w.end()) : Shape{w[0]}; }

std::vector<TensorMeta> linear_infer(const MetaCall& c) {
  TESSEL_CHECK(c.inputs.size() == 2 || c.inputs.size() == 3, "linear: expected x, w and an optional bias; got {} inputs",
               c.inputs.size());
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    kernels::check_floating(c, i);
    kernels::check_same_dtype(c, 0, i);
  }
  kernels::check_ndim(c, 0, 1, true);
  bool in_out = c.attrs.b("weight_in_out");
  kernels::check_ndim(c, 1, 2, /*at_least=*/in_out);
  const Shape& x = c.inputs[0].shape;
  const Shape& w = c.inputs[1].shape;
  int64_t in = in_out ? w[0] : w[1];
  const Shape outd = linear_out_dims(w, in_out);
  TESSEL_CHECK(x.back() == in, "linear: x {} has {} features but weight {} ({}) takes {}", shape_str(x), x.back(),
               shape_str(w), in_out ? "[in, out...]" : "[out, in]", in);
  if (c.inputs.size() == 3)
    TESSEL_CHECK(c.inputs[2].shape == outd, "linear: bias {} does not match the output features {} of weight {}",
                 shape_str(c.inputs[2].shape), shape_str(outd), shape_str(w));
  Shape out(x.begin(), x.end() - 1);
  out.insert(out.end(), outd.begin(), outd.end());
  return {TensorMeta{out, c.inputs[0].dtype, {}}};
}

template <typename T>
void linear_kernel(const Tensor& x, const Tensor& w, const Tensor* bias, bool in_out, const Tensor& out) {
  // Rows from the leading dims: with I == 0 (an empty shard of the contraction) x has no
  // elements but the output still has R rows (the bias). O: all of W's output dims.
  const int64_t I = x.size(-1), R = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  const int64_t O = shape_numel(linear_out_dims(w.shape(), in_out));
  Tensor xc = kernels::contig(x), wc = kernels::contig(w);
  T* y = out.data<T>();
  T beta = T(0);
  if (bias != nullptr) {
    Tensor bc = kernels::contig(*bias);
    const T* pb = bc.data<T>();
    for (int64_t r = 0; r < R; ++r) std::copy(pb, pb + O, y + r * O);
    beta = T(1);
  }
  // y[R, O] = x[R, I] @ W: W is w[I, O] (in_out) or w[O, I]^T.
  gemm<T>(false, !in_out, R, O, I, T(1), xc.data<T>(), std::max<int64_t>(I, 1), wc.data<T>(),
          in_out ? std::max<int64_t>(O, 1) : std::max<int64_t>(I, 1), beta, y, std::max<int64_t>(O, 1));
}

std::vector<Tensor> linear_forward(const OpCall& c) {
  Tensor out = Tensor::empty(c.outputs[0]);
  const Tensor* bias = c.inputs.size() == 3 ? &c.inputs[2] : nullptr;
  bool in_out = c.attrs.b("weight_in_out");
  TESSEL_DISPATCH_FLOAT(out.dtype(), "linear", [&]<typename T>() { linear_kernel<T>(c.inputs[0], c.inputs[1], bias, in_out, out); });
  return {out};
}

// dx[R, I] = g[R, O] @ W^T;  dW = x^T @ g stored as w is;  dbias[O] = Σ_rows g (O: all output dims).
template <typename T>
std::vector<Tensor> linear_backward_t(const GradCall& g) {
  const Tensor& x = g.inputs[0];
  const Tensor& w = g.inputs[1];
  bool in_out = g.attrs.b("weight_in_out");
  const int64_t I = x.size(-1), R = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  const int64_t O = shape_numel(linear_out_dims(w.shape(), in_out));
  Tensor go = kernels::contig(g.grad_outputs[0]);
  const T* pg = go.data<T>();
  std::vector<Tensor> grads(g.input_metas.size());
  if (g.needs_grad[0]) {
    Tensor wc = kernels::contig(w);
    Tensor dx = Tensor::empty(x.shape(), x.dtype());
    gemm<T>(false, in_out, R, I, O, T(1), pg, std::max<int64_t>(O, 1), wc.data<T>(),
            in_out ? std::max<int64_t>(O, 1) : std::max<int64_t>(I, 1), T(0), dx.data<T>(), std::max<int64_t>(I, 1));
    grads[0] = dx;
  }
  if (g.needs_grad[1]) {
    Tensor xc = kernels::contig(x);
    Tensor dw = Tensor::empty(w.shape(), w.dtype());
    if (in_out)  // dW[I, O] = x^T[I, R] @ g[R, O]
      gemm<T>(true, false, I, O, R, T(1), xc.data<T>(), std::max<int64_t>(I, 1), pg, std::max<int64_t>(O, 1), T(0),
              dw.data<T>(), std::max<int64_t>(O, 1));
    else  // dW[O, I] = g^T[O, R] @ x[R, I]
      gemm<T>(true, false, O, I, R, T(1), pg, std::max<int64_t>(O, 1), xc.data<T>(), std::max<int64_t>(I, 1), T(0),
              dw.data<T>(), std::max<int64_t>(I, 1));
    grads[1] = dw;
  }
  if (grads.size() == 3 && g.needs_grad[2]) {
    Tensor db = Tensor::zeros(g.input_metas[2].shape, go.dtype());
    T* pb = db.data<T>();
    // Columns split over threads, one block each, so that each reads whole row segments in
    // memory order; each column sums its rows in order (deterministic).
    const int64_t threads = current_num_threads();
    const int64_t grain = std::max<int64_t>(64, (O + threads - 1) / threads);
    parallel_for(0, O, grain, [&](int64_t lo, int64_t hi) {
      T* __restrict acc = pb + lo;
      for (int64_t r = 0; r < R; ++r) {
        const T* __restrict row = pg + r * O + lo;
        for (int64_t o = 0; o < hi - lo; ++o) acc[o] += row[o];
      }
    });
    grads[2] = db;
  }
  return grads;
}

std::vector<Tensor> linear_backward(const GradCall& g) {
  return TESSEL_DISPATCH_FLOAT(g.grad_outputs[0].dtype(), "linear", [&]<typename T>() { return linear_backward_t<T>(g); });
}

Cost linear_cost(const MetaCall& c, std::span<const TensorMeta> out) {
  double rows_x_out = static_cast<double>(out[0].numel());
  double in = static_cast<double>(c.inputs[0].shape.back());
  return Cost{2.0 * rows_x_out * in + (c.inputs.size() == 3 ? rows_x_out : 0.0), kernels::io_bytes(c, out)};
}

// ---------------------------------------------------------------- SPMD rules
// As einsum: matmul "...mk,...kn->...mn" (batch dims broadcast, transposes swap the last two
// labels), linear "...i,oi->...o" (or "...i,io->...o", "...i,iop->...op" for a weight with
// several output dims, so a shard of W's dim 2 is a shard of y's last dim). A sharded k gives Partial(sum)
// outputs; one Partial operand passes through (bilinear). Linear's bias follows the output:
// sharded with it along o, and Partial where the output is (kept on the first rank only, so
// the sum adds it once).

SpmdDecision matmul_spmd(const SpmdCall& c) {
  const Shape& a = c.inputs[0].shape;
  const Shape& b = c.inputs[1].shape;
  Shape ab(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
  Shape ob = broadcast_shapes(ab, bb, "matmul");
  std::string batch = spmd::dim_labels(ob.size(), 'A');
  auto labels = [&](const Shape& own, bool trans, const char* mat) {
    std::string l;
    size_t lead = ob.size() - own.size();
    for (size_t i = 0; i < own.size(); ++i) l += (own[i] == 1 && ob[lead + i] != 1) ? '.' : batch[lead + i];
    l += trans ? std::string{mat[1], mat[0]} : std::string(mat);
    return l;
  };
  spmd::LabelRule r;
  r.inputs = {labels(ab, c.attrs.b("trans_a"), "mk"), labels(bb, c.attrs.b("trans_b"), "kn")};
  r.output = batch + "mn";
  for (size_t i = 0; i < ob.size(); ++i)
    if (ob[i] == 1) r.output[i] = '.';
  r.linearity = spmd::Linearity::single;
  return spmd::label_rule(c, r);
}

SpmdDecision linear_spmd(const SpmdCall& c) {
  const size_t xr = c.inputs[0].shape.size();
  const bool in_out = c.attrs.b("weight_in_out");
  spmd::LabelRule r;
  std::string batch = spmd::dim_labels(xr - 1, 'A');
  const std::string outs = spmd::dim_labels(in_out ? c.inputs[1].shape.size() - 1 : 1, 'o');
  r.inputs = {batch + "i", in_out ? "i" + outs : outs + "i"};
  r.output = batch + outs;
  const bool bias = c.inputs.size() == 3;
  r.linearity = bias ? spmd::Linearity::none : spmd::Linearity::single;
  SpmdDecision d = spmd::label_rule(c, r);
  if (bias) {  // bias[outs]: y's output dims shifted to 0
    Placements bp;
    for (const Placement& o : d.outputs[0])
      bp.push_back(o.is_shard() && o.dim >= static_cast<int64_t>(xr - 1) ? Shard(o.dim - static_cast<int64_t>(xr - 1))
                   : o.is_partial()                                       ? Partial(ReduceOp::sum)
                                                                          : Replicate());
    d.inputs.push_back(bp);
  }
  return d;
}

}  // namespace

const OpDef op_matmul{.name = "matmul", .num_inputs = 2, .infer = matmul_infer, .forward = matmul_forward,
                      .backward = matmul_backward, .cost = matmul_cost, .spmd = matmul_spmd, .save = {0b11, 0},
                      .autocast = AutocastPolicy::lower,
                      .attrs = "trans_a: bool = false, trans_b: bool = false"};
const OpDef op_linear{.name = "linear", .num_inputs = -1, .infer = linear_infer, .forward = linear_forward,
                      .backward = linear_backward, .cost = linear_cost, .spmd = linear_spmd, .save = {0b11, 0},
                      .autocast = AutocastPolicy::lower,
                      .attrs = "weight_in_out: bool = false"};

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  return call_op1(op_matmul, {a, b}, Attrs{{"trans_a", trans_a}, {"trans_b", trans_b}});
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, bool weight_in_out) {
  std::vector<Tensor> in{x, w};
  if (bias.defined()) in.push_back(bias);
  return call_op1(op_linear, std::move(in), Attrs{{"weight_in_out", weight_in_out}});
}

}  // namespace tessel
