// Elementwise arithmetic and activations (binary ops broadcast numpy-style).
#pragma once

#include "tessel/core/tensor.h"

namespace tessel {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
// alpha * x + beta.
Tensor scale(const Tensor& x, double alpha, double beta = 0.0);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
// GELU, exact (erf) or with the tanh approximation GPT-2 uses.
Tensor gelu(const Tensor& x, bool tanh_approximation = false);
Tensor silu(const Tensor& x);
Tensor relu(const Tensor& x);
// Converts to `dtype` (differentiable between floating dtypes).
Tensor cast(const Tensor& x, DType dtype);
// Comparisons with broadcasting: a bool tensor, no gradient (use where() on it to select).
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& a) { return neg(a); }
inline Tensor operator*(const Tensor& a, double s) { return scale(a, s); }
inline Tensor operator*(double s, const Tensor& a) { return scale(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return scale(a, 1.0 / s); }
inline Tensor operator+(const Tensor& a, double s) { return scale(a, 1.0, s); }
inline Tensor operator-(const Tensor& a, double s) { return scale(a, 1.0, -s); }

}  // namespace tessel
