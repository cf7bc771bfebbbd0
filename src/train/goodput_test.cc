#include "train/goodput.h"

#include <gtest/gtest.h>

namespace multislice::train {
namespace {

nlohmann::json Step(int64_t step, int attempt, double end, double seconds) {
  return {{"step", step},
          {"attempt", attempt},
          {"time", end},
          {"step_time_s", seconds},
          {"loss", 1.0}};
}

// Attempt 1 trains steps 1-10 (one second each, ending at 101..110) and its
// host fails; the queued resource is seen out of ACTIVE at 112 and ACTIVE
// again at 115; attempt 2 resumes from the step-5 checkpoint and trains
// steps 6-12, its first step starting at 117. The job runs from 99 to 125.
TEST(GoodputTest, AccountsEverySecondOfOneFailure) {
  std::vector<nlohmann::json> records;
  for (int s = 1; s <= 10; ++s) records.push_back(Step(s, 1, 100 + s, 1));
  for (int s = 6; s <= 12; ++s) records.push_back(Step(s, 2, 112 + s, 1));
  records.push_back({{"note", "not a step"}});
  const std::vector<StateObservation> states = {
      {99.5, "ACTIVE", 1},      {111, "ACTIVE", 1}, {112, "PROVISIONING", 1},
      {113, "PROVISIONING", 2}, {115, "ACTIVE", 2}, {120, "ACTIVE", 2}};
  Result<Goodput> g = ComputeGoodput(99, 125, records, states);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_DOUBLE_EQ(g->wall_seconds, 26);
  EXPECT_EQ(g->steps, 12);
  EXPECT_DOUBLE_EQ(g->training_seconds, 12);
  EXPECT_EQ(g->recomputed_steps, 5);
  EXPECT_DOUBLE_EQ(g->recomputed_seconds, 5);
  EXPECT_EQ(g->failures, 1);
  EXPECT_DOUBLE_EQ(g->detection_seconds, 2);
  EXPECT_DOUBLE_EQ(g->repair_seconds, 3);
  EXPECT_DOUBLE_EQ(g->restart_seconds, 2);
  EXPECT_DOUBLE_EQ(g->other_seconds, 2);
  EXPECT_DOUBLE_EQ(g->goodput, 12.0 / 26.0);
  EXPECT_DOUBLE_EQ(g->ToJson()["goodput_percent"].get<double>(),
                   100 * 12.0 / 26.0);
}

TEST(GoodputTest, NoFailureIsAllTrainingAndOther) {
  std::vector<nlohmann::json> records;
  for (int s = 1; s <= 4; ++s) records.push_back(Step(s, 0, 10 + 2 * s, 2));
  // A record from before the job started (an older run) is not counted.
  records.push_back(Step(1, 0, 5, 2));
  Result<Goodput> g = ComputeGoodput(10, 20, records, {});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->failures, 0);
  EXPECT_EQ(g->recomputed_steps, 0);
  EXPECT_DOUBLE_EQ(g->training_seconds, 8);
  EXPECT_DOUBLE_EQ(g->other_seconds, 2);
  EXPECT_DOUBLE_EQ(g->goodput, 0.8);
}

TEST(GoodputTest, UnobservedRepairCountsTheWholeGap) {
  std::vector<nlohmann::json> records = {Step(1, 1, 11, 1), Step(2, 2, 21, 1)};
  Result<Goodput> g = ComputeGoodput(10, 22, records, {});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->failures, 1);
  EXPECT_DOUBLE_EQ(g->repair_seconds, 9);  // from 11 to the start at 20
  EXPECT_DOUBLE_EQ(g->detection_seconds, 0);
}

TEST(GoodputTest, EndBeforeStartIsRejected) {
  EXPECT_EQ(ComputeGoodput(5, 5, {}, {}).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace multislice::train

namespace multislice::train {
namespace {

// Issue 13: a trainer started again by hand in the same attempt (Ctrl-C,
// then the same command) resumes from step 5 with resume 1. Its steps count,
// the first start's steps 6-8 are recomputed, and the gap is one failure.
TEST(GoodputTest, ResumeWithinOneAttemptSupersedesTheEarlierRecords) {
  std::vector<nlohmann::json> records;
  for (int s = 1; s <= 8; ++s) {
    nlohmann::json r = Step(s, 0, 100 + s, 1);
    r["resume"] = 0;
    records.push_back(r);
  }
  for (int s = 6; s <= 10; ++s) {
    nlohmann::json r = Step(s, 0, 110 + s, 1);
    r["resume"] = 1;
    records.push_back(r);
  }
  Result<Goodput> g = ComputeGoodput(100, 121, records, {});
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ(g->steps, 10);
  EXPECT_DOUBLE_EQ(g->training_seconds, 10);
  EXPECT_EQ(g->recomputed_steps, 3);
  EXPECT_EQ(g->failures, 1);
  // From the end of the first start's step 8 (108) to the start of the
  // second's first step (115): no state observations, all of it repair.
  EXPECT_DOUBLE_EQ(g->repair_seconds, 7);
}

}  // namespace
}  // namespace multislice::train
