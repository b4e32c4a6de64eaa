// Normalisation over the last dim.
#pragma once

#include "tessel/core/tensor.h"

namespace tessel {

// (x - mean) / sqrt(var + eps) * weight + bias over the last dim (biased variance); weight
// and bias are [C] and may be undefined.
// Over the last `normalized_ndim` dims together (PyTorch's normalized_shape = those dims);
// weight and bias have their shape.
Tensor layer_norm(const Tensor& x, const Tensor& weight = {}, const Tensor& bias = {}, double eps = 1e-5,
                  int64_t normalized_ndim = 1);
// x / sqrt(mean(x²) + eps) * weight over the last dim; weight [C] may be undefined.
Tensor rms_norm(const Tensor& x, const Tensor& weight = {}, double eps = 1e-6);

}  // namespace tessel
