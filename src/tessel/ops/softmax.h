// Softmax, log-softmax and the fused cross-entropy loss.
#pragma once

#include "tessel/core/tensor.h"

namespace tessel {

// Along `dim` (any dim), subtracting the max for stability. -inf entries get probability 0;
// a line of all -inf gives NaN.
Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor log_softmax(const Tensor& x, int64_t dim = -1);

enum class Reduction { mean, sum };

// Cross-entropy of logits [..., C] against integer targets [...] (i32/i64). Targets equal to
// ignore_index contribute nothing; mean divides by the number of non-ignored targets (NaN
// when there are none). Returns a scalar. Throws on a target outside [0, C). Fused: the
// log-softmax of the logits is never materialised.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     Reduction reduction = Reduction::mean);

}  // namespace tessel
