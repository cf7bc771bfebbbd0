// The controller over real HTTP on loopback: the API contract (every method
// and error of spec 4.1), then provisioning, reset, repair, preemption,
// expiry and quotas against in-process fake agents.
#include "control/controller.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <thread>

#include "common/temp_dir.h"
#include "control/control_testing.h"
#include "control/controller_fixture.h"
#include "control/fake_agent.h"
#include "control/http.h"
#include "gtest/gtest.h"

namespace multislice::control {
namespace {

using nlohmann::json;
using testing::CpuBody;
using testing::FakeAgent;
using testing::kSeedBody;
using testing::WaitFor;
using Clock = std::chrono::steady_clock;

const char kToken[] = "test-token";
const char kParent[] = "/v2alpha1/projects/proj/locations/us-test1-a";

class ControllerTest : public testing::ControllerFixture {
 protected:
  ControllerTest() : ControllerFixture(kToken) {}

  HttpResponse Call(const std::string& method, const std::string& path,
                    const json* body = nullptr) {
    Result<HttpResponse> r = client_->Call(method, path, body);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : HttpResponse{};
  }
  // POSTs raw text (for malformed bodies).
  HttpResponse PostRaw(const std::string& path, const std::string& text) {
    httplib::Client raw(url_);
    auto res =
        raw.Post(path, {{"Authorization", std::string("Bearer ") + kToken}},
                 text, "application/json");
    HttpResponse out;
    if (!res) return out;
    out.status = res->status;
    out.body = json::parse(res->body, nullptr, false);
    return out;
  }
  HttpResponse Create(const std::string& id, const json& body) {
    return Call(
        "POST",
        std::string(kParent) + "/queuedResources?queued_resource_id=" + id,
        &body);
  }
  json Get(const std::string& id) {
    return Call("GET", std::string(kParent) + "/queuedResources/" + id).body;
  }
  std::string State(const std::string& id) {
    json qr = Get(id);
    return qr.contains("state") ? qr["state"].value("state", "") : "<none>";
  }
  bool WaitState(const std::string& id, const std::string& state,
                 std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    bool ok = WaitFor([&] { return State(id) == state; }, timeout);
    EXPECT_TRUE(ok) << id << " is " << State(id) << ", expected " << state;
    return ok;
  }
  // Every worker of queued resource `id` ever started by any agent.
  std::vector<testing::FakeWorker> History(const std::string& id) {
    std::vector<testing::FakeWorker> all;
    for (const auto& a : agents_) {
      for (const auto& w : a->history()) {
        if (w.name.rfind(id + ".", 0) == 0) all.push_back(w);
      }
    }
    return all;
  }
  // No worker of attempt N+1 started before every worker of attempt N
  // stopped.
  void ExpectNoOverlap(const std::string& id) {
    auto all = History(id);
    for (const auto& a : all) {
      for (const auto& b : all) {
        if (b.attempt > a.attempt) {
          EXPECT_FALSE(a.running) << a.name << " attempt " << a.attempt
                                  << " still runs beside attempt " << b.attempt;
          EXPECT_LE(a.stopped, b.started)
              << a.name << "@" << a.attempt << " overlaps " << b.name << "@"
              << b.attempt;
        }
      }
    }
  }
};

// Opens `n` TCP connections to 127.0.0.1:port that never send a byte.
std::vector<int> IdleConnections(int port, int n) {
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 &&
        ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      fds.push_back(fd);
    } else if (fd >= 0) {
      ::close(fd);
    }
  }
  return fds;
}

// Opens `n` connections from `source` (another loopback address) to
// 127.0.0.1:port, each sending the first line of a request and then
// nothing: clients that would hold a thread each while they "send".
std::vector<int> SlowConnections(const char* source, int port, int n) {
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    ::inet_pton(AF_INET, source, &from.sin_addr);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const char kStart[] =
        "GET /v2alpha1/projects/p/locations/z/queuedResources HTTP/1.1\r\n";
    if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) == 0 &&
        ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0 &&
        ::write(fd, kStart, sizeof(kStart) - 1) > 0) {
      fds.push_back(fd);
    } else {
      ::close(fd);
    }
  }
  return fds;
}

// A client address that opens slow connections by the hundred holds at most
// max_connections_per_address threads: the API stays quick for the others.
TEST_F(ControllerTest, SlowClientsOfOneAddressCannotHoldEveryThread) {
  ControllerOptions options;
  options.http_threads = 64;
  options.max_connections_per_address = 16;
  StartController(options);
  std::vector<int> slow =
      SlowConnections("127.0.0.2", controller_->port(), 200);
  ASSERT_EQ(slow.size(), 200u);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::vector<double> ms;
  for (int i = 0; i < 200; ++i) {
    const auto t0 = Clock::now();
    EXPECT_EQ(Call("GET", std::string(kParent) + "/queuedResources").status,
              200);
    ms.push_back(
        std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  // The connections beyond the bound were closed by the server.
  int closed = 0;
  for (int fd : slow) {
    pollfd p{fd, POLLIN, 0};
    char byte;
    closed += ::poll(&p, 1, 0) == 1 && ::read(fd, &byte, 1) == 0;
    ::close(fd);
  }
  std::sort(ms.begin(), ms.end());
  std::printf(
      "200 slow connections from 127.0.0.2: %d closed by the server; "
      "200 GETs from 127.0.0.1: p50 %.2f ms, p99 %.2f ms\n",
      closed, ms[100], ms[198]);
  EXPECT_GE(closed, 200 - 16);
  EXPECT_LT(ms[198], 50.0);
}

// Issue 12, defect 3: 70 idle connections held the 64 HTTP threads, the
// agents' heartbeats timed out and every ACTIVE queued resource was
// repaired. Now idle connections hold no thread (TCP_DEFER_ACCEPT), the
// agents have a port of their own, and a silent host is probed before it is
// declared lost.
TEST_F(ControllerTest, IdleConnectionFloodNeitherRepairsNorSlowsTheApi) {
  ControllerOptions options;
  options.heartbeat_timeout = std::chrono::milliseconds(1000);
  options.heartbeat_interval = std::chrono::milliseconds(100);
  StartController(options);
  AddAgent();
  AddAgent();
  ASSERT_EQ(Create("flood", CpuBody(2)).status, 200);
  ASSERT_TRUE(WaitState("flood", "ACTIVE"));
  std::vector<int> idle = IdleConnections(controller_->port(), 150);
  std::vector<int> idle_agent_port =
      IdleConnections(controller_->agent_port(), 50);
  EXPECT_EQ(idle.size(), 150u);
  // Three heartbeat timeouts of API calls under the flood.
  std::vector<double> ms;
  const auto end = Clock::now() + std::chrono::seconds(3);
  while (Clock::now() < end) {
    const auto t0 = Clock::now();
    HttpResponse r =
        Call("GET", std::string(kParent) + "/queuedResources/flood");
    ms.push_back(
        std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    EXPECT_EQ(r.status, 200);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int fd : idle) ::close(fd);
  for (int fd : idle_agent_port) ::close(fd);
  std::sort(ms.begin(), ms.end());
  const double p99 = ms[ms.size() * 99 / 100];
  std::printf("%zu GETs under 200 idle connections: p50 %.2f ms, p99 %.2f ms\n",
              ms.size(), ms[ms.size() / 2], p99);
  EXPECT_LT(p99, 50.0);
  json qr = Get("flood");
  EXPECT_EQ(qr["state"]["state"], "ACTIVE");
  EXPECT_EQ(qr["attempt"], 1) << "the flood made the controller repair";
  const json hosts = Call("GET", "/internal/v1/hosts").body["hosts"];
  for (const json& h : hosts) EXPECT_FALSE(h.value("lost", false)) << h.dump();
}

// A host whose heartbeats stop but whose agent answers the controller's
// probe is kept (the silence was the way there, not the host); one that
// answers neither is declared lost and its slice repaired.
TEST_F(ControllerTest, SilentHostIsProbedBeforeItIsDeclaredLost) {
  ControllerOptions options;
  options.heartbeat_timeout = std::chrono::milliseconds(600);
  options.heartbeat_interval = std::chrono::milliseconds(100);
  StartController(options);
  FakeAgent& a = AddAgent();
  ASSERT_EQ(Create("probe", CpuBody(1)).status, 200);
  ASSERT_TRUE(WaitState("probe", "ACTIVE"));
  // Heartbeats blocked on the way in, the agent still answering: simulated
  // by a controller that cannot hear it (a heartbeat-less agent whose
  // health answers).
  a.StopHeartbeatsOnly(true);
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  EXPECT_EQ(Get("probe")["attempt"], 1);
  a.StopHeartbeatsOnly(false);
  a.PauseHeartbeats(true);
  ASSERT_TRUE(WaitFor([&] {
    const json hosts = Call("GET", "/internal/v1/hosts").body["hosts"];
    for (const json& h : hosts) {
      if (h["id"] == a.host_id() && h.value("lost", false)) return true;
    }
    return false;
  }));
  a.PauseHeartbeats(false);
}

TEST_F(ControllerTest, AHostIsPlacedOnlyOnceItsAgentHoldsItsSecret) {
  // The controller's calls carry the secret a registration issued; an agent
  // that has not read its registration answer yet would refuse them. So a
  // host is placed only after a heartbeat signed with that secret.
  ControllerOptions options;
  options.reconcile_interval = std::chrono::milliseconds(20);
  options.heartbeat_timeout = std::chrono::milliseconds(5000);
  StartController(options);
  ASSERT_EQ(Create("late", CpuBody(1)).status, 200);
  agents_.push_back(std::make_unique<FakeAgent>(url_, kToken, "cpu-2"));
  FakeAgent& a = *agents_.back();
  a.StopHeartbeatsOnly(true);
  ASSERT_TRUE(WaitFor([&] { return !a.host_id().empty(); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(Get("late")["state"]["state"], "WAITING_FOR_RESOURCES");
  EXPECT_TRUE(a.history().empty());
  a.StopHeartbeatsOnly(false);
  ASSERT_TRUE(WaitState("late", "ACTIVE"));
  EXPECT_EQ(a.history().size(), 1u);
}

TEST_F(ControllerTest, UnauthenticatedRequestsAre401) {
  StartController();
  for (const char* token : {"", "wrong", "test-token-x"}) {
    ApiClient c = *ApiClient::Create(url_, token, std::chrono::seconds(5));
    for (const std::string& path : {std::string(kParent) + "/queuedResources",
                                    std::string(kParent) + "/queuedResources/x",
                                    std::string("/internal/v1/hosts")}) {
      HttpResponse r = *c.Call("GET", path);
      EXPECT_EQ(r.status, 401) << path;
      EXPECT_EQ(r.body["error"]["status"], "UNAUTHENTICATED");
      EXPECT_EQ(r.body["error"]["code"], 401);
    }
  }
}

TEST_F(ControllerTest, SeedBodyCreatesAndMalformedSeedNamesLineAndColumn) {
  StartController();
  HttpResponse op = PostRaw(
      std::string(kParent) + "/queuedResources?queued_resource_id=seed-qr",
      kSeedBody);
  ASSERT_EQ(op.status, 200) << op.body.dump();
  EXPECT_EQ(op.body["done"], false);
  EXPECT_EQ(op.body["metadata"]["verb"], "create");
  EXPECT_EQ(op.body["metadata"]["@type"],
            "type.googleapis.com/google.cloud.common.OperationMetadata");
  EXPECT_EQ(op.body["metadata"]["target"],
            "projects/proj/locations/us-test1-a/queuedResources/seed-qr");
  EXPECT_EQ(op.body["metadata"]["apiVersion"], "v2alpha1");
  EXPECT_EQ(op.body["metadata"]["cancelRequested"], false);
  const std::string op_name = op.body["name"];
  EXPECT_EQ(op_name.rfind("projects/proj/locations/us-test1-a/operations/", 0),
            0u);
  // No v4 hosts: it waits; the create operation completes.
  WaitState("seed-qr", "WAITING_FOR_RESOURCES");
  json qr = Get("seed-qr");
  EXPECT_EQ(qr["name"],
            "projects/proj/locations/us-test1-a/queuedResources/seed-qr");
  EXPECT_EQ(qr["tpu"]["nodeSpec"][0]["node"]["acceleratorType"], "v4-16");
  EXPECT_EQ(
      qr["tpu"]["nodeSpec"][0]["node"]["networkConfig"]["enableExternalIps"],
      true);
  // The request's multi_node_params come back as one spec per node.
  ASSERT_EQ(qr["tpu"]["nodeSpec"].size(), 2u);
  EXPECT_EQ(qr["tpu"]["nodeSpec"][1]["nodeId"], "seed-qr-1");
  EXPECT_EQ(qr["tpu"]["nodeSpec"][0]["node"]["metadata"]["startup-script"],
            "#!/bin/bash\necho hello");
  EXPECT_FALSE(qr["tpu"].contains("node_spec"));
  EXPECT_EQ(qr["guaranteed"]["reserved"], true);
  EXPECT_EQ(qr["state"]["stateInitiator"], "USER");
  ASSERT_EQ(qr["nodes"].size(), 2u);
  EXPECT_EQ(qr["nodes"][0]["nodeId"], "seed-qr-0");
  EXPECT_EQ(qr["nodes"][1]["nodeId"], "seed-qr-1");
  HttpResponse done = Call("GET", "/v2alpha1/" + op_name);
  EXPECT_EQ(done.status, 200);
  EXPECT_EQ(done.body["done"], true);
  EXPECT_EQ(done.body["response"]["name"], qr["name"]);

  // The seed as published: the comma after "tags" is missing.
  std::string broken = kSeedBody;
  const std::string tags = R"(["example-tag-1"],)";
  broken.erase(broken.find(tags) + tags.size() - 1, 1);
  HttpResponse bad = PostRaw(
      std::string(kParent) + "/queuedResources?queued_resource_id=broken",
      broken);
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.body["error"]["status"], "INVALID_ARGUMENT");
  // The error is at the "metadata" key that follows: its line, and a column
  // inside that key.
  int line = 1;
  size_t at = broken.find("\"metadata\"");
  for (size_t i = 0; i < at; ++i) line += broken[i] == '\n';
  const size_t line_start = broken.rfind('\n', at) + 1;
  const std::string message = bad.body["error"]["message"];
  EXPECT_NE(message.find("line " + std::to_string(line) + ","),
            std::string::npos)
      << message;
  int column = 0;
  ASSERT_EQ(
      std::sscanf(message.c_str() + message.find("column ") + 7, "%d", &column),
      1);
  EXPECT_GE(column, static_cast<int>(at - line_start) + 1) << message;
  EXPECT_LE(column, static_cast<int>(at - line_start) + 10) << message;
  EXPECT_EQ(
      Call("GET", std::string(kParent) + "/queuedResources/broken").status,
      404);
}

TEST_F(ControllerTest, ValidationErrorsNameTheField) {
  StartController();
  struct Case {
    std::function<void(json&)> edit;
    std::string field;
  };
  std::vector<Case> cases = {
      {[](json& b) {
         b["tpu"]["node_spec"][0]["multi_node_params"]["node_count"] = 1;
       },
       "tpu.node_spec[0].multi_node_params.node_count"},
      {[](json& b) {
         b["tpu"]["node_spec"][0]["multi_node_params"]["node_count"] = 257;
       },
       "tpu.node_spec[0].multi_node_params.node_count"},
      {[](json& b) { b["tpu"]["node_spec"][0]["node_id"] = "n"; },
       "tpu.node_spec[0].node_id"},
      {[](json& b) {
         b["tpu"]["node_spec"].push_back(b["tpu"]["node_spec"][0]);
       },
       "tpu.node_spec"},
      {[](json& b) {
         b["tpu"]["node_spec"][0]["node"]["accelerator_type"] = "v9-8";
       },
       "tpu.node_spec[0].node.accelerator_type"},
      {[](json& b) {
         b["tpu"]["node_spec"][0]["node"].erase("accelerator_type");
       },
       "tpu.node_spec[0].node.accelerator_type"},
      {[](json& b) { b["tpu"]["node_spec"][0]["node"]["bogus"] = 1; },
       "tpu.node_spec[0].node.bogus"},
      {[](json& b) {
         b["queueing_policy"] = {{"valid_until_duration", "soon"}};
       },
       "queueing_policy.valid_until_duration"},
      {[](json& b) {
         b["spot"] = json::object();
         b["guaranteed"] = {{"reserved", true}};
       },
       "guaranteed"},
      {[](json& b) {
         b["tpu"]["node_spec"][0]["node"]["metadata"]["startup-script"] =
             std::string(300 * 1024, 'x');
       },
       "tpu.node_spec[0].node.metadata"},
      {[](json& b) { b["tpu"]["nodeSpec"] = b["tpu"]["node_spec"]; },
       "tpu.node_spec"},
  };
  for (const Case& c : cases) {
    json body = CpuBody(2);
    c.edit(body);
    HttpResponse r = Create("v", body);
    EXPECT_EQ(r.status, 400) << c.field;
    EXPECT_EQ(r.body["error"]["status"], "INVALID_ARGUMENT");
    const std::string message = r.body["error"].value("message", "");
    EXPECT_EQ(message.rfind(c.field, 0), 0u)
        << "expected '" << c.field << "' in: " << message;
  }
  // The id, the body type and the size.
  json body = CpuBody(2);
  EXPECT_EQ(Create("bad*id", body).status, 400);
  EXPECT_EQ(
      Call("POST", std::string(kParent) + "/queuedResources", &body).status,
      400);
  json array = json::array();
  EXPECT_EQ(Create("arr", array).status, 400);
  HttpResponse big =
      PostRaw(std::string(kParent) + "/queuedResources?queued_resource_id=big",
              std::string(2 << 20, ' '));
  EXPECT_EQ(big.status, 413);
  EXPECT_EQ(big.body["error"]["code"], 413);
  // camelCase input is accepted as well.
  json camel = {{"tpu",
                 {{"nodeSpec",
                   {{{"multiNodeParams", {{"nodeCount", 2}}},
                     {"node", {{"acceleratorType", "cpu-2"}}}}}}}}};
  EXPECT_EQ(Create("camel", camel).status, 200);
}

TEST_F(ControllerTest, GetListDeleteResetAndOperations) {
  StartController();
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(Create("qr" + std::to_string(i), CpuBody(2)).status, 200);
  }
  EXPECT_EQ(Create("qr1", CpuBody(2)).status, 409);
  EXPECT_EQ(Create("qr1", CpuBody(2)).body["error"]["status"],
            "ALREADY_EXISTS");
  // Pages of 2: qr0 qr1 | qr2 qr3 | qr4, in creation order.
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    HttpResponse page =
        Call("GET", std::string(kParent) + "/queuedResources?pageSize=2" +
                        (token.empty() ? "" : "&pageToken=" + token));
    ASSERT_EQ(page.status, 200);
    EXPECT_LE(page.body["queuedResources"].size(), 2u);
    for (const json& q : page.body["queuedResources"]) {
      std::string name = q["name"];
      seen.push_back(name.substr(name.rfind('/') + 1));
    }
    token = page.body.value("nextPageToken", "");
    ++pages;
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen,
            (std::vector<std::string>{"qr0", "qr1", "qr2", "qr3", "qr4"}));
  EXPECT_EQ(
      Call("GET", std::string(kParent) + "/queuedResources?pageToken=x").status,
      400);
  EXPECT_EQ(
      Call("GET", std::string(kParent) + "/queuedResources?pageSize=-1").status,
      400);
  // Another zone sees none; '-' sees all; /v2/ is the same API.
  EXPECT_EQ(Call("GET",
                 "/v2alpha1/projects/proj/locations/other/"
                 "queuedResources")
                .body["queuedResources"]
                .size(),
            0u);
  EXPECT_EQ(Call("GET", "/v2/projects/proj/locations/-/queuedResources")
                .body["queuedResources"]
                .size(),
            5u);
  EXPECT_EQ(Call("GET",
                 "/v2/projects/proj/locations/us-test1-a/"
                 "queuedResources/qr0")
                .status,
            200);
  // 404s.
  HttpResponse missing =
      Call("GET", std::string(kParent) + "/queuedResources/nope");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.body["error"]["status"], "NOT_FOUND");
  EXPECT_EQ(Call("GET", std::string(kParent) + "/operations/nope").status, 404);
  EXPECT_EQ(
      Call("DELETE", std::string(kParent) + "/queuedResources/nope").status,
      404);
  EXPECT_EQ(Call("GET", "/v3/whatever").status, 404);
  // Delete without force of a waiting queued resource: refused.
  WaitState("qr0", "WAITING_FOR_RESOURCES");
  HttpResponse refused =
      Call("DELETE", std::string(kParent) + "/queuedResources/qr0");
  EXPECT_EQ(refused.status, 400);
  EXPECT_EQ(refused.body["error"]["status"], "FAILED_PRECONDITION");
  // Reset of a queued resource that is not ACTIVE: refused.
  HttpResponse reset =
      Call("POST", std::string(kParent) + "/queuedResources/qr0:reset");
  EXPECT_EQ(reset.status, 400);
  EXPECT_EQ(reset.body["error"]["status"], "FAILED_PRECONDITION");
  // With force: an operation that completes when it is gone.
  HttpResponse del =
      Call("DELETE", std::string(kParent) + "/queuedResources/qr0?force=true");
  ASSERT_EQ(del.status, 200);
  EXPECT_EQ(del.body["metadata"]["verb"], "delete");
  const std::string op = del.body["name"];
  EXPECT_TRUE(WaitFor([&] {
    return Call("GET", "/v2alpha1/" + op).body.value("done", false);
  }));
  EXPECT_EQ(Call("GET", std::string(kParent) + "/queuedResources/qr0").status,
            404);
}

TEST_F(ControllerTest, ProvisionsResetsAndRepairs) {
  ControllerOptions options;
  options.heartbeat_timeout = std::chrono::milliseconds(1000);
  options.reconcile_interval = std::chrono::milliseconds(20);
  StartController(options);
  for (int i = 0; i < 3; ++i) AddAgent();
  AddAgent("cpu-4");  // the wrong type: never used for cpu-2 slices
  const auto created = Clock::now();
  ASSERT_EQ(Create("job", CpuBody(2, "", "echo start; sleep 1000")).status,
            200);
  ASSERT_TRUE(WaitState("job", "ACTIVE"));
  const double active_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - created).count();
  std::printf("create -> ACTIVE: %.0f ms\n", active_ms);
  json qr = Get("job");
  EXPECT_EQ(qr["attempt"], 1);
  EXPECT_EQ(qr["nodes"][0]["state"], "READY");
  EXPECT_EQ(qr["nodes"][1]["state"], "READY");
  auto history = History("job");
  ASSERT_EQ(history.size(), 2u);
  std::set<std::string> slice_ids;
  for (const auto& w : history) {
    EXPECT_EQ(w.attempt, 1);
    EXPECT_EQ(w.script, "echo start; sleep 1000");
    EXPECT_EQ(w.env["MEGASCALE_NUM_SLICES"], "2");
    EXPECT_EQ(w.env["TPU_WORKER_ID"], "0");
    EXPECT_EQ(w.env["TPU_WORKER_HOSTNAMES"], "127.0.0.1");
    EXPECT_EQ(w.env["MULTISLICE_ATTEMPT"], "1");
    EXPECT_EQ(w.env["MULTISLICE_RUN_ID"].get<std::string>().rfind("qr-", 0),
              0u);
    EXPECT_EQ(w.env["MULTISLICE_ACCELERATOR_TYPE"], "cpu-2");
    EXPECT_EQ(w.env["MEGASCALE_PORT"], "8080");
    // torch.distributed's and JAX's generic variables (issue 13).
    const std::string rank = w.env["MEGASCALE_SLICE_ID"];  // 1 host a slice
    EXPECT_EQ(w.env["RANK"], rank);
    EXPECT_EQ(w.env["JAX_PROCESS_ID"], rank);
    EXPECT_EQ(w.env["WORLD_SIZE"], "2");
    EXPECT_EQ(w.env["JAX_NUM_PROCESSES"], "2");
    EXPECT_EQ(w.env["LOCAL_RANK"], "0");
    EXPECT_EQ(w.env["MASTER_ADDR"], "127.0.0.1");
    const int port = std::stoi(w.env["MASTER_PORT"].get<std::string>());
    EXPECT_GE(port, 20000);
    EXPECT_EQ(w.env["JAX_COORDINATOR_ADDRESS"],
              "127.0.0.1:" + std::to_string(port + 1));
    EXPECT_EQ(w.env["MEGASCALE_COORDINATOR_ADDRESS"],
              "file://" + dir_.path() + "/data/stores/" +
                  w.env["MULTISLICE_RUN_ID"].get<std::string>());
    slice_ids.insert(w.env["MEGASCALE_SLICE_ID"]);
    EXPECT_EQ(w.name, "job." + std::string(w.env["MEGASCALE_SLICE_ID"]) + ".0");
  }
  EXPECT_EQ(slice_ids, (std::set<std::string>{"0", "1"}));
  EXPECT_EQ(agents_[3]->history().size(), 0u);
  // The workers listing of the protocol.
  HttpResponse workers =
      Call("GET", "/internal/v1/queuedResources/job/workers");
  ASSERT_EQ(workers.status, 200);
  ASSERT_EQ(workers.body["workers"].size(), 2u);
  EXPECT_EQ(workers.body["workers"][1]["nodeIndex"], 1);
  EXPECT_EQ(workers.body["workers"][1]["node"], "job-1");

  // :reset: every worker stops, then attempt 2 starts everywhere.
  ASSERT_EQ(
      Call("POST", std::string(kParent) + "/queuedResources/job:reset").status,
      200);
  ASSERT_TRUE(WaitFor([&] { return Get("job").value("attempt", 0) == 2; }));
  ASSERT_TRUE(WaitState("job", "ACTIVE"));
  ExpectNoOverlap("job");
  EXPECT_EQ(History("job").size(), 4u);

  // Heartbeats stop on one of its hosts: lost within timeout + 1 s,
  // replaced by the spare, the other slice reset, attempt 3.
  std::string victim_host = Get("job")["nodes"][0]["hosts"][0];
  FakeAgent* victim = nullptr;
  for (auto& a : agents_) {
    if (a->host_id() == victim_host) victim = a.get();
  }
  ASSERT_NE(victim, nullptr);
  victim->PauseHeartbeats(true);
  const auto paused = Clock::now();
  auto victim_lost = [&] {
    const json hosts = Call("GET", "/internal/v1/hosts").body["hosts"];
    for (const json& h : hosts) {
      if (h["id"] == victim_host) return h.value("lost", false);
    }
    return false;
  };
  ASSERT_TRUE(WaitFor(victim_lost));
  const double detect_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - paused).count();
  ASSERT_TRUE(WaitFor([&] {
    json q = Get("job");
    return q["state"]["state"] == "ACTIVE" && q["attempt"] == 3;
  }));
  const double repair_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - paused).count();
  std::printf(
      "heartbeat loss detected after %.0f ms, ACTIVE again after %.0f "
      "ms\n",
      detect_ms, repair_ms);
  EXPECT_LT(detect_ms, 1000 + 1000);
  EXPECT_LT(repair_ms, 10000);
  qr = Get("job");
  EXPECT_NE(qr["nodes"][0]["hosts"][0], victim_host);
  EXPECT_EQ(victim->running(), 0);  // its worker was stopped too
  ExpectNoOverlap("job");
  victim->PauseHeartbeats(false);
  ASSERT_TRUE(WaitFor([&] { return !victim_lost(); }));  // registered again

  // admin fail-host on the other slice's host.
  std::string failed = Get("job")["nodes"][1]["hosts"][0];
  HttpResponse fail = Call("POST", "/internal/v1/hosts/" + failed + ":fail");
  ASSERT_EQ(fail.status, 200);
  EXPECT_EQ(fail.body["queuedResource"],
            "projects/proj/locations/us-test1-a/queuedResources/job");
  ASSERT_TRUE(WaitFor([&] {
    json q = Get("job");
    return q["state"]["state"] == "ACTIVE" && q["attempt"] == 4;
  }));
  EXPECT_NE(Get("job")["nodes"][1]["hosts"][0], failed);
  ExpectNoOverlap("job");

  // Delete with force: workers stopped, then gone.
  ASSERT_EQ(
      Call("DELETE", std::string(kParent) + "/queuedResources/job?force=true")
          .status,
      200);
  ASSERT_TRUE(WaitFor([&] {
    return Call("GET", std::string(kParent) + "/queuedResources/job").status ==
           404;
  }));
  for (const auto& a : agents_) EXPECT_EQ(a->running(), 0);
}

// An agent that cannot be reached when the controller calls it is lost at
// once, without waiting for its heartbeats to time out.
TEST_F(ControllerTest, UnreachableAgentIsLostAtOnce) {
  ControllerOptions options;
  options.heartbeat_timeout = std::chrono::seconds(60);
  options.reconcile_interval = std::chrono::milliseconds(20);
  StartController(options);
  for (int i = 0; i < 3; ++i) AddAgent();
  ASSERT_EQ(Create("job", CpuBody(2)).status, 200);
  ASSERT_TRUE(WaitState("job", "ACTIVE"));
  const std::string dead = Get("job")["nodes"][0]["hosts"][0];
  for (auto& a : agents_) {
    if (a->host_id() == dead) a->Kill();
  }
  const auto killed = Clock::now();
  ASSERT_EQ(
      Call("POST", std::string(kParent) + "/queuedResources/job:reset").status,
      200);
  ASSERT_TRUE(WaitFor(
      [&] {
        json q = Get("job");
        return q["state"]["state"] == "ACTIVE" && q["attempt"] == 2;
      },
      std::chrono::seconds(5)));
  EXPECT_LT(Clock::now() - killed, std::chrono::seconds(5));
  EXPECT_NE(Get("job")["nodes"][0]["hosts"][0], dead);
  const json hosts = Call("GET", "/internal/v1/hosts").body["hosts"];
  for (const json& h : hosts) {
    if (h["id"] == dead) {
      EXPECT_TRUE(h.value("lost", false));
      EXPECT_EQ(h.value("lostReason", ""), "agent unreachable");
    }
  }
  ExpectNoOverlap("job");
}

// Agents at two addresses (127.0.0.2 stands in for another machine): the
// workers share a redis-server the controller starts, and stops with itself.
TEST_F(ControllerTest, AgentsOnSeveralAddressesShareARedisCoordinator) {
  ControllerOptions options;
  options.reconcile_interval = std::chrono::milliseconds(20);
  StartController(options);
  AddAgent();
  agents_.push_back(std::make_unique<FakeAgent>(url_, kToken, "cpu-2",
                                                "us-test1-a", "127.0.0.2"));
  ASSERT_TRUE(WaitFor([&] { return !agents_.back()->host_id().empty(); }));
  ASSERT_EQ(Create("multi", CpuBody(2)).status, 200);
  ASSERT_TRUE(WaitState("multi", "ACTIVE"));
  auto history = History("multi");
  ASSERT_EQ(history.size(), 2u);
  const std::string address =
      history[0].env["MEGASCALE_COORDINATOR_ADDRESS"].get<std::string>();
  EXPECT_EQ(history[1].env["MEGASCALE_COORDINATOR_ADDRESS"], address);
  // redis://USER:PASSWORD@127.0.0.1:PORT: an ACL user of this QR's own.
  ASSERT_EQ(address.rfind("redis://ms-qr-", 0), 0u) << address;
  const size_t at = address.rfind('@');
  ASSERT_NE(at, std::string::npos);
  ASSERT_EQ(address.compare(at, 11, "@127.0.0.1:"), 0) << address;
  const std::string credentials = address.substr(8, at - 8);
  const std::string user = credentials.substr(0, credentials.find(':'));
  const std::string password = credentials.substr(credentials.find(':') + 1);
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  std::set<std::string> hostnames;
  for (const auto& w : history) {
    hostnames.insert(w.env["TPU_WORKER_HOSTNAMES"].get<std::string>());
  }
  EXPECT_EQ(hostnames, (std::set<std::string>{"127.0.0.1", "127.0.0.2"}));
  // Sends RESP commands (words split on spaces) to the server and returns
  // the last reply's first line ("" when the server does not answer).
  auto send = [port](const std::vector<std::string>& commands) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string reply;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      timeval tv{1, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      for (const std::string& command : commands) {
        const std::string line = command + "\r\n";
        char buf[256] = {};
        if (::write(fd, line.data(), line.size()) <= 0 ||
            ::read(fd, buf, sizeof(buf) - 1) <= 0) {
          reply.clear();
          break;
        }
        reply = std::string(buf).substr(0, std::string(buf).find('\r'));
      }
    }
    ::close(fd);
    return reply;
  };
  // Issue 12, defect 5: the coordinator was open to anyone who reached it.
  EXPECT_TRUE(WaitFor([&] { return !send({"PING"}).empty(); }));
  EXPECT_EQ(send({"PING"}).rfind("-NOAUTH", 0), 0u) << send({"PING"});
  EXPECT_EQ(send({"SET multislice/attempt/x 99"}).rfind("-NOAUTH", 0), 0u);
  const std::string auth = "AUTH " + user + " " + password;
  EXPECT_EQ(send({auth, "PING"}), "+PONG");
  // The QR's own user reaches its own keys only.
  const std::string run = user.substr(3);  // "qr-<uid>"
  EXPECT_EQ(send({auth, "SET " + run + "/1/k v"}), "+OK");
  EXPECT_EQ(send({auth, "SET other/1/k v"}).rfind("-NOPERM", 0), 0u);
  EXPECT_EQ(send({auth, "CONFIG GET requirepass"}).rfind("-NOPERM", 0), 0u);
  agents_.clear();
  controller_->Stop();
  EXPECT_EQ(send({"PING"}), "");
}

// Issue 12, defect 4: the rendezvous was keyed by the bare id and never
// removed, so a QR created again under a deleted one's id, or QRs of one id
// in two projects, met each other's stale keys. Now each run has its own
// identity (from the record's uid) and its namespace goes with it.
TEST_F(ControllerTest, EachRunHasItsOwnRendezvousNamespace) {
  ControllerOptions options;
  options.reconcile_interval = std::chrono::milliseconds(20);
  StartController(options);
  AddAgent();
  AddAgent();
  auto run_of = [&](const std::string& id) {
    auto h = History(id);
    return h.empty() ? std::string()
                     : h.back().env["MULTISLICE_RUN_ID"].get<std::string>();
  };
  const std::string stores = dir_.path() + "/data/stores/";
  ASSERT_EQ(Create("re", CpuBody(1)).status, 200);
  ASSERT_TRUE(WaitState("re", "ACTIVE"));
  const std::string first = run_of("re");
  ASSERT_FALSE(first.empty());
  EXPECT_TRUE(std::filesystem::is_directory(stores + first));
  ASSERT_EQ(
      Call("DELETE", std::string(kParent) + "/queuedResources/re?force=true")
          .status,
      200);
  ASSERT_TRUE(WaitFor([&] {
    return Call("GET", std::string(kParent) + "/queuedResources/re").status ==
           404;
  }));
  EXPECT_FALSE(std::filesystem::exists(stores + first));  // removed
  ASSERT_EQ(Create("re", CpuBody(1)).status, 200);
  ASSERT_TRUE(WaitState("re", "ACTIVE"));
  EXPECT_NE(run_of("re"), first);
  // The same id in two projects at once.
  std::set<std::string> runs;
  for (const std::string project : {"pa", "pb"}) {
    json body = CpuBody(1);
    body["tpu"]["node_spec"][0]["parent"] =
        "projects/" + project + "/locations/us-test1-a";
    const std::string qrs = "/v2alpha1/projects/" + project +
                            "/locations/us-test1-a/queuedResources";
    ASSERT_EQ(Call("DELETE", qrs + "/re?force=true").status, 404);
    ASSERT_EQ(Call("POST", qrs + "?queued_resource_id=x", &body).status, 200);
  }
  AddAgent();
  ASSERT_TRUE(WaitFor([&] {
    int active = 0;
    for (const std::string project : {"pa", "pb"}) {
      json q = Call("GET", "/v2alpha1/projects/" + project +
                               "/locations/us-test1-a/queuedResources/x")
                   .body;
      active += q["state"].value("state", "") == "ACTIVE";
    }
    return active == 2;
  }));
  for (const auto& w : History("x")) {
    runs.insert(w.env["MULTISLICE_RUN_ID"].get<std::string>());
  }
  EXPECT_EQ(runs.size(), 2u);
}

// Issue 12, defect 9: lost hosts piled up across restarts and
// re-registrations. Now a host lost for longer than the retention, and held
// by no queued resource, is forgotten, in memory and in the store.
TEST_F(ControllerTest, LongLostHostsAreForgotten) {
  ControllerOptions options;
  options.heartbeat_timeout = std::chrono::milliseconds(300);
  options.heartbeat_interval = std::chrono::milliseconds(50);
  options.lost_host_retention = std::chrono::milliseconds(500);
  StartController(options);
  FakeAgent& gone = AddAgent();
  AddAgent();
  const std::string id = gone.host_id();
  gone.Kill();
  auto listed = [&] {
    std::set<std::string> ids;
    const json hosts = Call("GET", "/internal/v1/hosts").body["hosts"];
    for (const json& h : hosts) ids.insert(h["id"].get<std::string>());
    return ids;
  };
  ASSERT_TRUE(
      WaitFor([&] { return !listed().count(id); }, std::chrono::seconds(10)));
  EXPECT_EQ(listed().size(), 1u);  // the live one stays
  // And after a restart on the same data directory.
  controller_.reset();
  StartController(options);
  EXPECT_FALSE(listed().count(id));
}

// Issue 13 (first part): what Google's client libraries call beside queued
// resources. The create takes the id as queuedResourceId too (their name
// for it), and the nodes a queued resource made are visible as nodes.
TEST_F(ControllerTest,
       NodesAcceleratorTypesRuntimeVersionsLocationsOperations) {
  ControllerOptions options;
  options.reconcile_interval = std::chrono::milliseconds(20);
  StartController(options);
  AddAgent();
  AddAgent();
  const json body = CpuBody(2);
  const std::string qrs = std::string(kParent) + "/queuedResources";
  EXPECT_EQ(
      Call("POST", qrs + "?queued_resource_id=a&queuedResourceId=b", &body)
          .status,
      400);
  ASSERT_EQ(Call("POST", qrs + "?queuedResourceId=libs", &body).status, 200);
  ASSERT_TRUE(WaitState("libs", "ACTIVE"));
  for (const char* api : {"/v2alpha1", "/v2"}) {
    const std::string parent =
        std::string(api) + "/projects/proj/locations/us-test1-a";
    HttpResponse nodes = Call("GET", parent + "/nodes");
    ASSERT_EQ(nodes.status, 200) << nodes.body.dump();
    ASSERT_EQ(nodes.body["nodes"].size(), 2u) << nodes.body.dump();
    const json& node = nodes.body["nodes"][0];
    EXPECT_EQ(node["name"], "projects/proj/locations/us-test1-a/nodes/libs-0");
    EXPECT_EQ(node["state"], "READY");
    EXPECT_EQ(node["acceleratorType"], "cpu-2");
    EXPECT_EQ(node["queuedResource"],
              "projects/proj/locations/us-test1-a/queuedResources/libs");
    EXPECT_EQ(node["networkEndpoints"].size(), 1u);
    EXPECT_EQ(Call("GET", parent + "/nodes/libs-1").body["name"],
              "projects/proj/locations/us-test1-a/nodes/libs-1");
    EXPECT_EQ(Call("GET", parent + "/nodes/nope").status, 404);
    EXPECT_EQ(Call("GET", parent + "/nodes?pageSize=1").body["nodes"].size(),
              1u);
    const json types = Call("GET", parent + "/acceleratorTypes").body;
    ASSERT_EQ(types["acceleratorTypes"].size(), 1u) << types.dump();
    EXPECT_EQ(types["acceleratorTypes"][0]["type"], "cpu-2");
    EXPECT_EQ(Call("GET", parent + "/acceleratorTypes/v4-8").body["type"],
              "v4-8");
    EXPECT_EQ(Call("GET", parent + "/acceleratorTypes/v9-8").status, 404);
    const json versions = Call("GET", parent + "/runtimeVersions").body;
    EXPECT_EQ(versions["runtimeVersions"][0]["version"], "tpu-ubuntu2204-base");
    EXPECT_EQ(
        Call("GET", parent + "/runtimeVersions/tpu-ubuntu2204-base").status,
        200);
    const json ops = Call("GET", parent + "/operations").body;
    ASSERT_GE(ops["operations"].size(), 1u) << ops.dump();
    const std::string op = ops["operations"][0]["name"];
    const std::string op_path =
        std::string(api) + "/" + op.substr(0, op.size());
    EXPECT_EQ(Call("POST", op_path + ":cancel").status, 200);
    EXPECT_EQ(Call("DELETE", op_path).status, 200);
    EXPECT_EQ(Call("POST", parent + "/operations/operation-none:cancel").status,
              404);
  }
  for (const char* api : {"/v1", "/v2alpha1", "/v2"}) {
    const json locations =
        Call("GET", std::string(api) + "/projects/proj/locations").body;
    ASSERT_EQ(locations["locations"].size(), 1u) << locations.dump();
    EXPECT_EQ(locations["locations"][0]["locationId"], "us-test1-a");
    EXPECT_EQ(
        Call("GET", std::string(api) + "/projects/proj/locations/us-test1-a")
            .body["name"],
        "projects/proj/locations/us-test1-a");
  }
  EXPECT_EQ(Call("GET", "/v1/projects/proj/locations/mars-1").status, 404);
}

// Issue 13: each API version has its own schema. v2 calls the slices
// multislice_params and has no best_effort; v2alpha1 has multi_node_params.
TEST_F(ControllerTest, V2AndV2alpha1EachHaveTheirOwnSchema) {
  ControllerOptions options;
  options.reconcile_interval = std::chrono::milliseconds(20);
  StartController(options);
  AddAgent();
  AddAgent();
  const std::string v2 =
      "/v2/projects/proj/locations/us-test1-a/queuedResources";
  const std::string alpha = std::string(kParent) + "/queuedResources";
  json v2_body = CpuBody(2);
  v2_body["tpu"]["node_spec"][0].erase("multi_node_params");
  v2_body["tpu"]["node_spec"][0]["multislice_params"] = {{"node_count", 2}};
  HttpResponse created = Call("POST", v2 + "?queuedResourceId=vtwo", &v2_body);
  ASSERT_EQ(created.status, 200) << created.body.dump();
  ASSERT_TRUE(WaitState("vtwo", "ACTIVE"));
  // Either version answers as Google's service does: one node spec per
  // node, each with its nodeId, neither version's params.
  for (const std::string& path : {v2 + "/vtwo", alpha + "/vtwo"}) {
    const json answer = Call("GET", path).body;
    const json& specs = answer["tpu"]["nodeSpec"];
    ASSERT_EQ(specs.size(), 2u) << answer.dump();
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(specs[i]["nodeId"], "vtwo-" + std::to_string(i));
      EXPECT_FALSE(specs[i].contains("multisliceParams"));
      EXPECT_FALSE(specs[i].contains("multiNodeParams"));
      EXPECT_EQ(specs[i]["node"]["acceleratorType"], "cpu-2");
    }
  }
  // The finished create operation answers in its own version.
  const std::string op = created.body["name"];
  const json done = Call("GET", "/v2/" + op).body;
  EXPECT_EQ(done["response"]["@type"],
            "type.googleapis.com/google.cloud.tpu.v2.QueuedResource");
  EXPECT_EQ(done["response"]["tpu"]["nodeSpec"].size(), 2u);
  // What the other version calls it is refused, naming the field.
  const json alpha_body = CpuBody(2);
  HttpResponse wrong = Call("POST", v2 + "?queuedResourceId=w", &alpha_body);
  EXPECT_EQ(wrong.status, 400);
  EXPECT_NE(wrong.body.dump().find("multi_node_params"), std::string::npos);
  json best = v2_body;
  best["best_effort"] = json::object();
  EXPECT_EQ(Call("POST", v2 + "?queuedResourceId=b", &best).status, 400);
  EXPECT_EQ(Call("POST", alpha + "?queuedResourceId=c", &v2_body).status, 400);
}

// Issue 13 (first-hour trap): a queued resource waiting for resources says
// why, so `queued-resources create` can print it instead of waiting in
// silence.
TEST_F(ControllerTest, WaitingForResourcesSaysWhy) {
  ControllerOptions options;
  options.reconcile_interval = std::chrono::milliseconds(20);
  StartController(options);
  ASSERT_EQ(Create("waits", CpuBody(2)).status, 200);
  ASSERT_TRUE(WaitState("waits", "WAITING_FOR_RESOURCES"));
  EXPECT_EQ(Get("waits")["waitingReason"],
            "no host of type cpu-2 in zone us-test1-a (nor in any other zone)");
  agents_.push_back(
      std::make_unique<FakeAgent>(url_, kToken, "cpu-2", "us-test2-b"));
  ASSERT_TRUE(WaitFor([&] { return !agents_.back()->host_id().empty(); }));
  EXPECT_EQ(Get("waits")["waitingReason"],
            "no host of type cpu-2 in zone us-test1-a; zones with such hosts: "
            "us-test2-b");
  AddAgent();
  EXPECT_EQ(Get("waits")["waitingReason"],
            "needs 2 free hosts of type cpu-2 in zone us-test1-a; 1 of its 1 "
            "are free");
  AddAgent();
  ASSERT_TRUE(WaitState("waits", "ACTIVE"));
  EXPECT_FALSE(Get("waits").contains("waitingReason"));
}

TEST_F(ControllerTest, ReservedPreemptsSpotWhichKeepsQuotaUntilDeleted) {
  ControllerOptions options;
  options.reconcile_interval = std::chrono::milliseconds(20);
  StartController(options);
  AddAgent();
  AddAgent();
  ASSERT_EQ(Create("spot", CpuBody(2, "spot")).status, 200);
  ASSERT_TRUE(WaitState("spot", "ACTIVE"));
  json reserved = CpuBody(2, "reserved");
  reserved["tpu"]["node_spec"][0]["multi_node_params"]["node_id_prefix"] =
      "res";
  ASSERT_EQ(Create("res", reserved).status, 200);
  ASSERT_TRUE(WaitState("res", "ACTIVE"));
  json spot = Get("spot");
  EXPECT_EQ(spot["state"]["state"], "SUSPENDED");
  EXPECT_EQ(spot["state"]["stateInitiator"], "SERVICE");
  EXPECT_EQ(spot["quotaHeldChips"], 4);
  EXPECT_EQ(spot["nodes"][0]["state"], "PREEMPTED");
  ExpectNoOverlap("spot");
  for (const auto& w : History("spot")) EXPECT_FALSE(w.running);
  // SUSPENDED: deletable without force.
  EXPECT_EQ(
      Call("DELETE", std::string(kParent) + "/queuedResources/spot").status,
      200);
  ASSERT_TRUE(WaitFor([&] {
    return Call("GET", std::string(kParent) + "/queuedResources/spot").status ==
           404;
  }));
  // ACTIVE: not without force.
  EXPECT_EQ(
      Call("DELETE", std::string(kParent) + "/queuedResources/res").status,
      400);
}

TEST_F(ControllerTest, QueueingPolicyAndQuota) {
  ControllerOptions options;
  options.reconcile_interval = std::chrono::milliseconds(20);
  options.quota_chips[static_cast<int>(Tier::kOnDemand)] = 4;
  StartController(options);
  json expiring = CpuBody(2);
  expiring["queueing_policy"] = {{"valid_until_duration", "0.3s"}};
  ASSERT_EQ(Create("expiring", expiring).status, 200);
  json later = CpuBody(2);
  later["queueing_policy"] = {{"valid_after_duration", "0.5s"}};
  later["tpu"]["node_spec"][0]["multi_node_params"]["node_id_prefix"] = "l";
  ASSERT_EQ(Create("later", later).status, 200);
  EXPECT_EQ(State("later"), "ACCEPTED");
  ASSERT_TRUE(WaitState("expiring", "FAILED"));
  json failed = Get("expiring");
  EXPECT_NE(failed["state"]["failedData"]["error"]
                .value("message", "")
                .find("valid_until"),
            std::string::npos);
  EXPECT_EQ(failed["quotaHeldChips"], 0);  // it never held any
  ASSERT_TRUE(WaitState("later", "WAITING_FOR_RESOURCES"));
  // Quota: 4 on-demand chips; "later" takes them once hosts exist, and a
  // second request waits although a host is free.
  for (int i = 0; i < 3; ++i) AddAgent();
  ASSERT_TRUE(WaitState("later", "ACTIVE"));
  json one = CpuBody(1);
  ASSERT_EQ(Create("over", one).status, 200);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(State("over"), "WAITING_FOR_RESOURCES");
  EXPECT_EQ(Get("later")["quotaHeldChips"], 4);
  ASSERT_EQ(
      Call("DELETE", std::string(kParent) + "/queuedResources/later?force=true")
          .status,
      200);
  ASSERT_TRUE(WaitState("over", "ACTIVE"));
}

// The console's extra fields and calls: the state history (persisted with
// the record), the operations of one queued resource, and the capacity.
TEST_F(ControllerTest, StateHistoryOperationsAndCapacity) {
  ControllerOptions options;
  options.reconcile_interval = std::chrono::milliseconds(20);
  options.quota_chips[static_cast<int>(Tier::kSpot)] = 64;
  StartController(options);
  for (int i = 0; i < 3; ++i) AddAgent();
  ASSERT_EQ(Create("job", CpuBody(2, "", "sleep 1000")).status, 200);
  ASSERT_TRUE(WaitState("job", "ACTIVE"));
  ASSERT_EQ(
      Call("POST", std::string(kParent) + "/queuedResources/job:reset").status,
      200);
  ASSERT_TRUE(WaitFor([&] { return Get("job").value("attempt", 0) == 2; }));
  ASSERT_TRUE(WaitState("job", "ACTIVE"));

  const json history = Get("job")["stateHistory"];
  std::vector<std::string> states;
  std::string last_time;
  for (const json& h : history) {
    states.push_back(h["state"]);
    EXPECT_EQ(h["initiator"], "USER");
    EXPECT_GE(h["time"].get<std::string>(), last_time);  // RFC 3339, UTC
    last_time = h["time"];
  }
  EXPECT_EQ(states, (std::vector<std::string>{
                        "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING",
                        "ACTIVE", "PROVISIONING", "ACTIVE"}));

  HttpResponse ops = Call("GET", "/internal/v1/queuedResources/job/operations");
  ASSERT_EQ(ops.status, 200);
  ASSERT_EQ(ops.body["operations"].size(), 2u);
  EXPECT_EQ(ops.body["operations"][0]["metadata"]["verb"], "create");
  EXPECT_EQ(ops.body["operations"][1]["metadata"]["verb"], "reset");
  EXPECT_EQ(Call("GET", "/internal/v1/queuedResources/nope/operations").status,
            404);

  HttpResponse cap = Call("GET", "/internal/v1/capacity");
  ASSERT_EQ(cap.status, 200);
  ASSERT_EQ(cap.body["hosts"].size(), 3u);
  int used = 0, free = 0;
  for (const json& h : cap.body["hosts"]) {
    used += h["state"] == "USED";
    free += h["state"] == "FREE";
    EXPECT_GE(h["heartbeatAgeMs"].get<int64_t>(), 0);
    EXPECT_EQ(h["acceleratorType"], "cpu-2");
  }
  EXPECT_EQ(used, 2);
  EXPECT_EQ(free, 1);
  ASSERT_EQ(cap.body["tiers"].size(), 4u);
  EXPECT_EQ(cap.body["tiers"][1]["tier"], "on-demand");
  EXPECT_EQ(cap.body["tiers"][1]["usedChips"], Get("job")["quotaHeldChips"]);
  EXPECT_EQ(cap.body["tiers"][1]["quotaChips"], -1);
  EXPECT_EQ(cap.body["tiers"][2]["quotaChips"], 64);
  EXPECT_EQ(cap.body["tiers"][2]["usedChips"], 0);

  // Persisted with the record: a restarted controller answers the same.
  agents_.clear();
  controller_.reset();
  StartController(options);
  EXPECT_EQ(Get("job")["stateHistory"], history);
}

}  // namespace
}  // namespace multislice::control
