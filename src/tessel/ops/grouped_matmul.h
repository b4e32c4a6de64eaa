// Grouped matrix products: one weight per group of consecutive rows (the experts of a mixture
// of experts, each applied to the tokens routed to it, sorted by expert).
#pragma once

#include <vector>

#include "tessel/core/tensor.h"

namespace tessel {

// y[N, F]: rows counts[0] of x go through w[0], the next counts[1] through w[1], and so on
// (Σ counts = N, counts.size() = E; a group may be empty). x is [N, K]; w is [E, K, F], or
// [E, F, K] used transposed when `trans_w` (PyTorch's [out, in] layout). One product per
// group on the intra-op pool — no padding to a common size, no per-row loop.
Tensor grouped_matmul(const Tensor& x, const Tensor& w, const std::vector<int64_t>& counts, bool trans_w = false);

}  // namespace tessel
