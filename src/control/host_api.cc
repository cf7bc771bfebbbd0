#include "control/host_api.h"

#include <algorithm>
#include <cstdlib>

#include "control/agent_capacity.h"
#include "control/node_access.h"
#include "control/validation.h"
#include "runtime/mesh/topology.h"

namespace multislice::control {

using nlohmann::json;

namespace {

using R = const httplib::Request&;
using W = httplib::Response&;
const char kHosts[] = "/internal/v1/hosts";

}  // namespace

void HostApi::MountAgentChannel(httplib::Server& server,
                                const std::string& token) {
  const std::string hosts = kHosts;
  // Registration: the admin token or the agents' one.
  const std::string agent_token = state_.options().agent_token;
  server.Post(hosts + ":register", [this, token, agent_token](R q, W s) {
    if (!agent_token.empty() && HasBearer(q, agent_token)) {
      HandleRegister(q, s);
    } else if (RequireBearer(q, s, token)) {
      HandleRegister(q, s);
    }
  });
  // Heartbeats: the host's own secret (checked in the handler).
  server.Post(hosts + R"(/([^/:]+):heartbeat)",
              [this](R q, W s) { HandleHeartbeat(q, s); });
}

void HostApi::Mount(httplib::Server& server, const std::string& token) {
  MountAgentChannel(server, token);
  auto authed = [this, &token](void (HostApi::*handler)(R, W)) {
    return WithBearer(token,
                      [this, handler](R q, W s) { (this->*handler)(q, s); });
  };
  const std::string hosts = kHosts;
  const std::string qr = R"(/internal/v1/queuedResources/([^/]+))";
  server.Post(hosts + R"(/([^/:]+):fail)", authed(&HostApi::HandleFailHost));
  server.Get(hosts, authed(&HostApi::HandleHosts));
  server.Get("/internal/v1/capacity", authed(&HostApi::HandleCapacity));
  server.Get(qr + "/workers", authed(&HostApi::HandleWorkers));
  server.Get(qr + "/operations", authed(&HostApi::HandleQrOperations));
  server.Get(qr + "/logs", authed(&HostApi::HandleLogs));
}

namespace {

// A registration's optional sshAddress ("IP:PORT" of the host's sshd) and
// sshHostKeys (type -> base64 public key), into `h`.
Status ParseSshRegistration(const json& body, Host& h) {
  if (body.contains("sshAddress")) {
    const json& address = body["sshAddress"];
    const std::string text =
        address.is_string() ? address.get<std::string>() : std::string();
    const size_t colon = text.rfind(':');
    const bool ok = address.is_string() && text.size() <= 64 &&
                    colon != std::string::npos && colon > 0 &&
                    std::atoi(text.c_str() + colon + 1) > 0 &&
                    text.find_first_not_of("0123456789.:") == std::string::npos;
    if (!ok) {
      return InvalidArgument("sshAddress: " + QuoteForMessage(text) +
                             " is not IP:PORT");
    }
    h.ssh_address = text;
  }
  if (body.contains("sshHostKeys")) {
    const json& keys = body["sshHostKeys"];
    if (!keys.is_object() || keys.size() > 8) {
      return InvalidArgument(
          "sshHostKeys: expected an object of at most 8 keys");
    }
    for (const auto& [type, key] : keys.items()) {
      const bool type_ok =
          type.size() <= 64 &&
          type.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-@.") ==
              std::string::npos;
      const bool key_ok =
          key.is_string() &&
          key.get_ref<const std::string&>().size() <= 16384 &&
          key.get_ref<const std::string&>().find_first_not_of(
              "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
              "=") == std::string::npos;
      if (!type_ok || !key_ok) {
        return InvalidArgument("sshHostKeys[" + QuoteForMessage(type) +
                               "]: expected a key type and a base64 key");
      }
    }
    h.ssh_host_keys = keys;
  }
  return OkStatus();
}

}  // namespace

void HostApi::HandleRegister(const httplib::Request& req,
                             httplib::Response& res) {
  Result<json> body = ParseJsonText(req.body);
  if (!body.ok() || !body->is_object()) {
    WriteError(
        res, 400, "INVALID_ARGUMENT",
        body.ok() ? "body: expected an object" : body.status().message());
    return;
  }
  Host h;
  for (auto [key, target] :
       std::initializer_list<std::pair<const char*, std::string*>>{
           {"hostname", &h.hostname},
           {"zone", &h.zone},
           {"acceleratorType", &h.accelerator_type},
           {"agentAddress", &h.agent_address},
           {"workdir", &h.workdir}}) {
    if (!body->contains(key) || !(*body)[key].is_string() ||
        (*body)[key].get<std::string>().size() > kMaxStringBytes) {
      WriteError(res, 400, "INVALID_ARGUMENT",
                 std::string(key) + ": expected a string");
      return;
    }
    *target = (*body)[key].get<std::string>();
  }
  // Optional: agents from before ICI domains send none.
  if (body->contains("iciDomain")) {
    if (!(*body)["iciDomain"].is_string()) {
      WriteError(res, 400, "INVALID_ARGUMENT", "iciDomain: expected a string");
      return;
    }
    h.ici_domain = (*body)["iciDomain"].get<std::string>();
    if (Status s = ValidateIciDomain("iciDomain", h.ici_domain); !s.ok()) {
      WriteError(res, 400, "INVALID_ARGUMENT", s.message());
      return;
    }
  }
  if (Status s = ParseSshRegistration(*body, h); !s.ok()) {
    WriteError(res, 400, "INVALID_ARGUMENT", s.message());
    return;
  }
  const size_t colon = h.agent_address.rfind(':');
  if (colon == std::string::npos || colon == 0 ||
      std::atoi(h.agent_address.c_str() + colon + 1) <= 0) {
    WriteError(res, 400, "INVALID_ARGUMENT",
               "agentAddress: '" + h.agent_address + "' is not HOST:PORT");
    return;
  }
  Result<mesh::AcceleratorType> type =
      mesh::ParseAcceleratorType(h.accelerator_type);
  if (!type.ok()) {
    WriteError(res, 400, "INVALID_ARGUMENT",
               "acceleratorType: " + type.status().message());
    return;
  }
  std::lock_guard<std::mutex> lock(state_.mu);
  for (const auto& [id, known] : state_.hosts) {
    if (known.agent_address == h.agent_address) {
      h.id = id;
      h.lost_at = known.lost_at;
    }
  }
  if (h.id.empty()) h.id = "host-" + std::to_string(state_.next_host++);
  h.last_heartbeat = SteadyMs();
  state_.GrantLease(h);
  // A new secret each time: whatever held the old one holds nothing now.
  Result<std::string> secret = RandomHex(32);
  if (!secret.ok()) {
    WriteError(res, 500, "INTERNAL", secret.status().message());
    return;
  }
  h.secret = *secret;
  h.holds_secret = false;
  Status s = state_.PersistHost(h);
  if (!s.ok()) {
    WriteError(res, 500, "INTERNAL", s.message());
    return;
  }
  state_.hosts[h.id] = h;
  state_.Log(h.id + ": registered " + h.accelerator_type + " at " +
             h.agent_address +
             (h.ici_domain.empty() ? "" : " in ICI domain " + h.ici_domain));
  state_.Wake();
  WriteJson(
      res, 200,
      {{"hostId", h.id},
       {"heartbeatIntervalMs", state_.options().heartbeat_interval.count()},
       {"heartbeatPort", agent_port_},
       {"leaseMs", state_.WorkerLease().count()},
       {"hostSecret", h.secret}});
}

void HostApi::HandleHeartbeat(const httplib::Request& req,
                              httplib::Response& res) {
  const std::string id = req.matches[1];
  // Bounded like every body (depth, UTF-8): a heartbeat's workers are kept.
  Result<json> parsed = ParseJsonText(req.body);
  const json body = parsed.ok() ? *std::move(parsed) : json();
  std::lock_guard<std::mutex> lock(state_.mu);
  auto it = state_.hosts.find(id);
  // Only the host itself may beat for it (its secret; hosts registered
  // before secrets existed, with the admin token).
  const std::string& credential =
      it == state_.hosts.end() || it->second.secret.empty()
          ? state_.options().token
          : it->second.secret;
  if (!RequireBearer(req, res, credential)) return;
  if (it == state_.hosts.end() || it->second.lost) {
    WriteError(res, 404, "NOT_FOUND",
               "host " + QuoteForMessage(id) +
                   " is not registered (register "
                   "again)");
    return;
  }
  if (!parsed.ok()) {
    WriteError(res, 400, "INVALID_ARGUMENT", parsed.status().message());
    return;
  }
  it->second.last_heartbeat = SteadyMs();
  state_.GrantLease(it->second);
  if (!it->second.holds_secret) {
    it->second.holds_secret = true;  // signed with the newest secret
    state_.Wake();                   // it can be placed now
  }
  if (body.is_object() && body.contains("workers") &&
      body["workers"].is_array()) {
    it->second.workers = body["workers"];
  }
  if (body.is_object() && body.contains("ssh")) {
    NoteSshApplied(state_, it->second, body["ssh"]);
  }
  // The keys of the node holding the host, for its sshd.
  WriteJson(res, 200,
            {{"leaseMs", state_.WorkerLease().count()},
             {"ssh", SshKeysForHost(state_, id)}});
}

void HostApi::HandleFailHost(const httplib::Request& req,
                             httplib::Response& res) {
  const std::string id = req.matches[1];
  std::lock_guard<std::mutex> lock(state_.mu);
  auto it = state_.hosts.find(id);
  if (it == state_.hosts.end()) {
    // Accept the agent address or hostname too.
    for (auto h = state_.hosts.begin(); h != state_.hosts.end(); ++h) {
      if (h->second.agent_address == id || h->second.hostname == id) it = h;
    }
  }
  if (it == state_.hosts.end()) {
    WriteError(res, 404, "NOT_FOUND", "host " + id + " not found");
    return;
  }
  const std::string owner = state_.HostOwners().count(it->first)
                                ? state_.HostOwners().at(it->first)
                                : std::string();
  state_.MarkLost(it->first, "failed by admin fail-host");
  state_.Wake();
  WriteJson(res, 200,
            {{"hostId", it->first}, {"lost", true}, {"queuedResource", owner}});
}

void HostApi::HandleHosts(const httplib::Request&, httplib::Response& res) {
  std::lock_guard<std::mutex> lock(state_.mu);
  std::map<std::string, std::string> owners = state_.HostOwners();
  json out = {{"hosts", json::array()}};
  for (const auto& [id, h] : state_.hosts) {
    json j = h.ToStorage();
    j.erase("secret");
    j["queuedResource"] = owners.count(id) ? owners[id] : "";
    j["workers"] = h.workers;
    out["hosts"].push_back(j);
  }
  WriteJson(res, 200, out);
}

void HostApi::HandleCapacity(const httplib::Request&, httplib::Response& res) {
  std::lock_guard<std::mutex> lock(state_.mu);
  std::map<std::string, std::string> owners = state_.HostOwners();
  const int64_t steady = SteadyMs();
  json hosts = json::array();
  for (const auto& [id, h] : state_.hosts) {
    const bool used = owners.count(id) > 0;
    hosts.push_back({{"id", id},
                     {"hostname", h.hostname},
                     {"zone", h.zone},
                     {"acceleratorType", h.accelerator_type},
                     {"iciDomain", h.ici_domain},
                     {"agentAddress", h.agent_address},
                     {"state", h.lost ? "LOST" : (used ? "USED" : "FREE")},
                     {"lostReason", h.lost_reason},
                     {"queuedResource", used ? owners[id] : ""},
                     {"heartbeatAgeMs", steady - h.last_heartbeat}});
  }
  int64_t held[kNumTiers] = {0, 0, 0, 0};
  int64_t idle[kNumTiers] = {0, 0, 0, 0};  // FAILED or SUSPENDED
  int idle_count[kNumTiers] = {0, 0, 0, 0};
  for (const auto& [name, r] : state_.records) {
    if (!r.holds_quota) continue;
    const int t = static_cast<int>(r.spec.tier);
    held[t] += r.total_chips();
    if (r.state == QrState::kFailed || r.state == QrState::kSuspended) {
      idle[t] += r.total_chips();
      ++idle_count[t];
    }
  }
  json tiers = json::array();
  for (int t = 0; t < kNumTiers; ++t) {
    tiers.push_back({{"tier", TierName(static_cast<Tier>(t))},
                     {"usedChips", held[t]},
                     {"quotaChips", state_.options().quota_chips[t]},
                     {"heldByFailedOrSuspendedChips", idle[t]},
                     {"failedOrSuspended", idle_count[t]}});
  }
  WriteJson(res, 200, {{"hosts", hosts}, {"tiers", tiers}});
}

void HostApi::HandleQrOperations(const httplib::Request& req,
                                 httplib::Response& res) {
  const std::string id = req.matches[1];
  std::lock_guard<std::mutex> lock(state_.mu);
  QueuedResourceRecord* r = FoundOr404(state_.FindById(id), id, res);
  if (!r) return;
  std::vector<const OperationRecord*> matching;
  for (const auto& [name, op] : state_.ops) {
    if (op.target == r->name) matching.push_back(&op);
  }
  std::sort(matching.begin(), matching.end(), [](const auto* a, const auto* b) {
    return a->create_ms < b->create_ms;
  });
  json out = json::array();
  for (const OperationRecord* op : matching) out.push_back(op->ToApi());
  WriteJson(res, 200, {{"operations", out}});
}

void HostApi::HandleWorkers(const httplib::Request& req,
                            httplib::Response& res) {
  const std::string id = req.matches[1];
  std::lock_guard<std::mutex> lock(state_.mu);
  QueuedResourceRecord* r = FoundOr404(state_.FindById(id), id, res);
  if (!r) return;
  json workers = json::array();
  for (size_t i = 0; i < r->nodes.size(); ++i) {
    const NodeRecord& n = r->nodes[i];
    for (size_t w = 0; w < n.hosts.size(); ++w) {
      const Host& h = state_.hosts[n.hosts[w]];
      const std::string name =
          WorkerName(r->id, static_cast<int>(i), static_cast<int>(w));
      workers.push_back({{"node", n.node_id},
                         {"nodeIndex", i},
                         {"worker", w},
                         {"name", name},
                         {"hostId", h.id},
                         {"agentAddress", h.agent_address},
                         // For the admin's exec on this host (ssh, run).
                         {"agentToken", h.secret},
                         {"directory", h.workdir + "/workers/" + name}});
    }
  }
  WriteJson(res, 200, {{"workers", workers}, {"attempt", r->attempt}});
}

void HostApi::HandleLogs(const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches[1];
  int64_t bytes = 4096;
  if (req.has_param("bytes")) {
    const std::string text = req.get_param_value("bytes");
    char* end = nullptr;
    long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || v < 1 || v > 65536) {
      WriteError(res, 400, "INVALID_ARGUMENT",
                 "bytes: '" + text.substr(0, 40) +
                     "' is not an integer from 1 to 65536");
      return;
    }
    bytes = v;
  }
  struct Target {
    json entry;
    std::string agent_address;
    std::string credential;
  };
  std::vector<Target> targets;
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    QueuedResourceRecord* r = FoundOr404(state_.FindById(id), id, res);
    if (!r) return;
    for (size_t i = 0; i < r->nodes.size(); ++i) {
      const NodeRecord& n = r->nodes[i];
      for (size_t w = 0; w < n.hosts.size(); ++w) {
        auto hit = state_.hosts.find(n.hosts[w]);
        if (hit == state_.hosts.end()) continue;
        Target t;
        t.entry = {{"node", n.node_id},
                   {"nodeIndex", i},
                   {"worker", w},
                   {"name", WorkerName(r->id, static_cast<int>(i),
                                       static_cast<int>(w))},
                   {"hostId", hit->first}};
        t.agent_address = hit->second.agent_address;
        t.credential = hit->second.secret;
        targets.push_back(std::move(t));
      }
    }
  }
  // Outside the lock: each agent runs `tail` in the worker's directory
  // (its exec call, like `queued-resources ssh`), read back until done.
  std::vector<json> out(targets.size());
  const std::string command = "tail -c " + std::to_string(bytes) +
                              " startup-script.log 2>/dev/null || true";
  const std::string token = state_.options().token;
  ForEachParallel(targets, [&](const Target& t, size_t i) {
    json entry = t.entry;
    entry["log"] = "";
    Result<ApiClient> client = AgentClient(
        t.agent_address, t.credential.empty() ? token : t.credential,
        std::chrono::milliseconds(3000));
    Result<std::string> log =
        client.ok() ? ExecOnWorker(*client, entry["name"].get<std::string>(),
                                   command, SteadyMs() + 3000)
                    : Result<std::string>(client.status());
    if (log.ok()) {
      entry["log"] = *log;
    } else {
      entry["error"] = log.status().message();
    }
    out[i] = entry;
  });
  WriteJson(res, 200, {{"workers", out}, {"bytes", bytes}});
}

}  // namespace multislice::control
