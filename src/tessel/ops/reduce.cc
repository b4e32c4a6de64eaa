// Reductions (sum, mean, max, argmax, topk) and scans (cumsum). A reduction over a run of
// adjacent dims views the input as [outer, R, inner] and sums R in a fixed order, so results
// do not depend on the thread count; other dim sets reduce one run at a time.
//
// Shapes: out[outer, inner] = reduce_r x[outer, r, inner]
#include <algorithm>
#include <numeric>

#include "tessel/ops/dispatch.h"
#include "tessel/ops/elementwise.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ops/op_list.h"
#include "tessel/ops/reduce.h"
#include "tessel/ops/shape.h"
#include "tessel/sharding/spmd_rules.h"

namespace tessel {

using kernels::DimSplit;

namespace {

// Output shape of reducing `dims` (normalised, sorted).
Shape reduced_shape(const Shape& in, const std::vector<int64_t>& dims, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < static_cast<int64_t>(in.size()); ++d) {
    bool r = std::binary_search(dims.begin(), dims.end(), d);
    if (!r) out.push_back(in[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

std::vector<int64_t> reduce_dims(const MetaCall& c) {
  return normalize_dims(c.attrs.ints("dims"), static_cast<int64_t>(c.inputs[0].shape.size()), c.op.name);
}

std::vector<TensorMeta> reduce_infer(const MetaCall& c) {
  kernels::check_floating(c, 0);
  std::vector<int64_t> dims = reduce_dims(c);
  return {TensorMeta{reduced_shape(c.inputs[0].shape, dims, c.attrs.b("keepdim")), c.inputs[0].dtype, {}}};
}

// out[o, i] = Σ_r x[o, r, i] over a contiguous x viewed as [outer, R, inner].
template <typename T>
void sum_kernel(const T* x, T* out, DimSplit s) {
  if (s.inner == 1) {
    parallel_for(0, s.outer, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, s.size)), [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; ++o) {
        const T* row = x + o * s.size;
        T acc[8] = {};
        int64_t r = 0;
        for (; r + 8 <= s.size; r += 8)
          for (int k = 0; k < 8; ++k) acc[k] += row[r + k];
        T total = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        for (; r < s.size; ++r) total += row[r];
        out[o] = total;
      }
    });
    return;
  }
  parallel_for(0, s.outer * s.inner, 4096, [&](int64_t lo, int64_t hi) {
    // Flattened (o, i) range; rows of inner elements are processed a segment at a time.
    int64_t p = lo;
    while (p < hi) {
      int64_t o = p / s.inner, i0 = p % s.inner;
      int64_t i1 = std::min(s.inner, i0 + (hi - p));
      T* dst = out + o * s.inner;
      const T* src = x + o * s.size * s.inner;
      for (int64_t i = i0; i < i1; ++i) dst[i] = T(0);
      for (int64_t r = 0; r < s.size; ++r)
        for (int64_t i = i0; i < i1; ++i) dst[i] += src[r * s.inner + i];
      p += i1 - i0;
    }
  });
}

// Sums the dims in `dims` (sorted), keeping them as size 1.
Tensor sum_keepdim(const Tensor& x, const std::vector<int64_t>& dims) {
  Tensor cur = kernels::contig(x);
  // Runs of adjacent dims, reduced last run first.
  size_t i = dims.size();
  while (i > 0) {
    size_t j = i - 1;
    while (j > 0 && dims[j - 1] + 1 == dims[j]) --j;
    int64_t d0 = dims[j], d1 = dims[i - 1];
    DimSplit s;
    for (int64_t d = 0; d < cur.dim(); ++d) {
      if (d < d0) s.outer *= cur.size(d);
      else if (d <= d1) s.size *= cur.size(d);
      else s.inner *= cur.size(d);
    }
    Shape out_shape = cur.shape();
    for (int64_t d = d0; d <= d1; ++d) out_shape[d] = 1;
    Tensor out = Tensor::empty(out_shape, cur.dtype());
    TESSEL_DISPATCH_FLOAT(cur.dtype(), "sum", [&]<typename T>() { sum_kernel<T>(cur.data<T>(), out.data<T>(), s); });
    cur = out;
    i = j;
  }
  return cur;
}

int64_t reduced_count(const Shape& in, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= in[d];
  return n;
}

std::vector<Tensor> sum_forward(const OpCall& c) {
  std::vector<int64_t> dims = normalize_dims(c.attrs.ints("dims"), c.inputs[0].dim(), "sum");
  return {view::reshape(sum_keepdim(c.inputs[0], dims), c.outputs[0].shape)};
}
std::vector<Tensor> mean_forward(const OpCall& c) {
  std::vector<int64_t> dims = normalize_dims(c.attrs.ints("dims"), c.inputs[0].dim(), "mean");
  Tensor s = sum_keepdim(c.inputs[0], dims);
  // A sharded mean divides its local sum by the global count (attr "count", set by the rule).
  int64_t n = c.attrs.has("count") ? c.attrs.i("count") : reduced_count(c.inputs[0].shape(), dims);
  Tensor out = view::reshape(s, c.outputs[0].shape);
  TESSEL_DISPATCH_FLOAT(out.dtype(), "mean", [&]<typename T>() {
    T* p = out.data<T>();
    T inv = n == 0 ? T(NAN) : T(1) / static_cast<T>(n);
    for (int64_t k = 0; k < out.numel(); ++k) p[k] = n == 0 ? T(NAN) : p[k] * inv;
  });
  return {out};
}

// The output gradient broadcast back over the reduced dims.
Tensor expand_back(const Tensor& g, const TensorMeta& in, const std::vector<int64_t>& dims) {
  Tensor k = reshape(g, reduced_shape(in.shape, dims, true));
  return contiguous(expand(k, in.shape));
}

std::vector<Tensor> sum_backward(const GradCall& g) {
  const TensorMeta& in = g.input_metas[0];
  std::vector<int64_t> dims = normalize_dims(g.attrs.ints("dims"), static_cast<int64_t>(in.shape.size()), "sum");
  return {expand_back(g.grad_outputs[0], in, dims)};
}
std::vector<Tensor> mean_backward(const GradCall& g) {
  const TensorMeta& in = g.input_metas[0];
  std::vector<int64_t> dims = normalize_dims(g.attrs.ints("dims"), static_cast<int64_t>(in.shape.size()), "mean");
  int64_t n = g.attrs.has("count") ? g.attrs.i("count") : reduced_count(in.shape, dims);
  return {scale(expand_back(g.grad_outputs[0], in, dims), 1.0 / static_cast<double>(std::max<int64_t>(n, 1)))};
}

Cost reduce_cost(const MetaCall& c, std::span<const TensorMeta> out) {
  return Cost{static_cast<double>(c.inputs[0].numel()), kernels::io_bytes(c, out)};
}

// ---------------------------------------------------------------- max (values; first max gets the gradient)

// x permuted so the reduced dims come last, as a contiguous [outer, R] matrix.
Tensor rows_last(const Tensor& x, const std::vector<int64_t>& dims) {
  std::vector<int64_t> order;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!std::binary_search(dims.begin(), dims.end(), d)) order.push_back(d);
  order.insert(order.end(), dims.begin(), dims.end());
  return view::contiguous(view::permute(x, order));
}

// max and min share everything but the comparison; `c.op.name` tells them apart.
std::vector<TensorMeta> max_infer(const MetaCall& c) {
  kernels::check_floating(c, 0);
  std::vector<int64_t> dims = reduce_dims(c);
  const TensorMeta& x = c.inputs[0];
  int64_t R = reduced_count(x.shape, dims);
  TESSEL_CHECK(R > 0, "{}: cannot reduce over empty dims [{}] of {}", c.op.name, fmt::join(dims, ","), x.str());
  Shape out = reduced_shape(x.shape, dims, c.attrs.b("keepdim"));
  return {TensorMeta{out, x.dtype, {}}, TensorMeta{{shape_numel(out)}, DType::i64, {}}};
}

std::vector<Tensor> max_forward(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  std::vector<int64_t> dims = normalize_dims(c.attrs.ints("dims"), x.dim(), c.op.name);
  const bool smallest = c.op.name == "min";
  Tensor rows = rows_last(x, dims);
  int64_t R = reduced_count(x.shape(), dims), outer = x.numel() / R;
  Tensor out = Tensor::empty(c.outputs[0]);
  Tensor idx = Tensor::empty(c.outputs[1]);
  int64_t* pi = idx.data<int64_t>();
  TESSEL_DISPATCH_FLOAT(x.dtype(), "max", [&]<typename T>() {
    const T* px = rows.data<T>();
    T* po = out.data<T>();
    parallel_for(0, outer, 64, [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; ++o) {
        const T* row = px + o * R;
        int64_t best = 0;
        for (int64_t r = 1; r < R; ++r)
          if ((smallest ? row[r] < row[best] : row[r] > row[best]) || (std::isnan(row[r]) && !std::isnan(row[best])))
            best = r;
        po[o] = row[best];
        pi[o] = best;
      }
    });
  });
  return {out, idx};
}

std::vector<Tensor> max_backward(const GradCall& g) {
  const TensorMeta& in = g.input_metas[0];
  std::vector<int64_t> dims = normalize_dims(g.attrs.ints("dims"), static_cast<int64_t>(in.shape.size()), "max");
  const Tensor& idx = g.outputs[1];
  int64_t R = reduced_count(in.shape, dims), outer = in.numel() / R;
  // Scatter into the permuted [outer, R] layout, then permute back.
  std::vector<int64_t> order;
  Shape permuted;
  for (int64_t d = 0; d < static_cast<int64_t>(in.shape.size()); ++d)
    if (!std::binary_search(dims.begin(), dims.end(), d)) order.push_back(d);
  order.insert(order.end(), dims.begin(), dims.end());
  for (int64_t d : order) permuted.push_back(in.shape[d]);
  Tensor go = kernels::contig(g.grad_outputs[0]);
  Tensor rows = Tensor::zeros(permuted, go.dtype());
  const int64_t* pi = idx.data<int64_t>();
  TESSEL_DISPATCH_FLOAT(go.dtype(), "max", [&]<typename T>() {
    const T* pg = go.data<T>();
    T* pr = rows.data<T>();
    for (int64_t o = 0; o < outer; ++o) pr[o * R + pi[o]] = pg[o];
  });
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[order[i]] = static_cast<int64_t>(i);
  return {view::contiguous(view::permute(rows, inverse))};
}

// ---------------------------------------------------------------- argmax

std::vector<TensorMeta> argmax_infer(const MetaCall& c) {
  const TensorMeta& x = c.inputs[0];
  TESSEL_CHECK(x.dtype != DType::b8, "argmax: bool input {}", x.str());
  int64_t d = normalize_dim(c.attrs.i("dim"), static_cast<int64_t>(x.shape.size()), "argmax");
  TESSEL_CHECK(x.shape[d] > 0, "argmax: dim {} of {} is empty", d, x.str());
  return {TensorMeta{reduced_shape(x.shape, {d}, c.attrs.b("keepdim")), DType::i64, {}}};
}

std::vector<Tensor> argmax_forward(const OpCall& c) {
  Tensor x = kernels::contig(c.inputs[0]);
  int64_t d = normalize_dim(c.attrs.i("dim"), x.dim(), "argmax");
  DimSplit s = kernels::split_at(x.shape(), d);
  Tensor out = Tensor::empty(c.outputs[0]);
  int64_t* po = out.data<int64_t>();
  TESSEL_DISPATCH_ALL(x.dtype(), "argmax", [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) {
      const T* px = x.data<T>();
      auto val = [](T v) {
        if constexpr (std::is_same_v<T, BFloat16>) return static_cast<double>(static_cast<float>(v));
        else return static_cast<double>(v);
      };
      for (int64_t o = 0; o < s.outer; ++o)
        for (int64_t i = 0; i < s.inner; ++i) {
          int64_t best = 0;
          double bv = val(px[o * s.size * s.inner + i]);
          for (int64_t r = 1; r < s.size; ++r) {
            double v = val(px[(o * s.size + r) * s.inner + i]);
            if (v > bv || (std::isnan(v) && !std::isnan(bv))) {
              best = r;
              bv = v;
            }
          }
          po[o * s.inner + i] = best;
        }
    }
  });
  return {out};
}

// ---------------------------------------------------------------- topk

std::vector<TensorMeta> topk_infer(const MetaCall& c) {
  kernels::check_floating(c, 0);
  const TensorMeta& x = c.inputs[0];
  TESSEL_CHECK(!x.shape.empty(), "topk: 0-dim input");
  int64_t d = normalize_dim(c.attrs.i("dim"), static_cast<int64_t>(x.shape.size()), "topk");
  int64_t k = c.attrs.i("k");
  TESSEL_CHECK(k >= 0 && k <= x.shape[d], "topk: k={} out of range for dim {} of size {}", k, d, x.shape[d]);
  Shape out = x.shape;
  out[d] = k;
  return {TensorMeta{out, x.dtype, {}}, TensorMeta{out, DType::i64, {}}};
}

std::vector<Tensor> topk_forward(const OpCall& c) {
  Tensor x = kernels::contig(c.inputs[0]);
  int64_t d = normalize_dim(c.attrs.i("dim"), x.dim(), "topk");
  int64_t k = c.attrs.i("k");
  bool largest = c.attrs.b("largest");
  DimSplit s = kernels::split_at(x.shape(), d);
  Tensor values = Tensor::empty(c.outputs[0]);
  Tensor indices = Tensor::empty(c.outputs[1]);
  int64_t* pi = indices.data<int64_t>();
  TESSEL_DISPATCH_FLOAT(x.dtype(), "topk", [&]<typename T>() {
    const T* px = x.data<T>();
    T* pv = values.data<T>();
    parallel_for(0, s.outer * s.inner, 16, [&](int64_t lo, int64_t hi) {
      std::vector<int64_t> order(static_cast<size_t>(s.size));
      for (int64_t p = lo; p < hi; ++p) {
        int64_t o = p / s.inner, i = p % s.inner;
        auto at = [&](int64_t r) { return px[(o * s.size + r) * s.inner + i]; };
        std::iota(order.begin(), order.end(), 0);
        auto before = [&](int64_t a, int64_t b) {
          T va = at(a), vb = at(b);
          if (va != vb) return largest ? va > vb : va < vb;
          return a < b;
        };
        std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
        for (int64_t j = 0; j < k; ++j) {
          pv[(o * k + j) * s.inner + i] = at(order[j]);
          pi[(o * k + j) * s.inner + i] = order[j];
        }
      }
    });
  });
  return {values, indices};
}

// d x[..., idx[j], ...] += g[..., j, ...].
std::vector<Tensor> topk_backward(const GradCall& g) {
  const TensorMeta& in = g.input_metas[0];
  int64_t d = normalize_dim(g.attrs.i("dim"), static_cast<int64_t>(in.shape.size()), "topk");
  int64_t k = g.attrs.i("k");
  DimSplit s = kernels::split_at(in.shape, d);
  Tensor go = g.grad_outputs[0].defined() ? kernels::contig(g.grad_outputs[0]) : Tensor::zeros(g.outputs[0].shape(), in.dtype);
  Tensor dx = Tensor::zeros(in.shape, go.dtype());
  const int64_t* pi = g.outputs[1].data<int64_t>();
  TESSEL_DISPATCH_FLOAT(go.dtype(), "topk", [&]<typename T>() {
    const T* pg = go.data<T>();
    T* pd = dx.data<T>();
    for (int64_t o = 0; o < s.outer; ++o)
      for (int64_t j = 0; j < k; ++j)
        for (int64_t i = 0; i < s.inner; ++i) {
          int64_t src = (o * k + j) * s.inner + i;
          pd[(o * s.size + pi[src]) * s.inner + i] += pg[src];
        }
  });
  return {dx};
}

// ---------------------------------------------------------------- cumsum

// out[o, r, i] = Σ_{r' <= r} x[o, r', i] (or r' >= r when reverse).
template <typename T>
void cumsum_kernel(const T* x, T* out, DimSplit s, bool reverse) {
  parallel_for(0, s.outer, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t o = lo; o < hi; ++o) {
      const T* src = x + o * s.size * s.inner;
      T* dst = out + o * s.size * s.inner;
      for (int64_t step = 0; step < s.size; ++step) {
        int64_t r = reverse ? s.size - 1 - step : step;
        int64_t prev = reverse ? r + 1 : r - 1;
        for (int64_t i = 0; i < s.inner; ++i)
          dst[r * s.inner + i] = src[r * s.inner + i] + (step == 0 ? T(0) : dst[prev * s.inner + i]);
      }
    }
  });
}

Tensor cumsum_raw(const Tensor& x, int64_t dim, bool reverse) {
  Tensor xc = kernels::contig(x);
  Tensor out = Tensor::empty(xc.shape(), xc.dtype());
  DimSplit s = kernels::split_at(xc.shape(), normalize_dim(dim, xc.dim(), "cumsum"));
  TESSEL_DISPATCH_FLOAT(xc.dtype(), "cumsum", [&]<typename T>() { cumsum_kernel<T>(xc.data<T>(), out.data<T>(), s, reverse); });
  return out;
}

std::vector<TensorMeta> cumsum_infer(const MetaCall& c) {
  kernels::check_floating(c, 0);
  TESSEL_CHECK(!c.inputs[0].shape.empty(), "cumsum: 0-dim input");
  normalize_dim(c.attrs.i("dim"), static_cast<int64_t>(c.inputs[0].shape.size()), "cumsum");
  return {c.inputs[0]};
}
std::vector<Tensor> cumsum_forward(const OpCall& c) { return {cumsum_raw(c.inputs[0], c.attrs.i("dim"), false)}; }
// The gradient of a prefix sum is the suffix sum of the output gradient.
std::vector<Tensor> cumsum_backward(const GradCall& g) { return {cumsum_raw(g.grad_outputs[0], g.attrs.i("dim"), true)}; }

// ---------------------------------------------------------------- SPMD rules
// sum/mean: a sharded reduced dim gives Partial(sum) (mean divides by the global count);
// Partial(sum) inputs pass through. max: a sharded reduced dim gives Partial(max) (below);
// argmax and topk: merged across ranks. cumsum needs its dim whole, and other dims keep their
// shards.

std::vector<int64_t> rule_dims(const SpmdCall& c, const char* key) {
  int64_t r = static_cast<int64_t>(c.inputs[0].shape.size());
  if (std::string_view(key) == "dims") return normalize_dims(c.attrs.ints("dims"), r, c.op);
  return {normalize_dim(c.attrs.i(key), r, c.op)};
}

SpmdDecision sum_spmd(const SpmdCall& c) {
  return spmd::reduction_rule(c, rule_dims(c, "dims"), c.attrs.b("keepdim"), ReduceOp::sum);
}

SpmdDecision mean_spmd(const SpmdCall& c) {
  std::vector<int64_t> dims = rule_dims(c, "dims");
  SpmdDecision d = spmd::reduction_rule(c, dims, c.attrs.b("keepdim"), ReduceOp::sum);
  Attrs local = c.attrs;
  local.set("count", reduced_count(c.inputs[0].shape, dims));
  d.local_attrs = local;
  return d;
}

// Output keeps the placements of the kept dims; `whole` dims are replicated first.
SpmdDecision whole_dims_rule(const SpmdCall& c, const std::vector<int64_t>& whole, bool keepdim, spmd::Linearity lin,
                             size_t outputs) {
  spmd::LabelRule r;
  r.linearity = lin;
  std::string in;
  const Shape& s = c.inputs[0].shape;
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
    bool w = std::find(whole.begin(), whole.end(), d) != whole.end();
    char L = w ? '.' : static_cast<char>('a' + d);
    in += L;
    if (!w || keepdim) r.output += L;
  }
  r.inputs.push_back(in);
  SpmdDecision dec = spmd::label_rule(c, r);
  dec.outputs.resize(outputs, dec.outputs[0]);
  return dec;
}

// max (min): a sharded reduced dim gives Partial(max) (Partial(min)) — the dist layer's own
// implementation (dist/custom_ops.cc) then routes the gradient to the one rank holding the
// selected element; every other layout runs the local kernel as usual.
SpmdDecision max_spmd(const SpmdCall& c) {
  const std::vector<int64_t> dims = rule_dims(c, "dims");
  spmd::LabelRule r;
  r.linearity = spmd::Linearity::none;
  r.contracted = c.op == "min" ? ReduceOp::min : ReduceOp::max;
  const Shape& s = c.inputs[0].shape;
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
    const char L = static_cast<char>('a' + d);
    const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    r.inputs.resize(1);
    r.inputs[0] += L;
    if (!reduced) r.output += L;
    else if (c.attrs.b("keepdim")) r.output += '.';
  }
  if (c.attrs.b("keepdim")) r.output_shape = spmd::keepdim_shape(s, dims);
  SpmdDecision dec = spmd::label_rule(c, r);
  for (const Placement& p : dec.inputs[0])
    dec.custom = dec.custom || (p.is_shard() && std::find(dims.begin(), dims.end(), p.dim) != dims.end());
  return dec;
}
// argmax: a sharded dim is merged by the dist layer (dist/custom_ops.cc: each rank's top-1,
// then the maximum and its first position across ranks), the index replicated there; priced as
// a max's Partial output (the merge reduces output-sized values).
// The rule of a selection along `dim` that the dist layer merges across the ranks sharding it
// (argmax, topk): labelled like a max over the dim, its Partial output priced as the merge
// (`owed_scale` halves of an output-sized all_reduce) and then replicated, `outputs` alike.
// `kept` the output's size along the dim (topk's k), 0 when the dim is dropped (or kept as 1
// with keepdim).
SpmdDecision merged_selection_rule(const SpmdCall& c, int64_t dim, int64_t kept, bool keepdim, size_t outputs) {
  spmd::LabelRule r;
  r.linearity = spmd::Linearity::none;
  r.contracted = ReduceOp::max;
  r.owed_scale = 4;
  if (kept > 0) {
    r.output_shape = c.inputs[0].shape;
    r.output_shape[static_cast<size_t>(dim)] = kept;
  }
  r.inputs.resize(1);
  for (int64_t d = 0; d < static_cast<int64_t>(c.inputs[0].shape.size()); ++d) {
    const char L = static_cast<char>('a' + d);
    r.inputs[0] += L;
    if (d != dim) r.output += L;
    else if (kept > 0 || keepdim) r.output += '.';
  }
  SpmdDecision dec = spmd::label_rule(c, r);
  for (const Placement& p : dec.inputs[0]) dec.custom = dec.custom || p.is_shard(dim);
  for (Placement& p : dec.outputs[0])
    if (p.is_partial()) p = Replicate();
  dec.outputs.resize(outputs, dec.outputs[0]);
  return dec;
}
SpmdDecision argmax_spmd(const SpmdCall& c) {
  const int64_t dim = rule_dims(c, "dim")[0];
  if (c.inputs[0].dtype == DType::b8)  // infer rejects it
    return whole_dims_rule(c, {dim}, c.attrs.b("keepdim"), spmd::Linearity::none, 1);
  return merged_selection_rule(c, dim, 0, c.attrs.b("keepdim"), 1);  // the merge: two all_reduces of the output
}
// topk: a sharded dim is merged by the dist layer (dist/custom_ops.cc: each rank's top k, then
// the best k of the gathered candidates), both outputs replicated there; priced like argmax's
// merge (the candidates are output-sized).
SpmdDecision topk_spmd(const SpmdCall& c) {
  return merged_selection_rule(c, rule_dims(c, "dim")[0], c.attrs.i("k"), false, 2);
}
SpmdDecision cumsum_spmd(const SpmdCall& c) {
  return whole_dims_rule(c, rule_dims(c, "dim"), true, spmd::Linearity::single, 1);
}

}  // namespace

const OpDef op_sum{.name = "sum", .num_inputs = 1, .infer = reduce_infer, .forward = sum_forward,
                   .backward = sum_backward, .cost = reduce_cost, .spmd = sum_spmd,
                   .autocast = AutocastPolicy::f32,
                   .attrs = "dims: ints = [], keepdim: bool = false"};
const OpDef op_mean{.name = "mean", .num_inputs = 1, .infer = reduce_infer, .forward = mean_forward,
                    .backward = mean_backward, .cost = reduce_cost, .spmd = mean_spmd,
                    .autocast = AutocastPolicy::f32,
                    .attrs = "dims: ints = [], keepdim: bool = false, count: int?"};
const OpDef op_max{.name = "max", .num_inputs = 1, .num_hidden = 1, .infer = max_infer, .forward = max_forward,
                   .backward = max_backward, .cost = reduce_cost, .spmd = max_spmd, .save = {0, 0b10},
                   .attrs = "dims: ints = [], keepdim: bool = false"};
const OpDef op_min{.name = "min", .num_inputs = 1, .num_hidden = 1, .infer = max_infer, .forward = max_forward,
                   .backward = max_backward, .cost = reduce_cost, .spmd = max_spmd, .save = {0, 0b10},
                   .attrs = "dims: ints = [], keepdim: bool = false"};
const OpDef op_argmax{.name = "argmax", .num_inputs = 1, .infer = argmax_infer, .forward = argmax_forward,
                      .cost = reduce_cost, .spmd = argmax_spmd, .bf16_via_f32 = false,
                      .attrs = "dim: int, keepdim: bool = false"};
const OpDef op_topk{.name = "topk", .num_inputs = 1, .num_outputs = 2, .infer = topk_infer, .forward = topk_forward,
                    .backward = topk_backward, .cost = reduce_cost, .spmd = topk_spmd, .save = {0, 0b10},
                    .attrs = "k: int, dim: int = -1, largest: bool = true"};
const OpDef op_cumsum{.name = "cumsum", .num_inputs = 1, .infer = cumsum_infer, .forward = cumsum_forward,
                      .backward = cumsum_backward, .cost = reduce_cost, .spmd = cumsum_spmd,
                      .autocast = AutocastPolicy::f32,
                      .attrs = "dim: int"};

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return call_op1(op_sum, {x}, Attrs{{"dims", dims}, {"keepdim", keepdim}});
}
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return call_op1(op_mean, {x}, Attrs{{"dims", dims}, {"keepdim", keepdim}});
}
Tensor max(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return call_op1(op_max, {x}, Attrs{{"dims", dims}, {"keepdim", keepdim}});
}
Tensor min(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return call_op1(op_min, {x}, Attrs{{"dims", dims}, {"keepdim", keepdim}});
}
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return call_op1(op_argmax, {x}, Attrs{{"dim", dim}, {"keepdim", keepdim}});
}
std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim, bool largest) {
  std::vector<Tensor> out = call_op(op_topk, {x}, Attrs{{"k", k}, {"dim", dim}, {"largest", largest}});
  return {out[0], out[1]};
}
Tensor cumsum(const Tensor& x, int64_t dim) { return call_op1(op_cumsum, {x}, Attrs{{"dim", dim}}); }

}  // namespace tessel
