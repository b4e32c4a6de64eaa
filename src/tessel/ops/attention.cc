// The op sdpa: scaled dot-product attention, one fused, memory-efficient kernel
// (attention_kernel.cc says how it computes, and what it keeps between the passes), with
// grouped-query heads, causal and document masks, and dropout on the probabilities.
//
// Shapes: q[B, H, T, D], k and v[B, Hkv, S, D], out[B, H, T, D], the hidden output LSE[B, H,
// T] (the log-sum-exp of each query's scores, saved for the backward), and the optional
// document starts docs[B, N] (int64). Attributes: causal, scale (0: 1/sqrt(D)), cp (the
// context-parallel method), and with dropout p the Philox seed and stream and row0 — plus b0,
// h0 and heads, set by the SPMD rule, placing a rank's piece among the global batch rows and
// heads so that its mask is that slice of the one-rank mask. Selective recompute (the argument
// recompute_probs) has nothing to drop: no probabilities are kept. Gradients are laid out to
// make merging the heads afterwards a view (dq, dk and dv of a fused projection's heads share
// one buffer laid out like it; a contiguous input gets a contiguous gradient).
#include "tessel/ops/attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>

#include "tessel/core/context.h"
#include "tessel/core/view.h"
#include "tessel/ops/attention_kernel.h"
#include "tessel/ops/dispatch.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ops/op_list.h"
#include "tessel/sharding/spmd_rules.h"

namespace tessel {

using attention_kernel::Dims;
using attention_kernel::dims_of;
using attention_kernel::DropMask;
using attention_kernel::heads_major;

namespace {

// The mask of a call whose q is the piece at batch row b0 (after the dropout's row0) and head
// h0 of `heads` (0: q's own) of the global tensor; sdpa_infer has checked p.
DropMask drop_mask(const SdpaDropout& dr, const Dims& d, int64_t b0, int64_t h0, int64_t heads) {
  DropMask m;
  m.threshold = static_cast<uint32_t>(std::min(dr.p * 4294967296.0, 4294967295.0));
  m.keep_scale = 1.0 / (1.0 - dr.p);
  m.seed = dr.seed;
  m.stream = dr.stream;
  m.b0 = dr.row0 + b0;
  m.h0 = h0;
  m.heads = heads > 0 ? heads : d.H;
  m.queries = d.T;
  m.keys = d.S;
  return m;
}

// The op's dropout attributes: p, seed, stream and row0 from the caller, b0, h0 and heads
// (the piece's place among the global batch rows and heads) from the SPMD rule.
DropMask drop_mask_of(const Attrs& a, const Dims& d) {
  if (!a.has("dropout") || a.f("dropout") == 0.0) return {};
  const SdpaDropout dr{a.f("dropout"), static_cast<uint64_t>(a.i("seed")), static_cast<uint64_t>(a.i("stream")),
                       a.i("row0")};
  auto get = [&](const char* key) { return a.has(key) ? a.i(key) : 0; };
  return drop_mask(dr, d, get("b0"), get("h0"), get("heads"));
}

// The scores' scale: `scale`, or 1/sqrt(D) when it is 0.
double resolved_scale(double scale, int64_t D) {
  return scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(D, 1)));
}
double scale_of(const Attrs& attrs, int64_t D) { return resolved_scale(attrs.f("scale"), D); }

std::vector<TensorMeta> sdpa_infer(const MetaCall& c) {
  TESSEL_CHECK(c.inputs.size() == 3 || c.inputs.size() == 4,
               "sdpa: expected q, k, v and optionally the document starts, got {} inputs", c.inputs.size());
  for (size_t i = 0; i < 3; ++i) {
    kernels::check_floating(c, i);
    kernels::check_same_dtype(c, 0, i);
    kernels::check_ndim(c, i, 4);
  }
  const Shape& q = c.inputs[0].shape;
  const Shape& k = c.inputs[1].shape;
  const Shape& v = c.inputs[2].shape;
  TESSEL_CHECK(k == v, "sdpa: k {} and v {} must have one shape [B, Hkv, S, D]", shape_str(k), shape_str(v));
  TESSEL_CHECK(q[0] == k[0], "sdpa: batch differs: q {} has B={} but k {} has B={}", shape_str(q), q[0], shape_str(k),
               k[0]);
  TESSEL_CHECK(q[3] == k[3], "sdpa: head dim differs: q {} has D={} but k {} has D={}", shape_str(q), q[3],
               shape_str(k), k[3]);
  TESSEL_CHECK(k[1] > 0 && q[1] % k[1] == 0,
               "sdpa: query heads H={} (q {}) must be a multiple of kv heads Hkv={} (k {})", q[1], shape_str(q), k[1],
               shape_str(k));
  if (c.inputs.size() == 4) {
    const TensorMeta& docs = c.inputs[3];
    TESSEL_CHECK(docs.dtype == DType::i64, "sdpa: document starts must be i64, got {}", dtype_name(docs.dtype));
    TESSEL_CHECK(docs.shape.size() == 2 && docs.shape[0] == q[0] && docs.shape[1] >= 1,
                 "sdpa: document starts must be [B, N] with B={} (q {}) and N >= 1, got {}", q[0], shape_str(q),
                 shape_str(docs.shape));
  }
  if (c.attrs.has("dropout")) {
    const double p = c.attrs.f("dropout");
    TESSEL_CHECK(p >= 0.0 && p < 1.0, "sdpa: attention dropout p={} must be in [0, 1)", p);
  }
  DType dt = c.inputs[0].dtype;
  return {TensorMeta{q, dt, {}}, TensorMeta{{q[0], q[1], q[2]}, dt, {}}};
}

// The document starts as a contiguous i64 tensor, or undefined without documents.
Tensor contig_docs(const Tensor& docs) { return docs.defined() ? kernels::contig(docs) : Tensor(); }
Tensor docs_of(std::span<const Tensor> inputs) { return inputs.size() == 4 ? contig_docs(inputs[3]) : Tensor(); }

std::vector<Tensor> sdpa_forward(const OpCall& c) {
  const Dims d = dims_of(c.inputs[0].shape(), c.inputs[1].shape());
  Tensor out = heads_major(d.B, d.H, d.T, d.D, c.outputs[0].dtype);
  Tensor lse = Tensor::empty(c.outputs[1]);
  attention_kernel::forward(d, scale_of(c.attrs, d.D), c.attrs.b("causal"), docs_of(c.inputs), drop_mask_of(c.attrs, d),
                            c.inputs[0], c.inputs[1], c.inputs[2], out, lse);
  return {out, lse};
}

// When q, k and v are the heads of one fused projection — views of one buffer whose rows
// hold q's heads, k's and v's side by side, `row` elements apart — dq, dk and dv are laid out
// the same way in one new buffer, so split's backward joins them into the projection's
// gradient without a copy. Empty when they are not (separate projections, or q, k and v one
// tensor as in a test).
std::optional<std::array<Tensor, 3>> grads_like_fused_inputs(const GradCall& c) {
  // (sdpa_infer has checked that the three share B and the dtype.)
  const Tensor& q = c.inputs[0];
  if (!(c.needs_grad[0] && c.needs_grad[1] && c.needs_grad[2]) || q.numel() == 0) return std::nullopt;
  const int64_t row = q.stride(2), batch = q.stride(0);
  int64_t lo = q.offset();
  for (size_t i = 0; i < 3; ++i) {
    const Tensor& t = c.inputs[i];
    bool packed = t.storage() == q.storage() && t.numel() > 0 && t.stride(3) == 1 && t.stride(1) == t.size(3) &&
                  t.stride(2) == row && t.stride(0) == batch && t.size(2) * row <= batch;
    if (!packed) return std::nullopt;
    lo = std::min(lo, t.offset());
  }
  // Each tensor's columns within a row, [col, col + H·D): they must fit the row and not overlap.
  std::array<std::pair<int64_t, int64_t>, 3> cols;
  for (size_t i = 0; i < 3; ++i) {
    const Tensor& t = c.inputs[i];
    const int64_t col = t.offset() - lo, width = t.size(1) * t.size(3);
    if (col + width > row) return std::nullopt;
    cols[i] = {col, col + width};
  }
  std::sort(cols.begin(), cols.end());
  if (cols[0].second > cols[1].first || cols[1].second > cols[2].first) return std::nullopt;
  Tensor buf = Tensor::empty({q.size(0) * batch}, q.dtype());
  std::array<Tensor, 3> out;
  for (size_t i = 0; i < 3; ++i) {
    const Tensor& t = c.inputs[i];
    out[i] = view::as_strided(buf, t.shape(), t.strides(), t.offset() - lo);
  }
  return out;
}

std::vector<Tensor> sdpa_backward(const GradCall& c) {
  Dims d = dims_of(c.input_metas[0].shape, c.input_metas[1].shape);
  double scale = scale_of(c.attrs, d.D);
  DType dt = c.input_metas[0].dtype;
  Tensor dq, dk, dv;
  if (auto fused = grads_like_fused_inputs(c)) {
    dq = (*fused)[0];
    dk = (*fused)[1];
    dv = (*fused)[2];
  } else {
    // A contiguous input gets a contiguous gradient: the autograd engine keeps it as the
    // leaf's gradient as it is (a heads-major one it would copy, 3 × 32 MiB per call at
    // bench/attention_bench's shapes); any other layout gets the heads-major one, which the
    // usual [B, T, H, D] view of a projection takes back without a copy.
    auto grad_like = [&](size_t i, int64_t heads, int64_t rows) {
      if (!c.needs_grad[i]) return Tensor();
      if (c.inputs[i].is_contiguous()) return Tensor::empty({d.B, heads, rows, d.D}, dt);
      return heads_major(d.B, heads, rows, d.D, dt);
    };
    dq = grad_like(0, d.H, d.T);
    dk = grad_like(1, d.Hkv, d.S);
    dv = grad_like(2, d.Hkv, d.S);
  }
  attention_kernel::backward(d, scale, c.attrs.b("causal"), docs_of(c.inputs), drop_mask_of(c.attrs, d), c.inputs[0],
                             c.inputs[1], c.inputs[2], c.outputs[0], c.outputs[1], c.grad_outputs[0], dq, dk, dv);
  if (c.inputs.size() == 4) return {dq, dk, dv, Tensor()};
  return {dq, dk, dv};
}

// Two gemms of 2·T·S·D each per (b, h): 4·B·H·T·S·D, the full count even when causal or
// masked by documents (the model-FLOPs convention), plus ~5 per score for the softmax. The
// kernel computes only the blocks some query sees (about half when causal); an efficiency
// measured against this count, as `tessel cluster detect` does, absorbs that.
Cost sdpa_cost(const MetaCall& c, std::span<const TensorMeta> out) {
  Dims d = dims_of(c.inputs[0].shape, c.inputs[1].shape);
  double scores = static_cast<double>(d.B * d.H) * static_cast<double>(d.T * d.S);
  return Cost{4.0 * scores * static_cast<double>(d.D) + 5.0 * scores, kernels::io_bytes(c, out)};
}

// ---------------------------------------------------------------- SPMD rule
// q "bh..", k and v "bh..", docs "b." -> out "bh.." (and LSE "bh." alike, computed on each
// rank's pieces): the batch may be sharded (q, k, v and the document starts alike), and so
// may the heads — q's H and k/v's Hkv over the same mesh dims — when every rank's pieces keep
// the grouping: its query heads [h0, h0 + Hl) are exactly the groups of its kv heads
// [g0, g0 + Gl) (h0 = g0·G, Hl = Gl·G, G = H / Hkv) and it has a kv head at all. Uneven
// splits can break that (H=6, Hkv=3 over 2 ranks: kv [2, 1] but q [3, 3]); then heads stay
// whole. T, S and D are always whole; Partial inputs are reduced first (nonlinear).

bool heads_keep_groups(const SpmdCall& c, const SpmdDecision& d) {
  const Shape& q = c.inputs[0].shape;
  const Shape& k = c.inputs[1].shape;
  bool sharded = false;
  for (const Placement& p : d.inputs[0]) sharded = sharded || p.is_shard(1);
  if (!sharded) return true;
  if (k[1] <= 0 || q[1] % k[1] != 0) return false;  // infer rejects it
  const int64_t G = q[1] / k[1];
  const DistAttr qa(c.mesh(), d.inputs[0]), ka(c.mesh(), d.inputs[1]);
  for (int64_t r : c.mesh().process_ids()) {
    const int64_t h0 = qa.local_offset(q, r)[1], hl = qa.local_shape(q, r)[1];
    const int64_t g0 = ka.local_offset(k, r)[1], gl = ka.local_shape(k, r)[1];
    if (gl == 0 || h0 != g0 * G || hl != gl * G) return false;
  }
  return true;
}

// Batch and heads as above, for a call whose sequence is whole.
SpmdDecision sdpa_batch_heads(const SpmdCall& c) {
  const bool docs = c.inputs.size() == 4;
  auto labels = [docs](std::string qkv) {
    std::vector<std::string> in(3, qkv);
    if (docs) in.push_back(qkv.substr(0, 1) + ".");
    return in;
  };
  spmd::LabelRule r{labels("bh.."), "bh..", spmd::Linearity::none};
  SpmdDecision d = spmd::label_rule(c, r);
  if (heads_keep_groups(c, d)) return d;
  r = spmd::LabelRule{labels("b..."), "b...", spmd::Linearity::none};
  return spmd::label_rule(c, r);
}

// Context parallel: with the attribute "cp" (set by the model's layers under parallel.cp), the
// mesh dim named cp, when it splits q's sequence (T, dim 2), keeps it split, by the method it names
// (docs/attention.md); without it the sequence is gathered, as before:
//   ring                q, k, v "bhT." over that dim, out alike — the dist layer's ring
//                       attention (custom: key/value blocks pass around the dim's ranks). The
//                       attribute also says how the sequence is held: in the load-balanced
//                       order (rank r of n holds chunks r and 2n-1-r of 2n), as the data loader
//                       lays the tokens out for it; on one rank that is the natural order;
//   all_to_all          q, k, v and out "bH..": the reshard S(2) -> S(1) (an all_to_all over the
//                       dim) before the local kernel, which then sees whole sequences of fewer
//                       heads; the caller reshards the output back.
// The other mesh dims are decided as if the sequence were whole; the document starts are
// replicated over the sequence dims.
SpmdDecision sdpa_spmd_placements(const SpmdCall& c) {
  const Placements all_r = spmd::replicated(c);
  const bool docs = c.inputs.size() == 4;
  bool well_formed = c.inputs.size() == 3 || (docs && c.inputs[3].shape.size() == 2);
  for (size_t i = 0; i < 3 && i < c.inputs.size(); ++i) well_formed = well_formed && c.inputs[i].shape.size() == 4;
  if (!well_formed)  // infer rejects it
    return SpmdDecision{std::vector<Placements>(c.inputs.size(), all_r), {all_r}};
  // Only the mesh dim named cp: the loader lays the sequence out for it (the ring's order), and
  // a rule that put the sequence on another dim (dp, when a batch of one cannot be split over
  // it) leaves it in the natural order there, which the whole-sequence kernel then sees.
  std::vector<size_t> seq_dims;
  const Placements& qp = c.input_attrs[0].placements;
  const int64_t cp = c.attrs.has("cp") ? c.mesh().find_dim("cp") : -1;
  if (cp >= 0 && qp[static_cast<size_t>(cp)].is_shard(2) && c.mesh().dim_size(cp) > 1)
    seq_dims.push_back(static_cast<size_t>(cp));
  if (seq_dims.empty()) return sdpa_batch_heads(c);
  std::vector<DistAttr> whole(c.input_attrs.begin(), c.input_attrs.end());
  for (DistAttr& a : whole)
    for (size_t m : seq_dims) a.placements[m] = Replicate();
  const SpmdCall rest{c.op, c.inputs, whole, c.attrs, c.rank};
  SpmdDecision d = sdpa_batch_heads(rest);
  const std::string& method = c.attrs.s("cp");
  TESSEL_CHECK(method == "ring" || method == "all_to_all",
               "sdpa: context-parallel method (attribute cp) must be ring or all_to_all, got '{}'", method);
  const int64_t split = method == "ring" ? 2 : 1;
  for (size_t m : seq_dims) {
    for (size_t i = 0; i < 3; ++i) d.inputs[i][m] = Shard(split);
    d.outputs[0][m] = Shard(split);
  }
  if (method == "all_to_all") {
    TESSEL_CHECK(heads_keep_groups(c, d),
                 "sdpa: context parallel all_to_all splits the heads of q {} and k {} over the sequence's mesh dims "
                 "too, and their pieces do not keep whole query groups (H / Hkv) with a kv head each; use ring",
                 shape_str(c.inputs[0].shape), shape_str(c.inputs[1].shape));
    return d;
  }
  TESSEL_CHECK(seq_dims.size() == 1, "sdpa: ring attention splits the sequence over one mesh dim, got {} ({})",
               seq_dims.size(), placements_str(qp));
  d.custom = true;
  return d;
}

// With dropout the kernel draws each probability's mask at its global index: the local call
// (and ring attention's block calls) get the global batch row and head of this rank's piece of
// q, and the global head count.
SpmdDecision with_drop_offsets(const SpmdCall& c, SpmdDecision d) {
  if (!c.attrs.has("dropout") || c.attrs.f("dropout") == 0.0) return d;
  const Shape& q = c.inputs[0].shape;
  const Shape at = DistAttr(c.mesh(), d.inputs[0]).local_offset(q, c.rank);
  Attrs a = c.attrs;
  a.set("b0", at[0]).set("h0", at[1]).set("heads", q[1]);
  d.local_attrs = a;
  return d;
}

SpmdDecision sdpa_spmd(const SpmdCall& c) { return with_drop_offsets(c, sdpa_spmd_placements(c)); }

}  // namespace

// Hidden output 1: the log-sum-exp LSE [B, H, T] of each query's scores, saved with q, k, v,
// the document starts and out.
const OpDef op_sdpa{.name = "sdpa", .num_inputs = -1, .num_hidden = 1, .infer = sdpa_infer, .forward = sdpa_forward,
                    .backward = sdpa_backward, .cost = sdpa_cost, .spmd = sdpa_spmd, .save = {0b1111, 0b11},
                    .autocast = AutocastPolicy::lower,
                    .attrs = "causal: bool = false, scale: float = 0.0, cp: str?, dropout: float?, "
                              "seed: int?, stream: int?, row0: int?, b0: int?, h0: int?, heads: int?"};

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                                    bool /*recompute_probs: nothing quadratic is kept to drop*/) {
  return call_op1(op_sdpa, {q, k, v}, Attrs{{"causal", causal}, {"scale", scale}});
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc_starts,
                                    bool causal, double scale, std::string_view cp_method, const SdpaDropout& dropout) {
  Attrs attrs{{"causal", causal}, {"scale", scale}};
  if (!cp_method.empty()) attrs.set("cp", std::string(cp_method));
  if (dropout.p != 0.0) {
    attrs.set("dropout", dropout.p)
        .set("seed", static_cast<int64_t>(dropout.seed))
        .set("stream", static_cast<int64_t>(dropout.stream))
        .set("row0", dropout.row0);
  }
  if (!doc_starts.defined()) return call_op1(op_sdpa, {q, k, v}, attrs);
  return call_op1(op_sdpa, {q, k, v, doc_starts}, attrs);
}

namespace {
Dims block_dims(const Tensor& q, const Tensor& k, const SdpaBlockPlace& at) {
  TESSEL_CHECK(q.dim() == 4 && k.dim() == 4 && q.size(0) == k.size(0) && q.size(3) == k.size(3) && k.size(1) > 0 &&
                   q.size(1) % k.size(1) == 0,
               "sdpa block: q {} and k {} must be [B, H, T, D] and [B, Hkv, S, D] with H a multiple of Hkv", q.str(),
               k.str());
  Dims d = dims_of(q.shape(), k.shape());
  d.q0 = at.q0;
  d.k0 = at.k0;
  d.total = at.total;
  return d;
}

// A block's dropout: its queries and keys at their global positions of a sequence of `total`.
DropMask block_drop(const SdpaBlockPlace& at, const Dims& d) {
  if (at.dropout.p == 0.0) return {};
  DropMask m = drop_mask(at.dropout, d, at.b0, at.h0, at.heads);
  m.q0 = at.q0;
  m.k0 = at.k0;
  m.queries = m.keys = at.total;
  return m;
}
}  // namespace

std::array<Tensor, 2> sdpa_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc_starts,
                                         bool causal, double scale, const SdpaBlockPlace& at) {
  // Called by the ring (dist/ring_attention.cc), not through dispatch: on q's device here.
  kernels::check_same_device("sdpa block", q, k);
  kernels::check_same_device("sdpa block", q, v);
  DeviceScope on(q.device());
  const Dims d = block_dims(q, k, at);
  Tensor out = heads_major(d.B, d.H, d.T, d.D, q.dtype());
  Tensor lse = Tensor::empty({d.B, d.H, d.T}, q.dtype());
  kernels::host_kernel("sdpa block", q.device(), [&] {
    attention_kernel::forward(d, resolved_scale(scale, d.D), causal, contig_docs(doc_starts), block_drop(at, d), q, k,
                              v, out, lse);
  });
  return {out, lse};
}

std::array<Tensor, 3> sdpa_block_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                          const Tensor& lse, const Tensor& dout, const Tensor& doc_starts, bool causal,
                                          double scale, const SdpaBlockPlace& at) {
  DeviceScope on(q.device());
  const Dims d = block_dims(q, k, at);
  const DType dt = q.dtype();
  Tensor dq = heads_major(d.B, d.H, d.T, d.D, dt), dk = heads_major(d.B, d.Hkv, d.S, d.D, dt),
         dv = heads_major(d.B, d.Hkv, d.S, d.D, dt);
  kernels::host_kernel("sdpa block backward", q.device(), [&] {
    attention_kernel::backward(d, resolved_scale(scale, d.D), causal, contig_docs(doc_starts), block_drop(at, d), q, k,
                               v, out, lse, dout, dq, dk, dv);
  });
  return {dq, dk, dv};
}

}  // namespace tessel
