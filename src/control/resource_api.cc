#include "control/resource_api.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>

#include "control/validation.h"
#include "runtime/mesh/topology.h"

namespace multislice::control {

using nlohmann::json;

namespace {

using R = const httplib::Request&;
using W = httplib::Response&;

// The runtime versions offered: CPU devices ignore the value, so these are
// the names Cloud TPU users already write, plus the one `multislice job`
// uses.
const char* const kRuntimeVersions[] = {
    "tpu-ubuntu2204-base", "v2-alpha-tpuv5", "v2-alpha-tpuv5-lite",
    "v2-alpha-tpuv6e",     "tpu-vm-base",    "multislice"};

std::string Parent(R req) {
  return "projects/" + req.matches[2].str() + "/locations/" +
         req.matches[3].str();
}

// The AcceleratorConfig.Type enum value of a family, as Cloud TPU names it
// (V5LITE_POD for v5litepod); families beyond Google's enum (cpu) in
// capitals, which a typed client decodes as TYPE_UNSPECIFIED.
std::string GenerationOf(const std::string& family) {
  if (family == "v5litepod") return "V5LITE_POD";
  std::string generation = family;
  std::transform(generation.begin(), generation.end(), generation.begin(),
                 [](unsigned char c) { return std::toupper(c); });
  return generation;
}

json AcceleratorTypeJson(const std::string& parent, const std::string& type) {
  Result<mesh::AcceleratorType> t = mesh::ParseAcceleratorType(type);
  const std::string generation = GenerationOf(t.ok() ? t->family : type);
  return {{"name", parent + "/acceleratorTypes/" + type},
          {"type", type},
          {"acceleratorConfigs", {{{"type", generation}}}}};
}

}  // namespace

json NodeJson(const QueuedResourceRecord& r, size_t index,
              const std::map<std::string, Host>& hosts) {
  const NodeRecord& n = r.nodes[index];
  json node = json::object();
  const json& spec = r.spec.body;
  if (spec.contains("tpu") && spec["tpu"].contains("nodeSpec") &&
      spec["tpu"]["nodeSpec"].is_array() && !spec["tpu"]["nodeSpec"].empty() &&
      spec["tpu"]["nodeSpec"][0].contains("node")) {
    node = spec["tpu"]["nodeSpec"][0]["node"];
  }
  node["name"] =
      "projects/" + r.project + "/locations/" + r.zone + "/nodes/" + n.node_id;
  node["id"] = r.NodeNumericId(index);
  node["acceleratorType"] = r.spec.accelerator_type;
  node["state"] = n.state;
  node["health"] = n.health;
  node["queuedResource"] = r.name;
  node["createTime"] = FormatTimestamp(r.create_ms);
  node["metadata"] = r.NodeMetadata(n);
  // A worker's address is where its host is reached: its sshd's (local
  // hosts each have a loopback address of their own for it), else its
  // agent's.
  json endpoints = json::array();
  for (const std::string& id : n.hosts) {
    auto it = hosts.find(id);
    if (it == hosts.end()) continue;
    const Host& h = it->second;
    const std::string ip =
        h.ssh_address.empty()
            ? h.ip()
            : h.ssh_address.substr(0, h.ssh_address.rfind(':'));
    endpoints.push_back({{"ipAddress", ip}, {"port", 8470}});
  }
  node["networkEndpoints"] = endpoints;
  return node;
}

void ResourceApi::Mount(httplib::Server& server, const std::string& token) {
  auto authed = [this, &token](void (ResourceApi::*handler)(R, W)) {
    return WithBearer(token,
                      [this, handler](R q, W s) { (this->*handler)(q, s); });
  };
  const std::string base =
      R"(/(v2alpha1|v2)/projects/([^/]+)/locations/([^/]+))";
  server.Get(base + "/nodes", authed(&ResourceApi::HandleListNodes));
  server.Get(base + R"(/nodes/([^/:]+))", authed(&ResourceApi::HandleGetNode));
  server.Get(base + "/acceleratorTypes",
             authed(&ResourceApi::HandleListAcceleratorTypes));
  server.Get(base + R"(/acceleratorTypes/([^/:]+))",
             authed(&ResourceApi::HandleGetAcceleratorType));
  server.Get(base + "/runtimeVersions",
             authed(&ResourceApi::HandleListRuntimeVersions));
  server.Get(base + R"(/runtimeVersions/([^/:]+))",
             authed(&ResourceApi::HandleGetRuntimeVersion));
  const std::string locations =
      R"(/(v2alpha1|v2|v1)/projects/([^/]+)/locations)";
  server.Get(locations, authed(&ResourceApi::HandleListLocations));
  server.Get(locations + R"(/([^/:]+))",
             authed(&ResourceApi::HandleGetLocation));
}

std::vector<json> ResourceApi::Nodes(const std::string& project,
                                     const std::string& zone) {
  std::vector<const QueuedResourceRecord*> records;
  for (const auto& [name, r] : state_.records) {
    if (r.project == project && (zone == "-" || r.zone == zone)) {
      records.push_back(&r);
    }
  }
  std::sort(records.begin(), records.end(),
            [](const auto* a, const auto* b) { return a->seq < b->seq; });
  std::vector<json> nodes;
  for (const QueuedResourceRecord* r : records) {
    for (size_t i = 0; i < r->nodes.size(); ++i) {
      nodes.push_back(NodeJson(*r, i, state_.hosts));
    }
  }
  return nodes;
}

std::vector<std::string> ResourceApi::Zones() {
  std::set<std::string> zones;
  for (const auto& [id, h] : state_.hosts) {
    if (!h.zone.empty()) zones.insert(h.zone);
  }
  for (const auto& [name, r] : state_.records) zones.insert(r.zone);
  return {zones.begin(), zones.end()};
}

void ResourceApi::HandleListNodes(R req, W res) {
  if (!Valid(ValidateParent(req.matches[2].str(), req.matches[3].str(), true),
             res)) {
    return;
  }
  std::lock_guard<std::mutex> lock(state_.mu);
  WritePage(req, res, "nodes", Nodes(req.matches[2], req.matches[3]));
}

void ResourceApi::HandleGetNode(R req, W res) {
  const std::string id = req.matches[4];
  if (!Valid(ValidateParent(req.matches[2].str(), req.matches[3].str(), false),
             res) ||
      !Valid(ValidateResourceId("node", id), res)) {
    return;
  }
  std::lock_guard<std::mutex> lock(state_.mu);
  const std::string name = Parent(req) + "/nodes/" + id;
  for (const json& node : Nodes(req.matches[2], req.matches[3])) {
    if (node["name"] == name) return WriteJson(res, 200, node);
  }
  WriteError(res, 404, "NOT_FOUND", "node " + name + " not found");
}

void ResourceApi::HandleListAcceleratorTypes(R req, W res) {
  if (!Valid(ValidateParent(req.matches[2].str(), req.matches[3].str(), false),
             res)) {
    return;
  }
  std::set<std::string> types;
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    for (const auto& [id, h] : state_.hosts) {
      if (!h.lost && h.zone == req.matches[3].str()) {
        types.insert(h.accelerator_type);
      }
    }
  }
  std::vector<json> items;
  for (const std::string& t : types) {
    items.push_back(AcceleratorTypeJson(Parent(req), t));
  }
  WritePage(req, res, "acceleratorTypes", items);
}

void ResourceApi::HandleGetAcceleratorType(R req, W res) {
  if (!Valid(ValidateParent(req.matches[2].str(), req.matches[3].str(), false),
             res)) {
    return;
  }
  const std::string type = req.matches[4];
  Result<mesh::AcceleratorType> parsed = mesh::ParseAcceleratorType(type);
  if (!parsed.ok()) {
    WriteError(res, 404, "NOT_FOUND",
               "acceleratorType " + QuoteForMessage(type) +
                   " not found: " + parsed.status().message());
    return;
  }
  WriteJson(res, 200, AcceleratorTypeJson(Parent(req), type));
}

void ResourceApi::HandleListRuntimeVersions(R req, W res) {
  if (!Valid(ValidateParent(req.matches[2].str(), req.matches[3].str(), false),
             res)) {
    return;
  }
  std::vector<json> items;
  for (const char* v : kRuntimeVersions) {
    items.push_back(
        {{"name", Parent(req) + "/runtimeVersions/" + v}, {"version", v}});
  }
  WritePage(req, res, "runtimeVersions", items);
}

void ResourceApi::HandleGetRuntimeVersion(R req, W res) {
  if (!Valid(ValidateParent(req.matches[2].str(), req.matches[3].str(), false),
             res)) {
    return;
  }
  const std::string v = req.matches[4];
  for (const char* known : kRuntimeVersions) {
    if (v == known) {
      return WriteJson(
          res, 200,
          {{"name", Parent(req) + "/runtimeVersions/" + v}, {"version", v}});
    }
  }
  WriteError(res, 404, "NOT_FOUND",
             "runtimeVersion " + QuoteForMessage(v) + " not found");
}

void ResourceApi::HandleListLocations(R req, W res) {
  const std::string project = req.matches[2];
  if (!Valid(ValidateProjectId("project", project), res)) return;
  std::vector<std::string> zones;
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    zones = Zones();
  }
  std::vector<json> items;
  for (const std::string& z : zones) {
    items.push_back({{"name", "projects/" + project + "/locations/" + z},
                     {"locationId", z},
                     {"displayName", z}});
  }
  WritePage(req, res, "locations", items);
}

void ResourceApi::HandleGetLocation(R req, W res) {
  if (!Valid(ValidateParent(req.matches[2].str(), req.matches[3].str(), false),
             res)) {
    return;
  }
  const std::string zone = req.matches[3];
  std::lock_guard<std::mutex> lock(state_.mu);
  const std::vector<std::string> zones = Zones();
  if (std::find(zones.begin(), zones.end(), zone) == zones.end()) {
    WriteError(res, 404, "NOT_FOUND",
               "location " + Parent(req) +
                   " not found (no host or queued "
                   "resource in that zone)");
    return;
  }
  WriteJson(
      res, 200,
      {{"name", Parent(req)}, {"locationId", zone}, {"displayName", zone}});
}

}  // namespace multislice::control
