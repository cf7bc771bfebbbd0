// Workers started by Slurm: `srun -N 4 --ntasks-per-node 1 multislice train
// CONFIG --num_slices 2 --accelerator_type v4-16` forms the job from Slurm's
// variables, as JAX's SlurmCluster does, with no controller and no
// MEGASCALE_* variables:
//
//   process index   SLURM_PROCID (0 .. SLURM_NTASKS-1)
//   slices          MEGASCALE_NUM_SLICES, else the command's --num_slices
//   hosts per slice SLURM_NTASKS / slices; must be the accelerator type's
//                   hosts per slice (cpu-N: 1, v4-16: 2, ...)
//   slice, worker   SLURM_PROCID / hosts per slice, SLURM_PROCID % hosts
//   worker hosts    the nodes of the slice's tasks: SLURM_STEP_NODELIST
//                   expanded (h[1-3,5]), tasks dealt in blocks by
//                   SLURM_STEP_TASKS_PER_NODE (2(x3),1)
//   coordinator     MEGASCALE_COORDINATOR_ADDRESS, else a file:// store in
//                   SLURM_SUBMIT_DIR/.multislice-store/ (Slurm clusters share
//                   the submit directory between nodes; set a redis://
//                   address where they do not)
//   run, attempt    slurm-<SLURM_JOB_ID>.<SLURM_STEP_ID>, SLURM_RESTART_COUNT
//                   (a job that `sbatch --requeue` restarted is attempt 1, 2..)
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/worker_env.h"

namespace multislice::runtime {

// Whether this process is a task of a Slurm job step (SLURM_PROCID and
// SLURM_STEP_ID set).
bool InSlurmStep(const EnvLookup& lookup);

// Expands a Slurm hostlist ("h[1-3,5],gpu[01-02]" -> h1 h2 h3 h5 gpu01
// gpu02). kInvalidArgument names the expression and what is wrong.
Result<std::vector<std::string>> ExpandHostlist(const std::string& hostlist);

// Expands SLURM_STEP_TASKS_PER_NODE ("2(x3),1" -> 2 2 2 1).
Result<std::vector<int>> ExpandTasksPerNode(const std::string& spec);

// The worker environment of this Slurm task, or nullopt outside a step. The
// command's own --num_slices and --accelerator_type are `num_slices` and
// `accelerator_type`. A variable or combination that does not form a job is
// kInvalidArgument naming the variables, their values and what was
// expected.
Result<std::optional<WorkerEnv>> ReadSlurmWorkerEnv(
    const EnvLookup& lookup, int num_slices,
    const std::string& accelerator_type);

}  // namespace multislice::runtime
