// End-to-end tests of goodput on a real `multislice train` run: the tiny
// model trains 16 steps with blocking checkpoints every 5; its worker is
// killed after step 8 (MULTISLICE_TEST_KILL_AFTER_STEP) and the same
// command resumes from step 5. `multislice goodput` on the run directory
// gives buckets that sum to the wall time, each of the size the records
// themselves say (read here from metrics.jsonl, independently of
// train/goodput.cc), and the window query clips them; the Prometheus file
// holds the last step's figures.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cli/cli_test_util.h"
#include "cli/train_test_fixture.h"
#include "train/metrics.h"

namespace multislice {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing_util::Child;
using testing_util::ReadFile;
using testing_util::Spawn;
using testing_util::WaitExit;

const char* const kBuckets[] = {"TPU_INITIALIZATION",
                                "TRAINING_PREP",
                                "PROGRAM_STARTUP",
                                "DATA_LOADING_SYNC",
                                "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
                                "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
                                "WASTED_PROGRESS_FROM_DISRUPTION",
                                "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
                                "OTHER"};

double Bucket(const json& g, const std::string& name) {
  const json& b = g["badput"][name];
  return b.is_object() ? b["seconds"].get<double>() : b.get<double>();
}

double BucketSum(const json& g) {
  double sum = g["productive_seconds"].get<double>();
  for (const char* name : kBuckets) sum += Bucket(g, name);
  return sum;
}

// The samples of a Prometheus text file: metric name -> (run label, value);
// every sample must follow its family's "# TYPE" line.
std::map<std::string, std::pair<std::string, double>> ParseSamples(
    const std::string& text) {
  const std::regex sample(
      R"re(([a-zA-Z_:][a-zA-Z0-9_:]*)\{run="([^"\\]*)"\} (\S+))re");
  std::map<std::string, std::pair<std::string, double>> samples;
  std::string typed;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (line.rfind("# TYPE ", 0) == 0) {
      typed = line.substr(7, line.find(' ', 7) - 7);
    } else if (std::regex_match(line, m, sample)) {
      EXPECT_EQ(m[1], typed) << "a sample without its TYPE: " << line;
      samples[m[1]] = {m[2], std::stod(m[3])};
    } else {
      EXPECT_EQ(line.rfind("# HELP ", 0), 0u) << "not a line: " << line;
    }
  }
  return samples;
}

class GoodputCommandTest : public testing_util::TrainRunTest {
 protected:
  std::vector<std::string> TrainArgs(const std::string& prometheus) const {
    return Args({"run_name=g", "steps=16", "checkpoint_period=5",
                 "async_checkpointing=false", "per_device_batch_size=4",
                 "dcn_data_parallelism=1", "--num_slices", "1",
                 "--accelerator_type", "cpu-1",
                 "prometheus_metrics_file=" + prometheus});
  }

  // `multislice goodput ARGS`: its exit code, stdout and stderr.
  std::tuple<int, std::string, std::string> Goodput(
      const std::vector<std::string>& args) {
    std::vector<std::string> all = {"goodput"};
    all.insert(all.end(), args.begin(), args.end());
    Child c = Spawn(all, {}, dir_.path(), "goodput");
    const int code = WaitExit(c, 60);
    return {code, ReadFile(c.out), ReadFile(c.err)};
  }

  json GoodputJson(const std::vector<std::string>& args) {
    auto [code, out, err] = Goodput(args);
    EXPECT_EQ(code, 0) << err;
    return json::parse(testing_util::LastJsonLine(out));
  }
};

// What the records say, computed here from metrics.jsonl.
struct RecordFigures {
  double first_start = 0, last_end = 0;
  double superseded_step_seconds = 0, kept_step_seconds = 0;
  double kept_later_seconds = 0;  // kept, without each start's first step
  double runtime_init = 0;
  double first_run_last_end = 0, second_start = 0;  // the disruption
  int starts = 0;
  json last;
};

RecordFigures ReadFigures(const std::vector<json>& records, int64_t restored) {
  RecordFigures f;
  f.first_start = 1e300;
  for (const json& r : records) {
    const double end = r["time"].get<double>();
    const int64_t resume = r["resume"].get<int64_t>();
    f.last_end = std::max(f.last_end, end);
    const bool superseded = resume == 0 && r["step"].get<int64_t>() > restored;
    const double seconds = r["step_time_s"].get<double>();
    (superseded ? f.superseded_step_seconds : f.kept_step_seconds) += seconds;
    if (!superseded && !r.contains("start_time")) {
      f.kept_later_seconds += seconds;
    }
    if (resume == 0) f.first_run_last_end = std::max(f.first_run_last_end, end);
    EXPECT_TRUE(r.contains("data_wait_s") && r.contains("checkpoint_block_s") &&
                r.contains("goodput"))
        << r.dump();
    if (!r.contains("start_time")) continue;
    ++f.starts;
    f.first_start = std::min(f.first_start, r["start_time"].get<double>());
    f.runtime_init += r["runtime_init_s"].get<double>();
    if (resume == 1) f.second_start = r["start_time"].get<double>();
  }
  f.last = records.back();
  return f;
}

TEST_F(GoodputCommandTest, ARunWithOneFailureAccountsForItsWallTime) {
  // The first start writes its Prometheus file into a missing directory:
  // a warning, once, and training goes on to the kill.
  Child first =
      Spawn(TrainArgs(dir_.path() + "/missing/train.prom"),
            {"MULTISLICE_TEST_KILL_AFTER_STEP=0:8"}, dir_.path(), "first");
  ASSERT_EQ(WaitExit(first, 240), 128 + SIGKILL) << ReadFile(first.err);
  const std::string err = ReadFile(first.err);
  const std::string warning =
      "multislice train: warning: cannot write the Prometheus file: ";
  EXPECT_EQ(err.find(warning), err.rfind(warning)) << err;
  EXPECT_NE(err.find(warning), std::string::npos) << err;

  const std::string prometheus = dir_.path() + "/train.prom";
  Child second = Spawn(TrainArgs(prometheus), {}, dir_.path(), "second");
  ASSERT_EQ(WaitExit(second, 240), 0) << ReadFile(second.err);
  const json summary =
      json::parse(testing_util::LastJsonLine(ReadFile(second.out)));
  ASSERT_EQ(summary.value("restored_step", -1), 5);

  auto records = train::MetricsWriter::ReadAll(RunDir("g") + "/metrics.jsonl");
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 8u + 11u);
  const RecordFigures f = ReadFigures(*records, 5);
  EXPECT_EQ(f.starts, 2);

  const json g = GoodputJson({RunDir("g"), "--json"});
  std::printf("goodput of the run: %s\n", g.dump().c_str());
  const double wall = g["wall_seconds"].get<double>();
  EXPECT_NEAR(wall, f.last_end - f.first_start, 1e-6);
  EXPECT_NEAR(BucketSum(g), wall, 1e-6 * wall);
  EXPECT_EQ(g["steps"], 16);
  EXPECT_EQ(g["recomputed_steps"], 3);
  EXPECT_EQ(g["failures"], 1);
  // Steps 6-8 of the first start were trained again: about their time.
  const double wasted = Bucket(g, "WASTED_PROGRESS_FROM_DISRUPTION");
  EXPECT_LE(wasted, f.superseded_step_seconds + 1e-9);
  EXPECT_GE(wasted, 0.8 * f.superseded_step_seconds);
  // Every step's time is productive, wasted, start-up or data wait; the
  // kept steps after each start's first are nearly all productive.
  const double productive = g["productive_seconds"].get<double>();
  EXPECT_NEAR(productive + wasted + Bucket(g, "PROGRAM_STARTUP") +
                  Bucket(g, "DATA_LOADING_SYNC"),
              f.kept_step_seconds + f.superseded_step_seconds, 1e-6);
  EXPECT_LE(productive, f.kept_step_seconds + 1e-9);
  EXPECT_GE(productive, 0.8 * f.kept_later_seconds);
  EXPECT_NEAR(g["goodput_percent"].get<double>(), 100 * productive / wall,
              1e-9);
  // A plain run: the recovery is the gap between the two starts, unsplit.
  const json& recovery = g["badput"]["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"];
  EXPECT_NEAR(recovery["seconds"].get<double>(),
              f.second_start - f.first_run_last_end, 1e-6);
  EXPECT_GT(recovery["seconds"].get<double>(), 0);
  EXPECT_NEAR(recovery["unsplit_seconds"].get<double>(),
              recovery["seconds"].get<double>(), 1e-9);
  // Two runtime start-ups with their matmul peak; a restored checkpoint;
  // three blocking saves before steps 6, 11 and 16 of the second start and
  // one before step 6 of the first; each inside the wall time.
  EXPECT_NEAR(Bucket(g, "TPU_INITIALIZATION"), f.runtime_init, 1e-6);
  for (const char* name : {"TPU_INITIALIZATION", "TRAINING_PREP",
                           "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
                           "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"}) {
    EXPECT_GT(Bucket(g, name), 0) << name;
    EXPECT_LT(Bucket(g, name), wall) << name;
  }
  // The trainer's running value agrees with the exact one.
  EXPECT_NEAR(f.last["goodput"].get<double>(), productive / wall, 0.05);

  // The last half: every bucket clipped to it.
  const double half = wall / 2;
  const json w =
      GoodputJson({RunDir("g"), "--window", std::to_string(half), "--json"});
  EXPECT_NEAR(w["wall_seconds"].get<double>(), half, 1e-3);
  EXPECT_NEAR(BucketSum(w), w["wall_seconds"].get<double>(), 1e-6 * wall);
  EXPECT_LE(w["productive_seconds"].get<double>(), productive + 1e-9);
  for (const char* name : kBuckets) {
    EXPECT_LE(Bucket(w, name), Bucket(g, name) + 1e-6) << name;
  }
  int kept_in_window = 0;  // the steps that count, ending in the window
  for (const json& r : *records) {
    const bool kept = r["resume"] == 1 || r["step"].get<int64_t>() <= 5;
    if (kept && r["time"].get<double>() >= f.last_end - half) ++kept_in_window;
  }
  EXPECT_EQ(w["steps"].get<int>(), kept_in_window);
  auto [code, text, text_err] = Goodput({RunDir("g"), "--window", "1"});
  EXPECT_EQ(code, 0) << text_err;
  EXPECT_NE(text.find("the last 1.0 s of "), std::string::npos) << text;

  // The Prometheus file: the last step's figures.
  const auto samples = ParseSamples(ReadFile(prometheus));
  ASSERT_TRUE(samples.count("multislice_train_step")) << ReadFile(prometheus);
  EXPECT_EQ(samples.at("multislice_train_step").first, "g");
  EXPECT_EQ(samples.at("multislice_train_step").second,
            f.last["step"].get<double>());
  EXPECT_EQ(samples.at("multislice_train_loss").second,
            f.last["loss"].get<double>());
  EXPECT_EQ(samples.at("multislice_train_goodput_ratio").second,
            f.last["goodput"].get<double>());
  EXPECT_FALSE(fs::exists(prometheus + ".tmp." + std::to_string(second.pid)));
}

TEST_F(GoodputCommandTest, BadInputIsOneSentenceAndExitCode2) {
  auto [code, out, err] = Goodput({dir_.path() + "/none"});
  EXPECT_EQ(code, 2);
  EXPECT_EQ(err, "multislice goodput: RUN_DIR: '" + dir_.path() +
                     "/none' is not a directory\n");
  fs::create_directories(dir_.path() + "/empty");
  std::tie(code, out, err) = Goodput({dir_.path() + "/empty"});
  EXPECT_EQ(code, 2);
  EXPECT_NE(
      err.find("RUN_DIR: '" + dir_.path() + "/empty' has no metrics.jsonl"),
      std::string::npos)
      << err;
  for (const char* window : {"abc", "0", "-5", "inf"}) {
    std::tie(code, out, err) = Goodput({dir_.path(), "--window", window});
    EXPECT_EQ(code, 2) << window;
    EXPECT_EQ(err, "multislice goodput: --window: '" + std::string(window) +
                       "' is not a number of seconds above 0\n");
  }
}

}  // namespace
}  // namespace multislice
