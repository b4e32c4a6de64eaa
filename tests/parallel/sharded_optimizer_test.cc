// The sharded optimizer against the plain update on one rank: each data-parallel rank holds a
// partial gradient, their sum is the one-rank gradient, and after every step each rank's
// parameters equal the one-rank update of that sum (clipped to the global norm). The sizes
// straddle the size up to which ZeRO 1/2 pack gradients into one collective (2^16 elements),
// and dp does not divide them.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "tessel/comm/thread_backend.h"
#include "tessel/comm/world.h"
#include "tessel/dist/dtensor.h"
#include "tessel/parallel/sharded_optimizer.h"

namespace tessel {
namespace {

const std::vector<Shape> kShapes = {{7}, {3, 5}, {70001}, {300, 250}};

// Deterministic values: parameter k at element i, and rank r's partial gradient at step t.
// Multiples of 2^-16 below 1, so that sums over ranks are exact in any order.
float value_at(size_t k, int64_t i) {
  return static_cast<float>((i * 37 + static_cast<int64_t>(k) * 101) % 1024 - 512) / 1024.0f;
}
float grad_at(size_t k, int64_t i, int64_t r, int64_t t) {
  return static_cast<float>((i * 53 + static_cast<int64_t>(k) * 7 + r * 331 + t * 97) % 512 - 256) / 65536.0f;
}

Tensor filled(const Shape& shape, const std::function<float(int64_t)>& f) {
  Tensor t = Tensor::empty(shape, DType::f32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = f(i);
  return t;
}

TEST(ShardedOptimizer, EveryStageUpdatesLikeOneRankOnTheSummedGradient) {
  constexpr int kSteps = 2;
  constexpr double kLr = 0.05, kMaxNorm = 0.2;
  for (const char* kind : {"adamw", "sgd"}) {
    for (int64_t dp : {2, 3}) {
      for (int64_t stage : {0, 1, 2}) {
        SCOPED_TRACE(fmt::format("{} dp {} stage {}", kind, dp, stage));
        parallel::OptimizerOptions options;
        options.kind = kind;
        options.adamw.weight_decay = 0.1;
        options.sgd.momentum = 0.9;
        // One rank: the summed gradients, clipped, through the same update rules.
        std::vector<Tensor> want, m, v;
        for (size_t k = 0; k < kShapes.size(); ++k) {
          want.push_back(filled(kShapes[k], [&](int64_t i) { return value_at(k, i); }));
          m.push_back(Tensor::zeros(kShapes[k], DType::f32));
          v.push_back(Tensor::zeros(kShapes[k], DType::f32));
        }
        std::vector<double> norms;
        for (int64_t t = 0; t < kSteps; ++t) {
          std::vector<Tensor> sums;
          double sq = 0;
          for (size_t k = 0; k < kShapes.size(); ++k) {
            sums.push_back(filled(kShapes[k], [&](int64_t i) {
              float s = 0;
              for (int64_t r = 0; r < dp; ++r) s += grad_at(k, i, r, t);
              return s;
            }));
            for (int64_t i = 0; i < sums[k].numel(); ++i)
              sq += std::pow(static_cast<double>(sums[k].data<float>()[i]), 2);
          }
          norms.push_back(std::sqrt(sq));
          const double norm = norms.back();
          const float clip = norm + 1e-6 > kMaxNorm ? static_cast<float>(kMaxNorm / (norm + 1e-6)) : 1.0f;
          for (size_t k = 0; k < kShapes.size(); ++k) {
            if (options.kind == "adamw")
              optim::adamw_update(want[k], sums[k], m[k], v[k], t + 1, options.adamw, kLr, kShapes[k].size() >= 2,
                                  clip);
            else
              optim::sgd_update(want[k], sums[k], &m[k], t == 0, options.sgd, kLr, clip);
          }
        }
        ASSERT_GT(norms[0], kMaxNorm);  // the clip is exercised

        spawn(static_cast<int>(dp), [&](int rank) {
          parallel::ParallelConfig config;
          config.dp = dp;
          config.sharding_stage = stage;
          const parallel::Layout layout(config, rank);
          const ProcessMesh mesh = layout.stage_mesh();
          std::vector<nn::Parameter> params(kShapes.size());
          std::vector<nn::Parameter*> ptrs;
          for (size_t k = 0; k < kShapes.size(); ++k) {
            params[k].name = fmt::format("p{}", k);
            params[k].shape = kShapes[k];
            params[k].value = dtensor_from_local(filled(kShapes[k], [&](int64_t i) { return value_at(k, i); }), mesh,
                                                 layout.placements({}), kShapes[k]);
            ptrs.push_back(&params[k]);
          }
          parallel::ShardedOptimizer optimizer(ptrs, layout, options);
          for (int64_t t = 0; t < kSteps; ++t) {
            for (size_t k = 0; k < kShapes.size(); ++k)
              params[k].value.set_grad(dtensor_from_local(
                  filled(kShapes[k], [&](int64_t i) { return grad_at(k, i, rank, t); }), mesh,
                  layout.placements({{"dp", Partial()}}), kShapes[k]));
            const double norm = optimizer.step(kLr, kMaxNorm);
            EXPECT_NEAR(norm, norms[static_cast<size_t>(t)], 1e-6 * norms[static_cast<size_t>(t)]) << "rank " << rank;
          }
          for (size_t k = 0; k < kShapes.size(); ++k) {
            const float* got = local_piece(params[k].value).data<float>();
            const float* expect = want[k].data<float>();
            // The sums are exact; only the clip coefficient's last bits may differ.
            const float tolerance = 1e-6f;
            int64_t bad = 0;
            for (int64_t i = 0; i < want[k].numel(); ++i) bad += std::abs(got[i] - expect[i]) > tolerance ? 1 : 0;
            EXPECT_EQ(bad, 0) << "rank " << rank << ": " << bad << " elements of " << params[k].name << " differ";
          }
        });
      }
    }
  }
}

}  // namespace
}  // namespace tessel
