// Optimizers against straightforward re-statements of PyTorch's update rules, clipping,
// schedules and the state dict.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "tessel/core/error.h"
#include "tessel/comm/thread_backend.h"
#include "tessel/dist/dtensor.h"
#include "tessel/optim/optimizer.h"

namespace tessel::optim {
namespace {

Tensor param(std::vector<double> v, Shape s) {
  Tensor t = Tensor::from_doubles(v, s, DType::f32);
  t.set_requires_grad(true);
  return t;
}

void set_grad(const Tensor& p, std::vector<double> g) { p.set_grad(Tensor::from_doubles(g, p.shape(), DType::f32)); }

TEST(AdamW, MatchesTheReferenceRuleAndDecaysOnlyMatrices) {
  Tensor w = param({0.5, -1.0, 2.0, 0.25}, {2, 2});
  Tensor b = param({0.1, -0.2}, {2});
  AdamWOptions o{.lr = 0.1, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.5};
  AdamW opt({{"w", w}, {"b", b}}, o);
  // Reference in double.
  std::vector<double> pw = {0.5, -1.0, 2.0, 0.25}, pb = {0.1, -0.2}, mw(4), vw(4), mb(2), vb(2);
  auto ref = [&](std::vector<double>& p, std::vector<double>& m, std::vector<double>& v, const std::vector<double>& g,
                 int t, bool decay) {
    for (size_t i = 0; i < p.size(); ++i) {
      if (decay) p[i] *= 1 - o.lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      double mh = m[i] / (1 - std::pow(o.beta1, t)), vh = v[i] / (1 - std::pow(o.beta2, t));
      p[i] -= o.lr * mh / (std::sqrt(vh) + o.eps);
    }
  };
  for (int t = 1; t <= 5; ++t) {
    std::vector<double> gw = {0.1 * t, -0.3, 0.05, 1.0 / t}, gb = {0.2, -0.1 * t};
    set_grad(w, gw);
    set_grad(b, gb);
    opt.step();
    ref(pw, mw, vw, gw, t, true);
    ref(pb, mb, vb, gb, t, false);
  }
  std::vector<double> gotw = w.to_doubles(), gotb = b.to_doubles();
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(gotw[i], pw[i], 2e-6) << i;
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(gotb[i], pb[i], 2e-6) << i;
  EXPECT_EQ(opt.steps(), 5);
}

TEST(Sgd, MomentumAndNesterov) {
  for (bool nesterov : {false, true}) {
    Tensor p = param({1.0, 2.0}, {2});
    Sgd opt({{"p", p}}, SgdOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = nesterov});
    std::vector<double> ref = {1.0, 2.0}, buf(2);
    for (int t = 0; t < 4; ++t) {
      std::vector<double> g = {0.5 - t, 0.25 * t};
      set_grad(p, g);
      opt.step();
      for (size_t i = 0; i < 2; ++i) {
        double d = g[i] + 0.01 * ref[i];
        buf[i] = t == 0 ? d : 0.9 * buf[i] + d;
        ref[i] -= 0.1 * (nesterov ? d + 0.9 * buf[i] : buf[i]);
      }
    }
    std::vector<double> got = p.to_doubles();
    EXPECT_NEAR(got[0], ref[0], 1e-6);
    EXPECT_NEAR(got[1], ref[1], 1e-6);
  }
  EXPECT_THROW(Sgd({}, SgdOptions{.momentum = 0.0, .nesterov = true}), Error);
}

TEST(Clip, GlobalNormAcrossParametersLikeTorch) {
  Tensor a = param({0, 0, 0}, {3}), b = param({0, 0}, {2});
  set_grad(a, {3, 0, 0});
  set_grad(b, {0, 4});
  double norm = clip_grad_norm({a, b}, 1.0);
  EXPECT_DOUBLE_EQ(norm, 5.0);
  double coef = 1.0 / (5.0 + 1e-6);
  EXPECT_NEAR(a.grad().to_doubles()[0], 3 * coef, 1e-7);
  EXPECT_NEAR(b.grad().to_doubles()[1], 4 * coef, 1e-7);
  // Under the threshold: untouched.
  set_grad(a, {0.3, 0, 0});
  set_grad(b, {0, 0.4});
  EXPECT_NEAR(clip_grad_norm({a, b}, 1.0), 0.5, 1e-7);
  EXPECT_NEAR(a.grad().to_doubles()[0], 0.3, 1e-7);
}

// step(coef) is the update on clip_grad_norm's scaled gradients, bit for bit, for both
// optimizers and with the coefficient active or not (1.0 when the norm is under the limit).
TEST(Clip, ACoefficientInsideTheStepEqualsScalingTheGradientsFirst) {
  for (const char* kind : {"adamw", "sgd"})
    for (double max_norm : {0.3, 100.0}) {
      auto run = [&](bool inside) {
        Tensor w = param({0.5, -1.0, 2.0, 0.25}, {2, 2}), b = param({0.1, -0.2}, {2});
        std::unique_ptr<Optimizer> opt;
        if (std::string(kind) == "adamw")
          opt = std::make_unique<AdamW>(std::vector<ParamRef>{{"w", w}, {"b", b}},
                                        AdamWOptions{.lr = 0.1, .weight_decay = 0.5});
        else
          opt = std::make_unique<Sgd>(std::vector<ParamRef>{{"w", w}, {"b", b}},
                                      SgdOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
        for (int t = 1; t <= 3; ++t) {
          set_grad(w, {0.1 * t, -0.3, 0.05, 1.0 / t});
          set_grad(b, {0.2, -0.1 * t});
          if (inside) {
            opt->step(clip_coefficient(std::sqrt(grad_sum_squares({w, b})), max_norm));
          } else {
            clip_grad_norm({w, b}, max_norm);
            opt->step();
          }
        }
        return std::vector<float>{w.data<float>()[0], w.data<float>()[1], w.data<float>()[2], w.data<float>()[3],
                                  b.data<float>()[0], b.data<float>()[1]};
      };
      EXPECT_EQ(run(true), run(false)) << kind << " max_norm " << max_norm;
    }
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0f);
  EXPECT_EQ(clip_coefficient(4.0, 0.0), 1.0f);  // no clipping
  EXPECT_FLOAT_EQ(clip_coefficient(4.0, 1.0), static_cast<float>(1.0 / (4.0 + 1e-6)));
}

TEST(Schedule, WarmupThenCosineOrLinear) {
  LrSchedule s{.kind = LrSchedule::Kind::cosine, .lr = 1.0, .min_lr = 0.1, .warmup = 10, .total = 110};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
  EXPECT_NEAR(s.at(500), 0.1, 1e-12);
  s.kind = LrSchedule::Kind::linear;
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);
  EXPECT_NEAR(s.at(35), 1.0 - 0.25 * 0.9, 1e-12);
  LrSchedule c{.kind = LrSchedule::Kind::constant, .lr = 0.3};
  EXPECT_EQ(c.at(1000), 0.3);
  EXPECT_THROW(LrSchedule::parse_kind("step"), Error);
}

TEST(StateDict, RoundTripsAndRejectsMismatches) {
  Tensor w = param({1, 2, 3, 4}, {2, 2});
  AdamW a({{"w", w}}, AdamWOptions{});
  set_grad(w, {1, 1, 1, 1});
  a.step();
  auto state = a.state_dict();
  EXPECT_EQ(state.size(), 3u);
  EXPECT_EQ(state.at("step").item(), 1.0);
  Tensor w2 = param({1, 2, 3, 4}, {2, 2});
  AdamW b({{"w", w2}}, AdamWOptions{});
  b.load_state_dict(state);
  EXPECT_EQ(b.steps(), 1);
  EXPECT_EQ(b.state_dict().at("w.exp_avg").to_doubles(), state.at("w.exp_avg").to_doubles());
  auto bad = state;
  bad["w.exp_avg"] = Tensor::zeros({3});
  EXPECT_THROW(b.load_state_dict(bad), CheckpointError);
  auto extra = state;
  extra["v.exp_avg"] = Tensor::zeros({1});
  EXPECT_THROW(b.load_state_dict(extra), CheckpointError);
  auto missing = state;
  missing.erase("w.exp_avg_sq");
  EXPECT_THROW(b.load_state_dict(missing), CheckpointError);
  // "step" must be a non-negative integer scalar; state slots must be floating point.
  for (Tensor step : {Tensor::scalar(3.7, DType::f64), Tensor::scalar(-2.0, DType::i64), Tensor::zeros({1, 1}, DType::i64),
                      Tensor::scalar(1e30, DType::f64)}) {
    auto odd = state;
    odd["step"] = step;
    EXPECT_THROW(b.load_state_dict(odd), CheckpointError) << step.str();
  }
  auto integral = state;
  integral["w.exp_avg"] = Tensor::zeros({2, 2}, DType::i32);
  EXPECT_THROW(b.load_state_dict(integral), CheckpointError);
  EXPECT_EQ(b.steps(), 1);  // a refused state leaves the optimizer as it was
}

}  // namespace
}  // namespace tessel::optim

namespace tessel::optim {
namespace {

// AdamW and SGD take distributed parameters as they are: on a [dp=2, tp=2] mesh of thread
// ranks a weight column-sharded over tp whose gradient arrives as a Partial sum over dp (each
// dp rank's half of the batch), clipped by the global norm, updates exactly as one rank does on
// the summed gradient; the state is distributed like the weight.
TEST(Optimizer, StepsDistributedParametersLikeOneRank) {
  const Shape shape{4, 6};
  auto value = [](int64_t i) { return std::sin(0.3 * static_cast<double>(i)); };
  auto grad_half = [](int64_t i, int64_t dp) { return std::cos(0.7 * static_cast<double>(i) + static_cast<double>(dp)); };
  std::vector<double> v(24), g(24);
  for (int64_t i = 0; i < 24; ++i) {
    v[static_cast<size_t>(i)] = value(i);
    g[static_cast<size_t>(i)] = grad_half(i, 0) + grad_half(i, 1);
  }
  for (const std::string kind : {"adamw", "sgd"}) {
    SCOPED_TRACE(kind);
    auto make = [&](std::vector<ParamRef> ps) -> std::unique_ptr<Optimizer> {
      if (kind == "adamw") return std::make_unique<AdamW>(std::move(ps), AdamWOptions{.lr = 0.05, .weight_decay = 0.1});
      return std::make_unique<Sgd>(std::move(ps), SgdOptions{.lr = 0.05, .momentum = 0.9});
    };
    // One rank.
    Tensor w = param(v, shape);
    auto one = make({{"w", w}});
    std::vector<double> norms;
    for (int s = 0; s < 3; ++s) {
      set_grad(w, g);
      norms.push_back(std::sqrt(grad_sum_squares({w})));
      one->step(clip_coefficient(norms.back(), 1.0));
    }
    const std::vector<double> want = w.to_doubles();
    spawn(4, [&](int rank) {
      const ProcessMesh mesh = ProcessMesh::iota({2, 2}, {"dp", "tp"});
      Tensor full = Tensor::from_doubles(v, shape, DType::f32);
      Tensor d = shard_tensor(full, mesh, {Replicate(), Shard(1)});
      d.set_requires_grad(true);
      auto opt = make({{"w", d}});
      const int64_t dp = mesh.coord(rank)[0];
      std::vector<double> half(24);
      for (int64_t i = 0; i < 24; ++i) half[static_cast<size_t>(i)] = grad_half(i, dp);
      for (int s = 0; s < 3; ++s) {
        // This dp rank's contribution, a partial sum over dp, split over tp like the weight.
        Tensor mine = shard_tensor(Tensor::from_doubles(half, shape, DType::f32), mesh, {Replicate(), Shard(1)});
        d.set_grad(dtensor_from_local(local_piece(mine), mesh, {Partial(), Shard(1)}, shape));
        const double norm = std::sqrt(grad_sum_squares({d}));
        EXPECT_NEAR(norm, norms[static_cast<size_t>(s)], 1e-5 * norms[static_cast<size_t>(s)]) << "rank " << rank;
        opt->step(clip_coefficient(norm, 1.0));
      }
      const std::vector<double> got = full_tensor(d).to_doubles();
      for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << "rank " << rank << " element " << i;
      const Tensor state = opt->state_dict().at(kind == "adamw" ? "w.exp_avg" : "w.momentum_buffer");
      EXPECT_EQ(dist_attr(state).placements, (Placements{Replicate(), Shard(1)}));
    });
  }
}

}  // namespace
}  // namespace tessel::optim
