// The CUDA backend's byte-moving kernels: strided copy with dtype conversion, and fill.
// One thread per element; the element's offsets come from its linear index over the shape.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "tessel/core/cuda/launch.h"
#include "tessel/core/cuda/strided.cuh"

namespace tessel::cuda {

namespace {

template <typename To, typename From>
__global__ void copy_kernel(To* dst, const From* src, Strides s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t o[2];
    offsets<2>(s, i, o);
    dst[o[0]] = convert<To>(src[o[1]]);
  }
}

template <typename T>
__global__ void fill_kernel(T* dst, T value, Strides s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t o[1];
    offsets<1>(s, i, o);
    dst[o[0]] = value;
  }
}

template <typename To>
void copy_from(void* dst, const void* src, int src_code, const Strides& s, int64_t n, StreamHandle stream) {
  dispatch_code(src_code, [&](auto from) {
    using From = decltype(from);
    copy_kernel<To, From><<<grid_for(n), kThreads, 0, stream>>>(static_cast<To*>(dst), static_cast<const From*>(src), s,
                                                                n);
  });
}

}  // namespace

void launch_copy(void* dst, int dst_code, const void* src, int src_code, const Strides& s, int64_t n,
                 StreamHandle stream) {
  if (n == 0) return;
  dispatch_code(dst_code, [&](auto to) { copy_from<decltype(to)>(dst, src, src_code, s, n, stream); });
}

void launch_fill(void* t, int code, double value, const Strides& s, int64_t n, StreamHandle stream) {
  if (n == 0) return;
  dispatch_code(code, [&](auto v) {
    using T = decltype(v);
    fill_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(static_cast<T*>(t), convert<T>(value), s, n);
  });
}

}  // namespace tessel::cuda
