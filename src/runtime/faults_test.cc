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
#include <memory>
#include <sstream>
#include <thread>

#include "runtime/comm/dcn/store.h"
#include "runtime/runtime.h"
#include "runtime/test_support.h"

extern char** environ;

namespace multislice::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// Worker: all-reduces over every device (data across slices, fsdp across
// the hosts of a slice) in a loop until killed or `seconds` have passed;
// prints "ready" after the first one. 64 MiB per device on one host per
// slice, 16 MiB when a slice has several.
int WorkerMain(int argc, char** argv) {
  if (argc != 3) return 2;
  const int timeout_seconds = std::atoi(argv[2]);
  auto env = ReadWorkerEnv(ProcessEnvironment());
  if (!env.ok() || !env->has_value()) return 2;
  RuntimeOptions options;
  options.env = **env;
  options.parallelism.ici[mesh::kFsdp] = -1;
  options.parallelism.dcn[mesh::kData] = -1;
  options.timeout = std::chrono::seconds(timeout_seconds);
  auto rt = Runtime::Create(options);
  if (!rt.ok()) {
    std::fprintf(stderr, "multislice: %s: %s\n", options.env.name().c_str(),
                 rt.status().message().c_str());
    return ExitCodeFor(rt.status());
  }
  const size_t count =
      (*rt)->accelerator().hosts_per_slice() > 1 ? 4 << 20 : 16 << 20;
  Status s = (*rt)->RunOnDevices([&](int local) -> Status {
    std::vector<float> buf(count, 1.0f);
    auto start = Clock::now();
    for (int i = 0; Clock::now() - start < std::chrono::seconds(120); ++i) {
      RETURN_IF_ERROR((*rt)
                          ->collectives(local)
                          .AllReduce({"data", "fsdp"}, buf.data(), buf.data(),
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
    const std::string id =
        std::to_string(env.slice_id) + "." + std::to_string(env.worker_id);
    out_ = dir + "/out" + id;
    err_ = dir + "/err" + id;
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

WorkerEnv Env(const std::string& store, int slice, int attempt,
              const std::string& type = "cpu-1", int worker = 0) {
  WorkerEnv env;
  env.coordinator_address = "file://" + store;
  env.num_slices = 2;
  env.slice_id = slice;
  env.worker_id = worker;
  env.accelerator_type = type;
  env.worker_hostnames.assign(HostsPerSlice(type), "127.0.0.1");
  env.run_id = "faults";
  env.attempt = attempt;
  return env;
}

// The four workers of 2 slices of v4-16 (2 hosts of 4 devices each).
std::vector<std::unique_ptr<Worker>> TwoSlicesOfTwoHosts(const std::string& dir,
                                                         int timeout) {
  std::vector<std::unique_ptr<Worker>> workers;
  for (int slice = 0; slice < 2; ++slice) {
    for (int host = 0; host < 2; ++host) {
      workers.push_back(std::make_unique<Worker>(
          Env(dir, slice, 0, "v4-16", host), dir, timeout));
    }
  }
  return workers;
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
  EXPECT_NE(err.find("all_reduce[data,fsdp]"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

// Slices of two hosts: kill -9 of one host's worker (slice 0 worker 1) in
// the middle of an all-reduce that crosses hosts and slices. Each of the
// three others exits 1 within the timeout with one line that names it and
// the collective.
TEST(FaultsTest, KilledHostOfAMultiHostSliceEndsEveryOtherWorker) {
  TempDir dir;
  const int timeout = 10;
  auto workers = TwoSlicesOfTwoHosts(dir.path(), timeout);
  Worker& victim = *workers[1];
  for (auto& w : workers) {
    ASSERT_TRUE(w->WaitForOutput("ready", std::chrono::seconds(60)))
        << w->err();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(::kill(victim.pid(), SIGKILL), 0);
  const auto killed_at = Clock::now();
  EXPECT_EQ(victim.WaitForExit(std::chrono::seconds(10)), 128 + SIGKILL);
  for (size_t i : {0, 2, 3}) {
    EXPECT_EQ(workers[i]->WaitForExit(std::chrono::seconds(timeout + 5)), 1)
        << "worker " << i;
    const std::string err = workers[i]->err();
    std::printf("worker %zu: %s", i, err.c_str());
    EXPECT_NE(err.find("slice 0 worker 1"), std::string::npos)
        << "worker " << i << ": " << err;
    EXPECT_NE(err.find("all_reduce[data,fsdp]"), std::string::npos) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
  EXPECT_LT(Clock::now() - killed_at, std::chrono::seconds(timeout));
}

// Slices of two hosts: SIGSTOP of one host (slice 1 worker 0). Each of the
// others exits 1 within the timeout naming it; nothing hangs.
TEST(FaultsTest, StoppedHostOfAMultiHostSliceTimesOutEveryOtherWorker) {
  TempDir dir;
  const int timeout = 4;
  auto workers = TwoSlicesOfTwoHosts(dir.path(), timeout);
  Worker& victim = *workers[2];
  for (auto& w : workers) {
    ASSERT_TRUE(w->WaitForOutput("ready", std::chrono::seconds(60)))
        << w->err();
  }
  ASSERT_EQ(::kill(victim.pid(), SIGSTOP), 0);
  const auto stopped_at = Clock::now();
  for (size_t i : {0, 1, 3}) {
    EXPECT_EQ(workers[i]->WaitForExit(std::chrono::seconds(timeout + 10)), 1)
        << "worker " << i;
    const std::string err = workers[i]->err();
    std::printf("worker %zu: %s", i, err.c_str());
    EXPECT_NE(err.find("slice 1 worker 0"), std::string::npos)
        << "worker " << i << ": " << err;
  }
  EXPECT_LT(Clock::now() - stopped_at, std::chrono::seconds(timeout + 5));
  ::kill(victim.pid(), SIGKILL);
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
  EXPECT_NE(err.find("all_reduce[data,fsdp]"), std::string::npos) << err;
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
