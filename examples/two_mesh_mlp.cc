// Two stages on two meshes, written as for one device: the example of PaddlePaddle's automatic
// parallelism documentation, in tessel. Eight thread ranks form two 2 x 2 meshes; the first
// layer's weight lives column-sharded on mesh 0 (ranks 0-3), the second's row-sharded on mesh 1
// (ranks 4-7), and the activation crosses from one mesh to the other by a reshard to
// [Shard(0), Shard(2)]. AdamW steps the distributed weights exactly as it would plain ones.
// After a few steps the losses and the weights are compared with the same program on one rank,
// which is the oracle.
//
//   build/release/examples/two_mesh_mlp        (exit status 1 when they differ)
#include <cmath>
#include <cstdio>
#include <functional>
#include <mutex>
#include <vector>

#include "tessel/autograd/engine.h"
#include "tessel/comm/thread_backend.h"
#include "tessel/core/context.h"
#include "tessel/core/philox.h"
#include "tessel/core/view.h"
#include "tessel/dist/dtensor.h"
#include "tessel/ops/ops.h"
#include "tessel/optim/optimizer.h"

using namespace tessel;

namespace {

constexpr int kSteps = 4;

Tensor random(const Shape& shape, const char* name, double std) {
  Tensor t = Tensor::empty(shape, DType::f32);
  rng_fill(t, Distribution::normal, 0.0, std, /*seed=*/7, stream_key(name));
  return t;
}

// z = relu(x @ w0) @ w1 on x [B, S, H]; the loss is the mean square of z.
struct Mlp {
  Tensor w0, w1;
  // Where the activation goes between the layers: unchanged on one rank, the other mesh on two.
  std::function<Tensor(const Tensor&)> between = [](const Tensor& y) { return y; };

  Tensor loss(const Tensor& x) const {
    Tensor y = relu(matmul(x, w0));
    Tensor z = matmul(between(y), w1);
    return mean(mul(z, z));
  }
};

}  // namespace

int main() {
  try {
    const Tensor x = random({4, 8, 16}, "x", 1.0);
    const Tensor w0 = random({16, 32}, "w0", 0.25), w1 = random({32, 16}, "w1", 0.18);
    const optim::AdamWOptions adamw{.lr = 1e-2, .weight_decay = 0.01};

    // One rank: the oracle.
    Mlp serial{view::clone(w0), view::clone(w1)};
    serial.w0.set_requires_grad(true);
    serial.w1.set_requires_grad(true);
    optim::AdamW serial_opt({{"w0", serial.w0}, {"w1", serial.w1}}, adamw);
    std::vector<double> serial_losses;
    for (int s = 0; s < kSteps; ++s) {
      Tensor loss = serial.loss(x);
      serial_losses.push_back(loss.item());
      serial_opt.zero_grad();
      backward(loss);
      serial_opt.step();
    }

    double worst = 0;
    spawn(8, [&](int rank) {
      const ProcessMesh mesh0({2, 2}, {0, 1, 2, 3}, {"x", "y"}), mesh1({2, 2}, {4, 5, 6, 7}, {"x", "y"});
      Mlp model;
      {
        NoGradGuard no_grad;
        model.w0 = shard_tensor(w0, mesh0, {Replicate(), Shard(1)});  // column-sharded on mesh 0
        model.w1 = shard_tensor(w1, mesh1, {Replicate(), Shard(0)});  // row-sharded on mesh 1
      }
      model.w0.set_requires_grad(true);
      model.w1.set_requires_grad(true);
      // The activation [B, S, 32] to mesh 1: batch over "x", hidden (w1's rows) over "y".
      model.between = [mesh1](const Tensor& y) { return reshard(y, mesh1, {Shard(0), Shard(2)}); };
      // As on one device.
      optim::AdamW opt({{"w0", model.w0}, {"w1", model.w1}}, adamw);
      const Tensor xs = shard_tensor(x, mesh0, {Shard(0), Replicate()});
      double diff = 0;
      for (int s = 0; s < kSteps; ++s) {
        Tensor loss = model.loss(xs);  // on mesh 1, where the second layer ran
        if (mesh1.contains(rank)) {
          const double value = full_tensor(loss).item();
          if (rank == 4)
            std::printf("step %d: loss %.7f on the two meshes, %.7f on one rank\n", s, value,
                        serial_losses[static_cast<size_t>(s)]);
          diff = std::max(diff, std::abs(value - serial_losses[static_cast<size_t>(s)]));
        }
        opt.zero_grad();
        backward(loss);
        opt.step();
      }
      // Every rank of a mesh gathers its weight whole and compares it with the oracle's.
      for (const auto& [mine, want] : {std::pair{model.w0, serial.w0}, std::pair{model.w1, serial.w1}}) {
        if (!dist_attr(mine).mesh.contains(rank)) continue;
        std::vector<double> got = full_tensor(mine).to_doubles(), expect = want.to_doubles();
        for (size_t k = 0; k < got.size(); ++k) diff = std::max(diff, std::abs(got[k] - expect[k]));
      }
      if (rank == 0 || rank == 4)
        std::printf("rank %d: w0 %s on %s, w1 %s on %s; AdamW state %s\n", rank,
                    placements_str(dist_attr(model.w0).placements).c_str(), dist_attr(model.w0).mesh.str().c_str(),
                    placements_str(dist_attr(model.w1).placements).c_str(), dist_attr(model.w1).mesh.str().c_str(),
                    placements_str(dist_attr(opt.state_dict().at("w1.exp_avg")).placements).c_str());
      static std::mutex mu;
      std::lock_guard lock(mu);
      worst = std::max(worst, diff);
    });
    const bool same = worst < 1e-5;
    std::printf("%s: the two-mesh run %s the single-rank run after %d AdamW steps (worst difference %.1e, f32)\n",
                same ? "PASS" : "FAIL", same ? "equals" : "differs from", kSteps, worst);
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
