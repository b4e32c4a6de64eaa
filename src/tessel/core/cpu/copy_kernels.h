// The CPU's byte-moving kernels (see copy_kernels.cc).
#pragma once

#include "tessel/core/tensor.h"

namespace tessel::cpu {

// dst[...] = convert(src[...]); src has dst's shape (broadcast already applied).
void copy(const Tensor& dst, const Tensor& src);
// t[...] = value.
void fill(const Tensor& t, double value);

}  // namespace tessel::cpu
