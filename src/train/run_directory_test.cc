// The run directory's lock (refusal sentence, release by the kernel when
// the holder dies, an earlier attempt waited for), the default run name,
// the schedule-change note and the resume hint.
#include "train/run_directory.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <thread>

#include "common/temp_dir.h"
#include "model/schedule.h"
#include "train/checkpoint.h"

namespace multislice::train {
namespace {

using std::chrono::milliseconds;

TEST(RunDirectoryLockTest, SecondHolderIsRefusedWithDirectoryAndPid) {
  TempDir dir("run-lock-");
  const std::string run = dir.path() + "/demo";
  auto first = RunDirectoryLock::Acquire(run, {"local-1", 0});
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_TRUE(std::filesystem::exists(run + "/train.lock"));

  // flock belongs to the open file: a second open in this process conflicts
  // as one in another process would.
  auto second = RunDirectoryLock::Acquire(run, {"local-2", 0});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  const std::string message = second.status().message();
  EXPECT_NE(message.find("the run directory " + run + " is in use"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("pid " + std::to_string(::getpid())),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find('\n'), std::string::npos);
  EXPECT_FALSE(RunDirectoryLock::CheckFree(run).ok());

  *first = RunDirectoryLock::Acquire(dir.path() + "/other", {}).value();
  EXPECT_TRUE(RunDirectoryLock::CheckFree(run).ok());
  EXPECT_TRUE(RunDirectoryLock::Acquire(run, {"local-2", 0}).ok());
}

TEST(RunDirectoryLockTest, KilledHolderLeavesNoStaleLock) {
  TempDir dir("run-lock-");
  const std::string run = dir.path() + "/demo";
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    auto lock = RunDirectoryLock::Acquire(run, {"job", 0});
    (void)!::write(ready[1], lock.ok() ? "y" : "n", 1);
    for (;;) ::pause();
  }
  char answer = 0;
  ASSERT_EQ(::read(ready[0], &answer, 1), 1);
  ASSERT_EQ(answer, 'y');
  auto refused = RunDirectoryLock::Acquire(run, {"other", 0});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("pid " + std::to_string(child)),
            std::string::npos)
      << refused.status().message();

  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_TRUE(RunDirectoryLock::CheckFree(run).ok());
  EXPECT_TRUE(RunDirectoryLock::Acquire(run, {"other", 0}).ok());
}

TEST(RunDirectoryLockTest, NextAttemptOfTheSameJobWaitsForTheEarlierOne) {
  TempDir dir("run-lock-");
  const std::string run = dir.path() + "/demo";
  auto earlier = RunDirectoryLock::Acquire(run, {"job", 1});
  ASSERT_TRUE(earlier.ok());
  // Another job is refused at once, even with a wait.
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(
      RunDirectoryLock::Acquire(run, {"other", 5}, milliseconds(5000)).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(2000));

  std::thread release([&] {
    std::this_thread::sleep_for(milliseconds(300));
    *earlier = RunDirectoryLock::Acquire(dir.path() + "/elsewhere", {}).value();
  });
  auto next = RunDirectoryLock::Acquire(run, {"job", 2}, milliseconds(10000));
  release.join();
  EXPECT_TRUE(next.ok()) << next.status().message();
}

runtime::EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(ChooseRunNameTest, JobNameThenJobsetNameThenTimestamp) {
  auto ours = ChooseRunName(
      Env({{"MULTISLICE_RUN_NAME", "demo"}, {"JOBSET_NAME", "js"}}), false);
  ASSERT_TRUE(ours.ok());
  EXPECT_EQ(ours->name, "demo");
  EXPECT_EQ(ours->source, "MULTISLICE_RUN_NAME");
  auto jobset = ChooseRunName(Env({{"JOBSET_NAME", "js"}}), false);
  ASSERT_TRUE(jobset.ok());
  EXPECT_EQ(jobset->name, "js");

  auto stamp = ChooseRunName(Env({}), true);
  ASSERT_TRUE(stamp.ok());
  EXPECT_EQ(stamp->source, "timestamp");
  EXPECT_EQ(stamp->name.rfind("run-", 0), 0u);
  EXPECT_EQ(stamp->name.size(), std::string("run-20261201-100000").size());

  // Several workers would each pick their own timestamp.
  auto refused = ChooseRunName(Env({}), false);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("run_name"), std::string::npos);
}

TEST(ScheduleChangeNoteTest, NamesOldAndNewStepsAndTheNextLearningRate) {
  TrainConfig before;
  before.steps = 100;
  before.warmup_steps = 10;
  TrainConfig now = before;
  now.steps = 200;
  EXPECT_EQ(ScheduleChangeNote(ToJson(before), before, 50), "");
  const std::string note = ScheduleChangeNote(ToJson(before), now, 100);
  EXPECT_NE(note.find("steps changed from 100 to 200"), std::string::npos)
      << note;
  EXPECT_EQ(note.find("warmup_steps"), std::string::npos) << note;
  // Step 101 under the old schedule is past its end (the final lr, 1e-4);
  // under the new one it is half-way down the cosine.
  char lr[32];
  std::snprintf(lr, sizeof lr, "%.2e",
                model::LearningRate(101, 200, 10, now.learning_rate,
                                    now.cosine_learning_rate_final_fraction));
  EXPECT_NE(note.find(std::string("step 101 trains with lr ") + lr),
            std::string::npos)
      << note;
  EXPECT_NE(note.find("instead of 1.00e-04"), std::string::npos) << note;
  EXPECT_NE(note.find("ends at step 200"), std::string::npos) << note;
  EXPECT_EQ(note.find('\n'), std::string::npos);
  // Nothing left to train, or no earlier config: nothing to say.
  EXPECT_EQ(ScheduleChangeNote(ToJson(before), now, 200), "");
  EXPECT_EQ(ScheduleChangeNote(nlohmann::json(), now, 100), "");
}

TEST(ShellCommandTest, QuotesWhatTheShellWouldSplit) {
  EXPECT_EQ(ShellCommand({"build/bin/multislice", "train", "configs/a.yml",
                          "run_name=demo", "--num_slices", "2"}),
            "build/bin/multislice train configs/a.yml run_name=demo "
            "--num_slices 2");
  EXPECT_EQ(ShellCommand({"multislice", "dataset_path=my data", "x='y'", ""}),
            "multislice 'dataset_path=my data' 'x='\\''y'\\''' ''");
}

TEST(ResumeHintTest, NamesTheNewestCommittedStepAndTheCommand) {
  TempDir dir("resume-hint-");
  TrainConfig config;
  config.base_output_directory = dir.path();
  config.run_name = "demo";
  config.checkpoint_period = 5;
  const std::vector<std::string> argv = {"multislice", "train", "c.yml",
                                         "run_name=demo"};
  EXPECT_EQ(ResumeHint(config, "interrupted", argv),
            "interrupted; no checkpoint was committed yet (the first is at "
            "step 5): running the command again trains from step 1: "
            "multislice train c.yml run_name=demo");

  CheckpointOptions options;
  options.directory = dir.path() + "/demo/checkpoints";
  options.async = false;
  CheckpointManager manager(options);
  for (int64_t step : {5, 10}) {
    ASSERT_TRUE(manager.Save(step, {}, nlohmann::json::object()).ok());
  }
  EXPECT_EQ(ResumeHint(config, "interrupted", argv),
            "interrupted; the newest committed checkpoint is step 10 (" +
                options.directory +
                "/10); resume with: multislice train c.yml run_name=demo");
}

}  // namespace
}  // namespace multislice::train
