#include "runtime/launcher.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>

namespace multislice::runtime {
namespace {

using Clock = std::chrono::steady_clock;

WorkerProcess Shell(const std::string& script, const std::string& prefix) {
  return WorkerProcess{{"/bin/sh", "-c", script}, {"GREETING=hi"}, prefix};
}

class CapturedOutput {
 public:
  CapturedOutput() {
    char name[] = "/tmp/launcher-test-XXXXXX";
    fd_ = ::mkstemp(name);
    path_ = name;
  }
  ~CapturedOutput() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  int fd() const { return fd_; }
  std::string Read() const {
    std::ifstream in(path_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  int fd_;
  std::string path_;
};

TEST(LauncherTest, PrefixesEveryLineAndPassesTheEnvironment) {
  CapturedOutput out, err;
  LaunchOptions options;
  options.workers = {Shell("echo one; echo $GREETING; printf tail", "[a] "),
                     Shell("echo oops >&2", "[b] ")};
  options.out_fd = out.fd();
  options.err_fd = err.fd();
  LaunchResult result = RunWorkers(options);
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_EQ(result.failed_worker, -1);
  EXPECT_EQ(out.Read(), "[a] one\n[a] hi\n[a] tail\n");
  EXPECT_EQ(err.Read(), "[b] oops\n");
}

TEST(LauncherTest, StdoutCanBeRelayedWithoutThePrefix) {
  CapturedOutput out, err;
  LaunchOptions options;
  options.workers = {Shell("echo '{\"a\": 1}'; echo note >&2", "[a] ")};
  options.workers[0].prefix_stdout = false;
  options.out_fd = out.fd();
  options.err_fd = err.fd();
  EXPECT_EQ(RunWorkers(options).exit_code, 0);
  EXPECT_EQ(out.Read(), "{\"a\": 1}\n");
  EXPECT_EQ(err.Read(), "[a] note\n");
}

// A hung (stopped) worker ends on the stop's SIGTERM, not after the grace.
TEST(LauncherTest, AStoppedWorkerIsEndedWithoutWaitingForTheGrace) {
  CapturedOutput out, err;
  LaunchOptions options;
  options.workers = {Shell("kill -STOP $$; sleep 30", "[a] "),
                     Shell("sleep 0.3; exit 3", "[b] ")};
  options.out_fd = out.fd();
  options.err_fd = err.fd();
  options.stop_grace = std::chrono::seconds(30);
  const auto start = Clock::now();
  LaunchResult result = RunWorkers(options);
  EXPECT_EQ(result.exit_code, 3);
  EXPECT_EQ(result.failed_worker, 1);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
}

TEST(LauncherTest, FirstFailureStopsTheOthersAndIsReturned) {
  CapturedOutput out, err;
  LaunchOptions options;
  options.workers = {Shell("sleep 30", "[a] "), Shell("exit 3", "[b] "),
                     Shell("sleep 30", "[c] ")};
  options.out_fd = out.fd();
  options.err_fd = err.fd();
  auto start = Clock::now();
  LaunchResult result = RunWorkers(options);
  EXPECT_EQ(result.exit_code, 3);
  EXPECT_EQ(result.failed_worker, 1);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
}

// RunWorkers with its output captured, which must end within 10 s.
LaunchResult RunWithin10s(LaunchOptions& options, CapturedOutput& out,
                          CapturedOutput& err) {
  options.out_fd = out.fd();
  options.err_fd = err.fd();
  const auto start = Clock::now();
  LaunchResult result = RunWorkers(options);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  return result;
}

// With failure domains, a failed worker stops only its domain: the other
// worker of it is killed, both are reported gone (the failed one last), and
// the other domain finishes on its own (exit 0). Losing the last domain
// stops everyone and returns the first loss as the cause.
TEST(LauncherTest, AFailedDomainStopsAloneAndTheOthersFinish) {
  CapturedOutput out, err;
  LaunchOptions options;
  options.workers = {Shell("sleep 1; echo done", "[0] "),
                     Shell("sleep 30", "[1a] "), Shell("exit 3", "[1b] ")};
  options.domains = {0, 1, 1};
  std::vector<int> gone;
  options.on_gone = [&](int worker, int) { gone.push_back(worker); };
  LaunchResult result = RunWithin10s(options, out, err);
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_EQ(gone, (std::vector<int>{1, 2}));
  EXPECT_EQ(result.lost_workers, (std::vector<int>{1, 2}));
  EXPECT_EQ(out.Read(), "[0] done\n");

  options.workers = {Shell("sleep 0.5; exit 4", "[0] "),
                     Shell("exit 3", "[1] ")};
  options.domains = {0, 1};
  gone.clear();
  result = RunWorkers(options);
  EXPECT_EQ(result.exit_code, 3);
  EXPECT_EQ(result.failed_worker, 1);
  EXPECT_EQ(gone, (std::vector<int>{1}));
}

// A lost domain is started again once both its workers are reaped, each
// told its start number; its second loss is recorded with that number, and
// with the restarts spent it stays lost while the other domain finishes.
TEST(LauncherTest, ALostDomainIsStartedAgainWithItsIncarnation) {
  CapturedOutput out, err;
  LaunchOptions options;
  const std::string said = "echo \"start ${MULTISLICE_INCARNATION:-0}\"; ";
  options.workers = {Shell("sleep 2; echo done", "[0] "),
                     Shell(said + "sleep 30", "[1a] "),
                     Shell(said + "sleep 0.1; exit 3", "[1b] ")};
  options.domains = {0, 1, 1};
  options.domain_restarts = 1;
  std::vector<std::pair<int, int>> gone;
  options.on_gone = [&](int worker, int incarnation) {
    gone.emplace_back(worker, incarnation);
  };
  LaunchResult result = RunWithin10s(options, out, err);
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_EQ(gone,
            (std::vector<std::pair<int, int>>{{1, 0}, {2, 0}, {1, 1}, {2, 1}}));
  EXPECT_EQ(result.restarted_domains, (std::vector<int>{1}));
  const std::string lines = out.Read();
  for (const char* line : {"[1a] start 0\n", "[1b] start 0\n", "[1a] start 1\n",
                           "[1b] start 1\n", "[0] done\n"}) {
    EXPECT_NE(lines.find(line), std::string::npos) << line << lines;
  }
  EXPECT_EQ(lines.find("start 2"), std::string::npos) << lines;
}

TEST(LauncherTest, WorkersThatIgnoreSigtermAreKilledAfterTheGrace) {
  CapturedOutput out, err;
  LaunchOptions options;
  options.workers = {Shell("trap '' TERM; sleep 30 & wait; sleep 30", "[a] "),
                     Shell("sleep 0.2; exit 5", "[b] ")};
  options.stop_grace = std::chrono::milliseconds(500);
  options.out_fd = out.fd();
  options.err_fd = err.fd();
  auto start = Clock::now();
  LaunchResult result = RunWorkers(options);
  EXPECT_EQ(result.exit_code, 5);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
}

TEST(LauncherTest, WorkerKilledBySignalReports128PlusSignal) {
  CapturedOutput out, err;
  LaunchOptions options;
  options.workers = {Shell("kill -9 $$", "[a] ")};
  options.out_fd = out.fd();
  options.err_fd = err.fd();
  EXPECT_EQ(RunWorkers(options).exit_code, 128 + 9);
}

// A worker killed by a signal is reported even when a peer exited 1 just
// before it was reaped (the peer saw the lost connection first); one that
// ends by itself well after the others were stopped is not.
TEST(LauncherTest, AKilledWorkerIsTheCauseOverAPeerThatExitedFirst) {
  CapturedOutput out, err;
  LaunchOptions options;
  options.workers = {Shell("sleep 0.05; exit 1", "[a] "),
                     Shell("trap '' TERM; sleep 0.15; kill -9 $$", "[b] ")};
  options.out_fd = out.fd();
  options.err_fd = err.fd();
  LaunchResult result = RunWorkers(options);
  EXPECT_EQ(result.exit_code, 128 + 9);
  EXPECT_EQ(result.failed_worker, 1);

  options.workers = {Shell("exit 1", "[a] "),
                     Shell("trap '' TERM; sleep 1; kill -9 $$", "[b] ")};
  options.cause_window = std::chrono::milliseconds(100);
  result = RunWorkers(options);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.failed_worker, 0);
}

}  // namespace
}  // namespace multislice::runtime
