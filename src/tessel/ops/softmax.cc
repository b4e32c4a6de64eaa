// Softmax, log-softmax and the fused cross-entropy loss. Each row is normalised by one thread
// in a few passes over a row that stays in cache (max, exp and sum, scale), so memory sees one
// read of x and one write of y; the exp pass prefetches the next row so its first (memory)
// pass overlaps this row's arithmetic. Row reductions use kLanes partial accumulators, which
// GCC turns into vector registers; exp is the vectorisable fast::exp_t. Nothing sums across
// rows except the loss, which adds per-row losses in row order, so results do not depend on
// the thread count.
//
// Shapes: softmax      y[outer, n, inner] = exp(x - max_n x) / Σ_n exp(x - max_n x)
//         log_softmax  y[outer, n, inner] = x - max_n x - log Σ_n exp(x - max_n x)
//         cross_entropy loss[] = reduce_r (lse[r] - logits[r, target[r]]),  logits[R, C]
// The fast path is inner = 1 (reduced dim last); other dims work on blocks of inner columns.
#include "tessel/ops/softmax.h"

#include <cmath>
#include <limits>

#include "tessel/ops/dispatch.h"
#include "tessel/ops/fast_math.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ops/op_list.h"
#include "tessel/ops/elementwise.h"
#include "tessel/ops/reduce.h"
#include "tessel/ops/shape.h"
#include "tessel/sharding/spmd_rules.h"

namespace tessel {

using kernels::DimSplit;

namespace {

// Row reductions keep kLanes partial accumulators (lane k sums elements k, k + kLanes, ...;
// combined pairwise at the end, a fixed order). "#pragma GCC unroll 1" on the lane loop keeps
// GCC from unrolling it and then vectorising across rows of lanes with shuffles (3-7x slower).
constexpr int kLanes = 16;
constexpr int64_t kColumns = 64;  // inner columns per block on the general path

template <typename T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// Rows per parallel_for chunk so a chunk touches about kElementGrain elements.
int64_t row_grain(int64_t row_len) {
  return std::max<int64_t>(1, kernels::kElementGrain / std::max<int64_t>(1, row_len));
}

// max_i x[i]; NaNs are skipped here but reach the output through exp.
template <typename T>
T row_max(const T* __restrict x, int64_t n) {
  T acc[kLanes];
  for (int k = 0; k < kLanes; ++k) acc[k] = kNegInf<T>;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    #pragma GCC unroll 1
    for (int k = 0; k < kLanes; ++k) acc[k] = x[i + k] > acc[k] ? x[i + k] : acc[k];
  }
  T m = kNegInf<T>;
  for (int k = 0; k < kLanes; ++k) m = acc[k] > m ? acc[k] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// Σ_i x[i] with kLanes partial sums combined pairwise (a fixed order).
template <typename T>
T row_sum(const T* __restrict x, int64_t n) {
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    #pragma GCC unroll 1
    for (int k = 0; k < kLanes; ++k) acc[k] += x[i + k];
  }
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  T s = acc[0];
  for (; i < n; ++i) s += x[i];
  return s;
}

// Σ_i a[i]·b[i].
template <typename T>
T row_dot(const T* __restrict a, const T* __restrict b, int64_t n) {
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    #pragma GCC unroll 1
    for (int k = 0; k < kLanes; ++k) acc[k] += a[i + k] * b[i + k];
  }
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  T s = acc[0];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Asks for the kLanes elements at p (one or two cache lines) ahead of use. A row's first pass
// reads memory; prefetching the next row during this row's arithmetic overlaps the two.
// Always inlined: GCC judges a helper that only prefetches side-effect free and drops calls.
template <typename T>
[[gnu::always_inline]] inline void prefetch_lanes(const T* p, bool write) {
  if (p == nullptr) return;
  for (size_t b = 0; b < kLanes * sizeof(T); b += 64) {
    if (write) __builtin_prefetch(reinterpret_cast<const char*>(p) + b, 1);
    else __builtin_prefetch(reinterpret_cast<const char*>(p) + b, 0);
  }
}

// Σ_i exp(x[i] - m), without storing the exponentials; prefetches next_x/next_y (or null).
template <typename T>
T row_exp_sum(const T* __restrict x, int64_t n, T m, const T* next_x, const T* next_y) {
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    prefetch_lanes(next_x ? next_x + i : nullptr, false);
    prefetch_lanes(next_y ? next_y + i : nullptr, true);
    for (int k = 0; k < kLanes; ++k) acc[k] += fast::exp_t<T>(x[i + k] - m);
  }
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  T s = acc[0];
  for (; i < n; ++i) s += fast::exp_t<T>(x[i] - m);
  return s;
}

// y[i] = exp(x[i] - m), returning Σ_i y[i]; prefetches like row_exp_sum.
template <typename T>
T row_exp_store(const T* __restrict x, T* __restrict y, int64_t n, T m, const T* next_x, const T* next_y) {
  T acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    prefetch_lanes(next_x ? next_x + i : nullptr, false);
    prefetch_lanes(next_y ? next_y + i : nullptr, true);
    for (int k = 0; k < kLanes; ++k) {
      T e = fast::exp_t<T>(x[i + k] - m);
      y[i + k] = e;
      acc[k] += e;
    }
  }
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  T s = acc[0];
  for (; i < n; ++i) {
    T e = fast::exp_t<T>(x[i] - m);
    y[i] = e;
    s += e;
  }
  return s;
}

// ---------------------------------------------------------------- softmax / log_softmax

// y[n] = softmax(x[n]) (or log_softmax) for one contiguous row: max (reads memory), exp and
// sum (arithmetic, while the next row is prefetched), then scale or shift in cache.
template <typename T, bool Log>
void softmax_row(const T* __restrict x, T* __restrict y, int64_t n, const T* next_x, const T* next_y) {
  const T m = row_max(x, n);
  if constexpr (Log) {
    const T lse = m + std::log(row_exp_sum(x, n, m, next_x, next_y));
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] - lse;
  } else {
    const T inv = T(1) / row_exp_store(x, y, n, m, next_x, next_y);
    for (int64_t i = 0; i < n; ++i) y[i] *= inv;
  }
}

// y[o, :, i0:i0+w] for one block of w <= kColumns inner columns; x, y point at [o, 0, i0].
template <typename T, bool Log>
void softmax_block(const T* __restrict x, T* __restrict y, int64_t n, int64_t inner, int64_t w) {
  T m[kColumns], s[kColumns];
  for (int64_t i = 0; i < w; ++i) m[i] = kNegInf<T>, s[i] = T(0);
  for (int64_t r = 0; r < n; ++r) {
    const T* xr = x + r * inner;
    for (int64_t i = 0; i < w; ++i) m[i] = xr[i] > m[i] ? xr[i] : m[i];
  }
  for (int64_t r = 0; r < n; ++r) {
    const T* xr = x + r * inner;
    T* yr = y + r * inner;
    for (int64_t i = 0; i < w; ++i) {
      T e = fast::exp_t<T>(xr[i] - m[i]);
      if constexpr (!Log) yr[i] = e;
      s[i] += e;
    }
  }
  if constexpr (Log) {
    for (int64_t i = 0; i < w; ++i) s[i] = m[i] + std::log(s[i]);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < w; ++i) y[r * inner + i] = x[r * inner + i] - s[i];
  } else {
    for (int64_t i = 0; i < w; ++i) s[i] = T(1) / s[i];
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < w; ++i) y[r * inner + i] *= s[i];
  }
}

// Calls row(offset, has_next) for every contiguous row ([outer, n], inner = 1), or
// block(offset, w) for every block of w inner columns; chunk sizes come from the shape alone.
template <typename RowFn, typename BlockFn>
void for_rows(DimSplit s, RowFn row, BlockFn block) {
  if (s.inner == 1) {
    parallel_for(0, s.outer, row_grain(s.size), [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; ++o) row(o * s.size, o + 1 < s.outer);
    });
    return;
  }
  const int64_t blocks = (s.inner + kColumns - 1) / kColumns;
  parallel_for(0, s.outer * blocks, row_grain(s.size * kColumns), [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      int64_t o = p / blocks, i0 = (p % blocks) * kColumns;
      block(o * s.size * s.inner + i0, std::min(kColumns, s.inner - i0));
    }
  });
}

int64_t softmax_dim(const MetaCall& c) {
  int64_t nd = static_cast<int64_t>(c.inputs[0].shape.size());
  return normalize_dim(c.attrs.i("dim"), std::max<int64_t>(nd, 1), c.op.name);  // a 0-dim x acts as [1]
}

std::vector<TensorMeta> softmax_infer(const MetaCall& c) {
  kernels::check_floating(c, 0);
  softmax_dim(c);
  return {TensorMeta{c.inputs[0].shape, c.inputs[0].dtype, {}}};
}

DimSplit split_for(const Tensor& x, int64_t dim) {
  if (x.dim() == 0) return DimSplit{};
  return kernels::split_at(x.shape(), normalize_dim(dim, x.dim(), "softmax"));
}

template <bool Log>
std::vector<Tensor> softmax_forward(const OpCall& c) {
  Tensor x = kernels::contig(c.inputs[0]);
  Tensor y = Tensor::empty(c.outputs[0]);
  DimSplit s = split_for(x, c.attrs.i("dim"));
  TESSEL_DISPATCH_FLOAT(x.dtype(), c.op.name, [&]<typename T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    for_rows(
        s,
        [&](int64_t off, bool next) {
          const int64_t n = s.size;
          softmax_row<T, Log>(px + off, py + off, n, next ? px + off + n : nullptr, next ? py + off + n : nullptr);
        },
        [&](int64_t off, int64_t w) { softmax_block<T, Log>(px + off, py + off, s.size, s.inner, w); });
  });
  return {y};
}

// softmax:     dx = y ⊙ (g - Σ_n g⊙y)
// log_softmax: dx = g - exp(y) · Σ_n g
// The reduction reads memory; the second pass works in cache and prefetches the next row
// (next = the offset to it, 0 for the last row).
template <typename T, bool Log>
void softmax_grad_row(const T* __restrict g, const T* __restrict y, T* __restrict dx, int64_t n, int64_t next) {
  const T r = Log ? row_sum(g, n) : row_dot(g, y, n);
  for (int64_t i0 = 0; i0 < n; i0 += kLanes) {
    const int64_t i1 = std::min(n, i0 + kLanes);
    if (next != 0) {
      prefetch_lanes(g + next + i0, false);
      prefetch_lanes(y + next + i0, false);
      prefetch_lanes(dx + next + i0, true);
    }
    if constexpr (Log)
      for (int64_t i = i0; i < i1; ++i) dx[i] = g[i] - fast::exp_t<T>(y[i]) * r;
    else
      for (int64_t i = i0; i < i1; ++i) dx[i] = y[i] * (g[i] - r);
  }
}

template <typename T, bool Log>
void softmax_grad_block(const T* __restrict g, const T* __restrict y, T* __restrict dx, int64_t n, int64_t inner,
                        int64_t w) {
  T acc[kColumns];
  for (int64_t i = 0; i < w; ++i) acc[i] = T(0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < w; ++i) acc[i] += Log ? g[r * inner + i] : g[r * inner + i] * y[r * inner + i];
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < w; ++i) {
      int64_t k = r * inner + i;
      if constexpr (Log) dx[k] = g[k] - fast::exp_t<T>(y[k]) * acc[i];
      else dx[k] = y[k] * (g[k] - acc[i]);
    }
}

template <bool Log>
std::vector<Tensor> softmax_backward(const GradCall& c) {
  Tensor y = kernels::contig(c.outputs[0]);
  Tensor g = kernels::contig(c.grad_outputs[0]);
  Tensor dx = Tensor::empty(y.shape(), y.dtype());
  DimSplit s = split_for(y, c.attrs.i("dim"));
  TESSEL_DISPATCH_FLOAT(y.dtype(), c.op.name, [&]<typename T>() {
    const T* py = y.data<T>();
    const T* pg = g.data<T>();
    T* pd = dx.data<T>();
    for_rows(
        s,
        [&](int64_t off, bool next) {
          softmax_grad_row<T, Log>(pg + off, py + off, pd + off, s.size, next ? s.size : 0);
        },
        [&](int64_t off, int64_t w) { softmax_grad_block<T, Log>(pg + off, py + off, pd + off, s.size, s.inner, w); });
  });
  return {dx};
}

// max, exp, sum and scale: about 5 FLOPs per element (exp counted as one).
Cost softmax_cost(const MetaCall& c, std::span<const TensorMeta> out) { return kernels::elementwise_cost(c, out, 5); }

// ---------------------------------------------------------------- cross_entropy

std::vector<TensorMeta> cross_entropy_infer(const MetaCall& c) {
  kernels::check_floating(c, 0);
  kernels::check_index(c, 1);
  const TensorMeta& logits = c.inputs[0];
  const TensorMeta& targets = c.inputs[1];
  TESSEL_CHECK(!logits.shape.empty(), "cross_entropy: logits must have a class dim [..., C], got {}", logits.str());
  Shape lead(logits.shape.begin(), logits.shape.end() - 1);
  TESSEL_CHECK(targets.shape == lead,
               "cross_entropy: targets {} must have the logits' leading shape {} (logits {}, classes last)",
               targets.str(), shape_str(lead), logits.str());
  const std::string& red = c.attrs.s("reduction");
  TESSEL_CHECK(red == "mean" || red == "sum", "cross_entropy: reduction '{}' is not 'mean' or 'sum'", red);
  return {TensorMeta{{}, logits.dtype, {}}, TensorMeta{{shape_numel(lead)}, logits.dtype, {}}};
}

// Row r counts when its target is not ignore_index; throws on a target outside [0, C).
template <typename I>
int64_t count_targets(const I* t, int64_t rows, int64_t C, int64_t ignore) {
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t v = static_cast<int64_t>(t[r]);
    if (v == ignore) continue;
    TESSEL_CHECK(v >= 0 && v < C,
                 "cross_entropy: target {} at row {} is outside [0, {}) for C={} classes (ignore_index {})", v, r, C,
                 C, ignore);
    ++count;
  }
  return count;
}

// lse[R] = log Σ_c exp(logits[R, c]); loss[] = Σ_r (lse[r] - logits[r, t[r]]) / count.
template <typename T, typename I>
std::vector<Tensor> cross_entropy_kernel(const OpCall& c, const Tensor& logits, const Tensor& targets) {
  const int64_t C = logits.size(-1), R = targets.numel();
  const int64_t ignore = c.attrs.i("ignore_index");
  const bool mean = c.attrs.s("reduction") == "mean";
  const I* pt = targets.data<I>();
  const int64_t count = count_targets(pt, R, C, ignore);
  Tensor loss = Tensor::empty(c.outputs[0]);
  Tensor lse = Tensor::empty(c.outputs[1]);
  const T* px = logits.data<T>();
  T* pl = lse.data<T>();
  std::vector<T> row_loss(static_cast<size_t>(R));
  parallel_for(0, R, row_grain(C), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* row = px + r * C;
      const T m = row_max(row, C);
      pl[r] = m + std::log(row_exp_sum(row, C, m, r + 1 < R ? row + C : nullptr, static_cast<const T*>(nullptr)));
      int64_t t = static_cast<int64_t>(pt[r]);
      row_loss[static_cast<size_t>(r)] = t == ignore ? T(0) : pl[r] - row[t];
    }
  });
  double total = 0;  // rows in order: the same bits for any thread count
  for (T v : row_loss) total += static_cast<double>(v);
  loss.data<T>()[0] = static_cast<T>(mean ? total / static_cast<double>(count) : total);  // mean of none: NaN
  return {loss, lse};
}

std::vector<Tensor> cross_entropy_forward(const OpCall& c) {
  Tensor logits = kernels::contig(c.inputs[0]);
  Tensor targets = kernels::contig(c.inputs[1]);
  return TESSEL_DISPATCH_FLOAT(logits.dtype(), "cross_entropy", [&]<typename T>() {
    return TESSEL_DISPATCH_INDEX(targets.dtype(), "cross_entropy",
                                 [&]<typename I>() { return cross_entropy_kernel<T, I>(c, logits, targets); });
  });
}

// dlogits[r, :] = (softmax(logits[r, :]) - onehot(t[r])) · g / count; zero for ignored rows.
template <typename T, typename I>
Tensor cross_entropy_grad(const GradCall& c, const Tensor& logits, const Tensor& targets, const Tensor& lse, double g) {
  const int64_t C = logits.size(-1), R = targets.numel();
  const int64_t ignore = c.attrs.i("ignore_index");
  const I* pt = targets.data<I>();
  int64_t count = 0;
  for (int64_t r = 0; r < R; ++r) count += static_cast<int64_t>(pt[r]) != ignore;
  const bool mean = c.attrs.s("reduction") == "mean";
  const T scale = static_cast<T>(mean ? g / static_cast<double>(std::max<int64_t>(count, 1)) : g);
  Tensor dx = Tensor::empty(logits.shape(), logits.dtype());
  const T* px = logits.data<T>();
  const T* pl = lse.data<T>();
  T* pd = dx.data<T>();
  parallel_for(0, R, row_grain(C), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* __restrict row = px + r * C;
      T* __restrict d = pd + r * C;
      int64_t t = static_cast<int64_t>(pt[r]);
      if (t == ignore) {
        for (int64_t j = 0; j < C; ++j) d[j] = T(0);
        continue;
      }
      const T l = pl[r];
      for (int64_t j = 0; j < C; ++j) d[j] = fast::exp_t<T>(row[j] - l) * scale;
      d[t] -= scale;
    }
  });
  return dx;
}

std::vector<Tensor> cross_entropy_backward(const GradCall& c) {
  if (!c.needs_grad[0]) return {Tensor(), Tensor()};
  Tensor logits = kernels::contig(c.inputs[0]);
  Tensor targets = kernels::contig(c.inputs[1]);
  Tensor lse = kernels::contig(c.outputs[1]);
  double g = c.grad_outputs[0].item();
  Tensor dx = TESSEL_DISPATCH_FLOAT(logits.dtype(), "cross_entropy", [&]<typename T>() {
    return TESSEL_DISPATCH_INDEX(targets.dtype(), "cross_entropy",
                                 [&]<typename I>() { return cross_entropy_grad<T, I>(c, logits, targets, lse, g); });
  });
  return {dx, Tensor()};
}

// Max, exp, sum per logit; the per-row pick and the reduction are negligible.
Cost cross_entropy_cost(const MetaCall& c, std::span<const TensorMeta> out) {
  return Cost{4.0 * static_cast<double>(c.inputs[0].numel()), kernels::io_bytes(c, out)};
}

// ---------------------------------------------------------------- SPMD rules
// softmax/log_softmax y[..., n, ...]: the softmax dim whole, every other dim keeps its shards;
// Partial inputs are reduced first (nonlinear).
// cross_entropy loss[] = f(logits[..., C], targets[...]): per mesh dim, split the rows (logits
// and targets sharded alike on one leading dim) or the classes (logits S(last), targets R), or
// replicate. Split calls are custom (the dist layer's cross_entropy, dist/custom_ops.cc): the
// mean needs the global count of non-ignored targets, and split classes need the row max, the
// sum of exponentials and the target logit reduced across the class shards. A mesh dim on
// which both inputs are replicated stays replicated (no collectives for it).

SpmdDecision softmax_spmd(const SpmdCall& c) {
  const int64_t nd = static_cast<int64_t>(c.inputs[0].shape.size());
  std::vector<int64_t> fixed;
  if (nd > 0) fixed.push_back(normalize_dim(c.attrs.i("dim"), nd, c.op));
  return spmd::keep_shape_rule(c, fixed, spmd::Linearity::none);
}

SpmdDecision cross_entropy_spmd(const SpmdCall& c) {
  const size_t nd = c.inputs[0].shape.size();
  if (nd == 0)  // infer rejects it
    return SpmdDecision{{spmd::replicated(c), spmd::replicated(c)}, {spmd::replicated(c)}};
  const std::string lead = spmd::dim_labels(nd - 1);
  spmd::LabelRule r;
  r.inputs = {lead + "z", lead};  // z: the class label, contracted into the scalar loss
  SpmdDecision d = spmd::label_rule(c, r);
  bool split = false;
  for (size_t m = 0; m < static_cast<size_t>(c.mesh_ndim()); ++m) {
    if (c.input_attrs[0].placements[m].is_replicate() && c.input_attrs[1].placements[m].is_replicate())
      d.inputs[0][m] = d.inputs[1][m] = Replicate();
    split = split || !d.inputs[0][m].is_replicate();
  }
  d.outputs.assign(1, spmd::replicated(c));
  d.custom = split;
  return d;
}

}  // namespace

const OpDef op_softmax{.name = "softmax", .num_inputs = 1, .infer = softmax_infer, .forward = softmax_forward<false>,
                       .backward = softmax_backward<false>, .cost = softmax_cost, .spmd = softmax_spmd,
                       .save = {0, 1}, .autocast = AutocastPolicy::f32,
                       .attrs = "dim: int = -1"};
const OpDef op_log_softmax{.name = "log_softmax", .num_inputs = 1, .infer = softmax_infer,
                           .forward = softmax_forward<true>, .backward = softmax_backward<true>,
                           .cost = softmax_cost, .spmd = softmax_spmd, .save = {0, 1},
                           .autocast = AutocastPolicy::f32,
                           .attrs = "dim: int = -1"};
// Hidden output 1: the per-row logsumexp [R], saved with the logits and targets.
const OpDef op_cross_entropy{.name = "cross_entropy", .num_inputs = 2, .num_hidden = 1,
                             .infer = cross_entropy_infer, .forward = cross_entropy_forward,
                             .backward = cross_entropy_backward, .cost = cross_entropy_cost,
                             .spmd = cross_entropy_spmd, .save = {0b11, 0b10},
                             .autocast = AutocastPolicy::f32,
                             .attrs = "ignore_index: int = -100, reduction: str = mean"};

Tensor softmax(const Tensor& x, int64_t dim) { return call_op1(op_softmax, {x}, Attrs{{"dim", dim}}); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return call_op1(op_log_softmax, {x}, Attrs{{"dim", dim}}); }

// The class dim anywhere: the logits are permuted to put it last (a view; on distributed
// logits the shards move with their dims), so the fused op, its rule and its vocab-parallel
// form apply unchanged.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Reduction reduction,
                     int64_t class_dim) {
  Tensor x = logits;
  const int64_t nd = logits.dim();
  if (nd > 0) {
    const int64_t cd = normalize_dim(class_dim, nd, "cross_entropy (class_dim)");
    if (cd != nd - 1) {
      std::vector<int64_t> order;
      for (int64_t d = 0; d < nd; ++d)
        if (d != cd) order.push_back(d);
      order.push_back(cd);
      x = permute(logits, order);
    }
  }
  return call_op1(op_cross_entropy, {x, targets},
                  Attrs{{"ignore_index", ignore_index},
                        {"reduction", std::string(reduction == Reduction::mean ? "mean" : "sum")}});
}

// -Σ_c probs · log_softmax(logits) over the class dim, then over the rows: composed of
// log_softmax, mul, sum and scale, whose rules, backwards and costs it takes (under a
// vocab-parallel layout log_softmax keeps the class dim whole, so the logits are gathered or
// moved to another dim first).
Tensor cross_entropy_soft(const Tensor& logits, const Tensor& probs, Reduction reduction, int64_t class_dim) {
  TESSEL_CHECK(logits.shape() == probs.shape(), "cross_entropy_soft: probs {} must have the logits' shape {}",
               probs.meta().str(), logits.meta().str());
  TESSEL_CHECK(logits.dim() > 0, "cross_entropy_soft: logits must have a class dim, got {}", logits.meta().str());
  const int64_t cd = normalize_dim(class_dim, logits.dim(), "cross_entropy_soft (class_dim)");
  Tensor total = sum(mul(probs, log_softmax(logits, cd)));
  if (reduction == Reduction::sum) return neg(total);
  const int64_t C = logits.size(cd), rows = C > 0 ? logits.numel() / C : 0;
  return scale(total, -1.0 / static_cast<double>(rows));
}

}  // namespace tessel
