// The split backward of zero-bubble pipelines (B then W) and activation recompute: both must
// give exactly the gradients of a plain backward.
#include <gtest/gtest.h>

#include <algorithm>

#include "tessel/autograd/engine.h"
#include "tessel/core/context.h"
#include "tessel/core/view.h"
#include "tessel/ops/ops.h"

namespace tessel {
namespace {

Tensor randn(Shape shape, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<double>(seed * 131 + i) * 0.7);
  return Tensor::from_doubles(v, shape, DType::f64);
}

struct Net {
  Tensor w1 = randn({4, 5}, 1).set_requires_grad(), b1 = randn({5}, 2).set_requires_grad(),
         w2 = randn({5, 3}, 3).set_requires_grad(), g = randn({3}, 4).set_requires_grad();
  Tensor block(const Tensor& x) const { return layer_norm(gelu(linear(x, w1, b1, true), true), Tensor(), Tensor(), 1e-5); }
  Tensor forward(const Tensor& x) const { return mul(linear(block(x), w2, Tensor(), true), g); }
};

void expect_equal(const Tensor& a, const Tensor& b) {
  ASSERT_TRUE(a.defined() && b.defined());
  ASSERT_EQ(a.shape(), b.shape());
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_DOUBLE_EQ(a.to_doubles()[i], b.to_doubles()[i]) << i;
}

TEST(SplitBackward, InputsFirstThenWeightsEqualsOneBackward) {
  Net ref, split;
  Tensor x0 = randn({2, 4}, 9);
  Tensor gy = randn({2, 3}, 10);
  Tensor xr = x0.detach().set_requires_grad(), xs = x0.detach().set_requires_grad();
  backward(ref.forward(xr), gy);

  DeferredWeightGrads later = backward_inputs({split.forward(xs)}, {gy}, {xs});
  ASSERT_TRUE(xs.grad().defined());
  expect_equal(xs.grad(), xr.grad());
  EXPECT_FALSE(split.w1.grad().defined()) << "B must leave the weight gradients for W";
  EXPECT_FALSE(split.w2.grad().defined());
  EXPECT_GT(later.items.size(), 0u);
  backward_weights(std::move(later));
  expect_equal(split.w1.grad(), ref.w1.grad());
  expect_equal(split.b1.grad(), ref.b1.grad());
  expect_equal(split.w2.grad(), ref.w2.grad());
  expect_equal(split.g.grad(), ref.g.grad());
}

// grad_ready_hooks run once per backward, when a leaf has all of its gradient: a leaf used
// twice is reported after its second use, the last layer's weight before the first layer's,
// and with a split backward the weights only in W.
TEST(GradReadyHooks, RunOnceWhenALeafHasItsWholeGradient) {
  for (bool split_backward : {false, true}) {
    SCOPED_TRACE(split_backward ? "B then W" : "one backward");
    Net ref, net;
    Tensor x0 = randn({2, 4}, 9), gy = randn({2, 3}, 10);
    Tensor xr = x0.detach().set_requires_grad(), xs = x0.detach().set_requires_grad();
    // g is used twice: in forward and once more on the output.
    backward(mul(ref.forward(xr), ref.g), gy);
    std::vector<std::string> order;
    std::vector<Tensor> seen;
    auto watch = [&](Tensor& t, std::string name) {
      t.autograd_meta().grad_ready_hooks.push_back([&order, &seen, name](const Tensor& g) {
        order.push_back(name);
        seen.push_back(view::clone(g));
      });
    };
    watch(net.w1, "w1");
    watch(net.w2, "w2");
    watch(net.g, "g");
    watch(xs, "x");
    Tensor y = mul(net.forward(xs), net.g);
    if (split_backward) {
      DeferredWeightGrads later = backward_inputs({y}, {gy}, {xs});
      EXPECT_EQ(order, (std::vector<std::string>{"x"})) << "the weights' gradients are not complete after B";
      backward_weights(std::move(later));
    } else {
      backward(y, gy);
    }
    ASSERT_EQ(order.size(), 4u);
    auto at = [&](const std::string& n) { return std::find(order.begin(), order.end(), n) - order.begin(); };
    EXPECT_LT(at("w2"), at("w1"));  // the backward reaches the last layer first
    expect_equal(seen[static_cast<size_t>(at("g"))], ref.g.grad());  // both uses summed
    expect_equal(seen[static_cast<size_t>(at("w1"))], ref.w1.grad());
    expect_equal(seen[static_cast<size_t>(at("x"))], xr.grad());
  }
}

TEST(Recompute, GivesTheSameGradientsAndKeepsNoBlockActivations) {
  Net ref, rc;
  Tensor x0 = randn({2, 4}, 11);
  Tensor xr = x0.detach().set_requires_grad(), xc = x0.detach().set_requires_grad();
  backward(sum(ref.forward(xr)));
  int reruns = 0;
  Tensor h = recompute([&](const Tensor& x) { return rc.block(x); }, xc, [&] { ++reruns; });
  Tensor y = mul(linear(h, rc.w2, Tensor(), true), rc.g);
  backward(sum(y));
  EXPECT_EQ(reruns, 1);
  expect_equal(xc.grad(), xr.grad());
  expect_equal(rc.w1.grad(), ref.w1.grad());
  expect_equal(rc.b1.grad(), ref.b1.grad());
  expect_equal(rc.w2.grad(), ref.w2.grad());
}

}  // namespace
}  // namespace tessel
