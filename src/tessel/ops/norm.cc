// Normalisation over the last dim: layer_norm and rms_norm share one fused kernel (rms_norm is
// layer_norm without centring and without bias). Forward: one thread per row; the first pass
// over a row reads memory, the statistics and the normalise-and-affine pass then run in cache
// while the next row is prefetched; the row's mean and rstd are hidden outputs for backward.
// Backward: dx per row in two passes; the weight and bias gradients are summed over fixed row
// chunks (boundaries from the grain, not the thread count) into per-chunk partials, combined
// in chunk order — deterministic.
//
// Shapes (R = rows of x flattened, C = the normalised trailing dims flattened: the last one, or
// layer_norm's last normalized_ndim as PyTorch's normalized_shape; weight and bias have their shape):
//   layer_norm  y[R, C] = (x - mean[R]) · rstd[R] · w[C] + b[C],  rstd = 1 / sqrt(var + eps)
//   rms_norm    y[R, C] = x · rstd[R] · w[C],                     rstd = 1 / sqrt(mean(x²) + eps)
//   backward    dx = rstd · (g·w - mean(g·w) - x̂ · mean(g·w·x̂)),  x̂ = (x - mean) · rstd
//               (rms_norm drops the mean(g·w) term); dw[C] = Σ_R g·x̂; db[C] = Σ_R g
#include "tessel/ops/norm.h"

#include <cmath>

#include "tessel/ops/dispatch.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ops/op_list.h"
#include "tessel/sharding/spmd_rules.h"

namespace tessel {

namespace {

// Row reductions keep kLanes partial accumulators (lane k sums elements k, k + kLanes, ...;
// combined pairwise at the end, a fixed order). "#pragma GCC unroll 1" on the lane loop keeps
// GCC from unrolling it and then vectorising across rows of lanes with shuffles (3-7x slower).
constexpr int kLanes = 16;

int64_t row_grain(int64_t C) { return std::max<int64_t>(1, kernels::kElementGrain / std::max<int64_t>(1, C)); }

// Which kernel and which optional inputs a call has.
struct NormSpec {
  bool centred;  // layer_norm (true) or rms_norm
  bool has_weight;
  bool has_bias;
  int weight_index() const { return 1; }
  int bias_index() const { return has_weight ? 2 : 1; }
};

NormSpec spec_of(std::string_view op, const Attrs& attrs) {
  bool layer = op == "layer_norm";
  return NormSpec{layer, attrs.b("has_weight"), layer && attrs.b("has_bias")};
}

// How many trailing dims are normalised together (layer_norm's normalized_ndim; 1 for rms_norm
// and by default): a row is their product.
int64_t normalized_ndim(const Attrs& attrs) { return attrs.i_or("normalized_ndim", 1); }
Shape row_shape(const Shape& x, int64_t n) { return Shape(x.end() - n, x.end()); }

// Asks for the kLanes elements at p (one or two cache lines) ahead of use. A row's first pass
// reads memory; prefetching the next row during this row's in-cache passes overlaps the two.
// Always inlined: GCC judges a helper that only prefetches side-effect free and drops calls.
template <typename T>
[[gnu::always_inline]] inline void prefetch_lanes(const T* p, bool write) {
  for (size_t b = 0; b < kLanes * sizeof(T); b += 64) {
    if (write) __builtin_prefetch(reinterpret_cast<const char*>(p) + b, 1);
    else __builtin_prefetch(reinterpret_cast<const char*>(p) + b, 0);
  }
}

// Σ_i (x[i] - shift) or Σ_i (x[i] - shift)² with kLanes partial sums combined pairwise;
// prefetches `ahead` (null: nothing) over the same span.
template <typename T, bool Square>
T row_sum(const T* __restrict x, int64_t n, T shift, const T* ahead) {
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    if (ahead != nullptr) prefetch_lanes(ahead + i, false);
    #pragma GCC unroll 1
    for (int k = 0; k < kLanes; ++k) {
      T v = x[i + k] - shift;
      acc[k] += Square ? v * v : v;
    }
  }
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  T s = acc[0];
  for (; i < n; ++i) {
    T v = x[i] - shift;
    s += Square ? v * v : v;
  }
  return s;
}

// ---------------------------------------------------------------- forward

// y[C] = (x[C] - mean) · rstd · w[C] + b[C] for one row; writes the row's statistics. The
// first pass reads memory; the later ones run in cache and prefetch the next row (next = the
// offset to it, 0 for none): its x while the variance is summed, its y while y is written.
template <typename T, bool Centred, bool HasW, bool HasB>
void norm_row(const T* __restrict x, const T* __restrict w, const T* __restrict b, T* __restrict y, int64_t C,
              int64_t next, T inv_c, T eps, T* mean_out, T* rstd_out) {
  T mean = T(0), var;
  if constexpr (Centred) {
    mean = row_sum<T, false>(x, C, T(0), nullptr) * inv_c;
    var = row_sum<T, true>(x, C, mean, next ? x + next : nullptr) * inv_c;  // two passes: no cancellation
  } else {
    var = row_sum<T, true>(x, C, T(0), nullptr) * inv_c;
  }
  const T rstd = T(1) / std::sqrt(var + eps);
  for (int64_t i0 = 0; i0 < C; i0 += kLanes) {
    const int64_t i1 = std::min(C, i0 + kLanes);
    if (next != 0) {
      if constexpr (!Centred) prefetch_lanes(x + next + i0, false);
      prefetch_lanes(y + next + i0, true);
    }
    for (int64_t i = i0; i < i1; ++i) {
      T v = (x[i] - mean) * rstd;
      if constexpr (HasW) v *= w[i];
      if constexpr (HasB) v += b[i];
      y[i] = v;
    }
  }
  if constexpr (Centred) *mean_out = mean;
  *rstd_out = rstd;
}

template <typename T, bool Centred, bool HasW, bool HasB>
void norm_forward_t(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t R, int64_t C, double eps) {
  const T inv_c = C > 0 ? T(1) / static_cast<T>(C) : T(0);
  parallel_for(0, R, row_grain(C), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r)
      norm_row<T, Centred, HasW, HasB>(x + r * C, w, b, y + r * C, C, r + 1 < R ? C : 0, inv_c, static_cast<T>(eps),
                                       Centred ? mean + r : nullptr, rstd + r);
  });
}

std::vector<TensorMeta> norm_infer(const MetaCall& c) {
  NormSpec sp = spec_of(c.op.name, c.attrs);
  size_t expect = 1 + sp.has_weight + sp.has_bias;
  TESSEL_CHECK(c.inputs.size() == expect, "{}: expected {} inputs (x{}{}), got {}: {}", c.op.name, expect,
               sp.has_weight ? ", weight" : "", sp.has_bias ? ", bias" : "", c.inputs.size(), kernels::inputs_str(c));
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    kernels::check_floating(c, i);
    kernels::check_same_dtype(c, 0, i);
  }
  const TensorMeta& x = c.inputs[0];
  const int64_t n = normalized_ndim(c.attrs);
  TESSEL_CHECK(n >= 1 && n <= static_cast<int64_t>(x.shape.size()),
               "{}: normalized_ndim {} must be between 1 and the rank of x {}", c.op.name, n, x.str());
  const Shape row = row_shape(x.shape, n);
  auto check_param = [&](int i, const char* what) {
    TESSEL_CHECK(c.inputs[i].shape == row, "{}: {} {} must be {} to match the last {} dim(s) of x {}", c.op.name, what,
                 c.inputs[i].str(), shape_str(row), n, x.str());
  };
  if (sp.has_weight) check_param(sp.weight_index(), "weight");
  if (sp.has_bias) check_param(sp.bias_index(), "bias");
  TensorMeta stats{{shape_numel(Shape(x.shape.begin(), x.shape.end() - n))}, x.dtype, {}};
  std::vector<TensorMeta> out{TensorMeta{x.shape, x.dtype, {}}};
  if (sp.centred) out.push_back(stats);  // mean
  out.push_back(stats);                   // rstd
  return out;
}

// Calls f.template operator()<HasW, HasB>() with the flags as constants.
template <typename F>
void with_flags(bool has_w, bool has_b, F f) {
  if (has_w && has_b) f.template operator()<true, true>();
  else if (has_w) f.template operator()<true, false>();
  else if (has_b) f.template operator()<false, true>();
  else f.template operator()<false, false>();
}

std::vector<Tensor> norm_forward(const OpCall& c) {
  NormSpec sp = spec_of(c.op.name, c.attrs);
  Tensor x = kernels::contig(c.inputs[0]);
  Tensor w = sp.has_weight ? kernels::contig(c.inputs[sp.weight_index()]) : Tensor();
  Tensor b = sp.has_bias ? kernels::contig(c.inputs[sp.bias_index()]) : Tensor();
  std::vector<Tensor> out;
  for (const TensorMeta& m : c.outputs) out.push_back(Tensor::empty(m));
  const int64_t C = shape_numel(row_shape(x.shape(), normalized_ndim(c.attrs))), R = c.outputs[1].numel();
  const double eps = c.attrs.f("eps");
  TESSEL_DISPATCH_FLOAT(x.dtype(), c.op.name, [&]<typename T>() {
    const T* pw = sp.has_weight ? w.data<T>() : nullptr;
    const T* pb = sp.has_bias ? b.data<T>() : nullptr;
    T* mean = sp.centred ? out[1].data<T>() : nullptr;
    T* rstd = out.back().data<T>();
    with_flags(sp.has_weight, sp.has_bias, [&]<bool HasW, bool HasB>() {
      if (sp.centred) norm_forward_t<T, true, HasW, HasB>(x.data<T>(), pw, pb, out[0].data<T>(), mean, rstd, R, C, eps);
      else norm_forward_t<T, false, HasW, false>(x.data<T>(), pw, pb, out[0].data<T>(), mean, rstd, R, C, eps);
    });
  });
  return out;
}

// ---------------------------------------------------------------- backward

// dx[C] for one row, and the row's terms of dw (g·x̂) and db (g) added to the chunk partials
// (null: not wanted). The sums read memory; dx is written in cache while the next row's x and
// g are prefetched (next = the offset to it, 0 for none).
template <typename T, bool Centred, bool HasW>
void norm_grad_row(const T* __restrict x, const T* __restrict g, const T* __restrict w, T* __restrict dx,
                   T* __restrict dw, T* __restrict db, int64_t C, int64_t next, T inv_c, T mean, T rstd) {
  if (dx != nullptr) {
    T s1[kLanes] = {}, s2[kLanes] = {};  // Σ g·w and Σ g·w·x̂
    int64_t i = 0;
    for (; i + kLanes <= C; i += kLanes) {
      #pragma GCC unroll 1
      for (int k = 0; k < kLanes; ++k) {
        T gw = HasW ? g[i + k] * w[i + k] : g[i + k];
        s1[k] += gw;
        s2[k] += gw * ((x[i + k] - mean) * rstd);
      }
    }
    for (int h = kLanes / 2; h > 0; h /= 2)
      for (int k = 0; k < h; ++k) s1[k] += s1[k + h], s2[k] += s2[k + h];
    T a = s1[0], b = s2[0];
    for (; i < C; ++i) {
      T gw = HasW ? g[i] * w[i] : g[i];
      a += gw;
      b += gw * ((x[i] - mean) * rstd);
    }
    const T ma = Centred ? a * inv_c : T(0), mb = b * inv_c;
    for (int64_t i0 = 0; i0 < C; i0 += kLanes) {
      const int64_t i1 = std::min(C, i0 + kLanes);
      if (next != 0) {
        prefetch_lanes(x + next + i0, false);
        prefetch_lanes(g + next + i0, false);
        prefetch_lanes(dx + next + i0, true);
      }
      for (int64_t j = i0; j < i1; ++j) {
        T gw = HasW ? g[j] * w[j] : g[j];
        dx[j] = rstd * (gw - ma - (x[j] - mean) * rstd * mb);
      }
    }
  }
  if (dw != nullptr)
    for (int64_t j = 0; j < C; ++j) dw[j] += g[j] * ((x[j] - mean) * rstd);
  if (db != nullptr)
    for (int64_t j = 0; j < C; ++j) db[j] += g[j];
}

// out[C] = Σ_k part[k, C] over chunks k in order.
template <typename T>
void combine_chunks(const std::vector<T>& part, int64_t chunks, int64_t C, T* out) {
  parallel_for(0, C, 4096, [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j) out[j] = T(0);
    for (int64_t k = 0; k < chunks; ++k) {
      const T* p = part.data() + k * C;
      for (int64_t j = lo; j < hi; ++j) out[j] += p[j];
    }
  });
}

template <typename T, bool Centred, bool HasW>
void norm_backward_t(const GradCall& c, const NormSpec& sp, const Tensor& x, const Tensor& g, const Tensor& w,
                     std::vector<Tensor>& grads) {
  const Shape row = row_shape(x.shape(), normalized_ndim(c.attrs));
  const int64_t C = shape_numel(row), R = c.outputs.back().numel();
  const T inv_c = C > 0 ? T(1) / static_cast<T>(C) : T(0);
  const bool want_dx = c.needs_grad[0];
  const bool want_dw = sp.has_weight && c.needs_grad[sp.weight_index()];
  const bool want_db = sp.has_bias && c.needs_grad[sp.bias_index()];
  Tensor mean_t = Centred ? kernels::contig(c.outputs[1]) : Tensor();
  Tensor rstd_t = kernels::contig(c.outputs.back());
  const T* px = x.data<T>();
  const T* pg = g.data<T>();
  const T* pw = HasW ? w.data<T>() : nullptr;
  const T* pmean = Centred ? mean_t.data<T>() : nullptr;
  const T* prstd = rstd_t.data<T>();
  Tensor dx = want_dx ? Tensor::empty(x.shape(), x.dtype()) : Tensor();
  T* pdx = want_dx ? dx.data<T>() : nullptr;
  const int64_t grain = row_grain(C), chunks = (R + grain - 1) / grain;
  std::vector<T> dw_part(want_dw ? static_cast<size_t>(chunks * C) : 0, T(0));
  std::vector<T> db_part(want_db ? static_cast<size_t>(chunks * C) : 0, T(0));
  parallel_for(0, R, grain, [&](int64_t lo, int64_t hi) {
    const int64_t k = lo / grain;
    T* dw = want_dw ? dw_part.data() + k * C : nullptr;
    T* db = want_db ? db_part.data() + k * C : nullptr;
    for (int64_t r = lo; r < hi; ++r)
      norm_grad_row<T, Centred, HasW>(px + r * C, pg + r * C, pw, pdx ? pdx + r * C : nullptr, dw, db, C,
                                      r + 1 < R ? C : 0, inv_c, Centred ? pmean[r] : T(0), prstd[r]);
  });
  if (want_dx) grads[0] = dx;
  if (want_dw) {
    Tensor dw = Tensor::empty(row, x.dtype());
    combine_chunks(dw_part, chunks, C, dw.data<T>());
    grads[sp.weight_index()] = dw;
  }
  if (want_db) {
    Tensor db = Tensor::empty(row, x.dtype());
    combine_chunks(db_part, chunks, C, db.data<T>());
    grads[sp.bias_index()] = db;
  }
}

std::vector<Tensor> norm_backward(const GradCall& c) {
  NormSpec sp = spec_of(c.op.name, c.attrs);
  std::vector<Tensor> grads(c.input_metas.size());
  Tensor x = kernels::contig(c.inputs[0]);
  Tensor g = kernels::contig(c.grad_outputs[0]);
  Tensor w = sp.has_weight ? kernels::contig(c.inputs[sp.weight_index()]) : Tensor();
  TESSEL_DISPATCH_FLOAT(x.dtype(), c.op.name, [&]<typename T>() {
    with_flags(sp.has_weight, false, [&]<bool HasW, bool>() {
      if (sp.centred) norm_backward_t<T, true, HasW>(c, sp, x, g, w, grads);
      else norm_backward_t<T, false, HasW>(c, sp, x, g, w, grads);
    });
  });
  return grads;
}

// layer_norm: sum, centred square-sum, normalise and affine ≈ 8 FLOPs per element;
// rms_norm: square-sum, scale and weight ≈ 4.
Cost norm_cost(const MetaCall& c, std::span<const TensorMeta> out) {
  return kernels::elementwise_cost(c, out, c.op.name == "layer_norm" ? 8 : 4);
}

// SPMD rule: y[..., C...] keeps the shards of every dim but the normalised ones (the last
// normalized_ndim), which are whole; weight and bias replicated; Partial inputs reduced first
// (nonlinear). The row statistics (hidden outputs) are per local row.
SpmdDecision norm_spmd(const SpmdCall& c) {
  const int64_t nd = static_cast<int64_t>(c.inputs[0].shape.size());
  std::vector<int64_t> fixed;
  for (int64_t d = std::max<int64_t>(0, nd - normalized_ndim(c.attrs)); d < nd; ++d) fixed.push_back(d);
  return spmd::keep_shape_rule(c, fixed, spmd::Linearity::none);
}

}  // namespace

// Inputs x [+ weight] [+ bias] as the attrs say. Hidden outputs: layer_norm mean [R] and
// rstd [R]; rms_norm rstd [R]. Backward reads x, weight and the statistics.
const OpDef op_layer_norm{.name = "layer_norm", .num_inputs = -1, .num_hidden = 2, .infer = norm_infer,
                          .forward = norm_forward, .backward = norm_backward, .cost = norm_cost,
                          .spmd = norm_spmd, .save = {kAll, 0b110}, .autocast = AutocastPolicy::f32,
                          .attrs = "has_weight: bool = false, has_bias: bool = false, eps: float = 1e-5, "
                                    "normalized_ndim: int = 1"};
const OpDef op_rms_norm{.name = "rms_norm", .num_inputs = -1, .num_hidden = 1, .infer = norm_infer,
                        .forward = norm_forward, .backward = norm_backward, .cost = norm_cost, .spmd = norm_spmd,
                        .save = {kAll, 0b10}, .autocast = AutocastPolicy::f32,
                        .attrs = "has_weight: bool = false, eps: float = 1e-6"};

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, int64_t normalized_ndim) {
  std::vector<Tensor> in{x};
  if (weight.defined()) in.push_back(weight);
  if (bias.defined()) in.push_back(bias);
  Attrs attrs{{"has_weight", weight.defined()}, {"has_bias", bias.defined()}, {"eps", eps}};
  if (normalized_ndim != 1) attrs.set("normalized_ndim", normalized_ndim);
  return call_op1(op_layer_norm, std::move(in), std::move(attrs));
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  std::vector<Tensor> in{x};
  if (weight.defined()) in.push_back(weight);
  return call_op1(op_rms_norm, std::move(in), Attrs{{"has_weight", weight.defined()}, {"eps", eps}});
}

}  // namespace tessel
