// Scaled dot-product attention, the plain (non-flash) form: per (batch, head) two gemms
// around a row softmax, with the probabilities P kept as a hidden output for backward. The
// (b, h) loop is sequential because OpenBLAS threads each gemm itself; only the row softmax
// runs on the intra-op pool. Grouped-query attention reads kv head h / (H / Hkv), and the
// backward accumulates dK and dV over the query heads of a group in head order.
//
// Shapes: q[B, H, T, D], k and v[B, Hkv, S, D], P[B, H, T, S], out[B, H, T, D]
//   forward   P = softmax(q k^T · scale + causal mask),  out = P v
//   backward  dV += P^T dO;  dP = dO V^T;  dS = P ⊙ (dP - rowsum(dP ⊙ P))
//             dQ = dS K · scale;  dK += dS^T Q · scale
// Causal hides key j from query i when j > i + (S - T) (aligned at the bottom right). A query
// that sees no key (only when T > S) gets P = 0 and out = 0 rather than NaN.
#include "tessel/ops/attention.h"

#include <cmath>
#include <limits>

#include "tessel/ops/dispatch.h"
#include "tessel/ops/fast_math.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ops/op_list.h"

namespace tessel {

using kernels::gemm;

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
  return {TensorMeta{q, dt, {}}, TensorMeta{{q[0], q[1], q[2], k[2]}, dt, {}}};
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

int64_t row_grain(int64_t S) { return std::max<int64_t>(1, kernels::kElementGrain / std::max<int64_t>(1, S)); }

template <typename T>
void sdpa_forward_t(const Dims& d, bool causal, T scale, const T* q, const T* k, const T* v, T* out, T* P) {
  const int64_t ld_d = std::max<int64_t>(d.D, 1), ld_s = std::max<int64_t>(d.S, 1);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t kvh = b * d.Hkv + h / d.group();
      const T* qb = q + (b * d.H + h) * d.T * d.D;
      const T* kb = k + kvh * d.S * d.D;
      const T* vb = v + kvh * d.S * d.D;
      T* pb = P + (b * d.H + h) * d.T * d.S;
      // scores[T, S] = q[T, D] @ k[S, D]^T · scale
      gemm<T>(false, true, d.T, d.S, d.D, scale, qb, ld_d, kb, ld_d, T(0), pb, ld_s);
      parallel_for(0, d.T, row_grain(d.S), [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) masked_softmax_row(pb + t * d.S, visible_keys(d, causal, t), d.S);
      });
      // out[T, D] = P[T, S] @ v[S, D]
      gemm<T>(false, false, d.T, d.D, d.S, T(1), pb, ld_s, vb, ld_d, T(0), out + (b * d.H + h) * d.T * d.D, ld_d);
    }
}

std::vector<Tensor> sdpa_forward(const OpCall& c) {
  Tensor q = kernels::contig(c.inputs[0]), k = kernels::contig(c.inputs[1]), v = kernels::contig(c.inputs[2]);
  Dims d = dims_of(q.shape(), k.shape());
  bool causal = c.attrs.b("causal");
  double scale = scale_of(c.attrs, d.D);
  Tensor out = Tensor::empty(c.outputs[0]);
  Tensor P = Tensor::empty(c.outputs[1]);
  TESSEL_DISPATCH_FLOAT(q.dtype(), "sdpa", [&]<typename T>() {
    sdpa_forward_t<T>(d, causal, static_cast<T>(scale), q.data<T>(), k.data<T>(), v.data<T>(), out.data<T>(),
                      P.data<T>());
  });
  return {out, P};
}

template <typename T>
void sdpa_backward_t(const Dims& d, T scale, const T* q, const T* k, const T* v, const T* P, const T* dO, T* dq, T* dk,
                     T* dv) {
  const int64_t ld_d = std::max<int64_t>(d.D, 1), ld_s = std::max<int64_t>(d.S, 1);
  std::vector<T> ds(static_cast<size_t>(d.T * d.S));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t bh = b * d.H + h, kvh = b * d.Hkv + h / d.group();
      const T* pb = P + bh * d.T * d.S;
      const T* gb = dO + bh * d.T * d.D;
      // dV[S, D] += P^T[S, T] @ dO[T, D]
      if (dv != nullptr)
        gemm<T>(true, false, d.S, d.D, d.T, T(1), pb, ld_s, gb, ld_d, T(1), dv + kvh * d.S * d.D, ld_d);
      if (dq == nullptr && dk == nullptr) continue;
      // dP[T, S] = dO[T, D] @ V^T, then dS = P ⊙ (dP - rowsum(dP ⊙ P))
      gemm<T>(false, true, d.T, d.S, d.D, T(1), gb, ld_d, v + kvh * d.S * d.D, ld_d, T(0), ds.data(), ld_s);
      parallel_for(0, d.T, row_grain(d.S), [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) softmax_grad_row(pb + t * d.S, ds.data() + t * d.S, d.S);
      });
      // dQ[T, D] = dS[T, S] @ K[S, D] · scale
      if (dq != nullptr)
        gemm<T>(false, false, d.T, d.D, d.S, scale, ds.data(), ld_s, k + kvh * d.S * d.D, ld_d, T(0),
                dq + bh * d.T * d.D, ld_d);
      // dK[S, D] += dS^T[S, T] @ Q[T, D] · scale
      if (dk != nullptr)
        gemm<T>(true, false, d.S, d.D, d.T, scale, ds.data(), ld_s, q + bh * d.T * d.D, ld_d, T(1),
                dk + kvh * d.S * d.D, ld_d);
    }
}

std::vector<Tensor> sdpa_backward(const GradCall& c) {
  Tensor q = kernels::contig(c.inputs[0]), k = kernels::contig(c.inputs[1]), v = kernels::contig(c.inputs[2]);
  Tensor P = kernels::contig(c.outputs[1]);
  Tensor dO = kernels::contig(c.grad_outputs[0]);
  Dims d = dims_of(q.shape(), k.shape());
  double scale = scale_of(c.attrs, d.D);
  Tensor dq = c.needs_grad[0] ? Tensor::empty(q.shape(), q.dtype()) : Tensor();
  Tensor dk = c.needs_grad[1] ? Tensor::zeros(k.shape(), k.dtype()) : Tensor();
  Tensor dv = c.needs_grad[2] ? Tensor::zeros(v.shape(), v.dtype()) : Tensor();
  TESSEL_DISPATCH_FLOAT(q.dtype(), "sdpa", [&]<typename T>() {
    sdpa_backward_t<T>(d, static_cast<T>(scale), q.data<T>(), k.data<T>(), v.data<T>(), P.data<T>(), dO.data<T>(),
                       dq.defined() ? dq.data<T>() : nullptr, dk.defined() ? dk.data<T>() : nullptr,
                       dv.defined() ? dv.data<T>() : nullptr);
  });
  return {dq, dk, dv};
}

// Two gemms of 2·T·S·D each per (b, h): 4·B·H·T·S·D, the full count even when causal (the
// model-FLOPs convention; half of it is masked work), plus ~5 per score for the softmax.
Cost sdpa_cost(const MetaCall& c, std::span<const TensorMeta> out) {
  Dims d = dims_of(c.inputs[0].shape, c.inputs[1].shape);
  double scores = static_cast<double>(d.B * d.H) * static_cast<double>(d.T * d.S);
  return Cost{4.0 * scores * static_cast<double>(d.D) + 5.0 * scores, kernels::io_bytes(c, out)};
}

}  // namespace

// Hidden output 1: the probabilities P [B, H, T, S], saved with q, k and v.
const OpDef op_sdpa{.name = "sdpa", .num_inputs = 3, .num_hidden = 1, .infer = sdpa_infer, .forward = sdpa_forward,
                    .backward = sdpa_backward, .cost = sdpa_cost, .save = {0b111, 0b10}};

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  return call_op1(op_sdpa, {q, k, v}, Attrs{{"causal", causal}, {"scale", scale}});
}

}  // namespace tessel
