// The pipeline runtime with more than one tensor crossing each stage boundary (as an MoE
// auxiliary loss must): two stages on a [pp=2] x [dp=2] world pass the hidden states and a
// per-row auxiliary sum, forward and backward, under 1F1B and the split backward of ZB-H1; the
// loss and the weights' gradients equal the single-rank computation of the same model.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>

#include "tessel/autograd/engine.h"
#include "tessel/comm/thread_backend.h"
#include "tessel/core/philox.h"
#include "tessel/core/view.h"
#include "tessel/dist/dtensor.h"
#include "tessel/ops/ops.h"
#include "tessel/parallel/pipeline.h"

namespace tessel::parallel {
namespace {

constexpr int64_t kRows = 8, kT = 3, kC = 4, kMicro = 2;

Tensor random(const Shape& shape, const char* name) {
  Tensor t = Tensor::empty(shape, DType::f32);
  rng_fill(t, Distribution::normal, 0.0, 0.5, /*seed=*/3, stream_key(name));
  return t;
}

// Stage s: h <- tanh(h @ w[s]); aux <- aux + mean over (T, C) of h² per row. The loss of a
// micro-batch: mean(h) + 0.1 · mean(aux).
std::pair<Tensor, Tensor> stage(const Tensor& h, const Tensor& aux, const Tensor& w) {
  Tensor out = tanh(matmul(h, w));
  Tensor more = mean(mul(out, out), {1, 2});
  return {out, aux.defined() ? add(aux, more) : more};
}
Tensor micro_loss(const Tensor& h, const Tensor& aux) { return add(mean(h), scale(mean(aux), 0.1)); }

TEST(PipelineRuntime, PassesSeveralTensorsBetweenStagesLikeOneRank) {
  const Tensor x = random({kRows, kT, kC}, "x");
  const Tensor w0 = random({kC, kC}, "w0"), w1 = random({kC, kC}, "w1");
  // One rank.
  Tensor a0 = view::clone(w0), a1 = view::clone(w1);
  a0.set_requires_grad(true);
  a1.set_requires_grad(true);
  const int64_t mb = kRows / kMicro;
  double want_loss = 0;
  for (int64_t m = 0; m < kMicro; ++m) {
    auto [h, aux] = stage(view::slice(x, 0, m * mb, (m + 1) * mb), Tensor(), a0);
    auto [h2, aux2] = stage(h, aux, a1);
    Tensor loss = micro_loss(h2, aux2);
    want_loss += loss.item() / kMicro;
    backward(scale(loss, 1.0 / kMicro));
  }
  for (const char* schedule : {"1F1B", "ZBH1"}) {
    SCOPED_TRACE(schedule);
    std::mutex mu;
    spawn(4, [&](int rank) {
      ParallelConfig c;
      c.pp = 2;
      c.dp = 2;
      c.micro_batches = kMicro;
      c.schedule = schedule;
      const Layout layout(c, rank);
      const ProcessMesh mesh = layout.stage_mesh();
      Tensor w = shard_tensor(layout.coord("pp") == 0 ? w0 : w1, mesh, layout.placements({}));
      w.set_requires_grad(true);
      const std::vector<Payload> payload = {
          {{mb, kT, kC}, DType::f32, layout.placements({{"dp", Shard(0)}})},
          {{mb}, DType::f32, layout.placements({{"dp", Shard(0)}})}};
      PipelineRuntime runtime(make_schedule(schedule, 2, kMicro, 1), layout, payload);
      const double loss_sum = runtime.run([&](int, int m, const std::vector<Tensor>& in) -> std::vector<Tensor> {
        if (layout.coord("pp") == 0) {
          const Tensor xs = shard_tensor(view::slice(x, 0, m * mb, (m + 1) * mb), mesh, layout.placements({{"dp", Shard(0)}}));
          auto [h, aux] = stage(xs, Tensor(), w);
          return {h, aux};
        }
        EXPECT_EQ(in.size(), 2u);
        auto [h, aux] = stage(in[0], in[1], w);
        return {reshard(micro_loss(h, aux), mesh, layout.placements({}))};  // a replicated scalar
      });
      const Tensor grad = full_tensor(reshard(w.grad(), mesh, layout.placements({})));
      const Tensor& want = layout.coord("pp") == 0 ? a0.grad() : a1.grad();
      std::lock_guard lock(mu);
      if (layout.coord("pp") == 1) {
        EXPECT_NEAR(loss_sum / kMicro, want_loss, 1e-6) << "rank " << rank;
      }
      const std::vector<double> got = grad.to_doubles(), expect = want.to_doubles();
      for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expect[i], 1e-6) << "rank " << rank << " element " << i;
    });
  }
}

}  // namespace
}  // namespace tessel::parallel
