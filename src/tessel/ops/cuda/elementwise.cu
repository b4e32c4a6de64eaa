// CUDA kernels of elementwise.cc's ops: broadcasting binary ops and the unary functions, one
// thread per output element (grid-stride), computing in the element type (f32 inputs in f32,
// as the CPU's kernels do; bf16 reaches them as f32 through call_op).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "tessel/core/cuda/strided.cuh"
#include "tessel/ops/cuda/launch.h"

namespace tessel::cuda {

namespace {

template <typename T>
struct Math {  // float and double through the CUDA math library's overloads
  __device__ static T exp(T x) { return ::exp(x); }
  __device__ static T log(T x) { return ::log(x); }
  __device__ static T sqrt(T x) { return ::sqrt(x); }
  __device__ static T tanh(T x) { return ::tanh(x); }
  __device__ static T erf(T x) { return ::erf(x); }
};

template <typename T>
__device__ T unary_value(Unary op, T x, T alpha, T beta) {
  using M = Math<T>;
  switch (op) {
    case Unary::neg: return -x;
    case Unary::exp: return M::exp(x);
    case Unary::log: return M::log(x);
    case Unary::sqrt: return M::sqrt(x);
    case Unary::rsqrt: return T(1) / M::sqrt(x);
    case Unary::tanh: return M::tanh(x);
    case Unary::silu: return x / (T(1) + M::exp(-x));
    case Unary::relu: return x > T(0) ? x : T(0);
    case Unary::gelu: return T(0.5) * x * (T(1) + M::erf(x * T(0.7071067811865476)));
    case Unary::gelu_tanh: {
      T u = T(0.7978845608028654) * (x + T(0.044715) * x * x * x);
      return x / (T(1) + M::exp(T(-2) * u));
    }
    case Unary::scale: return alpha * x + beta;
  }
  return x;
}

template <typename T>
__global__ void unary_kernel(Unary op, T* out, const T* x, Strides s, int64_t n, T alpha, T beta) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t o[2];
    offsets<2>(s, i, o);
    out[o[0]] = unary_value<T>(op, x[o[1]], alpha, beta);
  }
}

template <typename T>
__global__ void binary_kernel(Binary op, T* out, const T* a, const T* b, Strides s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t o[3];
    offsets<3>(s, i, o);
    T x = a[o[1]], y = b[o[2]];
    T r = op == Binary::add ? x + y : op == Binary::sub ? x - y : op == Binary::mul ? x * y : x / y;
    out[o[0]] = r;
  }
}

}  // namespace

void launch_binary(Binary op, int code, void* out, const void* a, const void* b, const Strides& s, int64_t n,
                   StreamHandle stream) {
  if (n == 0) return;
  if (code == kF32)
    binary_kernel<float><<<grid_for(n), kThreads, 0, stream>>>(op, static_cast<float*>(out), static_cast<const float*>(a),
                                                              static_cast<const float*>(b), s, n);
  else if (code == kF64)
    binary_kernel<double><<<grid_for(n), kThreads, 0, stream>>>(
        op, static_cast<double*>(out), static_cast<const double*>(a), static_cast<const double*>(b), s, n);
}

void launch_unary(Unary op, int code, void* out, const void* x, const Strides& s, int64_t n, double alpha, double beta,
                  StreamHandle stream) {
  if (n == 0) return;
  if (code == kF32)
    unary_kernel<float><<<grid_for(n), kThreads, 0, stream>>>(op, static_cast<float*>(out), static_cast<const float*>(x),
                                                             s, n, static_cast<float>(alpha), static_cast<float>(beta));
  else if (code == kF64)
    unary_kernel<double><<<grid_for(n), kThreads, 0, stream>>>(op, static_cast<double*>(out),
                                                              static_cast<const double*>(x), s, n, alpha, beta);
}

}  // namespace tessel::cuda
