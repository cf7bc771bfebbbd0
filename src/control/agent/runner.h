// `multislice run`: MaxText's multihost_runner.py (spec section 4.3) over
// the host agents of an existing queued resource.
//
// RunOnWorkers lists the queued resource's workers with the controller,
// then, through each worker's agent:
//  1. packs the script directory into a tar.gz (pack.h: output folders
//     are never packed, a directory too large is refused before packing,
//     progress on a terminal), unless use_existing_folder;
//  2. stops what an earlier `run` left on the workers: every exec tagged
//     kRunTagPrefix... (POST /agent/v1/workers/{name}/execs:stop), waiting
//     for them to exit;
//  3. uploads the archive (PUT /agent/v1/workers/{name}/files) and unpacks
//     it into `<worker directory>/<run_name>/` (files already there and
//     not in the archive stay); with use_existing_folder that folder must
//     already exist;
//  4. starts the command on every worker at once (POST /agent/v1/exec with
//     the worker's environment, cwd the unpacked folder, tag
//     kRunTagPrefix + run_name, and MULTISLICE_RUN_NAME set);
//  5. writes each worker's output to
//     `<output_dir>/<run_name>/output_slice_SSSS_worker_WWWW.txt` (slice =
//     node index), echoes slice 0 worker 0's output to `out`, and prints
//     `Completed c/t, slice S worker W still working...` on `err` while it
//     waits (redrawn in place on a terminal, else every progress_interval);
//  6. on the first worker that exits with a non-zero code (or whose agent
//     is lost: 255), stops every other worker's command, prints one line
//     naming the slice, worker and exit code, and returns that code. 0 when
//     every worker succeeds; 130 when `cancel` is set (the commands are
//     stopped first).
// A queued resource on Slurm capacity (its API answer carries clusterJob)
// has no agents: RunOnWorkers hands it to RunOverSlurm (slurm_runner.h),
// which does the same through steps of its Slurm job. What both share
// before running is in run_target.h (options, the queued resource, packed
// scripts); the output side in run_output.h.
#pragma once

#include "control/agent/run_target.h"

namespace multislice::control {

// Runs the command as described above. Returns the exit code, or an error
// before any command started: bad options (InvalidArgument), the
// controller or an agent unreachable (Unavailable), an unknown queued
// resource (NotFound), a missing folder with use_existing_folder
// (NotFound), packing, copying or unpacking failed.
Result<int> RunOnWorkers(const RunOptions& options);

}  // namespace multislice::control
