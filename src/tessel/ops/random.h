// Dropout with masks drawn from the counter-based RNG at each element's global index, so a
// shard's mask is exactly that slice of the serial mask.
#pragma once

#include "tessel/core/philox.h"
#include "tessel/core/tensor.h"

namespace tessel {

// Zeroes each element with probability p (uniform at its global index < p) and scales the
// rest by 1/(1-p); p must be in [0, 1). `box` places x inside its global tensor (empty: x is
// the whole tensor). The backward draws the same mask again, so nothing is stored.
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream, const GlobalBox& box = {});

}  // namespace tessel
