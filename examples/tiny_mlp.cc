// A tiny network, forward and backward, with a gradient check: a two-layer MLP with GELU and
// layer norm, trained for a few SGD steps on a fixed random regression task, then every
// parameter's gradient compared with central finite differences in f64.
#include <cmath>
#include <cstdio>

#include "tessel/autograd/engine.h"
#include "tessel/core/context.h"
#include "tessel/core/philox.h"
#include "tessel/ops/inplace.h"
#include "tessel/ops/ops.h"

using namespace tessel;

namespace {

Tensor param(const Shape& shape, const char* name, double std, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  rng_fill(t, Distribution::normal, 0.0, std, /*seed=*/42, stream_key(name));
  t.set_name(name);
  t.set_requires_grad(true);
  return t;
}

struct Mlp {
  Tensor w1, b1, w2, b2, gamma, beta;
  explicit Mlp(DType d)
      : w1(param({32, 16}, "w1", 0.25, d)), b1(param({32}, "b1", 0.02, d)), w2(param({4, 32}, "w2", 0.18, d)),
        b2(param({4}, "b2", 0.02, d)), gamma(param({32}, "gamma", 0.1, d)), beta(param({32}, "beta", 0.1, d)) {}
  std::vector<Tensor> params() const { return {w1, b1, w2, b2, gamma, beta}; }
  // y[B, 4] = W2 · layer_norm(gelu(W1 x + b1)) + b2
  Tensor forward(const Tensor& x) const {
    Tensor h = gelu(linear(x, w1, b1), /*tanh_approximation=*/true);
    return linear(layer_norm(h, gamma, beta), w2, b2);
  }
};

Tensor mse(const Tensor& y, const Tensor& target) {
  Tensor d = sub(y, target);
  return mean(mul(d, d));
}

}  // namespace

int main() {
  try {
    DType dtype = DType::f64;
    Mlp net(dtype);
    Tensor x = Tensor::empty({64, 16}, dtype);
    rng_fill(x, Distribution::normal, 0, 1, 7, stream_key("x"));
    Tensor target = Tensor::empty({64, 4}, dtype);
    rng_fill(target, Distribution::normal, 0, 1, 7, stream_key("target"));

    std::printf("tessel tiny MLP: 16 -> 32 (gelu, layer_norm) -> 4, batch 64, SGD lr 0.1\n");
    for (int step = 0; step < 20; ++step) {
      for (const Tensor& p : net.params()) p.set_grad(Tensor());
      Tensor loss = mse(net.forward(x), target);
      backward(loss);
      for (const Tensor& p : net.params()) add_(p, p.grad(), -0.1);
      if (step % 5 == 0 || step == 19) std::printf("  step %2d  loss %.6f\n", step, loss.item());
    }

    // Gradient check: autograd against central differences for every parameter element.
    for (const Tensor& p : net.params()) p.set_grad(Tensor());
    backward(mse(net.forward(x), target));
    const double eps = 1e-6;
    double worst = 0;
    int64_t checked = 0;
    NoGradGuard no_grad;
    for (const Tensor& p : net.params()) {
      double* v = p.data<double>();
      std::vector<double> g = p.grad().to_doubles();
      for (int64_t i = 0; i < p.numel(); ++i) {
        double saved = v[i];
        v[i] = saved + eps;
        double up = mse(net.forward(x), target).item();
        v[i] = saved - eps;
        double down = mse(net.forward(x), target).item();
        v[i] = saved;
        double numeric = (up - down) / (2 * eps);
        double err = std::fabs(numeric - g[static_cast<size_t>(i)]) / (1e-8 + std::fabs(numeric));
        worst = std::max(worst, std::min(err, std::fabs(numeric - g[static_cast<size_t>(i)]) * 1e6));
        ++checked;
      }
    }
    bool ok = worst < 1e-4;
    std::printf("gradient check: %lld parameters, worst relative error %.2e -> %s\n", static_cast<long long>(checked),
                worst, ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
