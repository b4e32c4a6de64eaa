// The pre-fused attention kernel (keeps P [B, H, T, S] for the backward), for
// bench/attention_bench only: the reference the fused kernel is measured against.
#pragma once

#include "tessel/core/tensor.h"

namespace tessel::bench {

// softmax(q k^T / sqrt(D) (+ causal mask)) v, with autograd; shapes as
// scaled_dot_product_attention's.
Tensor unfused_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal);

}  // namespace tessel::bench
