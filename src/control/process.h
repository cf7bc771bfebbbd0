// Process-group supervision for the host agent: startup scripts and `exec`
// commands each run as their own process group, and stopping one waits until
// every process of that group is gone.
//
// A started group is a session of its own (setsid), so its process group id
// is the leader's pid; its stdout and stderr are appended to a log file. The
// leader is a guardian: a forked copy of this process that never execs, runs
// the program as its child, exits with the program's status (re-raising the
// signal that ended it) and, when this process dies (PR_SET_PDEATHSIG),
// sends SIGKILL to the whole group, grandchildren included. The real
// launcher forks from one thread that lives as long as the launcher, since
// the parent-death signal follows the forking thread.
// The real launcher also makes this process a child subreaper, so orphaned
// grandchildren of a group are reparented here and reaped by Poll()/Stop()
// instead of lingering as zombies.
//
// Limits: a process that calls setsid() or setpgid() itself leaves its group
// and is not tracked; Stop() cannot end a process stuck in an uninterruptible
// sleep and then returns DeadlineExceeded.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace multislice::control {

struct ProcessSpec {
  // argv[0] is the program: an absolute path, or a name looked up in PATH.
  std::vector<std::string> argv;
  // "NAME=value" entries added to (and overriding) this process's
  // environment.
  std::vector<std::string> env;
  // Working directory of the child; empty: ours.
  std::string directory;
  // stdout and stderr are appended to this file (created with mode 0600 when
  // absent); empty: /dev/null.
  std::string log_path;
  // Fencing: a lease file (WriteLease) the guardian reads every
  // kLeasePollMs; once its deadline has passed, or it cannot be read, the
  // guardian kills its whole group. Empty: no lease.
  std::string lease_path;
  // The user the program runs as (the guardian stays this process's user):
  // -1 for ours. Supplementary groups are dropped.
  int uid = -1;
  int gid = -1;
};

// How often a guardian reads its lease.
inline constexpr int kLeasePollMs = 100;

// A user to run workers as: a name of this host's passwd database (its uid
// and primary group), or "UID:GID" in numbers (no passwd entry needed).
// InvalidArgument naming `field` otherwise.
struct UserIds {
  int uid = -1;
  int gid = -1;
};
Result<UserIds> ResolveUser(const std::string& field, const std::string& user);

// CLOCK_BOOTTIME (which counts a suspended machine's sleep too), in ns.
int64_t BootTimeNs();
// Atomically replaces the lease file `path` with `deadline_ns` (a
// BootTimeNs() value): a temporary file, then rename.
Status WriteLease(const std::string& path, int64_t deadline_ns);

struct ProcessState {
  pid_t pid = -1;       // the leader's pid (== the group id)
  bool running = true;  // the leader has not exited yet
  int exit_code = -1;   // the leader's exit status; -1 while running/signaled
  int signal = 0;       // the signal that ended the leader, 0 if none
  bool group_gone = false;  // no live process is left in the group

  // The shell's convention: exit_code, or 128 + signal; -1 while running.
  int ShellExitCode() const {
    if (running) return -1;
    return signal != 0 ? 128 + signal : exit_code;
  }
};

// One started process group. Thread-safe: Poll() may run while another
// thread is inside Stop(). Destroying a handle does not stop the group; call
// Stop() first.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual pid_t pid() const = 0;
  // The current state, reaping whatever of the group has exited. Never
  // blocks.
  virtual ProcessState Poll() = 0;
  // Waits up to `timeout` for the leader to exit; returns the state either
  // way (check running).
  virtual ProcessState Wait(std::chrono::milliseconds timeout) = 0;
  // SIGTERM to the group, then SIGKILL to the group when it has not gone
  // within `grace`; returns once no process of the group is left (leader
  // reaped, kill(-pgid, 0) answers ESRCH or only zombies remain). When that
  // has not happened `kill_timeout` after the SIGKILL, returns
  // DeadlineExceeded. Calling it on a group that is already gone returns its
  // state at once.
  virtual Result<ProcessState> Stop(
      std::chrono::milliseconds grace,
      std::chrono::milliseconds kill_timeout = std::chrono::seconds(5)) = 0;
};

// Starts process groups. The seam a test replaces to fake processes.
class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;
  // Starts `spec`. Fails (without a child left behind) when the log file or
  // the directory cannot be opened; a program that cannot be executed starts
  // and exits with code 127, its error in the log.
  virtual Result<std::unique_ptr<ProcessGroup>> Start(
      const ProcessSpec& spec) = 0;
};

// The real launcher (fork + setsid + execvp). Makes this process a child
// subreaper. The launcher must outlive the children it started, or they are
// killed with its spawning thread.
std::unique_ptr<ProcessLauncher> NewProcessLauncher();

// Whether any process other than a zombie is left in process group `pgid`.
bool ProcessGroupAlive(pid_t pgid);

}  // namespace multislice::control
