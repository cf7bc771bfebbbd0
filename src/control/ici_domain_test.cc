// ICI domains through the controller: agents register the hosts joined by
// ICI (`iciDomain`), the controller keeps it in its store (and reads stores
// from before the field), lists it, and places and repairs a multi-host
// slice only on one domain's hosts. The placement rules themselves are
// property-tested in scheduler_test.cc.
#include <chrono>
#include <set>
#include <string>
#include <thread>

#include "control/control_testing.h"
#include "control/controller_fixture.h"
#include "control/fake_agent.h"
#include "control/http.h"
#include "control/store.h"
#include "gtest/gtest.h"

namespace multislice::control {
namespace {

using nlohmann::json;
using testing::FakeAgent;
using testing::WaitFor;

const char kToken[] = "ici-token";
const char kQr[] =
    "/v2alpha1/projects/proj/locations/us-test1-a/queuedResources/pod";

class IciDomainTest : public testing::ControllerFixture {
 protected:
  IciDomainTest() : ControllerFixture(kToken, "multislice-ici-") {}

  void Start() {
    ControllerOptions options;
    options.heartbeat_timeout = std::chrono::milliseconds(1000);
    options.reconcile_interval = std::chrono::milliseconds(20);
    StartController(options);
  }
  // A v4-16 host (2 hosts of 4 chips make a slice) of `domain` at `ip`.
  FakeAgent& AddHost(const std::string& ip, const std::string& domain) {
    agents_.push_back(std::make_unique<FakeAgent>(url_, kToken, "v4-16",
                                                  "us-test1-a", ip, domain));
    FakeAgent& a = *agents_.back();
    EXPECT_TRUE(WaitFor([&] { return !a.host_id().empty(); }));
    return a;
  }
  HttpResponse Call(const std::string& method, const std::string& path,
                    const json* body = nullptr) {
    Result<HttpResponse> r = client_->Call(method, path, body);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : HttpResponse{};
  }
  json Qr() { return Call("GET", kQr).body; }
  std::string State() {
    json q = Qr();
    return q.contains("state") ? q["state"].value("state", "") : "<none>";
  }
  // The hosts of the slice, as a set of host ids.
  std::set<std::string> SliceHosts() {
    std::set<std::string> out;
    const json hosts = Qr()["nodes"][0]["hosts"];
    for (const json& h : hosts) out.insert(h);
    return out;
  }
  // Host id -> iciDomain, as GET /internal/v1/hosts lists them.
  std::map<std::string, std::string> ListedDomains() {
    std::map<std::string, std::string> out;
    const json hosts = Call("GET", "/internal/v1/hosts").body["hosts"];
    for (const json& h : hosts) {
      out[h["id"]] = h.value("iciDomain", "<absent>");
    }
    return out;
  }

  // Creates the queued resource "pod" (one v4-16 slice); the HTTP status.
  int CreatePod();
  // The queued resource reaches WAITING_FOR_RESOURCES and stays there.
  void ExpectItWaits() {
    ASSERT_TRUE(WaitFor([&] { return State() == "WAITING_FOR_RESOURCES"; }))
        << State();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(State(), "WAITING_FOR_RESOURCES");
  }
};

json V4_16Body() {
  return {{"tpu",
           {{"node_spec",
             {{{"parent", "projects/proj/locations/us-test1-a"},
               {"node_id", "pod"},
               {"node",
                {{"accelerator_type", "v4-16"},
                 {"runtime_version", "v2-alpha"},
                 {"metadata", {{"startup-script", "sleep 1000"}}}}}}}}}}};
}

int IciDomainTest::CreatePod() {
  const json body = V4_16Body();
  return Call("POST",
              "/v2alpha1/projects/proj/locations/us-test1-a/"
              "queuedResources?queued_resource_id=pod",
              &body)
      .status;
}

TEST_F(IciDomainTest, MultiHostSliceIsPlacedAndRepairedInOneDomain) {
  Start();
  FakeAgent& a1 = AddHost("127.0.0.1", "pa");
  FakeAgent& b1 = AddHost("127.0.0.2", "pb");
  ASSERT_EQ(CreatePod(), 200);
  // Two free v4 hosts, but not joined by ICI: the slice waits.
  ASSERT_NO_FATAL_FAILURE(ExpectItWaits());
  FakeAgent& a2 = AddHost("127.0.0.3", "pa");
  ASSERT_TRUE(WaitFor([&] { return State() == "ACTIVE"; })) << State();
  EXPECT_EQ(SliceHosts(), (std::set<std::string>{a1.host_id(), a2.host_id()}));
  EXPECT_EQ(
      ListedDomains(),
      (std::map<std::string, std::string>{
          {a1.host_id(), "pa"}, {b1.host_id(), "pb"}, {a2.host_id(), "pa"}}));
  const json capacity = Call("GET", "/internal/v1/capacity").body["hosts"];
  ASSERT_EQ(capacity.size(), 3u);
  for (const json& h : capacity) {
    EXPECT_EQ(h.value("iciDomain", ""), h["id"] == b1.host_id() ? "pb" : "pa");
  }

  // a1 fails (and stays away: a live agent would register again): its
  // survivor a2 and b1 (another domain) cannot form the replacement slice;
  // it waits until b2 joins b1's domain.
  a1.PauseHeartbeats(true);
  ASSERT_EQ(Call("POST", "/internal/v1/hosts/" + a1.host_id() + ":fail").status,
            200);
  ASSERT_NO_FATAL_FAILURE(ExpectItWaits());
  EXPECT_TRUE(Qr()["nodes"][0]["hosts"].empty());
  FakeAgent& b2 = AddHost("127.0.0.4", "pb");
  ASSERT_TRUE(WaitFor([&] { return State() == "ACTIVE"; })) << State();
  EXPECT_EQ(SliceHosts(), (std::set<std::string>{b1.host_id(), b2.host_id()}));
  EXPECT_EQ(a2.running(), 0);
  EXPECT_EQ(b1.running() + b2.running(), 2);
}

TEST_F(IciDomainTest, HostsWithoutADomainFormSlicesOnlyWithEachOther) {
  Start();
  FakeAgent& n1 = AddHost("127.0.0.1", "");
  AddHost("127.0.0.2", "pa");
  ASSERT_EQ(CreatePod(), 200);
  ASSERT_NO_FATAL_FAILURE(ExpectItWaits());
  FakeAgent& n2 = AddHost("127.0.0.3", "");
  ASSERT_TRUE(WaitFor([&] { return State() == "ACTIVE"; })) << State();
  EXPECT_EQ(SliceHosts(), (std::set<std::string>{n1.host_id(), n2.host_id()}));
  // An agent that sends no iciDomain is listed with "".
  EXPECT_EQ(ListedDomains()[n1.host_id()], "");
}

TEST_F(IciDomainTest, BadIciDomainIsRefusedNamingTheField) {
  Start();
  json body = {{"hostname", "h"},
               {"zone", "us-test1-a"},
               {"acceleratorType", "v4-16"},
               {"agentAddress", "127.0.0.1:1"},
               {"workdir", "/nonexistent"},
               {"iciDomain", "Pod_0"}};
  HttpResponse r = Call("POST", "/internal/v1/hosts:register", &body);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"].value("message", ""),
            "iciDomain: 'Pod_0' is not an ICI domain name such as 'pod0': "
            "expected lowercase letters, digits and '-', starting and ending "
            "with a letter or digit, at most 63 characters (or nothing: no "
            "domain)");
  body["iciDomain"] = 3;
  r = Call("POST", "/internal/v1/hosts:register", &body);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"].value("message", ""),
            "iciDomain: expected a string");
  EXPECT_TRUE(ListedDomains().empty());
}

TEST_F(IciDomainTest, DomainIsPersistedAndOldStoresRead) {
  Start();
  const std::string id = AddHost("127.0.0.1", "pa").host_id();
  agents_.clear();
  controller_.reset();
  {
    // As the store holds it, beside a host written before ICI domains.
    Result<std::unique_ptr<Store>> store =
        Store::Open(dir_.path() + "/data/state.db");
    ASSERT_TRUE(store.ok()) << store.status().message();
    Result<StoreSnapshot> snapshot = (*store)->Load();
    ASSERT_TRUE(snapshot.ok());
    ASSERT_EQ(snapshot->hosts.size(), 1u);
    EXPECT_EQ(snapshot->hosts[0].value("iciDomain", ""), "pa");
    StoreChange old;
    old.put_hosts = {{{"id", "host-9"},
                      {"hostname", "old"},
                      {"zone", "us-test1-a"},
                      {"acceleratorType", "v4-16"},
                      {"agentAddress", "127.0.0.9:1"},
                      {"workdir", "/nonexistent"},
                      {"secret", "s"},
                      {"lost", false},
                      {"lostReason", ""}}};
    ASSERT_TRUE((*store)->Apply(old).ok());
  }
  Start();
  EXPECT_EQ(ListedDomains(),
            (std::map<std::string, std::string>{{id, "pa"}, {"host-9", ""}}));
}

}  // namespace
}  // namespace multislice::control
