// Row-major GEMMs on cuBLASLt: C[M, N] = op(A)[M, K] @ op(B)[K, N] (+ bias[N]) over `batch`
// strided matrices, in f32 (strict, or TF32 when TESSEL_CUDA_TF32=1), f64 or bf16 with f32
// accumulation. cuBLASLt is column-major, so each call computes C^T = op(B)^T @ op(A)^T.
#pragma once

#include <cstdint>

#include "tessel/core/device.h"
#include "tessel/core/dtype.h"

namespace tessel::cuda {

struct Gemm {
  bool trans_a = false, trans_b = false;  // A stored [K, M], B stored [N, K]
  int64_t M = 0, N = 0, K = 0;
  int64_t batch = 1;
  const void* a = nullptr;  // contiguous matrices, `batch` of them back to back
  const void* b = nullptr;
  void* c = nullptr;
  const void* bias = nullptr;  // [N], or null
  float beta = 0;              // C = A @ B + beta * C
};

void gemm(Device device, DType dtype, const Gemm& g);

}  // namespace tessel::cuda
