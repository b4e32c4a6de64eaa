// Philox: known-answer vectors of the reference implementation, distribution sanity, and the
// slice property that makes sharded initialisation equal the serial one.
#include <gtest/gtest.h>

#include <cmath>

#include "tessel/core/philox.h"
#include "tessel/core/view.h"

namespace tessel {
namespace {

// Known-answer vectors of Philox4x32-10 (Random123's kat_vectors).
TEST(Philox, KnownAnswers) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}), (PhiloxBlock{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}),
            (PhiloxBlock{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
            (PhiloxBlock{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, StreamsAndSeedsDiffer) {
  EXPECT_NE(philox_at(1, stream_key("a"), 0), philox_at(1, stream_key("b"), 0));
  EXPECT_NE(philox_at(1, stream_key("a"), 0), philox_at(2, stream_key("a"), 0));
  EXPECT_NE(stream_combine(stream_key("a"), 1), stream_combine(stream_key("a"), 2));
  EXPECT_EQ(stream_key("transformer.h.0.attn.c_attn.weight"), stream_key("transformer.h.0.attn.c_attn.weight"));
}

TEST(Philox, UniformAndNormalMoments) {
  const int n = 200000;
  double su = 0, sn = 0, sn2 = 0;
  for (int i = 0; i < n; ++i) {
    double u = uniform_f64_at(7, 9, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    su += u;
    double z = normal_at(7, 9, i);
    sn += z;
    sn2 += z * z;
  }
  EXPECT_NEAR(su / n, 0.5, 0.005);
  EXPECT_NEAR(sn / n, 0.0, 0.01);
  EXPECT_NEAR(sn2 / n, 1.0, 0.01);
}

struct SliceCase {
  Shape global;
  Shape offset;
  Shape local;
};

class PhiloxSlice : public ::testing::TestWithParam<SliceCase> {};

// Filling a block of the global tensor alone gives exactly that block of the full fill.
TEST_P(PhiloxSlice, FillOfSliceEqualsSliceOfFill) {
  const SliceCase& c = GetParam();
  for (DType dtype : {DType::f32, DType::f64, DType::bf16})
    for (Distribution dist : {Distribution::uniform, Distribution::normal}) {
      Tensor full = Tensor::empty(c.global, dtype);
      rng_fill(full, dist, 0.0, 1.0, 1234, stream_key("w"));
      Tensor part = Tensor::empty(c.local, dtype);
      rng_fill(part, dist, 0.0, 1.0, 1234, stream_key("w"), GlobalBox{c.global, c.offset});
      Tensor expect = full;
      for (size_t d = 0; d < c.global.size(); ++d)
        expect = view::slice(expect, static_cast<int64_t>(d), c.offset[d], c.offset[d] + c.local[d]);
      ASSERT_EQ(part.to_doubles(), expect.to_doubles()) << "dtype " << dtype_name(dtype) << " shape "
                                                        << shape_str(c.global) << " offset " << shape_str(c.offset);
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PhiloxSlice,
                         ::testing::Values(SliceCase{{10}, {3}, {4}}, SliceCase{{10}, {0}, {10}},
                                           SliceCase{{7, 5}, {2, 0}, {3, 5}}, SliceCase{{7, 5}, {0, 3}, {7, 2}},
                                           SliceCase{{7, 5}, {4, 1}, {3, 3}}, SliceCase{{4, 6, 3}, {1, 2, 1}, {2, 3, 2}},
                                           SliceCase{{3, 1, 9}, {1, 0, 8}, {2, 1, 1}},
                                           SliceCase{{5, 5}, {5, 0}, {0, 5}}));

TEST(Philox, RejectsABlockOutsideTheGlobalShape) {
  Tensor part = Tensor::empty({3, 3});
  EXPECT_THROW(rng_fill(part, Distribution::uniform, 0, 1, 1, 1, GlobalBox{{4, 4}, {2, 0}}), Error);
  Tensor ints = Tensor::empty({3}, DType::i64);
  EXPECT_THROW(rng_fill(ints, Distribution::uniform, 0, 1, 1, 1), Error);
}

// The vector-lane batch gives philox_at's words, for runs that start anywhere (a carry into the
// counter's high word included) and are not multiples of the 16 lanes.
TEST(Philox, BlocksInLanesEqualOneAtATime) {
  const uint64_t seed = 0x0123456789abcdefull, stream = 0xfeedface12345678ull;
  for (const auto& [first, n] : std::vector<std::pair<uint64_t, int64_t>>{
           {0, 1}, {5, 16}, {1000, 17}, {(uint64_t{1} << 32) - 7, 40}, {~uint64_t{0} - 20, 21}}) {
    std::vector<uint32_t> words(static_cast<size_t>(4 * n));
    philox_blocks(seed, stream, first, n, words.data());
    for (int64_t i = 0; i < n; ++i) {
      const PhiloxBlock want = philox_at(seed, stream, first + static_cast<uint64_t>(i));
      for (size_t w = 0; w < 4; ++w)
        EXPECT_EQ(words[static_cast<size_t>(4 * i) + w], want[w]) << "index " << first + static_cast<uint64_t>(i);
    }
  }
}

}  // namespace
}  // namespace tessel
