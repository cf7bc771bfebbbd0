#include "control/reconciler.h"

#include <algorithm>
#include <functional>
#include <map>

#include "control/node_access.h"
#include "control/scheduler.h"

namespace multislice::control {

using nlohmann::json;

void Reconciler::Start() {
  std::set<std::string> live;
  for (const auto& [name, r] : state_.records) live.insert(RunIdentity(r));
  stores_.RemoveFileStoresExcept(live);
  loop_thread_ = std::thread([this] { Loop(); });
}

void Reconciler::Stop() {
  if (loop_thread_.joinable()) loop_thread_.join();
  for (Work& w : work_) {
    if (w.thread.joinable()) w.thread.join();
  }
  work_.clear();
  stores_.Stop();
}

void Reconciler::Loop() {
  std::unique_lock<std::mutex> lock(state_.mu);
  while (!state_.stopping) {
    Tick();
    state_.cv.wait_for(lock, state_.options().reconcile_interval,
                       [this] { return state_.wake || state_.stopping; });
    state_.wake = false;
  }
}

void Reconciler::Tick() {
  // Reap finished work threads.
  for (auto it = work_.begin(); it != work_.end();) {
    if (it->done->load()) {
      it->thread.join();
      it = work_.erase(it);
    } else {
      ++it;
    }
  }
  ProbeSilentHosts();
  state_.ForgetLongLostHosts();
  FinishNodeUpdates(state_);  // metadata patches past their deadline
  const int64_t now = WallMs();
  for (auto& [name, r] : state_.records) {
    const bool waiting = (r.state == QrState::kAccepted ||
                          r.state == QrState::kWaitingForResources) &&
                         !r.holds_quota && !r.delete_requested;
    if (!waiting) continue;
    std::vector<OperationRecord> ops;
    if (r.spec.valid_until_ms > 0 && now >= r.spec.valid_until_ms) {
      r.state = QrState::kFailed;
      r.state_initiator = "SERVICE";
      r.failed_error = "the valid_until deadline " +
                       FormatTimestamp(r.spec.valid_until_ms) +
                       " passed before resources were available";
      state_.FinishOps(r, r.ToApi(), &ops);
    } else if (r.state == QrState::kAccepted && now >= r.spec.valid_after_ms) {
      r.state = QrState::kWaitingForResources;
      state_.FinishOps(r, r.ToApi(), &ops);
    } else {
      continue;
    }
    state_.Changed(r);
    Status s = state_.Persist(r, ops);
    if (!s.ok()) state_.Log("cannot persist " + r.id + ": " + s.message());
    for (const OperationRecord& op : ops) state_.ops[op.name] = op;
    state_.Log(r.id + ": " + StateName(r.state));
  }
  if (cluster_ != nullptr) {
    TickCluster();
    return;
  }
  Schedule(now);
  // By name: LaunchWork may complete (and erase) a record at once.
  std::vector<std::string> names;
  for (const auto& [name, r] : state_.records) {
    if (!r.stage.empty() && !busy_.count(name)) names.push_back(name);
  }
  for (const std::string& name : names) {
    auto it = state_.records.find(name);
    if (it != state_.records.end()) LaunchWork(it->second);
  }
}

void Reconciler::Schedule(int64_t) {
  SchedulerInput in;
  std::map<std::string, std::string> owners = state_.HostOwners();
  // Hosts lost in the last minute (and back since) come last: a repair
  // should not land on the host that just failed.
  const int64_t steady = SteadyMs();
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& [id, h] : state_.hosts) {
      const bool recent = h.lost_at > 0 && steady - h.lost_at < 60000;
      if (!h.lost && h.holds_secret && !owners.count(id) &&
          recent == (pass == 1)) {
        in.free_hosts.push_back({id, h.accelerator_type, h.zone, h.ici_domain});
      }
    }
  }
  for (int t = 0; t < kNumTiers; ++t) {
    in.quota_chips[t] = state_.options().quota_chips[t];
  }
  for (const auto& [name, r] : state_.records) {
    if (r.delete_requested) continue;
    SchedRequest req{r.name,
                     r.seq,
                     r.spec.tier,
                     r.spec.accelerator_type,
                     r.hosts_per_slice,
                     r.chips_per_slice,
                     0,
                     false,
                     r.zone};
    if (r.state == QrState::kWaitingForResources && !r.holds_quota) {
      req.slices = static_cast<int>(r.nodes.size());
      in.requests.push_back(req);
    } else if (r.holds_quota && (r.state == QrState::kProvisioning ||
                                 r.state == QrState::kWaitingForResources)) {
      int missing = 0;
      for (const NodeRecord& n : r.nodes) missing += n.hosts.empty();
      if (missing > 0) {
        req.slices = missing;
        req.is_repair = true;
        in.requests.push_back(req);
      }
    }
    if (r.holds_quota) {
      SchedHolder h;
      h.name = r.name;
      h.seq = r.seq;
      h.tier = r.spec.tier;
      h.accelerator_type = r.spec.accelerator_type;
      h.zone = r.zone;
      h.chips = r.total_chips();
      h.holds_quota = true;
      h.preemptible =
          r.state == QrState::kActive && r.stage.empty() &&
          (r.spec.tier == Tier::kSpot || r.spec.tier == Tier::kBestEffort);
      h.suspending = r.state == QrState::kSuspending;
      for (const NodeRecord& n : r.nodes) {
        for (const std::string& id : n.hosts) {
          h.hosts.push_back(id);
          auto known = state_.hosts.find(id);
          h.host_ici_domains.push_back(
              known == state_.hosts.end() ? "" : known->second.ici_domain);
        }
      }
      in.holders.push_back(h);
    }
  }
  SchedulerDecision d = control::Schedule(in);
  std::set<std::string> granted;
  for (const Grant& g : d.grants) {
    QueuedResourceRecord& r = state_.records[g.name];
    granted.insert(g.name);
    size_t next = 0;
    for (NodeRecord& n : r.nodes) {
      if (n.hosts.empty() && next < g.slice_hosts.size()) {
        n.hosts = g.slice_hosts[next++];
        n.health = "HEALTHY";
      }
    }
    if (!r.holds_quota) {
      r.holds_quota = true;
      r.attempt = 1;
      r.stage = "start";
      state_.Log(r.id + ": PROVISIONING attempt 1");
    } else {
      state_.Log(r.id + ": replacement hosts granted");
    }
    r.state = QrState::kProvisioning;
    state_.Changed(r);
    Status s = state_.Persist(r);
    if (!s.ok()) state_.Log("cannot persist " + r.id + ": " + s.message());
  }
  // Repairs without a grant wait for resources.
  for (const SchedRequest& req : in.requests) {
    if (!req.is_repair || granted.count(req.name)) continue;
    QueuedResourceRecord& r = state_.records[req.name];
    if (r.state != QrState::kWaitingForResources) {
      r.state = QrState::kWaitingForResources;
      state_.Changed(r);
      state_.Persist(r).ok();
      state_.Log(r.id + ": WAITING_FOR_RESOURCES for a replacement slice");
    }
  }
  for (const std::string& name : d.preempted) {
    QueuedResourceRecord& r = state_.records[name];
    r.state = QrState::kSuspending;
    r.state_initiator = "SERVICE";
    r.stage = "stop";
    state_.Changed(r);
    state_.Persist(r).ok();
    state_.Log(r.id + ": SUSPENDING (preempted for a reserved request)");
  }
}

namespace {

// Every host that may run a worker of r: its nodes' and its retired ones.
std::vector<HostCall> StopCalls(const QueuedResourceRecord& r,
                                const std::map<std::string, Host>& hosts) {
  std::set<std::string> ids(r.retired_hosts.begin(), r.retired_hosts.end());
  for (const NodeRecord& n : r.nodes)
    ids.insert(n.hosts.begin(), n.hosts.end());
  std::vector<HostCall> calls;
  for (const std::string& id : ids) {
    auto it = hosts.find(id);
    if (it == hosts.end()) {
      calls.push_back({id, "", ""});
    } else {
      calls.push_back({id, it->second.agent_address, it->second.secret});
    }
  }
  return calls;
}

// torch.distributed's and JAX's generic variables, so that an unchanged
// DDP or jax.distributed script forms its job across the slices: the rank
// in JAX's process order (TPU_WORKER_ID + MEGASCALE_SLICE_ID * hosts per
// slice), one process per host, the coordinator on slice 0 worker 0 at a
// port that changes with each attempt (a restarted job never meets the
// previous one's sockets).
void AddFrameworkEnv(const QueuedResourceRecord& r, int node, int worker,
                     int hosts_per_slice, const std::string& first_host,
                     json& env) {
  const int world = static_cast<int>(r.nodes.size()) * hosts_per_slice;
  const int rank = worker + node * hosts_per_slice;
  const int port =
      20000 + static_cast<int>((std::hash<std::string>{}(RunIdentity(r)) +
                                static_cast<size_t>(r.attempt) * 2) %
                               20000);
  env["MASTER_ADDR"] = first_host;
  env["MASTER_PORT"] = std::to_string(port);
  env["WORLD_SIZE"] = std::to_string(world);
  env["RANK"] = std::to_string(rank);
  env["LOCAL_RANK"] = "0";
  env["LOCAL_WORLD_SIZE"] = "1";
  env["JAX_COORDINATOR_ADDRESS"] = first_host + ":" + std::to_string(port + 1);
  env["JAX_NUM_PROCESSES"] = std::to_string(world);
  env["JAX_PROCESS_ID"] = std::to_string(rank);
}

// The workers of r's nodes not yet started, with their environment.
std::vector<StartTarget> StartTargets(const QueuedResourceRecord& r,
                                      const std::map<std::string, Host>& hosts,
                                      const std::string& coordinator) {
  auto host = [&](const std::string& id) -> const Host& {
    static const Host kNone;
    auto it = hosts.find(id);
    return it == hosts.end() ? kNone : it->second;
  };
  const std::string first_host_ip = r.nodes.empty() || r.nodes[0].hosts.empty()
                                        ? std::string()
                                        : host(r.nodes[0].hosts[0]).ip();
  std::vector<StartTarget> targets;
  for (size_t i = 0; i < r.nodes.size(); ++i) {
    const NodeRecord& n = r.nodes[i];
    if (n.started) continue;
    std::string hostnames;
    for (const std::string& h : n.hosts) {
      hostnames += (hostnames.empty() ? "" : ",") + host(h).ip();
    }
    for (size_t w = 0; w < n.hosts.size(); ++w) {
      StartTarget t;
      t.node = static_cast<int>(i);
      t.worker = static_cast<int>(w);
      t.host = {n.hosts[w], host(n.hosts[w]).agent_address,
                host(n.hosts[w]).secret};
      t.name = WorkerName(r.id, t.node, t.worker);
      t.env = {{"MEGASCALE_COORDINATOR_ADDRESS", coordinator},
               {"MEGASCALE_NUM_SLICES", std::to_string(r.nodes.size())},
               {"MEGASCALE_SLICE_ID", std::to_string(i)},
               {"MEGASCALE_PORT", "8080"},
               {"TPU_WORKER_ID", std::to_string(w)},
               {"TPU_WORKER_HOSTNAMES", hostnames},
               {"MULTISLICE_ACCELERATOR_TYPE", r.spec.accelerator_type},
               {"MULTISLICE_RUN_ID", RunIdentity(r)},
               {"MULTISLICE_ATTEMPT", std::to_string(r.attempt)}};
      AddFrameworkEnv(r, t.node, t.worker, static_cast<int>(n.hosts.size()),
                      first_host_ip, t.env);
      targets.push_back(std::move(t));
    }
  }
  return targets;
}

}  // namespace

void Reconciler::ProbeSilentHosts() {
  const int64_t steady = SteadyMs();
  for (auto& [id, h] : state_.hosts) {
    const int64_t silent = steady - h.last_heartbeat;
    if (h.lost || probing_.count(id) ||
        silent <= state_.options().heartbeat_timeout.count()) {
      continue;
    }
    probing_.insert(id);
    const HostCall call{id, h.agent_address, h.secret};
    RunOnWorkThread([this, call, silent] {
      const bool alive =
          capacity_.Alive(call, state_.options().liveness_probe_timeout);
      return [this, call, silent, alive] {
        probing_.erase(call.host_id);
        ApplyProbe(call.host_id, silent, alive);
      };
    });
  }
}

void Reconciler::ApplyProbe(const std::string& host_id, int64_t silent_ms,
                            bool alive) {
  auto it = state_.hosts.find(host_id);
  if (it == state_.hosts.end() || it->second.lost) return;
  Host& h = it->second;
  if (SteadyMs() - h.last_heartbeat <=
      state_.options().heartbeat_timeout.count()) {
    return;  // a heartbeat came while the probe ran
  }
  if (alive) {
    // The agent answers: its heartbeats are held up on the way (the
    // network, or this controller too busy to read them). Not a loss.
    h.last_heartbeat = SteadyMs();
    state_.Log(host_id + ": no heartbeat for " + std::to_string(silent_ms) +
               " ms, but its agent answers: kept");
    return;
  }
  state_.MarkLost(host_id, "no heartbeat for " + std::to_string(silent_ms) +
                               " ms and no answer to a probe");
}

void Reconciler::RunOnWorkThread(std::function<std::function<void()>()> work) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  work_.push_back({std::thread([this, work = std::move(work), done] {
                     std::function<void()> apply = work();
                     {
                       std::lock_guard<std::mutex> lock(state_.mu);
                       if (!state_.stopping) apply();
                       state_.wake = true;
                     }
                     state_.cv.notify_all();
                     done->store(true);
                   }),
                   done});
}

void Reconciler::LaunchWork(QueuedResourceRecord& r) {
  const std::string name = r.name;
  const uint64_t version = state_.versions[name];
  const std::string stage = r.stage;
  const int attempt = r.attempt;
  std::function<WorkResult()> work;
  if (stage == "stop") {
    std::vector<HostCall> calls = StopCalls(r, state_.hosts);
    const std::string prefix = WorkerName(r.id, 0, 0);
    const std::string worker_prefix = prefix.substr(0, prefix.size() - 3);
    if (calls.empty()) {  // nothing runs anywhere: complete now
      WorkResult result;
      result.complete = true;
      ApplyWork(name, version, stage, attempt, result);
      return;
    }
    work = [this, calls, worker_prefix] {
      return capacity_.StopWorkers(calls, worker_prefix);
    };
  } else if (stage == "start") {
    for (const NodeRecord& n : r.nodes) {
      if (n.hosts.empty()) return;  // waits for a replacement slice
    }
    const int64_t fence = state_.FenceOf(name);
    if (fence > SteadyMs()) {
      if (fence_logged_.insert(name).second) {
        state_.Log(r.id + ": attempt " + std::to_string(attempt) + " waits " +
                   std::to_string(fence - SteadyMs()) +
                   " ms for the lease of a lost host's workers to lapse");
      }
      return;
    }
    fence_logged_.erase(name);
    state_.fences.erase(name);
    Result<std::string> coordinator = stores_.For(r, state_.hosts);
    if (!coordinator.ok()) {
      state_.Log(r.id + ": " + coordinator.status().message());
      return;
    }
    std::vector<StartTarget> targets =
        StartTargets(r, state_.hosts, *coordinator);
    const std::string script = r.spec.startup_script;
    const int nodes = static_cast<int>(r.nodes.size());
    work = [this, targets, attempt, script, nodes] {
      return capacity_.StartWorkers(targets, attempt, script, nodes);
    };
  } else {
    return;
  }
  busy_.insert(name);
  RunOnWorkThread([this, work, name, version, stage, attempt] {
    WorkResult result = work();
    return [this, name, version, stage, attempt, result] {
      busy_.erase(name);
      ApplyWork(name, version, stage, attempt, result);
    };
  });
}

void Reconciler::ApplyWork(const std::string& name, uint64_t version,
                           const std::string& stage, int attempt,
                           const WorkResult& result) {
  // Hosts whose agent says none of r's workers runs there fence r no more.
  for (const std::string& h : result.stopped_hosts) state_.LiftFence(name, h);
  for (const std::string& h : result.lost_hosts) {
    // A dead agent's workers died with it; an unreachable one's stop when
    // their lease lapses, and the record is fenced until then.
    const bool dead = result.dead_hosts.count(h) > 0;
    if (dead) state_.LiftFence(name, h);
    // While stopping, only mark it lost (for repair) if it is not already.
    if (stage != "stop" || !state_.hosts[h].lost) {
      state_.MarkLost(h, "agent unreachable", /*confirmed=*/dead);
    }
  }
  for (const auto& [host_id, status] : result.started_workers) {
    auto h = state_.hosts.find(host_id);
    if (h == state_.hosts.end() || !status.is_object()) continue;
    json& workers = h->second.workers;
    if (!workers.is_array()) workers = json::array();
    bool replaced = false;
    for (json& w : workers) {
      if (w.is_object() && w.value("name", "") == status.value("name", "")) {
        w = status;
        replaced = true;
      }
    }
    if (!replaced) workers.push_back(status);
  }
  auto it = state_.records.find(name);
  if (it == state_.records.end()) return;
  QueuedResourceRecord& r = it->second;
  std::vector<OperationRecord> ops;
  if (stage == "start") {
    if (r.stage != "start" || r.attempt != attempt) return;
    if (!result.hard_error.empty()) {
      r.state = QrState::kFailed;
      r.state_initiator = "SERVICE";
      r.failed_error = result.hard_error;
      r.stage = "stop";  // stop what started, then release the hosts
      state_.FinishOps(r, r.ToApi(), &ops);
      state_.Log(r.id + ": FAILED: " + result.hard_error);
    } else {
      for (int node : result.started_nodes) {
        if (r.nodes[node].hosts.empty()) continue;  // lost meanwhile
        r.nodes[node].started = true;
        r.nodes[node].state = "READY";
        r.nodes[node].health = "HEALTHY";
      }
      bool all = true;
      for (const NodeRecord& n : r.nodes) all &= n.started;
      if (!all) {
        if (result.started_nodes.empty()) return;
      } else {
        r.state = QrState::kActive;
        r.stage.clear();
        state_.FinishOps(r, r.ToApi(), &ops);
        state_.Log(r.id + ": ACTIVE (attempt " + std::to_string(r.attempt) +
                   ")");
      }
    }
  } else if (stage == "stop") {
    if (r.stage != "stop" || state_.versions[name] != version ||
        !result.complete) {
      return;
    }
    // Retired hosts that were failed on purpose but still run an agent are
    // free again once their workers stopped.
    r.retired_hosts.clear();
    if (r.delete_requested) {
      state_.FinishOps(r, json::object(), &ops);
      StoreChange change;
      change.delete_queued_resources.push_back(name);
      change.put_operations = ops;
      Status s = state_.store().Apply(change);
      if (!s.ok()) {
        state_.Log("cannot delete " + r.id + ": " + s.message());
        return;
      }
      for (const OperationRecord& op : ops) state_.ops[op.name] = op;
      state_.Log(r.id + ": deleted");
      stores_.Release(r);
      state_.records.erase(it);
      state_.versions.erase(name);
      return;
    }
    if (r.state == QrState::kSuspending || r.state == QrState::kFailed) {
      for (NodeRecord& n : r.nodes) {
        n.hosts.clear();
        n.started = false;
        n.state = r.state == QrState::kSuspending ? "PREEMPTED" : n.state;
      }
      if (r.state == QrState::kSuspending) {
        r.state = QrState::kSuspended;
        state_.Log(r.id + ": SUSPENDED");
      }
      r.stage.clear();
    } else {
      // Repair or reset: every old worker has exited; start the next
      // attempt (once every node has hosts).
      r.attempt += 1;
      r.stage = "start";
      for (NodeRecord& n : r.nodes) n.started = false;
      state_.Log(r.id + ": workers stopped; starting attempt " +
                 std::to_string(r.attempt));
    }
  } else {
    return;
  }
  state_.Changed(r);
  Status s = state_.Persist(r, ops);
  if (!s.ok()) state_.Log("cannot persist " + r.id + ": " + s.message());
  for (const OperationRecord& op : ops) state_.ops[op.name] = op;
}

}  // namespace multislice::control
