// The distributed cross-entropy's local kernels (cross_entropy.h), on the CPU and on devices
// that run CPU kernels; other devices have none yet (host_kernel says so).
#include "tessel/dist/kernels/cross_entropy.h"

#include <algorithm>

#include "tessel/core/thread_pool.h"
#include "tessel/ops/fast_math.h"
#include "tessel/ops/kernel_util.h"

namespace tessel::kernels {

namespace {

// Rows per parallel_for chunk: about kElementGrain logits.
int64_t row_grain(int64_t Cl) { return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, Cl)); }

// Cl of x viewed as [R, Cl] (R is the length of the row statistics).
int64_t row_width(const Tensor& x) { return x.dim() == 0 ? 1 : x.size(-1); }

}  // namespace

template <typename T>
void ce_row_max(const Tensor& x, std::vector<T>& m) {
  const int64_t R = static_cast<int64_t>(m.size()), Cl = row_width(x);
  host_kernel("cross_entropy", x.device(), [&] {
    const T* px = x.data<T>();
    parallel_for(0, R, row_grain(Cl), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r)
        for (int64_t c = 0; c < Cl; ++c) m[r] = px[r * Cl + c] > m[r] ? px[r * Cl + c] : m[r];
    });
  });
}

template <typename T>
void ce_row_sums(const Tensor& x, const std::vector<T>& m, const std::vector<int64_t>& targets, int64_t c0,
                 int64_t ignore, std::vector<T>& sx) {
  const int64_t R = static_cast<int64_t>(m.size()), Cl = row_width(x);
  host_kernel("cross_entropy", x.device(), [&] {
    const T* px = x.data<T>();
    parallel_for(0, R, row_grain(Cl), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const T* row = px + r * Cl;
        T s = 0;
        for (int64_t c = 0; c < Cl; ++c) s += fast::exp_t<T>(row[c] - m[r]);
        sx[r] = s;
        const int64_t t = targets[r] - c0;
        if (targets[r] != ignore && t >= 0 && t < Cl) sx[R + r] = row[t];
      }
    });
  });
}

template <typename T>
Tensor ce_backward(const Tensor& x, const std::vector<double>& lse, const std::vector<int64_t>& targets, int64_t c0,
                   int64_t ignore, T scale) {
  const int64_t R = static_cast<int64_t>(lse.size()), Cl = row_width(x);
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  host_kernel("cross_entropy", x.device(), [&] {
    const T* px = x.data<T>();
    T* pd = dx.data<T>();
    parallel_for(0, R, row_grain(Cl), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        T* d = pd + r * Cl;
        if (targets[r] == ignore) {
          std::fill(d, d + Cl, T(0));
          continue;
        }
        const T* row = px + r * Cl;
        const T l = static_cast<T>(lse[r]);
        for (int64_t c = 0; c < Cl; ++c) d[c] = fast::exp_t<T>(row[c] - l) * scale;
        const int64_t t = targets[r] - c0;
        if (t >= 0 && t < Cl) d[t] -= scale;
      }
    });
  });
  return dx;
}

#define TESSEL_CE_INSTANTIATE(T)                                                                                 \
  template void ce_row_max<T>(const Tensor&, std::vector<T>&);                                                   \
  template void ce_row_sums<T>(const Tensor&, const std::vector<T>&, const std::vector<int64_t>&, int64_t, int64_t, \
                               std::vector<T>&);                                                                 \
  template Tensor ce_backward<T>(const Tensor&, const std::vector<double>&, const std::vector<int64_t>&, int64_t,  \
                                 int64_t, T);
TESSEL_CE_INSTANTIATE(float)
TESSEL_CE_INSTANTIATE(double)
#undef TESSEL_CE_INSTANTIATE

}  // namespace tessel::kernels
