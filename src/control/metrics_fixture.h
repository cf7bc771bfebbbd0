// Test support for the metrics tests (metrics_test.cc, metrics_scrape_test.cc):
// the controller fixture with single-node queued resources of any tier
// created, and their states read, through the API.
#pragma once

#include <string>

#include "control/control_testing.h"
#include "control/controller_fixture.h"

namespace multislice::control::testing {

class MetricsFixture : public ControllerFixture {
 protected:
  static constexpr char kParent[] =
      "/v2alpha1/projects/proj/locations/us-test1-a";

  explicit MetricsFixture(std::string token)
      : ControllerFixture(std::move(token)) {}

  HttpResponse Call(const std::string& method, const std::string& path,
                    const nlohmann::json* body = nullptr) {
    Result<HttpResponse> r = client_->Call(method, path, body);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : HttpResponse{};
  }
  // A single-node cpu-2 queued resource `id` of `tier` (CpuBody's), with
  // `policy` as its queueing_policy when given; the answer's status.
  int Create(const std::string& id, const std::string& tier,
             const nlohmann::json& policy = nullptr) {
    nlohmann::json body = CpuBody(1, tier);
    body["tpu"]["node_spec"][0]["node_id"] = id + "-node";
    if (!policy.is_null()) body["queueing_policy"] = policy;
    return Call("POST",
                std::string(kParent) +
                    "/queuedResources?queued_resource_id=" + id,
                &body)
        .status;
  }
  // Its state as the API answers it; "<none>" when there is none.
  std::string State(const std::string& id) {
    nlohmann::json qr =
        Call("GET", std::string(kParent) + "/queuedResources/" + id).body;
    return qr.contains("state") ? qr["state"].value("state", "") : "<none>";
  }
};

}  // namespace multislice::control::testing
