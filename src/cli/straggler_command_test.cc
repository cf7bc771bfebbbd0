// `multislice train` with one worker slowed down by a test seam (a sleep in
// every step's compute): it is reported as a straggler, with its host,
// within straggler_report_interval steps; workers slowed alike are not.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/train_test_fixture.h"

namespace multislice {
namespace {

using testing_util::ReadFile;

const std::vector<std::string> kTwoSlicesOfTwo = {
    "--accelerator_type",     "cpu-2",    "ici_fsdp_parallelism=2",
    "dcn_data_parallelism=2", "steps=10", "straggler_report_interval=5"};

class StragglerTest : public testing_util::TrainRunTest {
 protected:
  std::vector<nlohmann::json> Records(const std::string& run) {
    std::vector<nlohmann::json> records;
    std::ifstream in(RunDir(run) + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      records.push_back(nlohmann::json::parse(line));
    }
    return records;
  }
};

TEST_F(StragglerTest, ASlowWorkerIsReportedWithItsHost) {
  std::vector<std::string> args = kTwoSlicesOfTwo;
  args.push_back("run_name=slow");
  // Every device sleeps 30 ms in each step's compute (so that millisecond
  // noise does not count), slice 1's 60 ms more; the others wait for it in
  // the gradient all-reduce, which is not compute.
  Train(args, "slow", {"MULTISLICE_TEST_SLOW_WORKER=*:30,1:60"});
  int reports = 0;
  for (const nlohmann::json& r : Records("slow")) {
    if (!r.contains("step")) continue;
    const int64_t step = r["step"];
    ASSERT_EQ(r.contains("stragglers"), step % 5 == 0) << r.dump();
    if (step % 5 != 0) continue;
    ++reports;
    ASSERT_EQ(r["stragglers"].size(), 1u) << r.dump();
    const nlohmann::json& s = r["stragglers"][0];
    EXPECT_EQ(s["worker"], "slice 1 worker 0");
    EXPECT_EQ(s["process"], 1);
    EXPECT_FALSE(s["host"].get<std::string>().empty());
    EXPECT_LT(s["relative_score"].get<double>(), 0.7) << s.dump();
    EXPECT_GE(s["compute_seconds"].get<double>(), 0.09) << s.dump();
  }
  EXPECT_EQ(reports, 2);  // after steps 5 and 10
}

TEST_F(StragglerTest, TheLogLineAndTheStepLineMarkIt) {
  std::vector<std::string> args = kTwoSlicesOfTwo;
  args.push_back("run_name=marked");
  std::vector<std::string> argv = Args(args);
  argv.pop_back();  // without --json: the step lines
  testing_util::Child run = testing_util::Spawn(
      argv, {"MULTISLICE_TEST_SLOW_WORKER=*:30,0:60"}, dir_.path(), "marked");
  ASSERT_EQ(testing_util::WaitExit(run, 240), 0) << ReadFile(run.err);
  const std::string err = ReadFile(run.err), out = ReadFile(run.out);
  EXPECT_NE(err.find("straggler after step 5: slice 0 worker 0 on "),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("slice 1 worker 0 on"), std::string::npos) << err;
  EXPECT_NE(out.find("STRAGGLER slice 0 worker 0"), std::string::npos) << out;
}

TEST_F(StragglerTest, EvenWorkersAreNotReported) {
  std::vector<std::string> args = kTwoSlicesOfTwo;
  args.push_back("run_name=even");
  // Every worker sleeps alike, so that their compute is even also on a
  // loaded machine (steps of a few ms vary by more than the threshold).
  Train(args, "even", {"MULTISLICE_TEST_SLOW_WORKER=*:40"});
  int steps = 0;
  for (const nlohmann::json& r : Records("even")) {
    if (!r.contains("step")) continue;
    ++steps;
    EXPECT_FALSE(r.contains("stragglers")) << r.dump();
  }
  EXPECT_EQ(steps, 10);
}

}  // namespace
}  // namespace multislice
