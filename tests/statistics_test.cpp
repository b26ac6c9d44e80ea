// remat/internal/statistics.h: the median and its spread, as the profiler reads its runs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/internal/statistics.h"

TEST(Statistics, FewRunsThatHappenToLandCloseDoNotPinAScatteredStage) {
  // Two of three runs close together: the MAD alone (0.5 here) would call this within 5%.
  const double three = remat::median_spread({10.0, 10.5, 30.0});
  EXPECT_GT(three, 0.25 * 10.5) << three;
  EXPECT_GE(three, remat::median_spread({10.0, 30.0, 10.5, 10.4, 10.6, 10.5, 10.45}));
  // From six runs on, one slow run does not widen the interval (the shared machine's one outlier).
  const double six = remat::median_spread({10.0, 10.1, 9.9, 10.0, 10.05, 100.0});
  EXPECT_LT(six, 0.05 * 10.0) << six;
  EXPECT_EQ(remat::median_spread({7.0}), 0.0);
  EXPECT_GT(remat::median_spread({7.0, 8.0}), 0.0);
}
