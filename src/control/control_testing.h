// Test support shared by the controller's tests: the seed's request body,
// a small create body and a bounded wait.
#pragma once

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

namespace multislice::control::testing {

// The seed's queued-resource-req.json with its placeholders filled in (and
// its missing comma after "tags" restored).
inline constexpr char kSeedBody[] = R"({
"guaranteed": { "reserved": true },
"tpu": {
    "node_spec": [
    {
    "parent": "projects/123/locations/us-test1-a",
        "node": {
        "accelerator_type": "v4-16",
        "runtime_version": "tpu-ubuntu2204-base",
        "network_config": {
            "network": "default",
            "subnetwork": "default",
            "enable_external_ips": true
        },
        "tags" : ["example-tag-1"],
        "metadata": {
            "startup-script": "#!/bin/bash\necho hello"
        }
    },
    "multi_node_params": {
        "node_count": 2,
        "node_id_prefix": "seed-qr"
    }
    }
    ]
}
}
)";

// A create body of `nodes` cpu-2 slices (node id "single" for one) in
// projects/proj/locations/us-test1-a, of `tier` ("", "reserved", "spot",
// "best-effort"), running `script`.
inline nlohmann::json CpuBody(int nodes, const std::string& tier = "",
                              const std::string& script = "sleep 1000") {
  nlohmann::json node_spec = {{"parent", "projects/proj/locations/us-test1-a"},
                              {"node",
                               {{"accelerator_type", "cpu-2"},
                                {"runtime_version", "v2-alpha"},
                                {"metadata", {{"startup-script", script}}}}}};
  if (nodes == 1) {
    node_spec["node_id"] = "single";
  } else {
    node_spec["multi_node_params"] = {{"node_count", nodes}};
  }
  nlohmann::json body = {{"tpu", {{"node_spec", {node_spec}}}}};
  if (tier == "reserved") body["guaranteed"] = {{"reserved", true}};
  if (tier == "spot") body["spot"] = nlohmann::json::object();
  if (tier == "best-effort") body["best_effort"] = nlohmann::json::object();
  return body;
}

// Polls `done` every 10 ms until it holds or `timeout` has passed; returns
// whether it held.
inline bool WaitFor(
    const std::function<bool()>& done,
    std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

}  // namespace multislice::control::testing
