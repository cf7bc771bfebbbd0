// `queued-resources ssh` (RunSsh) over real agents on loopback, with a fake
// controller serving registration, heartbeats and the workers list of one
// queued resource "qr": 2 nodes of 2 workers, each node on its own agent.
#include "control/agent/ssh.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/temp_dir.h"
#include "control/agent/agent.h"
#include "control/agent/local_cluster_test_util.h"
#include "control/http.h"
#include "control/process.h"

namespace multislice::control {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr const char* kToken = "ssh-test-token";

class FakeController {
 public:
  FakeController() {
    http_.server().Post("/internal/v1/hosts:register", [](const httplib::
                                                              Request& req,
                                                          httplib::Response&
                                                              res) {
      if (!RequireBearer(req, res, kToken)) return;
      WriteJson(res, 200, {{"hostId", "host"}, {"heartbeatIntervalMs", 200}});
    });
    http_.server().Post(
        R"(/internal/v1/hosts/([^/:]+):heartbeat)",
        [](const httplib::Request& req, httplib::Response& res) {
          if (!RequireBearer(req, res, kToken)) return;
          WriteJson(res, 200, json::object());
        });
    http_.server().Get(
        R"(/internal/v1/queuedResources/([^/]+)/workers)",
        [this](const httplib::Request& req, httplib::Response& res) {
          if (!RequireBearer(req, res, kToken)) return;
          std::lock_guard<std::mutex> lock(mu_);
          if (req.matches[1] != "qr") {
            WriteError(res, 404, "NOT_FOUND", "no queued resource");
            return;
          }
          WriteJson(res, 200, {{"workers", workers_}});
        });
    http_.Listen();
  }
  std::string url() const { return http_.url(); }
  void SetWorkers(json workers) {
    std::lock_guard<std::mutex> lock(mu_);
    workers_ = std::move(workers);
  }

 private:
  std::mutex mu_;
  json workers_ = json::array();
  testing::LoopbackServer http_;  // last: stopped first
};

// Captures what RunSsh prints.
class Capture {
 public:
  Capture() : file_(std::tmpfile()) {}
  ~Capture() { std::fclose(file_); }
  FILE* file() { return file_; }
  std::string Text() {
    std::fflush(file_);
    std::rewind(file_);
    std::string text;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, file_)) > 0) text.append(buf, n);
    return text;
  }

 private:
  FILE* file_;
};

// A command that leaves a marker file named `marker` (expanded by the
// shell) in `shared`, prints its slice, then waits (bounded) until 4 markers
// are there: it finishes only when 4 workers run it at once.
std::string RendezvousCommand(const std::string& shared,
                              const std::string& marker) {
  return "touch " + shared + "/" + marker +
         "; echo slice $MEGASCALE_SLICE_ID;"
         " for i in $(seq 400); do"
         "   [ $(ls " +
         shared +
         " | wc -l) -ge 4 ] && { echo all here; exit 0; };"
         "   sleep 0.05;"
         " done; echo gave up; exit 9";
}

class SshTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    std::filesystem::create_directories(shared());
    json workers = json::array();
    for (int node = 0; node < 2; ++node) {
      AgentOptions options;
      options.controller_url = controller_.url();
      options.token = kToken;
      options.zone = "z";
      options.accelerator_type = "cpu-2";
      options.workdir = dir_.path() + "/agent" + std::to_string(node);
      options.stop_grace = milliseconds(1000);
      auto agent = Agent::Start(options);
      ASSERT_TRUE(agent.ok()) << agent.status().message();
      ASSERT_TRUE((*agent)->WaitRegistered().ok());
      auto client = ApiClient::Create("http://" + (*agent)->address(), kToken,
                                      seconds(10));
      for (int worker = 0; worker < 2; ++worker) {
        const std::string name =
            "qr." + std::to_string(node) + "." + std::to_string(worker);
        json body = {{"attempt", 1},
                     {"script", "sleep 100"},
                     {"env", {{"MEGASCALE_SLICE_ID", std::to_string(node)}}}};
        auto put = client->Call("PUT", "/agent/v1/workers/" + name, &body);
        ASSERT_TRUE(put.ok());
        ASSERT_EQ(put->status, 201);
        workers.push_back({{"node", "qr-" + std::to_string(node)},
                           {"nodeIndex", node},
                           {"worker", worker},
                           {"hostId", "host"},
                           {"agentAddress", (*agent)->address()},
                           {"directory", put->body["directory"]}});
      }
      agents_.push_back(std::move(agent).value());
    }
    controller_.SetWorkers(workers);
  }
  void TearDown() override {
    for (auto& agent : agents_) agent->Shutdown();
  }

  std::string shared() { return dir_.path() + "/shared"; }

  SshOptions Options(const std::string& command) {
    SshOptions options;
    options.controller_url = controller_.url();
    options.token = kToken;
    options.queued_resource = "qr";
    options.nodes.all = true;
    options.workers.all = true;
    options.command = command;
    options.poll_interval = milliseconds(20);
    options.out = out_.file();
    options.err = err_.file();
    return options;
  }

  TempDir dir_{"ssh-test-"};
  FakeController controller_;
  std::vector<std::unique_ptr<Agent>> agents_;
  Capture out_, err_;
};

TEST_F(SshTest, BatchSmallerThanWorkersOfACommandWaitingForAllCompletes) {
  // Each worker leaves a marker, then waits (bounded) until all 4 are there.
  const std::string command = RendezvousCommand(shared(), "$(basename $PWD)");
  SshOptions options = Options(command);
  options.batch_size = 1;
  options.batch_wait = milliseconds(500);
  const auto start = std::chrono::steady_clock::now();
  auto code = RunSsh(options);
  ASSERT_TRUE(code.ok()) << code.status().message();
  EXPECT_EQ(*code, 0) << out_.Text() << err_.Text();
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(10));
  const std::string out = out_.Text();
  for (int node = 0; node < 2; ++node) {
    for (int worker = 0; worker < 2; ++worker) {
      const std::string prefix = "[node " + std::to_string(node) + " worker " +
                                 std::to_string(worker) + "] ";
      EXPECT_NE(out.find(prefix + "slice " + std::to_string(node) + "\n"),
                std::string::npos)
          << out;
      EXPECT_NE(out.find(prefix + "all here\n"), std::string::npos) << out;
    }
  }
  const std::string err = err_.Text();
  EXPECT_NE(err.find("starting them all now"), std::string::npos) << err;
  // Said once, on one line.
  EXPECT_EQ(err.find("starting them all now"),
            err.rfind("starting them all now"));
}

TEST_F(SshTest, ReturnsTheFailingWorkersExitCode) {
  auto code = RunSsh(Options(
      "if [ $(basename $PWD) = qr.1.0 ]; then echo failing; exit 7; fi; "
      "echo fine"));
  ASSERT_TRUE(code.ok()) << code.status().message();
  EXPECT_EQ(*code, 7);
  const std::string out = out_.Text();
  EXPECT_NE(out.find("[node 1 worker 0] failing\n"), std::string::npos) << out;
  EXPECT_NE(out.find("[node 0 worker 1] fine\n"), std::string::npos) << out;
  EXPECT_NE(err_.Text().find("node 1 worker 0 exited with code 7"),
            std::string::npos)
      << err_.Text();
}

TEST_F(SshTest, RunsOnlyOnTheSelectedWorkers) {
  SshOptions options =
      Options("echo here; printf '\\377\\376 bytes\\n'; printf 'no newline'");
  options.nodes = *ParseSelection("1", "--node");
  options.workers = *ParseSelection("0-1", "--worker");
  auto code = RunSsh(options);
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0);
  const std::string out = out_.Text();
  EXPECT_EQ(out.find("[node 0"), std::string::npos) << out;
  EXPECT_NE(out.find("[node 1 worker 0] here\n"), std::string::npos) << out;
  EXPECT_NE(out.find("[node 1 worker 1] no newline\n"), std::string::npos)
      << out;
  // Invalid UTF-8 arrives replaced, and nothing after it is lost or doubled.
  EXPECT_NE(out.find("[node 1 worker 1] \xEF\xBF\xBD\xEF\xBF\xBD bytes\n"),
            std::string::npos)
      << out;
  auto count = [&](const std::string& text) {
    size_t n = 0;
    for (size_t at = out.find(text); at != std::string::npos;
         at = out.find(text, at + 1)) {
      ++n;
    }
    return n;
  };
  EXPECT_EQ(count(" bytes\n"), 2u) << out;
  EXPECT_EQ(count("] no newline\n"), 2u) << out;
  EXPECT_EQ(count("] here\n"), 2u) << out;

  options.nodes = *ParseSelection("2", "--node");
  auto out_of_range = RunSsh(options);
  EXPECT_EQ(out_of_range.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out_of_range.status().message(),
            "--node: 2 is out of range: qr has nodes 0 to 1");

  options.queued_resource = "other";
  EXPECT_EQ(RunSsh(options).status().code(), StatusCode::kNotFound);
  options.queued_resource = "qr";
  options.token = "wrong";
  EXPECT_FALSE(RunSsh(options).ok());
}

TEST_F(SshTest, CancelStopsTheRunningCommands) {
  std::atomic<bool> cancel{false};
  SshOptions options =
      Options("echo $$ > " + shared() + "/$(basename $PWD).pid; sleep 100");
  options.cancel = &cancel;
  std::thread canceller([&] {
    for (int i = 0; i < 500; ++i) {
      if (std::distance(std::filesystem::directory_iterator(shared()),
                        std::filesystem::directory_iterator{}) == 4) {
        break;
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
    cancel = true;
  });
  auto code = RunSsh(options);
  canceller.join();
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 130);
  for (const auto& entry : std::filesystem::directory_iterator(shared())) {
    std::ifstream in(entry.path());
    pid_t pid = 0;
    in >> pid;
    ASSERT_GT(pid, 0);
    EXPECT_FALSE(ProcessGroupAlive(pid)) << entry.path();
  }
}

// End to end with the real binary: `multislice controller --local-hosts 4`
// (4 `multislice agent` children), a 4-slice queued resource of cpu-2 made
// with `queued-resources create`, then `queued-resources ssh`. Skipped when
// the binary has not been built.
class SshEndToEndTest : public testing::LocalClusterTest {
 protected:
  SshEndToEndTest() : LocalClusterTest(MULTISLICE_BINARY, 4, "cpu-2", 4) {}

  // Runs `multislice ARGS... --controller URL --token-file F`, bounded;
  // returns its exit code and output (stdout and stderr together).
  std::pair<int, std::string> RunCli(std::vector<std::string> args) {
    return cluster_.Run(std::move(args));
  }
};

TEST_F(SshEndToEndTest, BatchOfOneOverFourWorkersWaitingForAllCompletes) {
  const std::string command =
      RendezvousCommand(shared(), "$MEGASCALE_SLICE_ID");
  auto [code, out] =
      RunCli({"queued-resources", "ssh", "qr", "--node=all", "--worker=all",
              "--batch-size", "1", "--batch-wait", "1", "--command", command});
  EXPECT_EQ(code, 0) << out;
  for (int node = 0; node < 4; ++node) {
    const std::string prefix = "[node " + std::to_string(node) + " worker 0] ";
    EXPECT_NE(out.find(prefix + "slice " + std::to_string(node) + "\n"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find(prefix + "all here\n"), std::string::npos) << out;
  }
  EXPECT_NE(out.find("starting them all now"), std::string::npos) << out;

  auto [failed, failed_out] =
      RunCli({"queued-resources", "ssh", "qr", "--node=1-2", "--worker=all",
              "--command",
              "if [ $MEGASCALE_SLICE_ID = 2 ]; then exit 7; fi; echo ok"});
  EXPECT_EQ(failed, 7) << failed_out;
  EXPECT_NE(failed_out.find("[node 1 worker 0] ok\n"), std::string::npos)
      << failed_out;
  EXPECT_EQ(failed_out.find("[node 0 "), std::string::npos) << failed_out;
  EXPECT_NE(failed_out.find("node 2 worker 0 exited with code 7"),
            std::string::npos)
      << failed_out;

  // Stopping the controller (SIGTERM) stops its agents, which stop their
  // workers: no startup-script process is left.
  const std::string token = cluster_.token();
  auto controller = ApiClient::Create(cluster_.url(), token, seconds(10));
  ASSERT_TRUE(controller.ok());
  auto listed =
      controller->Call("GET", "/internal/v1/queuedResources/qr/workers");
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->status, 200) << listed->body.dump();
  std::vector<pid_t> groups;
  for (const json& w : listed->body["workers"]) {
    // Agents accept only their host's secret (the listing's agentToken).
    auto agent =
        ApiClient::Create("http://" + w["agentAddress"].get<std::string>(),
                          w["agentToken"].get<std::string>(), seconds(10));
    auto workers = agent->Call("GET", "/agent/v1/workers");
    ASSERT_TRUE(workers.ok());
    for (const json& status : workers->body["workers"]) {
      EXPECT_EQ(status["state"], "RUNNING") << status.dump();
      groups.push_back(status["pid"].get<pid_t>());
    }
  }
  EXPECT_EQ(groups.size(), 4u);
  Status stopped = cluster_.Stop();
  ASSERT_TRUE(stopped.ok()) << stopped.message();
  for (pid_t pgid : groups) EXPECT_FALSE(ProcessGroupAlive(pgid)) << pgid;
}

}  // namespace
}  // namespace multislice::control
