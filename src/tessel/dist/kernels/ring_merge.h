// The ring attention's merge of one key/value block's partial result into the running one.
#pragma once

#include <cstdint>

#include "tessel/core/tensor.h"

namespace tessel::kernels {

// acc rows [t0, t0 + rows) of [B, H, 2c, D] (and acc_lse [B, H, 2c]) merged in place with a
// block's out [B, H, rows, D] (any strides) and lse [B, H, rows], by their log-sum-exps.
void ring_merge(const Tensor& acc, const Tensor& acc_lse, const Tensor& out, const Tensor& lse, int64_t t0);

}  // namespace tessel::kernels
