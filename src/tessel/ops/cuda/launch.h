// Plain declarations between the ops' CUDA glue (kernels.cc, g++) and their kernels (.cu,
// nvcc): raw pointers, dtype codes and strided shapes only (core/cuda/launch.h).
#pragma once

#include "tessel/core/cuda/launch.h"
#include "tessel/ops/update_scalars.h"

namespace tessel::cuda {

enum class Binary : int { add, sub, mul, div };
enum class Unary : int { neg, exp, log, sqrt, rsqrt, tanh, silu, relu, gelu, gelu_tanh, scale };

// out[i] = a[i] OP b[i] over the strided iteration `s` (operands 0: out, 1: a, 2: b).
void launch_binary(Binary op, int code, void* out, const void* a, const void* b, const Strides& s, int64_t n,
                   StreamHandle stream);
// out[i] = f(x[i]) (operands 0: out, 1: x); scale is alpha * x + beta.
void launch_unary(Unary op, int code, void* out, const void* x, const Strides& s, int64_t n, double alpha,
                  double beta, StreamHandle stream);

// out[m] = scale · Σ_k x[m, k] over a contiguous x[M, K] (K may be 0: zeros).
void launch_row_sum(int code, const void* x, void* out, int64_t M, int64_t K, double scale, StreamHandle stream);

// dst[i] += alpha · src[i] over the strided iteration `s` (operands 0: dst, 1: src).
void launch_axpy(int code, void* dst, const void* src, const Strides& s, int64_t n, double alpha, StreamHandle stream);
// One AdamW step over n contiguous f32 elements.
void launch_adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& k, StreamHandle stream);

}  // namespace tessel::cuda
