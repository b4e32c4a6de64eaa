// The attention kernel tessel had before the fused one (src/tessel/ops/attention.cc), kept for
// bench/attention_bench only, as the reference its speed and memory are measured against: per
// (batch, head, block of queries) two gemms around a row softmax, with the probabilities P
// [B, H, T, S] kept as a hidden output for the backward. Not registered; no SPMD rule.
//
// Shapes: q[B, H, T, D], k and v[B, Hkv, S, D], P[B, H, T, S] (or [B, H, T, 0]), out[B, H, T, D]
//   forward   P = softmax(q k^T · scale + causal mask),  out = P v
//   backward  dV += P^T dO;  dP = dO V^T;  dS = P ⊙ (dP - rowsum(dP ⊙ P))
//             dQ = dS K · scale;  dK += dS^T Q · scale
// Causal hides key j from query i when j > i + (S - T) (aligned at the bottom right). A query
// that sees no key (only when T > S) gets P = 0 and out = 0 rather than NaN.
#include "attention_reference.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>

#include "attention_reference_gemm.h"
#include "tessel/ops/attention_kernel.h"
#include "tessel/ops/dispatch.h"
#include "tessel/ops/fast_math.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/sharding/spmd_rules.h"

namespace tessel::bench {

using reference_gemm::small_gemm;

namespace {

// Row reductions keep kLanes partial accumulators (lane k sums elements k, k + kLanes, ...;
// combined pairwise at the end, a fixed order). "#pragma GCC unroll 1" on the lane loop keeps
// GCC from unrolling it and then vectorising across rows of lanes with shuffles (3-7x slower).
constexpr int kLanes = 16;

struct Dims {
  int64_t B, H, Hkv, T, S, D;
  int64_t group() const { return H / Hkv; }
};

Dims dims_of(const Shape& q, const Shape& k) { return Dims{q[0], q[1], k[1], q[2], k[2], q[3]}; }

// Whether P is rebuilt in the backward instead of kept (absent: kept).
bool recompute_probs(const Attrs& attrs) { return attrs.b_or("recompute_probs", false); }

double scale_of(const Attrs& attrs, int64_t D) {
  double s = attrs.f("scale");
  return s != 0.0 ? s : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(D, 1)));
}

// Keys visible to query t: [0, n) with n = t + 1 + (S - T) clipped to [0, S] when causal.
int64_t visible_keys(const Dims& d, bool causal, int64_t t) {
  if (!causal) return d.S;
  return std::clamp<int64_t>(t + 1 + d.S - d.T, 0, d.S);
}

std::vector<TensorMeta> sdpa_infer(const MetaCall& c) {
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
  DType dt = c.inputs[0].dtype;
  const int64_t p_cols = recompute_probs(c.attrs) ? 0 : k[2];
  return {TensorMeta{q, dt, {}}, TensorMeta{{q[0], q[1], q[2], p_cols}, dt, {}}};
}

// p[0, S) = softmax(p[0, n)) in place, p[n, S) = 0 (all 0 when n = 0).
template <typename T>
void masked_softmax_row(T* __restrict p, int64_t n, int64_t S) {
  for (int64_t j = n; j < S; ++j) p[j] = T(0);
  if (n == 0) return;
  T mx[kLanes];
  for (int k = 0; k < kLanes; ++k) mx[k] = -std::numeric_limits<T>::infinity();
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    #pragma GCC unroll 1
    for (int k = 0; k < kLanes; ++k) mx[k] = p[j + k] > mx[k] ? p[j + k] : mx[k];
  }
  T m = mx[0];
  for (int k = 1; k < kLanes; ++k) m = mx[k] > m ? mx[k] : m;
  for (; j < n; ++j) m = p[j] > m ? p[j] : m;
  for (j = 0; j < n; ++j) p[j] = fast::exp_t<T>(p[j] - m);
  T acc[kLanes] = {};
  for (j = 0; j + kLanes <= n; j += kLanes) {
    #pragma GCC unroll 1
    for (int k = 0; k < kLanes; ++k) acc[k] += p[j + k];
  }
  for (int h = kLanes / 2; h > 0; h /= 2)
    for (int k = 0; k < h; ++k) acc[k] += acc[k + h];
  T s = acc[0];
  for (; j < n; ++j) s += p[j];
  const T inv = T(1) / s;
  for (j = 0; j < n; ++j) p[j] *= inv;
}

// ds[t, :] = p[t, :] ⊙ (dp[t, :] - Σ_s dp[t, s]·p[t, s]) in place over dp.
template <typename T>
void softmax_grad_row(const T* __restrict p, T* __restrict dp, int64_t S) {
  T acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= S; j += kLanes) {
    #pragma GCC unroll 1
    for (int k = 0; k < kLanes; ++k) acc[k] += dp[j + k] * p[j + k];
  }
  for (int h = kLanes / 2; h > 0; h /= 2)
    for (int k = 0; k < h; ++k) acc[k] += acc[k + h];
  T dot = acc[0];
  for (; j < S; ++j) dot += dp[j] * p[j];
  for (j = 0; j < S; ++j) dp[j] = p[j] * (dp[j] - dot);
}

// Operands are read as the fused kernel reads them (attention_kernel.h), outputs laid out as it
// lays them out.
using attention_kernel::Heads;
using attention_kernel::heads_major;
using attention_kernel::heads_of;

// Causal attention runs in blocks of kQueryBlock queries: a block computes scores only
// against the keys its last query sees, so the fully masked part of the T×S products (about
// half) is never computed; P's masked entries are written as 0 all the same. 32 rows measured
// best at T = 128..512, D = 64 (bench/ops_bench sdpa: 1.4-1.5x the unblocked kernel; 16 rows
// loses more to small gemms than it saves, 64 saves less). Non-causal attention is one block.
constexpr int64_t kQueryBlock = 32;

int64_t query_block(const Dims& d, bool causal) {
  return causal ? std::clamp<int64_t>(kQueryBlock, 1, std::max<int64_t>(d.T, 1)) : std::max<int64_t>(d.T, 1);
}

// kt[D, S] = k[S, D]^T (rows `ld` apart), so that products with k^T read their right-hand
// operand by contiguous rows, as small_gemm's vector loads need; the copy is D·S values per
// kv head, against 2·T·S·D multiply-adds per query head.
template <typename T>
void transpose_rows(const T* k, int64_t ld, int64_t S, int64_t D, T* kt) {
  constexpr int64_t kTile = 16;
  for (int64_t s0 = 0; s0 < S; s0 += kTile)
    for (int64_t d0 = 0; d0 < D; d0 += kTile)
      for (int64_t s = s0; s < std::min(S, s0 + kTile); ++s)
        for (int64_t d = d0; d < std::min(D, d0 + kTile); ++d) kt[d * S + s] = k[s * ld + d];
}

// P[rows, S] of query rows [t0, t0 + rows) of head h (rows ld_s = S apart), from q and the
// transposed keys kt[D, S] of its kv head: the forward's computation, which the backward
// repeats when P was not kept. Masked and unseen keys get 0.
template <typename T>
void probs_block(const Dims& d, bool causal, T scale, const Heads<T>& q, const T* kt, int64_t b, int64_t h, int64_t t0,
                 int64_t rows, T* pt) {
  const int64_t ld_s = std::max<int64_t>(d.S, 1), n = visible_keys(d, causal, t0 + rows - 1);
  // scores[rows, n] = q[rows, D] @ kt[D, n] · scale
  if (n > 0) small_gemm<T>(rows, n, d.D, scale, q.at(b, h) + t0 * q.ld, q.ld, 1, kt, ld_s, T(0), pt, ld_s);
  for (int64_t t = 0; t < rows; ++t) masked_softmax_row(pt + t * d.S, visible_keys(d, causal, t0 + t), d.S);
}

// P null: P is not kept, each block goes to a scratch of qb × S per task.
template <typename T>
void sdpa_forward_t(const Dims& d, bool causal, T scale, const Heads<T>& q, const Heads<T>& k, const Heads<T>& v,
                    const Heads<T>& out, T* P) {
  const int64_t ld_s = std::max<int64_t>(d.S, 1), qb = query_block(d, causal);
  // One task per (batch, kv head): its group of query heads shares the transposed keys.
  parallel_for(0, d.B * d.Hkv, 1, [&](int64_t lo, int64_t hi) {
    std::vector<T> kt(static_cast<size_t>(d.D * d.S));
    std::vector<T> scratch(P == nullptr ? static_cast<size_t>(qb * d.S) : 0);
    for (int64_t unit = lo; unit < hi; ++unit) {
      const int64_t b = unit / d.Hkv, kvh = unit % d.Hkv;
      transpose_rows(k.at(b, kvh), k.ld, d.S, d.D, kt.data());
      for (int64_t h = kvh * d.group(); h < (kvh + 1) * d.group(); ++h) {
        for (int64_t t0 = 0; t0 < d.T; t0 += qb) {
          const int64_t rows = std::min(qb, d.T - t0), n = visible_keys(d, causal, t0 + rows - 1);
          T* pt = P != nullptr ? P + (b * d.H + h) * d.T * d.S + t0 * d.S : scratch.data();
          probs_block(d, causal, scale, q, kt.data(), b, h, t0, rows, pt);
          // out[rows, D] = P[rows, n] @ v[n, D]
          T* ot = out.at(b, h) + t0 * out.ld;
          if (n > 0) {
            small_gemm<T>(rows, d.D, n, T(1), pt, ld_s, 1, v.at(b, kvh), v.ld, T(0), ot, out.ld);
          } else {
            for (int64_t t = 0; t < rows; ++t) std::fill(ot + t * out.ld, ot + t * out.ld + d.D, T(0));
          }
        }
      }
    }
  });
}

std::vector<Tensor> sdpa_forward(const OpCall& c) {
  Dims d = dims_of(c.inputs[0].shape(), c.inputs[1].shape());
  bool causal = c.attrs.b("causal");
  double scale = scale_of(c.attrs, d.D);
  Tensor out = heads_major(d.B, d.H, d.T, d.D, c.outputs[0].dtype);
  Tensor P = Tensor::empty(c.outputs[1]);  // [B, H, T, 0] when P is not kept
  const bool keep_p = !recompute_probs(c.attrs);
  TESSEL_DISPATCH_FLOAT(c.inputs[0].dtype(), "sdpa", [&]<typename T>() {
    Tensor kq, kk, kv, ko;
    Heads<T> q = heads_of<T>(c.inputs[0], kq), k = heads_of<T>(c.inputs[1], kk), v = heads_of<T>(c.inputs[2], kv);
    sdpa_forward_t<T>(d, causal, static_cast<T>(scale), q, k, v, heads_of<T>(out, ko), keep_p ? P.data<T>() : nullptr);
  });
  return {out, P};
}

// Query blocks run last to first: the last block sees every key, so the first head of a kv
// group writes all of dK and dV there (beta 0) and the rest accumulate, with no zero-fill.
// One task per (batch, kv head) runs the group's query heads in order, so dK and dV sum over
// them the same way whatever the thread count. P null: each block of P is rebuilt from q and
// k (probs_block) just before its use.
template <typename T>
void sdpa_backward_t(const Dims& d, bool causal, T scale, const Heads<T>& q, const Heads<T>& k, const Heads<T>& v,
                     const T* P, const Heads<T>& dO, const Heads<T>* dq, const Heads<T>* dk, const Heads<T>* dv) {
  const int64_t ld_s = std::max<int64_t>(d.S, 1), qb = query_block(d, causal);
  const int64_t blocks = (d.T + qb - 1) / qb;
  // Keys that no query sees (all of them when T = 0) get no product: their dK and dV rows are 0.
  const int64_t seen = blocks > 0 ? visible_keys(d, causal, d.T - 1) : 0;
  auto zero_unseen = [&](const Heads<T>* g, int64_t b, int64_t kvh) {
    if (g != nullptr)
      for (int64_t s = seen; s < d.S; ++s) std::fill_n(g->at(b, kvh) + s * g->ld, d.D, T(0));
  };
  parallel_for(0, d.B * d.Hkv, 1, [&](int64_t lo, int64_t hi) {
    std::vector<T> ds(static_cast<size_t>(qb * d.S)), vt(static_cast<size_t>(d.D * d.S));
    std::vector<T> kt(P == nullptr ? static_cast<size_t>(d.D * d.S) : 0), scratch(P == nullptr ? ds.size() : 0);
    for (int64_t unit = lo; unit < hi; ++unit) {
      const int64_t b = unit / d.Hkv, kvh = unit % d.Hkv;
      if (dq != nullptr || dk != nullptr) transpose_rows(v.at(b, kvh), v.ld, d.S, d.D, vt.data());
      if (P == nullptr) transpose_rows(k.at(b, kvh), k.ld, d.S, d.D, kt.data());
      zero_unseen(dk, b, kvh);
      zero_unseen(dv, b, kvh);
      for (int64_t h = kvh * d.group(); h < (kvh + 1) * d.group(); ++h) {
        const bool first_of_group = h == kvh * d.group();
        for (int64_t blk = blocks - 1; blk >= 0; --blk) {
          const int64_t t0 = blk * qb;
          const int64_t rows = std::min(qb, d.T - t0), n = visible_keys(d, causal, t0 + rows - 1);
          // The group's first product into dK and dV writes rows [0, seen) (n = seen here).
          const T kv_beta = first_of_group && blk == blocks - 1 ? T(0) : T(1);
          const T* gt = dO.at(b, h) + t0 * dO.ld;
          T* dst = ds.data();
          if (n == 0) {  // these queries see no key: P = 0, so dQ = 0 and nothing flows to K or V
            if (dq != nullptr)
              for (int64_t t = 0; t < rows; ++t) std::fill_n(dq->at(b, h) + (t0 + t) * dq->ld, d.D, T(0));
            continue;
          }
          const T* pt = P != nullptr ? P + (b * d.H + h) * d.T * d.S + t0 * d.S : scratch.data();
          if (P == nullptr) probs_block(d, causal, scale, q, kt.data(), b, h, t0, rows, scratch.data());
          // dV[n, D] += P^T[n, rows] @ dO[rows, D]
          if (dv != nullptr)
            small_gemm<T>(n, d.D, rows, T(1), pt, 1, ld_s, gt, dO.ld, kv_beta, dv->at(b, kvh), dv->ld);
          if (dq == nullptr && dk == nullptr) continue;
          // dP[rows, n] = dO[rows, D] @ vt[D, n], then dS = P ⊙ (dP - rowsum(dP ⊙ P))
          small_gemm<T>(rows, n, d.D, T(1), gt, dO.ld, 1, vt.data(), ld_s, T(0), dst, ld_s);
          for (int64_t t = 0; t < rows; ++t) softmax_grad_row(pt + t * d.S, dst + t * d.S, n);
          // dQ[rows, D] = dS[rows, n] @ K[n, D] · scale
          if (dq != nullptr)
            small_gemm<T>(rows, d.D, n, scale, dst, ld_s, 1, k.at(b, kvh), k.ld, T(0), dq->at(b, h) + t0 * dq->ld,
                          dq->ld);
          // dK[n, D] += dS^T[n, rows] @ Q[rows, D] · scale
          if (dk != nullptr)
            small_gemm<T>(n, d.D, rows, scale, dst, 1, ld_s, q.at(b, h) + t0 * q.ld, q.ld, kv_beta, dk->at(b, kvh),
                          dk->ld);
        }
      }
    }
  });
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
  for (const Tensor& t : c.inputs) {
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
    if (c.needs_grad[0]) dq = heads_major(d.B, d.H, d.T, d.D, dt);
    if (c.needs_grad[1]) dk = heads_major(d.B, d.Hkv, d.S, d.D, dt);
    if (c.needs_grad[2]) dv = heads_major(d.B, d.Hkv, d.S, d.D, dt);
  }
  const bool kept = !recompute_probs(c.attrs);
  Tensor P = kept ? kernels::contig(c.outputs[1]) : Tensor();
  TESSEL_DISPATCH_FLOAT(dt, "sdpa", [&]<typename T>() {
    Tensor keep[7];
    Heads<T> q = heads_of<T>(c.inputs[0], keep[0]), k = heads_of<T>(c.inputs[1], keep[1]),
             v = heads_of<T>(c.inputs[2], keep[2]), dO = heads_of<T>(c.grad_outputs[0], keep[3]);
    Heads<T> hq, hk, hv;
    if (dq.defined()) hq = heads_of<T>(dq, keep[4]);
    if (dk.defined()) hk = heads_of<T>(dk, keep[5]);
    if (dv.defined()) hv = heads_of<T>(dv, keep[6]);
    sdpa_backward_t<T>(d, c.attrs.b("causal"), static_cast<T>(scale), q, k, v, kept ? P.data<T>() : nullptr, dO,
                       dq.defined() ? &hq : nullptr, dk.defined() ? &hk : nullptr, dv.defined() ? &hv : nullptr);
  });
  return {dq, dk, dv};
}

// Two gemms of 2·T·S·D each per (b, h): 4·B·H·T·S·D, the full count even when causal (the
// model-FLOPs convention), plus ~5 per score for the softmax. The causal kernel computes only
// about half of it (1/2 + kQueryBlock/2T); an efficiency measured against this count, as
// `tessel cluster detect` does, absorbs that.
Cost sdpa_cost(const MetaCall& c, std::span<const TensorMeta> out) {
  Dims d = dims_of(c.inputs[0].shape, c.inputs[1].shape);
  double scores = static_cast<double>(d.B * d.H) * static_cast<double>(d.T * d.S);
  return Cost{4.0 * scores * static_cast<double>(d.D) + 5.0 * scores, kernels::io_bytes(c, out)};
}

const OpDef op_sdpa_unfused{.name = "sdpa_unfused", .num_inputs = 3, .num_hidden = 1, .infer = sdpa_infer,
                            .forward = sdpa_forward, .backward = sdpa_backward, .cost = sdpa_cost,
                            .save = {0b111, 0b10}};

}  // namespace

Tensor unfused_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  return call_op1(op_sdpa_unfused, {q, k, v}, Attrs{{"causal", causal}, {"scale", 0.0}});
}

}  // namespace tessel::bench
