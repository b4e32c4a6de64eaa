// Shape ops: reshape, permute, expand, contiguous, cat, split, slice. Outputs are views of
// the input where the layout allows (reshape, permute, expand, split, slice), so they cost no
// copy; the compositions (transpose, stack, chunk, narrow, flatten, (un)squeeze) are built
// from these in shape.h/below.
#include "tessel/ops/shape.h"

#include <numeric>
#include <optional>

#include "tessel/ops/dispatch.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ops/op_list.h"
#include "tessel/sharding/spmd_rules.h"

namespace tessel {

namespace {

Cost view_cost(const MetaCall&, std::span<const TensorMeta>) { return Cost{}; }
Cost copy_cost(const MetaCall& c, std::span<const TensorMeta> out) { return Cost{0, kernels::io_bytes(c, out)}; }

// ---------------------------------------------------------------- reshape

std::vector<TensorMeta> reshape_infer(const MetaCall& c) {
  const TensorMeta& x = c.inputs[0];
  return {TensorMeta{view::infer_reshape(c.attrs.ints("shape"), x.numel(), "reshape"), x.dtype, {}}};
}
std::vector<Tensor> reshape_forward(const OpCall& c) { return {view::reshape(c.inputs[0], c.outputs[0].shape)}; }
std::vector<Tensor> reshape_backward(const GradCall& g) { return {reshape(g.grad_outputs[0], g.input_metas[0].shape)}; }

// ---------------------------------------------------------------- permute

std::vector<TensorMeta> permute_infer(const MetaCall& c) {
  const TensorMeta& x = c.inputs[0];
  const std::vector<int64_t>& dims = c.attrs.ints("dims");
  TESSEL_CHECK(dims.size() == x.shape.size(), "permute: {} dims [{}] for input {}", dims.size(), fmt::join(dims, ","),
               x.str());
  Shape out(dims.size());
  std::vector<bool> seen(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = normalize_dim(dims[i], static_cast<int64_t>(dims.size()), "permute");
    TESSEL_CHECK(!seen[d], "permute: dim {} repeats in [{}]", d, fmt::join(dims, ","));
    seen[d] = true;
    out[i] = x.shape[d];
  }
  return {TensorMeta{out, x.dtype, {}}};
}
std::vector<Tensor> permute_forward(const OpCall& c) { return {view::permute(c.inputs[0], c.attrs.ints("dims"))}; }
std::vector<Tensor> permute_backward(const GradCall& g) {
  const std::vector<int64_t>& dims = g.attrs.ints("dims");
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i)
    inverse[normalize_dim(dims[i], static_cast<int64_t>(dims.size()), "permute")] = static_cast<int64_t>(i);
  return {permute(g.grad_outputs[0], inverse)};
}

// ---------------------------------------------------------------- expand

std::vector<TensorMeta> expand_infer(const MetaCall& c) {
  const TensorMeta& x = c.inputs[0];
  Shape shape = c.attrs.ints("shape");
  TESSEL_CHECK(shape.size() >= x.shape.size(), "expand: cannot expand {} to fewer dims {}", shape_str(x.shape),
               shape_str(shape));
  size_t lead = shape.size() - x.shape.size();
  for (size_t i = 0; i < x.shape.size(); ++i) {
    if (shape[lead + i] == -1) shape[lead + i] = x.shape[i];
    TESSEL_CHECK(x.shape[i] == shape[lead + i] || x.shape[i] == 1, "expand: cannot expand {} to {} (dim {}: {} vs {})",
                 shape_str(x.shape), shape_str(shape), lead + i, x.shape[i], shape[lead + i]);
  }
  return {TensorMeta{shape, x.dtype, {}}};
}
std::vector<Tensor> expand_forward(const OpCall& c) { return {view::expand(c.inputs[0], c.outputs[0].shape)}; }
std::vector<Tensor> expand_backward(const GradCall& g) { return {kernels::sum_to(g.grad_outputs[0], g.input_metas[0].shape)}; }

// ---------------------------------------------------------------- contiguous

std::vector<TensorMeta> same_infer(const MetaCall& c) { return {c.inputs[0]}; }
std::vector<Tensor> contiguous_forward(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  return {x.is_contiguous() ? x.detach() : view::clone(x)};
}
std::vector<Tensor> identity_backward(const GradCall& g) { return {g.grad_outputs[0]}; }

// ---------------------------------------------------------------- cat

std::vector<TensorMeta> cat_infer(const MetaCall& c) {
  TESSEL_CHECK(!c.inputs.empty(), "cat: needs at least one tensor");
  const TensorMeta& first = c.inputs[0];
  int64_t nd = static_cast<int64_t>(first.shape.size());
  TESSEL_CHECK(nd > 0, "cat: cannot concatenate 0-dim tensors (inputs: {})", kernels::inputs_str(c));
  int64_t d = normalize_dim(c.attrs.i("dim"), nd, "cat");
  Shape out = first.shape;
  out[d] = 0;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const TensorMeta& m = c.inputs[i];
    kernels::check_same_dtype(c, 0, i);
    bool ok = static_cast<int64_t>(m.shape.size()) == nd;
    for (int64_t k = 0; ok && k < nd; ++k) ok = k == d || m.shape[k] == first.shape[k];
    TESSEL_CHECK(ok, "cat: input {} has shape {} but input 0 has {}; all dims but {} must match", i, shape_str(m.shape),
                 shape_str(first.shape), d);
    out[d] += m.shape[d];
  }
  return {TensorMeta{out, first.dtype, {}}};
}
std::vector<Tensor> cat_forward(const OpCall& c) {
  Tensor out = Tensor::empty(c.outputs[0]);
  int64_t d = normalize_dim(c.attrs.i("dim"), out.dim(), "cat");
  int64_t at = 0;
  for (const Tensor& x : c.inputs) {
    view::copy(view::slice(out, d, at, at + x.size(d)), x);
    at += x.size(d);
  }
  return {out};
}
std::vector<Tensor> cat_backward(const GradCall& g) {
  const Tensor& go = g.grad_outputs[0];
  int64_t d = normalize_dim(g.attrs.i("dim"), go.dim(), "cat");
  std::vector<Tensor> grads;
  int64_t at = 0;
  for (const TensorMeta& m : g.input_metas) {
    grads.push_back(slice(go, d, at, at + m.shape[d]));
    at += m.shape[d];
  }
  return grads;
}

// ---------------------------------------------------------------- split

std::vector<TensorMeta> split_infer(const MetaCall& c) {
  const TensorMeta& x = c.inputs[0];
  TESSEL_CHECK(!x.shape.empty(), "split: cannot split a 0-dim tensor");
  int64_t d = normalize_dim(c.attrs.i("dim"), static_cast<int64_t>(x.shape.size()), "split");
  const std::vector<int64_t>& sizes = c.attrs.ints("sizes");
  int64_t total = 0;
  for (int64_t s : sizes) {
    TESSEL_CHECK(s >= 0, "split: negative size in [{}]", fmt::join(sizes, ","));
    total += s;
  }
  TESSEL_CHECK(total == x.shape[d], "split: sizes [{}] sum to {} but dim {} of {} has size {}", fmt::join(sizes, ","),
               total, d, shape_str(x.shape), x.shape[d]);
  std::vector<TensorMeta> out;
  for (int64_t s : sizes) {
    Shape shape = x.shape;
    shape[d] = s;
    out.push_back(TensorMeta{shape, x.dtype, {}});
  }
  return out;
}
std::vector<Tensor> split_forward(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  int64_t d = normalize_dim(c.attrs.i("dim"), x.dim(), "split");
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t s : c.attrs.ints("sizes")) {
    out.push_back(view::slice(x, d, at, at + s));
    at += s;
  }
  return out;
}

// The gradient parts as one view of the input's shape when they already lie side by side in
// one buffer, the way split cut the input (sdpa writes the heads' gradients of a fused qkv
// projection so): then the backward copies nothing. Empty otherwise.
std::optional<Tensor> joined_in_place(const GradCall& g, int64_t d) {
  const Tensor& first = g.grad_outputs[0];
  if (!first.defined()) return std::nullopt;
  int64_t at = 0;
  for (const Tensor& p : g.grad_outputs) {
    if (!p.defined() || p.storage() != first.storage() || p.dtype() != first.dtype() || p.strides() != first.strides() ||
        p.offset() != first.offset() + at * first.stride(d))
      return std::nullopt;
    at += p.size(d);
  }
  if (at > 1 && first.stride(d) == 0) return std::nullopt;  // the parts alias one another
  return view::as_strided(first, g.input_metas[0].shape, first.strides(), first.offset());
}

std::vector<Tensor> split_backward(const GradCall& g) {
  int64_t d = normalize_dim(g.attrs.i("dim"), static_cast<int64_t>(g.input_metas[0].shape.size()), "split");
  if (auto joined = joined_in_place(g, d)) return {*joined};
  std::vector<Tensor> parts;
  const std::vector<int64_t>& sizes = g.attrs.ints("sizes");
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (g.grad_outputs[i].defined()) {
      parts.push_back(g.grad_outputs[i]);
    } else {
      Shape shape = g.input_metas[0].shape;
      shape[d] = sizes[i];
      parts.push_back(Tensor::zeros(shape, g.input_metas[0].dtype));
    }
  }
  return {cat(parts, d)};
}

// ---------------------------------------------------------------- slice

struct SliceArgs {
  int64_t dim, start, end, step;
};
SliceArgs slice_args(const Shape& shape, const Attrs& a) {
  TESSEL_CHECK(!shape.empty(), "slice: cannot slice a 0-dim tensor");
  int64_t d = normalize_dim(a.i("dim"), static_cast<int64_t>(shape.size()), "slice");
  int64_t n = shape[d], start = a.i("start"), end = a.i("end"), step = a.i_or("step", 1);
  TESSEL_CHECK(step > 0, "slice: step must be positive, got {}", step);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  return {d, start, end, step};
}
std::vector<TensorMeta> slice_infer(const MetaCall& c) {
  const TensorMeta& x = c.inputs[0];
  SliceArgs s = slice_args(x.shape, c.attrs);
  Shape out = x.shape;
  out[s.dim] = (s.end - s.start + s.step - 1) / s.step;
  return {TensorMeta{out, x.dtype, {}}};
}
std::vector<Tensor> slice_forward(const OpCall& c) {
  SliceArgs s = slice_args(c.inputs[0].shape(), c.attrs);
  return {view::slice(c.inputs[0], s.dim, s.start, s.end, s.step)};
}
std::vector<Tensor> slice_backward(const GradCall& g) {
  SliceArgs s = slice_args(g.input_metas[0].shape, g.attrs);
  Tensor dx = Tensor::zeros(g.input_metas[0].shape, g.grad_outputs[0].dtype());
  view::copy(view::slice(dx, s.dim, s.start, s.end, s.step), g.grad_outputs[0]);
  return {dx};
}

// ---------------------------------------------------------------- SPMD rules
// Shape ops only move elements, so a pending sum/avg (Partial) passes through every one of
// them (cat: when all its inputs are Partial alike). Shards follow the dims they move with:
//   reshape    x[in] -> out[out]: dims grouped into runs of equal products (size-1 dims
//              aside); a shard of a group's first input dim survives onto the group's first
//              output dim when both split into the same element ranges (e.g. [6, 4] ->
//              [24]: 6 divisible by the shard count; [6] -> [2, 3] on 2 ranks: the shard
//              is the outermost factor), a shard of a size-1 dim onto the output's size-1 dim
//              of the same rank among them; every other shard is gathered first;
//   permute    S(dims[j]) -> S(j);
//   expand     broadcast dims (size 1 -> n, new leading dims) replicated, others kept;
//   contiguous identity;
//   cat        the cat dim replicated in every input, the others shared by all inputs;
//   split      the split dim replicated, each output keeps the input's placements;
//   slice      the slice dim replicated unless the slice is the whole dim (step 1).
// reshape and expand run the local kernel with the shape of this rank's output piece.

bool linear_partial(const Placement& p) {
  return p.is_partial() && (p.reduce == ReduceOp::sum || p.reduce == ReduceOp::avg);
}

// Input 0's placements with shards of `whole` dims, and Partials other than sum/avg, replaced by R.
Placements keep_except(const SpmdCall& c, const std::vector<int64_t>& whole) {
  Placements p = spmd::without(c.input_attrs[0].placements, whole, /*drop_partial=*/false);
  for (Placement& x : p)
    if (x.is_partial() && !linear_partial(x)) x = Replicate();
  return p;
}

// The call's attrs with `key` set to the shape of this rank's piece of an output `shape` placed `out`.
Attrs with_local_shape(const SpmdCall& c, const char* key, const Shape& shape, const Placements& out) {
  Attrs a = c.attrs;
  a.set(key, DistAttr(c.mesh(), out).local_shape(shape, c.rank));
  return a;
}

// Input and output dims of a reshape (size-1 dims left out) whose products are equal: the
// elements of a group stay together, in order.
struct DimGroup {
  std::vector<int64_t> in, out;
};
std::vector<DimGroup> reshape_groups(const Shape& in, const Shape& out) {
  std::vector<int64_t> a, b;
  for (size_t d = 0; d < in.size(); ++d)
    if (in[d] != 1) a.push_back(static_cast<int64_t>(d));
  for (size_t d = 0; d < out.size(); ++d)
    if (out[d] != 1) b.push_back(static_cast<int64_t>(d));
  std::vector<DimGroup> groups;
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    DimGroup g;
    int64_t pa = 1, pb = 1;
    do {
      if (pa <= pb && i < a.size()) {
        pa *= in[a[i]];
        g.in.push_back(a[i++]);
      } else {
        TESSEL_ASSERT(j < b.size(), "reshape: {} and {} do not group", shape_str(in), shape_str(out));
        pb *= out[b[j]];
        g.out.push_back(b[j++]);
      }
    } while (pa != pb);
    groups.push_back(std::move(g));
  }
  return groups;
}

// Whether splitting n units of `rn` elements and m units of `rm` elements (n·rn = m·rm) by the
// nested counts `ks` (balanced splits, each inside the piece of the one before) puts every
// piece boundary at the same element.
bool same_splits(int64_t n, int64_t rn, int64_t m, int64_t rm, std::span<const int64_t> ks) {
  if (ks.empty()) return true;
  const int64_t k = ks[0];
  for (int64_t i = 0; i < k; ++i)
    if (split_offset(n, k, i) * rn != split_offset(m, k, i) * rm ||
        !same_splits(split_size(n, k, i), rn, split_size(m, k, i), rm, ks.subspan(1)))
      return false;
  return true;
}

int64_t dims_product(const Shape& s, std::span<const int64_t> dims) {
  int64_t p = 1;
  for (int64_t d : dims) p *= s[static_cast<size_t>(d)];
  return p;
}

// x[in] -> out[out]: per group, the shard of its first input dim a (mesh dims in order, as
// long as the nested splits of a and of the first output dim p agree) moves to p.
SpmdDecision reshape_spmd(const SpmdCall& c) {
  const Shape& in = c.inputs[0].shape;
  const Shape out = view::infer_reshape(c.attrs.ints("shape"), c.inputs[0].numel(), "reshape");
  const Placements& cur = c.input_attrs[0].placements;
  Placements req = spmd::replicated(c), res = spmd::replicated(c);
  for (size_t m = 0; m < cur.size(); ++m)
    if (linear_partial(cur[m])) req[m] = res[m] = cur[m];
  if (c.inputs[0].numel() > 0) {  // an empty tensor has no groups; it stays replicated
    for (const DimGroup& g : reshape_groups(in, out)) {
      const int64_t a = g.in[0], p = g.out[0];
      const int64_t rest_in = dims_product(in, std::span(g.in).subspan(1));
      const int64_t rest_out = dims_product(out, std::span(g.out).subspan(1));
      std::vector<int64_t> ks;
      for (int64_t m : c.input_attrs[0].mesh_dims_sharding(a)) {
        ks.push_back(c.mesh().dim_size(m));
        if (!same_splits(in[a], rest_in, out[p], rest_out, ks)) break;
        req[m] = Shard(a);
        res[m] = Shard(p);
      }
    }
    // Size-1 dims, paired in order (the j-th of the input with the j-th of the output): a
    // shard of one leaves the whole piece on the first rank and nothing elsewhere, on either
    // side, so it carries over (batch 1 under data parallelism, a decode step, the identity view).
    std::vector<int64_t> ones_in, ones_out;
    for (size_t d = 0; d < in.size(); ++d)
      if (in[d] == 1) ones_in.push_back(static_cast<int64_t>(d));
    for (size_t d = 0; d < out.size(); ++d)
      if (out[d] == 1) ones_out.push_back(static_cast<int64_t>(d));
    for (size_t j = 0; j < ones_in.size() && j < ones_out.size(); ++j)
      for (int64_t m : c.input_attrs[0].mesh_dims_sharding(ones_in[j])) {
        req[static_cast<size_t>(m)] = Shard(ones_in[j]);
        res[static_cast<size_t>(m)] = Shard(ones_out[j]);
      }
  }
  SpmdDecision d{{req}, {res}};
  d.local_attrs = with_local_shape(c, "shape", out, res);
  return d;
}

// out dim j = x dim dims[j]: a shard of input dim dims[j] becomes a shard of output dim j.
SpmdDecision permute_spmd(const SpmdCall& c) {
  const std::vector<int64_t>& dims = c.attrs.ints("dims");
  const int64_t r = static_cast<int64_t>(dims.size());
  Placements in = keep_except(c, {}), out = in;
  for (size_t m = 0; m < in.size(); ++m)
    if (in[m].is_shard())
      for (int64_t j = 0; j < r; ++j)
        if (normalize_dim(dims[static_cast<size_t>(j)], r, "permute") == in[m].dim) out[m] = Shard(j);
  return SpmdDecision{{in}, {out}};
}

// x[..., 1, n] -> out[L..., m, n]: dims that broadcast are replicated; kept dims keep their
// shards, shifted by the L new leading dims.
SpmdDecision expand_spmd(const SpmdCall& c) {
  const Shape& x = c.inputs[0].shape;
  const Shape out = expand_infer(MetaCall{op_expand, c.inputs, c.attrs})[0].shape;
  const size_t lead = out.size() - x.size();
  std::vector<int64_t> broadcast;
  for (size_t d = 0; d < x.size(); ++d)
    if (x[d] != out[lead + d]) broadcast.push_back(static_cast<int64_t>(d));
  Placements in = keep_except(c, broadcast), res = in;
  for (Placement& p : res)
    if (p.is_shard()) p = Shard(p.dim + static_cast<int64_t>(lead));
  SpmdDecision d{{in}, {res}};
  d.local_attrs = with_local_shape(c, "shape", out, res);
  return d;
}

// out = x, copied: placements unchanged.
SpmdDecision contiguous_spmd(const SpmdCall& c) {
  Placements p = keep_except(c, {});
  return SpmdDecision{{p}, {p}};
}

// out[.., n0 + n1 + .., ..] = cat(x0, x1, ..): every input shards the same non-cat dim (or
// none) per mesh dim, chosen by least resharding; Partial inputs stay Partial only together.
SpmdDecision cat_spmd(const SpmdCall& c) {
  const int64_t nd = static_cast<int64_t>(c.inputs[0].shape.size());
  const int64_t dim = normalize_dim(c.attrs.i("dim"), nd, "cat");
  spmd::LabelRule r;
  r.linearity = spmd::Linearity::joint;
  for (int64_t d = 0; d < nd; ++d) r.output += d == dim ? '.' : static_cast<char>('a' + d);
  r.inputs.assign(c.inputs.size(), r.output);
  return spmd::label_rule(c, r);
}

// x[.., n, ..] -> outs[.., sizes[i], ..]: the split dim whole, each output placed like x.
SpmdDecision split_spmd(const SpmdCall& c) {
  const int64_t dim = normalize_dim(c.attrs.i("dim"), static_cast<int64_t>(c.inputs[0].shape.size()), "split");
  Placements p = keep_except(c, {dim});
  return SpmdDecision{{p}, std::vector<Placements>(c.attrs.ints("sizes").size(), p)};
}

// x[.., n, ..] -> out[.., (end - start) / step, ..]: a slice inside the dim needs it whole; a
// slice of the whole dim with step 1 keeps its shard, each rank taking its whole piece.
SpmdDecision slice_spmd(const SpmdCall& c) {
  const Shape& x = c.inputs[0].shape;
  SliceArgs s = slice_args(x, c.attrs);
  const bool whole = s.start == 0 && s.end == x[static_cast<size_t>(s.dim)] && s.step == 1;
  Placements p = keep_except(c, whole ? std::vector<int64_t>{} : std::vector<int64_t>{s.dim});
  SpmdDecision d{{p}, {p}};
  if (whole) {
    Attrs a = c.attrs;
    a.set("dim", s.dim).set("start", int64_t{0}).set("end", x[static_cast<size_t>(s.dim)]).set("step", int64_t{1});
    d.local_attrs = a;
  }
  return d;
}

}  // namespace

const OpDef op_reshape{.name = "reshape", .num_inputs = 1, .infer = reshape_infer, .forward = reshape_forward,
                       .backward = reshape_backward, .cost = view_cost, .spmd = reshape_spmd, .bf16_via_f32 = false,
                       .attrs = "shape: ints"};
const OpDef op_permute{.name = "permute", .num_inputs = 1, .infer = permute_infer, .forward = permute_forward,
                       .backward = permute_backward, .cost = view_cost, .spmd = permute_spmd, .bf16_via_f32 = false,
                       .attrs = "dims: ints"};
const OpDef op_expand{.name = "expand", .num_inputs = 1, .infer = expand_infer, .forward = expand_forward,
                      .backward = expand_backward, .cost = view_cost, .spmd = expand_spmd, .bf16_via_f32 = false,
                      .attrs = "shape: ints"};
const OpDef op_contiguous{.name = "contiguous", .num_inputs = 1, .infer = same_infer, .forward = contiguous_forward,
                          .backward = identity_backward, .cost = copy_cost, .spmd = contiguous_spmd,
                          .bf16_via_f32 = false};
const OpDef op_cat{.name = "cat", .num_inputs = -1, .infer = cat_infer, .forward = cat_forward,
                   .backward = cat_backward, .cost = copy_cost, .spmd = cat_spmd, .bf16_via_f32 = false,
                   .attrs = "dim: int = 0"};
const OpDef op_split{.name = "split", .num_inputs = 1, .num_outputs = -1, .infer = split_infer,
                     .forward = split_forward, .backward = split_backward, .cost = view_cost, .spmd = split_spmd,
                     .bf16_via_f32 = false,
                     .attrs = "sizes: ints, dim: int = 0"};
const OpDef op_slice{.name = "slice", .num_inputs = 1, .infer = slice_infer, .forward = slice_forward,
                     .backward = slice_backward, .cost = view_cost, .spmd = slice_spmd, .bf16_via_f32 = false,
                     .attrs = "dim: int, start: int, end: int, step: int = 1"};

Tensor reshape(const Tensor& x, const Shape& shape) { return call_op1(op_reshape, {x}, Attrs{{"shape", shape}}); }

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  if (x.dim() == 0) return reshape(x, {1});
  int64_t s = normalize_dim(start_dim, x.dim(), "flatten"), e = normalize_dim(end_dim, x.dim(), "flatten");
  TESSEL_CHECK(s <= e, "flatten: start_dim {} is after end_dim {}", start_dim, end_dim);
  Shape shape(x.shape().begin(), x.shape().begin() + s);
  int64_t merged = 1;
  for (int64_t d = s; d <= e; ++d) merged *= x.size(d);
  shape.push_back(merged);
  shape.insert(shape.end(), x.shape().begin() + e + 1, x.shape().end());
  return reshape(x, shape);
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  Shape shape = x.shape();
  shape.insert(shape.begin() + normalize_dim(dim, x.dim() + 1, "unsqueeze"), 1);
  return reshape(x, shape);
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  int64_t d = normalize_dim(dim, x.dim(), "squeeze");
  TESSEL_CHECK(x.size(d) == 1, "squeeze: dim {} of {} has size {}, not 1", d, shape_str(x.shape()), x.size(d));
  Shape shape = x.shape();
  shape.erase(shape.begin() + d);
  return reshape(x, shape);
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) { return call_op1(op_permute, {x}, Attrs{{"dims", dims}}); }

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  std::vector<int64_t> dims(x.dim());
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[normalize_dim(dim0, x.dim(), "transpose")], dims[normalize_dim(dim1, x.dim(), "transpose")]);
  return permute(x, dims);
}

Tensor expand(const Tensor& x, const Shape& shape) { return call_op1(op_expand, {x}, Attrs{{"shape", shape}}); }
Tensor contiguous(const Tensor& x) { return call_op1(op_contiguous, {x}); }
Tensor cat(const std::vector<Tensor>& xs, int64_t dim) { return call_op1(op_cat, xs, Attrs{{"dim", dim}}); }

Tensor stack(const std::vector<Tensor>& xs, int64_t dim) {
  TESSEL_CHECK(!xs.empty(), "stack: needs at least one tensor");
  int64_t d = normalize_dim(dim, xs[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  for (size_t i = 0; i < xs.size(); ++i) {
    TESSEL_CHECK(xs[i].shape() == xs[0].shape(), "stack: tensor {} has shape {} but tensor 0 has {}", i,
                 shape_str(xs[i].shape()), shape_str(xs[0].shape()));
    parts.push_back(unsqueeze(xs[i], d));
  }
  return cat(parts, d);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  return call_op(op_split, {x}, Attrs{{"sizes", sizes}, {"dim", dim}});
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  TESSEL_CHECK(chunks > 0, "chunk: chunk count must be positive, got {}", chunks);
  int64_t n = x.size(dim);
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < chunks; ++i) sizes.push_back(split_size(n, chunks, i));
  return split(x, sizes, dim);
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  return call_op1(op_slice, {x}, Attrs{{"dim", dim}, {"start", start}, {"end", end}, {"step", step}});
}

}  // namespace tessel
