// DiLoCo's replicas when slices are lost and come back
// (diloco_continue_on_failure, docs/diloco.md): every collective across
// replicas, the fault check that also carries the requests to rejoin, the
// admission of a restarted slice and its side of it, and the saves while a
// replica is away.
#include <algorithm>
#include <cstdio>

#include "train/replica_restore.h"
#include "train/trainer_internal.h"

namespace multislice::train::internal {

// Whether the job stops after this step: a process has failed. DiLoCo's
// replicas meet only where a sync starts (every period / fragments steps)
// and at the last step, so a failure in one replica stops every one there;
// without DiLoCo the step's flag is the whole mesh's.
// With diloco_continue_on_failure the same max also carries, one flag per
// slice, the lost slices whose restarted workers ask to rejoin.
Result<bool> Trainer::StopsAt(Device& d, int64_t step, float replica_fault) {
  if (d.plan.diloco_size() == 1) return replica_fault > 0;
  if (!d.outer->SyncStartsAfter(step) && step != config_.steps) return false;
  const bool rejoins = config_.diloco_continue_on_failure;
  std::vector<float> flags(1 + (rejoins ? rt_.env().num_slices : 0));
  RETURN_IF_ERROR(AcrossReplicas([&] {
    std::fill(flags.begin(), flags.end(), 0.0f);
    flags[0] = replica_fault;
    if (rejoins && d.local == 0 && step < config_.steps) {
      for (int slice : rt_.RejoinRequests()) flags[1 + slice] = 1;
    }
    return d.plan.ReduceOverAll(flags.data(), static_cast<int>(flags.size()),
                                "diloco-fault", runtime::ReduceOp::kMax);
  }));
  if (flags[0] > 0) return true;
  if (!rejoins) return false;
  if (step < config_.steps) {
    ScheduleAdmission(d, step, flags.data() + 1);
  } else if (d.local == 0) {
    rt_.CloseAdmissions();
  }
  return false;
}

// The slices that asked are admitted once this step's sync has landed
// (overlap_steps later, when nothing is in flight), if training goes on
// after that.
void Trainer::ScheduleAdmission(Device& d, int64_t step,
                                const float* requests) {
  Device::Admission& a = d.admission;
  a.slices.clear();
  for (int slice = 0; slice < rt_.env().num_slices; ++slice) {
    if (requests[slice] > 0) a.slices.push_back(slice);
  }
  const int64_t at = step + config_.num_communication_overlapping_steps;
  if (a.slices.empty() || at >= config_.steps) return;
  a.at = at;
  a.generation = rt_.membership_generation();
}

// After `step` the survivors take the admitted slices back: no save
// may be in flight (its barriers count the members), the runtime connects
// the next generation with them, and their replicas get the lowest
// survivor's state. A loss since the decision leaves them waiting for the
// next one.
Status Trainer::AdmitSlices(Device& d, int64_t step) {
  Device::Admission& a = d.admission;
  a.at = -1;
  saver_->WaitForSaves(d.local);
  if (!rt_.AllLocalDevicesOk(rt_.membership_generation() == a.generation)) {
    return OkStatus();
  }
  RETURN_IF_ERROR(rt_.AdmitSlices(a.generation, a.slices, step));
  RETURN_IF_ERROR(ShareRejoinState(d, /*joining=*/false));
  if (d.reporter_thread) {
    for (int slice : a.slices) {
      std::fprintf(stderr,
                   "multislice train: slice %d rejoined after step %lld\n",
                   slice, static_cast<long long>(step));
    }
  }
  return OkStatus();
}

// The replicas that join take the moments and outer state of the lowest
// replica that trained on, and the outer parameters as their own (as at a
// restart: replica_restore.h). Every replica of the new generation calls it.
Status Trainer::ShareRejoinState(Device& d, bool joining) {
  float lowest = joining ? 1e9f : static_cast<float>(d.plan.diloco_rank());
  RETURN_IF_ERROR(d.plan.ReduceOverDiloco(&lowest, 1, "rejoin-root",
                                          runtime::ReduceOp::kMin));
  const int root_replica = static_cast<int>(lowest);
  int root = root_replica;  // its rank among the replicas left
  for (int slice : rt_.lost_slices()) root -= slice < root_replica ? 1 : 0;
  return RejoinFromReplica(
      d.plan, root, /*complete=*/!joining,
      {d.state.shard.data(), d.state.adam_m.data(), d.state.adam_v.data(),
       d.outer->outer().data(), d.outer->momentum().data()});
}

// A restarted slice's device: it starts after the step the survivors
// admitted it at, from their state, with its data at that step.
Status Trainer::JoinRunningJob(Device& d) {
  const int64_t step = *rt_.joined_step();
  RETURN_IF_ERROR(ShareRejoinState(d, /*joining=*/true));
  d.start_step = step;
  d.outer->Resume(step);
  IteratorState at = d.train_data.state();
  at.step = step;
  RETURN_IF_ERROR(d.train_data.Restore(at));
  if (d.local == 0) {
    std::fprintf(stderr,
                 "multislice train: %s rejoined after step %lld at the outer "
                 "parameters\n",
                 rt_.env().name().c_str(), static_cast<long long>(step));
  }
  return OkStatus();
}

// Runs op, a collective across DiLoCo's replicas. With
// diloco_continue_on_failure, when it fails and the survivors agree that
// slices were lost (Runtime::DropLostSlices), it runs again over the
// replicas left, after `resend` (which restarts work op waits for); the
// first failure is returned when none was lost or the agreement failed.
Status Trainer::AcrossReplicas(const std::function<Status()>& op,
                               const std::function<Status()>& resend) {
  for (int tries = 0;; ++tries) {
    const int generation = rt_.membership_generation();
    Status s = op();
    if (!config_.diloco_continue_on_failure) return s;
    // A collective can succeed on one device of a process and fail on
    // another (one that had nothing to send to the lost peer): they retry
    // together, or their shared-memory groups would fall out of step.
    if (!rt_.AllLocalDevicesOk(s.ok()) && s.ok()) {
      s = Aborted("another device of this process lost a peer");
    }
    if (s.ok() || tries >= rt_.env().num_slices) return s;
    Result<int> lost = rt_.DropLostSlices(generation);
    if (!lost.ok()) {
      return s.WithContext(
          "and the survivors did not agree on the slices "
          "lost (" +
          lost.status().message() + ")");
    }
    if (*lost == 0 && rt_.membership_generation() == generation) return s;
    if (resend) RETURN_IF_ERROR(resend());
  }
}

// With lost slices (one DiLoCo replica each): the lowest replica left,
// which writes the outer state and stands in for the lost ones.
int Trainer::LowestLiveReplica() const {
  const std::vector<int> lost = rt_.lost_slices();
  int replica = 0;
  while (std::find(lost.begin(), lost.end(), replica) != lost.end()) ++replica;
  return replica;
}

// The shards this device writes for the replicas that are gone: the outer
// parameters with this replica's AdamW moments, the state a rejoin gives a
// replica that lost its memory (docs/diloco.md), so that the checkpoint
// resumes onto every slice again.
std::vector<StateShard> Trainer::StandIns(const Device& d) const {
  std::vector<StateShard> stand_ins;
  for (int slice : rt_.lost_slices()) {
    StateShard s = d.shard(/*with_outer=*/false);
    s.replica = slice;
    s.params = d.outer->outer().data();
    stand_ins.push_back(s);
  }
  return stand_ins;
}

// Whether the save of `step` is skipped because slice 0 was lost: its
// process commits every checkpoint. Every survivor decides alike: the
// slices are dropped at the same collective everywhere.
bool Trainer::SkipsSaveWhileLost(int local, int64_t step) const {
  const std::vector<int> lost = rt_.lost_slices();
  if (std::find(lost.begin(), lost.end(), 0) == lost.end()) return false;
  if (local == 0 && rt_.process_index() == rt_.live_processes().front()) {
    std::fprintf(stderr,
                 "multislice train: warning: no checkpoint at step %lld: "
                 "slice 0 was lost, and its worker 0 commits the "
                 "checkpoints\n",
                 static_cast<long long>(step));
  }
  return true;
}

}  // namespace multislice::train::internal
