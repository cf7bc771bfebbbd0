// `multislice train` with a worker that hangs (stopped by SIGSTOP) or whose
// collectives differ from the others': the hang digest names it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli/train_test_fixture.h"

namespace multislice {
namespace {

using testing_util::Child;
using testing_util::ReadFile;
using testing_util::Spawn;
using testing_util::WaitExit;

constexpr double kThresholdSeconds = 3;
constexpr double kGraceSeconds = 3;  // HangWatchOptions::grace

class HangRunTest : public testing_util::TrainRunTest {
 protected:
  struct Hung {
    int code = 0;
    std::string err;
    nlohmann::json digest;
    double seconds_after_last_step = 0;  // exit - end of the last step
  };

  // Runs 8 steps on `mesh` with the seam `env` and returns how it ended.
  Hung RunHung(const std::string& name, const std::vector<std::string>& mesh,
               const std::string& env) {
    std::vector<std::string> args = {"steps=8", "run_name=" + name,
                                     "hang_timeout_seconds=3"};
    args.insert(args.end(), mesh.begin(), mesh.end());
    Child run = Spawn(Args(args), {env}, dir_.path(), name);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const std::vector<pid_t> workers = testing_util::Workers(run);
    Hung h;
    h.code = WaitExit(run, 120);
    const double exited = WallSeconds();
    h.err = ReadFile(run.err);
    for (pid_t pid : workers) ExpectGone(pid);
    const std::string path = RunDir(name) + "/hang_digest.json";
    EXPECT_TRUE(std::filesystem::exists(path)) << h.err;
    try {
      h.digest = nlohmann::json::parse(ReadFile(path));
    } catch (const std::exception& e) {
      ADD_FAILURE() << path << ": " << e.what();
    }
    std::ifstream metrics(RunDir(name) + "/metrics.jsonl");
    double last_step_end = 0;
    for (std::string line; std::getline(metrics, line);) {
      const nlohmann::json record = nlohmann::json::parse(line);
      if (record.contains("step")) last_step_end = record["time"];
    }
    h.seconds_after_last_step = exited - last_step_end;
    return h;
  }

  static double WallSeconds() {
    return std::chrono::duration<double>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  // No worker is left behind, stopped or not.
  static void ExpectGone(pid_t pid) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(10);
    const std::string stat = "/proc/" + std::to_string(pid) + "/stat";
    while (std::filesystem::exists(stat) &&
           std::chrono::steady_clock::now() < deadline) {
      std::string text = ReadFile(stat);
      if (text.find(") Z") != std::string::npos) return;  // reaped soon
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_FALSE(std::filesystem::exists(stat)) << "worker " << pid << " left";
  }

  static std::vector<int> Culprits(const nlohmann::json& digest) {
    std::vector<int> out;
    for (const auto& c : digest["culprits"]) out.push_back(c["process"]);
    return out;
  }
};

struct StoppedCase {
  const char* name;
  std::vector<std::string> mesh;
  int stopped;
  int processes;
};

class StoppedWorkerTest : public HangRunTest,
                          public ::testing::WithParamInterface<StoppedCase> {};

// The survivors wait on different peers (in the ring of four slices, slice
// 3 waits on the stopped slice 2, slice 0 on slice 3, slice 1 on slice 0):
// the digest names the stopped one.
TEST_P(StoppedWorkerTest, TheDigestNamesTheStoppedWorker) {
  const StoppedCase& c = GetParam();
  const Hung h = RunHung(
      c.name, c.mesh,
      "MULTISLICE_TEST_STOP_AFTER_STEP=" + std::to_string(c.stopped) + ":3");
  EXPECT_EQ(h.code, 1) << h.err;
  EXPECT_EQ(h.digest["cause"], "hang") << h.digest.dump(2);
  EXPECT_EQ(Culprits(h.digest), std::vector<int>{c.stopped})
      << h.digest.dump(2);
  EXPECT_EQ(h.digest["silent"], nlohmann::json::array({c.stopped}));
  EXPECT_EQ(h.digest["workers"].size(), size_t(c.processes - 1));
  for (const auto& w : h.digest["workers"]) {
    for (const auto& d : w["devices"]) {
      EXPECT_TRUE(d.contains("pending")) << w.dump(2);  // all wait
    }
  }
  const std::string name = "slice " + std::to_string(c.stopped) + " worker 0";
  for (int p = 0; p < c.processes; ++p) {
    if (p == c.stopped) continue;
    const std::string prefix = "[slice " + std::to_string(p) + " worker 0] ";
    EXPECT_NE(h.err.find(prefix +
                         "multislice train: the job is stuck (hang); "
                         "suspected culprit(s): " +
                         name),
              std::string::npos)
        << h.err;
  }
  EXPECT_NE(h.err.find("culprit: " + name), std::string::npos) << h.err;
  EXPECT_LT(h.seconds_after_last_step, kThresholdSeconds + kGraceSeconds + 5)
      << h.err;
  std::printf("%s: the job ended %.1f s after its last step's record\n", c.name,
              h.seconds_after_last_step);
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, StoppedWorkerTest,
    ::testing::Values(
        StoppedCase{"two-slices-of-two",
                    {"--accelerator_type", "cpu-2", "ici_fsdp_parallelism=2",
                     "dcn_data_parallelism=2"},
                    1,
                    2},
        StoppedCase{"four-slices-of-one",
                    {"--accelerator_type", "cpu-1", "dcn_data_parallelism=4"},
                    2,
                    4}),
    [](const auto& info) {
      std::string name = info.param.name;
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

TEST_F(HangRunTest, DifferentCollectivesAreAProgramMismatch) {
  const Hung h = RunHung(
      "mismatch", {"--accelerator_type", "cpu-1", "dcn_data_parallelism=3"},
      "MULTISLICE_TEST_SKIP_COLLECTIVE=2:3");
  EXPECT_EQ(h.code, 1) << h.err;
  EXPECT_EQ(h.digest["cause"], "program mismatch") << h.digest.dump(2);
  EXPECT_EQ(Culprits(h.digest), std::vector<int>{2}) << h.digest.dump(2);
  const nlohmann::json& m = h.digest["mismatch"];
  // Slice 2 skipped step 3's loss all-reduce and went on to the next
  // collective, step 4's first gradient bucket.
  EXPECT_NE(m["expected"].get<std::string>().find("loss-and-norm"),
            std::string::npos)
      << m.dump();
  EXPECT_NE(m["issued"].get<std::string>().find("grads"), std::string::npos)
      << m.dump();
  EXPECT_FALSE(m["at_or_before"].get<bool>());
  // At the same position of every device's sequence: the others' pending
  // collective there is the expected one.
  const uint64_t seq = m["sequence"];
  for (const auto& w : h.digest["workers"]) {
    const auto& pending = w["devices"][0]["pending"];
    EXPECT_EQ(pending["sequence"].get<uint64_t>(), seq) << w.dump(2);
  }
  EXPECT_NE(h.err.find("program mismatch: the first differing collective is #" +
                       std::to_string(seq)),
            std::string::npos)
      << h.err;
}

TEST_F(HangRunTest, AHealthyRunWritesNoDigest) {
  Train({"steps=8", "run_name=healthy", "hang_timeout_seconds=1",
         "--accelerator_type", "cpu-2", "ici_fsdp_parallelism=2",
         "dcn_data_parallelism=2"},
        "healthy");
  EXPECT_FALSE(
      std::filesystem::exists(RunDir("healthy") + "/hang_digest.json"));
}

}  // namespace
}  // namespace multislice
