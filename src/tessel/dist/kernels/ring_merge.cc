// The ring attention's merge of a block's output into the accumulator by log-sum-exp
// (ring_merge.h), on the CPU and devices that run CPU kernels.
#include "tessel/dist/kernels/ring_merge.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tessel/core/thread_pool.h"
#include "tessel/core/view.h"
#include "tessel/ops/kernel_util.h"

namespace tessel::kernels {

namespace {

// acc rows [t0, t0 + rows) of [B, H, 2c, D] (and lse [B, H, 2c]) merged with a block's out
// [B, H, rows, D] (any strides) and lse [B, H, rows].
template <typename T>
void merge_t(const Tensor& acc, const Tensor& acc_lse, const Tensor& out, const Tensor& lse, int64_t t0) {
  const Tensor o = view::contiguous(out), l = view::contiguous(lse);
  const int64_t B = acc.size(0), H = acc.size(1), TT = acc.size(2), D = acc.size(3), rows = o.size(2);
  T* pa = acc.data<T>();
  T* pl = acc_lse.data<T>();
  const T* po = o.data<T>();
  const T* pb = l.data<T>();
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  parallel_for(0, B * H, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t bh = lo; bh < hi; ++bh)
      for (int64_t t = 0; t < rows; ++t) {
        const T lb = pb[bh * rows + t];
        if (lb == kNegInf) continue;  // the block gave this row nothing
        T& la = pl[bh * TT + t0 + t];
        T* a = pa + (bh * TT + t0 + t) * D;
        const T* b = po + (bh * rows + t) * D;
        if (la == kNegInf) {
          std::copy_n(b, D, a);
          la = lb;
          continue;
        }
        const T m = std::max(la, lb);
        const T ea = std::exp(la - m), eb = std::exp(lb - m);
        const T lse_new = m + std::log(ea + eb);
        const T wa = std::exp(la - lse_new), wb = std::exp(lb - lse_new);
        for (int64_t e = 0; e < D; ++e) a[e] = a[e] * wa + b[e] * wb;
        la = lse_new;
      }
  });
}

}  // namespace

void ring_merge(const Tensor& acc, const Tensor& acc_lse, const Tensor& out, const Tensor& lse, int64_t t0) {
  host_kernel("ring attention merge", acc.device(), [&] {
    TESSEL_DISPATCH_FLOAT(acc.dtype(), "ring attention merge", [&]<typename T>() { merge_t<T>(acc, acc_lse, out, lse, t0); });
  });
}

}  // namespace tessel::kernels
