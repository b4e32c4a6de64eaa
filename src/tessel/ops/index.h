// Gathers by integer index. Ids are checked when the op runs: one outside its range throws
// tessel::Error naming the id and the bound.
#pragma once

#include "tessel/core/tensor.h"

namespace tessel {

// out[..., D] = table[ids[...], :] for a table [V, D] and i32/i64 ids of any shape, each in
// [0, V). Differentiable in the table (repeated ids add up); the ids get no gradient.
// The op (op_embedding) also takes an optional attr "vocab_start" for a piece of a
// vocab-sharded table holding rows [vocab_start, vocab_start + V) of the whole one: ids outside
// the piece then give zero rows and no gradient instead of an error (set by the SPMD rule).
Tensor embedding(const Tensor& table, const Tensor& ids);
// [..., num_classes] of `dtype` with 1 at each id in [0, num_classes) (not differentiable).
Tensor one_hot(const Tensor& ids, int64_t num_classes, DType dtype = DType::i64);

}  // namespace tessel
