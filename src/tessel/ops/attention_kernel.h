// The fused attention kernel behind the op sdpa (ops/attention.cc: the op, its SPMD rule and
// the block calls of ring attention): tiled forward and backward over plain tensors, never
// holding a [T, S] matrix (attention_kernel.cc says how). Internal to ops/.
#pragma once

#include <algorithm>
#include <cstdint>

#include "tessel/core/tensor.h"
#include "tessel/core/view.h"
#include "tessel/ops/attention.h"

namespace tessel::attention_kernel {

// Outputs written once (out in the forward, dK and dV in the backward) of at least this many
// bytes are stored past the caches: at T = 1k an ordinary store first reads each line from
// memory, and the forward + backward ran 2.5% slower (docs/attention.md). Smaller outputs stay
// in cache for the op that reads them next.
inline constexpr int64_t kStreamBytes = int64_t{8} << 20;

// q0 and k0: the global positions of query 0 and key 0 (the op: S - T and 0, aligned at the
// bottom right; ring attention's blocks: where their chunks sit in the whole sequence), and
// `total` the positions the document starts index (the op: S).
struct Dims {
  int64_t B, H, Hkv, T, S, D;
  int64_t q0 = 0, k0 = 0, total = 0;
  int64_t group() const { return H / Hkv; }
};

inline Dims dims_of(const Shape& q, const Shape& k) {
  return Dims{q[0], q[1], k[1], q[2], k[2], q[3], k[2] - q[2], 0, k[2]};
}

// The dropout of one call: where its q sits in the global [B, H, T, S] tensor of
// probabilities (batch row b0, head h0 of `heads`, query q0 of `queries`, key k0 of `keys`)
// and the Philox stream. Off when p is 0.
struct DropMask {
  uint64_t seed = 0, stream = 0;
  uint32_t threshold = 0;  // a word below it drops
  double keep_scale = 1.0;
  int64_t b0 = 0, h0 = 0, heads = 0, q0 = 0, queries = 0, k0 = 0, keys = 0;
  bool on() const { return threshold > 0; }
};

// A new [B, H, T, D] tensor laid out as [B, T, H, D] in memory, so that the usual
// permute-and-merge of heads after attention is a view, not a copy.
Tensor heads_major(int64_t B, int64_t H, int64_t T, int64_t D, DType dtype);

// A [B, H, T, D] operand as BLAS reads it: head (b, h) starts at base + b·sb + h·sh and its
// T rows are `ld` apart with D contiguous. Views such as a permuted [B, T, H, D] projection
// are read in place; only layouts with a strided D are copied (into `keep`, which holds
// whatever `base` points into). (bench/attention_reference.cc's frozen kernel reads its
// operands the same way.)
template <typename T>
struct Heads {
  T* base = nullptr;
  int64_t sb = 0, sh = 0, ld = 0;
  T* at(int64_t b, int64_t h) const { return base + b * sb + h * sh; }
};

template <typename T>
Heads<T> heads_of(const Tensor& t, Tensor& keep) {
  const int64_t D = t.size(3), rows = t.size(2);
  bool direct = (t.stride(3) == 1 || D <= 1) && (rows <= 1 || t.stride(2) >= std::max<int64_t>(D, 1));
  keep = direct ? t : view::contiguous(t);
  int64_t ld = rows <= 1 ? std::max<int64_t>(D, 1) : keep.stride(2);
  return Heads<T>{keep.data<T>(), keep.stride(0), keep.stride(1), ld};
}

// out [B, H, T, D] and the log-sum-exp lse [B, H, T] (allocated by the caller, lse
// contiguous) of q [B, H, T, D] against k, v [B, Hkv, S, D]; docs: the document starts as a
// contiguous i64 [B, N], or undefined; scale already resolved (not 0).
void forward(const Dims& d, double scale, bool causal, const Tensor& docs, const DropMask& drop, const Tensor& q,
             const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse);

// dq, dk and dv (allocated by the caller; an undefined one is not wanted) from the forward's
// out and lse and the output's gradient dout.
void backward(const Dims& d, double scale, bool causal, const Tensor& docs, const DropMask& drop, const Tensor& q,
              const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& dout,
              const Tensor& dq, const Tensor& dk, const Tensor& dv);

}  // namespace tessel::attention_kernel
