#include "control/node_access.h"

#include <optional>
#include <set>
#include <sstream>

#include "control/resource_api.h"
#include "control/validation.h"

namespace multislice::control {

using nlohmann::json;

namespace {

using R = const httplib::Request&;
using W = httplib::Response&;

// 64 bits of FNV-1a: a project's stable numeric id.
uint64_t Fnv1a(const std::string& text) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

// Whether host `id` has applied generation `generation` of `r`'s node
// metadata (a host without an sshd has nothing to apply).
bool Applied(const ControlState& state, const QueuedResourceRecord& r,
             const std::string& id, int64_t generation) {
  auto it = state.hosts.find(id);
  if (it == state.hosts.end() || it->second.lost) return true;
  const Host& h = it->second;
  if (h.ssh_address.empty()) return true;
  return h.ssh_owner == r.uid && h.ssh_generation >= generation;
}

}  // namespace

std::optional<NodeRef> FindNode(ControlState& state, const std::string& project,
                                const std::string& zone,
                                const std::string& id) {
  for (auto& [name, r] : state.records) {
    if (r.project != project || r.zone != zone) continue;
    for (size_t i = 0; i < r.nodes.size(); ++i) {
      if (r.nodes[i].node_id == id) return NodeRef{&r, i};
    }
  }
  return std::nullopt;
}

std::string NodeName(const std::string& project, const std::string& zone,
                     const std::string& id) {
  return "projects/" + project + "/locations/" + zone + "/nodes/" + id;
}

std::optional<NodeRef> NodeOfPath(ControlState& state,
                                  const httplib::Request& req,
                                  httplib::Response& res) {
  const std::string project = req.matches[2], zone = req.matches[3],
                    id = req.matches[4];
  if (!Valid(ValidateParent(project, zone, false), res) ||
      !Valid(ValidateResourceId("node", id), res)) {
    return std::nullopt;
  }
  std::optional<NodeRef> node = FindNode(state, project, zone, id);
  if (!node) {
    WriteError(res, 404, "NOT_FOUND",
               "node " + NodeName(project, zone, id) + " not found");
  }
  return node;
}

void NodeAccessApi::Mount(httplib::Server& server, const std::string& token) {
  auto authed = [this, &token](void (NodeAccessApi::*handler)(R, W)) {
    return WithBearer(token,
                      [this, handler](R q, W s) { (this->*handler)(q, s); });
  };
  const std::string node =
      R"(/(v2alpha1|v2)/projects/([^/]+)/locations/([^/]+)/nodes/([^/:]+))";
  server.Patch(node, authed(&NodeAccessApi::HandlePatchNode));
  server.Post(node + ":getGuestAttributes",
              authed(&NodeAccessApi::HandleGetGuestAttributes));
  server.Get(R"(/compute/(v1|beta|alpha)/projects/([^/]+))",
             authed(&NodeAccessApi::HandleGetProject));
}

void NodeAccessApi::HandlePatchNode(R req, W res) {
  const std::string api = req.matches[1];
  // updateMask: the fields of the body to apply; only metadata here (what
  // gcloud's ssh and `tpu-vm update --metadata` change).
  const std::string mask = req.get_param_value("updateMask");
  if (mask.empty()) {
    WriteError(res, 400, "INVALID_ARGUMENT",
               "update_mask: is required (metadata is the field that can be "
               "updated)");
    return;
  }
  std::istringstream fields(mask);
  for (std::string field; std::getline(fields, field, ',');) {
    if (field != "metadata") {
      WriteError(res, 400, "INVALID_ARGUMENT",
                 "update_mask: " + QuoteForMessage(field) +
                     " cannot be updated here (metadata can)");
      return;
    }
  }
  Result<json> body = ParseJsonText(req.body);
  if (!body.ok() || !body->is_object()) {
    WriteError(res, 400, "INVALID_ARGUMENT",
               body.ok() ? "body: expected a JSON object (a Node)"
                         : body.status().message());
    return;
  }
  // A field in the mask and absent from the body is cleared.
  const json metadata = body->value("metadata", json::object());
  if (!Valid(ValidateStringMap(metadata, "node.metadata"), res)) return;

  std::lock_guard<std::mutex> lock(state_.mu);
  std::optional<NodeRef> ref = NodeOfPath(state_, req, res);
  if (!ref) return;
  QueuedResourceRecord r = *ref->record;
  NodeRecord& n = r.nodes[ref->index];
  if (r.delete_requested) {
    WriteError(
        res, 400, "FAILED_PRECONDITION",
        "node " + n.node_id + " is being deleted with queued resource " + r.id);
    return;
  }
  n.metadata = metadata;
  ++n.metadata_generation;
  OperationRecord op = state_.NewOperation(r, api, "update");
  op.target = NodeName(r.project, r.zone, n.node_id);
  r.node_updates.push_back({op.name, n.node_id, n.metadata_generation,
                            WallMs() + kNodeUpdateTimeoutMs});
  Status s = state_.Persist(r, {op});
  if (!s.ok()) {
    WriteError(res, 500, "INTERNAL", s.message());
    return;
  }
  state_.Log(r.id + ": node " + n.node_id + " metadata updated (generation " +
             std::to_string(n.metadata_generation) + ")");
  state_.records[r.name] = std::move(r);
  state_.ops[op.name] = op;
  FinishNodeUpdates(state_);  // at once when no host has to apply it
  WriteJson(res, 200, state_.ops[op.name].ToApi());
}

void NodeAccessApi::HandleGetGuestAttributes(R req, W res) {
  Result<json> body = ParseJsonText(req.body.empty() ? "{}" : req.body);
  if (!body.ok() || !body->is_object()) {
    WriteError(res, 400, "INVALID_ARGUMENT",
               body.ok() ? "body: expected a JSON object "
                           "(GetGuestAttributesRequest)"
                         : body.status().message());
    return;
  }
  const json path_value = body->value("queryPath", json(""));
  const json ids = body->value("workerIds", json::array());
  if (!path_value.is_string() || !ids.is_array()) {
    WriteError(res, 400, "INVALID_ARGUMENT",
               "query_path: expected a string, worker_ids: a list of strings");
    return;
  }
  const std::string query_path = path_value;
  std::lock_guard<std::mutex> lock(state_.mu);
  std::optional<NodeRef> ref = NodeOfPath(state_, req, res);
  if (!ref) return;
  const NodeRecord& n = ref->record->nodes[ref->index];
  // "" (gcloud's --worker=all) or no id: every worker.
  std::vector<size_t> workers;
  bool all = ids.empty();
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string field = "worker_ids[" + std::to_string(i) + "]";
    if (!ids[i].is_string()) {
      WriteError(res, 400, "INVALID_ARGUMENT", field + ": expected a string");
      return;
    }
    const std::string id = ids[i];
    if (id.empty()) {
      all = true;
      continue;
    }
    size_t worker = 0;
    const bool digits = id.size() <= 6 &&
                        id.find_first_not_of("0123456789") == std::string::npos;
    if (digits) worker = std::stoul(id);
    if (!digits || worker >= n.hosts.size()) {
      WriteError(res, 400, "INVALID_ARGUMENT",
                 field + ": " + QuoteForMessage(id) +
                     " is not a worker of node " + n.node_id + " (it has " +
                     std::to_string(n.hosts.size()) + ")");
      return;
    }
    workers.push_back(worker);
  }
  if (all) {
    workers.clear();
    for (size_t w = 0; w < n.hosts.size(); ++w) workers.push_back(w);
  }
  json out = json::array();
  for (size_t w : workers) {
    auto it = state_.hosts.find(n.hosts[w]);
    // Google answers 404 for a VM whose guest agent has written nothing;
    // gcloud then connects without the host key's name in its alias.
    if (it == state_.hosts.end() || it->second.ssh_host_keys.empty()) {
      WriteError(res, 404, "NOT_FOUND",
                 "guest attributes of worker " + std::to_string(w) +
                     " of node " + n.node_id + ": its host runs no sshd");
      return;
    }
    json items = json::array();
    for (const auto& [type, key] : it->second.ssh_host_keys.items()) {
      const std::string path = "hostkeys/" + type;
      if (!query_path.empty() && query_path != "/" &&
          path.rfind(query_path, 0) != 0) {
        continue;
      }
      items.push_back(
          {{"namespace", "hostkeys"}, {"key", type}, {"value", key}});
    }
    out.push_back(
        {{"queryPath", query_path}, {"queryValue", {{"items", items}}}});
  }
  WriteJson(res, 200, {{"guestAttributes", out}});
}

void NodeAccessApi::HandleGetProject(R req, W res) {
  const std::string version = req.matches[1], project = req.matches[2];
  if (!Valid(ValidateProjectId("project", project), res)) return;
  // No project-wide metadata: gcloud then adds its key to the node's
  // metadata (never the project's), and OS Login is off.
  WriteJson(res, 200,
            {{"kind", "compute#project"},
             {"id", std::to_string(Fnv1a(project) >> 1)},
             {"name", project},
             {"selfLink", "https://www.googleapis.com/compute/" + version +
                              "/projects/" + project},
             {"commonInstanceMetadata",
              {{"kind", "compute#metadata"},
               {"fingerprint", "AAAAAAAAAAA="},
               {"items", json::array()}}},
             {"xpnProjectStatus", "UNSPECIFIED_XPN_PROJECT_STATUS"}});
}

json SshKeysForHost(const ControlState& state, const std::string& host_id) {
  for (const auto& [name, r] : state.records) {
    for (const NodeRecord& n : r.nodes) {
      for (const std::string& h : n.hosts) {
        if (h != host_id) continue;
        const json metadata = r.NodeMetadata(n);
        const json keys = metadata.value("ssh-keys", json(""));
        return {{"owner", r.uid},
                {"generation", n.metadata_generation},
                {"keys", keys.is_string() ? keys : json("")}};
      }
    }
  }
  return {{"owner", ""}};
}

void NoteSshApplied(ControlState& state, Host& h, const json& report) {
  if (!report.is_object() || !report.contains("owner") ||
      !report["owner"].is_string() || !report.contains("generation") ||
      !report["generation"].is_number_integer()) {
    return;
  }
  const std::string owner = report["owner"];
  if (owner.size() > 128) return;
  const int64_t generation = report["generation"].get<int64_t>();
  if (owner == h.ssh_owner && generation == h.ssh_generation) return;
  h.ssh_owner = owner;
  h.ssh_generation = generation;
  FinishNodeUpdates(state);
}

void FinishNodeUpdates(ControlState& state) {
  const int64_t now = WallMs();
  for (auto& [name, live] : state.records) {
    if (live.node_updates.empty()) continue;
    QueuedResourceRecord r = live;
    std::vector<OperationRecord> ops;
    std::vector<NodeUpdate> pending;
    for (const NodeUpdate& u : r.node_updates) {
      size_t index = r.nodes.size();
      for (size_t i = 0; i < r.nodes.size(); ++i) {
        if (r.nodes[i].node_id == u.node_id) index = i;
      }
      bool done =
          index == r.nodes.size() || r.delete_requested || now >= u.deadline_ms;
      if (!done) {
        done = true;
        for (const std::string& h : r.nodes[index].hosts) {
          done = done && Applied(state, r, h, u.generation);
        }
      }
      auto op = state.ops.find(u.op);
      if (!done || op == state.ops.end()) {
        if (!done) pending.push_back(u);
        continue;
      }
      OperationRecord finished = op->second;
      finished.done = true;
      finished.end_ms = now;
      if (index < r.nodes.size()) {
        finished.response = NodeJson(r, index, state.hosts);
        finished.response["@type"] =
            "type.googleapis.com/google.cloud.tpu." +
            (finished.api_version == "v2" ? std::string("v2")
                                          : std::string("v2alpha1")) +
            ".Node";
      } else {
        finished.error = {{"code", 5},
                          {"message", "node " + u.node_id + " is gone"},
                          {"status", "NOT_FOUND"}};
      }
      ops.push_back(finished);
    }
    if (ops.empty()) continue;
    r.node_updates = pending;
    Status s = state.Persist(r, ops);
    if (!s.ok()) {
      state.Log(r.id + ": cannot persist a node update's end: " + s.message());
      continue;
    }
    for (const OperationRecord& op : ops) state.ops[op.name] = op;
    live = std::move(r);
  }
}

}  // namespace multislice::control
