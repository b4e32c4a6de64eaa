// Matrix products on OpenBLAS.
#pragma once

#include "tessel/core/tensor.h"

namespace tessel {

// out[..., M, N] = A[..., M, K] @ B[..., K, N], where A is `a` (or `a` with its last two dims
// swapped when trans_a) and likewise B; batch dims broadcast. Both operands need 2+ dims.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// y[..., out] = x[..., in] @ W + bias, with W = w^T for w stored [out, in] (PyTorch, Llama)
// or W = w for w stored [in, out] when `weight_in_out` (GPT-2's Conv1D). `bias` may be
// undefined.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = {}, bool weight_in_out = false);

}  // namespace tessel
