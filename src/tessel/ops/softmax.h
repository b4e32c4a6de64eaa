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
// `class_dim` names the class dim (PyTorch's [N, C, d1, ...] is class_dim 1); targets have
// the logits' shape without it.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     Reduction reduction = Reduction::mean, int64_t class_dim = -1);
// Cross-entropy against soft labels: probs has the logits' shape (a distribution over the
// class dim per row); loss = -Σ probs · log_softmax(logits, class_dim), mean over the rows
// (every dim but the class dim) or sum.
Tensor cross_entropy_soft(const Tensor& logits, const Tensor& probs, Reduction reduction = Reduction::mean,
                          int64_t class_dim = -1);

}  // namespace tessel
