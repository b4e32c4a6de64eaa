// The optimizers' CPU kernels: AdamW and SGD updates and the sum of squares of the gradient
// norm, on contiguous f32 tensors (optimizer.h dispatches them by device).
#include "tessel/optim/cpu/updates.h"

#include <cmath>

#include "tessel/core/thread_pool.h"

namespace tessel::optim::cpu {

namespace {

// The element loop on one chunk; restrict pointers let GCC vectorise it.
void adamw_chunk(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v, int64_t n,
                 AdamWScalars k) {
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i] * k.grad_scale;
    float mi = m[i] + k.w1 * (gi - m[i]);
    float vi = v[i] * k.b2 + k.w2 * gi * gi;
    float denom = std::sqrt(vi) / k.bc2_sqrt + k.eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * k.decay - k.step_size * (mi / denom);
  }
}

void sgd_chunk(float* __restrict p, const float* __restrict g, float* __restrict buf, int64_t n, bool first, float wd,
               float mom, float damp, float lr, bool nesterov, float grad_scale) {
  for (int64_t i = 0; i < n; ++i) {
    float d = g[i] * grad_scale + wd * p[i];
    if (mom != 0.0f) {
      float b = first ? d : mom * buf[i] + damp * d;
      buf[i] = b;
      d = nesterov ? d + mom * b : b;
    }
    p[i] -= lr * d;
  }
}

}  // namespace

void adamw_update(const Tensor& pt, const Tensor& gt, const Tensor& mt, const Tensor& vt, const AdamWScalars& k) {
  float* p = pt.data<float>();
  const float* g = gt.data<float>();
  float* m = mt.data<float>();
  float* v = vt.data<float>();
  const int64_t n = pt.numel();
  parallel_for(0, n, 1 << 14, [&](int64_t lo, int64_t hi) { adamw_chunk(p + lo, g + lo, m + lo, v + lo, hi - lo, k); });
}

void sgd_update(const Tensor& pt, const Tensor& gt, const Tensor* buft, bool first_step, const SgdOptions& o, double lr,
                float grad_scale) {
  float* p = pt.data<float>();
  const float* g = gt.data<float>();
  float* buf = buft != nullptr ? buft->data<float>() : nullptr;
  const int64_t n = pt.numel();
  const float wd = static_cast<float>(o.weight_decay), mom = static_cast<float>(o.momentum);
  const float damp = static_cast<float>(1.0 - o.dampening), lrf = static_cast<float>(lr);
  parallel_for(0, n, 1 << 14, [&](int64_t lo, int64_t hi) {
    sgd_chunk(p + lo, g + lo, buf ? buf + lo : nullptr, hi - lo, first_step, wd, mom, damp, lrf, o.nesterov,
              grad_scale);
  });
}

// Σ x² in f64 with 8 independent partial sums (vectorisable; a fixed order).
double sum_squares(const Tensor& t) {
  const float* __restrict x = t.data<float>();
  const int64_t n = t.numel();
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += static_cast<double>(x[i + k]) * x[i + k];
  double s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

}  // namespace tessel::optim::cpu
