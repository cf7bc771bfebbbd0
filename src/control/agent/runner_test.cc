// `multislice run` (runner.h): its name rules, and end to end with the real
// binary: `multislice controller --local-hosts 4 --local-accelerator-type
// v4-16` (a v4-16 slice takes 2 hosts), one queued resource of 2 slices x 2
// workers, and `multislice run` of a script directory on it. The end-to-end
// cases are skipped when the binary has not been built.
#include "control/agent/runner.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "common/temp_dir.h"
#include "control/agent/local_cluster_test_util.h"
#include "control/process.h"

namespace multislice::control {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::ReadWholeFile;

TEST(RunNameTest, AcceptsMaxTextsTimestampsAndRejectsPaths) {
  EXPECT_TRUE(ValidRunName("2026-11-30-07-48-08"));
  EXPECT_TRUE(ValidRunName("exp_1.a"));
  EXPECT_FALSE(ValidRunName(""));
  EXPECT_FALSE(ValidRunName(".."));
  EXPECT_FALSE(ValidRunName(".hidden"));
  EXPECT_FALSE(ValidRunName("a/b"));
  EXPECT_FALSE(ValidRunName("a b"));
  EXPECT_FALSE(ValidRunName(std::string(101, 'a')));
  const auto t = std::chrono::system_clock::from_time_t(0) + seconds(3723);
  EXPECT_EQ(DefaultRunName(t), "1970-01-01-01-02-03");
}

TEST(RunOptionsTest, RejectsBadOptionsBeforeCallingAnything) {
  RunOptions options;
  options.controller_url = "http://127.0.0.1:1";
  options.command = "true";
  options.run_name = "r";
  EXPECT_EQ(RunOnWorkers(options).status().code(),
            StatusCode::kInvalidArgument);  // neither --qr nor --tpu_prefix
  options.queued_resource = "qr";
  options.run_name = "../x";
  EXPECT_EQ(RunOnWorkers(options).status().code(),
            StatusCode::kInvalidArgument);
  options.run_name = "r";
  options.use_existing_folder = true;
  // Nothing listens on port 1: the controller is unreachable.
  EXPECT_EQ(RunOnWorkers(options).status().code(), StatusCode::kUnavailable);
}

// Whether a process of that group is alive (zombies aside).
bool GroupAlive(const std::string& pgid_text) {
  return ProcessGroupAlive(static_cast<pid_t>(std::stol(pgid_text)));
}

class RunEndToEndTest : public testing::LocalClusterTest {
 protected:
  // 4 hosts of v4-16: a slice takes 2 of them.
  RunEndToEndTest() : LocalClusterTest(MULTISLICE_BINARY, 4, "v4-16", 2) {}

  void SetUp() override {
    LocalClusterTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    std::filesystem::create_directories(scripts());
    std::filesystem::create_directories(here());
  }

  std::string scripts() { return dir_.path() + "/scripts"; }
  std::string here() { return dir_.path() + "/here"; }  // the runner's cwd

  void WriteScript(const std::string& name, const std::string& text) {
    std::ofstream(scripts() + "/" + name) << text;
  }

  std::string OutputFile(const std::string& run, int slice, int worker) {
    char name[64];
    std::snprintf(name, sizeof name, "/output_slice_%04d_worker_%04d.txt",
                  slice, worker);
    return here() + "/runs/" + run + name;
  }

  // Every "S.W" marker file in shared/ with the prefix, as its contents
  // (a process group id).
  std::vector<std::string> Groups(const std::string& prefix) {
    std::vector<std::string> groups;
    for (const auto& e : std::filesystem::directory_iterator(shared())) {
      const std::string name = e.path().filename().string();
      // Not a job's .tmp file, which may still be empty (read too early it
      // made stol throw, 1 run in about 10 on this machine).
      if (name.rfind(prefix, 0) == 0 && name.size() > 4 &&
          name.compare(name.size() - 4, 4, ".tmp") != 0) {
        groups.push_back(ReadWholeFile(e.path()));
      }
    }
    return groups;
  }

  // Waits (bounded) until `n` marker files with the prefix exist.
  bool WaitForGroups(const std::string& prefix, size_t n) {
    for (int i = 0; i < 1000; ++i) {
      if (Groups(prefix).size() >= n) return true;
      std::this_thread::sleep_for(milliseconds(10));
    }
    return false;
  }
};

// The records of job.sh: its own process group id in shared/pgid.S.W.
constexpr const char* kRecordGroup =
    "cut -d' ' -f5 /proc/$$/stat > \"$SHARED/pgid.$MEGASCALE_SLICE_ID."
    "$TPU_WORKER_ID.tmp\" && mv \"$SHARED/pgid.$MEGASCALE_SLICE_ID."
    "$TPU_WORKER_ID.tmp\" \"$SHARED/pgid.$MEGASCALE_SLICE_ID."
    "$TPU_WORKER_ID\"\n";

TEST_F(RunEndToEndTest, AFailingWorkerStopsTheOthersAndGivesItsExitCode) {
  // Slice 1 worker 0 fails with 7 once every worker has started; the others
  // sleep until stopped.
  WriteScript("job.sh", std::string("SHARED=$1\n") + kRecordGroup +
                            "echo \"output of $MEGASCALE_SLICE_ID."
                            "$TPU_WORKER_ID in $(basename $PWD)\"\n"
                            "if [ $MEGASCALE_SLICE_ID.$TPU_WORKER_ID = 1.0 ];"
                            " then\n"
                            "  for i in $(seq 400); do\n"
                            "    [ $(ls $SHARED | grep -c '^pgid\\.[0-9]*\\."
                            "[0-9]*$') -ge 4 ] && break; sleep 0.05\n"
                            "  done\n"
                            "  echo failing now; exit 7\n"
                            "fi\n"
                            "exec sleep 300\n");
  const auto start = std::chrono::steady_clock::now();
  auto [code, out] = cluster_.Run(
      {"run", "--qr", "qr", "--script_dir", scripts(), "--run_name", "fail",
       "--command", "bash job.sh " + shared()},
      here());
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::printf("run with one failing worker of 4 returned after %.2f s\n", took);
  EXPECT_EQ(code, 7) << out;
  EXPECT_NE(out.find("slice 1 worker 0 failed with exit code 7"),
            std::string::npos)
      << out;
  // Slice 0 worker 0's output is echoed.
  EXPECT_NE(out.find("output of 0.0 in fail\n"), std::string::npos) << out;
  // No process of any worker's command is left.
  const std::vector<std::string> groups = Groups("pgid.");
  EXPECT_EQ(groups.size(), 4u);
  for (const std::string& g : groups) EXPECT_FALSE(GroupAlive(g)) << g;
  // Each file holds that worker's own output and no other's.
  for (int slice = 0; slice < 2; ++slice) {
    for (int worker = 0; worker < 2; ++worker) {
      const std::string text = ReadWholeFile(OutputFile("fail", slice, worker));
      const std::string own =
          std::to_string(slice) + "." + std::to_string(worker);
      EXPECT_NE(text.find("output of " + own + " in fail\n"), std::string::npos)
          << own << ": " << text;
      EXPECT_EQ(text.find("output of ", text.find("output of ") + 1),
                std::string::npos)
          << own << ": " << text;
      EXPECT_EQ(text.find("failing now") != std::string::npos, own == "1.0")
          << own << ": " << text;
    }
  }
}

TEST_F(RunEndToEndTest, SucceedsThenRerunsWithTheExistingFolder) {
  WriteScript("job.sh",
              "echo \"hello from $MEGASCALE_SLICE_ID.$TPU_WORKER_ID run "
              "$MULTISLICE_RUN_NAME\"; cat data.txt\n");
  WriteScript("data.txt", "first copy\n");
  auto [code, out] =
      cluster_.Run({"run", "--qr", "qr", "--script_dir", scripts(),
                    "--run_name", "ok", "--command", "bash job.sh"},
                   here());
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("completed 4/4"), std::string::npos) << out;
  for (int slice = 0; slice < 2; ++slice) {
    for (int worker = 0; worker < 2; ++worker) {
      EXPECT_EQ(ReadWholeFile(OutputFile("ok", slice, worker)),
                "hello from " + std::to_string(slice) + "." +
                    std::to_string(worker) + " run ok\nfirst copy\n");
    }
  }

  // The rerun copies nothing: the workers still have the first copy.
  WriteScript("data.txt", "second copy\n");
  auto [again, again_out] = cluster_.Run(
      {"run", "--qr", "qr", "--run_name", "ok", "--use_existing_folder",
       "--command", "bash job.sh; echo again"},
      here());
  EXPECT_EQ(again, 0) << again_out;
  for (int slice = 0; slice < 2; ++slice) {
    for (int worker = 0; worker < 2; ++worker) {
      EXPECT_EQ(ReadWholeFile(OutputFile("ok", slice, worker)),
                "hello from " + std::to_string(slice) + "." +
                    std::to_string(worker) + " run ok\nfirst copy\nagain\n");
    }
  }

  // A folder that was never copied: one line, exit 1.
  auto [missing, missing_out] =
      cluster_.Run({"run", "--qr", "qr", "--run_name", "never",
                    "--use_existing_folder", "--command", "true"},
                   here());
  EXPECT_EQ(missing, 1) << missing_out;
  EXPECT_NE(missing_out.find("--use_existing_folder needs an earlier run"),
            std::string::npos)
      << missing_out;
}

TEST_F(RunEndToEndTest, StopsAnEarlierRunAndAnswersCtrlC) {
  // A runner killed with SIGKILL leaves its commands running on the agents.
  WriteScript("job.sh", std::string("SHARED=$1; TAG=$2\n") +
                            "cut -d' ' -f5 /proc/$$/stat > "
                            "\"$SHARED/$TAG.$MEGASCALE_SLICE_ID."
                            "$TPU_WORKER_ID.tmp\"\n"
                            "mv \"$SHARED/$TAG.$MEGASCALE_SLICE_ID."
                            "$TPU_WORKER_ID.tmp\" \"$SHARED/$TAG."
                            "$MEGASCALE_SLICE_ID.$TPU_WORKER_ID\"\n"
                            "exec sleep 300\n");
  auto first = cluster_.Spawn(
      {"run", "--qr", "qr", "--script_dir", scripts(), "--run_name", "first",
       "--command", "bash job.sh " + shared() + " first"},
      here());
  ASSERT_TRUE(WaitForGroups("first.", 4)) << first->Output();
  first->Signal(SIGKILL);
  EXPECT_EQ(first->Wait(seconds(10)), 128 + SIGKILL);
  for (const std::string& g : Groups("first.")) EXPECT_TRUE(GroupAlive(g));

  // The next run stops them before it starts; Ctrl-C stops its own.
  auto second = cluster_.Spawn(
      {"run", "--tpu_prefix", "qr", "--script_dir", scripts(), "--run_name",
       "second", "--command", "bash job.sh " + shared() + " second"},
      here());
  ASSERT_TRUE(WaitForGroups("second.", 4)) << second->Output();
  for (const std::string& g : Groups("first.")) EXPECT_FALSE(GroupAlive(g));
  second->Signal(SIGINT);
  EXPECT_EQ(second->Wait(seconds(30)), 130) << second->Output();
  EXPECT_NE(second->Output().find("interrupted; stopped the commands of 4"),
            std::string::npos)
      << second->Output();
  for (const std::string& g : Groups("second.")) EXPECT_FALSE(GroupAlive(g));
}

TEST_F(RunEndToEndTest, MaxTextSpellingsFromTheCurrentDirectoryShipNoOutput) {
  // The current directory as the script directory (README's `--script_dir
  // .`), holding an earlier run's output of the old layout and a
  // controller's data directory: neither, nor this run's own output folder,
  // reaches the workers.
  std::ofstream(here() + "/job.sh")
      << "find . -name 'output_slice_*' -o -name agent-token -o -name "
         "'.multislice-output' | sort > found.txt\n"
         "echo \"found $(wc -l < found.txt) in $(basename $PWD)\"\n";
  std::filesystem::create_directories(here() + "/old-run");
  std::ofstream(here() + "/old-run/output_slice_0000_worker_0000.txt") << "x";
  std::filesystem::create_directories(here() + "/ctl");
  std::ofstream(here() + "/ctl/agent-token") << "secret";
  for (const std::string run : {"first", "second"}) {
    auto [code, out] = cluster_.Run(
        {"run", "--TPU_PREFIX=qr", "--SCRIPT_DIR", ".", "--RUN_NAME=" + run,
         "--COMMAND", "bash job.sh", "--ZONE", "local-a"},
        here());
    EXPECT_EQ(code, 0) << out;
    EXPECT_NE(out.find("multislice run: packed .: "), std::string::npos) << out;
    EXPECT_NE(out.find("(output in runs/" + run + "/)"), std::string::npos)
        << out;
    EXPECT_EQ(ReadWholeFile(OutputFile(run, 1, 1)), "found 0 in " + run + "\n");
  }
  // --zone is a filter: another zone has no such queued resource.
  auto [elsewhere, elsewhere_out] =
      cluster_.Run({"run", "--TPU_PREFIX", "qr", "--zone", "other-zone",
                    "--command", "true"},
                   here());
  EXPECT_EQ(elsewhere, 1) << elsewhere_out;
  EXPECT_EQ(elsewhere_out,
            "multislice run: --TPU_PREFIX: no queued resource of project "
            "local in zone other-zone has nodes named qr-0, qr-1, ... or "
            "qr\n");
}

TEST_F(RunEndToEndTest, ATooLargeScriptDirIsRefusedBeforePacking) {
  std::ofstream(scripts() + "/job.sh") << "true\n";
  std::ofstream(scripts() + "/big.bin").close();
  std::filesystem::resize_file(scripts() + "/big.bin", 300ull << 20);
  const auto start = std::chrono::steady_clock::now();
  auto [code, out] = cluster_.Run(
      {"run", "--qr", "qr", "--script_dir", scripts(), "--command", "true"},
      here());
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(10));
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--script_dir: " + scripts() +
                     " holds 300 MiB in 2 files to pack (big.bin 300 MiB"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find('\n'), out.size() - 1) << out;
}

TEST_F(RunEndToEndTest, BadFlagsAndAnUnreachableControllerAreOneLine) {
  testing::CliProcess bad(
      {MULTISLICE_BINARY, "run", "--qr", "qr", "--command", "true",
       "--run_name", "a/b", "--controller", cluster_.url(), "--token-file",
       cluster_.token_file()},
      dir_.path() + "/bad.log", here());
  EXPECT_EQ(bad.Wait(seconds(30)), 2);
  EXPECT_EQ(bad.Output(),
            "multislice run: --run_name: 'a/b' is not 1 to 100 of "
            "[A-Za-z0-9._-] starting with a letter or digit\n");
  // An upper-case spelling is named as typed.
  testing::CliProcess empty(
      {MULTISLICE_BINARY, "run", "--qr", "qr", "--COMMAND", "", "--controller",
       cluster_.url(), "--token-file", cluster_.token_file()},
      dir_.path() + "/empty.log", here());
  EXPECT_EQ(empty.Wait(seconds(30)), 2);
  EXPECT_EQ(empty.Output(),
            "multislice run: --COMMAND: expected the command to run on every "
            "worker\n");
  testing::CliProcess down({MULTISLICE_BINARY, "run", "--qr", "qr", "--command",
                            "true", "--controller", "http://127.0.0.1:1",
                            "--token-file", cluster_.token_file()},
                           dir_.path() + "/down.log", here());
  EXPECT_EQ(down.Wait(seconds(30)), 1);
  const std::string text = down.Output();
  EXPECT_EQ(text.find('\n'), text.size() - 1) << text;
  EXPECT_NE(text.find("cannot reach http://127.0.0.1:1"), std::string::npos)
      << text;
}

}  // namespace
}  // namespace multislice::control
