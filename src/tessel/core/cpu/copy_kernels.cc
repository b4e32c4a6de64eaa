// The CPU's strided copy (with dtype conversion) and fill: the byte-moving kernels core itself
// needs (factories, Tensor::to, view::copy). The guarded device runs these inside a kernel
// scope; other devices register their own with their backend.
#include "tessel/core/cpu/copy_kernels.h"

#include <algorithm>

#include "tessel/core/convert.h"
#include "tessel/core/strided.h"
#include "tessel/core/thread_pool.h"

namespace tessel::cpu {

namespace {

template <typename To, typename From>
void copy_typed(const Tensor& dst, const Tensor& src) {
  To* d = static_cast<To*>(dst.raw_data());
  const From* s = static_cast<const From*>(src.raw_data());
  StridedLoop<2> loop(dst.shape(), {&dst.strides(), &src.strides()});
  int64_t inner = std::max<int64_t>(loop.inner_size(), 1);
  int64_t grain = std::max<int64_t>(1, 32768 / inner);
  parallel_for(0, loop.outer_count(), grain, [&](int64_t b, int64_t e) {
    loop.run(b, e, [&](const auto& off, int64_t n, const auto& st) {
      To* dp = d + off[0];
      const From* sp = s + off[1];
      if (st[0] == 1 && st[1] == 1) {
        for (int64_t i = 0; i < n; ++i) dp[i] = convert_value<To>(sp[i]);
      } else {
        for (int64_t i = 0; i < n; ++i) dp[i * st[0]] = convert_value<To>(sp[i * st[1]]);
      }
    });
  });
}

}  // namespace

void copy(const Tensor& dst, const Tensor& s) {
  TESSEL_DISPATCH_ALL(dst.dtype(), "copy", [&]<typename To>() {
    TESSEL_DISPATCH_ALL(s.dtype(), "copy", [&]<typename From>() { copy_typed<To, From>(dst, s); });
  });
}

void fill(const Tensor& t, double value) {
  TESSEL_DISPATCH_ALL(t.dtype(), "fill", [&]<typename T>() {
    T v = convert_value<T>(value);
    T* p = static_cast<T*>(t.raw_data());
    StridedLoop<1> loop(t.shape(), {&t.strides()});
    loop.run([&](const auto& off, int64_t n, const auto& st) {
      for (int64_t i = 0; i < n; ++i) p[off[0] + i * st[0]] = v;
    });
  });
}

}  // namespace tessel::cpu
