// Failures between workers: a peer killed with SIGKILL in the middle of a
// large all-reduce, a peer that stops answering (SIGSTOP), and a worker of a
// stale restart attempt. The survivors must print one line naming the peer
// and the collective, and exit 1 within the timeout; nothing may hang.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "runtime/comm/dcn/store.h"
#include "runtime/runtime.h"
#include "runtime/test_support.h"

extern char** environ;

namespace multislice::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// Worker: all-reduces 64 MiB over the DCN axis in a loop until killed or
// `seconds` have passed; prints "ready" after the first one.
int WorkerMain(int argc, char** argv) {
  if (argc != 3) return 2;
  const int timeout_seconds = std::atoi(argv[2]);
  auto env = ReadWorkerEnv(ProcessEnvironment());
  if (!env.ok() || !env->has_value()) return 2;
  RuntimeOptions options;
  options.env = **env;
  options.parallelism.dcn = {-1, 1, 1};
  options.timeout = std::chrono::seconds(timeout_seconds);
  auto rt = Runtime::Create(options);
  if (!rt.ok()) {
    std::fprintf(stderr, "multislice: %s: %s\n", options.env.name().c_str(),
                 rt.status().message().c_str());
    return ExitCodeFor(rt.status());
  }
  Status s = (*rt)->RunOnDevices([&](int local) -> Status {
    std::vector<float> buf(16 << 20, 1.0f);
    auto start = Clock::now();
    for (int i = 0; Clock::now() - start < std::chrono::seconds(120); ++i) {
      RETURN_IF_ERROR((*rt)
                          ->collectives(local)
                          .AllReduce({"data"}, buf.data(), buf.data(),
                                     buf.size(), comm::DType::kF32,
                                     comm::ReduceOp::kSum, "fault-loop")
                          .Wait());
      if (i == 0) {
        std::printf("ready\n");
        std::fflush(stdout);
      }
    }
    return OkStatus();
  });
  return s.ok() ? 0 : 1;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// One worker process started by hand, as a person would on each machine.
class Worker {
 public:
  Worker(const WorkerEnv& env, const std::string& dir, int timeout_seconds) {
    out_ = dir + "/out" + std::to_string(env.slice_id);
    err_ = dir + "/err" + std::to_string(env.slice_id);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, 2, err_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) env_strings.push_back(*e);
    for (const std::string& kv : env.ToEnvironment()) env_strings.push_back(kv);
    std::vector<char*> envp;
    for (std::string& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string self = SelfExecutable(), flag = "--worker",
                timeout = std::to_string(timeout_seconds);
    char* argv[] = {self.data(), flag.data(), timeout.data(), nullptr};
    posix_spawn(&pid_, self.c_str(), &actions, nullptr, argv, envp.data());
    posix_spawn_file_actions_destroy(&actions);
  }
  ~Worker() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  std::string out() const { return ReadFile(out_); }
  std::string err() const { return ReadFile(err_); }

  bool WaitForOutput(const std::string& text, std::chrono::seconds limit) {
    auto end = Clock::now() + limit;
    while (Clock::now() < end) {
      if (out().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  // Exit code, or -1 if still running after `limit`.
  int WaitForExit(std::chrono::seconds limit) {
    auto end = Clock::now() + limit;
    while (Clock::now() < end) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::string out_, err_;
};

WorkerEnv Env(const std::string& store, int slice, int attempt) {
  WorkerEnv env;
  env.coordinator_address = "file://" + store;
  env.num_slices = 2;
  env.slice_id = slice;
  env.accelerator_type = "cpu-1";
  env.run_id = "faults";
  env.attempt = attempt;
  return env;
}

TEST(FaultsTest, KilledPeerMidAllReduceEndsTheSurvivorWithinTheTimeout) {
  TempDir dir;
  const int timeout = 10;
  Worker survivor(Env(dir.path(), 0, 0), dir.path(), timeout);
  Worker victim(Env(dir.path(), 1, 0), dir.path(), timeout);
  ASSERT_TRUE(victim.WaitForOutput("ready", std::chrono::seconds(60)))
      << victim.err();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(::kill(victim.pid(), SIGKILL), 0);
  auto killed_at = Clock::now();
  EXPECT_EQ(victim.WaitForExit(std::chrono::seconds(10)), 128 + SIGKILL);
  EXPECT_EQ(survivor.WaitForExit(std::chrono::seconds(timeout + 5)), 1);
  EXPECT_LT(Clock::now() - killed_at, std::chrono::seconds(timeout));
  const std::string err = survivor.err();
  EXPECT_NE(err.find("slice 0 worker 0"), std::string::npos) << err;
  EXPECT_NE(err.find("slice 1 worker 0"), std::string::npos) << err;
  EXPECT_NE(err.find("all_reduce[data]"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

TEST(FaultsTest, PeerThatStopsAnsweringTimesOut) {
  TempDir dir;
  const int timeout = 4;
  Worker survivor(Env(dir.path(), 0, 0), dir.path(), timeout);
  Worker victim(Env(dir.path(), 1, 0), dir.path(), timeout);
  ASSERT_TRUE(victim.WaitForOutput("ready", std::chrono::seconds(60)))
      << victim.err();
  ASSERT_EQ(::kill(victim.pid(), SIGSTOP), 0);
  auto stopped_at = Clock::now();
  EXPECT_EQ(survivor.WaitForExit(std::chrono::seconds(timeout + 10)), 1);
  EXPECT_LT(Clock::now() - stopped_at, std::chrono::seconds(timeout + 5));
  const std::string err = survivor.err();
  EXPECT_NE(err.find("slice 1 worker 0"), std::string::npos) << err;
  EXPECT_NE(err.find("all_reduce[data]"), std::string::npos) << err;
  ::kill(victim.pid(), SIGKILL);
}

TEST(FaultsTest, WorkerOfAStaleAttemptIsRefused) {
  TempDir dir;
  auto address = dcn::ParseStoreAddress("file://" + dir.path());
  ASSERT_TRUE(address.ok());
  ASSERT_TRUE(dcn::ClaimAttempt(*address, "faults", 2).ok());
  Worker stale(Env(dir.path(), 0, 1), dir.path(), 5);
  EXPECT_EQ(stale.WaitForExit(std::chrono::seconds(20)), 1);
  const std::string err = stale.err();
  EXPECT_NE(err.find("stale"), std::string::npos) << err;
  EXPECT_NE(err.find("attempt 2"), std::string::npos) << err;
}

}  // namespace
}  // namespace multislice::runtime

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--worker") {
    return multislice::runtime::WorkerMain(argc, argv);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
