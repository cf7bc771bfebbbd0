#include "control/node_api.h"

#include <optional>

#include "control/node_access.h"
#include "control/resource_api.h"
#include "control/validation.h"

namespace multislice::control {

using nlohmann::json;

namespace {

using R = const httplib::Request&;
using W = httplib::Response&;

// A Node body (nodes.create) as the one node spec of a queued resource:
// its scheduling config picks the tier (spot or preemptible: spot;
// reserved: reserved), and is dropped from the node.
json QueuedResourceOfNode(const std::string& parent, const std::string& id,
                          json node) {
  json qr = {
      {"tpu",
       {{"nodeSpec", json::array({{{"parent", parent}, {"nodeId", id}}})}}}};
  if (node.is_object() && node.contains("schedulingConfig") &&
      node["schedulingConfig"].is_object()) {
    const json& sc = node["schedulingConfig"];
    auto on = [&sc](const char* key) {
      return sc.contains(key) && sc[key].is_boolean() && sc[key].get<bool>();
    };
    if (on("spot") || on("preemptible")) qr["spot"] = json::object();
    if (on("reserved")) qr["guaranteed"] = {{"reserved", true}};
  }
  qr["tpu"]["nodeSpec"][0]["node"] = std::move(node);
  return qr;
}

}  // namespace

void NodeApi::Mount(httplib::Server& server, const std::string& token) {
  auto authed = [this, &token](void (NodeApi::*handler)(R, W)) {
    return WithBearer(token,
                      [this, handler](R q, W s) { (this->*handler)(q, s); });
  };
  const std::string location =
      R"(/(v2alpha1|v2)/projects/([^/]+)/locations/([^/:]+))";
  const std::string node = location + R"(/nodes/([^/:]+))";
  server.Post(location + "/nodes", authed(&NodeApi::HandleCreate));
  server.Delete(node, authed(&NodeApi::HandleDelete));
  server.Post(node + R"(:(stop|start|performMaintenance))",
              authed(&NodeApi::HandleRefused));
  server.Post(node + ":simulateMaintenanceEvent",
              authed(&NodeApi::HandleSimulateMaintenance));
  server.Post(location + ":generateServiceIdentity",
              authed(&NodeApi::HandleServiceIdentity));
}

void NodeApi::HandleCreate(R req, W res) {
  const std::string api = req.matches[1], project = req.matches[2],
                    zone = req.matches[3];
  if (!Valid(ValidateParent(project, zone, false), res)) return;
  const std::string id = req.has_param("nodeId")
                             ? req.get_param_value("nodeId")
                             : req.get_param_value("node_id");
  if (id.empty()) {
    WriteError(res, 400, "INVALID_ARGUMENT", "node_id: is required");
    return;
  }
  if (!Valid(ValidateResourceId("node_id", id), res)) return;
  Result<json> body = ParseJsonText(req.body);
  if (!body.ok() || !body->is_object()) {
    WriteError(res, 400, "INVALID_ARGUMENT",
               body.ok() ? "body: expected a JSON object (a Node)"
                         : body.status().message());
    return;
  }
  json qr = QueuedResourceOfNode("projects/" + project + "/locations/" + zone,
                                 id, *body);
  // The Node's scheduling config chose the tier; the rest is its spec.
  qr["tpu"]["nodeSpec"][0]["node"].erase("schedulingConfig");
  queued_resources_.Create(api, project, zone, id, qr, /*as_node=*/true, res);
}

void NodeApi::HandleDelete(R req, W res) {
  const std::string api = req.matches[1];
  std::string qr_name, qr_id;
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    std::optional<NodeRef> ref = NodeOfPath(state_, req, res);
    if (!ref) return;
    const QueuedResourceRecord& r = *ref->record;
    if (!r.created_as_node) {
      WriteError(res, 400, "FAILED_PRECONDITION",
                 "node " + r.nodes[ref->index].node_id +
                     " belongs to queued resource " + r.id +
                     ": delete that (gcloud compute tpus queued-resources "
                     "delete " +
                     r.id + " --force)");
      return;
    }
    qr_name = r.name;
  }
  queued_resources_.Delete(api, qr_name, /*force=*/true, res);
}

void NodeApi::HandleRefused(R req, W res) {
  const std::string verb = req.matches[5];
  std::lock_guard<std::mutex> lock(state_.mu);
  std::optional<NodeRef> ref = NodeOfPath(state_, req, res);
  if (!ref) return;
  const QueuedResourceRecord& r = *ref->record;
  const std::string& node = r.nodes[ref->index].node_id;
  if (verb == "performMaintenance") {
    WriteError(res, 400, "FAILED_PRECONDITION",
               "node " + node +
                   " has no maintenance pending (simulateMaintenanceEvent "
                   "makes one)");
    return;
  }
  WriteError(res, 400, "FAILED_PRECONDITION",
             "node " + node + " of queued resource " + r.id + ": " + verb +
                 " is not supported for a queued resource's node (its hosts "
                 "stay held until the queued resource is deleted; "
                 "queued-resources reset restarts its workers)");
}

void NodeApi::HandleSimulateMaintenance(R req, W res) {
  const std::string api = req.matches[1];
  Result<json> body = ParseJsonText(req.body.empty() ? "{}" : req.body);
  const json ids = body.ok() && body->is_object()
                       ? body->value("workerIds", json::array())
                       : json();
  if (!ids.is_array()) {
    WriteError(res, 400, "INVALID_ARGUMENT",
               "worker_ids: expected a list of worker numbers");
    return;
  }
  std::lock_guard<std::mutex> lock(state_.mu);
  std::optional<NodeRef> ref = NodeOfPath(state_, req, res);
  if (!ref) return;
  QueuedResourceRecord& r = *ref->record;
  const NodeRecord& n = r.nodes[ref->index];
  // As Google's: the first worker given, worker 0 when none is.
  size_t worker = 0;
  if (!ids.empty()) {
    const std::string id = ids[0].is_string() ? ids[0].get<std::string>() : "";
    const bool digits = !id.empty() && id.size() <= 6 &&
                        id.find_first_not_of("0123456789") == std::string::npos;
    worker = digits ? std::stoul(id) : n.hosts.size() + 1;
    if (!digits || worker >= n.hosts.size()) {
      WriteError(res, 400, "INVALID_ARGUMENT",
                 "worker_ids[0]: " + QuoteForMessage(ids[0].dump()) +
                     " is not a worker of node " + n.node_id + " (it has " +
                     std::to_string(n.hosts.size()) + ")");
      return;
    }
  }
  if (worker >= n.hosts.size()) {
    WriteError(res, 400, "FAILED_PRECONDITION",
               "node " + n.node_id + " has no hosts yet");
    return;
  }
  const std::string node_id = n.node_id, host = n.hosts[worker];
  OperationRecord op = state_.NewOperation(r, api, "simulateMaintenanceEvent");
  op.target = NodeName(r.project, r.zone, node_id);
  op.done = true;
  op.end_ms = WallMs();
  op.response = NodeJson(r, ref->index, state_.hosts);
  op.response["@type"] =
      "type.googleapis.com/google.cloud.tpu." +
      (api == "v2" ? std::string("v2") : std::string("v2alpha1")) + ".Node";
  const std::string record = r.name;
  // The host goes as in a maintenance event: the node is repaired.
  state_.MarkLost(host, "simulated maintenance event of worker " +
                            std::to_string(worker) + " of node " + node_id);
  state_.Wake();
  QueuedResourceRecord& after = state_.records[record];
  Status s = state_.Persist(after, {op});
  if (!s.ok()) {
    WriteError(res, 500, "INTERNAL", s.message());
    return;
  }
  state_.ops[op.name] = op;
  WriteJson(res, 200, op.ToApi());
}

void NodeApi::HandleServiceIdentity(R req, W res) {
  const std::string project = req.matches[2], zone = req.matches[3];
  if (!Valid(ValidateParent(project, zone, false), res)) return;
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : project) hash = (hash ^ c) * 1099511628211ull;
  const std::string number = std::to_string(hash % 1000000000000ull);
  WriteJson(
      res, 200,
      {{"identity",
        {{"email", "service-" + number + "@cloud-tpu.iam.gserviceaccount.com"},
         {"uniqueId", std::to_string(hash >> 1)}}}});
}

}  // namespace multislice::control
