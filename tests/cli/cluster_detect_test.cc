// The efficiency curve `tessel cluster detect` fits through two measured linears: it passes
// through both measurements, also where the large one outran the sgemm rate the shares are
// taken against (the rate is then raised instead of the curve being cut below them).
#include <gtest/gtest.h>

#include "tessel/cli/cluster_detect.h"

namespace tessel {
namespace {

double on_curve(const EfficiencyCurve& c, double d) { return c.lift * c.efficiency * d / (d + c.half_dim); }

TEST(ClusterDetect, EfficiencyCurvePassesThroughBothMeasuredSizes) {
  // Shares of the sgemm 1024^3 rate at d = 1229 and 361 (the linears' harmonic sizes): as
  // measured on a 2-core Emerald Rapids host with four ranks of one thread and with one rank of
  // two (the large linear outran the rate: the curve's top is above it, 1.11 and 1.22), and a
  // host whose linears stay well below the rate (top 0.85: nothing to raise).
  struct Measured {
    double large, small;
    bool raised;
  };
  for (Measured m : {Measured{1.026, 0.867, true}, Measured{1.020, 0.729, true}, Measured{0.80, 0.70, false}}) {
    SCOPED_TRACE(testing::Message() << "shares " << m.large << ", " << m.small);
    const EfficiencyCurve c = fit_efficiency_curve(m.large, m.small, 1229, 361);
    EXPECT_NEAR(on_curve(c, 1229), m.large, 1e-9);
    EXPECT_NEAR(on_curve(c, 361), m.small, 1e-9);
    EXPECT_LE(c.efficiency, 1.0);
    EXPECT_EQ(c.lift > 1, m.raised);
    if (!m.raised) {
      EXPECT_EQ(c.lift, 1.0);
    }
  }
}

TEST(ClusterDetect, EfficiencyCurveWithoutASlowdownAtTheSmallSizeIsFlat) {
  // The small linear as fast as the large one: the half-dim at its floor of 1, so the curve is
  // flat — through the large measurement and within 0.3% of it at the small size.
  const EfficiencyCurve c = fit_efficiency_curve(0.8, 0.8, 1229, 361);
  EXPECT_EQ(c.half_dim, 1.0);
  EXPECT_EQ(c.lift, 1.0);
  EXPECT_NEAR(on_curve(c, 1229), 0.8, 1e-12);
  EXPECT_NEAR(on_curve(c, 361), 0.8, 0.8 * 0.003);
}

}  // namespace
}  // namespace tessel
