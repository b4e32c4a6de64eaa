// In-place kernels.
#include "tessel/ops/inplace.h"

#include "tessel/core/context.h"
#include "tessel/core/strided.h"
#include "tessel/core/thread_pool.h"
#include "tessel/core/view.h"
#include "tessel/ops/device_fns.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ops/trace.h"

namespace tessel {

void add_(const Tensor& dst, const Tensor& src, double alpha) {
  TESSEL_CHECK(is_floating(dst.dtype()), "add_: destination '{}' has dtype {}; expected floating", dst.name(), dst.dtype());
  // Inside a backward pass an add_ accumulates a gradient: backward work.
  if (tracing_ops())
    trace_cost("add_", Cost{static_cast<double>(dst.numel()), 3 * static_cast<double>(dst.nbytes())},
               rank_context().backward_depth > 0);
  if (dst.is_meta() || src.is_meta()) return;
  if (dst.dtype() == DType::bf16) {  // accumulate in f32, round once
    Tensor f = view::to_dtype(dst, DType::f32);
    add_(f, src, alpha);
    view::copy(dst, f);
    return;
  }
  kernels::check_same_device("add_", dst, src);
  Tensor s = src.dtype() == dst.dtype() ? src : view::to_dtype(src, dst.dtype());
  if (s.shape() != dst.shape()) s = view::expand(s, dst.shape());
  auto run = [&]<typename T>() {
    T a = static_cast<T>(alpha);
    T* d = dst.data<T>();
    const T* p = s.data<T>();
    StridedLoop<2> loop(dst.shape(), {&dst.strides(), &s.strides()});
    int64_t grain = std::max<int64_t>(1, kernels::kElementGrain / std::max<int64_t>(1, loop.inner_size()));
    parallel_for(0, loop.outer_count(), grain, [&](int64_t lo, int64_t hi) {
      loop.run(lo, hi, [&](const auto& off, int64_t n, const auto& st) {
        T* __restrict dp = d + off[0];
        const T* __restrict sp = p + off[1];
        if (st[0] == 1 && st[1] == 1) {
          if (a == T(1))
            for (int64_t i = 0; i < n; ++i) dp[i] += sp[i];
          else
            for (int64_t i = 0; i < n; ++i) dp[i] += a * sp[i];
        } else {
          for (int64_t i = 0; i < n; ++i) dp[i * st[0]] += a * sp[i * st[1]];
        }
      });
    });
  };
  if (auto f = device_fn<AddInplaceFn>("add_", dst.device())) return f(dst, s, alpha);
  kernels::host_kernel("add_", dst.device(), [&] { TESSEL_DISPATCH_FLOAT(dst.dtype(), "add_", run); });
}

void scale_(const Tensor& dst, double alpha) {
  if (tracing_ops())
    trace_cost("scale_", Cost{static_cast<double>(dst.numel()), 2 * static_cast<double>(dst.nbytes())},
               rank_context().backward_depth > 0);
  if (dst.is_meta()) return;
  if (dst.dtype() == DType::bf16 || !dst.is_contiguous()) {
    // A contiguous compute copy (f32 for bf16), scaled and written back.
    Tensor g = view::to_dtype(dst, dst.dtype() == DType::bf16 ? DType::f32 : dst.dtype());
    scale_(g, alpha);
    view::copy(dst, g);
    return;
  }
  if (auto f = device_fn<ScaleInplaceFn>("scale_", dst.device())) return f(dst, alpha);
  kernels::host_kernel("scale_", dst.device(), [&] {
    TESSEL_DISPATCH_FLOAT(dst.dtype(), "scale_", [&]<typename T>() {
      T a = static_cast<T>(alpha);
      T* d = dst.data<T>();
      parallel_for(0, dst.numel(), kernels::kElementGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) d[i] *= a;
      });
    });
  });
}

void copy_(const Tensor& dst, const Tensor& src) { view::copy(dst, src); }
void zero_(const Tensor& dst) { view::fill(dst, 0.0); }

}  // namespace tessel
