// The seam between the controller's state machine and the machines it runs
// workers on. The reconciler decides what should run where (from the
// scheduler's grants); a CapacityProvider makes it so and says what came of
// it. The embedded provider calls host agents (agent_capacity.h); a cluster
// scheduler (Slurm) is a second implementation of the same calls.
//
// Calls run on a work thread without the controller's lock; they may block
// for as long as the provider's own timeouts allow.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace multislice::control {

// One host's address, as a work thread needs it.
struct HostCall {
  std::string host_id;
  std::string agent_address;
  std::string credential;  // the host's secret (Host::secret)
};

// One worker to start: worker `worker` of node (slice) `node`.
struct StartTarget {
  int node = 0;
  int worker = 0;
  HostCall host;
  std::string name;    // WorkerName(id, node, worker)
  nlohmann::json env;  // the worker environment (docs/control.md)
};

// What came of one stage's calls.
struct WorkResult {
  bool complete = false;             // the stage's calls all succeeded
  std::set<int> started_nodes;       // start: nodes whose workers all run
  std::set<std::string> lost_hosts;  // hosts that could not be reached
  // Of lost_hosts, those whose workers are certainly gone: the host answered
  // that nothing listens at the agent's port, so the agent is dead, and its
  // workers' guardians die with it (process.h).
  std::set<std::string> dead_hosts;
  // stop: hosts that answered and have none of the workers running.
  std::set<std::string> stopped_hosts;
  std::string hard_error;  // a host refused: the QR fails
  // start: the status each host answered for a started worker (its pid),
  // known before the next heartbeat carries it.
  std::vector<std::pair<std::string, nlohmann::json>> started_workers;
};

class CapacityProvider {
 public:
  virtual ~CapacityProvider() = default;

  // Starts `targets` (workers of `nodes` slices) as attempt `attempt`
  // running `script`. A worker of the same name already running this
  // attempt counts as started; one of an older attempt is stopped.
  virtual WorkResult StartWorkers(const std::vector<StartTarget>& targets,
                                  int attempt, const std::string& script,
                                  int nodes) = 0;

  // Stops every worker named "{worker_prefix}{node}.{worker}" on `hosts`;
  // complete once none of them runs.
  virtual WorkResult StopWorkers(const std::vector<HostCall>& hosts,
                                 const std::string& worker_prefix) = 0;

  // Whether the host answers within `timeout`: a positive check made before
  // a host whose heartbeats stopped is declared lost.
  virtual bool Alive(const HostCall& host,
                     std::chrono::milliseconds timeout) = 0;
};

// A capacity provider that owns admission and placement itself (a cluster
// scheduler: Slurm). The reconciler does not run its scheduler for a queued
// resource on such capacity: it submits the whole request as one job (every
// slice's hosts at once, started together or not at all), follows the job's
// state, and cancels or restarts it. The host agents' path (CapacityProvider
// above) is untouched by this one.

// What one queued resource asks of the cluster.
struct ClusterJobSpec {
  std::string name;    // a job name: the queued resource's id
  std::string run_id;  // MULTISLICE_RUN_ID
  int slices = 1;
  int hosts_per_slice = 1;
  std::string accelerator_type;
  std::string tier;  // TierName: reserved, on-demand, spot, best-effort
  std::string startup_script;
  // valid_until is not passed to the cluster: Slurm's --deadline also cuts
  // the time limit of a job that started, and a queued resource's deadline
  // ends only its wait. The reconciler cancels a job still pending then.
};

// A job as the cluster reports it.
struct ClusterJobStatus {
  enum class Phase {
    kGone,         // the cluster no longer knows the job (ended, cancelled)
    kPending,      // waiting for every node at once
    kConfiguring,  // nodes allocated, being readied
    kRunning,      // the batch script runs
    kEnded,        // completed, failed, timed out or cancelled
  };
  Phase phase = Phase::kGone;
  std::string state;   // the cluster's own word (PENDING, RUNNING, ...)
  std::string reason;  // why it pends or ended, as the cluster says
  // Every worker of the job runs (the workers' step started).
  bool workers_started = false;
  std::vector<std::string> nodes;  // allocated nodes, in task order
  int restarts = 0;                // times the job was requeued
};

class ClusterCapacity {
 public:
  virtual ~ClusterCapacity() = default;
  // Submits `spec` as one job held until every node is free; its id.
  virtual Result<std::string> Submit(const ClusterJobSpec& spec) = 0;
  virtual Result<ClusterJobStatus> Query(const std::string& job) = 0;
  // Ends the job and its workers.
  virtual Status Cancel(const std::string& job) = 0;
  // Stops every worker and runs the job again (a new attempt), on new nodes
  // where `exclude` names some to avoid.
  virtual Status Requeue(const std::string& job,
                         const std::vector<std::string>& exclude) = 0;
  // The nodes the cluster reports down or failed now (repair).
  virtual Result<std::set<std::string>> FailedNodes() = 0;
};

}  // namespace multislice::control
