#include "control/public_api.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <set>

#include "control/validation.h"
#include "runtime/mesh/topology.h"

namespace multislice::control {

using nlohmann::json;

namespace {

// The queued resource named by the path {project}/{zone}/{id}, validated.
std::optional<std::string> NameFromPath(const httplib::Request& req,
                                        httplib::Response& res) {
  if (!Valid(
          ValidateQueuedResourceName(req.matches[2].str(), req.matches[3].str(),
                                     req.matches[4].str()),
          res)) {
    return std::nullopt;
  }
  return QrName(req.matches[2], req.matches[3], req.matches[4]);
}

// The tier's quota in use, when it leaves no room for `r` (not yet
// admitted); else "". With mu held.
std::string QuotaReason(const QueuedResourceRecord& r,
                        const ControlState& state) {
  const int tier = static_cast<int>(r.spec.tier);
  const int64_t quota = state.options().quota_chips[tier];
  if (quota < 0 || r.holds_quota) return "";
  int64_t used = 0;
  for (const auto& [name, other] : state.records) {
    if (other.holds_quota && other.spec.tier == r.spec.tier) {
      used += other.total_chips();
    }
  }
  if (used + r.total_chips() <= quota) return "";
  return "the " + TierName(r.spec.tier) + " quota: " + std::to_string(used) +
         " of " + std::to_string(quota) + " chips in use, this request needs " +
         std::to_string(r.total_chips());
}

// Why `r` waits, when it does (an extra field, `waitingReason`, beside
// Google's schema): what it needs and what the zone has. With mu held.
std::string WaitingReason(const QueuedResourceRecord& r,
                          const ControlState& state) {
  if (r.state != QrState::kWaitingForResources) return "";
  if (state.options().cluster) {
    // The cluster owns the hosts: only the quota, or its pending job.
    if (r.cluster_job.empty()) return QuotaReason(r, state);
    return "Slurm job " + r.cluster_job + " is pending (squeue -j " +
           r.cluster_job + " says why)";
  }
  int needed = 0;
  for (const NodeRecord& n : r.nodes) {
    needed += n.hosts.empty() ? r.hosts_per_slice : 0;
  }
  const std::map<std::string, std::string> owners = state.HostOwners();
  int total = 0, free = 0;
  std::set<std::string> other_zones;
  for (const auto& [id, h] : state.hosts) {
    if (h.lost || h.accelerator_type != r.spec.accelerator_type) continue;
    if (h.zone != r.zone) {
      other_zones.insert(h.zone);
      continue;
    }
    ++total;
    free += owners.count(id) == 0;
  }
  const std::string type = r.spec.accelerator_type;
  if (total == 0) {
    std::string zones;
    for (const std::string& z : other_zones) {
      zones += (zones.empty() ? "" : ", ") + z;
    }
    return "no host of type " + type + " in zone " + r.zone +
           (zones.empty() ? std::string(" (nor in any other zone)")
                          : "; zones with such hosts: " + zones);
  }
  if (free < needed) {
    return "needs " + std::to_string(needed) + " free hosts of type " + type +
           " in zone " + r.zone + "; " + std::to_string(free) + " of its " +
           std::to_string(total) + " are free";
  }
  return QuotaReason(r, state);
}

// The API answer for `r` in version `api`, with why it waits.
json ApiAnswer(const QueuedResourceRecord& r, const std::string& api,
               const ControlState& state) {
  json out = r.ToApi(api);
  const std::string reason = WaitingReason(r, state);
  if (!reason.empty()) out["waitingReason"] = reason;
  return out;
}

}  // namespace

void PublicApi::Mount(httplib::Server& server, const std::string& token) {
  const std::string base =
      R"(/(v2alpha1|v2)/projects/([^/]+)/locations/([^/]+))";
  const std::string qrs = base + "/queuedResources";
  const std::string qr = qrs + R"(/([^/:]+))";
  using R = const httplib::Request&;
  using W = httplib::Response&;
  auto authed = [this, &token](void (PublicApi::*handler)(R, W)) {
    return WithBearer(token,
                      [this, handler](R q, W s) { (this->*handler)(q, s); });
  };
  server.Post(qrs, authed(&PublicApi::HandleCreate));
  server.Get(qrs, authed(&PublicApi::HandleList));
  server.Get(qr, authed(&PublicApi::HandleGet));
  server.Delete(qr, authed(&PublicApi::HandleDelete));
  server.Post(qr + ":reset", authed(&PublicApi::HandleReset));
  server.Get(base + R"(/operations/([^/]+))",
             authed(&PublicApi::HandleOperation));
  server.Get(base + "/operations", authed(&PublicApi::HandleListOperations));
  server.Post(base + R"(/operations/([^/:]+):cancel)",
              authed(&PublicApi::HandleForgetOperation));
  server.Delete(base + R"(/operations/([^/:]+))",
                authed(&PublicApi::HandleForgetOperation));
}

void PublicApi::HandleCreate(const httplib::Request& req,
                             httplib::Response& res) {
  const std::string api = req.matches[1], project = req.matches[2],
                    zone = req.matches[3];
  if (zone == "-") {
    WriteError(res, 400, "INVALID_ARGUMENT",
               "parent: a queued resource is created in one zone, not '-'");
    return;
  }
  if (!Valid(ValidateParent(project, zone, false), res)) return;
  // The seed's curl form, and the name Google's client libraries send.
  std::string id = req.get_param_value("queued_resource_id");
  const std::string camel = req.get_param_value("queuedResourceId");
  if (!id.empty() && !camel.empty() && id != camel) {
    WriteError(res, 400, "INVALID_ARGUMENT",
               "queued_resource_id and queuedResourceId differ: give one");
    return;
  }
  if (id.empty()) id = camel;
  if (id.empty()) {
    WriteError(res, 400, "INVALID_ARGUMENT", "queued_resource_id: is required");
    return;
  }
  if (!Valid(ValidateResourceId("queued_resource_id", id), res)) return;
  Result<json> body = ParseJsonText(req.body);
  if (!body.ok()) {
    WriteError(res, 400, "INVALID_ARGUMENT", body.status().message());
    return;
  }
  Create(api, project, zone, id, *body, /*as_node=*/false, res);
}

void PublicApi::Create(const std::string& api, const std::string& project,
                       const std::string& zone, const std::string& id,
                       const json& body, bool as_node, httplib::Response& res) {
  Result<QueuedResourceSpec> spec =
      ParseQueuedResource(body, id, WallMs(), api);
  if (!spec.ok()) {
    WriteError(res, 400, "INVALID_ARGUMENT", spec.status().message());
    return;
  }
  Result<mesh::AcceleratorType> type =
      mesh::ParseAcceleratorType(spec->accelerator_type);
  QueuedResourceRecord r;
  r.name = QrName(project, zone, id);
  r.project = project;
  r.zone = zone;
  r.id = id;
  r.create_ms = WallMs();
  r.spec = std::move(*spec);
  r.hosts_per_slice = type->hosts_per_slice();
  r.chips_per_slice = type->num_chips;
  r.state = QrState::kAccepted;
  r.created_as_node = as_node;
  for (const std::string& node_id : r.spec.node_ids) {
    NodeRecord n;
    n.node_id = node_id;
    r.nodes.push_back(n);
  }
  std::unique_lock<std::mutex> lock(state_.mu);
  if (state_.records.count(r.name)) {
    WriteError(res, 409, "ALREADY_EXISTS",
               "queued resource " + r.name + " already exists");
    return;
  }
  r.seq = state_.next_seq++;
  r.uid = state_.NewUid();
  OperationRecord op = state_.NewOperation(r, api, "create");
  r.waiting_ops.push_back(op.name);
  Status s = state_.Persist(r, {op});
  if (!s.ok()) {
    WriteError(res, 500, "INTERNAL", s.message());
    return;
  }
  state_.records[r.name] = r;
  state_.ops[op.name] = op;
  state_.Log(r.id + ": ACCEPTED (" + std::to_string(r.nodes.size()) + " x " +
             r.spec.accelerator_type + ", " + TierName(r.spec.tier) + ")");
  state_.Wake();
  WriteJson(res, 200, op.ToApi());
}

void PublicApi::HandleGet(const httplib::Request& req, httplib::Response& res) {
  const std::optional<std::string> path_name = NameFromPath(req, res);
  if (!path_name) return;
  const std::string& name = *path_name;
  std::lock_guard<std::mutex> lock(state_.mu);
  QueuedResourceRecord* found = FoundOr404(state_.FindById(name), name, res);
  if (!found) return;
  WriteJson(res, 200, ApiAnswer(*found, req.matches[1], state_));
}

void PublicApi::HandleList(const httplib::Request& req,
                           httplib::Response& res) {
  const std::string project = req.matches[2], zone = req.matches[3];
  if (!Valid(ValidateParent(project, zone, true), res)) return;
  // The token here is the creation sequence number after which the page
  // starts, so that creates and deletes between pages shift nothing.
  std::optional<PageRequest> page = PageOf(req, res);
  if (!page) return;
  std::vector<const QueuedResourceRecord*> matching;
  std::lock_guard<std::mutex> lock(state_.mu);
  for (const auto& [name, r] : state_.records) {
    if (r.project == project && (zone == "-" || r.zone == zone) &&
        r.seq > page->after) {
      matching.push_back(&r);
    }
  }
  std::sort(matching.begin(), matching.end(),
            [](const auto* a, const auto* b) { return a->seq < b->seq; });
  json out = {{"queuedResources", json::array()}};
  const size_t shown = std::min(matching.size(), size_t(page->size));
  for (size_t i = 0; i < shown; ++i) {
    out["queuedResources"].push_back(
        ApiAnswer(*matching[i], req.matches[1], state_));
  }
  if (matching.size() > shown) {
    out["nextPageToken"] = FormatPageToken(matching[shown - 1]->seq);
  }
  WriteJson(res, 200, out);
}

void PublicApi::HandleDelete(const httplib::Request& req,
                             httplib::Response& res) {
  const std::string api = req.matches[1];
  const std::optional<std::string> path_name = NameFromPath(req, res);
  if (!path_name) return;
  const std::string& name = *path_name;
  const Result<bool> force_param =
      ParseBoolParam("force", req.get_param_value("force"));
  if (!Valid(force_param.status(), res)) return;
  Delete(api, name, *force_param, res);
}

void PublicApi::Delete(const std::string& api, const std::string& name,
                       bool force, httplib::Response& res) {
  std::lock_guard<std::mutex> lock(state_.mu);
  QueuedResourceRecord* found = FoundOr404(state_.FindById(name), name, res);
  if (!found) return;
  QueuedResourceRecord r = *found;
  const bool deletable =
      r.state == QrState::kAccepted || r.state == QrState::kFailed ||
      r.state == QrState::kSuspended || r.state == QrState::kDeleting;
  if (!force && !deletable) {
    WriteError(res, 400, "FAILED_PRECONDITION",
               "queued resource " + name + " is " + StateName(r.state) +
                   ": without force only ACCEPTED, FAILED or SUSPENDED queued "
                   "resources are deleted (pass force=true to delete its "
                   "nodes first)");
    return;
  }
  OperationRecord op = state_.NewOperation(r, api, "delete");
  r.waiting_ops.push_back(op.name);
  r.delete_requested = true;
  r.state = QrState::kDeleting;
  r.state_initiator = "USER";
  r.stage = "stop";
  for (NodeRecord& n : r.nodes) n.state = "DELETING";
  CommitUserChange(r, op, r.id + ": DELETING", res);
}

void PublicApi::HandleReset(const httplib::Request& req,
                            httplib::Response& res) {
  const std::string api = req.matches[1];
  const std::optional<std::string> path_name = NameFromPath(req, res);
  if (!path_name) return;
  const std::string& name = *path_name;
  std::lock_guard<std::mutex> lock(state_.mu);
  QueuedResourceRecord* found = FoundOr404(state_.FindById(name), name, res);
  if (!found) return;
  QueuedResourceRecord r = *found;
  if (r.state != QrState::kActive) {
    WriteError(res, 400, "FAILED_PRECONDITION",
               "queued resource " + name + " is " + StateName(r.state) +
                   ": only an ACTIVE queued resource can be reset");
    return;
  }
  OperationRecord op = state_.NewOperation(r, api, "reset");
  r.waiting_ops.push_back(op.name);
  r.state = QrState::kProvisioning;
  r.state_initiator = "USER";
  r.stage = "stop";
  for (NodeRecord& n : r.nodes) {
    n.state = "RESTARTING";
    n.started = false;
  }
  CommitUserChange(r, op, r.id + ": reset requested", res);
}

void PublicApi::CommitUserChange(QueuedResourceRecord& r,
                                 const OperationRecord& op,
                                 const std::string& log_line,
                                 httplib::Response& res) {
  Status s = state_.Persist(r, {op});
  if (!s.ok()) {
    WriteError(res, 500, "INTERNAL", s.message());
    return;
  }
  state_.records[r.name] = r;
  state_.Changed(state_.records[r.name]);
  state_.ops[op.name] = op;
  state_.Log(log_line);
  state_.Wake();
  WriteJson(res, 200, op.ToApi());
}

const OperationRecord* PublicApi::FindOperation(const httplib::Request& req,
                                                httplib::Response& res) {
  if (!Valid(ValidateOperationName(req.matches[2].str(), req.matches[3].str(),
                                   req.matches[4].str()),
             res)) {
    return nullptr;
  }
  const std::string name = "projects/" + req.matches[2].str() + "/locations/" +
                           req.matches[3].str() + "/operations/" +
                           req.matches[4].str();
  auto it = state_.ops.find(name);
  if (it == state_.ops.end()) {
    WriteError(res, 404, "NOT_FOUND", "operation " + name + " not found");
    return nullptr;
  }
  return &it->second;
}

void PublicApi::HandleOperation(const httplib::Request& req,
                                httplib::Response& res) {
  std::lock_guard<std::mutex> lock(state_.mu);
  if (const OperationRecord* op = FindOperation(req, res)) {
    WriteJson(res, 200, op->ToApi());
  }
}

void PublicApi::HandleListOperations(const httplib::Request& req,
                                     httplib::Response& res) {
  const std::string project = req.matches[2], zone = req.matches[3];
  if (!Valid(ValidateParent(project, zone, true), res)) return;
  const std::string prefix = "projects/" + project + "/locations/" +
                             (zone == "-" ? std::string() : zone + "/");
  std::lock_guard<std::mutex> lock(state_.mu);
  std::vector<const OperationRecord*> matching;
  for (const auto& [name, op] : state_.ops) {
    if (name.rfind(prefix, 0) == 0) matching.push_back(&op);
  }
  std::sort(matching.begin(), matching.end(), [](const auto* a, const auto* b) {
    return a->create_ms != b->create_ms ? a->create_ms < b->create_ms
                                        : a->name < b->name;
  });
  std::vector<json> items;
  for (const OperationRecord* op : matching) items.push_back(op->ToApi());
  WritePage(req, res, "operations", items);
}

void PublicApi::HandleForgetOperation(const httplib::Request& req,
                                      httplib::Response& res) {
  std::lock_guard<std::mutex> lock(state_.mu);
  if (FindOperation(req, res)) WriteJson(res, 200, json::object());
}

}  // namespace multislice::control
