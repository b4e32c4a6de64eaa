// Device-side helpers of the CUDA kernels (nvcc only): strided offsets from a linear index,
// conversions between the dtypes, dispatch over dtype codes, launch sizes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "tessel/core/cuda/launch.h"

namespace tessel::cuda {

inline constexpr int kThreads = 256;

inline unsigned grid_for(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8);  // grid-stride loops cover the rest
}

// Offsets of element `i` (row-major over s.shape) for the first N operands.
template <int N>
__device__ inline void offsets(const Strides& s, int64_t i, int64_t (&o)[N]) {
  for (int k = 0; k < N; ++k) o[k] = 0;
  for (int d = s.ndim - 1; d >= 0; --d) {
    int64_t size = s.shape[d];
    int64_t idx = i % size;
    i /= size;
    for (int k = 0; k < N; ++k) o[k] += idx * s.stride[k][d];
  }
}

// Conversions as the CPU's convert_value does them: through float for bf16 (round to nearest
// even), truncation toward zero for floating to integer, != 0 for bool.
template <typename To, typename From>
__host__ __device__ inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, __nv_bfloat16>) {
    return convert<To>(__bfloat162float(v));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else {
    return static_cast<To>(v);
  }
}

// Calls f(T{}) with T the C++ type of dtype `code`.
template <typename F>
inline void dispatch_code(int code, F&& f) {
  switch (code) {
    case kF32: f(float{}); break;
    case kF64: f(double{}); break;
    case kBF16: f(__nv_bfloat16{}); break;
    case kI32: f(int32_t{}); break;
    case kI64: f(int64_t{}); break;
    case kB8: f(bool{}); break;
    default: break;
  }
}

// Calls f(T{}) for the floating codes only.
template <typename F>
inline void dispatch_float(int code, F&& f) {
  switch (code) {
    case kF32: f(float{}); break;
    case kF64: f(double{}); break;
    case kBF16: f(__nv_bfloat16{}); break;
    default: break;
  }
}

}  // namespace tessel::cuda
