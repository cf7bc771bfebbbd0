// The start-up matmul peak: the best of kPeakRounds rounds, every device
// thread at once, and one measurement shared by the workers of a job on one
// machine (measured by one of them with all of their devices' threads).
#include "bench/peak.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

namespace multislice::bench {
namespace {

compute::GemmDesc Small() {
  compute::GemmDesc d;
  d.m = d.n = d.k = 64;
  d.ab_type = DType::kF32;
  d.c_type = DType::kF32;
  return d;
}

std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/peak_test_" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(PeakTest, BestOfRoundsOnEveryThreadAtOnce) {
  auto peak = MeasureConcurrentMatmulPeak(Small(), 3, 2);
  ASSERT_TRUE(peak.ok()) << peak.status().message();
  EXPECT_EQ(peak->threads, 2);
  // kPeakRounds rounds, more on a busy machine (their threads had less of
  // a CPU than they could have); at least 3 calls a round.
  EXPECT_GE(peak->rounds, kPeakRounds);
  EXPECT_EQ(peak->rounds % kPeakRounds, 0);
  EXPECT_EQ(peak->reps, peak->rounds * 3);
  ASSERT_EQ(peak->round_gflops.size(), static_cast<size_t>(peak->rounds));
  ASSERT_EQ(peak->round_cpu_shares.size(), static_cast<size_t>(peak->rounds));
  EXPECT_EQ(peak->median_gflops, *std::max_element(peak->round_gflops.begin(),
                                                   peak->round_gflops.end()));
  EXPECT_LE(peak->min_gflops, peak->median_gflops);
  EXPECT_LE(peak->median_gflops, peak->max_gflops);
  EXPECT_EQ(peak->processes, 1);  // not a worker: this process alone
  EXPECT_TRUE(peak->measured_here);
  // 10 timed calls asked for: 3 rounds of 4.
  auto more = MeasureConcurrentMatmulPeak(Small(), 10, 1);
  ASSERT_TRUE(more.ok());
  EXPECT_EQ(more->reps, more->rounds * 4);
}

TEST(PeakTest, WorkersOfOneMachineShareOneMeasurementOfAllTheirDevices) {
  const std::string dir = FreshDir("shared");
  Result<MatmulPeak> results[2] = {Internal("unset"), Internal("unset")};
  std::thread workers[2];
  for (int w = 0; w < 2; ++w) {
    workers[w] = std::thread([&, w] {
      // The second worker comes late: the first waits for it.
      if (w == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      PeakShare share{.dir = dir,
                      .processes = 2,
                      .name = "slice" + std::to_string(w),
                      .wait_seconds = 30};
      results[w] = MeasureSharedMatmulPeak(Small(), 3, 1, share);
    });
  }
  for (std::thread& t : workers) t.join();
  ASSERT_TRUE(results[0].ok()) << results[0].status().message();
  ASSERT_TRUE(results[1].ok()) << results[1].status().message();
  EXPECT_NE(results[0]->measured_here, results[1]->measured_here);
  for (const Result<MatmulPeak>& r : results) {
    EXPECT_EQ(r->threads, 2);  // one device each, both at once
    EXPECT_EQ(r->processes, 2);
    EXPECT_EQ(r->median_gflops, results[0]->median_gflops);
    EXPECT_EQ(r->round_gflops, results[0]->round_gflops);
  }
}

TEST(PeakTest, AWorkerThatNeverComesDelaysTheOthersOnlyAWhile) {
  PeakShare share{.dir = FreshDir("alone"),
                  .processes = 2,
                  .name = "slice0",
                  .wait_seconds = 0.3};
  const auto start = std::chrono::steady_clock::now();
  auto peak = MeasureSharedMatmulPeak(Small(), 3, 1, share);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  ASSERT_TRUE(peak.ok());
  EXPECT_GE(waited, 0.3);
  EXPECT_LT(waited, 20);
  // Still measured with the devices of both workers busy.
  EXPECT_EQ(peak->threads, 2);
  EXPECT_TRUE(peak->measured_here);
}

// The start-up measurement fits its rounds in a time budget: a slow matmul
// (0.45 s a call at the baseline ISA) gets one call a round, not three, and
// a fast one all of them.
TEST(PeakTest, StartupRoundsFitTheirTimeBudget) {
  EXPECT_EQ(StartupCallsPerRound(3, 0.01), 3);
  EXPECT_EQ(StartupCallsPerRound(3, 0.1), 2);
  EXPECT_EQ(StartupCallsPerRound(3, 0.2), 1);
  EXPECT_EQ(StartupCallsPerRound(3, 0.45), 1);
  EXPECT_EQ(StartupCallsPerRound(5, 0.0), 5);
  auto fast = MeasureConcurrentMatmulPeak(Small(), 3, 1, PeakTime::kStartup);
  ASSERT_TRUE(fast.ok()) << fast.status().message();
  EXPECT_EQ(fast->reps, fast->rounds * 3);  // Small() takes well under 0.08 s
}

}  // namespace
}  // namespace multislice::bench
