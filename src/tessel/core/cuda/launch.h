// Plain declarations shared by the CUDA backend's .cc glue (g++) and its .cu kernels (nvcc):
// raw pointers, element counts, dtype codes and shape/stride arrays, nothing of tessel's
// C++ headers, so nvcc never parses them.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace tessel::cuda {

using StreamHandle = CUstream_st*;

// Dtype codes, as tessel::DType's values: f32, f64, bf16, i32, i64, b8.
enum Code : int { kF32 = 0, kF64 = 1, kBF16 = 2, kI32 = 3, kI64 = 4, kB8 = 5 };

inline constexpr int kMaxDims = 8;

// Up to kMaxDims dims of one shape, with each operand's strides (in elements) and offset
// applied to its base pointer beforehand.
struct Strides {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[3][kMaxDims] = {};  // per operand: out, a, b
};

// dst[i] = convert(src[i]) over n elements of the strided iteration `s` (operands 0: dst, 1: src).
void launch_copy(void* dst, int dst_code, const void* src, int src_code, const Strides& s, int64_t n,
                 StreamHandle stream);
// t[i] = value over n elements (operand 0).
void launch_fill(void* t, int code, double value, const Strides& s, int64_t n, StreamHandle stream);

}  // namespace tessel::cuda
