// What `multislice train` does around a run directory besides training in
// it (issue 13, the first hour of a user): the lock that keeps a second
// training out of it, the name of a run started without run_name, the note
// when a resumed run changes its learning-rate schedule, and the command
// that resumes a run after it stopped.
//
// The lock: <run_dir>/train.lock, an exclusive flock(2) taken by process 0
// of a job (slice 0 worker 0: the one process that writes config.json,
// metrics.jsonl and loss.svg) and held for the life of that process. The
// other workers of the job share the run directory without locking, so they
// never refuse each other. The kernel drops the lock when the holder dies,
// however it dies (kill -9, a crash, a lost host's agent stopping it), so
// there is never a stale lock to remove by hand. The holder writes one JSON
// line into the file (pid, host, run id, attempt, start time) for the
// sentence a refused training prints; the file itself is never deleted (a
// path that is unlinked while locked would let a second process lock a new
// file of the same name).
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/worker_env.h"
#include "train/config.h"

namespace multislice::train {

inline constexpr char kRunLockFileName[] = "train.lock";

struct RunLockOwner {
  std::string run_id;  // the job's MULTISLICE_RUN_ID
  int attempt = 0;     // the job's MULTISLICE_ATTEMPT
};

class RunDirectoryLock {
 public:
  // Creates `run_dir` if needed and takes the lock without blocking. When a
  // process holds it: kFailedPrecondition, one sentence naming the
  // directory and the holder ("... is in use by another training: pid 123
  // on host h, started 2026-12-01 10:00:00 UTC; wait for it to finish or
  // stop it, or choose another run_name"). A holder of an earlier attempt
  // of the same job (same run_id, lower attempt: its process is being
  // stopped by a repair) is waited for, up to `wait_for_earlier_attempt`.
  static Result<RunDirectoryLock> Acquire(
      const std::string& run_dir, const RunLockOwner& owner,
      std::chrono::milliseconds wait_for_earlier_attempt =
          std::chrono::milliseconds(0));

  // Whether another process holds the lock of `run_dir`: the refusal
  // Acquire would return, or ok (the lock is taken and released at once;
  // nothing is created when the directory does not exist).
  static Status CheckFree(const std::string& run_dir);

  RunDirectoryLock(RunDirectoryLock&& other) noexcept;
  RunDirectoryLock& operator=(RunDirectoryLock&& other) noexcept;
  RunDirectoryLock(const RunDirectoryLock&) = delete;
  RunDirectoryLock& operator=(const RunDirectoryLock&) = delete;
  ~RunDirectoryLock();  // releases the lock

 private:
  explicit RunDirectoryLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// The name of a run whose run_name is empty, and where it came from. As
// MaxText does, JOBSET_NAME first (and our job's MULTISLICE_RUN_NAME before
// it), so that every worker of a job and every attempt of it pick the same
// directory and a restart resumes; else, when `allow_timestamp` (one process
// chooses for all: the local launcher, a job of one worker), a UTC timestamp
// "run-20261201-100000". Without either variable and with allow_timestamp
// false (a worker of a job of several processes) kInvalidArgument: the
// workers would pick different timestamps.
struct DefaultRunName {
  std::string name;
  std::string source;  // "MULTISLICE_RUN_NAME", "JOBSET_NAME" or "timestamp"
};
Result<DefaultRunName> ChooseRunName(const runtime::EnvLookup& lookup,
                                     bool allow_timestamp);

// One line when a resumed run's schedule keys (steps, warmup_steps,
// learning_rate, cosine_learning_rate_final_fraction) differ from
// `previous` (the run's config.json of its last start), else "": the keys
// with their old and new values and the learning rate of the next step
// under each, e.g. "steps changed from 100 to 200 since this run's last
// start: the learning-rate schedule is recomputed for the new value, so
// step 101 trains with lr 5.50e-04 instead of 1.00e-04 ...". Training goes
// on (extending a finished run is what raising steps is for).
std::string ScheduleChangeNote(const nlohmann::json& previous,
                               const TrainConfig& config,
                               int64_t restored_step);

// `argv` as one shell command line, each argument quoted when it needs to
// be ('...' with embedded quotes escaped), argv[0] kept as the user typed it.
std::string ShellCommand(const std::vector<std::string>& argv);

// What a training that stopped before its end (Ctrl-C, SIGTERM, a lost
// worker) prints last: the newest committed checkpoint of `config`'s run
// and the command that resumes from it, e.g. "interrupted; the newest
// committed checkpoint is step 10 (runs/demo/checkpoints/10); resume with:
// multislice train configs/base.yml run_name=demo".
std::string ResumeHint(const TrainConfig& config, const std::string& what,
                       const std::vector<std::string>& argv);

}  // namespace multislice::train
