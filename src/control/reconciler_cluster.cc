// The reconcile loop's path for cluster capacity (capacity.h
// ClusterCapacity, docs/control.md "Slurm as the capacity"): the cluster
// owns admission and placement, so a queued resource is one job that the
// loop submits, follows, requeues (reset, repair) and cancels (delete). Its
// states follow the job's:
//
//   over its tier's quota (not submitted) WAITING_FOR_RESOURCES
//   job pending                          WAITING_FOR_RESOURCES
//   job configuring, or running before
//     the workers' step started          PROVISIONING
//   running, every worker started        ACTIVE
//   requeued (a node failed, or reset)   attempt + 1; the failed node's
//                                        slice REPAIRING, others RESTARTING
//   still pending at valid_until         cancelled, FAILED
//   preempted (PreemptMode=CANCEL)       SUSPENDED
//   ended by itself (failure, time limit) FAILED
//   cancelled (delete)                   DELETING, then gone
//
// Quotas are the controller's, as on agents: a record is submitted only
// when its tier's quota holds its chips (scheduler.h), and holds quota from
// the submit until it is deleted, FAILED and SUSPENDED included; one whose
// job was cancelled pending at valid_until holds none, as an agents' QR
// that was never admitted.
#include <algorithm>

#include "control/reconciler.h"
#include "control/scheduler.h"

namespace multislice::control {
namespace {

constexpr int64_t kPollIntervalMs = 500;
constexpr int64_t kSubmitRetryMs = 5000;

bool IsEnded(ClusterJobStatus::Phase p) {
  return p == ClusterJobStatus::Phase::kEnded ||
         p == ClusterJobStatus::Phase::kGone;
}

}  // namespace

ClusterFollow FollowClusterJob(QueuedResourceRecord& r,
                               const ClusterJobStatus& job,
                               const std::set<std::string>& failed,
                               bool requeued) {
  using P = ClusterJobStatus::Phase;
  ClusterFollow out;
  const QrState before = r.state;
  const int slices = static_cast<int>(r.nodes.size());
  const int hosts = r.hosts_per_slice;
  if (IsEnded(job.phase)) {
    if (r.state == QrState::kFailed || r.state == QrState::kSuspended) {
      return out;
    }
    if (job.state == "PREEMPTED") {
      // Slurm preempted the job for a higher-priority one (PreemptMode=
      // CANCEL): as a spot QR preempted on agents.
      r.state = QrState::kSuspended;
      r.state_initiator = "SERVICE";
      for (NodeRecord& n : r.nodes) {
        n.started = false;
        n.hosts.clear();
        n.state = "PREEMPTED";
      }
      out.changed = out.finish_ops = true;
      out.log =
          r.id + ": SUSPENDED (Slurm job " + r.cluster_job + " preempted)";
      return out;
    }
    r.state = QrState::kFailed;
    r.state_initiator = "SERVICE";
    const std::string word = job.state.empty() ? "GONE" : job.state;
    r.failed_error = job.state == "DEADLINE" ||
                             job.reason.find("eadline") != std::string::npos
                         ? "the valid_until deadline passed (Slurm job " +
                               r.cluster_job + " " + word + ")"
                         : "Slurm job " + r.cluster_job + " ended: " + word +
                               (job.reason.empty() || job.reason == "None"
                                    ? ""
                                    : " (" + job.reason + ")");
    for (NodeRecord& n : r.nodes) {
      n.started = false;
      n.hosts.clear();
    }
    out.changed = out.finish_ops = true;
    out.log = r.id + ": FAILED: " + r.failed_error;
    return out;
  }
  const int run_attempt = job.restarts + 1;
  auto slice_failed = [&](const NodeRecord& n) {
    return std::any_of(n.hosts.begin(), n.hosts.end(),
                       [&](const std::string& h) { return failed.count(h); });
  };
  if (requeued || run_attempt > r.attempt) {
    // A new attempt: Slurm requeued the job (a node failed under it) or we
    // did (repair, reset). Every slice restarts.
    const int next = requeued ? run_attempt + 1 : run_attempt;
    for (NodeRecord& n : r.nodes) {
      n.started = false;
      if (slice_failed(n)) {
        n.state = "REPAIRING";
        n.health = "UNHEALTHY_MAINTENANCE";
      } else if (n.state != "REPAIRING") {
        n.state = "RESTARTING";
      }
    }
    if (next > r.attempt) {
      out.log = r.id + ": attempt " + std::to_string(next) +
                (requeued ? " (job " + r.cluster_job +
                                " requeued away from a failed node)"
                          : " (Slurm requeued job " + r.cluster_job + ")");
      r.attempt = next;
    }
    if (r.state == QrState::kActive) r.state = QrState::kProvisioning;
    out.changed = true;
    if (requeued) return out;
  }
  if ((job.phase == P::kConfiguring || job.phase == P::kRunning) &&
      static_cast<int>(job.nodes.size()) == slices * hosts) {
    for (int i = 0; i < slices; ++i) {
      std::vector<std::string> slice(job.nodes.begin() + i * hosts,
                                     job.nodes.begin() + (i + 1) * hosts);
      if (r.nodes[i].hosts != slice) {
        r.nodes[i].hosts = slice;
        out.changed = true;
      }
    }
  }
  QrState next = r.state;
  if (job.phase == P::kPending) {
    next = QrState::kWaitingForResources;
  } else if (run_attempt < r.attempt) {
    next = QrState::kProvisioning;  // our requeue has not taken hold yet
  } else if (job.phase == P::kRunning &&
             (job.workers_started || r.state == QrState::kActive)) {
    next = QrState::kActive;
  } else {
    next = QrState::kProvisioning;
  }
  if (next == QrState::kActive && before != QrState::kActive) {
    for (NodeRecord& n : r.nodes) {
      n.started = true;
      n.state = "READY";
      n.health = "HEALTHY";
    }
    out.finish_ops = true;
    out.log = r.id + ": ACTIVE (attempt " + std::to_string(r.attempt) +
              ", Slurm job " + r.cluster_job + ")";
  } else if (next != before) {
    out.log =
        r.id + ": " + StateName(next) + " (Slurm job " + r.cluster_job + " " +
        job.state +
        (job.reason.empty() || job.reason == "None" ? "" : ", " + job.reason) +
        ")";
  }
  if (next != r.state) {
    r.state = next;
    out.changed = true;
  }
  return out;
}

std::set<std::string> Reconciler::ClusterAdmissions() const {
  SchedulerInput in;
  for (int t = 0; t < kNumTiers; ++t) {
    in.quota_chips[t] = state_.options().quota_chips[t];
  }
  for (const auto& [name, r] : state_.records) {
    if (r.delete_requested) continue;
    if (r.holds_quota) {
      SchedHolder h;
      h.name = name;
      h.tier = r.spec.tier;
      h.chips = r.total_chips();
      h.holds_quota = true;
      in.holders.push_back(h);
    } else if (r.state == QrState::kWaitingForResources) {
      SchedRequest req;
      req.name = name;
      req.seq = r.seq;
      req.tier = r.spec.tier;
      req.accelerator_type = r.spec.accelerator_type;
      req.hosts_per_slice = 0;  // Slurm places it
      req.chips_per_slice = r.chips_per_slice;
      req.slices = static_cast<int>(r.nodes.size());
      in.requests.push_back(req);
    }
  }
  std::set<std::string> admitted;
  for (const Grant& g : control::Schedule(in).grants) admitted.insert(g.name);
  return admitted;
}

void Reconciler::TickCluster() {
  const int64_t steady = SteadyMs();
  const std::set<std::string> admitted = ClusterAdmissions();
  std::vector<std::string> names;
  for (const auto& [name, r] : state_.records) {
    if (!busy_.count(name)) names.push_back(name);
  }
  for (const std::string& name : names) {
    auto it = state_.records.find(name);
    if (it == state_.records.end()) continue;
    QueuedResourceRecord& r = it->second;
    const uint64_t version = state_.versions[name];
    const bool stopping = r.stage == "stop";
    if (r.cluster_job.empty()) {
      if (stopping) {
        if (r.delete_requested) {
          WorkResult done;
          done.complete = true;
          ApplyWork(name, version, "stop", r.attempt, done);
        } else {
          r.stage.clear();
          state_.Changed(r);
          state_.Persist(r).ok();
        }
        continue;
      }
      const bool waiting = r.state == QrState::kWaitingForResources &&
                           !r.holds_quota && !r.delete_requested;
      if (!waiting || !admitted.count(name) || steady < next_poll_[name]) {
        continue;  // over quota: waits, as on agents
      }
      next_poll_[name] = steady + kSubmitRetryMs;
      ClusterJobSpec spec;
      spec.name = r.id;
      spec.run_id = RunIdentity(r);
      spec.slices = static_cast<int>(r.nodes.size());
      spec.hosts_per_slice = r.hosts_per_slice;
      spec.accelerator_type = r.spec.accelerator_type;
      spec.tier = TierName(r.spec.tier);
      spec.startup_script = r.spec.startup_script;
      busy_.insert(name);
      RunOnWorkThread([this, name, version, spec] {
        ClusterWork w;
        w.action = "submit";
        Result<std::string> job = cluster_->Submit(spec);
        w.status = job.status();
        if (job.ok()) w.job = *job;
        return [this, name, version, w] { ApplyClusterWork(name, version, w); };
      });
      continue;
    }
    if (!stopping &&
        (r.state == QrState::kFailed || r.state == QrState::kSuspended)) {
      continue;  // job over
    }
    if (steady < next_poll_[name]) continue;
    next_poll_[name] = steady + kPollIntervalMs;
    const std::string job = r.cluster_job;
    // valid_until bounds the wait for the first start only (as admission
    // does on agents): a job still pending then is cancelled.
    const bool expired = !stopping && r.spec.valid_until_ms > 0 &&
                         WallMs() >= r.spec.valid_until_ms &&
                         r.state == QrState::kWaitingForResources &&
                         r.attempt == 1;
    std::string action = "query";
    if (expired) action = "expire";
    if (stopping) action = r.delete_requested ? "cancel" : "requeue";
    const int attempt = r.attempt;
    busy_.insert(name);
    RunOnWorkThread([this, name, version, job, action, attempt] {
      ClusterWork w;
      w.action = action;
      if (action == "cancel" || action == "expire") {
        w.status = cluster_->Cancel(job);
      }
      if (action == "requeue") w.status = cluster_->Requeue(job, {});
      Result<ClusterJobStatus> st = cluster_->Query(job);
      if (st.ok()) {
        w.queried = true;
        w.job_status = *st;
        // Repair: a running job on a failed node is requeued away from it,
        // unless a requeue of ours has not taken hold yet.
        if (action == "query" &&
            st->phase == ClusterJobStatus::Phase::kRunning &&
            st->restarts + 1 >= attempt) {
          Result<std::set<std::string>> failed = cluster_->FailedNodes();
          if (failed.ok()) w.failed = *failed;
          std::vector<std::string> bad;
          for (const std::string& n : st->nodes) {
            if (w.failed.count(n)) bad.push_back(n);
          }
          if (!bad.empty()) {
            w.status = cluster_->Requeue(job, bad);
            w.requeued = w.status.ok();
          }
        }
      } else if (w.status.ok()) {
        w.status = st.status();
      }
      return [this, name, version, w] { ApplyClusterWork(name, version, w); };
    });
  }
}

void Reconciler::ApplyClusterWork(const std::string& name, uint64_t version,
                                  const ClusterWork& w) {
  busy_.erase(name);
  auto it = state_.records.find(name);
  if (it == state_.records.end()) return;
  QueuedResourceRecord& r = it->second;
  if (!w.status.ok()) {
    const std::string line = r.id + ": " + w.action + ": " + w.status.message();
    if (said_[name] != line) state_.Log(line);
    said_[name] = line;
  } else {
    said_.erase(name);
  }
  std::vector<OperationRecord> ops;
  if (w.action == "submit") {
    // Kept whatever changed meanwhile: a delete cancels it next.
    if (!w.status.ok()) return;  // stays WAITING_FOR_RESOURCES; retried
    r.cluster_job = w.job;
    r.holds_quota = true;
    r.attempt = 1;
    state_.Log(r.id + ": submitted as Slurm job " + w.job);
    next_poll_[name] = 0;
  } else if (state_.versions[name] != version) {
    return;  // changed meanwhile (a delete, a reset): runs again
  } else if (w.action == "cancel") {
    if (!w.queried || !IsEnded(w.job_status.phase)) return;  // not yet gone
    next_poll_.erase(name);
    said_.erase(name);
    WorkResult done;
    done.complete = true;
    ApplyWork(name, version, "stop", r.attempt, done);
    return;
  } else if (w.action == "expire") {
    if (!w.status.ok()) return;  // retried
    r.state = QrState::kFailed;
    r.state_initiator = "SERVICE";
    r.failed_error = "the valid_until deadline " +
                     FormatTimestamp(r.spec.valid_until_ms) +
                     " passed before resources were available (Slurm job " +
                     r.cluster_job + " cancelled)";
    r.holds_quota = false;  // never started: as a QR never admitted
    for (NodeRecord& n : r.nodes) {
      n.started = false;
      n.hosts.clear();
    }
    state_.FinishOps(r, r.ToApi(), &ops);
    state_.Log(r.id + ": FAILED: " + r.failed_error);
  } else if (w.action == "requeue") {
    if (!w.status.ok()) return;  // retried
    r.attempt += 1;
    r.stage.clear();
    r.state = QrState::kProvisioning;
    for (NodeRecord& n : r.nodes) {
      n.started = false;
      n.state = "RESTARTING";
    }
    state_.Log(r.id + ": reset: Slurm job " + r.cluster_job +
               " requeued for attempt " + std::to_string(r.attempt));
  } else {
    if (!w.queried) return;
    ClusterFollow f = FollowClusterJob(r, w.job_status, w.failed, w.requeued);
    if (!f.log.empty()) state_.Log(f.log);
    if (!f.changed) return;
    if (f.finish_ops) state_.FinishOps(r, r.ToApi(), &ops);
  }
  state_.Changed(r);
  Status s = state_.Persist(r, ops);
  if (!s.ok()) state_.Log("cannot persist " + r.id + ": " + s.message());
  for (const OperationRecord& op : ops) state_.ops[op.name] = op;
}

}  // namespace multislice::control
