// In-place updates that are not recorded by autograd: gradient accumulation, optimizer
// steps, parameter loading. Never use them on tensors a recorded op saved for backward.
#pragma once

#include "tessel/core/tensor.h"

namespace tessel {

// dst += alpha * src (src broadcast to dst's shape; dtypes may differ).
void add_(const Tensor& dst, const Tensor& src, double alpha = 1.0);
// dst *= alpha.
void scale_(const Tensor& dst, double alpha);
// dst = src (broadcast, converted).
void copy_(const Tensor& dst, const Tensor& src);
void zero_(const Tensor& dst);

}  // namespace tessel
