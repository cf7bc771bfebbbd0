#include "train/hang_threshold.h"

#include <gtest/gtest.h>

namespace multislice::train {
namespace {

using std::chrono::milliseconds;

TEST(HangThresholdTest, AFixedThresholdIsKept) {
  HangThreshold t(4.5, milliseconds(60000));
  EXPECT_EQ(t.After(0.1), milliseconds(4500));
  EXPECT_EQ(t.After(100), milliseconds(4500));
}

TEST(HangThresholdTest, TheAutomaticOneIsFiveMediansAtLeastThirtySeconds) {
  HangThreshold t(0, milliseconds(3600 * 1000));
  EXPECT_EQ(t.After(1), milliseconds(30000));  // 5 s is below the floor
  // Steps of 10 s: the median moves to 10 once they are the majority.
  EXPECT_EQ(t.After(10), milliseconds(50000));  // median of {1, 10}: 10
  EXPECT_EQ(t.After(1), milliseconds(30000));   // median of {1, 10, 1}: 1
  for (int i = 0; i < 3; ++i) t.After(20);
  // {1, 1, 10, 20, 20, 20, 20}: the median is 20.
  EXPECT_EQ(t.After(20), milliseconds(100000));
}

TEST(HangThresholdTest, ItForgetsOldSteps) {
  HangThreshold t(0, milliseconds(3600 * 1000));
  for (int i = 0; i < HangThreshold::kStepsKept; ++i) t.After(100);
  milliseconds last{};
  for (int i = 0; i < HangThreshold::kStepsKept; ++i) last = t.After(8);
  EXPECT_EQ(last, milliseconds(40000));
}

TEST(HangThresholdTest, ItStaysBelowTheDcnTimeout) {
  HangThreshold fixed(100, milliseconds(60000));
  EXPECT_EQ(fixed.After(1), milliseconds(48000));
  HangThreshold automatic(0, milliseconds(10000));
  EXPECT_EQ(automatic.After(1), milliseconds(8000));
}

}  // namespace
}  // namespace multislice::train
