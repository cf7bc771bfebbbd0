#include "model/schedule.h"

#include <gtest/gtest.h>

#include <cmath>

namespace multislice::model {
namespace {

TEST(ScheduleTest, ClipScale) {
  EXPECT_EQ(ClipScale(10.0, 0.0f), 1.0f);
  EXPECT_EQ(ClipScale(10.0, -1.0f), 1.0f);
  EXPECT_EQ(ClipScale(0.5, 1.0f), 1.0f);
  EXPECT_EQ(ClipScale(1.0, 1.0f), 1.0f);
  EXPECT_FLOAT_EQ(ClipScale(4.0, 1.0f), 0.25f);
  EXPECT_EQ(ClipScale(0.0, 1.0f), 1.0f);
}

TEST(ScheduleTest, LearningRateKeyPoints) {
  const double peak = 1e-3, fraction = 0.1;
  EXPECT_DOUBLE_EQ(LearningRate(0, 100, 10, peak, fraction), 0.0);
  EXPECT_DOUBLE_EQ(LearningRate(5, 100, 10, peak, fraction), 0.5 * peak);
  EXPECT_DOUBLE_EQ(LearningRate(10, 100, 10, peak, fraction), peak);
  // Half way through the cosine: the mean of peak and final.
  EXPECT_NEAR(LearningRate(55, 100, 10, peak, fraction), 0.55 * peak, 1e-12);
  EXPECT_NEAR(LearningRate(100, 100, 10, peak, fraction), 0.1 * peak, 1e-12);
  EXPECT_NEAR(LearningRate(150, 100, 10, peak, fraction), 0.1 * peak, 1e-12);
  // Monotone decreasing after warm-up.
  for (int s = 10; s < 100; ++s) {
    EXPECT_GE(LearningRate(s, 100, 10, peak, fraction),
              LearningRate(s + 1, 100, 10, peak, fraction));
  }
}

TEST(ScheduleTest, LearningRateDegenerateSchedules) {
  const double peak = 2e-3;
  // No warm-up: starts at peak.
  EXPECT_DOUBLE_EQ(LearningRate(0, 10, 0, peak, 0.0), peak);
  EXPECT_NEAR(LearningRate(10, 10, 0, peak, 0.0), 0.0, 1e-15);
  EXPECT_DOUBLE_EQ(LearningRate(0, 10, -3, peak, 0.0), peak);
  // Warm-up as long as the run: warm-up only, then peak.
  EXPECT_DOUBLE_EQ(LearningRate(5, 10, 10, peak, 0.1), 0.5 * peak);
  EXPECT_DOUBLE_EQ(LearningRate(10, 10, 10, peak, 0.1), peak);
  // Warm-up longer than the run.
  EXPECT_DOUBLE_EQ(LearningRate(10, 10, 20, peak, 0.1), 0.5 * peak);
  // Zero-length run.
  EXPECT_DOUBLE_EQ(LearningRate(0, 0, 0, peak, 0.1), peak);
  EXPECT_DOUBLE_EQ(LearningRate(-1, 10, 5, peak, 0.1), 0.0);
  for (int s = 0; s <= 12; ++s) {
    EXPECT_FALSE(std::isnan(LearningRate(s, 0, 0, peak, 0.1)));
    EXPECT_FALSE(std::isnan(LearningRate(s, 1, 1, peak, 0.1)));
  }
}

}  // namespace
}  // namespace multislice::model
