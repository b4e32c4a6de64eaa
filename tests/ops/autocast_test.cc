// bf16 mixed precision (AutocastScope, OpDef::autocast): which dtype each kind of op computes
// in, that gradients reach f32 inputs in f32, that backward passes and kernels run with it off,
// and that a recompute reruns its forward in the forward's dtypes. Each result is compared
// with the same computation written out with explicit casts, bit for bit.
#include <gtest/gtest.h>

#include "op_test_util.h"
#include "tessel/autograd/engine.h"
#include "tessel/autograd/function.h"
#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/core/view.h"
#include "tessel/ops/ops.h"

namespace tessel {
namespace {

using testing::rand_tensor;

Tensor leaf(const Shape& shape, uint64_t seed) {
  Tensor t = rand_tensor(shape, DType::f32, seed);
  t.set_requires_grad(true);
  return t;
}

std::vector<float> floats(const Tensor& t) { return view::to_dtype(t, DType::f32).to_vector<float>(); }

TEST(Autocast, ProductsComputeInBf16AndTheirGradientsReachF32InputsInF32) {
  Tensor x = leaf({3, 8}, 1), w = leaf({5, 8}, 2), b = leaf({5}, 3);
  Tensor y;
  {
    AutocastScope on(true);
    y = linear(x, w, b);
  }
  EXPECT_EQ(y.dtype(), DType::bf16);
  backward(sum(y));
  ASSERT_TRUE(x.grad().defined() && w.grad().defined() && b.grad().defined());
  EXPECT_EQ(x.grad().dtype(), DType::f32);
  EXPECT_EQ(w.grad().dtype(), DType::f32);

  // The same written out: inputs rounded to bf16, product and its backward as for bf16 tensors.
  Tensor x2 = leaf({3, 8}, 1), w2 = leaf({5, 8}, 2), b2 = leaf({5}, 3);
  Tensor y2 = linear(cast(x2, DType::bf16), cast(w2, DType::bf16), cast(b2, DType::bf16));
  ASSERT_EQ(y2.dtype(), DType::bf16);
  backward(sum(y2));
  EXPECT_EQ(floats(y), floats(y2));
  EXPECT_EQ(floats(x.grad()), floats(x2.grad()));
  EXPECT_EQ(floats(w.grad()), floats(w2.grad()));
  EXPECT_EQ(floats(b.grad()), floats(b2.grad()));

  // And it is not the f32 product: the rounding is real.
  Tensor y32 = linear(x2.detach(), w2.detach(), b2.detach());
  EXPECT_NE(floats(y), floats(y32));
}

TEST(Autocast, NormsSoftmaxAndSumsComputeInF32) {
  const Tensor h = cast(rand_tensor({4, 16}, DType::f32, 7), DType::bf16);
  AutocastScope on(true);
  for (const Tensor& out : {layer_norm(h), softmax(h), log_softmax(h), sum(h), mean(h)}) {
    EXPECT_EQ(out.dtype(), DType::f32);
  }
  AutocastScope off(false);
  EXPECT_EQ(floats(layer_norm(h)), floats(cast(layer_norm(cast(h, DType::f32)), DType::bf16)))
      << "outside autocast a bf16 norm rounds back to bf16";
  AutocastScope on_again(true);
  EXPECT_EQ(floats(layer_norm(h)), floats(layer_norm(cast(h, DType::f32))));
  const Tensor targets = Tensor::from_vector<int64_t>({1, 0, 15, 3}, {4});
  EXPECT_EQ(cross_entropy(h, targets).dtype(), DType::f32);
}

TEST(Autocast, OtherOpsComputeInTheWidestInputDtype) {
  const Tensor a = cast(rand_tensor({6}, DType::f32, 11), DType::bf16);
  const Tensor b = rand_tensor({6}, DType::f32, 12);
  EXPECT_THROW(add(a, b), Error) << "without autocast a bf16 + f32 mix is refused";
  AutocastScope on(true);
  const Tensor s = add(a, b);
  EXPECT_EQ(s.dtype(), DType::f32);
  EXPECT_EQ(floats(s), floats(add(cast(a, DType::f32), b)));
  EXPECT_EQ(gelu(a).dtype(), DType::bf16) << "one bf16 input: computed via f32, rounded back";
  EXPECT_EQ(gelu(b).dtype(), DType::f32);
}

TEST(Autocast, BackwardRunsWithAutocastOff) {
  Tensor x = leaf({4}, 21);
  bool seen_on = true;
  Tensor y;
  {
    AutocastScope on(true);
    y = x.detach();
    record_function("probe", {x}, {y}, [&seen_on](std::vector<Tensor>&& g) {
      seen_on = autocast_enabled();
      return std::vector<Tensor>{g[0]};
    });
    backward(sum(y));  // backward called inside the scope still runs with it off
  }
  EXPECT_FALSE(seen_on);
  EXPECT_TRUE(x.grad().defined());
}

TEST(Autocast, RecomputeRerunsInTheForwardsDtypes) {
  auto block = [](const Tensor& w) {
    return [w](const Tensor& h) { return gelu(linear(h, w)); };
  };
  Tensor x = leaf({3, 8}, 31), w = leaf({8, 8}, 32);
  Tensor x2 = leaf({3, 8}, 31), w2 = leaf({8, 8}, 32);
  Tensor kept, rerun;
  {
    AutocastScope on(true);
    kept = block(w)(x);
    rerun = recompute(block(w2), x2);
  }
  ASSERT_EQ(kept.dtype(), DType::bf16);
  ASSERT_EQ(rerun.dtype(), DType::bf16);
  EXPECT_EQ(floats(kept), floats(rerun));
  backward(sum(kept));
  backward(sum(rerun));
  EXPECT_EQ(floats(x.grad()), floats(x2.grad()));
  EXPECT_EQ(floats(w.grad()), floats(w2.grad()));
}

}  // namespace
}  // namespace tessel
