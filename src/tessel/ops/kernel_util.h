// Helpers shared by the op families' kernels: input checks, elementwise maps over contiguous
// tensors, undoing broadcasting in backward, and the common cost shapes.
#pragma once

#include <span>
#include <string_view>

#include "tessel/core/profile.h"
#include "tessel/core/thread_pool.h"
#include "tessel/core/view.h"
#include "tessel/ops/op.h"

namespace tessel::kernels {

inline constexpr int64_t kElementGrain = 1 << 15;

// Throws unless input `i` of `call` is floating (f32, f64 or bf16).
void check_floating(const MetaCall& call, size_t i);
// Throws unless inputs `i` and `j` share a dtype.
void check_same_dtype(const MetaCall& call, size_t i, size_t j);
// Throws unless input `i` has `ndim` dims (or at least `ndim` when `at_least`).
void check_ndim(const MetaCall& call, size_t i, int64_t ndim, bool at_least = false);
// Throws unless input `i` is i32 or i64.
void check_index(const MetaCall& call, size_t i);
// "f32[2, 3], f32[3]" — the inputs, for error messages.
std::string inputs_str(const MetaCall& call);

// Runs the CPU kernel `fn` on tensors of `device` that no registered op covers (the in-place
// updates, kernels composed by hand): directly on the CPU, inside a kernel scope on a device
// that runs CPU kernels; on any other device it throws naming `what` and the device, until
// that device has a kernel of its own for it.
template <typename F>
void host_kernel(std::string_view what, Device device, F&& fn) {
  if (device.is_cpu()) return fn();
  TESSEL_CHECK(device_backend(device).runs_cpu_kernels(), "{}: no kernel for device {}", what, device.str());
  KernelScope scope(device);
  fn();
}
// Throws unless `a` and `b` are on one device, naming `what` and both tensors.
void check_same_device(std::string_view what, const Tensor& a, const Tensor& b);

// Contiguous view of `t` (the tensor itself when already contiguous).
inline Tensor contig(const Tensor& t) { return view::contiguous(t); }

// out[i] = f(a[i]) over contiguous copies; the output has dtype of T.
template <typename T, typename F>
Tensor map1(const Tensor& a, F f) {
  Tensor ac = contig(a);
  Tensor out = Tensor::empty(a.shape(), dtype_of<T>);
  const T* __restrict x = ac.data<T>();
  T* __restrict y = out.data<T>();
  parallel_for(0, a.numel(), kElementGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = f(x[i]);
  });
  return out;
}

// out[i] = f(a[i], b[i]); a and b have one shape.
template <typename T, typename F>
Tensor map2(const Tensor& a, const Tensor& b, F f) {
  TESSEL_ASSERT(a.shape() == b.shape(), "map2 shapes {} vs {}", shape_str(a.shape()), shape_str(b.shape()));
  Tensor ac = contig(a), bc = contig(b);
  Tensor out = Tensor::empty(a.shape(), dtype_of<T>);
  const T* __restrict x = ac.data<T>();
  const T* __restrict z = bc.data<T>();
  T* __restrict y = out.data<T>();
  parallel_for(0, a.numel(), kElementGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) y[i] = f(x[i], z[i]);
  });
  return out;
}

// C[M, N] = alpha · op(A) @ op(B) + beta · C, all row-major with leading dims, on the calling
// rank's pool. OpenBLAS splits a product among its own threads differently for each thread
// count and rounds its edge tiles differently from its full ones, so its result depends on the
// thread count (0.3.21, 256x768x2048: 9% of the elements differ between 1 and 2 threads).
// tessel therefore runs OpenBLAS on one thread and splits C itself into a grid of tiles that
// depends only on M, N and K (gemm_grid); each element of C belongs to one tile and gets the
// bits a single-threaded BLAS call on that tile gives it, so they do not depend on the number
// of threads. The consecutive tiles one thread takes run as one call where that gives the same
// bits (the tiles are large enough for BLAS's packed path), so BLAS packs each operand once.
template <typename T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
          T beta, T* C, int64_t ldc);

// The tile grid of an M x N x K product: `row_blocks` x `col_blocks` tiles of at most `rows` x
// `cols` (the last in each direction may be smaller). A function of the shape alone.
struct GemmGrid {
  int64_t rows = 0, cols = 0, row_blocks = 1, col_blocks = 1;
};
GemmGrid gemm_grid(int64_t M, int64_t N, int64_t K);

// Multiply-adds per tile that gemm_grid aims at: about 1 ms on one core at ~110 GFLOP/s, so
// BLAS's per-call packing stays a few percent of a tile while a GPT-2 small projection still
// makes hundreds of tiles to share among the threads.
inline constexpr int64_t kGemmTileWork = int64_t{1} << 26;

// Sums `grad` down to `shape`, undoing the broadcast that produced it.
Tensor sum_to(const Tensor& grad, const Shape& shape);

// A tensor viewed as [outer, size, inner] around `dim`.
struct DimSplit {
  int64_t outer = 1, size = 1, inner = 1;
};
DimSplit split_at(const Shape& shape, int64_t dim);

// Cost of an op touching every input and output once with `flops_per_element` per output.
Cost elementwise_cost(const MetaCall& call, std::span<const TensorMeta> outputs, double flops_per_element);
// Bytes of the inputs and outputs.
double io_bytes(const MetaCall& call, std::span<const TensorMeta> outputs);

}  // namespace tessel::kernels
