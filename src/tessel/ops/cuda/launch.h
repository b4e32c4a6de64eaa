// Plain declarations between the ops' CUDA glue (kernels.cc, g++) and their kernels (.cu,
// nvcc): raw pointers, dtype codes and strided shapes only (core/cuda/launch.h).
#pragma once

#include "tessel/core/cuda/launch.h"

namespace tessel::cuda {

enum class Binary : int { add, sub, mul, div };
enum class Unary : int { neg, exp, log, sqrt, rsqrt, tanh, silu, relu, gelu, gelu_tanh, scale };

// out[i] = a[i] OP b[i] over the strided iteration `s` (operands 0: out, 1: a, 2: b).
void launch_binary(Binary op, int code, void* out, const void* a, const void* b, const Strides& s, int64_t n,
                   StreamHandle stream);
// out[i] = f(x[i]) (operands 0: out, 1: x); scale is alpha * x + beta.
void launch_unary(Unary op, int code, void* out, const void* x, const Strides& s, int64_t n, double alpha,
                  double beta, StreamHandle stream);

}  // namespace tessel::cuda
