#include "control/process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/temp_dir.h"

namespace multislice::control {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Waits (bounded) until `path` exists and is non-empty.
bool WaitForFile(const std::string& path, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!ReadFile(path).empty()) return true;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return false;
}

class ProcessTest : public ::testing::Test {
 protected:
  std::unique_ptr<ProcessGroup> Start(ProcessSpec spec) {
    auto group = launcher_->Start(spec);
    EXPECT_TRUE(group.ok()) << group.status().message();
    return group.ok() ? std::move(group).value() : nullptr;
  }
  std::string Path(const std::string& name) { return dir_.path() + "/" + name; }

  TempDir dir_{"process-test-"};
  std::unique_ptr<ProcessLauncher> launcher_ = NewProcessLauncher();
};

// Fencing (issue 12, defect 6): a worker whose lease lapses is killed by its
// guardian, grandchildren included, without any help from the agent (which
// may be frozen); one whose lease is renewed keeps running.
TEST_F(ProcessTest, GuardianKillsTheGroupWhenItsLeaseLapses) {
  const std::string lease = Path("lease");
  ASSERT_TRUE(WriteLease(lease, BootTimeNs() + 2'000'000'000LL).ok());
  ProcessSpec renewed{{"/bin/bash", "-c", "sleep 30 & wait"}, {}, "", "", ""};
  renewed.lease_path = lease;
  auto kept = Start(renewed);
  const std::string short_lease = Path("short-lease");
  ASSERT_TRUE(WriteLease(short_lease, BootTimeNs() + 600'000'000LL).ok());
  ProcessSpec lapsing{
      {"/bin/bash", "-c", "sleep 30 & echo $! > " + Path("child") + "; wait"},
      {},
      "",
      "",
      ""};
  lapsing.lease_path = short_lease;
  const auto started = std::chrono::steady_clock::now();
  auto fenced = Start(lapsing);
  ASSERT_NE(kept, nullptr);
  ASSERT_NE(fenced, nullptr);
  ASSERT_TRUE(WaitForFile(Path("child"), seconds(5)));
  const int grandchild = std::stoi(ReadFile(Path("child")));
  // Renew the first lease while the second lapses.
  for (int i = 0; i < 15; ++i) {
    ASSERT_TRUE(WriteLease(lease, BootTimeNs() + 1'000'000'000LL).ok());
    std::this_thread::sleep_for(milliseconds(100));
  }
  ProcessState s = fenced->Wait(seconds(5));
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - started)
                        .count();
  EXPECT_FALSE(s.running);
  EXPECT_EQ(s.signal, SIGKILL);
  EXPECT_GE(ms, 600);
  EXPECT_FALSE(ProcessGroupAlive(fenced->pid()));
  EXPECT_NE(::kill(grandchild, 0), 0) << "the grandchild outlived the lease";
  EXPECT_TRUE(kept->Poll().running) << "a renewed lease was fenced";
  ASSERT_TRUE(kept->Stop(milliseconds(100)).ok());
  // A lease file that cannot be read counts as lapsed.
  ProcessSpec unreadable{{"/bin/sleep", "30"}, {}, "", "", ""};
  unreadable.lease_path = Path("no-such-lease");
  auto orphan = Start(unreadable);
  ASSERT_NE(orphan, nullptr);
  EXPECT_FALSE(orphan->Wait(seconds(5)).running);
}

TEST_F(ProcessTest, ReportsExitCode) {
  auto group = Start({{"/bin/bash", "-c", "exit 7"}, {}, "", "", ""});
  ASSERT_NE(group, nullptr);
  ProcessState s = group->Wait(seconds(10));
  EXPECT_FALSE(s.running);
  EXPECT_EQ(s.exit_code, 7);
  EXPECT_EQ(s.signal, 0);
  EXPECT_EQ(s.ShellExitCode(), 7);
  auto stopped = group->Stop(milliseconds(100));
  ASSERT_TRUE(stopped.ok());
  EXPECT_TRUE(stopped->group_gone);
}

TEST_F(ProcessTest, ReportsSignal) {
  auto group =
      Start({{"/bin/bash", "-c", "kill -USR1 $$; sleep 5"}, {}, "", "", ""});
  ASSERT_NE(group, nullptr);
  ProcessState s = group->Wait(seconds(10));
  EXPECT_FALSE(s.running);
  EXPECT_EQ(s.signal, SIGUSR1);
  EXPECT_EQ(s.ShellExitCode(), 128 + SIGUSR1);
}

TEST_F(ProcessTest, AppliesEnvironmentAndDirectoryAndOwnGroup) {
  ProcessSpec spec;
  spec.argv = {"bash", "-c",
               "echo \"$GREETING $(pwd) $(ps -o pgid= -p $$ | tr -d ' ') "
               "$(ps -o sid= -p $$ | tr -d ' ')\""};
  spec.env = {"GREETING=hello", "PATH=/usr/bin:/bin"};
  spec.directory = dir_.path();
  spec.log_path = Path("out.log");
  auto group = Start(spec);
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->Wait(seconds(10)).exit_code, 0);
  // The program runs in a session and group of its own, led by pid().
  const std::string pid = std::to_string(group->pid());
  EXPECT_EQ(ReadFile(spec.log_path),
            "hello " + dir_.path() + " " + pid + " " + pid + "\n");
}

// A process that starts a group and is then killed with SIGKILL, as an agent
// can be: the whole group, grandchildren included, must die with it.
TEST_F(ProcessTest, GroupDiesWithTheProcessThatStartedIt) {
  const std::string child_file = Path("child");
  const std::string group_file = Path("group");
  pid_t starter = ::fork();
  ASSERT_GE(starter, 0);
  if (starter == 0) {
    auto launcher = NewProcessLauncher();
    auto group = launcher->Start({{"/bin/bash", "-c",
                                   "sleep 100 & echo $! > child.tmp; "
                                   "mv child.tmp child; sleep 100"},
                                  {},
                                  dir_.path(),
                                  "",
                                  ""});
    if (!group.ok()) ::_exit(1);
    std::ofstream(group_file) << (*group)->pid() << "\n";
    ::pause();
    ::_exit(0);
  }
  ASSERT_TRUE(WaitForFile(child_file, seconds(10)));
  ASSERT_TRUE(WaitForFile(group_file, seconds(10)));
  const pid_t pgid = std::stoi(ReadFile(group_file));
  EXPECT_TRUE(ProcessGroupAlive(pgid));
  ::kill(starter, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(starter, &status, 0), starter);
  const auto deadline = std::chrono::steady_clock::now() + seconds(5);
  while (ProcessGroupAlive(pgid) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_FALSE(ProcessGroupAlive(pgid));
  // The orphans were reparented to this test (a subreaper): reap them.
  while (::waitpid(-pgid, &status, WNOHANG) > 0) {
  }
}

TEST_F(ProcessTest, AppendsLogAcrossAttemptsWithStderr) {
  ProcessSpec spec{
      {"/bin/bash", "-c", "echo out; echo err >&2"}, {}, "", Path("w.log"), ""};
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto group = Start(spec);
    ASSERT_NE(group, nullptr);
    EXPECT_EQ(group->Wait(seconds(10)).exit_code, 0);
  }
  EXPECT_EQ(ReadFile(spec.log_path), "out\nerr\nout\nerr\n");
}

TEST_F(ProcessTest, StopEndsGroupWithGrandchildren) {
  ProcessSpec spec{
      {"/bin/bash", "-c", "sleep 100 & echo $! > child; sleep 100"},
      {},
      dir_.path(),
      "",
      ""};
  auto group = Start(spec);
  ASSERT_NE(group, nullptr);
  ASSERT_TRUE(WaitForFile(Path("child"), seconds(10)));
  const pid_t grandchild = std::stoi(ReadFile(Path("child")));
  EXPECT_EQ(::kill(grandchild, 0), 0);
  const auto start = std::chrono::steady_clock::now();
  auto stopped = group->Stop(seconds(5));
  ASSERT_TRUE(stopped.ok()) << stopped.status().message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(4));
  EXPECT_TRUE(stopped->group_gone);
  EXPECT_FALSE(stopped->running);
  EXPECT_EQ(stopped->signal, SIGTERM);
  EXPECT_FALSE(ProcessGroupAlive(group->pid()));
  // The grandchild is gone (reaped here as the subreaper, not a zombie).
  EXPECT_EQ(::kill(grandchild, 0), -1);
}

TEST_F(ProcessTest, StopKillsGroupAfterLeaderExited) {
  // The leader exits at once and leaves a background child in the group.
  ProcessSpec spec{{"/bin/bash", "-c", "sleep 100 & echo $! > child"},
                   {},
                   dir_.path(),
                   "",
                   ""};
  auto group = Start(spec);
  ASSERT_NE(group, nullptr);
  ASSERT_TRUE(WaitForFile(Path("child"), seconds(10)));
  ProcessState s = group->Wait(seconds(10));
  EXPECT_FALSE(s.running);
  EXPECT_EQ(s.exit_code, 0);
  EXPECT_FALSE(group->Poll().group_gone);
  auto stopped = group->Stop(seconds(5));
  ASSERT_TRUE(stopped.ok()) << stopped.status().message();
  EXPECT_TRUE(stopped->group_gone);
  EXPECT_EQ(::kill(std::stoi(ReadFile(Path("child"))), 0), -1);
}

TEST_F(ProcessTest, KillsTermIgnoringGroupAfterGrace) {
  ProcessSpec spec{
      {"/bin/bash", "-c",
       "trap '' TERM; echo ready > ready; while :; do sleep 0.05; done"},
      {},
      dir_.path(),
      "",
      ""};
  auto group = Start(spec);
  ASSERT_NE(group, nullptr);
  ASSERT_TRUE(WaitForFile(Path("ready"), seconds(10)));
  const auto start = std::chrono::steady_clock::now();
  auto stopped = group->Stop(milliseconds(300));
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(stopped.ok()) << stopped.status().message();
  EXPECT_EQ(stopped->signal, SIGKILL);
  EXPECT_TRUE(stopped->group_gone);
  EXPECT_GE(took, milliseconds(300));
  EXPECT_LT(took, seconds(3));
}

TEST_F(ProcessTest, StopFromAnotherThreadWhilePolling) {
  auto group = Start({{"/bin/sleep", "100"}, {}, "", "", ""});
  ASSERT_NE(group, nullptr);
  std::thread poller([&] {
    for (int i = 0; i < 200 && group->Poll().running; ++i) {
      std::this_thread::sleep_for(milliseconds(2));
    }
  });
  auto stopped = group->Stop(seconds(2));
  poller.join();
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->signal, SIGTERM);
}

TEST_F(ProcessTest, MissingProgramExits127AndBadDirectoryFails) {
  auto group = Start({{"no-such-program-xyz"}, {}, "", Path("e.log"), ""});
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->Wait(seconds(10)).exit_code, 127);
  EXPECT_NE(ReadFile(Path("e.log")).find("cannot execute"), std::string::npos);

  auto bad = launcher_->Start({{"/bin/true"}, {}, Path("missing-dir"), "", ""});
  EXPECT_FALSE(bad.ok());
  auto bad_log =
      launcher_->Start({{"/bin/true"}, {}, "", Path("missing-dir/x.log"), ""});
  EXPECT_FALSE(bad_log.ok());
}

}  // namespace
}  // namespace multislice::control
