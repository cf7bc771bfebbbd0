#include "control/agent_capacity.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <thread>

#include "control/control_state.h"

namespace multislice::control {

using nlohmann::json;

Result<ApiClient> AgentClient(const std::string& address,
                              const std::string& token,
                              std::chrono::milliseconds timeout) {
  return ApiClient::Create("http://" + address, token, timeout);
}

Result<std::string> ExecOnWorker(ApiClient& client, const std::string& worker,
                                 const std::string& command,
                                 int64_t deadline_ms) {
  json body = {{"command", command}, {"worker", worker}};
  Result<HttpResponse> started = client.Call("POST", "/agent/v1/exec", &body);
  if (!started.ok()) return started.status();
  if (started->status / 100 != 2 || !started->body.is_object() ||
      !started->body.contains("execId") ||
      !started->body["execId"].is_string()) {
    return ErrorFromResponse(*started);
  }
  const std::string exec_id = started->body["execId"].get<std::string>();
  std::string output;
  int64_t offset = 0;
  while (SteadyMs() < deadline_ms) {
    Result<HttpResponse> r =
        client.Call("GET", "/agent/v1/exec/" + exec_id +
                               "?offset=" + std::to_string(offset));
    if (!r.ok()) return r.status();
    if (r->status != 200 || !r->body.is_object()) return ErrorFromResponse(*r);
    output += r->body.value("output", "");
    offset = r->body.value("nextOffset", offset);
    if (r->body.value("done", false)) return output;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return DeadlineExceeded("the agent did not finish the command in time");
}

namespace {

// Whether the host of `address` (HOST:PORT) refuses a TCP connection to the
// port at once: the agent process is gone. A timeout (a frozen agent, a
// partition) is not a refusal.
bool ConnectionRefused(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(address.substr(0, colon).c_str(),
                    address.substr(colon + 1).c_str(), &hints, &found) != 0) {
    return false;
  }
  bool refused = false;
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (fd >= 0) {
    if (::connect(fd, found->ai_addr, found->ai_addrlen) != 0 &&
        errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, 500) == 1) {
        int error = 0;
        socklen_t len = sizeof(error);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
        refused = error == ECONNREFUSED;
      }
    } else {
      refused = errno == ECONNREFUSED;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return refused;
}

// The bearer for calls to `host`'s agent: its secret (an agent registered
// with a controller that issued none accepts the admin token).
std::string Credential(const HostCall& host, const std::string& admin) {
  return host.credential.empty() ? admin : host.credential;
}

// Records `host` as unreachable in `result`, and as dead when it refuses.
void Unreachable(const HostCall& host, WorkResult& result) {
  result.lost_hosts.insert(host.host_id);
  if (ConnectionRefused(host.agent_address)) {
    result.dead_hosts.insert(host.host_id);
  }
}

// A 409 on start: a worker of that name already runs. Ours (a restarted
// controller) counts as started; one of another attempt is stopped.
bool AdoptOrStopRunning(ApiClient& client, const StartTarget& t, int attempt,
                        int grace_seconds) {
  Result<HttpResponse> list = client.Call("GET", "/agent/v1/workers");
  if (!list.ok() || list->status != 200) return false;
  bool ours = false;
  for (const json& w : list->body.value("workers", json::array())) {
    if (w.value("name", "") != t.name) continue;
    if (w.value("state", "") != "RUNNING") continue;
    if (w.value("attempt", -1) == attempt) {
      ours = true;
    } else {
      json stop = {{"graceSeconds", grace_seconds}};
      client.Call("POST", "/agent/v1/workers/" + t.name + ":stop", &stop)
          .status()
          .ok();
    }
  }
  return ours;
}

// Whether `name` is "{prefix}{node}.{worker}": not another QR's worker whose
// id extends ours.
bool IsWorkerOf(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix, 0) != 0) return false;
  const std::string rest = name.substr(prefix.size());
  return rest.find_first_not_of("0123456789.") == std::string::npos &&
         std::count(rest.begin(), rest.end(), '.') == 1;
}

}  // namespace

WorkResult AgentCapacity::StartWorkers(const std::vector<StartTarget>& targets,
                                       int attempt, const std::string& script,
                                       int nodes) {
  WorkResult result;
  std::mutex result_mu;
  std::vector<char> ok(targets.size(), 0);
  const auto timeout = options_.agent_call_timeout;
  ForEachParallel(targets, [&](const StartTarget& t, size_t index) {
    Result<ApiClient> client = AgentClient(
        t.host.agent_address, Credential(t.host, options_.token), timeout);
    if (!client.ok()) return;
    json body = {{"attempt", attempt}, {"script", script}, {"env", t.env}};
    Result<HttpResponse> put =
        client->Call("PUT", "/agent/v1/workers/" + t.name, &body);
    if (put.ok() && put->status == 409) {
      ok[index] =
          AdoptOrStopRunning(*client, t, attempt, options_.stop_grace_seconds);
      return;
    }
    std::lock_guard<std::mutex> lock(result_mu);
    if (!put.ok()) {
      Unreachable(t.host, result);
    } else if (put->status == 201 || put->status == 200) {
      ok[index] = 1;
      result.started_workers.emplace_back(t.host.host_id, put->body);
    } else if (put->status == 401) {
      // The agent does not hold the secret of the host's newest
      // registration (it registered again meanwhile): not this QR's
      // failure, the host's, as if it could not be reached.
      result.lost_hosts.insert(t.host.host_id);
    } else {
      result.hard_error = "agent " + t.host.host_id + " refused worker " +
                          t.name + ": " + ErrorFromResponse(*put).message();
    }
  });
  std::vector<int> pending(nodes, 0);
  std::set<int> touched;
  for (size_t i = 0; i < targets.size(); ++i) {
    touched.insert(targets[i].node);
    if (!ok[i]) ++pending[targets[i].node];
  }
  for (int node : touched) {
    if (pending[node] == 0) result.started_nodes.insert(node);
  }
  result.complete = result.lost_hosts.empty() && result.hard_error.empty() &&
                    static_cast<size_t>(std::count(ok.begin(), ok.end(), 1)) ==
                        targets.size();
  return result;
}

WorkResult AgentCapacity::StopWorkers(const std::vector<HostCall>& hosts,
                                      const std::string& worker_prefix) {
  WorkResult result;
  std::mutex result_mu;
  std::atomic<bool> all_stopped{true};
  const auto timeout =
      options_.agent_call_timeout +
      std::chrono::milliseconds(1000LL * options_.stop_grace_seconds);
  ForEachParallel(hosts, [&](const HostCall& h, size_t) {
    Result<ApiClient> client =
        AgentClient(h.agent_address, Credential(h, options_.token), timeout);
    if (!client.ok()) return;
    Result<HttpResponse> list = client->Call("GET", "/agent/v1/workers");
    if (!list.ok()) {
      std::lock_guard<std::mutex> lock(result_mu);
      Unreachable(h, result);
      return;
    }
    if (list->status != 200) {
      all_stopped = false;
      return;
    }
    bool host_stopped = true;
    for (const json& w : list->body.value("workers", json::array())) {
      const std::string name = w.value("name", "");
      if (!IsWorkerOf(name, worker_prefix)) continue;
      if (w.value("state", "") != "RUNNING") continue;
      json stop = {{"graceSeconds", options_.stop_grace_seconds}};
      Result<HttpResponse> r =
          client->Call("POST", "/agent/v1/workers/" + name + ":stop", &stop);
      if (!r.ok()) {
        std::lock_guard<std::mutex> lock(result_mu);
        Unreachable(h, result);
        host_stopped = false;
      } else if (r->status != 200 && r->status != 404) {
        all_stopped = false;
        host_stopped = false;
      }
    }
    if (host_stopped) {
      std::lock_guard<std::mutex> lock(result_mu);
      result.stopped_hosts.insert(h.host_id);
    }
  });
  result.complete = all_stopped.load();
  return result;
}

bool AgentCapacity::Alive(const HostCall& host,
                          std::chrono::milliseconds timeout) {
  Result<ApiClient> client = AgentClient(
      host.agent_address, Credential(host, options_.token), timeout);
  if (!client.ok()) return false;
  Result<HttpResponse> health = client->Call("GET", "/agent/v1/health");
  return health.ok() && health->status == 200;
}

}  // namespace multislice::control
