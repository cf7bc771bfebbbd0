// The agent over real HTTP on loopback, against a fake controller that
// records registrations and heartbeats.
#include "control/agent/agent.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/temp_dir.h"
#include "control/agent/local_cluster_test_util.h"
#include "control/agent/remote_exec.h"
#include "control/http.h"

namespace multislice::control {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr const char* kToken = "test-token-0123456789";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Polls `done` every 10 ms for at most `timeout`.
template <typename F>
bool WaitFor(F done, milliseconds timeout = milliseconds(10000)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return done();
}

// A controller that knows only /internal/v1/hosts:register and :heartbeat.
class FakeController {
 public:
  FakeController() {
    http_.server().Post(
        "/internal/v1/hosts:register",
        [this](const httplib::Request& req, httplib::Response& res) {
          if (!RequireBearer(req, res, kToken)) return;
          std::lock_guard<std::mutex> lock(mu_);
          registrations_.push_back(json::parse(req.body));
          WriteJson(
              res, 200,
              {{"hostId", "host-" + std::to_string(registrations_.size())},
               {"heartbeatIntervalMs", 50}});
        });
    http_.server().Post(
        R"(/internal/v1/hosts/([^/:]+):heartbeat)",
        [this](const httplib::Request& req, httplib::Response& res) {
          if (!RequireBearer(req, res, kToken)) return;
          std::lock_guard<std::mutex> lock(mu_);
          if (forget_next_heartbeat_) {
            forget_next_heartbeat_ = false;
            WriteError(res, 404, "NOT_FOUND", "no such host");
            return;
          }
          heartbeats_.push_back({req.matches[1], json::parse(req.body)});
          WriteJson(res, 200, json::object());
        });
    http_.Listen();
  }
  std::string url() const { return http_.url(); }
  std::vector<json> registrations() {
    std::lock_guard<std::mutex> lock(mu_);
    return registrations_;
  }
  std::vector<std::pair<std::string, json>> heartbeats() {
    std::lock_guard<std::mutex> lock(mu_);
    return heartbeats_;
  }
  void ForgetHost() {
    std::lock_guard<std::mutex> lock(mu_);
    forget_next_heartbeat_ = true;
  }

 private:
  std::mutex mu_;
  std::vector<json> registrations_;
  std::vector<std::pair<std::string, json>> heartbeats_;
  bool forget_next_heartbeat_ = false;
  testing::LoopbackServer http_;  // last: stopped first
};

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    AgentOptions options;
    options.controller_url = controller_.url();
    options.token = kToken;
    options.hostname = "test-host";
    options.zone = "us-central2-b";
    options.accelerator_type = "cpu-2";
    options.workdir = dir_.path() + "/agent";
    options.stop_grace = milliseconds(2000);
    auto agent = Agent::Start(options);
    ASSERT_TRUE(agent.ok()) << agent.status().message();
    agent_ = std::move(agent).value();
    ASSERT_TRUE(agent_->WaitRegistered().ok());
    client_.emplace(
        ApiClient::Create("http://" + agent_->address(), kToken, seconds(20))
            .value());
  }
  void TearDown() override {
    if (agent_) agent_->Shutdown();
  }

  HttpResponse Call(std::string_view method, const std::string& path,
                    const json* body = nullptr) {
    auto r = client_->Call(method, path, body);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : HttpResponse{};
  }
  HttpResponse PutWorker(const std::string& name, int attempt,
                         const std::string& script, json env = json::object()) {
    json body = {{"attempt", attempt}, {"script", script}, {"env", env}};
    return Call("PUT", "/agent/v1/workers/" + name, &body);
  }
  // Runs an exec to its end; returns {output, exitCode}.
  std::pair<std::string, int> Exec(const json& body) {
    HttpResponse started = Call("POST", "/agent/v1/exec", &body);
    EXPECT_EQ(started.status, 201) << started.body.dump();
    if (started.status != 201) return {"", -1};
    const std::string id = started.body["execId"];
    std::string output;
    long long offset = 0;
    for (int i = 0; i < 1000; ++i) {
      HttpResponse r = Call(
          "GET", "/agent/v1/exec/" + id + "?offset=" + std::to_string(offset));
      EXPECT_EQ(r.status, 200);
      output += r.body["output"].get<std::string>();
      EXPECT_EQ(r.body["nextOffset"].get<long long>(),
                offset + static_cast<long long>(
                             r.body["output"].get<std::string>().size()));
      offset = r.body["nextOffset"];
      if (r.body["done"].get<bool>()) return {output, r.body["exitCode"]};
      std::this_thread::sleep_for(milliseconds(10));
    }
    ADD_FAILURE() << "exec did not finish";
    return {output, -1};
  }
  std::string WorkerDir(const std::string& name) {
    return agent_->WorkerStatuses().empty()
               ? ""
               : dir_.path() + "/agent/workers/" + name;
  }

  TempDir dir_{"agent-test-"};
  FakeController controller_;
  std::unique_ptr<Agent> agent_;
  std::optional<ApiClient> client_;
};

TEST_F(AgentTest, RegistersAndSendsHeartbeats) {
  auto regs = controller_.registrations();
  ASSERT_EQ(regs.size(), 1u);
  EXPECT_EQ(regs[0]["hostname"], "test-host");
  EXPECT_EQ(regs[0]["zone"], "us-central2-b");
  EXPECT_EQ(regs[0]["acceleratorType"], "cpu-2");
  EXPECT_EQ(regs[0]["agentAddress"], agent_->address());
  EXPECT_EQ(regs[0]["workdir"], dir_.path() + "/agent");
  EXPECT_EQ(agent_->host_id(), "host-1");
  ASSERT_TRUE(WaitFor([&] { return controller_.heartbeats().size() >= 2; }));
  auto beat = controller_.heartbeats()[0];
  EXPECT_EQ(beat.first, "host-1");
  EXPECT_TRUE(beat.second["workers"].is_array());

  HttpResponse health = Call("GET", "/agent/v1/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body["hostId"], "host-1");
  EXPECT_EQ(health.body["acceleratorType"], "cpu-2");
  EXPECT_EQ(health.body["zone"], "us-central2-b");
  EXPECT_EQ(health.body["workers"], 0);
}

TEST_F(AgentTest, RegistersAgainWhenTheControllerForgetsTheHost) {
  controller_.ForgetHost();
  ASSERT_TRUE(WaitFor([&] { return controller_.registrations().size() >= 2; }));
  EXPECT_EQ(controller_.registrations()[1]["agentAddress"], agent_->address());
  ASSERT_TRUE(WaitFor([&] { return agent_->host_id() == "host-2"; }));
  ASSERT_TRUE(WaitFor([&] {
    auto beats = controller_.heartbeats();
    return !beats.empty() && beats.back().first == "host-2";
  }));
}

TEST_F(AgentTest, RejectsRequestsWithoutTheToken) {
  auto anonymous =
      ApiClient::Create("http://" + agent_->address(), "wrong", seconds(5));
  ASSERT_TRUE(anonymous.ok());
  json body = {{"script", "touch pwned"}};
  for (auto [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"GET", "/agent/v1/health"},
           {"GET", "/agent/v1/workers"},
           {"PUT", "/agent/v1/workers/x"},
           {"POST", "/agent/v1/workers/x:stop"},
           {"POST", "/agent/v1/exec"},
           {"GET", "/agent/v1/exec/e1"}}) {
    auto r = anonymous->Call(method, path, &body);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->status, 401) << method << " " << path;
    EXPECT_EQ(r->body["error"]["status"], "UNAUTHENTICATED");
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/agent/workers/x"));
}

TEST_F(AgentTest, RunsTheStartupScriptWithItsEnvironmentAndStopsIt) {
  const std::string script =
      "#!/bin/bash\n"
      "echo \"$MEGASCALE_SLICE_ID $TPU_WORKER_ID $MULTISLICE_ATTEMPT\" > "
      "env.txt\n"
      "pwd >> env.txt\n"
      "echo started attempt $MULTISLICE_ATTEMPT\n"
      "sleep 100 &\n"
      "echo $! > child.pid\n"
      "wait\n";
  json env = {{"MEGASCALE_SLICE_ID", "1"},
              {"TPU_WORKER_ID", "0"},
              {"MULTISLICE_ATTEMPT", "1"}};
  HttpResponse put = PutWorker("qr.1.0", 1, script, env);
  ASSERT_EQ(put.status, 201) << put.body.dump();
  const std::string dir = dir_.path() + "/agent/workers/qr.1.0";
  EXPECT_EQ(put.body["name"], "qr.1.0");
  EXPECT_EQ(put.body["attempt"], 1);
  EXPECT_EQ(put.body["state"], "RUNNING");
  EXPECT_EQ(put.body["directory"], dir);
  EXPECT_EQ(put.body["log"], dir + "/startup-script.log");
  EXPECT_TRUE(put.body["exitCode"].is_null());
  EXPECT_EQ(std::filesystem::status(dir + "/startup-script.sh").permissions() &
                std::filesystem::perms::all,
            std::filesystem::perms::owner_all);
  ASSERT_TRUE(WaitFor([&] { return !ReadFile(dir + "/child.pid").empty(); }));
  EXPECT_EQ(ReadFile(dir + "/env.txt"), "1 0 1\n" + dir + "\n");

  // A second PUT while it runs is refused.
  EXPECT_EQ(PutWorker("qr.1.0", 2, script, env).status, 409);

  // Heartbeats and the list carry it.
  ASSERT_TRUE(WaitFor([&] {
    auto beats = controller_.heartbeats();
    return !beats.empty() && beats.back().second["workers"].size() == 1 &&
           beats.back().second["workers"][0]["state"] == "RUNNING";
  }));
  HttpResponse list = Call("GET", "/agent/v1/workers");
  ASSERT_EQ(list.body["workers"].size(), 1u);
  EXPECT_EQ(list.body["workers"][0]["pid"], put.body["pid"]);

  // Stop answers only once the group (with its background child) is gone.
  const pid_t child = std::stoi(ReadFile(dir + "/child.pid"));
  json stop = {{"graceSeconds", 5}};
  HttpResponse stopped = Call("POST", "/agent/v1/workers/qr.1.0:stop", &stop);
  ASSERT_EQ(stopped.status, 200) << stopped.body.dump();
  EXPECT_EQ(stopped.body["state"], "EXITED");
  EXPECT_EQ(stopped.body["signal"], SIGTERM);
  EXPECT_EQ(stopped.body["exitCode"], 128 + SIGTERM);
  EXPECT_EQ(::kill(child, 0), -1);
  EXPECT_EQ(::kill(put.body["pid"].get<pid_t>(), 0), -1);

  // Attempt 2 appends to the same log.
  env["MULTISLICE_ATTEMPT"] = "2";
  HttpResponse again =
      PutWorker("qr.1.0", 2, "echo attempt $MULTISLICE_ATTEMPT; exit 4", env);
  ASSERT_EQ(again.status, 201);
  ASSERT_TRUE(WaitFor([&] {
    auto workers = agent_->WorkerStatuses();
    return workers.size() == 1 && workers[0]["state"] == "EXITED";
  }));
  auto workers = agent_->WorkerStatuses();
  EXPECT_EQ(workers[0]["attempt"], 2);
  EXPECT_EQ(workers[0]["exitCode"], 4);
  EXPECT_EQ(workers[0]["signal"], 0);
  EXPECT_EQ(ReadFile(dir + "/startup-script.log"),
            "=== attempt 1 ===\nstarted attempt 1\n"
            "=== attempt 2 ===\nattempt 2\n");
}

TEST_F(AgentTest, WorkerRunsWhileItsBackgroundJobRuns) {
  HttpResponse put = PutWorker(
      "qr.0.0", 1, "sleep 100 & echo $! > child.pid; echo launched; exit 0");
  ASSERT_EQ(put.status, 201);
  const std::string dir = dir_.path() + "/agent/workers/qr.0.0";
  ASSERT_TRUE(WaitFor([&] {
    auto workers = agent_->WorkerStatuses();
    return workers.size() == 1 && workers[0]["exitCode"] == 0;
  }));
  // The script has exited, its job has not: still RUNNING, no second PUT.
  auto workers = agent_->WorkerStatuses();
  EXPECT_EQ(workers[0]["state"], "RUNNING");
  EXPECT_EQ(workers[0]["signal"], 0);
  EXPECT_EQ(PutWorker("qr.0.0", 2, "true").status, 409);
  const pid_t child = std::stoi(ReadFile(dir + "/child.pid"));
  HttpResponse stopped = Call("POST", "/agent/v1/workers/qr.0.0:stop");
  ASSERT_EQ(stopped.status, 200);
  EXPECT_EQ(stopped.body["state"], "EXITED");
  EXPECT_EQ(stopped.body["exitCode"], 0);  // the script's own status
  EXPECT_EQ(::kill(child, 0), -1);
  EXPECT_EQ(PutWorker("qr.0.0", 2, "true").status, 201);
}

TEST_F(AgentTest, RejectsBadWorkerRequests) {
  EXPECT_EQ(PutWorker("Upper", 1, "true").status, 400);
  EXPECT_EQ(PutWorker("..", 1, "true").status, 400);
  EXPECT_EQ(PutWorker(".hidden", 1, "true").status, 400);
  EXPECT_EQ(PutWorker(std::string(129, 'a'), 1, "true").status, 400);
  EXPECT_EQ(PutWorker("ok", -1, "true").status, 400);
  EXPECT_EQ(PutWorker("ok", 1, std::string(kMaxScriptBytes + 1, '#')).status,
            400);
  EXPECT_EQ(PutWorker("ok", 1, "true", {{"BAD NAME", "x"}}).status, 400);
  EXPECT_EQ(PutWorker("ok", 1, "true", {{"X", 3}}).status, 400);
  json no_script = {{"attempt", 1}};
  EXPECT_EQ(Call("PUT", "/agent/v1/workers/ok", &no_script).status, 400);
  json huge = {{"script", std::string(kMaxBodyBytes + 10, 'x')}};
  HttpResponse too_big = Call("PUT", "/agent/v1/workers/ok", &huge);
  EXPECT_EQ(too_big.status, 413);
  EXPECT_EQ(Call("POST", "/agent/v1/workers/nobody:stop").status, 404);
  EXPECT_EQ(Call("GET", "/agent/v1/exec/nothing").status, 404);
  EXPECT_EQ(Call("GET", "/agent/v1/nothing").status, 404);
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/agent/workers/ok"));
}

TEST_F(AgentTest, ExecRunsInTheWorkerDirectoryAndReportsItsExitCode) {
  ASSERT_EQ(
      PutWorker("qr.0.1", 1, "sleep 100", {{"MEGASCALE_SLICE_ID", "3"}}).status,
      201);
  const std::string dir = dir_.path() + "/agent/workers/qr.0.1";
  auto [output, code] =
      Exec({{"command",
             "echo out; echo err >&2; pwd; echo slice $MEGASCALE_SLICE_ID "
             "$EXTRA; exit 3"},
            {"worker", "qr.0.1"},
            {"env", {{"EXTRA", "x"}}}});
  EXPECT_EQ(output, "out\nerr\n" + dir + "\nslice 3 x\n");
  EXPECT_EQ(code, 3);

  // A large output comes back whole, in chunks.
  auto [big, big_code] =
      Exec({{"command", "head -c 600000 /dev/zero | tr '\\0' a"}});
  EXPECT_EQ(big.size(), 600000u);
  EXPECT_EQ(big_code, 0);

  json unknown = {{"command", "true"}, {"worker", "qr.9.9"}};
  EXPECT_EQ(Call("POST", "/agent/v1/exec", &unknown).status, 404);
}

TEST_F(AgentTest, ExecStopEndsTheCommand) {
  json body = {{"command", "sleep 100 & sleep 100"}};
  HttpResponse started = Call("POST", "/agent/v1/exec", &body);
  ASSERT_EQ(started.status, 201);
  const std::string id = started.body["execId"];
  json grace = {{"graceSeconds", 1}};
  HttpResponse stopped = Call("POST", "/agent/v1/exec/" + id + ":stop", &grace);
  ASSERT_EQ(stopped.status, 200);
  EXPECT_EQ(stopped.body["exitCode"], 128 + SIGTERM);
  HttpResponse read = Call("GET", "/agent/v1/exec/" + id + "?offset=0");
  EXPECT_TRUE(read.body["done"].get<bool>());
  EXPECT_EQ(Call("GET", "/agent/v1/exec/" + id + "?offset=-1").status, 400);
}

TEST_F(AgentTest, UploadWritesAFileIntoTheWorkerDirectory) {
  ASSERT_EQ(PutWorker("qr.0.0", 1, "sleep 100").status, 201);
  auto agent = AgentClient::Create(agent_->address(), kToken, seconds(20));
  ASSERT_TRUE(agent.ok());
  // Larger than any JSON body, with every byte value.
  std::string bytes(3 << 20, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i);
  Status put = agent->PutFile("qr.0.0", "run/sub dir/f.bin", bytes);
  ASSERT_TRUE(put.ok()) << put.message();
  const std::string dir = dir_.path() + "/agent/workers/qr.0.0/run/sub dir";
  EXPECT_EQ(ReadFile(dir + "/f.bin"), bytes);
  ASSERT_TRUE(agent->PutFile("qr.0.0", "run/sub dir/f.bin", "new").ok());
  EXPECT_EQ(ReadFile(dir + "/f.bin"), "new");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator{}),
            1);  // no temporary file left

  for (const std::string bad :
       {"", "/etc/passwd", "..", "../x", "a/../b", "a//b", "./a", "a/"}) {
    EXPECT_EQ(agent->PutFile("qr.0.0", bad, "x").code(),
              StatusCode::kInvalidArgument)
        << bad;
  }
  EXPECT_EQ(agent->PutFile("qr.9.9", "x", "x").code(), StatusCode::kNotFound);
  auto intruder = AgentClient::Create(agent_->address(), "wrong", seconds(20));
  EXPECT_FALSE(intruder->PutFile("qr.0.0", "intruder", "x").ok());
  EXPECT_FALSE(
      std::filesystem::exists(dir_.path() + "/agent/workers/qr.0.0/intruder"));

  // A body announced larger than an upload may be is refused from the
  // headers, before it is sent.
  auto raw = [&](const std::string& request) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(agent_->port()));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval timeout{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    std::string answer;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) ==
            0 &&
        ::write(fd, request.data(), request.size()) ==
            static_cast<ssize_t>(request.size())) {
      char buf[256];
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) answer.assign(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return answer;
  };
  const std::string headers = std::string("Host: x\r\nAuthorization: Bearer ") +
                              kToken + "\r\nContent-Length: ";
  EXPECT_EQ(raw("PUT /agent/v1/workers/qr.0.0/files?path=big HTTP/1.1\r\n" +
                headers + std::to_string(kMaxUploadBytes + 1) + "\r\n\r\n")
                .rfind("HTTP/1.1 413", 0),
            0u);
  // A JSON call may not grow past kMaxBodyBytes.
  json command = {{"command", std::string(kMaxBodyBytes, 'x')}};
  EXPECT_EQ(Call("POST", "/agent/v1/exec", &command).status, 413);
}

TEST_F(AgentTest, ExecRunsInASubdirectoryAndTaggedStopsMatchOnlyTheirOwn) {
  ASSERT_EQ(PutWorker("qr.0.0", 1, "sleep 100").status, 201);
  ASSERT_EQ(PutWorker("qr.0.1", 1, "sleep 100").status, 201);
  auto agent = AgentClient::Create(agent_->address(), kToken, seconds(20));
  ASSERT_TRUE(agent->PutFile("qr.0.0", "run/f", "x").ok());
  auto [pwd, code] =
      Exec({{"command", "pwd"}, {"worker", "qr.0.0"}, {"directory", "run"}});
  EXPECT_EQ(pwd, dir_.path() + "/agent/workers/qr.0.0/run\n");
  EXPECT_EQ(code, 0);
  for (json bad : {json{{"command", "true"}, {"directory", "../run"}},
                   json{{"command", "true"}, {"tag", "a b"}},
                   json{{"command", "true"}, {"tag", 3}}}) {
    EXPECT_EQ(Call("POST", "/agent/v1/exec", &bad).status, 400) << bad.dump();
  }
  json missing = {
      {"command", "true"}, {"worker", "qr.0.0"}, {"directory", "nothing"}};
  EXPECT_EQ(Call("POST", "/agent/v1/exec", &missing).status, 404);

  // Sleeping execs: tagged run/a on qr.0.0 (twice), tagged other on qr.0.0,
  // tagged run/b on qr.0.1, untagged on qr.0.0.
  std::vector<std::pair<std::string, std::string>> execs = {{"qr.0.0", "run/a"},
                                                            {"qr.0.0", "run/a"},
                                                            {"qr.0.0", "other"},
                                                            {"qr.0.1", "run/b"},
                                                            {"qr.0.0", ""}};
  std::vector<std::string> ids;
  for (const auto& [worker, tag] : execs) {
    ExecRequest request;
    request.command = "sleep 100";
    request.tag = tag;
    auto id = agent->StartExec(worker, request);
    ASSERT_TRUE(id.ok()) << id.status().message();
    ids.push_back(*id);
  }
  auto stopped = agent->StopTaggedExecs("qr.0.0", "run/", milliseconds(1000));
  ASSERT_TRUE(stopped.ok()) << stopped.status().message();
  EXPECT_EQ(*stopped, 2);
  for (size_t i = 0; i < ids.size(); ++i) {
    auto read = agent->ReadExec(ids[i], 0);
    ASSERT_TRUE(read.ok());
    EXPECT_EQ(read->done, i < 2) << i;
    if (i < 2) {
      EXPECT_EQ(read->exit_code, 128 + SIGTERM);
    }
  }
  // Nothing left to stop; bad calls.
  EXPECT_EQ(*agent->StopTaggedExecs("qr.0.0", "run/", milliseconds(0)), 0);
  EXPECT_EQ(
      agent->StopTaggedExecs("qr.9.9", "run/", milliseconds(0)).status().code(),
      StatusCode::kNotFound);
  json empty = {{"tagPrefix", ""}};
  EXPECT_EQ(Call("POST", "/agent/v1/workers/qr.0.0/execs:stop", &empty).status,
            400);
}

TEST_F(AgentTest, ShutdownStopsEveryWorker) {
  HttpResponse put = PutWorker("qr.0.0", 1, "trap '' TERM; sleep 100");
  ASSERT_EQ(put.status, 201);
  const pid_t pid = put.body["pid"];
  json body = {{"command", "sleep 100"}};
  ASSERT_EQ(Call("POST", "/agent/v1/exec", &body).status, 201);
  // The TERM-ignoring script costs the 2 s grace.
  const auto start = std::chrono::steady_clock::now();
  agent_->Shutdown();
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(5));
  EXPECT_EQ(::kill(pid, 0), -1);
  EXPECT_FALSE(ProcessGroupAlive(pid));
}

// A launcher that fails on demand, in front of the real one.
class FlakyLauncher : public ProcessLauncher {
 public:
  Result<std::unique_ptr<ProcessGroup>> Start(
      const ProcessSpec& spec) override {
    if (fail_next.exchange(false)) return Internal("fork failed: injected");
    return real_->Start(spec);
  }
  std::atomic<bool> fail_next{false};

 private:
  std::unique_ptr<ProcessLauncher> real_ = NewProcessLauncher();
};

TEST(AgentLauncherTest, AFailedStartLeavesTheWorkerStartable) {
  TempDir dir("agent-test-");
  FakeController controller;
  FlakyLauncher launcher;
  AgentOptions options;
  options.controller_url = controller.url();
  options.token = kToken;
  options.zone = "z";
  options.accelerator_type = "cpu-2";
  options.workdir = dir.path();
  options.launcher = &launcher;
  auto agent = Agent::Start(options);
  ASSERT_TRUE(agent.ok());
  ASSERT_TRUE((*agent)->WaitRegistered().ok());
  auto client =
      ApiClient::Create("http://" + (*agent)->address(), kToken, seconds(10));
  json body = {{"attempt", 1}, {"script", "sleep 100"}};
  launcher.fail_next = true;
  auto failed = client->Call("PUT", "/agent/v1/workers/w", &body);
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ(failed->status, 500);
  EXPECT_NE(failed->body.dump().find("injected"), std::string::npos);
  auto statuses = (*agent)->WorkerStatuses();
  ASSERT_EQ(statuses.size(), 1u);
  EXPECT_EQ(statuses[0]["state"], "EXITED");
  auto started = client->Call("PUT", "/agent/v1/workers/w", &body);
  ASSERT_TRUE(started.ok());
  EXPECT_EQ(started->status, 201);
  EXPECT_EQ(started->body["state"], "RUNNING");
  (*agent)->Shutdown();
  EXPECT_FALSE(ProcessGroupAlive(started->body["pid"].get<pid_t>()));
}

TEST(AgentStartTest, FailsWhenTheControllerNeverAnswers) {
  TempDir dir("agent-test-");
  // A port that nothing listens on: bind one and close it.
  int port = 0;
  {
    httplib::Server probe;
    port = probe.bind_to_any_port("127.0.0.1");
  }
  AgentOptions options;
  options.controller_url = "http://127.0.0.1:" + std::to_string(port);
  options.token = kToken;
  options.zone = "z";
  options.accelerator_type = "cpu-2";
  options.workdir = dir.path();
  options.register_timeout = milliseconds(300);
  options.http_timeout = milliseconds(500);
  auto agent = Agent::Start(options);
  ASSERT_TRUE(agent.ok());
  const auto start = std::chrono::steady_clock::now();
  Status s = (*agent)->WaitRegistered();
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(3));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.message();
  EXPECT_NE(s.message().find(options.controller_url), std::string::npos);
  EXPECT_TRUE((*agent)->Failed());
}

TEST(AgentStartTest, RejectsBadOptions) {
  AgentOptions options;
  options.controller_url = "127.0.0.1:1";
  options.token = kToken;
  options.workdir = "/tmp";
  EXPECT_EQ(Agent::Start(options).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidWorkerName("qr-a.0.12"));
  EXPECT_FALSE(ValidWorkerName("qr/0"));
  EXPECT_FALSE(ValidWorkerName("-x"));
  EXPECT_FALSE(ValidWorkerName(""));
}

}  // namespace
}  // namespace multislice::control
