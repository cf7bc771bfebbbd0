// `multislice run` (runner.h) on a queued resource whose capacity is Slurm
// (controller --capacity slurm): its API answer carries clusterJob, the
// Slurm job holding every worker's node, and nodes[i].hosts[w], the node of
// slice i's worker w. There are no agents; every step of runner.h is a
// step of that job, started from here (a host with Slurm's client) with
// `srun --jobid=J --overlap` on the workers' nodes, one task per worker:
//  1. packs the script directory (PackRunScripts), unless
//     use_existing_folder;
//  2. stops what an earlier `run` of the queued resource left: the job's
//     steps named kRunTagPrefix... (squeue --steps), `scancel
//     --signal=TERM`, then KILL after stop_grace, waiting until they are
//     gone;
//  3. step `multislice-run/RUN_NAME/setup`: the archive on srun's stdin
//     (--input=all: every task reads all of it) is unpacked into RUN_NAME/
//     in each worker's directory; with use_existing_folder the step checks
//     that the folder is there;
//  4. step `multislice-run/RUN_NAME`: the command, in that folder;
//  5. and 6. as on agents (run_output.h): each worker's output file, slice
//     0 worker 0's echo, the progress line; the first worker that exits
//     non-zero has the others stopped (the step: scancel TERM, KILL after
//     stop_grace) and gives the exit code; Ctrl-C stops the step, 130.
//
// The worker's environment is the startup script's, from one place: each
// task replays the job's batch script (`scontrol show job J`: Command=, the
// controller's, slurm_capacity.h) with its `srun` replaced by a shell
// function that runs the batch script's task body for this worker alone
// (SLURM_PROCID = slice * hosts per slice + worker, SLURM_RESTART_COUNT =
// the job's Restarts, which a step started outside the batch script does
// not get) with the run's script in place of the startup script. So
// MEGASCALE_*, TPU_WORKER_*, MULTISLICE_ATTEMPT, RANK/WORLD_SIZE/MASTER_*,
// JAX_* and the working directory (the worker's directory) are what the
// startup script had; MULTISLICE_RUN_NAME is added, as on agents.
//
// Each task's output (stdout and stderr together) is labelled line by line
// "[node N worker W] " and followed by one line "\x1e" kSlurmRunExitMarker
// "N W CODE"; srun's output is written to a file here and demultiplexed by
// label, so a worker's file holds its bytes as on agents (a last line
// without a newline included).
#pragma once

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "control/agent/run_target.h"

namespace multislice::control {

// Ends each task's output: "\x1e" kSlurmRunExitMarker "N W CODE\n".
inline constexpr const char* kSlurmRunExitMarker = "multislice-run-exit ";

// Runs options.command on every worker of `queued_resource` (its API
// answer, with clusterJob) as described above. The same results as
// RunOnWorkers; FailedPrecondition when the queued resource has no workers
// or its job is not RUNNING; Unavailable when a Slurm command cannot be
// run or fails.
Result<int> RunOverSlurm(const RunOptions& options,
                         const nlohmann::json& queued_resource);

}  // namespace multislice::control
