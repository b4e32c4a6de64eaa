// The MoE block against a per-token reference (each token through its k experts one at a time,
// written with plain loops), its gradients — through router, experts and the attached
// balancing and z losses — against central differences, and the Mixtral model built from it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tessel/autograd/engine.h"
#include "tessel/core/context.h"
#include "tessel/nn/models.h"
#include "tessel/nn/moe.h"
#include "tessel/ops/ops.h"

namespace tessel::nn {
namespace {

constexpr int64_t kB = 2, kT = 5, kC = 6, kE = 4, kF = 5;

MoeConfig tiny_moe(double capacity = 0, int64_t shared = 0) {
  return {.num_experts = kE, .top_k = 2, .expert_hidden = kF, .capacity_factor = capacity, .aux_loss_coef = 0.3,
          .z_loss_coef = 0.2, .shared_expert_hidden = shared};
}

Tensor random_input(uint64_t seed) {
  Tensor x = Tensor::empty({kB, kT, kC}, DType::f64);
  init_fill(x, Init::normal(1.0), seed, "x");
  return x;
}

double silu_of(double v) { return v / (1 + std::exp(-v)); }

// y[b, t] = Σ_j w_j · W2_e (silu(W1_e x) ⊙ W3_e x) over the token's kept choices, plus the shared
// expert; routing per sequence as the published formulas say (softmax, top-k by score with ties
// to the lower expert, renormalised, a sequence's assignments past ceil(c·T·k/E) per expert
// dropped lowest score first).
std::vector<double> reference(MoeBlock& m, const Tensor& x) {
  const MoeConfig& c = m.config();
  const std::vector<double> xv = x.to_doubles(), gate = m.gate().weight().value.to_doubles();
  const std::vector<double> w1 = m.w1().value.to_doubles(), w2 = m.w2().value.to_doubles(),
                            w3 = m.w3().value.to_doubles();
  const int64_t k = c.top_k;
  std::vector<double> y(static_cast<size_t>(kB * kT * kC), 0.0);
  for (int64_t b = 0; b < kB; ++b) {
    std::vector<std::vector<double>> p(kT, std::vector<double>(kE));
    std::vector<std::vector<int64_t>> pick(kT);
    std::vector<std::vector<double>> w(kT);
    for (int64_t t = 0; t < kT; ++t) {
      const double* xt = &xv[static_cast<size_t>((b * kT + t) * kC)];
      double mx = -INFINITY, s = 0;
      std::vector<double> l(kE);
      for (int64_t e = 0; e < kE; ++e) {
        for (int64_t i = 0; i < kC; ++i) l[e] += gate[e * kC + i] * xt[i];
        mx = std::max(mx, l[e]);
      }
      for (int64_t e = 0; e < kE; ++e) s += std::exp(l[e] - mx);
      for (int64_t e = 0; e < kE; ++e) p[t][e] = std::exp(l[e] - mx) / s;
      std::vector<int64_t> idx(kE);
      std::iota(idx.begin(), idx.end(), 0);
      std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t bb) { return p[t][a] > p[t][bb]; });
      double norm = 0;
      for (int64_t j = 0; j < k; ++j) norm += p[t][idx[j]];
      for (int64_t j = 0; j < k; ++j) pick[t].push_back(idx[j]), w[t].push_back(p[t][idx[j]] / norm);
    }
    if (c.capacity_factor > 0) {
      const int64_t cap = static_cast<int64_t>(std::ceil(c.capacity_factor * kT * k / kE));
      for (int64_t e = 0; e < kE; ++e) {
        std::vector<std::pair<int64_t, int64_t>> mine;  // (t, j)
        for (int64_t t = 0; t < kT; ++t)
          for (int64_t j = 0; j < k; ++j)
            if (pick[t][j] == e) mine.push_back({t, j});
        std::stable_sort(mine.begin(), mine.end(), [&](auto a, auto bb) { return p[a.first][e] > p[bb.first][e]; });
        for (size_t i = static_cast<size_t>(cap); i < mine.size(); ++i) w[mine[i].first][mine[i].second] = 0;
      }
    }
    for (int64_t t = 0; t < kT; ++t) {
      const double* xt = &xv[static_cast<size_t>((b * kT + t) * kC)];
      double* yt = &y[static_cast<size_t>((b * kT + t) * kC)];
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = pick[t][j];
        std::vector<double> h(kF);
        for (int64_t f = 0; f < kF; ++f) {
          double a = 0, u = 0;
          for (int64_t i = 0; i < kC; ++i) a += w1[(e * kF + f) * kC + i] * xt[i], u += w3[(e * kF + f) * kC + i] * xt[i];
          h[f] = silu_of(a) * u;
        }
        for (int64_t o = 0; o < kC; ++o) {
          double v = 0;
          for (int64_t f = 0; f < kF; ++f) v += w2[(e * kC + o) * kF + f] * h[f];
          yt[o] += w[t][j] * v;
        }
      }
    }
  }
  return y;
}

TEST(MoeBlock, MatchesAPerTokenReferenceDroplessAndWithACapacity) {
  for (double capacity : {0.0, 1.0}) {
    MoeBlock m(kC, tiny_moe(capacity), 0.5, 0);
    m.finalize_names("moe");
    m.materialize(7, DType::f64);
    const Tensor x = random_input(3);
    moe_step() = MoeStep{.record = true};
    const std::vector<double> got = m.forward(x).to_doubles(), want = reference(m, x);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << "capacity " << capacity << " at " << i;
    const MoeLayerStats& s = moe_step().layers.at(0);
    EXPECT_EQ(s.assignments, kB * kT * 2);
    EXPECT_EQ(std::accumulate(s.tokens_per_expert.begin(), s.tokens_per_expert.end(), 0.0) + s.dropped, s.assignments);
    if (capacity > 0) EXPECT_GT(s.dropped, 0) << "the test's capacity should bite";
    else EXPECT_EQ(s.dropped, 0);
    moe_step() = MoeStep{};
  }
}

// Objective = Σ y ⊙ R + aux_coef · aux + z_coef · z: autograd (the losses' gradients arrive
// through the block's output) against central differences over every parameter and input.
TEST(MoeBlock, GradientsThroughRouterExpertsAndLossesMatchFiniteDifferences) {
  for (double capacity : {0.0, 1.0}) {
    const MoeConfig c = tiny_moe(capacity, 3);
    MoeBlock m(kC, c, 0.5, 0);
    m.finalize_names("moe");
    m.materialize(5, DType::f64);
    Tensor x = random_input(9);
    Tensor R = random_input(10);
    auto objective = [&] {
      NoGradGuard no_grad;
      const Tensor flat = reshape(x, {kB * kT, kC});
      const Routing r = route_tokens(linear(flat, m.gate().weight().value),
                                     {.top_k = 2, .capacity_factor = capacity, .group_tokens = kT});
      return sum(mul(m.forward(x), R)).item() + c.aux_loss_coef * r.aux_loss.item() + c.z_loss_coef * r.z_loss.item();
    };
    x.set_requires_grad(true);
    backward(sum(mul(m.forward(x), R)));
    std::vector<std::pair<std::string, Tensor>> wrt{{"x", x}};
    for (Parameter* p : m.parameters()) wrt.push_back({p->name, p->value});
    const double eps = 1e-6;
    double worst = 0;
    std::string worst_at;
    for (auto& [name, t] : wrt) {
      ASSERT_TRUE(t.grad().defined()) << name << " got no gradient";
      const std::vector<double> g = t.grad().to_doubles();
      double* v = t.data<double>();
      for (int64_t i = 0; i < t.numel(); ++i) {
        const double saved = v[i];
        v[i] = saved + eps;
        const double up = objective();
        v[i] = saved - eps;
        const double down = objective();
        v[i] = saved;
        const double num = (up - down) / (2 * eps);
        const double err = std::fabs(num - g[static_cast<size_t>(i)]) / (1e-8 + 1e-5 * std::fabs(num));
        if (err > worst) worst = err, worst_at = fmt::format("{}[{}]: autograd {} numeric {}", name, i, g[static_cast<size_t>(i)], num);
      }
    }
    EXPECT_LE(worst, 1.0) << "capacity " << capacity << ": " << worst_at;
  }
}

TEST(MoeBlock, TheLossScaleScalesOnlyTheAttachedLossesGradients) {
  MoeBlock m(kC, tiny_moe(), 0.5, 0);
  m.finalize_names("moe");
  m.materialize(5, DType::f64);
  const Tensor x = random_input(9);
  auto gate_grad = [&](double loss_scale, bool with_output) {
    m.gate().weight().value.set_grad(Tensor());
    moe_step() = MoeStep{.loss_scale = loss_scale};
    const Tensor y = m.forward(x);
    backward(with_output ? sum(y) : scale(sum(y), 0.0));
    moe_step() = MoeStep{};
    return m.gate().weight().value.grad().to_doubles();
  };
  // With the output's own gradient zeroed, only the losses' gradients are left: linear in the scale.
  const std::vector<double> one = gate_grad(1.0, false), quarter = gate_grad(0.25, false);
  double norm = 0;
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_NEAR(quarter[i], one[i] / 4, 1e-15);
    norm += std::fabs(one[i]);
  }
  EXPECT_GT(norm, 0) << "the balancing and z losses should reach the router";
}

TEST(MoeBlock, BadConfigsNameTheKey) {
  MoeConfig c = tiny_moe();
  c.top_k = 5;
  try {
    MoeBlock m(kC, c, 0.5, 0);
    FAIL() << "top_k > num_experts was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("num_experts_per_tok"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel::nn
