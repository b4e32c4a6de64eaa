// The optimizers' CPU kernels (updates.cc); optimizer.h's functions check their operands and
// dispatch them by device.
#pragma once

#include "tessel/core/tensor.h"
#include "tessel/ops/update_scalars.h"
#include "tessel/optim/optimizer.h"

namespace tessel::optim::cpu {

void adamw_update(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const AdamWScalars& k);
void sgd_update(const Tensor& p, const Tensor& g, const Tensor* buf, bool first_step, const SgdOptions& o, double lr,
                float grad_scale);
double sum_squares(const Tensor& x);

}  // namespace tessel::optim::cpu
