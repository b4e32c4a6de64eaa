// The same MLP, written once, run on one rank and on a 2 x 2 mesh of thread ranks: the batch
// sharded over "dp", the first layer column-parallel and the second row-parallel over "tp"
// (Megatron's MLP). Every op picks its layout by its SPMD rule and inserts the communication;
// the loss and every gradient are then compared with the single-rank run, which is the oracle.
//
//   build/release/examples/dtensor_mlp        (exit status 1 when they differ)
#include <cmath>
#include <cstdio>
#include <vector>

#include "tessel/autograd/engine.h"
#include "tessel/comm/thread_backend.h"
#include "tessel/comm/world.h"
#include "tessel/core/context.h"
#include "tessel/core/philox.h"
#include "tessel/dist/dtensor.h"
#include "tessel/ops/ops.h"

using namespace tessel;

namespace {

Tensor random(const Shape& shape, const char* name, double std) {
  Tensor t = Tensor::empty(shape, DType::f64);
  rng_fill(t, Distribution::normal, 0.0, std, /*seed=*/42, stream_key(name));
  return t;
}

// The model, as one would write it for one device: y = W2 · gelu(W1 x + b1) + b2, mean squared
// error. Nothing here knows about ranks.
struct Mlp {
  Tensor w1, b1, w2, b2;
  std::vector<Tensor> params() const { return {w1, b1, w2, b2}; }
  Tensor loss(const Tensor& x, const Tensor& target) const {
    Tensor y = linear(gelu(linear(x, w1, b1), /*tanh_approximation=*/true), w2, b2);
    Tensor d = sub(y, target);
    return mean(mul(d, d));
  }
};

const char* kNames[] = {"w1", "b1", "w2", "b2"};

Mlp full_model() {
  return {random({32, 16}, "w1", 0.25), random({32}, "b1", 0.02), random({4, 32}, "w2", 0.18),
          random({4}, "b2", 0.02)};
}

}  // namespace

int main() {
  try {
    const Tensor x = random({8, 16}, "x", 1.0), target = random({8, 4}, "target", 1.0);

    // One rank: the reference loss and gradients.
    Mlp serial = full_model();
    for (Tensor& p : serial.params()) p.set_requires_grad(true);
    Tensor serial_loss = serial.loss(x, target);
    backward(serial_loss);
    std::printf("one rank:   loss %.15f\n", serial_loss.item());

    // Four thread ranks on a mesh [dp=2, tp=2]. Each rank passes the same full tensors and
    // keeps its piece (a real model would create only its pieces with make_dtensor).
    double worst = 0;
    spawn(4, [&](int rank) {
      const ProcessMesh mesh = ProcessMesh::iota({2, 2}, {"dp", "tp"});
      const Mlp full = full_model();
      Mlp model;
      {
        NoGradGuard no_grad;
        model.w1 = shard_tensor(full.w1, mesh, {Replicate(), Shard(0)});  // column-parallel: output features
        model.b1 = shard_tensor(full.b1, mesh, {Replicate(), Shard(0)});
        model.w2 = shard_tensor(full.w2, mesh, {Replicate(), Shard(1)});  // row-parallel: input features
        model.b2 = shard_tensor(full.b2, mesh, {Replicate(), Replicate()});
      }
      std::vector<Tensor> params = model.params();
      for (Tensor& p : params) p.set_requires_grad(true);
      Tensor xs = shard_tensor(x, mesh, {Shard(0), Replicate()});  // the batch over dp
      Tensor ts = shard_tensor(target, mesh, {Shard(0), Replicate()});

      Tensor loss = model.loss(xs, ts);
      backward(loss);
      const double value = full_tensor(loss).item();
      if (rank == 0)
        std::printf("2 x 2 mesh: loss %.15f   (loss placements %s)\n", value,
                    placements_str(dist_attr(loss).placements).c_str());
      double diff = std::abs(value - serial_loss.item());
      std::vector<Tensor> serial_params = serial.params();
      for (size_t i = 0; i < params.size(); ++i) {
        const Tensor grad = params[i].grad();
        std::vector<double> got = full_tensor(grad).to_doubles(), want = serial_params[i].grad().to_doubles();
        double d = 0;
        for (size_t k = 0; k < got.size(); ++k) d = std::max(d, std::abs(got[k] - want[k]));
        if (rank == 0)
          std::printf("  grad %-2s %-14s on the mesh; max |mesh - one rank| = %.1e\n", kNames[i],
                      placements_str(dist_attr(grad).placements).c_str(), d);
        diff = std::max(diff, d);
      }
      if (rank == 0) worst = diff;
    });
    const bool same = worst < 1e-12;
    std::printf("%s: the mesh run %s the single-rank run (worst difference %.1e, f64)\n", same ? "PASS" : "FAIL",
                same ? "equals" : "differs from", worst);
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
