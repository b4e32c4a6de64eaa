// The efficiency curve `tessel cluster detect` fits through two measured linears: it passes
// through both measurements, also where the large one outran the sgemm rate the shares are
// taken against (the rate is then raised instead of the curve being cut below them).
#include <gtest/gtest.h>

#include "tessel/cli/cluster_detect.h"

namespace tessel {
namespace {

double on_curve(const EfficiencyCurve& c, double d) { return c.lift * c.efficiency * d / (d + c.half_dim); }

TEST(ClusterDetect, EfficiencyCurvePassesThroughBothMeasuredSizes) {
  // Shares of the sgemm 1024^3 rate at d = 1229 and 361 (the linears' harmonic sizes), as
  // measured on a 2-core Emerald Rapids host: four ranks of one thread, one rank of two, and a
  // host whose large linear stays below the sgemm rate.
  struct Measured {
    double large, small;
  };
  for (Measured m : {Measured{1.026, 0.867}, Measured{1.020, 0.729}, Measured{0.85, 0.60}}) {
    SCOPED_TRACE(testing::Message() << "shares " << m.large << ", " << m.small);
    const EfficiencyCurve c = fit_efficiency_curve(m.large, m.small, 1229, 361);
    EXPECT_NEAR(on_curve(c, 1229), m.large, 1e-9);
    EXPECT_NEAR(on_curve(c, 361), m.small, 1e-9);
    EXPECT_LE(c.efficiency, 1.0);
    EXPECT_GE(c.lift, 1.0);
    EXPECT_EQ(c.lift > 1, m.large * (1229 + c.half_dim) / 1229 > 1);
  }
}

TEST(ClusterDetect, EfficiencyCurveWithoutASlowdownAtTheSmallSizeIsFlat) {
  // The small linear as fast as the large one: half-dim at its floor, E the large share.
  const EfficiencyCurve c = fit_efficiency_curve(0.8, 0.8, 1229, 361);
  EXPECT_EQ(c.half_dim, 1.0);
  EXPECT_EQ(c.lift, 1.0);
  EXPECT_NEAR(c.efficiency, 0.8 * 1230 / 1229, 1e-12);
}

}  // namespace
}  // namespace tessel
