// The runtime of one worker process: its devices, the job's mesh, and the
// transports its collectives use.
//
// Create() reads nothing from the environment itself: it takes the worker
// environment (worker_env.h) and the parallelism configuration, resolves the
// mesh, claims the restart attempt in the store (a worker of an older attempt
// is refused), and connects one DCN communicator per device column (the
// devices with the same local index in every slice; k Gloo contexts, so k
// streams cross slices in parallel). All waits are bounded by the timeout.
//
// RunOnDevices runs a function on one thread per local device. When a device
// function fails, the failure is reported by `on_device_error` (by default:
// one line naming this worker and the error on stderr, then exit code 1 at
// once, so that no other device thread is left waiting on a dead peer).
#pragma once

#include <gloo/rendezvous/store.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/collectives.h"
#include "runtime/comm/dcn/communicator.h"
#include "runtime/comm/dcn/store.h"
#include "runtime/comm/ici/group.h"
#include "runtime/hang_watch.h"
#include "runtime/mesh/device_mesh.h"
#include "runtime/mesh/topology.h"
#include "runtime/trace.h"
#include "runtime/worker_env.h"

namespace multislice::runtime {

struct RuntimeOptions {
  WorkerEnv env;
  mesh::ParallelismConfig parallelism;  // may hold one -1 per level
  std::chrono::milliseconds timeout{60000};
  // Called (from a device thread) with the first failed device's status.
  // The default prints "multislice: <worker>: <message>" and calls _exit(1).
  std::function<void(const Status&)> on_device_error;
};

class Runtime {
 public:
  static Result<std::unique_ptr<Runtime>> Create(const RuntimeOptions& options);
  ~Runtime();

  const WorkerEnv& env() const { return options_.env; }
  const mesh::AcceleratorType& accelerator() const { return accelerator_; }
  const mesh::ParallelismConfig& parallelism() const { return parallelism_; }
  const mesh::DeviceMesh& mesh() const { return mesh_; }
  const std::vector<mesh::Device>& devices() const { return devices_; }
  // Ids of the devices this process drives, by local index.
  const std::vector<int>& local_devices() const { return local_devices_; }
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  int process_index() const;
  int process_count() const;

  DeviceCollectives& collectives(int local_index) {
    return *collectives_[local_index];
  }
  ici::Domain& ici_domain() { return *ici_domain_; }
  // The DCN communicator of a column in the current membership; null when
  // the job has one slice.
  dcn::Communicator* dcn(int column);
  // The rank of `process` in the current communicators.
  int dcn_rank_of(int process) const;

  // Losing slices without stopping (DiLoCo's diloco_continue_on_failure).
  // The membership starts as every process, generation 0. After a
  // collective failed because a peer was lost, each device thread calls
  // DropLostSlices with the generation it ran in: the first call of the
  // process agrees with the other survivors through the store on the
  // processes gone (membership.h), drops their slices, connects new DCN
  // communicators among the survivors (the old ones closed their
  // connections on the failure) and moves to the next generation; a later
  // call with an older generation returns at once. Collectives built after
  // it (DeviceCollectives::Group) leave the lost slices out. Not for a
  // failure of this process's own slice (kFailedPrecondition).
  // Returns the number of slices it dropped (0 for a call that found the
  // generation already moved on, or no process gone).
  Result<int> DropLostSlices(int seen_generation);
  // Every device thread of this process calls it at the same point (after
  // the same collective) with whether that succeeded on its device; returns
  // whether it did on all of them, so that they retry together.
  bool AllLocalDevicesOk(bool ok);
  int membership_generation() const;
  std::vector<int> lost_slices() const;

  // Rejoining (membership.h). A worker started with an incarnation above 0
  // asks to rejoin in Create and waits there until the survivors admit it;
  // joined_step() is then the last step they trained before it (nullopt
  // for a worker that started with the job). too_late_to_join(): the
  // survivors closed the admissions first (their training ended), and this
  // worker has nothing to do.
  std::optional<int64_t> joined_step() const { return joined_step_; }
  bool too_late_to_join() const { return too_late_to_join_; }
  // The lost slices every worker of which asks to rejoin now.
  std::vector<int> RejoinRequests();
  // Like DropLostSlices, the other way: once per generation (`seen`), the
  // survivors take `slices` back after `step`: the lowest of them records
  // the admissions, and everyone connects the next generation with them.
  Status AdmitSlices(int seen_generation, const std::vector<int>& slices,
                     int64_t step);
  // The survivors will admit no one any more: the lowest one says so.
  void CloseAdmissions();
  // The processes still in the job, in increasing order.
  std::vector<int> live_processes() const;
  // Each process's start in this attempt (0, or its restarts so far).
  std::vector<int> incarnations() const;
  // The rendezvous store under this run's and attempt's prefix.
  gloo::rendezvous::Store& store() { return *store_; }
  const dcn::StoreAddress& store_address() const { return store_address_; }

  // The timeline that collectives and compute add spans to, or null (the
  // default: nothing is recorded). Set before starting collectives.
  Trace* trace() const { return trace_; }
  void set_trace(Trace* trace) { trace_ = trace; }

  // Runs fn(local_index) on one thread per local device and waits for all.
  // Returns ok, or calls on_device_error with the first failure.
  Status RunOnDevices(const std::function<Status(int local_index)>& fn);

  // The hang digest (hang_watch.h): off until armed; from then a collective
  // of this worker in flight longer than `threshold` (or another worker's
  // alarm) starts the round. The digest is printed on stderr and the
  // process ends as a failed device does (on_device_error or exit 1), the
  // writer having written it to `digest_path` (when not empty).
  void ArmHangWatch(std::chrono::milliseconds threshold,
                    const std::string& digest_path);
  // This worker's report: where each of its devices is in its collectives.
  WorkerHangReport HangReport() const;
  // "slice S worker W" of process p.
  std::string ProcessName(int process) const;
  // The pipeline stage of device `id` (0 without a stage axis): devices of
  // one stage issue the same collectives and do the same work.
  int StageOf(int id) const;
  // Every process's host (its DCN address), by process: each records its
  // own in the store in Create; read once, on the first call.
  const std::vector<std::string>& process_hosts();

 private:
  explicit Runtime(const RuntimeOptions& options);
  // `failure`, naming the worker it started at when a peer's loss made this
  // one fail (first_failure.h).
  Status WithFirstFailure(const Status& failure);
  // Connects one communicator per device column among `processes` (this
  // one among them) under the store keys of `generation`.
  Status ConnectDcn(const std::vector<int>& processes, int generation);
  // A restarted worker's side of AdmitSlices.
  Status JoinRunning();
  void StartHangWatch();
  // Ends the process for `failure` as a failed device does.
  void EndWithFailure(const Status& failure);
  // Moves to `generation`: its communicators among `live` (which are
  // connected here), the lost slices and the rank table. Under
  // membership_mu_.
  Status EnterGeneration(int generation, const std::vector<int>& live,
                         const std::vector<int>& lost);

  RuntimeOptions options_;
  mesh::AcceleratorType accelerator_;
  mesh::ParallelismConfig parallelism_;
  mesh::DeviceMesh mesh_;
  std::vector<mesh::Device> devices_;
  std::vector<int> local_devices_;
  dcn::StoreAddress store_address_;
  std::shared_ptr<gloo::rendezvous::Store> store_;
  std::unique_ptr<ici::Domain> ici_domain_;
  std::mutex drop_mu_;  // one DropLostSlices at a time
  mutable std::mutex membership_mu_;
  std::vector<std::unique_ptr<dcn::Communicator>> dcn_;
  // Communicators of earlier generations: a device thread may still be in
  // a call on one when the next generation connects.
  std::vector<std::unique_ptr<dcn::Communicator>> retired_dcn_;
  std::vector<int> live_processes_;  // by rank in dcn_
  std::vector<int> dcn_rank_of_;     // by process; -1 when gone
  std::vector<int> lost_slices_;
  std::vector<int> incarnations_;  // by process: its start in this attempt
  std::atomic<int> generation_{0};
  std::optional<int64_t> joined_step_;
  bool too_late_to_join_ = false;
  struct Vote {
    std::mutex mu;
    std::condition_variable cv;
    int64_t round = 0;
    int arrived = 0;
    bool all_ok = true, result = true;
  } vote_;
  std::vector<std::unique_ptr<DeviceCollectives>> collectives_;
  std::unique_ptr<HangWatch> hang_watch_;  // stopped before collectives_
  std::vector<std::string> process_hosts_;
  Trace* trace_ = nullptr;
};

}  // namespace multislice::runtime
