#include "control/control_state.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace multislice::control {

using nlohmann::json;

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

json Host::ToStorage() const {
  return {{"id", id},
          {"hostname", hostname},
          {"zone", zone},
          {"acceleratorType", accelerator_type},
          {"iciDomain", ici_domain},
          {"agentAddress", agent_address},
          {"workdir", workdir},
          {"secret", secret},
          {"lost", lost},
          {"lostReason", lost_reason},
          {"sshAddress", ssh_address},
          {"sshHostKeys", ssh_host_keys}};
}

Host Host::FromStorage(const json& j) {
  Host h;
  h.id = j.value("id", "");
  h.hostname = j.value("hostname", "");
  h.zone = j.value("zone", "");
  h.accelerator_type = j.value("acceleratorType", "");
  h.ici_domain = j.value("iciDomain", "");  // absent in older stores
  h.agent_address = j.value("agentAddress", "");
  h.workdir = j.value("workdir", "");
  h.secret = j.value("secret", "");
  h.lost = j.value("lost", false);
  h.lost_reason = j.value("lostReason", "");
  // Absent before agents ran sshd.
  h.ssh_address = j.value("sshAddress", "");
  h.ssh_host_keys = j.value("sshHostKeys", json::object());
  if (!h.ssh_host_keys.is_object()) h.ssh_host_keys = json::object();
  return h;
}

std::string Host::ip() const {
  size_t colon = agent_address.rfind(':');
  return colon == std::string::npos ? agent_address
                                    : agent_address.substr(0, colon);
}

bool IsLoopback(const std::string& ip) {
  return ip == "localhost" || ip.rfind("127.", 0) == 0 || ip == "::1";
}

std::string QrName(const std::string& project, const std::string& zone,
                   const std::string& id) {
  return "projects/" + project + "/locations/" + zone + "/queuedResources/" +
         id;
}

namespace {

// The ids of r's nodes in repair.
std::set<std::string> RepairingNodes(const QueuedResourceRecord& r) {
  std::set<std::string> ids;
  for (const NodeRecord& n : r.nodes) {
    if (n.state == "REPAIRING") ids.insert(n.node_id);
  }
  return ids;
}

}  // namespace

ControlState::ControlState(const ControllerOptions& options,
                           std::unique_ptr<Store> store)
    : options_(options), store_(std::move(store)) {}

Status ControlState::Load() {
  ASSIGN_OR_RETURN(StoreSnapshot snapshot, store_->Load());
  const int64_t now = SteadyMs();
  for (QueuedResourceRecord& r : snapshot.queued_resources) {
    next_seq = std::max(next_seq, r.seq + 1);
    // A repair under way before the restart completes here.
    std::set<std::string> repairing = RepairingNodes(r);
    if (!repairing.empty()) repairing_[r.name] = std::move(repairing);
    records[r.name] = std::move(r);
  }
  for (OperationRecord& op : snapshot.operations) ops[op.name] = op;
  for (const json& j : snapshot.hosts) {
    Host h = Host::FromStorage(j);
    h.last_heartbeat = now;       // a grace period of one timeout after restart
    if (h.lost) h.lost_at = now;  // lost hosts age from the restart
    GrantLease(h);  // whatever it was granted before, lapsed by then
    int n = std::atoi(h.id.c_str() + (h.id.rfind("host-", 0) == 0 ? 5 : 0));
    next_host = std::max(next_host, n + 1);
    hosts[h.id] = h;
  }
  // A restarted attempt may have been fenced before the restart: wait a
  // whole lease before starting it.
  for (const auto& [name, r] : records) {
    if (r.stage == "start" && r.attempt > 1) {
      fences[name][""] =
          now + WorkerLease().count() + options_.fence_margin.count();
    }
  }
  if (!records.empty()) {
    Log("restored " + std::to_string(records.size()) + " queued resources, " +
        std::to_string(ops.size()) + " operations, " +
        std::to_string(hosts.size()) + " hosts");
  }
  return OkStatus();
}

void ControlState::CountRepairs(const QueuedResourceRecord& r) {
  std::set<std::string> now = RepairingNodes(r);
  auto it = repairing_.find(r.name);
  const std::set<std::string> before =
      it == repairing_.end() ? std::set<std::string>() : it->second;
  for (const NodeRecord& n : r.nodes) {
    const bool was = before.count(n.node_id) > 0;
    counts.repairs_started += !was && now.count(n.node_id);
    counts.repairs_completed += was && n.state == "READY";
  }
  if (now.empty()) {
    repairing_.erase(r.name);
  } else {
    repairing_[r.name] = std::move(now);
  }
  // Records deleted during a repair are never persisted again.
  for (auto gone = repairing_.begin(); gone != repairing_.end();) {
    gone =
        records.count(gone->first) ? std::next(gone) : repairing_.erase(gone);
  }
}

Status ControlState::Persist(QueuedResourceRecord& r,
                             std::vector<OperationRecord> changed_ops) {
  CountRepairs(r);
  r.RecordStateChange(WallMs());
  StoreChange change;
  change.put_queued_resources.push_back(r);
  change.put_operations = std::move(changed_ops);
  return store_->Apply(change);
}

Status ControlState::PersistHost(const Host& h) {
  StoreChange change;
  change.put_hosts.push_back(h.ToStorage());
  return store_->Apply(change);
}

std::string ControlState::NewUid() {
  char text[40];
  std::snprintf(text, sizeof(text), "%016llx%016llx",
                static_cast<unsigned long long>(rng_()),
                static_cast<unsigned long long>(rng_()));
  return text;
}

OperationRecord ControlState::NewOperation(const QueuedResourceRecord& r,
                                           const std::string& api,
                                           const std::string& verb) {
  char suffix[32];
  std::snprintf(suffix, sizeof(suffix), "%016llx",
                static_cast<unsigned long long>(rng_()));
  OperationRecord op;
  op.name = "projects/" + r.project + "/locations/" + r.zone +
            "/operations/operation-" + suffix;
  op.target = r.name;
  op.verb = verb;
  op.api_version = api;
  op.create_ms = WallMs();
  return op;
}

void ControlState::FinishOps(QueuedResourceRecord& r, const json& response,
                             std::vector<OperationRecord>* changed) {
  for (const std::string& name : r.waiting_ops) {
    auto it = ops.find(name);
    if (it == ops.end() || it->second.done) continue;
    OperationRecord op = it->second;
    op.done = true;
    op.end_ms = WallMs();
    if (op.verb == "delete") {
      op.response = {{"@type", "type.googleapis.com/google.protobuf.Empty"}};
    } else {
      // The queued resource as the operation's API version shows it.
      op.response = response.is_object() && !response.empty()
                        ? r.ToApi(op.api_version)
                        : response;
      op.response["@type"] =
          "type.googleapis.com/google.cloud.tpu." +
          (op.api_version == "v2" ? std::string("v2")
                                  : std::string("v2alpha1")) +
          ".QueuedResource";
    }
    changed->push_back(op);
  }
  r.waiting_ops.clear();
}

std::map<std::string, std::string> ControlState::HostOwners() const {
  std::map<std::string, std::string> owners;
  for (const auto& [name, r] : records) {
    for (const NodeRecord& n : r.nodes) {
      for (const std::string& h : n.hosts) owners[h] = name;
    }
    for (const std::string& h : r.retired_hosts) owners[h] = name;
  }
  return owners;
}

void ControlState::ForgetLongLostHosts() {
  const int64_t now = SteadyMs();
  const std::map<std::string, std::string> owners = HostOwners();
  StoreChange change;
  for (const auto& [id, h] : hosts) {
    if (h.lost && !owners.count(id) &&
        now - h.lost_at > options_.lost_host_retention.count()) {
      change.delete_hosts.push_back(id);
    }
  }
  if (change.delete_hosts.empty()) return;
  Status s = store_->Apply(change);
  if (!s.ok()) {
    Log("cannot forget lost hosts: " + s.message());
    return;
  }
  for (const std::string& id : change.delete_hosts) {
    hosts.erase(id);
    Log(id + ": forgotten (lost for longer than " +
        std::to_string(options_.lost_host_retention.count()) + " ms)");
  }
}

QueuedResourceRecord* ControlState::FindById(const std::string& id) {
  auto it = records.find(id);
  if (it != records.end()) return &it->second;
  for (auto& [name, r] : records) {
    if (r.id == id || r.name == id) return &r;
  }
  return nullptr;
}

void ControlState::Log(const std::string& line) const {
  std::fprintf(stderr, "controller: %s\n", line.c_str());
}

namespace {

// Sends node `lost_node` of `r` to repair: the whole slice is replaced, its
// hosts stay with r (retired) until its workers on them are stopped.
void RepairNode(QueuedResourceRecord& r, int lost_node,
                const std::string& host_id, const ControlState& state) {
  NodeRecord& n = r.nodes[lost_node];
  for (const std::string& h : n.hosts) r.retired_hosts.push_back(h);
  n.hosts.clear();
  n.started = false;
  n.health = "TIMEOUT";
  const bool repairing = r.state == QrState::kActive ||
                         r.state == QrState::kProvisioning ||
                         r.state == QrState::kWaitingForResources;
  if (repairing) {
    n.state = "REPAIRING";
    for (NodeRecord& other : r.nodes) {
      other.started = false;
      if (&other != &n && other.state != "REPAIRING") {
        other.state = "RESTARTING";
      }
    }
    r.state = QrState::kProvisioning;
    r.state_initiator = "SERVICE";
    state.Log(r.id + ": node " + n.node_id + " REPAIRING (" + host_id +
              " lost)");
  }
  r.stage = "stop";
}

}  // namespace

std::chrono::milliseconds ControlState::WorkerLease() const {
  return options_.worker_lease.count() > 0 ? options_.worker_lease
                                           : 2 * options_.heartbeat_timeout;
}

void ControlState::GrantLease(Host& h) {
  h.lease_until =
      SteadyMs() + WorkerLease().count() + options_.fence_margin.count();
}

int64_t ControlState::FenceOf(const std::string& name) const {
  auto it = fences.find(name);
  if (it == fences.end()) return 0;
  int64_t until = 0;
  for (const auto& [host, t] : it->second) until = std::max(until, t);
  return until;
}

void ControlState::LiftFence(const std::string& name,
                             const std::string& host_id) {
  auto it = fences.find(name);
  if (it == fences.end()) return;
  it->second.erase(host_id);
  if (it->second.empty()) fences.erase(it);
}

void ControlState::MarkLost(const std::string& host_id,
                            const std::string& reason, bool confirmed) {
  auto hit = hosts.find(host_id);
  if (hit == hosts.end()) return;
  Host& host = hit->second;
  if (!host.lost) {
    host.lost = true;
    host.lost_at = SteadyMs();
    host.lost_reason = reason;
    ++counts.hosts_lost;
    PersistHost(host).ok();
    Log(host_id + ": lost (" + reason + ")");
  }
  for (auto& [name, r] : records) {
    int lost_node = -1;
    for (size_t i = 0; i < r.nodes.size(); ++i) {
      const auto& hs = r.nodes[i].hosts;
      if (std::find(hs.begin(), hs.end(), host_id) != hs.end()) {
        lost_node = static_cast<int>(i);
      }
    }
    if (lost_node < 0) continue;
    if (!confirmed) fences[name][host_id] = host.lease_until;
    RepairNode(r, lost_node, host_id, *this);
    Changed(r);
    Status s = Persist(r);
    if (!s.ok()) Log("cannot persist " + r.id + ": " + s.message());
  }
}

}  // namespace multislice::control
