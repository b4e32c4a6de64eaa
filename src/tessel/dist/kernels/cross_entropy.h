// The local kernels of the distributed cross-entropy (custom_ops.cc): per-row statistics of a
// rank's logits piece x[R, Cl] and the gradient. The statistics are small host vectors that
// the collectives between the kernels reduce; the kernels run on the logits' device.
#pragma once

#include <cstdint>
#include <vector>

#include "tessel/core/tensor.h"

namespace tessel::kernels {

// m[r] = max(m[r], max_c x[r, c]).
template <typename T>
void ce_row_max(const Tensor& x, std::vector<T>& m);
// sx[r] = Σ_c exp(x[r, c] - m[r]); sx[R + r] = x[r, t[r] - c0] when this piece holds the target.
template <typename T>
void ce_row_sums(const Tensor& x, const std::vector<T>& m, const std::vector<int64_t>& targets, int64_t c0,
                 int64_t ignore, std::vector<T>& sx);
// dx[r, c] = (exp(x[r, c] - lse[r]) - [c0 + c == t[r]]) · scale; 0 for ignored rows.
template <typename T>
Tensor ce_backward(const Tensor& x, const std::vector<double>& lse, const std::vector<int64_t>& targets, int64_t c0,
                   int64_t ignore, T scale);

}  // namespace tessel::kernels
