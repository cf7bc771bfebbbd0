// Starting the workers of a job on this machine.
//
// RunWorkers starts one child process per worker, relays every line the
// children print with a "[slice s worker w] " prefix, and waits. When a
// worker fails it stops the others (SIGTERM to each worker's process group,
// SIGKILL after a grace period), reaps every child, and returns the failed
// worker's exit code (128 + signal for a worker killed by a signal). A
// SIGINT or SIGTERM to the launcher is forwarded the same way. Children die
// with the launcher (PR_SET_PDEATHSIG), so no worker outlives it.
//
// RunLocalJob is the one-machine default behind `multislice <command>
// --num_slices S`: when this process was started as a worker (the variables
// of worker_env.h are set) it runs the worker body in-process; otherwise it
// creates a file:// store in a fresh temporary directory, starts S workers
// that re-run this binary with the same arguments and the worker
// environment, and removes the store when they are done.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "runtime/worker_env.h"

namespace multislice::runtime {

struct WorkerProcess {
  std::vector<std::string> argv;  // argv[0] is the program path
  std::vector<std::string> env;   // "NAME=value", added to ours
  std::string prefix;             // put before every output line
  bool prefix_stdout = true;      // false: relay stdout as is (JSON data)
};

struct LaunchOptions {
  std::vector<WorkerProcess> workers;
  // Time between SIGTERM and SIGKILL when stopping workers.
  std::chrono::milliseconds stop_grace{5000};
  // After the first worker fails, how long the others may still end on
  // their own before they are stopped: a worker killed by a signal is the
  // cause the result reports, even when a peer noticed the lost connection
  // and exited 1 before the kernel had finished tearing the killed one down.
  std::chrono::milliseconds cause_window{300};
  // Failure domains that may be lost without stopping the others (DiLoCo's
  // diloco_continue_on_failure: the workers of a slice): the domain of each
  // worker, by index. Empty: the first failure stops every worker, as
  // above. Otherwise a failed worker's domain is stopped (SIGKILL to its
  // other workers), on_gone is told each of its workers (the failed one
  // last, so that whoever sees it gone sees its domain gone) and the other
  // domains go on; once no domain is left, the workers stop as above.
  std::vector<int> domains;
  std::function<void(int worker, int incarnation)> on_gone;
  // With domains: how many times a lost domain is started again, once all
  // of its workers are reaped (a repair, on one machine). A restarted
  // worker has MULTISLICE_INCARNATION set to its start number (1 at the
  // first restart), so that it rejoins the running job (membership.h).
  int domain_restarts = 0;
  int out_fd = 1;  // where children's stdout lines go
  int err_fd = 2;  // where children's stderr lines go
};

struct LaunchResult {
  int exit_code = 0;       // 0 when every worker succeeded
  int failed_worker = -1;  // index into LaunchOptions::workers, or -1
  // With LaunchOptions::domains: the workers of the domains lost while the
  // others went on (exit_code stays 0 when those others succeeded).
  std::vector<int> lost_workers;
  // The domain of each restart, in order.
  std::vector<int> restarted_domains;
};

LaunchResult RunWorkers(const LaunchOptions& options);

struct LocalJobOptions {
  int num_slices = 1;
  std::string accelerator_type;  // e.g. cpu-4, or v4-16 (2 hosts per slice)
  std::string run_id;            // default: "local-<pid>"
  int attempt = 0;
  // The rendezvous store; empty means file:// in a fresh temporary directory.
  std::string store_address;
  // Relay slice 0 worker 0's stdout without the prefix, so that data it
  // prints (--json) stays parseable; everything else is still prefixed.
  bool raw_stdout_of_first_worker = false;
  // DiLoCo's diloco_continue_on_failure: a failed worker stops only its
  // slice, which is recorded gone in the store (membership.h), and the
  // other slices go on (LaunchOptions::domains).
  bool continue_without_lost_slices = false;
  // With it: how many times a lost slice is started again, to rejoin.
  int slice_restarts = 0;
  // The command line to re-run in every worker (argv of this process).
  std::vector<std::string> argv;
};

// The worker processes of a local job whose store is the directory
// `store_dir`: one per host of every slice (slice-major, TPU_WORKER_ID
// minor, so index = JAX's process index), each re-running options.argv with
// argv[0] replaced by this executable and the worker environment set; every
// host's address is 127.0.0.1.
std::vector<WorkerProcess> LocalWorkers(const LocalJobOptions& options,
                                        const std::string& store_dir);

// Runs `worker_main` here when ReadJobEnvironment finds a worker environment
// (returning its exit code), else launches the local slices as described
// above.
// Returns 2 with a one-line message when the environment is malformed.
// This process's worker environment: the MEGASCALE_* contract
// (worker_env.h), or inside a Slurm job step without it, the job Slurm's
// variables describe with options' slice count and accelerator type
// (slurm_env.h); nullopt when neither (launch the local slices).
Result<std::optional<WorkerEnv>> ReadJobEnvironment(
    const LocalJobOptions& options, const EnvLookup& lookup);

// Hosts per slice of an accelerator type (1 when it does not parse).
int HostsPerSlice(const std::string& accelerator_type);

int RunLocalJob(const LocalJobOptions& options,
                const std::function<int(const WorkerEnv&)>& worker_main);

// Whether long work should report progress: stderr is a terminal, or this
// is a worker whose launcher's stderr is one (the launcher sets
// MULTISLICE_PROGRESS=1 for its workers then, since their stderr is a pipe).
bool ShowProgress();

// The path of the running executable (/proc/self/exe resolved).
std::string SelfExecutable();

}  // namespace multislice::runtime
