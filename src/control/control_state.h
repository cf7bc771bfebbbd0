// What the controller's units share: the queued resources, operations and
// hosts in memory, the lock that guards them, and the writes that keep the
// Store in step with them.
//
// Every change is written to the Store inside the lock before the lock is
// released, so what the API answers has always been persisted. The units
// that read and change this state (public_api, host_api, reconciler) each
// take the lock themselves; the helpers below expect it held.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "control/api_types.h"
#include "control/controller.h"
#include "control/store.h"

namespace multislice::control {

int64_t WallMs();    // since the Unix epoch
int64_t SteadyMs();  // monotonic

// A host as the controller knows it: registered by its agent, kept alive by
// heartbeats, owned by at most one queued resource at a time.
struct Host {
  std::string id;
  std::string hostname;
  std::string zone;
  std::string accelerator_type;
  // The hosts joined to this one by ICI (agent --ici-domain): a multi-host
  // slice takes all its hosts from one domain. "" (older agents and stores
  // too): combines only with other hosts without one.
  std::string ici_domain;
  std::string agent_address;  // HOST:PORT of its /agent/v1/ API
  std::string workdir;
  // Issued at each registration: the bearer of this host's heartbeats and of
  // the controller's (and users') calls to its agent. Persisted.
  std::string secret;
  bool lost = false;
  std::string lost_reason;
  int64_t last_heartbeat = 0;  // steady ms; not persisted
  int64_t lost_at = 0;         // steady ms of the last loss; not persisted
  // Steady ms by which every lease granted to this host's workers has
  // certainly lapsed (last answered heartbeat + lease + margin).
  int64_t lease_until = 0;
  // Whether the agent holds `secret`: false from a registration until the
  // first heartbeat it signs with it. The controller's calls carry the
  // secret, so a host is placed only once this is true (before, the agent
  // may not have read its registration answer yet). Not persisted: a host
  // loaded at start-up beats with the secret it already has.
  bool holds_secret = true;
  nlohmann::json workers = nlohmann::json::array();
  // The host's sshd (its agent's): "IP:PORT", "" when it runs none, and its
  // public host keys, type -> base64 (guest attributes' hostkeys/).
  std::string ssh_address;
  nlohmann::json ssh_host_keys = nlohmann::json::object();
  // What the agent last reported applying: the owner (a queued resource's
  // uid) and the node's metadata generation. Not persisted.
  std::string ssh_owner;
  int64_t ssh_generation = -1;

  nlohmann::json ToStorage() const;
  static Host FromStorage(const nlohmann::json& j);
  // The address part of agent_address.
  std::string ip() const;
};

bool IsLoopback(const std::string& ip);

// "projects/{project}/locations/{zone}/queuedResources/{id}".
std::string QrName(const std::string& project, const std::string& zone,
                   const std::string& id);

class ControlState {
 public:
  ControlState(const ControllerOptions& options, std::unique_ptr<Store> store);

  // Restores records, operations and hosts from the store (at start-up,
  // before any other thread runs).
  Status Load();

  const ControllerOptions& options() const { return options_; }
  Store& store() { return *store_; }

  // --- everything below: with mu held ---
  // Persists `r` (and `ops`), appending r's state to its history when it
  // changed: every transition passes here.
  Status Persist(QueuedResourceRecord& r,
                 std::vector<OperationRecord> ops = {});
  Status PersistHost(const Host& h);
  // 128 random bits, hex: a new queued resource's uid.
  std::string NewUid();
  OperationRecord NewOperation(const QueuedResourceRecord& r,
                               const std::string& api, const std::string& verb);
  // Marks r's waiting operations done with `response`; appends them to
  // `changed` (the caller persists them with r).
  void FinishOps(QueuedResourceRecord& r, const nlohmann::json& response,
                 std::vector<OperationRecord>* changed);
  // A work thread's result applies only if the record's version has not
  // moved since the work was launched.
  void Changed(QueuedResourceRecord& r) { ++versions[r.name]; }
  // Marks the host lost and sends every queued resource using it to repair.
  // Unless `confirmed` (its workers are known to be gone), each of them is
  // fenced: its next workers start only after the host's lease_until.
  void MarkLost(const std::string& host_id, const std::string& reason,
                bool confirmed = false);
  // The lease granted with a heartbeat answered now, and the host's new
  // lease_until.
  std::chrono::milliseconds WorkerLease() const;
  void GrantLease(Host& h);
  // When r's next workers may start (steady ms; 0: now): the latest
  // lease_until of the hosts it lost without confirmation.
  int64_t FenceOf(const std::string& name) const;
  // The host's workers are confirmed stopped: it no longer fences r.
  void LiftFence(const std::string& name, const std::string& host_id);
  // Host id -> the name of the queued resource holding it.
  std::map<std::string, std::string> HostOwners() const;
  // Forgets hosts lost longer than the retention and held by no queued
  // resource.
  void ForgetLongLostHosts();
  // By id or full name; nullptr when none.
  QueuedResourceRecord* FindById(const std::string& id);
  // Wakes the reconcile loop.
  void Wake() {
    wake = true;
    cv.notify_all();
  }
  void Log(const std::string& line) const;

  std::mutex mu;
  std::condition_variable cv;
  bool wake = false;                                    // guarded by mu
  bool stopping = false;                                // guarded by mu
  std::map<std::string, QueuedResourceRecord> records;  // by name
  std::map<std::string, uint64_t> versions;             // by name
  std::map<std::string, OperationRecord> ops;           // by name
  std::map<std::string, Host> hosts;                    // by id
  int64_t next_seq = 1;
  int next_host = 1;
  // Record name -> host id -> steady ms before which r may not start.
  std::map<std::string, std::map<std::string, int64_t>> fences;
  // Since this controller started, for /metrics (metrics.h).
  struct Counts {
    int64_t repairs_started = 0;    // a node of a record became REPAIRING
    int64_t repairs_completed = 0;  // a REPAIRING node became READY
    int64_t hosts_lost = 0;         // MarkLost of a host not lost before
  } counts;

 private:
  // Counts r's nodes that became REPAIRING or READY after REPAIRING since
  // r was last persisted (repairing_).
  void CountRepairs(const QueuedResourceRecord& r);

  const ControllerOptions& options_;
  std::unique_ptr<Store> store_;
  std::mt19937_64 rng_{std::random_device{}()};
  // Record name -> the ids of its nodes REPAIRING when it was last
  // persisted (records without one are absent).
  std::map<std::string, std::set<std::string>> repairing_;
};

}  // namespace multislice::control
