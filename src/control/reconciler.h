// The reconcile loop: drives every queued resource through its states
// (docs/control.md). Each tick it declares hosts lost whose heartbeats
// stopped, moves waiting records on (valid_after, valid_until), runs the
// scheduler over free hosts and waiting requests (admission, repair,
// preemption), and launches the current stage ("start", "stop") of each
// record on a work thread that calls the capacity provider. A work thread's
// result is applied under the lock only if the record's version has not
// moved meanwhile; otherwise the stage runs again (every step is
// idempotent).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "control/capacity.h"
#include "control/control_state.h"
#include "control/coordinator_stores.h"

namespace multislice::control {

// What a queued resource on cluster capacity became after its job reported
// `job`: r is updated in place (states, nodes, attempt). `failed` are the
// cluster's failed nodes; `requeued`: the job was just requeued away from
// those of them it held (repair).
struct ClusterFollow {
  bool changed = false;     // r must be persisted
  bool finish_ops = false;  // r reached ACTIVE or FAILED: its ops are done
  std::string log;          // a line for the controller's log, or ""
};
ClusterFollow FollowClusterJob(QueuedResourceRecord& r,
                               const ClusterJobStatus& job,
                               const std::set<std::string>& failed,
                               bool requeued);

class Reconciler {
 public:
  // With `cluster`, every queued resource is a job of that cluster
  // (ClusterCapacity): the scheduler and `capacity` are not used for it.
  Reconciler(ControlState& state, CapacityProvider& capacity,
             ClusterCapacity* cluster = nullptr)
      : state_(state),
        capacity_(capacity),
        cluster_(cluster),
        stores_(state.options()) {}
  ~Reconciler() { Stop(); }

  // Starts the loop thread.
  void Start();
  // Stops the loop (state.stopping must be set and cv notified first) and
  // waits for every work thread; stops the redis-server.
  void Stop();

 private:
  void Loop();
  void Tick();
  // Asks the agents of hosts whose heartbeats stopped whether they are
  // alive, on work threads; ApplyProbe declares the silent ones lost.
  void ProbeSilentHosts();
  void ApplyProbe(const std::string& host_id, int64_t silent_ms, bool alive);
  void Schedule(int64_t now);
  // Runs `work` on a thread of its own without the lock; then, under the
  // lock (unless stopping), the function it returns, and wakes the loop.
  void RunOnWorkThread(std::function<std::function<void()>()> work);
  void LaunchWork(QueuedResourceRecord& r);
  // Cluster capacity: submits waiting records, follows, cancels and
  // requeues their jobs (on work threads).
  void TickCluster();
  // Cluster capacity: the waiting records that the tiers' quotas let be
  // submitted now (the scheduler's quota rule, FIFO per tier; a submit in
  // flight counts as granted again).
  std::set<std::string> ClusterAdmissions() const;
  struct ClusterWork {
    std::string action;  // submit, query, cancel, requeue
    Status status;       // of the action's own call
    std::string job;     // submit: the new job's id
    bool queried = false;
    ClusterJobStatus job_status;
    std::set<std::string> failed;
    bool requeued = false;  // query: requeued away from failed nodes
  };
  void ApplyClusterWork(const std::string& name, uint64_t version,
                        const ClusterWork& work);
  void ApplyWork(const std::string& name, uint64_t version,
                 const std::string& stage, int attempt,
                 const WorkResult& result);

  ControlState& state_;
  CapacityProvider& capacity_;
  ClusterCapacity* cluster_;                  // may be null (agents only)
  std::map<std::string, int64_t> next_poll_;  // steady ms, by record
  std::map<std::string, std::string> said_;   // last error logged, by record
  CoordinatorStores stores_;                  // guarded by state_.mu
  std::thread loop_thread_;
  std::set<std::string> busy_;          // records with a work thread running
  std::set<std::string> probing_;       // hosts with a liveness probe running
  std::set<std::string> fence_logged_;  // records told they wait for a fence
  struct Work {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Work> work_;
};

}  // namespace multislice::control
