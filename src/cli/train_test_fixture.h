// The fixture of the tests that run `multislice train` end to end: a
// prepared copy of the default corpus and the tests' tiny model (f32, 2
// layers of width 64, so each run takes about a second), shared by every
// test of a suite, a run directory per test, and the checks those tests
// share (losses, weights, checkpoints).
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_test_util.h"
#include "common/temp_dir.h"
#include "train/checkpoint.h"
#include "train/train_state.h"

namespace multislice::testing_util {

class TrainRunTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new TempDir("multislice-train-data-");
    // A prepared copy of the default corpus, shared by every test.
    Child prep = Spawn({"data", "prepare", "--output", data_->path() + "/ds"},
                       {}, data_->path(), "prepare");
    ASSERT_EQ(WaitExit(prep, 120), 0) << ReadFile(prep.err);
    std::ofstream(data_->path() + "/tiny.yml")
        << "# the tests' model: tiny, exact f32\n"
           "emb_dim: 64\nnum_heads: 2\nnum_decoder_layers: 2\nmlp_dim: 128\n"
           "max_target_length: 32\ndtype: f32\ndeterministic: true\n"
           "warmup_steps: 2\nlearning_rate: 3.0e-3\neval_interval: 1000\n";
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
  }

  // Runs `multislice train tiny.yml ARGS --json` to completion; returns its
  // JSON summary (fails the test on a non-zero exit).
  nlohmann::json Train(const std::vector<std::string>& args,
                       const std::string& name,
                       const std::vector<std::string>& env = {}) {
    Child c = Spawn(Args(args), env, dir_.path(), name);
    const int code = WaitExit(c, 240);
    EXPECT_EQ(code, 0) << name << ": " << ReadFile(c.err);
    std::string out = ReadFile(c.out);
    const size_t brace = out.rfind("\n{");
    if (brace != std::string::npos) out = out.substr(brace + 1);
    try {
      return nlohmann::json::parse(out);
    } catch (const std::exception& e) {
      ADD_FAILURE() << name << ": no JSON summary: " << out << "\n"
                    << ReadFile(c.err);
      return {};
    }
  }

  std::vector<std::string> Args(const std::vector<std::string>& args) const {
    std::vector<std::string> all = {"train", data_->path() + "/tiny.yml",
                                    "base_output_directory=" + dir_.path(),
                                    "dataset_path=" + data_->path() + "/ds"};
    all.insert(all.end(), args.begin(), args.end());
    all.push_back("--json");
    return all;
  }

  std::string RunDir(const std::string& run) const {
    return dir_.path() + "/" + run;
  }

  // The prepared dataset's directory (train.bin, val.bin).
  static std::string DatasetDir() { return data_->path() + "/ds"; }

  inline static TempDir* data_ = nullptr;
  TempDir dir_{"multislice-train-test-"};
};

inline std::vector<double> Losses(const nlohmann::json& summary) {
  return summary.value("losses", std::vector<double>{});
}

inline void ExpectClose(const std::vector<double>& a,
                        const std::vector<double>& b, double rel,
                        const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], rel * std::abs(b[i])) << what << " step " << i;
  }
}

inline double MaxRelativeDifference(const std::vector<float>& a,
                                    const std::vector<float>& b) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, static_cast<double>(std::abs(b[i])));
  }
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]) / scale);
  }
  return worst;
}

inline std::vector<int64_t> CompleteSteps(const std::string& run_dir) {
  CheckpointOptions options;
  options.directory = run_dir + "/checkpoints";
  auto steps = CheckpointManager(options).CompleteSteps();
  return steps.ok() ? *steps : std::vector<int64_t>{-1};
}

inline train::FullState LoadState(const std::string& run_dir, int64_t step) {
  CheckpointOptions options;
  options.directory = run_dir + "/checkpoints";
  CheckpointManager manager(options);
  auto state = train::LoadFullState(manager, step);
  EXPECT_TRUE(state.ok()) << state.status().message();
  return state.ok() ? std::move(*state) : train::FullState{};
}

// `args` with `more` after them.
inline std::vector<std::string> With(std::vector<std::string> args,
                                     const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// Expects `resumed`, restored at step `restored`, to have trained every
// step after it with the loss of `uninterrupted`, bit for bit.
inline void ExpectLossesFrom(const nlohmann::json& resumed, int64_t restored,
                             const std::vector<double>& uninterrupted) {
  const std::vector<double> losses = Losses(resumed);
  ASSERT_EQ(losses.size(),
            uninterrupted.size() - static_cast<size_t>(restored));
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_EQ(losses[i], uninterrupted[restored + i])
        << "step " << restored + i + 1;
  }
}

// Kills worker `which` of the two that `victim` launched; the launcher
// reports the lost worker with its status (128 + SIGKILL).
inline void KillWorker(const Child& victim, size_t which) {
  std::vector<pid_t> workers = Workers(victim);
  ASSERT_EQ(workers.size(), 2u);
  ::kill(workers[which], SIGKILL);
  EXPECT_EQ(WaitExit(victim, 60), 128 + SIGKILL);
}

}  // namespace multislice::testing_util
