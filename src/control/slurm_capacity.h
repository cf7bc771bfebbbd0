// Slurm as the capacity (docs/control.md, "Slurm as the capacity"): a
// queued resource is one batch job of slices x hosts_per_slice nodes, one
// task per node (Slurm starts it with every node or not at all). The batch
// script runs the startup script on every node through one `srun` step,
// each task with the worker environment of the host agents (MEGASCALE_*,
// TPU_WORKER_*, MULTISLICE_ATTEMPT = 1 + SLURM_RESTART_COUNT, ...) in its
// worker's own directory (WORKDIR/workers/ID.SLICE.WORKER), and then
// holds the nodes until the job is cancelled, as a TPU VM stays yours after
// its startup script ended.
//
// Every Slurm command goes through one CommandRunner, so that a test can
// answer for Slurm (slurm_capacity_test.cc). Output is read in the
// machine-readable forms: sbatch --parsable, scontrol --oneliner,
// squeue/sinfo --noheader --format.
//
// Thread-safety: SlurmCapacity's calls may run on several threads at once
// (the runner must allow it; NewCommandRunner's does).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "control/capacity.h"

namespace multislice::control {

// Runs one command and returns its standard output. A command that cannot
// start, exits non-zero (the error carries its standard error) or outlives
// the runner's timeout is an error.
class CommandRunner {
 public:
  virtual ~CommandRunner() = default;
  virtual Result<std::string> Run(const std::vector<std::string>& argv) = 0;
};

// Runs commands as child processes (PATH lookup), each killed after
// `timeout`.
std::unique_ptr<CommandRunner> NewCommandRunner(
    std::chrono::milliseconds timeout);

struct SlurmOptions {
  std::string partition;  // "" : the cluster's default partition
  // Where the batch scripts, their output and the workers' file:// store
  // live; every node must see it at the same path (the submit directory).
  std::string workdir;
  // Tier name (TierName) -> the partition its jobs go to instead, e.g. spot
  // to a partition a reserved one preempts (PreemptType=preempt/
  // partition_prio, PreemptMode=CANCEL: the QR becomes SUSPENDED).
  std::map<std::string, std::string> tier_partitions;
};

// The job's state word (JobState=) as a phase.
ClusterJobStatus::Phase SlurmPhase(const std::string& job_state);

// KEY=VALUE fields of one `scontrol show job --oneliner` line.
std::map<std::string, std::string> ParseOneliner(const std::string& line);

// The batch script of `spec`, whose files are under `workdir` (the startup
// script is read from `startup_path`).
std::string SlurmBatchScript(const ClusterJobSpec& spec,
                             const std::string& workdir,
                             const std::string& startup_path);

class SlurmCapacity : public ClusterCapacity {
 public:
  SlurmCapacity(SlurmOptions options, std::unique_ptr<CommandRunner> runner);

  Result<std::string> Submit(const ClusterJobSpec& spec) override;
  Result<ClusterJobStatus> Query(const std::string& job) override;
  Status Cancel(const std::string& job) override;
  Status Requeue(const std::string& job,
                 const std::vector<std::string>& exclude) override;
  Result<std::set<std::string>> FailedNodes() override;

 private:
  SlurmOptions options_;
  std::unique_ptr<CommandRunner> runner_;
};

}  // namespace multislice::control
