// The node calls gcloud's ssh and tpu-vm commands make (node_access.h,
// node_api.h) against an in-process controller and FakeAgents that report
// an sshd: guest attributes, the metadata patch and the operation that waits
// for the hosts, the keys each host's heartbeat answer carries, the Compute
// project, and the node methods beyond get.
#include "control/node_access.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "control/control_testing.h"
#include "control/controller_fixture.h"
#include "control/fake_agent.h"

namespace multislice::control {
namespace {

using nlohmann::json;
using testing::CpuBody;
using testing::FakeAgent;
using testing::WaitFor;

const char kToken[] = "node-access-token";
const std::string kLocation = "/v2alpha1/projects/proj/locations/us-test1-a";

class NodeAccessTest : public testing::ControllerFixture {
 protected:
  NodeAccessTest() : ControllerFixture(kToken) {}

  void SetUp() override { StartController(); }

  HttpResponse Call(const std::string& method, const std::string& path,
                    const json* body = nullptr) {
    Result<HttpResponse> r = client_->Call(method, path, body);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : HttpResponse{};
  }
  FakeAgent& AddSshAgent() {
    agents_.push_back(std::make_unique<FakeAgent>(
        url_, token_, "cpu-2", "us-test1-a", "127.0.0.1", "", /*ssh=*/true));
    FakeAgent& a = *agents_.back();
    EXPECT_TRUE(WaitFor([&] { return !a.host_id().empty(); }));
    return a;
  }
  // Queued resource `id` of `nodes` cpu-2 slices, ACTIVE.
  void CreateActive(const std::string& id, int nodes) {
    const json body = CpuBody(nodes);
    ASSERT_EQ(Call("POST",
                   kLocation + "/queuedResources?queuedResourceId=" + id, &body)
                  .status,
              200);
    ASSERT_TRUE(WaitFor([&] {
      return Call("GET", kLocation + "/queuedResources/" + id)
                 .body["state"]["state"] == "ACTIVE";
    }));
  }
  json Operation(const std::string& name) {
    return Call("GET", "/v2alpha1/" + name).body;
  }
};

TEST_F(NodeAccessTest, APatchEndsOnceTheHostsAppliedItAndReachesOnlyThem) {
  FakeAgent& a = AddSshAgent();
  FakeAgent& b = AddSshAgent();
  CreateActive("qr", 2);
  const std::string key = "root:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKey root";
  // Which agent holds qr-0, which qr-1.
  const json q = Call("GET", kLocation + "/queuedResources/qr").body;
  const std::string host0 = q["nodes"][0]["hosts"][0];
  FakeAgent& holder = a.host_id() == host0 ? a : b;
  FakeAgent& other = a.host_id() == host0 ? b : a;

  holder.hold_ssh_keys = true;
  const json patch = {{"metadata", {{"ssh-keys", key}, {"x", "y"}}}};
  HttpResponse op =
      Call("PATCH", kLocation + "/nodes/qr-0?updateMask=metadata", &patch);
  ASSERT_EQ(op.status, 200) << op.body.dump();
  EXPECT_EQ(op.body["metadata"]["verb"], "update");
  EXPECT_EQ(op.body["metadata"]["target"],
            "projects/proj/locations/us-test1-a/nodes/qr-0");
  const std::string name = op.body["name"];
  // The holder got the keys, on behalf of qr (its uid), but has not
  // applied them: the operation waits.
  ASSERT_TRUE(
      WaitFor([&] { return holder.ssh_keys().value("keys", "") == key; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_FALSE(Operation(name)["done"].get<bool>());
  holder.hold_ssh_keys = false;
  ASSERT_TRUE(WaitFor([&] { return Operation(name)["done"].get<bool>(); }));
  const json done = Operation(name);
  EXPECT_EQ(done["response"]["@type"],
            "type.googleapis.com/google.cloud.tpu.v2alpha1.Node");
  EXPECT_EQ(done["response"]["metadata"]["ssh-keys"], key);
  EXPECT_EQ(done["response"]["metadata"]["x"], "y");
  // The other node's host holds none of them.
  EXPECT_EQ(other.ssh_keys().value("keys", ""), "");
  EXPECT_EQ(other.ssh_keys().value("owner", ""), holder.ssh_keys()["owner"]);
  // The node answers with it; qr-1 does not.
  EXPECT_EQ(Call("GET", kLocation + "/nodes/qr-0").body["metadata"]["ssh-keys"],
            key);
  EXPECT_FALSE(Call("GET", kLocation + "/nodes/qr-1")
                   .body["metadata"]
                   .contains("ssh-keys"));
  // Deleted: the hosts are nobody's, their keys gone.
  ASSERT_EQ(Call("DELETE", kLocation + "/queuedResources/qr?force=True").status,
            200);
  ASSERT_TRUE(WaitFor([&] {
    return holder.ssh_keys().value("owner", "x").empty() &&
           other.ssh_keys().value("owner", "x").empty();
  }));
}

TEST_F(NodeAccessTest, PatchRefusalsNameTheField) {
  AddSshAgent();
  CreateActive("one", 1);
  const json patch = {{"metadata", {{"a", "b"}}}};
  auto message = [&](const std::string& path, const json& body) {
    HttpResponse r = Call("PATCH", kLocation + path, &body);
    return std::to_string(r.status) + " " +
           r.body["error"].value("message", std::string());
  };
  EXPECT_EQ(message("/nodes/single", patch),
            "400 update_mask: is required (metadata is the field that can be "
            "updated)");
  EXPECT_EQ(message("/nodes/single?updateMask=labels", patch),
            "400 update_mask: 'labels' cannot be updated here (metadata can)");
  EXPECT_EQ(
      message("/nodes/single?updateMask=metadata",
              json{{"metadata", {{"a", 1}}}}),
      "400 node.metadata[\"a\"]: expected a string of at most 1024 bytes");
  EXPECT_EQ(message("/nodes/nope?updateMask=metadata", patch),
            "404 node projects/proj/locations/us-test1-a/nodes/nope not found");
  EXPECT_EQ(message("/nodes/BAD?updateMask=metadata", patch).substr(0, 9),
            "400 node:");
}

TEST_F(NodeAccessTest, GuestAttributesAreEachWorkersHostKeys) {
  AddSshAgent();
  AddAgent();  // a host without an sshd
  CreateActive("qr", 2);
  const json q = Call("GET", kLocation + "/queuedResources/qr").body;
  const json hosts = Call("GET", "/internal/v1/hosts").body["hosts"];
  std::string with_ssh;
  for (const json& h : hosts) {
    if (!h.value("sshAddress", "").empty()) with_ssh = h["id"];
  }
  const std::string node_with_ssh =
      q["nodes"][0]["hosts"][0] == with_ssh ? "qr-0" : "qr-1";
  const std::string node_without = node_with_ssh == "qr-0" ? "qr-1" : "qr-0";
  const json all = {{"workerIds", {""}}};  // gcloud's --worker=all
  HttpResponse r =
      Call("POST",
           kLocation + "/nodes/" + node_with_ssh + ":getGuestAttributes", &all);
  ASSERT_EQ(r.status, 200) << r.body.dump();
  ASSERT_EQ(r.body["guestAttributes"].size(), 1u);
  const json item = r.body["guestAttributes"][0]["queryValue"]["items"][0];
  EXPECT_EQ(item["namespace"], "hostkeys");
  EXPECT_EQ(item["key"], "ssh-ed25519");
  EXPECT_EQ(item["value"], FakeAgent::kHostKey);
  // The node answers with that host's sshd address.
  EXPECT_EQ(Call("GET", kLocation + "/nodes/" + node_with_ssh)
                .body["networkEndpoints"][0]["ipAddress"],
            "127.0.0.1");
  const json one = {{"workerIds", {"3"}}};
  r = Call("POST",
           kLocation + "/nodes/" + node_with_ssh + ":getGuestAttributes", &one);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["message"],
            "worker_ids[0]: '3' is not a worker of node " + node_with_ssh +
                " (it has 1)");
  r = Call("POST", kLocation + "/nodes/" + node_without + ":getGuestAttributes",
           &all);
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(r.body.dump().find("its host runs no sshd"), std::string::npos);
}

TEST_F(NodeAccessTest, TheComputeProjectHasNoProjectWideKeys) {
  HttpResponse r = Call("GET", "/compute/v1/projects/my-project");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.body["name"], "my-project");
  EXPECT_EQ(r.body["commonInstanceMetadata"]["items"], json::array());
  EXPECT_EQ(Call("GET", "/compute/v1/projects/My_Project").status, 400);
  httplib::Client anonymous(url_);
  EXPECT_EQ(anonymous.Get("/compute/v1/projects/my-project")->status, 401);
}

TEST_F(NodeAccessTest, BooleansAsGooglesFrontEndReadsThem) {
  AddSshAgent();
  CreateActive("qr", 1);
  HttpResponse r = Call("DELETE", kLocation + "/queuedResources/qr?force=yes");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["message"],
            "Invalid value at 'force' (TYPE_BOOL), 'yes': expected true or "
            "false");
  EXPECT_EQ(Call("DELETE", kLocation + "/queuedResources/qr?force=TRUE").status,
            200);
}

TEST_F(NodeAccessTest, NodeMethods) {
  AddSshAgent();
  AddSshAgent();
  // tpu-vm create: a queued resource of one node named after it.
  const json node = {{"acceleratorType", "cpu-2"},
                     {"runtimeVersion", "v2-alpha-tpuv5-lite"},
                     {"schedulingConfig", {{"spot", true}}}};
  HttpResponse r = Call("POST", kLocation + "/nodes?nodeId=vm", &node);
  ASSERT_EQ(r.status, 200) << r.body.dump();
  ASSERT_TRUE(WaitFor([&] {
    return Call("GET", kLocation + "/nodes/vm").body.value("state", "") ==
           "READY";
  }));
  EXPECT_EQ(Call("GET", kLocation + "/queuedResources/vm").body["tier"],
            "spot");
  // stop, start, performMaintenance: one sentence each.
  for (const std::string verb : {"stop", "start", "performMaintenance"}) {
    r = Call("POST", kLocation + "/nodes/vm:" + verb, &node);
    EXPECT_EQ(r.status, 400) << verb;
    EXPECT_EQ(r.body["error"]["status"], "FAILED_PRECONDITION");
  }
  // simulateMaintenanceEvent: the host goes, the node is repaired.
  const std::string before = Call("GET", kLocation + "/queuedResources/vm")
                                 .body["nodes"][0]["hosts"][0];
  const json worker0 = {{"workerIds", {"0"}}};
  r = Call("POST", kLocation + "/nodes/vm:simulateMaintenanceEvent", &worker0);
  ASSERT_EQ(r.status, 200) << r.body.dump();
  EXPECT_TRUE(r.body["done"].get<bool>());
  ASSERT_TRUE(WaitFor([&] {
    const json q = Call("GET", kLocation + "/queuedResources/vm").body;
    return q["attempt"] == 2 && q["state"]["state"] == "ACTIVE";
  }));
  EXPECT_NE(Call("GET", kLocation + "/queuedResources/vm")
                .body["nodes"][0]["hosts"][0],
            before);
  // A queued resource's own node is not deleted by nodes.delete.
  CreateActive("other", 1);
  r = Call("DELETE", kLocation + "/nodes/single");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.dump().find("belongs to queued resource other"),
            std::string::npos);
  // tpu-vm delete of vm deletes it.
  ASSERT_EQ(Call("DELETE", kLocation + "/nodes/vm").status, 200);
  ASSERT_TRUE(WaitFor(
      [&] { return Call("GET", kLocation + "/nodes/vm").status == 404; }));
  // The service identity.
  r = Call("POST", kLocation + ":generateServiceIdentity", &node);
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.body["identity"]["email"].get<std::string>().find(
                "@cloud-tpu.iam.gserviceaccount.com"),
            std::string::npos);
}

}  // namespace
}  // namespace multislice::control
