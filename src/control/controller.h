// The queued-resource controller: the public API (spec 4.1) under
// /v2alpha1/ and /v2/, the agents' channel under /internal/v1/
// (docs/control-protocol.md), and the reconcile loop that drives every
// queued resource through its states: admission by the scheduler,
// provisioning on the agents, heartbeat monitoring, repair, reset,
// preemption and deletion. See docs/control.md for the state machine.
//
// State lives in a Store under data_dir; every transition is persisted
// before it is acted on, and each step is idempotent, so a controller
// restarted on the same data_dir carries on whatever was under way.
//
// Thread-safety: Start() and Stop() from one thread; everything else is
// internal (HTTP threads, one reconcile thread, one thread per queued
// resource whose agents are being called).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "control/api_types.h"

namespace multislice::control {

class ClusterCapacity;  // capacity.h

struct ControllerOptions {
  std::string data_dir;  // state.db, stores/ (file:// coordinators)
  std::string token;     // the admin token: users, the API and every host
  // Agents register with this token (or the admin one): it can do nothing
  // else. Empty: only the admin token registers.
  std::string agent_token;
  std::string bind_address = "127.0.0.1";
  int port = 0;  // 0: any free port (see Controller::port())
  // The address remote agents reach this machine at, for the redis://
  // coordinator of queued resources whose agents are on several machines.
  std::string advertise_address = "127.0.0.1";
  std::chrono::milliseconds heartbeat_timeout{5000};
  std::chrono::milliseconds heartbeat_interval{500};  // told to agents
  std::chrono::milliseconds reconcile_interval{100};
  int stop_grace_seconds = 5;  // SIGTERM to SIGKILL, on :stop
  std::chrono::milliseconds agent_call_timeout{5000};  // beyond the grace
  int64_t quota_chips[kNumTiers] = {-1, -1, -1, -1};   // -1: unlimited
  int http_threads = 64;  // enough for 50 concurrent keep-alive clients
  // The API port's connections from one client address at once; beyond,
  // a new connection is closed before it is read (connection_gate.h); 0:
  // no bound (and no gate).
  int max_connections_per_address = 32;
  // The agents' channel (registration, heartbeats) also listens on a port of
  // its own, with its own threads, so that clients of the API (idle, slow or
  // hostile) cannot hold up a heartbeat. 0: any free port; the registration
  // answer tells agents which (heartbeatPort).
  int agent_port = 0;
  int agent_http_threads = 8;
  // Prometheus metrics (docs/control.md, "Metrics"): GET /metrics on the API
  // port behind the token, and, with a bind address here (controller
  // --metrics_address), on a listener of its own without the token, as
  // exporters serve them, with its own few threads and connection bound.
  std::string metrics_bind_address;  // "": no such listener
  int metrics_port = 0;              // 0: any free port
  // Before a host whose heartbeats stopped is declared lost, the controller
  // asks its agent directly (GET /agent/v1/health, this long): an agent that
  // answers is alive, and the silence was the network or this controller's
  // own overload, not a reason to repair.
  std::chrono::milliseconds liveness_probe_timeout{1000};
  // Fencing (docs/control.md): each heartbeat answer grants the host's
  // workers a lease this long (0: twice heartbeat_timeout); a worker whose
  // lease lapses is killed by its guardian. A replacement for a host lost
  // without its agent confirming that its workers stopped starts only
  // lease + fence_margin after that host's last answered heartbeat.
  std::chrono::milliseconds worker_lease{0};
  std::chrono::milliseconds fence_margin{1000};
  // A host lost this long (and held by no queued resource) is forgotten:
  // agents that come back register anew, so lost hosts do not pile up
  // across restarts and re-registrations.
  std::chrono::milliseconds lost_host_retention{std::chrono::minutes(10)};
  // The owner of each run's file:// store directory (0700): the user the
  // local agents run workers as (controller --local-worker-user); -1: ours.
  int file_store_uid = -1;
  int file_store_gid = -1;
  bool file_store_group_access = false;  // 0770 rather than 0700
  // A cluster scheduler as the capacity (controller --capacity slurm):
  // every queued resource becomes one of its jobs and the host agents are
  // not used. Null: the host agents (the default).
  std::shared_ptr<ClusterCapacity> cluster;
};

class Controller {
 public:
  // Opens the store, restores the state, binds the port and starts serving.
  static Result<std::unique_ptr<Controller>> Start(ControllerOptions options);
  ~Controller();  // Stop()s

  int port() const;
  // The agents' channel port (ControllerOptions::agent_port).
  int agent_port() const;
  // The metrics listener's port; 0 without one.
  int metrics_port() const;
  // Treats the host whose id, agent address, hostname or workdir is `host`
  // as lost now (as `admin fail-host` does); for a supervisor that saw its
  // agent process exit. NotFound when no host matches.
  Status ReportHostLost(const std::string& host, const std::string& reason);
  // The process-group ids of the RUNNING workers the host (matched as
  // above) reported in its last heartbeat; empty when unknown. Lets a
  // supervisor on the same machine wait for a dead agent's workers to be
  // gone before reporting the loss (no two attempts at once).
  std::vector<int> LastReportedWorkerGroups(const std::string& host);
  // Stops serving and waits for every thread (agents' processes are left to
  // the agents).
  void Stop();

  class Impl;

 private:
  explicit Controller(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The worker name of worker `worker` of node `node_index` of queued resource
// `id`: "{id}.{node}.{worker}" in [a-z0-9.-] (other characters become '-').
std::string WorkerName(const std::string& id, int node_index, int worker);

}  // namespace multislice::control
