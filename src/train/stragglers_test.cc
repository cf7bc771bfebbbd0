#include "train/stragglers.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace multislice::train {
namespace {

// Two workers of two devices each; devices 0 and 2 in stage 0, 1 and 3 in
// stage 1.
DeviceLayout TwoByTwo() {
  return {{0, 0, 1, 1}, {0, 1, 0, 1}, {"w0", "w1"}, {"h0", "h1"}};
}

TEST(StragglerDetectorTest, EvenWorkersAreNotStragglers) {
  StragglerDetector detector(TwoByTwo(), 0.7, 0.7);
  const auto scores = detector.Score({0.10f, 0.20f, 0.11f, 0.21f});
  ASSERT_EQ(scores.size(), 2u);
  for (const StragglerScore& s : scores) EXPECT_FALSE(s.straggler) << s.worker;
  // Stage 1 does more work than stage 0: each worker's devices are
  // compared within their stage, and it takes its lowest stage's score.
  EXPECT_NEAR(scores[1].relative, std::min(0.10 / 0.11, 0.20 / 0.21), 1e-6);
  EXPECT_NEAR(scores[1].seconds, 0.21, 1e-6);
}

TEST(StragglerDetectorTest, ASlowWorkerIsScoredAgainstTheFastest) {
  StragglerDetector detector(TwoByTwo(), 0.7, 0.7);
  const auto scores = detector.Score({0.10f, 0.20f, 0.10f, 0.40f});
  ASSERT_EQ(scores.size(), 2u);
  EXPECT_FALSE(scores[0].straggler);
  EXPECT_TRUE(scores[1].straggler);
  EXPECT_NEAR(scores[1].relative, 0.5, 1e-6);
  EXPECT_NEAR(scores[1].individual, 1.0, 1e-6);  // its first round
  EXPECT_EQ(scores[1].host, "h1");
}

TEST(StragglerDetectorTest, AWorkerThatSlowsDownAgainstItsOwnBest) {
  // Every worker slows down alike: none is slower than the others, but
  // each is below its own best.
  StragglerDetector detector(TwoByTwo(), 0.7, 0.7);
  detector.Score({0.1f, 0.2f, 0.1f, 0.2f});
  const auto scores = detector.Score({0.3f, 0.6f, 0.3f, 0.6f});
  for (const StragglerScore& s : scores) {
    EXPECT_NEAR(s.relative, 1.0, 1e-6);
    EXPECT_NEAR(s.individual, 1.0 / 3, 1e-6);
    EXPECT_TRUE(s.straggler);
  }
  // Back to speed: the best is kept.
  for (const StragglerScore& s : detector.Score({0.1f, 0.2f, 0.1f, 0.2f})) {
    EXPECT_NEAR(s.individual, 1.0, 1e-6);
    EXPECT_FALSE(s.straggler);
  }
}

TEST(StragglerDetectorTest, AWorkersDevicesAreAveraged) {
  // Worker 1's devices of stage 0: 0.10 and 0.14, mean 0.12.
  DeviceLayout layout = {{0, 1, 1}, {0, 0, 0}, {"w0", "w1"}, {"h0", "h1"}};
  StragglerDetector detector(layout, 0.95, 0.7);
  const auto scores = detector.Score({0.11f, 0.10f, 0.14f});
  ASSERT_EQ(scores.size(), 2u);
  EXPECT_NEAR(scores[1].seconds, 0.12, 1e-6);
  EXPECT_NEAR(scores[1].relative, 0.11 / 0.12, 1e-6);
  EXPECT_TRUE(scores[1].straggler);  // below 0.95
  EXPECT_NEAR(scores[0].relative, 1.0, 1e-6);
}

TEST(StragglerDetectorTest, DevicesWithoutATimeAreLeftOut) {
  StragglerDetector detector(TwoByTwo(), 0.7, 0.7);
  const auto scores = detector.Score({0.1f, 0.2f, 0.0f, 0.0f});
  ASSERT_EQ(scores.size(), 1u);
  EXPECT_EQ(scores[0].process, 0);
}

}  // namespace
}  // namespace multislice::train
