// CUDA kernels of reduce.cc's sum and mean: out[m] = scale · Σ_k x[m, K] over a contiguous
// [M, K], one block of 256 threads per row, partial sums in the element type combined by a
// fixed tree in shared memory (the same bits for the same shape on every run).
#include <cuda_runtime.h>

#include "tessel/core/cuda/strided.cuh"
#include "tessel/ops/cuda/launch.h"

namespace tessel::cuda {

namespace {

template <typename T>
__global__ void row_sum_kernel(const T* x, T* out, int64_t M, int64_t K, T scale) {
  __shared__ T part[kThreads];
  for (int64_t m = blockIdx.x; m < M; m += gridDim.x) {
    T acc = T(0);
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x) acc += x[m * K + k];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w /= 2) {
      if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
      __syncthreads();
    }
    if (threadIdx.x == 0) out[m] = part[0] * scale;
    __syncthreads();
  }
}

}  // namespace

void launch_row_sum(int code, const void* x, void* out, int64_t M, int64_t K, double scale, StreamHandle stream) {
  if (M == 0) return;
  const unsigned blocks = static_cast<unsigned>(M < 65535 ? M : 65535);
  if (code == kF32)
    row_sum_kernel<float><<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(x), static_cast<float*>(out), M, K,
                                                           static_cast<float>(scale));
  else if (code == kF64)
    row_sum_kernel<double><<<blocks, kThreads, 0, stream>>>(static_cast<const double*>(x), static_cast<double*>(out), M,
                                                            K, scale);
}

}  // namespace tessel::cuda
