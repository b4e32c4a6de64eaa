// Selection by masks: where, masked_fill, triu, and the causal mask built from triu.
#pragma once

#include "tessel/core/tensor.h"

namespace tessel {

// out = cond ? a : b, with cond (bool), a and b (one floating dtype) broadcast together.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// out = mask ? value : x, with the bool mask broadcast to x's shape.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// Keeps elements on and above the `diagonal`-th diagonal of the last two dims, zeroes the rest
// (bool inputs give false below).
Tensor triu(const Tensor& x, int64_t diagonal = 0);
// bool [t, s]: true where key j must be hidden from query i in causal attention, i.e.
// j > i + (s - t). s = -1 means s = t.
Tensor causal_mask(int64_t t, int64_t s = -1);

}  // namespace tessel
