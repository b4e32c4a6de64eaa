// Dropout with masks drawn from the counter-based RNG at each element's global index, so a
// shard's mask is exactly that slice of the serial mask.
#pragma once

#include "tessel/core/philox.h"
#include "tessel/core/tensor.h"

namespace tessel {

// A dim of the global tensor that holds the sequence in ring attention's load-balanced order
// over `ranks` cp ranks (rank r holds chunks r and 2·ranks-1-r of 2·ranks; parallel/data.h):
// dropout then draws each element's mask at its index in the natural order, as one rank does.
// dim -1: the tensor is in the natural order.
struct SequenceOrder {
  int64_t dim = -1;
  int64_t ranks = 1;
};

// Zeroes each element with probability p (uniform at its global index < p) and scales the
// rest by 1/(1-p); p must be in [0, 1). `box` places x inside its global tensor (empty: x is
// the whole tensor); `order` says when a dim of that tensor is in ring attention's order. The
// backward draws the same mask again, so nothing is stored.
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t stream, const GlobalBox& box = {},
               const SequenceOrder& order = {});

}  // namespace tessel
