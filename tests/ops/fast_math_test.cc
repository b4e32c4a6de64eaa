// fast::exp16 (the 16-lane e^x of attention's score tiles) against libm in double precision:
// relative error below 2e-7 over the whole f32 range it does not flush, the same values as the
// scalar fast::exp to within rounding, and the edges attention relies on — e^0 exactly 1 (a
// rescale by a max that did not move is skipped), -inf and anything below the range exactly 0
// (masked scores), +inf above it, and NaN kept. fast::exp2_16 (2^x, for attention's scores
// in base 2) the same against exp2 in double, with the same edges, and exp2_16_finite (no
// clamps) equal to it wherever x is finite.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tessel/ops/fast_math.h"

namespace tessel {
namespace {

#if defined(__AVX512F__)
std::vector<float> exp16_of(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); i += 16) _mm512_storeu_ps(y.data() + i, fast::exp16(_mm512_loadu_ps(x.data() + i)));
  return y;
}

TEST(FastMath, Exp16MatchesLibmAcrossTheRange) {
  std::vector<float> x;
  for (double v = -87.0; v < 88.7; v += 0.00731) x.push_back(static_cast<float>(v));
  while (x.size() % 16 != 0) x.push_back(0.5f);
  const std::vector<float> y = exp16_of(x);
  double worst = 0, worst_scalar = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(static_cast<double>(x[i]));
    worst = std::max(worst, std::fabs(y[i] - want) / want);
    const double scalar = fast::exp(x[i]);  // flushes to 0 below -86.5, exp16 does not
    if (scalar > 0) worst_scalar = std::max(worst_scalar, std::fabs(y[i] - scalar) / scalar);
  }
  EXPECT_LT(worst, 2e-7) << "relative error against exp in double";
  EXPECT_LT(worst_scalar, 4e-7) << "relative difference from the scalar fast::exp";
}

// The edges both exponentials share, for inputs laid out as the edge tests lay them out: 0, -0,
// -inf, two underflows, two overflows, +inf, NaN.
void expect_shared_edges(const std::vector<float>& y) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 1.0f);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_EQ(y[3], 0.0f);
  EXPECT_EQ(y[4], 0.0f);
  EXPECT_EQ(y[5], inf);
  EXPECT_EQ(y[6], inf);
  EXPECT_EQ(y[7], inf);
  EXPECT_TRUE(std::isnan(y[8]));
}

TEST(FastMath, Exp16EdgesAreExact) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x{0.0f, -0.0f, -inf, -200.0f, -110.0f, 89.0f, 1000.0f, inf, nan, 1.0f, -1.0f, -inf, 0.0f, 0.0f,
                       0.0f, 0.0f};
  const std::vector<float> y = exp16_of(x);
  expect_shared_edges(y);
  EXPECT_NEAR(y[9], std::exp(1.0), 2e-7 * std::exp(1.0));
  EXPECT_NEAR(y[10], std::exp(-1.0), 2e-7 * std::exp(-1.0));
  EXPECT_EQ(y[11], 0.0f);
}
std::vector<float> exp2_16_of(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); i += 16)
    _mm512_storeu_ps(y.data() + i, fast::exp2_16(_mm512_loadu_ps(x.data() + i)));
  return y;
}

TEST(FastMath, Exp2x16MatchesLibmAcrossTheRange) {
  std::vector<float> x;
  for (double v = -126.0; v < 127.9; v += 0.00913) x.push_back(static_cast<float>(v));
  while (x.size() % 16 != 0) x.push_back(0.5f);
  const std::vector<float> y = exp2_16_of(x);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp2(static_cast<double>(x[i]));
    worst = std::max(worst, std::fabs(y[i] - want) / want);
  }
  EXPECT_LT(worst, 2e-7) << "relative error against exp2 in double";
}

TEST(FastMath, Exp2x16EdgesAreExact) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x{0.0f, -0.0f, -inf, -200.0f, -160.0f, 129.0f, 1000.0f, inf, nan, 1.0f, -1.0f, 10.0f, -149.0f,
                       0.5f, 0.0f, 0.0f};
  const std::vector<float> y = exp2_16_of(x);
  expect_shared_edges(y);
  EXPECT_EQ(y[9], 2.0f);
  EXPECT_EQ(y[10], 0.5f);
  EXPECT_EQ(y[11], 1024.0f);
  EXPECT_EQ(y[12], std::exp2(-149.0f));  // the smallest subnormal
  EXPECT_NEAR(y[13], std::sqrt(2.0), 2e-7 * std::sqrt(2.0));
}

// exp2_16_finite, exp2_16 without the clamps: the same values for every finite x, far below
// and above the range included (vscalefps takes any exponent).
TEST(FastMath, Exp2x16FiniteMatchesExp2x16) {
  std::vector<float> x;
  for (double v = -3000.0; v < 3000.0; v += 0.37) x.push_back(static_cast<float>(v));
  while (x.size() % 16 != 0) x.push_back(-0.25f);
  const std::vector<float> want = exp2_16_of(x);
  for (size_t i = 0; i < x.size(); i += 16) {
    float got[16];
    _mm512_storeu_ps(got, fast::exp2_16_finite(_mm512_loadu_ps(x.data() + i)));
    for (size_t e = 0; e < 16; ++e) ASSERT_EQ(got[e], want[i + e]) << "x = " << x[i + e];
  }
}
#else
TEST(FastMath, Exp16MatchesLibmAcrossTheRange) { GTEST_SKIP() << "fast::exp16 needs AVX-512"; }
#endif

}  // namespace
}  // namespace tessel
