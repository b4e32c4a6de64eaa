// Scaled dot-product attention.
#pragma once

#include "tessel/core/tensor.h"

namespace tessel {

// out[B, H, T, D] = softmax(q k^T · scale (+ causal mask)) v for q [B, H, T, D] and k, v
// [B, Hkv, S, D] with H a multiple of Hkv (grouped-query attention: query head h reads kv
// head h / (H / Hkv)). Causal hides key j from query i when j > i + (S - T); a query that
// sees no key (causal with T > S) gets zeros. scale 0 means 1/sqrt(D). q, k, v may be strided
// views (e.g. a permuted [B, T, H, D]).
// recompute_probs: keep no [B, H, T, S] probabilities for the backward but rebuild them there
// block by block (selective activation recompute); the gradients are the same bits.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                    double scale = 0.0, bool recompute_probs = false);

}  // namespace tessel
