// The MoE router against a reference written from the published formulas (Switch Transformer's
// top-k routing and load-balancing loss, GShard's capacity with the lowest scores dropped,
// ST-MoE's z-loss), on fixed logits, and its gradients against finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tessel/autograd/engine.h"
#include "tessel/nn/moe_router.h"
#include "tessel/ops/ops.h"

namespace tessel::nn {
namespace {

constexpr int64_t kT = 6, kE = 4;

std::vector<double> fixed_logits() {
  // Token 3 scores experts 1 and 2 the same; expert 0 is everyone's favourite (so a capacity
  // bites there).
  return {2.0, 0.5, -1.0, 0.1,  1.5, -0.3, 0.8, 0.2,   3.0, 0.0, 0.4, -2.0,
          1.0, 0.6, 0.6, -0.5,  2.2, 1.9, -0.7, 0.3,   0.1, -1.2, 2.5, 1.1};
}

struct Reference {
  std::vector<double> weights;    // [T, k], 0 where dropped
  std::vector<int64_t> experts;   // [T, k]
  std::vector<int64_t> counts;    // kept per expert
  int64_t dropped = 0;
  double aux = 0, z = 0;
};

Reference reference(const std::vector<double>& x, int64_t k, bool renormalize, int64_t capacity) {
  Reference r;
  std::vector<double> p(x.size());
  std::vector<double> f(static_cast<size_t>(kE), 0), P(static_cast<size_t>(kE), 0);
  std::vector<double> top(static_cast<size_t>(kT * k));
  for (int64_t t = 0; t < kT; ++t) {
    double m = -INFINITY, s = 0;
    for (int64_t e = 0; e < kE; ++e) m = std::max(m, x[t * kE + e]);
    for (int64_t e = 0; e < kE; ++e) s += std::exp(x[t * kE + e] - m);
    const double lse = m + std::log(s);
    r.z += lse * lse / kT;
    for (int64_t e = 0; e < kE; ++e) p[t * kE + e] = std::exp(x[t * kE + e] - lse), P[e] += p[t * kE + e] / kT;
    std::vector<int64_t> idx(static_cast<size_t>(kE));
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return p[t * kE + a] > p[t * kE + b]; });
    double norm = 0;
    for (int64_t j = 0; j < k; ++j) norm += p[t * kE + idx[j]];
    for (int64_t j = 0; j < k; ++j) {
      r.experts.push_back(idx[j]);
      top[t * k + j] = p[t * kE + idx[j]];
      r.weights.push_back(renormalize ? p[t * kE + idx[j]] / norm : p[t * kE + idx[j]]);
      f[idx[j]] += 1.0 / static_cast<double>(kT * k);
    }
  }
  for (int64_t e = 0; e < kE; ++e) r.aux += kE * f[e] * P[e];
  r.counts.assign(static_cast<size_t>(kE), 0);
  for (int64_t e = 0; e < kE; ++e) {
    std::vector<int64_t> mine;
    for (int64_t a = 0; a < kT * k; ++a)
      if (r.experts[a] == e) mine.push_back(a);
    std::stable_sort(mine.begin(), mine.end(), [&](int64_t a, int64_t b) { return top[a] > top[b]; });
    for (size_t i = 0; i < mine.size(); ++i) {
      if (static_cast<int64_t>(i) < capacity) {
        ++r.counts[e];
      } else {
        r.weights[mine[i]] = 0;
        ++r.dropped;
      }
    }
  }
  return r;
}

TEST(MoeRouter, MatchesTheFormulasDroplessAndWithACapacity) {
  const std::vector<double> x = fixed_logits();
  for (const double factor : {0.0, 0.75}) {
    for (const bool renormalize : {true, false}) {
      SCOPED_TRACE(fmt::format("capacity factor {}, renormalize {}", factor, renormalize));
      const Tensor logits = Tensor::from_doubles(x, {kT, kE}, DType::f64);
      const Routing r = route_tokens(logits, RouterOptions{.top_k = 2, .renormalize = renormalize,
                                                           .capacity_factor = factor});
      // ceil(0.75 · 12 / 4) = 3 assignments per expert.
      const Reference want = reference(x, 2, renormalize, factor > 0 ? 3 : kT * 2);
      const std::vector<double> w = r.weights.to_doubles(), ex = r.experts.to_doubles();
      for (size_t i = 0; i < want.weights.size(); ++i) {
        EXPECT_NEAR(w[i], want.weights[i], 1e-12) << "assignment " << i;
        EXPECT_EQ(static_cast<int64_t>(ex[i]), want.experts[i]) << "assignment " << i;
      }
      EXPECT_EQ(r.counts, want.counts);
      EXPECT_EQ(r.dropped, want.dropped);
      EXPECT_DOUBLE_EQ(r.dropped_fraction, static_cast<double>(want.dropped) / 12);
      EXPECT_NEAR(r.aux_loss.item(), want.aux, 1e-12);
      EXPECT_NEAR(r.z_loss.item(), want.z, 1e-12);
      // The order lists the kept assignments expert by expert, tokens in order.
      int64_t at = 0;
      for (int64_t e = 0; e < kE; ++e)
        for (int64_t i = 0; i < r.counts[e]; ++i, ++at) {
          EXPECT_EQ(static_cast<int64_t>(ex[static_cast<size_t>(r.order[at])]), e);
          if (i > 0) {
            EXPECT_LT(r.order[at - 1], r.order[at]);
          }
        }
      EXPECT_EQ(at, 12 - want.dropped);
    }
  }
  // The capacity bites: expert 0 is chosen by every token but takes only 3.
  const Routing capped = route_tokens(Tensor::from_doubles(x, {kT, kE}, DType::f64),
                                      RouterOptions{.top_k = 2, .capacity_factor = 0.75});
  EXPECT_EQ(capped.counts[0], 3);
  EXPECT_GT(capped.dropped, 0);
}

// d(aux + z + Σ c·weights)/d logits by autograd against central differences, both score
// functions, with and without a capacity (which and how many assignments are kept does not
// change within the step h).
TEST(MoeRouter, GradientsMatchFiniteDifferences) {
  // Without the tie of token 3 (the choices are piecewise constant; a tie sits on a step).
  std::vector<double> x = fixed_logits();
  x[3 * kE + 2] = 0.65;
  std::vector<double> c(static_cast<size_t>(kT * 2));
  for (size_t i = 0; i < c.size(); ++i) c[i] = std::sin(1.3 * static_cast<double>(i) + 0.4);
  const Tensor coef = Tensor::from_doubles(c, {kT, 2}, DType::f64);
  for (const char* scores : {"softmax", "sigmoid"})
    for (const double factor : {0.0, 0.75}) {
      SCOPED_TRACE(fmt::format("{}, capacity factor {}", scores, factor));
      const RouterOptions o{.top_k = 2, .scores = scores, .capacity_factor = factor};
      auto loss = [&](const Tensor& logits) {
        const Routing r = route_tokens(logits, o);
        return add(add(r.aux_loss, r.z_loss), sum(mul(r.weights, coef)));
      };
      Tensor logits = Tensor::from_doubles(x, {kT, kE}, DType::f64);
      logits.set_requires_grad(true);
      backward(loss(logits));
      const std::vector<double> g = logits.grad().to_doubles();
      const double h = 1e-6;
      for (size_t i = 0; i < x.size(); ++i) {
        std::vector<double> up = x, down = x;
        up[i] += h;
        down[i] -= h;
        const double numeric = (loss(Tensor::from_doubles(up, {kT, kE}, DType::f64)).item() -
                                loss(Tensor::from_doubles(down, {kT, kE}, DType::f64)).item()) / (2 * h);
        EXPECT_NEAR(g[i], numeric, 1e-6) << "logit " << i;
      }
    }
}

TEST(MoeRouter, BadOptionsNameTheOption) {
  const Tensor logits = Tensor::zeros({3, 4}, DType::f64);
  auto message = [&](const RouterOptions& o) {
    try {
      route_tokens(logits, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_NE(message(RouterOptions{.top_k = 5}).find("top_k = 5 must be 1..4"), std::string::npos);
  EXPECT_NE(message(RouterOptions{.scores = "tanh"}).find("scores 'tanh'"), std::string::npos);
  EXPECT_NE(message(RouterOptions{.capacity_factor = -1}).find("capacity_factor -1"), std::string::npos);
}

}  // namespace
}  // namespace tessel::nn
