// The byte-level reduction kernels the backends share: element-wise reductions of raw buffers
// by dtype and op, and the rank-order reduction of several ranks' buffers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/core/dtype.h"
#include "tessel/core/reduce_op.h"

namespace tessel {

// Element-wise reduction of `n` elements: acc = op(acc, x) (avg accumulates like sum; divide
// afterwards with finish_avg).
void reduce_into(void* acc, const void* x, int64_t n, DType dtype, ReduceOp op);
void finish_avg(void* buf, int64_t n, DType dtype, int ranks);
// dst[k][dst_off + i] = reduce over r, in rank order, of srcs[r][src_off + i] for i in [0, n),
// offsets in elements, in tiles that stay in cache; bf16 accumulates in f32 and rounds once. The
// thread backend and the Gloo backend's shared-memory path reduce with it, so both give the same
// bits.
void reduce_ranks(const std::vector<const void*>& srcs, const std::vector<void*>& dsts, int64_t src_off, int64_t dst_off,
                  int64_t n, DType dtype, ReduceOp op);
// Throws naming `where` when `op` cannot reduce `dtype` (avg and prod of bool).
void check_reducible(DType dtype, ReduceOp op, const std::string& where);

}  // namespace tessel
