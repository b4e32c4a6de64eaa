// Scaled dot-product attention: one fused, memory-efficient kernel (FlashAttention-style;
// docs/attention.md).
#pragma once

#include "tessel/core/tensor.h"

namespace tessel {

// out[B, H, T, D] = softmax(q k^T · scale (+ causal mask)) v for q [B, H, T, D] and k, v
// [B, Hkv, S, D] with H a multiple of Hkv (grouped-query attention: query head h reads kv
// head h / (H / Hkv)). Causal hides key j from query i when j > i + (S - T); a query that
// sees no key (causal with T > S) gets zeros. scale 0 means 1/sqrt(D). q, k, v may be strided
// views (e.g. a permuted [B, T, H, D]). Nothing of size T×S is kept for the backward (only
// out and a log-sum-exp per query row), so memory is linear in the sequence.
// recompute_probs: accepted for the callers of selective recompute and ignored — the fused
// kernel never keeps the probabilities, so there is nothing left to recompute.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                    double scale = 0.0, bool recompute_probs = false);

// The same with document masks for packed sequences: doc_starts [B, N] (i64) lists, per
// batch row, the key positions where its documents start — ascending, the first 0, within
// [0, S]; a row with fewer documents pads with S (empty documents). Query i (at key position
// i + S - T) sees only keys of its own document (and, when causal, none after it). One list
// for the whole batch is an expand of a [1, N] tensor. An undefined doc_starts is one
// document per row.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc_starts,
                                    bool causal = false, double scale = 0.0);

}  // namespace tessel
