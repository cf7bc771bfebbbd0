// Test support: a real `multislice controller --local-hosts N` (N
// `multislice agent` children on loopback) and bounded runs of the
// `multislice` binary against it, used by ssh_test and runner_test; and a
// loopback HTTP server for fake controllers (agent_test, ssh_test).
//
// Every process started here is reaped: the controller is stopped (with its
// agents and their process groups) by the destructor, and a CLI run that
// outlives its timeout is killed.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/temp_dir.h"
#include "control/http.h"
#include "control/process.h"

extern char** environ;

namespace multislice::control::testing {

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// An httplib::Server on a free loopback port, served by a thread from
// Listen() until the object goes (declare it after what its handlers use).
class LoopbackServer {
 public:
  ~LoopbackServer() {
    if (!thread_.joinable()) return;
    server_.stop();
    thread_.join();
  }
  httplib::Server& server() { return server_; }
  // Binds and serves; call once the routes are set.
  void Listen() {
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  std::string url() const {
    return "http://127.0.0.1:" + std::to_string(port_);
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

// One `multislice ...` process with its output (stdout and stderr) in a
// file; killed and reaped by the destructor if still running.
class CliProcess {
 public:
  // Starts `binary args...` in `cwd` (empty: ours).
  CliProcess(const std::vector<std::string>& argv, const std::string& log,
             const std::string& cwd)
      : log_(log) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    if (!cwd.empty())
      posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
    std::vector<char*> args;
    for (const std::string& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    if (posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ) !=
        0) {
      pid_ = -1;
    }
    posix_spawn_file_actions_destroy(&actions);
  }
  ~CliProcess() {
    if (pid_ > 0 && code_ == kRunning) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }
  CliProcess(const CliProcess&) = delete;
  CliProcess& operator=(const CliProcess&) = delete;

  pid_t pid() const { return pid_; }
  void Signal(int signal) {
    if (pid_ > 0 && code_ == kRunning) ::kill(pid_, signal);
  }
  // The exit code (128 + signal when a signal ended it), or -1 when it is
  // still running after `timeout` (it is then killed).
  int Wait(std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return -1;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (code_ == kRunning) {
      int status = 0;
      pid_t done = ::waitpid(pid_, &status, WNOHANG);
      if (done == pid_) {
        code_ =
            WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        code_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return code_;
  }
  std::string Output() const { return ReadWholeFile(log_); }

 private:
  static constexpr int kRunning = -1000;
  std::string log_;
  pid_t pid_ = -1;
  int code_ = kRunning;
};

// `multislice controller --port 0 --data-dir DIR/controller --local-hosts N
// --local-accelerator-type TYPE` for the life of the object.
class LocalController {
 public:
  LocalController(std::string binary, std::string dir)
      : binary_(std::move(binary)), dir_(std::move(dir)) {}
  ~LocalController() { Stop().ok(); }

  // Starts it and waits (bounded) for its "controller listening on URL".
  // `extra` flags go to the controller as well (e.g. --heartbeat-timeout).
  Status Start(int hosts, const std::string& accelerator_type,
               const std::vector<std::string>& extra = {}) {
    ProcessSpec spec;
    spec.argv = {binary_,
                 "controller",
                 "--port",
                 "0",
                 "--data-dir",
                 dir_ + "/controller",
                 "--local-hosts",
                 std::to_string(hosts),
                 "--local-accelerator-type",
                 accelerator_type};
    spec.argv.insert(spec.argv.end(), extra.begin(), extra.end());
    spec.log_path = dir_ + "/controller.log";
    ASSIGN_OR_RETURN(controller_, launcher_->Start(spec));
    const std::string marker = "controller listening on ";
    // 60 s: a loaded 2-core machine (CI with builds beside it) once took
    // over 15 s.
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (url_.empty() && std::chrono::steady_clock::now() < deadline) {
      std::string log = ReadWholeFile(spec.log_path);
      size_t at = log.find(marker);
      if (at != std::string::npos) {
        size_t end = log.find(' ', at + marker.size());
        if (end != std::string::npos) {
          url_ = log.substr(at + marker.size(), end - at - marker.size());
        }
      }
      if (url_.empty())
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (url_.empty()) {
      return DeadlineExceeded("the controller did not start: " +
                              ReadWholeFile(spec.log_path));
    }
    return OkStatus();
  }

  // Stops the controller (SIGTERM: it stops its agents, which stop their
  // process groups) and waits for its whole group to go.
  Status Stop() {
    if (!controller_) return OkStatus();
    auto stopped =
        controller_->Stop(std::chrono::seconds(15), std::chrono::seconds(5));
    controller_.reset();
    return stopped.status();
  }

  const std::string& url() const { return url_; }
  std::string token_file() const { return dir_ + "/controller/token"; }
  std::string token() const {
    std::string token = ReadWholeFile(token_file());
    while (!token.empty() && std::isspace(token.back())) token.pop_back();
    return token;
  }
  std::string log() const { return ReadWholeFile(dir_ + "/controller.log"); }

  // Starts `multislice ARGS... --controller URL --token-file F` in `cwd`.
  std::unique_ptr<CliProcess> Spawn(std::vector<std::string> args,
                                    const std::string& cwd = "") {
    std::vector<std::string> argv = {binary_};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(),
                {"--controller", url_, "--token-file", token_file()});
    const std::string log = dir_ + "/cli-" + std::to_string(++runs_) + ".log";
    return std::make_unique<CliProcess>(argv, log, cwd);
  }

  // Runs it to its end (bounded by `timeout`); returns its exit code (-1 on
  // timeout) and output.
  std::pair<int, std::string> Run(
      std::vector<std::string> args, const std::string& cwd = "",
      std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    auto process = Spawn(std::move(args), cwd);
    const int code = process->Wait(timeout);
    return {code, process->Output()};
  }

 private:
  std::string binary_;
  std::string dir_;
  std::unique_ptr<ProcessLauncher> launcher_ = NewProcessLauncher();
  std::unique_ptr<ProcessGroup> controller_;
  std::string url_;
  int runs_ = 0;
};

// A fixture: a temporary directory with shared/, a LocalController of
// `hosts` hosts of `accelerator_type`, and queued resource "qr" of `slices`
// slices of that type (startup script `sleep 300`), ACTIVE. Skipped when the
// binary is not built. TearDown stops the controller and checks it went.
class LocalClusterTest : public ::testing::Test {
 protected:
  LocalClusterTest(std::string binary, int hosts, std::string accelerator_type,
                   int slices)
      : binary_(std::move(binary)),
        hosts_(hosts),
        accelerator_type_(std::move(accelerator_type)),
        slices_(slices) {}

  void SetUp() override {
    if (!std::filesystem::exists(binary_)) {
      GTEST_SKIP() << binary_ << " is not built";
    }
    ASSERT_TRUE(dir_.ok());
    std::filesystem::create_directories(shared());
    ASSERT_TRUE(cluster_.Start(hosts_, accelerator_type_).ok())
        << cluster_.log();
    auto [code, out] = cluster_.Run(
        {"queued-resources", "create", "qr", "--accelerator-type",
         accelerator_type_, "--runtime-version", "v2-alpha", "--node-count",
         std::to_string(slices_), "--metadata", "startup-script=sleep 300"});
    ASSERT_EQ(code, 0) << out << cluster_.log();
  }
  void TearDown() override {
    Status stopped = cluster_.Stop();
    EXPECT_TRUE(stopped.ok()) << stopped.message();
  }

  std::string shared() { return dir_.path() + "/shared"; }

  const std::string binary_;
  const int hosts_;
  const std::string accelerator_type_;
  const int slices_;
  TempDir dir_{"cluster-test-"};
  LocalController cluster_{binary_, dir_.path()};
};

}  // namespace multislice::control::testing
