// Autograd engine: accumulation, shared subgraphs, no-grad, explicit gradients, retain_graph
// and the errors a user sees.
#include <gtest/gtest.h>

#include "tessel/autograd/engine.h"
#include "tessel/autograd/function.h"
#include "tessel/core/context.h"
#include "tessel/ops/ops.h"

namespace tessel {
namespace {

Tensor leaf(std::vector<double> v, Shape s) {
  Tensor t = Tensor::from_doubles(v, s, DType::f64);
  t.set_requires_grad(true);
  return t;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Autograd, SharedSubexpressionAndAccumulation) {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = mul(x, x);               // dy/dx = 2x
  Tensor z = sum(add(y, scale(x, 3)));  // dz/dx = 2x + 3
  backward(z);
  EXPECT_EQ(x.grad().to_doubles(), (std::vector<double>{5, 7, 9}));
  // A second graph accumulates into the same .grad.
  backward(sum(x));
  EXPECT_EQ(x.grad().to_doubles(), (std::vector<double>{6, 8, 10}));
}

TEST(Autograd, NoGradScopeRecordsNothing) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y;
  {
    NoGradGuard g;
    y = mul(x, x);
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(y.is_leaf());
  EXPECT_NE(message_of([&] { backward(sum(y)); }).find("does not require grad"), std::string::npos);
}

TEST(Autograd, ExplicitGradientForANonScalarRoot) {
  Tensor x = leaf({1, 2, 3, 4}, {2, 2});
  Tensor y = scale(x, 2.0);
  EXPECT_NE(message_of([&] { backward(y); }).find("one-element"), std::string::npos);
  backward(y, Tensor::from_doubles({1, 0, 0, 1}, {2, 2}, DType::f64));
  EXPECT_EQ(x.grad().to_doubles(), (std::vector<double>{2, 0, 0, 2}));
  Tensor z = scale(x, 2.0);
  std::string msg = message_of([&] { backward(z, Tensor::ones({4}, DType::f64)); });
  EXPECT_NE(msg.find("[4]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 2]"), std::string::npos) << msg;
}

TEST(Autograd, SecondBackwardNeedsRetainGraph) {
  Tensor x = leaf({1, 2}, {2});
  Tensor l = sum(mul(x, x));
  backward(l, {}, /*retain_graph=*/true);
  backward(l);  // allowed: the first kept the graph
  EXPECT_EQ(x.grad().to_doubles(), (std::vector<double>{4, 8}));
  std::string msg = message_of([&] { backward(l); });
  EXPECT_NE(msg.find("second time"), std::string::npos) << msg;
  EXPECT_NE(msg.find("retain_graph"), std::string::npos) << msg;
}

TEST(Autograd, GradientShapeMismatchNamesTheNode) {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = Tensor::zeros({3}, DType::f64);
  record_function("bad_node", {x}, {y}, [](std::vector<Tensor>&&) { return std::vector<Tensor>{Tensor::ones({2}, DType::f64)}; });
  std::string msg = message_of([&] { backward(sum(y)); });
  EXPECT_NE(msg.find("bad_node"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3]"), std::string::npos) << msg;
}

TEST(Autograd, GradReturnsWithoutTouchingDotGrad) {
  Tensor x = leaf({1, 2}, {2});
  Tensor w = leaf({3, 4}, {2});
  Tensor h = mul(x, w);
  Tensor l = sum(mul(h, h));
  std::vector<Tensor> g = grad({l}, {x, h});
  EXPECT_EQ(g[0].to_doubles(), (std::vector<double>{2 * 3 * 3, 2 * 2 * 4 * 4}));  // 2 x w²
  EXPECT_EQ(g[1].to_doubles(), (std::vector<double>{6, 16}));                   // 2 h
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
}

TEST(Autograd, DetachAndIntegerInputsStopGradients) {
  Tensor x = leaf({1, 2}, {2});
  Tensor d = x.detach();
  EXPECT_FALSE(d.requires_grad());
  Tensor l = sum(add(mul(x, d), x));
  backward(l);
  EXPECT_EQ(x.grad().to_doubles(), (std::vector<double>{2, 3}));
  Tensor table = leaf({1, 2, 3, 4}, {2, 2});
  Tensor ids = Tensor::from_doubles({1, 1, 0}, {3}, DType::i64);
  backward(sum(embedding(table, ids)));
  EXPECT_EQ(table.grad().to_doubles(), (std::vector<double>{1, 1, 2, 2}));
}

TEST(Autograd, PostAccumulateHooksSeeTheFinalGradient) {
  Tensor x = leaf({1, 2}, {2});
  std::vector<double> seen;
  x.autograd_meta().post_accumulate_hooks.push_back([&](const Tensor& g) { seen = g.to_doubles(); });
  backward(sum(scale(x, 5.0)));
  EXPECT_EQ(seen, (std::vector<double>{5, 5}));
}

TEST(Autograd, TapeOrderHandlesDiamondsAndDeadBranches) {
  Tensor x = leaf({2}, {1});
  Tensor a = exp(x);
  Tensor b = mul(a, x);
  Tensor unused = mul(a, a);  // recorded but not part of the loss
  (void)unused;
  Tensor c = add(a, b);  // c = e^x + x e^x; dc/dx = 2e^x + x e^x
  backward(sum(c));
  double e2 = std::exp(2.0);
  EXPECT_NEAR(x.grad().item(), 2 * e2 + 2 * e2, 1e-12);
}

TEST(Autograd, Bf16LeafGetsBf16Gradient) {
  Tensor x = Tensor::from_doubles({1, 2}, {2}, DType::bf16);
  x.set_requires_grad(true);
  Tensor y = mul(x, x);
  EXPECT_EQ(y.dtype(), DType::bf16);
  backward(sum(y));
  EXPECT_EQ(x.grad().dtype(), DType::bf16);
  EXPECT_EQ(x.grad().to_doubles(), (std::vector<double>{2, 4}));
}

}  // namespace
}  // namespace tessel
