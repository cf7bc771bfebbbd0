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
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "control/capacity.h"
#include "control/control_state.h"
#include "control/coordinator_stores.h"

namespace multislice::control {

class Reconciler {
 public:
  Reconciler(ControlState& state, CapacityProvider& capacity)
      : state_(state), capacity_(capacity), stores_(state.options()) {}
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
  void ApplyWork(const std::string& name, uint64_t version,
                 const std::string& stage, int attempt,
                 const WorkResult& result);

  ControlState& state_;
  CapacityProvider& capacity_;
  CoordinatorStores stores_;  // guarded by state_.mu
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
