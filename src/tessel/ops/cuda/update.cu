// CUDA kernels of the updates no op covers: dst += alpha · src (strided, the gradient
// accumulation of add_) and one fused AdamW step over contiguous f32 tensors (the arithmetic
// of optim/cpu/updates.cc, in the same order).
#include <cuda_runtime.h>

#include "tessel/core/cuda/strided.cuh"
#include "tessel/ops/cuda/launch.h"
#include "tessel/ops/update_scalars.h"

namespace tessel::cuda {

namespace {

template <typename T>
__global__ void axpy_kernel(T* dst, const T* src, Strides s, int64_t n, T alpha) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t o[2];
    offsets<2>(s, i, o);
    dst[o[0]] += alpha * src[o[1]];
  }
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, AdamWScalars k) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = g[i] * k.grad_scale;
    const float mi = m[i] + k.w1 * (gi - m[i]);
    const float vi = v[i] * k.b2 + k.w2 * gi * gi;
    const float denom = sqrtf(vi) / k.bc2_sqrt + k.eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * k.decay - k.step_size * (mi / denom);
  }
}

}  // namespace

void launch_axpy(int code, void* dst, const void* src, const Strides& s, int64_t n, double alpha, StreamHandle stream) {
  if (n == 0) return;
  if (code == kF32)
    axpy_kernel<float><<<grid_for(n), kThreads, 0, stream>>>(static_cast<float*>(dst), static_cast<const float*>(src), s,
                                                            n, static_cast<float>(alpha));
  else if (code == kF64)
    axpy_kernel<double><<<grid_for(n), kThreads, 0, stream>>>(static_cast<double*>(dst), static_cast<const double*>(src),
                                                             s, n, alpha);
}

void launch_adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& k, StreamHandle stream) {
  if (n == 0) return;
  adamw_kernel<<<grid_for(n), kThreads, 0, stream>>>(p, g, m, v, n, k);
}

}  // namespace tessel::cuda
