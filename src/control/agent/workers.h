// The agent's process groups: startup-script workers and exec commands,
// without HTTP (agent.cc maps these calls and their errors onto
// /agent/v1/). See docs/agent.md for the rules.
//
// Errors: InvalidArgument (a bad name), NotFound (no such worker or exec),
// FailedPrecondition (the worker is still running: a second start),
// Aborted (a start or stop of that worker is under way), Unavailable (the
// table is shutting down), DeadlineExceeded (a group outlived SIGKILL),
// Internal (files, fork).
//
// Thread-safety: every method may be called from any thread; starts and
// stops of different workers run concurrently, and no lock is held while a
// group is being stopped.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "control/process.h"

namespace multislice::control {

// Whether `name` can name a worker: 1 to 128 of [a-z0-9.-], starting with a
// letter or digit (so never "." or "..").
bool ValidWorkerName(const std::string& name);

// Whether `tag` can tag an exec: 1 to 128 of [A-Za-z0-9._/:-].
bool ValidExecTag(const std::string& tag);

// Whether `path` is a relative path that stays below its base: 1 to 1024
// characters, not starting with '/', no empty, "." or ".." component, no
// NUL byte.
bool ValidRelativePath(const std::string& path);

// At most this much output is returned by one ReadExec.
inline constexpr size_t kMaxExecChunkBytes = 256 * 1024;

// What StartExec runs: `bash -c command`.
struct ExecSpec {
  std::string command;
  // Runs in this worker's directory with its latest environment; empty: in
  // the workdir with the agent's environment.
  std::string worker;
  // A subdirectory (ValidRelativePath) of that directory to run in instead;
  // it must exist.
  std::string directory;
  // Marks the exec so that StopTaggedExecs can find it; empty: none.
  std::string tag;
  std::vector<std::string> env;  // "NAME=value", added last
};

// One exec stopped by StopTaggedExecs.
struct StoppedExec {
  std::string id;
  std::string tag;
  int exit_code = -1;  // the shell's convention
};

struct ExecChunk {
  std::string output;  // log bytes from the offset
  long long next_offset = 0;
  bool done = false;   // the command has exited and all output is read
  int exit_code = -1;  // when done: the shell's convention (128 + signal)
};

class WorkerTable {
 public:
  // workdir: where workers/{name}/ and exec/ go. launcher must outlive the
  // table. stop_grace: for Shutdown().
  WorkerTable(std::string workdir, ProcessLauncher* launcher,
              std::chrono::milliseconds stop_grace);
  ~WorkerTable();  // Shutdown()s

  // Writes the script to workers/{name}/startup-script.sh (0700), appends
  // "=== attempt N ===" to startup-script.log, and starts `/bin/bash
  // startup-script.sh` there with `env` ("NAME=value") as its own group.
  // Returns the worker's status (see StatusJson).
  Result<nlohmann::json> Start(const std::string& name, int attempt,
                               const std::string& script,
                               const std::vector<std::string>& env);

  // Stops the worker's group (SIGTERM, grace, SIGKILL) and returns its status
  // once the group is gone.
  Result<nlohmann::json> Stop(const std::string& name,
                              std::chrono::milliseconds grace);

  // Every worker's status, sorted by name: {"name", "attempt", "pid",
  // "state", "exitCode", "signal", "directory", "log"}.
  nlohmann::json Statuses();
  size_t size();

  // Starts `bash -c command` (in the worker's directory with its latest
  // environment when `worker` is not empty, else in workdir) with `env`
  // added; returns the exec id.
  Result<std::string> StartExec(const std::string& command,
                                const std::string& worker,
                                const std::vector<std::string>& env);
  // The same with a directory and a tag (see ExecSpec). NotFound also when
  // the directory does not exist.
  Result<std::string> StartExec(const ExecSpec& spec);
  Result<ExecChunk> ReadExec(const std::string& id, long long offset);
  // Stops the exec's group; returns its exit code (shell convention).
  Result<int> StopExec(const std::string& id, std::chrono::milliseconds grace);
  // Stops, all at once, every exec of `worker` whose tag starts with
  // `tag_prefix` (not empty) and whose group still has a process; returns
  // them once every group is gone. NotFound for an unknown worker.
  Result<std::vector<StoppedExec>> StopTaggedExecs(
      const std::string& worker, const std::string& tag_prefix,
      std::chrono::milliseconds grace);

  // The worker's directory (<workdir>/workers/{name}); NotFound when no
  // worker of that name was started.
  Result<std::string> WorkerDirectory(const std::string& name);

  // Fencing: every worker started from now on holds the lease at `path`
  // (ProcessSpec::lease_path) and is killed by its guardian when it lapses.
  void set_lease_path(std::string path) { lease_path_ = std::move(path); }
  // Workers (not execs) run as this user, their directories owned by it;
  // -1: this process's user.
  void set_worker_user(int uid, int gid) {
    worker_uid_ = uid;
    worker_gid_ = gid;
  }

  // Refuses new starts, then stops every group at once (with stop_grace) and
  // waits for all. Idempotent.
  void Shutdown();

 private:
  struct Worker;
  struct Exec;
  static nlohmann::json StatusJson(const Worker& w);
  Status Launch(Worker& worker, int attempt, const std::string& script,
                const std::vector<std::string>& env);
  void DropOldExecsLocked();

  const std::string workdir_;
  ProcessLauncher* const launcher_;
  const std::chrono::milliseconds stop_grace_;
  std::string lease_path_;  // set before serving
  int worker_uid_ = -1, worker_gid_ = -1;

  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Worker>> workers_;
  std::map<std::string, std::shared_ptr<Exec>> execs_;
  uint64_t exec_counter_ = 0;
  bool shutting_down_ = false;
};

}  // namespace multislice::control
