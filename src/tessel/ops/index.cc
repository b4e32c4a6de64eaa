// Gathers by integer index: embedding (rows of a table) and one_hot. Shape inference cannot
// see index values, so each forward checks its ids before touching memory and throws naming
// the first bad id. The embedding backward scatter-adds gradient rows in id order within each
// block of columns, so its sums do not depend on the thread count.
//
// Shapes (N = number of ids, the ids' shape flattened):
//   embedding out[N, D] = table[ids[N], D]          table [V, D]
//   one_hot   out[N, K] = (k == ids[N])             K = num_classes
// With the attr vocab_start (a vocab-sharded table's piece: rows [vocab_start, vocab_start + V)
// of the whole table), embedding gives zero rows, and no gradient, for ids outside the piece.
#include "tessel/ops/index.h"

#include <algorithm>

#include "tessel/ops/dispatch.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ops/op_list.h"
#include "tessel/sharding/spmd_rules.h"

namespace tessel {

namespace {

// Throws naming `op` and the first id outside [0, n); `bound` names n ("V", "num_classes").
template <typename I>
void check_ids(const I* ids, int64_t count, int64_t n, std::string_view op, std::string_view bound) {
  for (int64_t k = 0; k < count; ++k) {
    int64_t id = static_cast<int64_t>(ids[k]);
    TESSEL_CHECK(id >= 0 && id < n, "{}: id {} (at flat position {}) is outside [0, {}) with {}={}", op, id, k, bound,
                 bound, n);
  }
}

// Output shape: the ids' shape with `last` appended.
Shape with_last(const Shape& ids, int64_t last) {
  Shape out = ids;
  out.push_back(last);
  return out;
}

// ---------------------------------------------------------------- embedding

std::vector<TensorMeta> embedding_infer(const MetaCall& c) {
  kernels::check_floating(c, 0);
  kernels::check_ndim(c, 0, 2);
  kernels::check_index(c, 1);
  const TensorMeta& table = c.inputs[0];
  return {TensorMeta{with_last(c.inputs[1].shape, table.shape[1]), table.dtype, {}}};
}

// out[n, :] = table[ids[n] - v0, :], or zeros when ids[n] - v0 is outside [0, V); table
// [V, D] and out [N, D] contiguous.
template <typename T, typename I>
void embedding_kernel(const T* table, const I* ids, T* out, int64_t N, int64_t V, int64_t D, int64_t v0) {
  int64_t grain = std::max<int64_t>(1, kernels::kElementGrain / std::max<int64_t>(1, D));
  parallel_for(0, N, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; ++n) {
      const int64_t v = static_cast<int64_t>(ids[n]) - v0;
      if (v < 0 || v >= V) {
        std::fill(out + n * D, out + (n + 1) * D, T(0));
        continue;
      }
      const T* row = table + v * D;
      std::copy(row, row + D, out + n * D);
    }
  });
}

// The first row of the table piece: the attr vocab_start when given (ids outside the piece
// are then not this piece's), 0 otherwise (every id must be in range).
int64_t vocab_start(const Attrs& attrs) { return attrs.i_or("vocab_start", 0); }

std::vector<Tensor> embedding_forward(const OpCall& c) {
  Tensor table = kernels::contig(c.inputs[0]);
  Tensor ids = kernels::contig(c.inputs[1]);
  Tensor out = Tensor::empty(c.outputs[0]);
  int64_t V = table.size(0), D = table.size(1), N = ids.numel();
  const int64_t v0 = vocab_start(c.attrs);
  TESSEL_DISPATCH_INDEX(ids.dtype(), "embedding", [&]<typename I>() {
    const I* pi = ids.data<I>();
    if (!c.attrs.has("vocab_start")) check_ids(pi, N, V, "embedding", "V");
    TESSEL_DISPATCH_FLOAT(table.dtype(), "embedding", [&]<typename T>() {
      embedding_kernel<T, I>(table.data<T>(), pi, out.data<T>(), N, V, D, v0);
    });
  });
  return {out};
}

// dtable[ids[n] - v0, :] += g[n, :] for n = 0..N-1 in order, skipping ids outside the piece;
// dtable [V, D] zeroed first. Threads split the D columns, each adding every row in n order,
// so the sums are the serial ones.
template <typename T, typename I>
void embedding_grad_kernel(const T* g, const I* ids, T* dtable, int64_t N, int64_t V, int64_t D, int64_t v0) {
  int64_t grain = std::max<int64_t>(64, kernels::kElementGrain / std::max<int64_t>(1, N));
  parallel_for(0, D, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t v = static_cast<int64_t>(ids[n]) - v0;
      if (v < 0 || v >= V) continue;
      T* dst = dtable + v * D;
      const T* src = g + n * D;
      for (int64_t d = lo; d < hi; ++d) dst[d] += src[d];
    }
  });
}

std::vector<Tensor> embedding_backward(const GradCall& g) {
  if (!g.needs_grad[0]) return {Tensor(), Tensor()};
  const Tensor& ids = g.inputs[1];
  Tensor go = kernels::contig(g.grad_outputs[0]);
  const Shape& table_shape = g.input_metas[0].shape;
  Tensor dtable = Tensor::zeros(table_shape, go.dtype());
  int64_t V = table_shape[0], D = table_shape[1], N = ids.numel();
  Tensor idc = kernels::contig(ids);
  TESSEL_DISPATCH_INDEX(idc.dtype(), "embedding", [&]<typename I>() {
    TESSEL_DISPATCH_FLOAT(go.dtype(), "embedding", [&]<typename T>() {
      embedding_grad_kernel<T, I>(go.data<T>(), idc.data<I>(), dtable.data<T>(), N, V, D, vocab_start(g.attrs));
    });
  });
  return {dtable, Tensor()};
}

// A gather reads the ids and N rows of the table and writes N rows: not the whole table.
Cost embedding_cost(const MetaCall& c, std::span<const TensorMeta> out) {
  double out_bytes = static_cast<double>(out[0].nbytes());
  return Cost{0, static_cast<double>(c.inputs[1].nbytes()) + 2 * out_bytes};
}

// ---------------------------------------------------------------- one_hot

std::vector<TensorMeta> one_hot_infer(const MetaCall& c) {
  kernels::check_index(c, 0);
  int64_t K = c.attrs.i("num_classes");
  TESSEL_CHECK(K > 0, "one_hot: num_classes={} must be positive (ids {})", K, c.inputs[0].str());
  return {TensorMeta{with_last(c.inputs[0].shape, K), c.attrs.dtype("dtype"), {}}};
}

// out[n, k] = k == ids[n] ? 1 : 0; out [N, K] contiguous.
template <typename T, typename I>
void one_hot_kernel(const I* ids, T* out, int64_t N, int64_t K) {
  T one;
  if constexpr (std::is_same_v<T, BFloat16>) one = BFloat16(1.0f);
  else one = T(1);
  parallel_for(0, N, std::max<int64_t>(1, kernels::kElementGrain / K), [&](int64_t lo, int64_t hi) {
    std::fill(out + lo * K, out + hi * K, T{});
    for (int64_t n = lo; n < hi; ++n) out[n * K + static_cast<int64_t>(ids[n])] = one;
  });
}

std::vector<Tensor> one_hot_forward(const OpCall& c) {
  Tensor ids = kernels::contig(c.inputs[0]);
  Tensor out = Tensor::empty(c.outputs[0]);
  int64_t K = c.attrs.i("num_classes"), N = ids.numel();
  TESSEL_DISPATCH_INDEX(ids.dtype(), "one_hot", [&]<typename I>() {
    const I* pi = ids.data<I>();
    check_ids(pi, N, K, "one_hot", "num_classes");
    TESSEL_DISPATCH_ALL(out.dtype(), "one_hot", [&]<typename T>() { one_hot_kernel<T, I>(pi, out.data<T>(), N, K); });
  });
  return {out};
}

Cost one_hot_cost(const MetaCall& c, std::span<const TensorMeta> out) { return Cost{0, kernels::io_bytes(c, out)}; }

// ---------------------------------------------------------------- SPMD rules
// embedding "VD", ids "ab.." -> out "ab..D": ids sharded on any dim shard the output's dim;
// a table sharded on D shards the output's last dim; a table sharded on V (vocab-parallel, as
// in Megatron) makes the output Partial(sum): each rank looks up the ids in its rows
// [vocab_start, vocab_start + Vlocal) (the local attr) and gives zero rows for the others.
// Linear in the table: a Partial(sum) table passes through. A mesh dim on which both inputs are
// replicated stays replicated (splitting V there would only leave a Partial to reduce).
// one_hot ids "ab.." -> out "ab..": ids' shards pass to the leading dims; classes whole.

SpmdDecision embedding_spmd(const SpmdCall& c) {
  const Shape& table = c.inputs[0].shape;
  if (table.size() != 2) return SpmdDecision{{spmd::replicated(c), spmd::replicated(c)}, {spmd::replicated(c)}};
  const std::string lead = spmd::dim_labels(c.inputs[1].shape.size());
  SpmdDecision d = spmd::label_rule(c, spmd::LabelRule{{"VD", lead}, lead + "D", spmd::Linearity::single});
  bool vocab = false;
  for (size_t m = 0; m < static_cast<size_t>(c.mesh_ndim()); ++m) {
    if (c.input_attrs[0].placements[m].is_replicate() && c.input_attrs[1].placements[m].is_replicate())
      d.inputs[0][m] = d.inputs[1][m] = d.outputs[0][m] = Replicate();
    vocab = vocab || d.inputs[0][m].is_shard(0);
  }
  if (vocab) {
    Attrs local = c.attrs;
    local.set("vocab_start", vocab_start(c.attrs) + DistAttr(c.mesh(), d.inputs[0]).local_offset(table, c.rank)[0]);
    d.local_attrs = local;
  }
  return d;
}

SpmdDecision one_hot_spmd(const SpmdCall& c) {
  const std::string lead = spmd::dim_labels(c.inputs[0].shape.size());
  return spmd::label_rule(c, spmd::LabelRule{{lead}, lead + ".", spmd::Linearity::none});
}

}  // namespace

const OpDef op_embedding{.name = "embedding", .num_inputs = 2, .infer = embedding_infer, .forward = embedding_forward,
                         .backward = embedding_backward, .cost = embedding_cost, .spmd = embedding_spmd,
                         .save = {0b10, 0},
                         .attrs = "vocab_start: int?"};
const OpDef op_one_hot{.name = "one_hot", .num_inputs = 1, .infer = one_hot_infer, .forward = one_hot_forward,
                       .cost = one_hot_cost, .spmd = one_hot_spmd, .bf16_via_f32 = false,
                       .attrs = "num_classes: int, dtype: dtype = i64"};

Tensor embedding(const Tensor& table, const Tensor& ids) { return call_op1(op_embedding, {table, ids}); }

Tensor one_hot(const Tensor& ids, int64_t num_classes, DType dtype) {
  return call_op1(op_one_hot, {ids}, Attrs{{"num_classes", num_classes}, {"dtype", dtype}});
}

}  // namespace tessel
