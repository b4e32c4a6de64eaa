// Dropout's layout invariance, directly: dropping out blocks of a tensor, each placed by its
// GlobalBox, gives exactly (bitwise) those slices of dropping out the whole tensor, forward
// and backward, with any thread count; and the stream and seed change the mask.
#include <gtest/gtest.h>

#include "op_test_util.h"
#include "tessel/autograd/engine.h"
#include "tessel/core/context.h"
#include "tessel/core/view.h"
#include "tessel/ops/ops.h"

namespace tessel {
namespace {

using testing::rand_tensor;

constexpr uint64_t kSeed = 42;
constexpr uint64_t kStream = 0xd00d5eedcafef00dull;
constexpr double kP = 0.3;

// Rows [r0, r1) x cols [c0, c1) of a 2-D tensor, as a contiguous copy.
Tensor block(const Tensor& t, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  return view::clone(view::slice(view::slice(t, 0, r0, r1), 1, c0, c1));
}

struct Block {
  int64_t r0, r1, c0, c1;
};
// An interior block, whole rows, one column and a single element.
const Block kBlocks[] = {{2, 6, 1, 5}, {3, 5, 0, 6}, {0, 8, 4, 5}, {7, 8, 5, 6}};

TEST(Dropout, BlocksEqualSlicesOfTheWholeTensor) {
  Tensor x = rand_tensor({8, 6}, DType::f32, 7);
  Tensor whole = dropout(x, kP, kSeed, kStream);
  for (const Block& b : kBlocks) {
    Tensor local = block(x, b.r0, b.r1, b.c0, b.c1);
    GlobalBox box{{8, 6}, {b.r0, b.c0}};
    Tensor part = dropout(local, kP, kSeed, kStream, box);
    EXPECT_EQ(part.to_vector<float>(), block(whole, b.r0, b.r1, b.c0, b.c1).to_vector<float>())
        << "block rows " << b.r0 << ".." << b.r1 << " cols " << b.c0 << ".." << b.c1;
  }
}

TEST(Dropout, DropsAboutPAndScalesTheRest) {
  Tensor x = Tensor::ones({4000}, DType::f64);
  std::vector<double> y = dropout(x, kP, kSeed, kStream).to_doubles();
  int64_t dropped = 0;
  for (double v : y) {
    if (v == 0.0) ++dropped;
    else EXPECT_DOUBLE_EQ(v, 1.0 / (1.0 - kP));
  }
  EXPECT_NEAR(static_cast<double>(dropped) / 4000.0, kP, 0.03);
}

TEST(Dropout, StreamsAndSeedsGiveDifferentMasks) {
  Tensor x = Tensor::ones({8, 6}, DType::f32);
  std::vector<float> base = dropout(x, kP, kSeed, kStream).to_vector<float>();
  EXPECT_EQ(dropout(x, kP, kSeed, kStream).to_vector<float>(), base) << "same counters must repeat";
  EXPECT_NE(dropout(x, kP, kSeed, kStream + 1).to_vector<float>(), base) << "stream ignored";
  EXPECT_NE(dropout(x, kP, kSeed, stream_combine(kStream, 1)).to_vector<float>(), base) << "stream ignored";
  EXPECT_NE(dropout(x, kP, kSeed + 1, kStream).to_vector<float>(), base) << "seed ignored";
}

TEST(Dropout, BlockGradientsEqualSlicesOfTheWholeGradient) {
  Tensor x = rand_tensor({8, 6}, DType::f64, 8);
  Tensor w = rand_tensor({8, 6}, DType::f64, 9);
  Tensor xs = view::clone(x);
  xs.set_requires_grad(true);
  Tensor whole_grad = grad({sum(mul(dropout(xs, kP, kSeed, kStream), w))}, {xs})[0];
  for (const Block& b : kBlocks) {
    Tensor local = block(x, b.r0, b.r1, b.c0, b.c1);
    local.set_requires_grad(true);
    GlobalBox box{{8, 6}, {b.r0, b.c0}};
    Tensor loss = sum(mul(dropout(local, kP, kSeed, kStream, box), block(w, b.r0, b.r1, b.c0, b.c1)));
    Tensor g = grad({loss}, {local})[0];
    EXPECT_EQ(g.to_doubles(), block(whole_grad, b.r0, b.r1, b.c0, b.c1).to_doubles())
        << "block rows " << b.r0 << ".." << b.r1 << " cols " << b.c0 << ".." << b.c1;
  }
}

TEST(Dropout, ThreadCountDoesNotChangeTheMask) {
  Tensor x = rand_tensor({64, 300}, DType::f32, 10);  // several row chunks of for_each_global_row
  auto run_with = [&](int threads) {
    auto ctx = make_rank_context(0, 1, threads);
    RankContextScope scope(ctx);
    return dropout(x, kP, kSeed, kStream).to_vector<float>();
  };
  EXPECT_EQ(run_with(1), run_with(3));
}

}  // namespace
}  // namespace tessel

namespace tessel {
namespace {

// A [B, T, C] tensor whose sequence is held in ring attention's load-balanced order over n
// ranks (rank r: chunks r and 2n-1-r of 2n) drops what the natural-order tensor drops, each
// element at its natural position — also one rank's piece placed by its box.
TEST(Dropout, RingOrderDrawsTheNaturalOrdersMask) {
  const int64_t B = 2, T = 16, C = 3;
  Tensor x = rand_tensor({B, T, C}, DType::f32, 9);
  const Tensor want = dropout(x, kP, kSeed, kStream);
  for (int64_t n : {2, 4}) {
    SCOPED_TRACE(fmt::format("{} ranks", n));
    const int64_t c = T / (2 * n);
    std::vector<int64_t> order;  // position i of the ring's order holds natural position order[i]
    for (int64_t r = 0; r < n; ++r)
      for (int64_t chunk : {r, 2 * n - 1 - r})
        for (int64_t i = 0; i < c; ++i) order.push_back(chunk * c + i);
    auto ring = [&](const Tensor& t) {
      Tensor out = Tensor::empty(t.shape(), t.dtype());
      for (int64_t i = 0; i < T; ++i)
        view::copy(view::select(out, 1, i), view::select(t, 1, order[static_cast<size_t>(i)]));
      return out;
    };
    const Tensor got = dropout(ring(x), kP, kSeed, kStream, {}, SequenceOrder{1, n});
    EXPECT_EQ(got.to_vector<float>(), ring(want).to_vector<float>());
    // Rank 1's piece: rows 2c .. 4c of the ring's order, placed by its box.
    const Tensor piece = view::clone(view::slice(ring(x), 1, 2 * c, 4 * c));
    const Tensor part = dropout(piece, kP, kSeed, kStream, GlobalBox{{B, T, C}, {0, 2 * c, 0}}, SequenceOrder{1, n});
    EXPECT_EQ(part.to_vector<float>(), view::clone(view::slice(ring(want), 1, 2 * c, 4 * c)).to_vector<float>());
    // Without the order the mask is the reordered tensor's own, not the natural one's.
    EXPECT_NE(dropout(ring(x), kP, kSeed, kStream).to_vector<float>(), ring(want).to_vector<float>());
  }
}

}  // namespace
}  // namespace tessel
