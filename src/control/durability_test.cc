// Durability: the controller runs as a child process (this binary with
// --controller-child) and is killed with SIGKILL in the middle of
// provisioning and in the middle of a repair; a new one on the same data
// directory must find every record and finish what was under way, without
// ever running two attempts of a queued resource at once.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "common/temp_dir.h"
#include "control/controller.h"
#include "control/fake_agent.h"
#include "gtest/gtest.h"

namespace multislice::control {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
}  // namespace
const char kToken[] = "durability-token";
std::string g_self;  // this binary, re-run as the controller
namespace {
const char kParent[] = "/v2alpha1/projects/p/locations/z";

// A port nothing listens on: bound, read, closed. (An unstarted
// httplib::Server keeps its socket open, so it cannot be used for this.)
int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

bool WaitFor(const std::function<bool()>& done,
             std::chrono::milliseconds timeout = std::chrono::seconds(15)) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

// A controller child process; killed with SIGKILL (and reaped) at the end.
class ControllerProcess {
 public:
  ControllerProcess(const std::string& dir, int port) {
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string port_text = std::to_string(port);
      ::execl(g_self.c_str(), g_self.c_str(), "--controller-child", dir.c_str(),
              port_text.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~ControllerProcess() { Kill(); }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

class DurabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    port_ = FreePort();
    url_ = "http://127.0.0.1:" + std::to_string(port_);
    client_ = std::make_unique<ApiClient>(
        *ApiClient::Create(url_, kToken, std::chrono::seconds(5)));
  }
  void TearDown() override {
    agents_.clear();
    controller_.reset();
  }
  void StartController() {
    controller_ = std::make_unique<ControllerProcess>(dir_.path(), port_);
    ASSERT_TRUE(WaitFor([&] {
      Result<HttpResponse> r = client_->Call("GET", "/internal/v1/hosts");
      return r.ok() && r->status == 200;
    }));
  }
  testing::FakeAgent& AddAgent() {
    agents_.push_back(
        std::make_unique<testing::FakeAgent>(url_, kToken, "cpu-2", "z"));
    testing::FakeAgent& a = *agents_.back();
    EXPECT_TRUE(WaitFor([&] { return !a.host_id().empty(); }));
    return a;
  }
  json Get(const std::string& path) {
    Result<HttpResponse> r = client_->Call("GET", path);
    return r.ok() ? r->body : json();
  }
  json Qr(const std::string& id) {
    return Get(std::string(kParent) + "/queuedResources/" + id);
  }
  std::string State(const std::string& id) {
    json q = Qr(id);
    return q.contains("state") ? q["state"].value("state", "") : "";
  }
  std::string Create(const std::string& id, const std::string& type) {
    json body = {{"tpu",
                  {{"node_spec",
                    {{{"multi_node_params", {{"node_count", 2}}},
                      {"node",
                       {{"accelerator_type", type},
                        {"metadata", {{"startup-script", "sleep 100"}}}}}}}}}}};
    Result<HttpResponse> r = client_->Call(
        "POST",
        std::string(kParent) + "/queuedResources?queued_resource_id=" + id,
        &body);
    EXPECT_TRUE(r.ok() && r->status == 200);
    return r.ok() ? r->body.value("name", "") : "";
  }
  void ExpectNoOverlap(const std::string& id) {
    std::vector<testing::FakeWorker> all;
    for (const auto& a : agents_) {
      for (const auto& w : a->history()) {
        if (w.name.rfind(id + ".", 0) == 0) all.push_back(w);
      }
    }
    for (const auto& a : all) {
      for (const auto& b : all) {
        if (b.attempt > a.attempt) {
          EXPECT_FALSE(a.running) << a.name << "@" << a.attempt;
          EXPECT_LE(a.stopped, b.started)
              << a.name << "@" << a.attempt << " overlaps " << b.name << "@"
              << b.attempt;
        }
        if (&a != &b && a.name == b.name) {
          EXPECT_NE(a.attempt, b.attempt)
              << a.name << " started twice for attempt " << a.attempt;
        }
      }
    }
  }

  TempDir dir_;
  int port_ = 0;
  std::string url_;
  std::unique_ptr<ApiClient> client_;
  std::unique_ptr<ControllerProcess> controller_;
  std::vector<std::unique_ptr<testing::FakeAgent>> agents_;
};

TEST_F(DurabilityTest, KilledDuringProvisioningCarriesOn) {
  StartController();
  auto& a = AddAgent();
  auto& b = AddAgent();
  a.put_delay = b.put_delay = std::chrono::milliseconds(600);
  const std::string waiting_op = Create("waits", "cpu-4");  // never placed
  const std::string op = Create("job", "cpu-2");
  ASSERT_TRUE(WaitFor([&] { return State("job") == "PROVISIONING"; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  controller_->Kill();  // PUTs in flight
  StartController();
  ASSERT_TRUE(WaitFor([&] { return State("job") == "ACTIVE"; }))
      << State("job");
  json job = Qr("job");
  EXPECT_EQ(job["attempt"], 1);
  EXPECT_EQ(State("waits"), "WAITING_FOR_RESOURCES");
  EXPECT_EQ(Get("/v2alpha1/" + op).value("done", false), true);
  EXPECT_EQ(Get("/v2alpha1/" + waiting_op).value("done", false), true);
  // Each worker started once.
  EXPECT_EQ(a.history().size() + b.history().size(), 2u);
  ExpectNoOverlap("job");
}

TEST_F(DurabilityTest, KilledDuringRepairCarriesOn) {
  StartController();
  for (int i = 0; i < 3; ++i) AddAgent();
  Create("job", "cpu-2");
  ASSERT_TRUE(WaitFor([&] { return State("job") == "ACTIVE"; }));
  for (auto& a : agents_) a->stop_delay = std::chrono::milliseconds(600);
  const std::string failed = Qr("job")["nodes"][0]["hosts"][0];
  ASSERT_EQ(
      client_->Call("POST", "/internal/v1/hosts/" + failed + ":fail")->status,
      200);
  ASSERT_TRUE(WaitFor([&] { return State("job") != "ACTIVE"; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  controller_->Kill();  // stops in flight
  StartController();
  ASSERT_TRUE(WaitFor([&] {
    json q = Qr("job");
    return q.contains("state") && q["state"]["state"] == "ACTIVE" &&
           q["attempt"] == 2;
  })) << Qr("job").dump();
  json job = Qr("job");
  EXPECT_EQ(job["nodes"][0]["state"], "READY");
  EXPECT_EQ(job["nodes"][1]["state"], "READY");
  int running = 0;
  for (const auto& a : agents_) running += a->running();
  EXPECT_EQ(running, 2);
  ExpectNoOverlap("job");
}

TEST_F(DurabilityTest, KilledDuringDeletionCarriesOn) {
  StartController();
  AddAgent();
  AddAgent();
  Create("job", "cpu-2");
  ASSERT_TRUE(WaitFor([&] { return State("job") == "ACTIVE"; }));
  for (auto& a : agents_) a->stop_delay = std::chrono::milliseconds(600);
  Result<HttpResponse> op = client_->Call(
      "DELETE", std::string(kParent) + "/queuedResources/job?force=true");
  ASSERT_TRUE(op.ok() && op->status == 200);
  const std::string op_name = op->body["name"];
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(State("job"), "DELETING");
  controller_->Kill();  // stops in flight
  StartController();
  ASSERT_TRUE(WaitFor([&] {
    Result<HttpResponse> r =
        client_->Call("GET", std::string(kParent) + "/queuedResources/job");
    return r.ok() && r->status == 404;
  }));
  json done = Get("/v2alpha1/" + op_name);
  EXPECT_EQ(done.value("done", false), true) << done.dump();
  for (const auto& a : agents_) EXPECT_EQ(a->running(), 0);
}

}  // namespace
}  // namespace multislice::control

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--controller-child") == 0) {
    multislice::control::ControllerOptions options;
    options.data_dir = std::string(argv[2]) + "/data";
    options.token = multislice::control::kToken;
    options.port = std::atoi(argv[3]);
    options.heartbeat_timeout = std::chrono::milliseconds(3000);
    options.reconcile_interval = std::chrono::milliseconds(20);
    auto controller = multislice::control::Controller::Start(options);
    if (!controller.ok()) {
      std::fprintf(stderr, "%s\n", controller.status().message().c_str());
      return 1;
    }
    // Dies with the test if the test dies first.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    while (true) ::pause();  // until SIGKILL
  }
  multislice::control::g_self = argv[0];
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
