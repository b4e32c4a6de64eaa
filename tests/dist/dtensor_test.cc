// Distributed tensors: construction, conversion, local creation, and a first op with its
// gradient — each checked against the same computation on one rank.
#include <gtest/gtest.h>

#include "tessel/autograd/engine.h"
#include "tessel/comm/thread_backend.h"
#include "tessel/comm/world.h"
#include "tessel/core/context.h"
#include "tessel/core/philox.h"
#include "tessel/dist/dtensor.h"
#include "tessel/ops/ops.h"

namespace tessel {
namespace {

Tensor iota(const Shape& s) {
  std::vector<double> v(static_cast<size_t>(shape_numel(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i) * 0.5 - 3;
  return Tensor::from_doubles(v, s, DType::f64);
}

// Mesh text that parses to more processes than any machine has (or whose product overflows)
// is refused before a rank list is allocated.
TEST(ProcessMesh, ParsesTextAndRefusesImpossibleSizes) {
  ProcessMesh m = ProcessMesh::parse("mesh(dp=2,tp=3)");
  EXPECT_EQ(m.size(), 6);
  EXPECT_EQ(ProcessMesh::parse(m.str()).str(), m.str());
  EXPECT_EQ(ProcessMesh::parse("2x2").size(), 4);
  for (const char* text : {"mesh(dp=65536,tp=65536)", "100000x100000x100000", "mesh(a=4294967296,b=4294967296)"}) {
    try {
      ProcessMesh::parse(text);
      ADD_FAILURE() << text << " parsed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("more than 16777216 processes"), std::string::npos) << e.what();
    }
  }
}

TEST(DTensor, ShardAndGatherRoundTripEveryPlacement) {
  spawn(3, [](int) {
    ProcessMesh mesh = ProcessMesh::iota({3}, {"x"});
    Tensor full = iota({7, 5});
    for (Placement p : {Replicate(), Shard(0), Shard(1), Partial()}) {
      Tensor d = shard_tensor(full, mesh, {p});
      EXPECT_EQ(d.shape(), (Shape{7, 5}));
      EXPECT_EQ(full_tensor(d).to_doubles(), full.to_doubles()) << p.str();
    }
    Tensor s = shard_tensor(full, mesh, {Shard(0)});
    int r = world_group()->rank();
    EXPECT_EQ(to_local(s).shape(), (Shape{r == 0 ? 3 : 2, 5}));  // 7 over 3: 3, 2, 2
    EXPECT_THROW(s.to_doubles(), Error);                         // data live in pieces
  });
}

TEST(DTensor, LocalCreationEqualsTheSliceOfTheWhole) {
  spawn(4, [](int) {
    ProcessMesh mesh = ProcessMesh::iota({2, 2}, {"dp", "tp"});
    auto fill = [](const Tensor& t, const GlobalBox& box) { rng_fill(t, Distribution::normal, 0, 1, 7, 9, box); };
    Tensor d = make_dtensor({5, 6}, DType::f64, mesh, {Shard(1), Shard(0)}, fill);
    Tensor whole = Tensor::empty({5, 6}, DType::f64);
    fill(whole, {});
    EXPECT_EQ(full_tensor(d).to_doubles(), whole.to_doubles());
  });
}

TEST(DTensor, FromLocalChecksThePieceShape) {
  spawn(2, [](int rank) {
    ProcessMesh mesh = ProcessMesh::iota({2});
    Tensor piece = Tensor::full({rank == 0 ? 2 : 1, 3}, rank + 1.0, DType::f64);
    Tensor d = dtensor_from_local(piece, mesh, {Shard(0)}, {3, 3});
    EXPECT_EQ(full_tensor(d).to_doubles(), (std::vector<double>{1, 1, 1, 1, 1, 1, 2, 2, 2}));
    EXPECT_THROW(dtensor_from_local(piece, mesh, {Shard(0)}, {5, 3}), Error);
  });
}

TEST(DTensor, MatmulAndItsGradientsEqualTheSerialRun) {
  Tensor x = iota({6, 4}), w = iota({4, 5});
  Tensor xs = x.detach(), ws = w.detach();
  xs.set_requires_grad(true);
  ws.set_requires_grad(true);
  backward(sum(mul(matmul(xs, ws), ws.detach().numel() > 0 ? Tensor::full({6, 5}, 0.5, DType::f64) : Tensor())));
  std::vector<double> gx = xs.grad().to_doubles(), gw = ws.grad().to_doubles(), y = matmul(x, w).to_doubles();
  spawn(2, [&](int) {
    ProcessMesh mesh = ProcessMesh::iota({2});
    Tensor dx, dw;
    {
      NoGradGuard g;
      dx = shard_tensor(x, mesh, {Shard(0)});
      dw = shard_tensor(w, mesh, {Replicate()});
    }
    dx.set_requires_grad(true);
    dw.set_requires_grad(true);
    Tensor dy = matmul(dx, dw);
    EXPECT_EQ(dist_attr(dy).placements, (Placements{Shard(0)}));
    EXPECT_EQ(full_tensor(dy).to_doubles(), y);
    backward(sum(mul(dy, Tensor::full({6, 5}, 0.5, DType::f64))));
    EXPECT_EQ(dist_attr(dw.grad()).placements, (Placements{Partial()}));  // reduced only when needed
    EXPECT_EQ(full_tensor(dx.grad()).to_doubles(), gx);
    std::vector<double> got = full_tensor(dw.grad()).to_doubles();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], gw[i], 1e-12);
  });
}

}  // namespace
}  // namespace tessel
