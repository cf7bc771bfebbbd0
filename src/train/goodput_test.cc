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

namespace multislice::train {
namespace {

// A step record with goodput's fields (metrics.h).
nlohmann::json Timed(int64_t step, int attempt, int64_t resume, double end,
                     double seconds, double data_wait, double block = 0) {
  nlohmann::json r = Step(step, attempt, end, seconds);
  r["resume"] = resume;
  r["data_wait_s"] = data_wait;
  r["checkpoint_block_s"] = block;
  return r;
}

void SetStart(nlohmann::json& r, double start, double init, double restore,
              double prep) {
  r["start_time"] = start;
  r["runtime_init_s"] = init;
  r["restore_s"] = restore;
  r["training_prep_s"] = prep;
}

// Start A (attempt 1) begins at 1000: 2 s of runtime start-up, 0.5 s of
// restore lookup, 1.5 s of preparation; steps 1-6 of 1 s each, 0.1 s of it
// waiting for the batch, except step 1 (3 s: 2 s of start-up); the save
// after step 3 blocks 0.5 s. It fails after step 6 (1012.5). The queued
// resource is seen out of ACTIVE at 1014 and ACTIVE again at 1017; start B
// (attempt 2) begins at 1018: 1 s start-up, 1 s restore of step 3, 0.5 s
// preparation, and trains steps 4-8 from 1020.5 (step 4 takes 2 s: 1 s of
// start-up). The job runs from 999 to 1028.
std::vector<nlohmann::json> OneFailureRun() {
  std::vector<nlohmann::json> records;
  records.push_back(Timed(1, 1, 0, 1007, 3, 0.1));
  SetStart(records.back(), 1000, 2, 0.5, 1.5);
  records.push_back(Timed(2, 1, 0, 1008, 1, 0.1));
  records.push_back(Timed(3, 1, 0, 1009, 1, 0.1));
  records.push_back(Timed(4, 1, 0, 1010.5, 1, 0.1, 0.5));
  records.push_back(Timed(5, 1, 0, 1011.5, 1, 0.1));
  records.push_back(Timed(6, 1, 0, 1012.5, 1, 0.1));
  records.push_back(Timed(4, 2, 1, 1022.5, 2, 0.1));
  SetStart(records.back(), 1018, 1, 1, 0.5);
  for (int s = 5; s <= 8; ++s) {
    records.push_back(Timed(s, 2, 1, 1018.5 + s, 1, 0.1));
  }
  return records;
}

const std::vector<StateObservation> kOneFailureStates = {
    {999, "ACTIVE", 1},
    {1014, "PROVISIONING", 1},
    {1017, "ACTIVE", 2},
    {1027, "ACTIVE", 2}};

double Sum(const Goodput& g) {
  double sum = g.productive_seconds;
  for (double b : g.badput) sum += b;
  return sum;
}

constexpr double kEps = 1e-9;

TEST(GoodputTest, EveryBucketOfOneFailureIsKnownByConstruction) {
  Result<Goodput> g =
      ComputeGoodput(999, 1028, OneFailureRun(), kOneFailureStates);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_NEAR(g->wall_seconds, 29, kEps);
  // Each kept step trains 0.9 s beyond its wait and start-up: A's 1-3, B's
  // 4-8; A's 4-6 were trained again.
  EXPECT_NEAR(g->productive_seconds, 8 * 0.9, kEps);
  EXPECT_NEAR(g->seconds(Badput::kWastedProgress), 3 * 0.9, kEps);
  EXPECT_NEAR(g->seconds(Badput::kTpuInitialization), 2 + 1, kEps);
  EXPECT_NEAR(g->seconds(Badput::kCheckpointRestore), 0.5 + 1, kEps);
  EXPECT_NEAR(g->seconds(Badput::kTrainingPrep), 1.5 + 0.5, kEps);
  // First steps beyond their start's median (0.9 s without the wait).
  EXPECT_NEAR(g->seconds(Badput::kProgramStartup), (2.9 - 0.9) + (1.9 - 0.9),
              kEps);
  EXPECT_NEAR(g->seconds(Badput::kDataLoadingSync), 11 * 0.1, kEps);
  EXPECT_NEAR(g->seconds(Badput::kCheckpointSave), 0.5, kEps);
  // From A's last step to B's start: 1.5 s to the state change, 3 s of
  // repair, 1 s until B began.
  EXPECT_NEAR(g->seconds(Badput::kInfrastructureRecovery), 1018 - 1012.5, kEps);
  EXPECT_NEAR(g->recovery.detection_seconds, 1.5, kEps);
  EXPECT_NEAR(g->recovery.repair_seconds, 3, kEps);
  EXPECT_NEAR(g->recovery.restart_seconds, 1, kEps);
  EXPECT_NEAR(g->recovery.unsplit_seconds, 0, kEps);
  // Before A began (1 s) and after B's last step (1.5 s).
  EXPECT_NEAR(g->seconds(Badput::kOther), 1 + 1.5, kEps);
  EXPECT_NEAR(Sum(*g), g->wall_seconds, kEps);
  EXPECT_EQ(g->steps, 8);
  EXPECT_EQ(g->recomputed_steps, 3);
  EXPECT_EQ(g->failures, 1);
  EXPECT_NEAR(g->goodput, 7.2 / 29, kEps);
  // Issue 6's summary: whole step times, restart up to B's first step.
  EXPECT_NEAR(g->training_seconds, (3 + 1 + 1) + (2 + 4), kEps);
  EXPECT_NEAR(g->recomputed_seconds, 3, kEps);
  EXPECT_NEAR(g->restart_seconds, 1020.5 - 1017, kEps);

  const nlohmann::json j = g->ToJson();
  EXPECT_NEAR(j["badput"]["WASTED_PROGRESS_FROM_DISRUPTION"].get<double>(), 2.7,
              kEps);
  EXPECT_NEAR(
      j["badput"]["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"]["repair_seconds"]
          .get<double>(),
      3, kEps);
  EXPECT_NEAR(j["goodput_percent"].get<double>(), 100 * 7.2 / 29, kEps);
}

// A plain `train` run has no queued resource: the gap is not split.
TEST(GoodputTest, WithoutStatesTheRecoveryIsUnsplit) {
  Result<Goodput> g = ComputeGoodput(999, 1028, OneFailureRun(), {});
  ASSERT_TRUE(g.ok());
  EXPECT_NEAR(g->recovery.unsplit_seconds, 5.5, kEps);
  EXPECT_NEAR(g->recovery.detection_seconds + g->recovery.repair_seconds +
                  g->recovery.restart_seconds,
              0, kEps);
  EXPECT_NEAR(g->repair_seconds, 1020.5 - 1012.5, kEps);
  EXPECT_NEAR(Sum(*g), 29, kEps);
}

TEST(GoodputTest, AWindowClipsEveryInterval) {
  // The last 12 s, [1016, 1028]: the end of the repair, all of B.
  Result<Goodput> g =
      ComputeGoodput(999, 1028, OneFailureRun(), kOneFailureStates, 1016);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_NEAR(g->wall_seconds, 12, kEps);
  EXPECT_NEAR(g->recovery.detection_seconds, 0, kEps);
  EXPECT_NEAR(g->recovery.repair_seconds, 1017 - 1016, kEps);
  EXPECT_NEAR(g->recovery.restart_seconds, 1, kEps);
  EXPECT_NEAR(g->seconds(Badput::kTpuInitialization), 1, kEps);
  EXPECT_NEAR(g->seconds(Badput::kCheckpointRestore), 1, kEps);
  EXPECT_NEAR(g->seconds(Badput::kTrainingPrep), 0.5, kEps);
  EXPECT_NEAR(g->seconds(Badput::kProgramStartup), 1, kEps);
  EXPECT_NEAR(g->seconds(Badput::kDataLoadingSync), 0.5, kEps);
  EXPECT_NEAR(g->seconds(Badput::kWastedProgress), 0, kEps);
  EXPECT_NEAR(g->productive_seconds, 5 * 0.9, kEps);
  EXPECT_NEAR(g->seconds(Badput::kOther), 1.5, kEps);
  EXPECT_NEAR(Sum(*g), 12, kEps);
  EXPECT_EQ(g->steps, 5);
  EXPECT_EQ(g->recomputed_steps, 0);
  EXPECT_EQ(g->failures, 0) << "A failed before the window";

  // [1023, 1028] cuts step 5 [1022.5, 1023.5]: its wait and 0.4 s of its
  // training lie before the window.
  g = ComputeGoodput(999, 1028, OneFailureRun(), kOneFailureStates, 1023);
  ASSERT_TRUE(g.ok());
  EXPECT_NEAR(g->productive_seconds, 0.5 + 3 * 0.9, kEps);
  EXPECT_NEAR(g->seconds(Badput::kDataLoadingSync), 3 * 0.1, kEps);
  EXPECT_NEAR(g->seconds(Badput::kOther), 1.5, kEps);
  EXPECT_NEAR(Sum(*g), 5, kEps);
  EXPECT_EQ(
      ComputeGoodput(999, 1028, OneFailureRun(), {}, 1028).status().code(),
      StatusCode::kInvalidArgument);
}

// Clocks that disagree (a start claiming more preparation than the gap
// before its step): the overlap is counted once, so the buckets still sum
// to the wall time.
TEST(GoodputTest, OverlappingIntervalsAreCountedOnce) {
  std::vector<nlohmann::json> records = {Timed(1, 0, 0, 12, 2, 0),
                                         Timed(2, 0, 0, 13, 1, 0, 5)};
  SetStart(records.front(), 5, 1, 0, 10);  // claims [6, 16]
  Result<Goodput> g = ComputeGoodput(4, 14, records, {});
  ASSERT_TRUE(g.ok());
  EXPECT_NEAR(Sum(*g), 10, kEps);
  EXPECT_NEAR(g->seconds(Badput::kTrainingPrep), 14 - 6, kEps);
  EXPECT_GE(g->seconds(Badput::kOther), 0);
}

// A run directory trained by a job (attempt 1) and then resumed by hand
// (attempt 0): the starts follow each other in time, not by attempt.
TEST(GoodputTest, StartsFollowEachOtherInTime) {
  std::vector<nlohmann::json> records = {
      Timed(1, 1, 0, 11, 1, 0), Timed(2, 1, 0, 12, 1, 0),
      Timed(3, 0, 1, 21, 1, 0), Timed(4, 0, 1, 22, 1, 0)};
  SetStart(records[2], 18, 1, 0.5, 0.5);
  Result<Goodput> g = ComputeGoodput(10, 22, records, {});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->failures, 1);
  EXPECT_NEAR(g->recovery.unsplit_seconds, 18 - 12, kEps);
  EXPECT_NEAR(g->productive_seconds, 4, kEps);
  EXPECT_NEAR(Sum(*g), 12, kEps);
}

TEST(GoodputTest, SpanAndInheritedProductiveTime) {
  const std::vector<nlohmann::json> records = OneFailureRun();
  const auto span = RecordSpan(records);
  ASSERT_TRUE(span.has_value());
  EXPECT_DOUBLE_EQ(span->first, 1000);
  EXPECT_DOUBLE_EQ(span->second, 1026.5);
  EXPECT_FALSE(RecordSpan({{{"note", 1}}}).has_value());
  // B restored step 3: A's steps 1-3 are what it inherits.
  EXPECT_NEAR(ProductiveSecondsUpTo(records, 3), 3 * 0.9, kEps);
  EXPECT_NEAR(ProductiveSecondsUpTo(records, 8), 8 * 0.9, kEps);
}

}  // namespace
}  // namespace multislice::train
